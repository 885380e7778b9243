#include "common/tensor_codec.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swapping first");

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<size_t> DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return sizeof(float);
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype ", v1::DType_Name(dtype),
          " is not supported yet; send DTYPE_FLOAT32 tensors"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype),
                       " is not a valid dtype; send DTYPE_FLOAT32 tensors"));
  }
}

absl::StatusOr<int64_t> ElementCount(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    count *= dim;
  }
  return count;
}

v1::TensorSetHeader MakeFloat32Header(
    uint64_t version, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes) {
  v1::TensorSetHeader header;
  header.set_version(version);
  for (size_t i = 0; i < names.size(); ++i) {
    v1::TensorInfo* info = header.add_tensors();
    info->set_name(names[i]);
    info->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t dim : shapes[i]) info->add_shape(dim);
  }
  return header;
}

absl::Status CheckSameLayout(const v1::TensorSetHeader& expected,
                             const v1::TensorSetHeader& header) {
  if (header.tensors_size() != expected.tensors_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", expected.tensors_size(), " tensors (the job's weights), got ",
        header.tensors_size(), "; was the gradient computed on the job's model?"));
  }
  for (int i = 0; i < header.tensors_size(); ++i) {
    const v1::TensorInfo& want = expected.tensors(i);
    const v1::TensorInfo& got = header.tensors(i);
    if (got.dtype() != v1::DTYPE_FLOAT32) {
      const absl::Status supported = DTypeSize(got.dtype()).status();
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", got.name(), "': ",
          supported.ok() ? "the job's weights are DTYPE_FLOAT32"
                         : supported.message()));
    }
    if (got.name() != want.name()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " is named '", got.name(), "'; expected '",
                       want.name(), "'"));
    }
    if (!std::equal(got.shape().begin(), got.shape().end(),
                    want.shape().begin(), want.shape().end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", got.name(), "' has shape ", ShapeString(got.shape()),
          "; the job's weights have shape ", ShapeString(want.shape())));
    }
  }
  return absl::OkStatus();
}

absl::Status ForEachChunk(
    absl::Span<const absl::Span<const char>> buffers, size_t max_chunk_bytes,
    const std::function<absl::Status(v1::TensorChunk&)>& emit) {
  if (max_chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk size must be positive");
  }
  v1::TensorChunk chunk;
  for (size_t t = 0; t < buffers.size(); ++t) {
    const absl::Span<const char> bytes = buffers[t];
    for (size_t offset = 0; offset < bytes.size(); offset += max_chunk_bytes) {
      const size_t n = std::min(max_chunk_bytes, bytes.size() - offset);
      chunk.set_tensor_index(static_cast<uint32_t>(t));
      chunk.set_byte_offset(offset);
      chunk.mutable_data()->assign(bytes.data() + offset, n);
      MPILEARN_RETURN_IF_ERROR(emit(chunk));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<size_t>> TensorSetAssembler::ByteSizes(
    const v1::TensorSetHeader& header) {
  std::vector<size_t> sizes;
  sizes.reserve(header.tensors_size());
  for (const v1::TensorInfo& info : header.tensors()) {
    absl::StatusOr<size_t> element_size = DTypeSize(info.dtype());
    if (!element_size.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", info.name(), "': ", element_size.status().message()));
    }
    absl::StatusOr<int64_t> count = ElementCount(info.shape());
    if (!count.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", info.name(), "': ", count.status().message()));
    }
    sizes.push_back(static_cast<size_t>(*count) * *element_size);
  }
  return sizes;
}

absl::StatusOr<TensorSetAssembler> TensorSetAssembler::Create(
    const v1::TensorSetHeader& header,
    std::vector<absl::Span<char>> destinations) {
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> sizes, ByteSizes(header));
  if (destinations.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header lists ", sizes.size(), " tensors but ",
                     destinations.size(), " destinations were given"));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (destinations[i].size() != sizes[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", header.tensors(i).name(), "' is ", sizes[i],
          " bytes but its destination holds ", destinations[i].size()));
    }
  }
  TensorSetAssembler assembler(std::move(destinations));
  // Skip leading empty tensors so `tensor_` points at one that needs bytes.
  while (assembler.tensor_ < assembler.destinations_.size() &&
         assembler.destinations_[assembler.tensor_].empty()) {
    ++assembler.tensor_;
  }
  return assembler;
}

absl::Status TensorSetAssembler::Add(const v1::TensorChunk& chunk) {
  if (tensor_ >= destinations_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for tensor ", chunk.tensor_index(),
                     " arrived after every tensor was complete"));
  }
  if (chunk.tensor_index() > tensor_ && chunk.byte_offset() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", tensor_, " is incomplete: ", received_, " of ",
        destinations_[tensor_].size(), " bytes arrived before tensor ",
        chunk.tensor_index(), " began; does the header's shape match the data?"));
  }
  if (chunk.tensor_index() != tensor_ || chunk.byte_offset() != received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk out of order: got tensor ", chunk.tensor_index(), " offset ",
        chunk.byte_offset(), ", expected tensor ", tensor_, " offset ",
        received_));
  }
  absl::Span<char> dest = destinations_[tensor_];
  if (chunk.data().empty() || chunk.data().size() > dest.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", chunk.data().size(), " bytes at offset ", received_,
        " does not fit tensor ", tensor_, " of ", dest.size(), " bytes"));
  }
  std::memcpy(dest.data() + received_, chunk.data().data(), chunk.data().size());
  received_ += chunk.data().size();
  if (received_ == dest.size()) {
    received_ = 0;
    ++tensor_;
    while (tensor_ < destinations_.size() && destinations_[tensor_].empty()) {
      ++tensor_;
    }
  }
  return absl::OkStatus();
}

absl::Status TensorSetAssembler::Finish() const {
  if (tensor_ < destinations_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incomplete tensor set: tensor ", tensor_, " has ", received_, " of ",
        destinations_[tensor_].size(), " bytes (", destinations_.size() - tensor_,
        " tensors incomplete)"));
  }
  return absl::OkStatus();
}

v1::TensorSet ToTensorSet(const v1::TensorSetHeader& header,
                          const std::vector<std::vector<float>>& values) {
  v1::TensorSet set;
  *set.mutable_header() = header;
  for (const std::vector<float>& v : values) {
    set.add_data()->assign(reinterpret_cast<const char*>(v.data()),
                           v.size() * sizeof(float));
  }
  return set;
}

absl::StatusOr<Float32Tensors> FromTensorSet(const v1::TensorSet& set) {
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> sizes,
                            TensorSetAssembler::ByteSizes(set.header()));
  if (static_cast<size_t>(set.data_size()) != sizes.size()) {
    return absl::DataLossError(absl::StrCat("tensor set lists ", sizes.size(),
                                            " tensors but holds ",
                                            set.data_size()));
  }
  Float32Tensors out;
  out.header = set.header();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (set.header().tensors(i).dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError("only fp32 tensor sets can be decoded");
    }
    if (set.data(i).size() != sizes[i]) {
      return absl::DataLossError(absl::StrCat(
          "tensor '", set.header().tensors(i).name(), "' should be ", sizes[i],
          " bytes but is ", set.data(i).size()));
    }
    std::vector<float> values(sizes[i] / sizeof(float));
    std::memcpy(values.data(), set.data(i).data(), sizes[i]);
    out.values.push_back(std::move(values));
  }
  return out;
}

absl::Span<const char> AsBytes(absl::Span<const float> values) {
  return absl::Span<const char>(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
}

absl::Span<char> AsWritableBytes(absl::Span<float> values) {
  return absl::Span<char>(reinterpret_cast<char*>(values.data()),
                          values.size() * sizeof(float));
}

}  // namespace mpilearn
