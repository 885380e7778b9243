#include "common/tensor_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half_float.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swapping first");

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The 16-bit format of a 2-byte wire dtype; crashes for any other (callers
// check the dtype with DTypeSize first).
HalfFormat HalfFormatOf(v1::DType dtype) {
  if (dtype == v1::DTYPE_BFLOAT16) return HalfFormat::kBFloat16;
  CHECK_EQ(dtype, v1::DTYPE_FLOAT16) << "not a 16-bit wire dtype";
  return HalfFormat::kFloat16;
}

// Element count and wire byte size of one tensor of a header; errors name
// the tensor.
struct TensorSize {
  int64_t elements;
  size_t element_bytes;
  size_t wire_bytes;
};

absl::StatusOr<TensorSize> SizeOf(const v1::TensorInfo& info) {
  absl::StatusOr<size_t> element_bytes = DTypeSize(info.dtype());
  if (!element_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", info.name(), "': ", element_bytes.status().message()));
  }
  absl::StatusOr<int64_t> count = ElementCount(info.shape());
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", info.name(), "': ", count.status().message()));
  }
  if (static_cast<uint64_t>(*count) >
      std::numeric_limits<size_t>::max() / sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", info.name(), "': shape ", ShapeString(info.shape()),
        " is too large"));
  }
  return TensorSize{*count, *element_bytes,
                    static_cast<size_t>(*count) * *element_bytes};
}

}  // namespace

absl::StatusOr<size_t> DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return sizeof(float);
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return sizeof(uint16_t);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype ",
          v1::DType_IsValid(dtype) ? v1::DType_Name(dtype)
                                   : absl::StrCat(static_cast<int>(dtype)),
          " is not a valid wire dtype; send DTYPE_FLOAT32, DTYPE_BFLOAT16 or "
          "DTYPE_FLOAT16 tensors"));
  }
}

void EncodeFloats(absl::Span<const float> values, v1::DType dtype, char* out) {
  if (dtype == v1::DTYPE_FLOAT32) {
    if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(float));
    return;
  }
  EncodeHalf(HalfFormatOf(dtype), values, out);
}

void EncodeFloatsWithFeedback(absl::Span<const float> values,
                              absl::Span<float> residual, v1::DType dtype,
                              char* out) {
  CHECK_EQ(values.size(), residual.size());
  if (dtype == v1::DTYPE_FLOAT32) {
    // fp32 loses nothing: send value + residual, and the residual is spent.
    for (size_t i = 0; i < values.size(); ++i) {
      const float sum = values[i] + residual[i];
      std::memcpy(out + i * sizeof(float), &sum, sizeof(float));
      residual[i] = 0.0f;
    }
    return;
  }
  EncodeHalfWithFeedback(HalfFormatOf(dtype), values, residual, out);
}

void DecodeFloats(absl::Span<const char> in, v1::DType dtype, float* out) {
  if (dtype == v1::DTYPE_FLOAT32) {
    if (!in.empty()) std::memcpy(out, in.data(), in.size());
    return;
  }
  DecodeHalf(HalfFormatOf(dtype), in, out);
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

void SetWireDType(v1::TensorSetHeader* header, v1::DType dtype) {
  for (v1::TensorInfo& info : *header->mutable_tensors()) info.set_dtype(dtype);
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
    const absl::Status supported = DTypeSize(got.dtype()).status();
    if (!supported.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", got.name(), "': ", supported.message()));
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

absl::Status CheckWarmStartLayout(const v1::TensorSetHeader& source,
                                  const v1::TensorSetHeader& model, const std::string& from) {
  auto shape = [](const v1::TensorInfo& tensor) {
    return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
  };
  const int common = std::min(source.tensors_size(), model.tensors_size());
  for (int i = 0; i < common; ++i) {
    const v1::TensorInfo& want = source.tensors(i);
    const v1::TensorInfo& have = model.tensors(i);
    if (want.name() != have.name() || shape(want) != shape(have)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "warm_start: tensor ", i, " is '", want.name(), "' ", shape(want), " in ", from,
          " but '", have.name(), "' ", shape(have),
          " in this job's model; start from weights of the same model"));
    }
  }
  if (source.tensors_size() != model.tensors_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warm_start: ", from, " holds ", source.tensors_size(), " tensors but this job's model ",
        model.tensors_size(), "; start from weights of the same model"));
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

absl::Status ForEachChunk(
    absl::Span<const absl::Span<const float>> values, v1::DType dtype,
    size_t max_chunk_bytes,
    const std::function<absl::Status(v1::TensorChunk&)>& emit) {
  MPILEARN_ASSIGN_OR_RETURN(const size_t element_bytes, DTypeSize(dtype));
  const size_t per_chunk = max_chunk_bytes / element_bytes;
  if (per_chunk == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size ", max_chunk_bytes, " is below one ",
                     v1::DType_Name(dtype), " element"));
  }
  v1::TensorChunk chunk;
  for (size_t t = 0; t < values.size(); ++t) {
    const absl::Span<const float> tensor = values[t];
    for (size_t first = 0; first < tensor.size(); first += per_chunk) {
      const absl::Span<const float> part =
          tensor.subspan(first, std::min(per_chunk, tensor.size() - first));
      chunk.set_tensor_index(static_cast<uint32_t>(t));
      chunk.set_byte_offset(first * element_bytes);
      std::string* data = chunk.mutable_data();
      data->resize(part.size() * element_bytes);
      EncodeFloats(part, dtype, data->data());
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
    MPILEARN_ASSIGN_OR_RETURN(const TensorSize size, SizeOf(info));
    sizes.push_back(size.wire_bytes);
  }
  return sizes;
}

absl::StatusOr<std::vector<int64_t>> TensorSetAssembler::ElementCounts(
    const v1::TensorSetHeader& header) {
  std::vector<int64_t> counts;
  counts.reserve(header.tensors_size());
  for (const v1::TensorInfo& info : header.tensors()) {
    MPILEARN_ASSIGN_OR_RETURN(const TensorSize size, SizeOf(info));
    counts.push_back(size.elements);
  }
  return counts;
}

absl::StatusOr<TensorSetAssembler> TensorSetAssembler::Create(
    const v1::TensorSetHeader& header,
    std::vector<absl::Span<float>> destinations) {
  if (destinations.size() != static_cast<size_t>(header.tensors_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("header lists ", header.tensors_size(), " tensors but ",
                     destinations.size(), " destinations were given"));
  }
  std::vector<Tensor> tensors;
  tensors.reserve(destinations.size());
  for (size_t i = 0; i < destinations.size(); ++i) {
    const v1::TensorInfo& info = header.tensors(static_cast<int>(i));
    MPILEARN_ASSIGN_OR_RETURN(const TensorSize size, SizeOf(info));
    if (destinations[i].size() != static_cast<uint64_t>(size.elements)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", info.name(), "' has ", size.elements,
          " elements but its destination holds ", destinations[i].size()));
    }
    tensors.push_back(Tensor{destinations[i], info.dtype(), size.element_bytes,
                             size.wire_bytes});
  }
  TensorSetAssembler assembler(std::move(tensors));
  // Skip leading empty tensors so `tensor_` points at one that needs bytes.
  assembler.SkipCompleteTensors();
  return assembler;
}

void TensorSetAssembler::SkipCompleteTensors() {
  while (tensor_ < tensors_.size() && received_ == tensors_[tensor_].wire_bytes) {
    received_ = 0;
    ++tensor_;
  }
}

absl::Status TensorSetAssembler::Add(const v1::TensorChunk& chunk) {
  return Add(chunk.tensor_index(), chunk.byte_offset(), chunk.data());
}

absl::Status TensorSetAssembler::Add(uint32_t tensor_index,
                                     uint64_t byte_offset,
                                     absl::Span<const char> data) {
  if (tensor_ >= tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for tensor ", tensor_index,
                     " arrived after every tensor was complete"));
  }
  const Tensor& tensor = tensors_[tensor_];
  if (tensor_index > tensor_ && byte_offset == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", tensor_, " is incomplete: ", received_, " of ",
        tensor.wire_bytes, " bytes arrived before tensor ", tensor_index,
        " began; does the header's shape match the data?"));
  }
  if (tensor_index != tensor_ || byte_offset != received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk out of order: got tensor ", tensor_index, " offset ",
        byte_offset, ", expected tensor ", tensor_, " offset ", received_));
  }
  if (data.empty() || data.size() > tensor.wire_bytes - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", data.size(), " bytes at offset ", received_,
        " does not fit tensor ", tensor_, " of ", tensor.wire_bytes, " bytes"));
  }
  const size_t bytes = data.size();
  if (tensor.dtype == v1::DTYPE_FLOAT32) {
    // Wire bytes are the fp32 bytes: cut anywhere, they land in place.
    std::memcpy(reinterpret_cast<char*>(tensor.destination.data()) + received_,
                data.data(), data.size());
  } else {
    const size_t size = tensor.element_bytes;
    size_t element = received_ / size;
    size_t held = received_ % size;  // bytes of `element` in partial_
    if (held != 0) {
      const size_t take = std::min(size - held, data.size());
      std::memcpy(partial_ + held, data.data(), take);
      data.remove_prefix(take);
      held += take;
      if (held == size) {
        DecodeFloats(absl::MakeConstSpan(partial_, size), tensor.dtype,
                     tensor.destination.data() + element);
        ++element;
        held = 0;
      }
    }
    const size_t whole = data.size() / size * size;
    DecodeFloats(data.first(whole), tensor.dtype,
                 tensor.destination.data() + element);
    data.remove_prefix(whole);
    std::memcpy(partial_ + held, data.data(), data.size());
  }
  received_ += bytes;
  SkipCompleteTensors();
  return absl::OkStatus();
}

absl::Status TensorSetAssembler::Finish() const {
  if (!complete()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incomplete tensor set: tensor ", tensor_, " has ", received_, " of ",
        tensors_[tensor_].wire_bytes, " bytes (", tensors_.size() - tensor_,
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
