#include "worker/dataset.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/idx_reader.h"

namespace mpilearn {
namespace worker {
namespace {

using ::mpilearn::v1::DataSpec;

constexpr int64_t kDefaultValidationCount = 5000;

std::string Shape(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Reads the IDX file that spec field `field` names, prefixing any error with
// the field.
absl::StatusOr<IdxArray> ReadField(absl::string_view field,
                                   const std::string& path, int64_t limit) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(path, limit);
  if (!array.ok()) {
    return absl::Status(array.status().code(),
                        absl::StrCat("data.", field, ": ",
                                     array.status().message()));
  }
  return array;
}

// Loads one split from the files that `images_field` and `labels_field`
// name, keeping at most `limit` samples (0: all).
absl::StatusOr<Dataset> LoadSplit(absl::string_view images_field,
                                  const std::string& images_path,
                                  absl::string_view labels_field,
                                  const std::string& labels_path,
                                  int64_t limit) {
  MPILEARN_ASSIGN_OR_RETURN(IdxArray images,
                            ReadField(images_field, images_path, limit));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", images_field, ": '", images_path,
        "' holds an IDX array of shape ", Shape(images.dims),
        ", but images must be 3-dimensional [N, height, width] like "
        "train-images-idx3-ubyte.gz"));
  }
  const int64_t n = images.dims[0];
  const int64_t height = images.dims[1];
  const int64_t width = images.dims[2];
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", images_field, ": '", images_path, "' holds no images"));
  }
  if (height == 0 || width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", images_field, ": '", images_path,
                     "' holds images of ", height, "x", width, " pixels"));
  }

  MPILEARN_ASSIGN_OR_RETURN(IdxArray labels,
                            ReadField(labels_field, labels_path, limit));
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", labels_field, ": '", labels_path,
        "' holds an IDX array of shape ", Shape(labels.dims),
        ", but labels must be 1-dimensional [N] like "
        "train-labels-idx1-ubyte.gz"));
  }
  if (labels.dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", images_field, " and data.", labels_field, " disagree: '",
        images_path, "' holds ", n, " images but '", labels_path, "' holds ",
        labels.dims[0], " labels",
        limit > 0 ? absl::StrCat(" (reading at most ", limit, ")") : ""));
  }

  // from_blob only borrows the vectors' bytes; the conversions copy them.
  Dataset split;
  split.images = torch::from_blob(images.data.data(), {n, 1, height, width},
                                  torch::kUInt8)
                     .to(torch::kFloat32)
                     .div_(255.0);
  split.labels =
      torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return split;
}

// Checks that the optional pair of fields is either both set or both empty.
absl::Status CheckPair(absl::string_view images_field,
                       const std::string& images_path,
                       absl::string_view labels_field,
                       const std::string& labels_path) {
  if (images_path.empty() && !labels_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", images_field, " is required when data.", labels_field,
        " is set"));
  }
  if (!images_path.empty() && labels_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", labels_field, " is required when data.", images_field,
        " is set"));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(absl::string_view field, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, " must be >= 0, got ", value));
  }
  return absl::OkStatus();
}

// Checks that `split`'s images have the training images' size.
absl::Status CheckImageSize(absl::string_view images_field,
                            const Dataset& split, const Dataset& train) {
  const int64_t h = split.images.size(2), w = split.images.size(3);
  const int64_t train_h = train.images.size(2), train_w = train.images.size(3);
  if (h != train_h || w != train_w) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", images_field, ": images are ", h, "x", w,
        " pixels but the training images are ", train_h, "x", train_w));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Dataset::size() const {
  return labels.defined() ? labels.size(0) : 0;
}

absl::StatusOr<DatasetSplits> LoadDatasets(const DataSpec& spec) {
  if (spec.train_images().empty()) {
    return absl::InvalidArgumentError(
        "data.train_images is required: a gzip'd IDX file of training images "
        "such as /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  }
  if (spec.train_labels().empty()) {
    return absl::InvalidArgumentError(
        "data.train_labels is required: a gzip'd IDX file of training labels "
        "such as /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz");
  }
  MPILEARN_RETURN_IF_ERROR(CheckPair("validation_images",
                                     spec.validation_images(),
                                     "validation_labels",
                                     spec.validation_labels()));
  MPILEARN_RETURN_IF_ERROR(CheckPair("test_images", spec.test_images(),
                                     "test_labels", spec.test_labels()));
  MPILEARN_RETURN_IF_ERROR(CheckNonNegative("train_limit", spec.train_limit()));
  MPILEARN_RETURN_IF_ERROR(CheckNonNegative("test_limit", spec.test_limit()));
  const int64_t validation_count = spec.has_validation_count()
                                       ? spec.validation_count()
                                       : kDefaultValidationCount;
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegative("validation_count", validation_count));

  DatasetSplits splits;
  MPILEARN_ASSIGN_OR_RETURN(
      Dataset train,
      LoadSplit("train_images", spec.train_images(), "train_labels",
                spec.train_labels(), spec.train_limit()));

  if (!spec.validation_images().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        splits.validation,
        LoadSplit("validation_images", spec.validation_images(),
                  "validation_labels", spec.validation_labels(),
                  /*limit=*/0));
    MPILEARN_RETURN_IF_ERROR(
        CheckImageSize("validation_images", splits.validation, train));
    splits.train = std::move(train);
  } else {
    const int64_t n = train.size();
    if (validation_count >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.validation_count is ", validation_count,
          (spec.has_validation_count() ? "" : " (the default)"),
          " but the training set has only ", n, " samples",
          (spec.train_limit() > 0 ? " after data.train_limit" : ""),
          "; the held-out validation samples must leave some to train on, so "
          "lower data.validation_count",
          (spec.train_limit() > 0 ? " or raise data.train_limit" : ""),
          ", or give data.validation_images and data.validation_labels"));
    }
    const int64_t train_n = n - validation_count;
    splits.train.images = train.images.narrow(0, 0, train_n);
    splits.train.labels = train.labels.narrow(0, 0, train_n);
    if (validation_count > 0) {
      splits.validation.images =
          train.images.narrow(0, train_n, validation_count);
      splits.validation.labels =
          train.labels.narrow(0, train_n, validation_count);
    }
  }

  if (!spec.test_images().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        splits.test, LoadSplit("test_images", spec.test_images(),
                               "test_labels", spec.test_labels(),
                               spec.test_limit()));
    MPILEARN_RETURN_IF_ERROR(
        CheckImageSize("test_images", splits.test, splits.train));
  }

  int64_t max_label = 0;
  for (const Dataset* d : {&splits.train, &splits.validation, &splits.test}) {
    if (d->size() > 0) {
      max_label = std::max(max_label, d->labels.max().item<int64_t>());
    }
  }
  splits.num_classes = max_label + 1;
  return splits;
}

Dataset Shard(const Dataset& data, int rank, int world) {
  CHECK_GT(world, 0) << "Shard: world size must be positive";
  CHECK_GE(rank, 0) << "Shard: rank must be in [0, " << world << ")";
  CHECK_LT(rank, world) << "Shard: rank must be in [0, " << world << ")";
  const int64_t n = data.size();
  if (n == 0) return data;
  const int64_t base = n / world;
  const int64_t extra = n % world;
  // The first `extra` ranks take one sample more than the rest.
  const int64_t start = rank * base + std::min<int64_t>(rank, extra);
  const int64_t count = base + (rank < extra ? 1 : 0);
  Dataset shard;
  shard.images = data.images.narrow(0, start, count);
  shard.labels = data.labels.narrow(0, start, count);
  return shard;
}

}  // namespace worker
}  // namespace mpilearn
