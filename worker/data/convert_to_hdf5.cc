#include "worker/data/convert_to_hdf5.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"
#include "worker/data/hdf5_writer.h"
#include "worker/data/idx_reader.h"

namespace mpilearn::worker {
namespace {

// Rows converted per read and write, so a .npy source is streamed.
constexpr int64_t kRowsPerBlock = 4096;

// Where rows come from. Read returns rows [begin, end) of both arrays as
// contiguous float32 or int64 tensors holding the values to store (HDF5
// converts them to the stored type exactly).
class Source {
 public:
  virtual ~Source() = default;
  virtual absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) = 0;

  StoredArray features;
  StoredArray labels;
};

ElementType ElementTypeOfIdx(IdxType type) {
  switch (type) {
    case IdxType::kUnsignedByte:
      return ElementType::kUint8;
    case IdxType::kSignedByte:
      return ElementType::kInt8;
    case IdxType::kInt16:
      return ElementType::kInt16;
    case IdxType::kInt32:
      return ElementType::kInt32;
    case IdxType::kFloat32:
      return ElementType::kFloat32;
    case IdxType::kFloat64:
      return ElementType::kFloat64;
  }
  return ElementType::kFloat32;  // Unreachable.
}

// Two IDX files, read whole (the reader holds them as float).
class IdxSource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Open(
      const ConvertOptions& options) {
    auto source = std::make_unique<IdxSource>();
    MPILEARN_ASSIGN_OR_RETURN(source->features_,
                              ReadIdxFile(options.features, options.limit));
    MPILEARN_ASSIGN_OR_RETURN(source->labels_,
                              ReadIdxFile(options.labels, options.limit));
    if (source->features_.dims[0] != source->labels_.dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", options.features, "' holds ", source->features_.dims[0],
          " items but '", options.labels, "' holds ", source->labels_.dims[0],
          "; features and labels must have the same count"));
    }
    source->features = {ElementTypeOfIdx(source->features_.type),
                        source->features_.dims};
    source->labels = {ElementTypeOfIdx(source->labels_.type),
                      source->labels_.dims};
    return source;
  }

  absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) override {
    return std::make_pair(Rows(features_, features, begin, end),
                          Rows(labels_, labels, begin, end));
  }

 private:
  static torch::Tensor Rows(IdxArray& array, const StoredArray& info,
                            int64_t begin, int64_t end) {
    const int64_t row = info.RowElements();
    return torch::from_blob(array.values.data() + begin * row,
                            {(end - begin) * row}, torch::kFloat32);
  }

  IdxArray features_;
  IdxArray labels_;
};

// A .npy pair or .npz archive, read by range through OpenDataFile.
class NumpySource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Open(
      const ConvertOptions& options) {
    auto source = std::make_unique<NumpySource>();
    MPILEARN_ASSIGN_OR_RETURN(source->file_, OpenDataFile(options.features));
    const DataFile& file = *source->file_;
    const int64_t rows =
        options.limit > 0 ? std::min(options.limit, file.rows()) : file.rows();
    source->features.dims = {rows};
    source->features.dims.insert(source->features.dims.end(),
                                 file.feature_shape().begin(),
                                 file.feature_shape().end());
    source->labels.dims = {rows};
    source->labels.dims.insert(source->labels.dims.end(),
                               file.label_shape().begin(),
                               file.label_shape().end());
    source->features.type = StoredType(file.feature_type(), false);
    source->labels.type =
        StoredType(file.label_type(), file.label_shape().empty());
    return source;
  }

  absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) override {
    MPILEARN_ASSIGN_OR_RETURN(DataRows rows, file_->Read(begin, end));
    torch::Tensor features = rows.features.contiguous().view({-1});
    // The worker read uint8 features as x / 255: back to their bytes.
    if (file_->feature_type() == ElementType::kUint8) {
      features = features.mul(255.0).round_();
    }
    return std::make_pair(features, rows.labels.contiguous().view({-1}));
  }

 private:
  // The type an array is stored in: the source's where the worker's values
  // (float32 features and label rows, int64 class labels) hold it exactly,
  // float32 otherwise.
  static ElementType StoredType(ElementType source, bool class_labels) {
    if (class_labels && IsIntegerElementType(source)) return source;
    switch (source) {
      case ElementType::kUint8:
      case ElementType::kInt8:
      case ElementType::kInt16:
      case ElementType::kFloat32:
        return source;
      default:
        return ElementType::kFloat32;
    }
  }

  std::unique_ptr<DataFile> file_;
};

absl::Status WriteFile(Source& source, const ConvertOptions& options,
                       const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(
      std::unique_ptr<Hdf5DataWriter> writer,
      Hdf5DataWriter::Create(path, source.features, source.labels,
                             {options.chunk_rows, options.gzip}));
  const int64_t rows = source.features.dims[0];
  for (int64_t begin = 0; begin < rows; begin += kRowsPerBlock) {
    const int64_t end = std::min(rows, begin + kRowsPerBlock);
    MPILEARN_ASSIGN_OR_RETURN(auto block, source.Read(begin, end));
    MPILEARN_RETURN_IF_ERROR(
        writer->WriteRows(begin, end - begin, block.first, block.second));
  }
  return writer->Finish();
}

}  // namespace

bool IsNumpyPath(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  return absl::EndsWith(lower, ".npy") || absl::EndsWith(lower, ".npz");
}

absl::StatusOr<std::string> ConvertToHdf5(const ConvertOptions& options) {
  std::unique_ptr<Source> source;
  if (IsNumpyPath(options.features)) {
    MPILEARN_ASSIGN_OR_RETURN(source, NumpySource::Open(options));
  } else {
    MPILEARN_ASSIGN_OR_RETURN(source, IdxSource::Open(options));
  }
  const std::string temporary = absl::StrCat(options.out, ".tmp-", getpid());
  const absl::Status written = WriteFile(*source, options, temporary);
  if (!written.ok()) {
    std::remove(temporary.c_str());
    return written;
  }
  if (std::rename(temporary.c_str(), options.out.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename '", temporary, "' to '", options.out, "'"));
  }
  return absl::StrCat(
      "wrote ", options.out, ": features ",
      DescribeStoredArray(source->features), ", labels ",
      DescribeStoredArray(source->labels), ", ",
      options.chunk_rows == 0
          ? std::string("contiguous")
          : absl::StrCat(
                "chunks of ", options.chunk_rows, " rows",
                options.gzip > 0 ? absl::StrCat(", gzip ", options.gzip) : ""));
}

}  // namespace mpilearn::worker
