#include "worker/data/dataset.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_list.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"
#include "worker/data/idx_reader.h"

namespace mpilearn {
namespace worker {
namespace {

using ::mpilearn::v1::DataSpec;

constexpr int64_t kDefaultValidationCount = 5000;
constexpr int kMaxFolds = 100;  // as NormalizeJobSpec allows

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

// A float32 tensor of `sizes` that takes over `values`' storage (no copy);
// the tensor's deleter frees it.
torch::Tensor TensorOf(std::vector<float> values,
                       const std::vector<int64_t>& sizes) {
  auto owner = std::make_shared<std::vector<float>>(std::move(values));
  float* data = owner->data();
  return torch::from_blob(
      data, sizes, [owner](void*) mutable { owner.reset(); }, torch::kFloat32);
}

// Checks that a float array holds no NaN or infinity: one would poison every
// weight it reaches, far from its cause.
absl::Status CheckFinite(absl::string_view field, const std::string& path,
                         const IdxArray& array) {
  if (IsIntegerIdxType(array.type)) return absl::OkStatus();
  const auto bad = std::find_if(
      array.values.begin(), array.values.end(),
      [](float v) { return !std::isfinite(v); });
  if (bad == array.values.end()) return absl::OkStatus();
  const int64_t per_sample =
      static_cast<int64_t>(array.values.size()) / array.dims[0];
  return absl::InvalidArgumentError(absl::StrCat(
      "data.", field, ": '", path, "' holds ", *bad, " at sample ",
      (bad - array.values.begin()) / per_sample,
      "; every value must be finite"));
}

// One split as loaded, with what the cross-split checks compare.
struct LoadedSplit {
  Dataset data;
  // Whether the features were unsigned bytes scaled by 1/255, and the
  // stored element types' names, for messages.
  bool features_scaled = true;
  std::string features_type = "unsigned byte";
  std::string labels_type = "unsigned byte";
};

// True when features of `type` are scaled by 1/255 on loading.
bool IsScaled(IdxType type) { return type == IdxType::kUnsignedByte; }

// Describes a split's labels for messages: "class indices (int64 [N])" or
// "float rows of width 2".
std::string LabelKind(const Dataset& d) {
  if (d.labels.dim() == 1) return "class indices";
  return absl::StrCat("float rows of width ", d.labels.size(1));
}

// Converts a features array to its tensor (see dataset.h for the rules).
absl::StatusOr<torch::Tensor> FeaturesOf(absl::string_view field,
                                         const std::string& path,
                                         IdxArray array) {
  if (array.dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", path, "' holds an IDX array of shape ",
        ShapeText(array.dims),
        ", but features must have at least 2 dimensions [N, ...], such as "
        "[N, height, width] like train-images-idx3-ubyte.gz or [N, D]"));
  }
  if (array.dims[0] == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, ": '", path, "' holds no samples"));
  }
  const std::vector<int64_t> sample(array.dims.begin() + 1, array.dims.end());
  if (std::find(sample.begin(), sample.end(), 0) != sample.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", path, "' holds samples of shape ",
        ShapeText(sample), ", which have no values"));
  }
  MPILEARN_RETURN_IF_ERROR(CheckFinite(field, path, array));
  std::vector<int64_t> sizes = array.dims;
  const bool scaled = IsScaled(array.type);
  if (scaled && sizes.size() == 3) {
    // A single-channel image [N, H, W] -> [N, 1, H, W].
    sizes.insert(sizes.begin() + 1, 1);
  }
  torch::Tensor features = TensorOf(std::move(array.values), sizes);
  if (scaled) features.div_(255.0);
  return features;
}

// Converts a labels array to its tensor (see dataset.h for the rules).
absl::StatusOr<torch::Tensor> LabelsOf(absl::string_view field,
                                       const std::string& path,
                                       IdxArray array) {
  const bool integer = IsIntegerIdxType(array.type);
  if (array.dims.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", path, "' holds an IDX array of shape ",
        ShapeText(array.dims),
        ", but labels must be 1-dimensional [N] like "
        "train-labels-idx1-ubyte.gz, or 2-dimensional [N, K] rows"));
  }
  if (array.dims.size() == 2 && array.dims[1] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": '", path, "' holds label rows of width 0"));
  }
  MPILEARN_RETURN_IF_ERROR(CheckFinite(field, path, array));
  const int64_t n = array.dims[0];
  if (array.dims.size() == 2 || !integer) {
    const int64_t width = array.dims.size() == 2 ? array.dims[1] : 1;
    return TensorOf(std::move(array.values), {n, width});
  }
  // Integer [N]: class indices. Each value is a whole number (an integer
  // type, exact in float below 2^24 > kMaxClasses).
  for (int64_t i = 0; i < n; ++i) {
    const float v = array.values[i];
    if (v < 0 || v >= kMaxClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.", field, ": '", path, "' holds class index ",
          static_cast<int64_t>(v),
          " at sample ", i, "; class indices must be in [0, ", kMaxClasses,
          ")", (v < 0 ? " (regression targets belong in a float32 file)"
                      : "")));
    }
  }
  return TensorOf(std::move(array.values), {n}).to(torch::kInt64);
}

// Loads one split from the files that `features_field` and `labels_field`
// name, keeping at most `limit` samples (0: all).
absl::StatusOr<LoadedSplit> LoadSplit(absl::string_view features_field,
                                      const std::string& features_path,
                                      absl::string_view labels_field,
                                      const std::string& labels_path,
                                      int64_t limit) {
  LoadedSplit split;
  MPILEARN_ASSIGN_OR_RETURN(IdxArray features,
                            ReadField(features_field, features_path, limit));
  split.features_scaled = IsScaled(features.type);
  split.features_type = std::string(IdxTypeName(features.type));
  MPILEARN_ASSIGN_OR_RETURN(
      split.data.features,
      FeaturesOf(features_field, features_path, std::move(features)));
  const int64_t n = split.data.features.size(0);

  MPILEARN_ASSIGN_OR_RETURN(IdxArray labels,
                            ReadField(labels_field, labels_path, limit));
  if (labels.dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", features_field, " and data.", labels_field, " disagree: '",
        features_path, "' holds ", n, " samples but '", labels_path,
        "' holds ", labels.dims[0], " labels",
        limit > 0 ? absl::StrCat(" (reading at most ", limit, ")") : ""));
  }
  split.labels_type = std::string(IdxTypeName(labels.type));
  MPILEARN_ASSIGN_OR_RETURN(
      split.data.labels, LabelsOf(labels_field, labels_path, std::move(labels)));
  return split;
}

// Loads one split from the data files `field` lists, rows concatenated in
// list order, at most `limit` rows (0: all).
absl::StatusOr<LoadedSplit> LoadFilesSplit(
    absl::string_view field,
    const google::protobuf::RepeatedPtrField<std::string>& entries,
    const DataFileNames& names, int64_t limit) {
  MPILEARN_ASSIGN_OR_RETURN(
      const std::vector<std::string> paths,
      ExpandFileList(field, {entries.begin(), entries.end()}));
  LoadedSplit split;
  std::vector<torch::Tensor> features, labels;
  int64_t rows = 0;
  for (const std::string& path : paths) {
    if (limit > 0 && rows >= limit) break;
    absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(path, names);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat("data.", field, ": ", file.status().message()));
    }
    const int64_t take =
        limit > 0 ? std::min((*file)->rows(), limit - rows) : (*file)->rows();
    absl::StatusOr<DataRows> read = (*file)->Read(0, take);
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat("data.", field, ": ", read.status().message()));
    }
    if (!features.empty() && read->features.sizes().slice(1) !=
                                 features.front().sizes().slice(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.", field, ": '", path, "' holds samples of shape ",
          ShapeText(read->features.sizes().slice(1).vec()), " but '", paths[0],
          "' holds ", ShapeText(features.front().sizes().slice(1).vec())));
    }
    if (!labels.empty() && (read->labels.dim() != labels.front().dim() ||
                            read->labels.sizes().slice(1) !=
                                labels.front().sizes().slice(1))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.", field, ": '", path, "' holds labels of shape ",
          ShapeText(read->labels.sizes().vec()), " but '", paths[0],
          "' holds labels of shape ", ShapeText(labels.front().sizes().vec())));
    }
    if (features.empty()) {
      split.features_scaled = (*file)->feature_type() == ElementType::kUint8;
      split.features_type = ElementTypeName((*file)->feature_type());
      split.labels_type = ElementTypeName((*file)->label_type());
    }
    rows += take;
    features.push_back(std::move(read->features));
    labels.push_back(std::move(read->labels));
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, ": the files hold no samples"));
  }
  split.data.features = features.size() == 1 ? features[0] : torch::cat(features);
  split.data.labels = labels.size() == 1 ? labels[0] : torch::cat(labels);
  if (!torch::isfinite(split.data.features).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": the features hold NaN or infinite values; every "
        "value must be finite"));
  }
  if (split.data.labels.dim() == 1) {
    const int64_t low = split.data.labels.min().item<int64_t>();
    const int64_t high = split.data.labels.max().item<int64_t>();
    if (low < 0 || high >= kMaxClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.", field, ": class indices must be in [0, ", kMaxClasses,
          "), the labels hold ", low < 0 ? low : high));
    }
  } else if (!torch::isfinite(split.data.labels).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", field, ": the labels hold NaN or infinite values"));
  }
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

// Checks that `split` has the training split's per-sample feature shape,
// feature scale and kind of labels.
absl::Status CheckMatchesTrain(absl::string_view features_field,
                               absl::string_view labels_field,
                               const LoadedSplit& split,
                               const LoadedSplit& train) {
  const std::vector<int64_t> shape = split.data.features.sizes().slice(1).vec();
  const std::vector<int64_t> train_shape =
      train.data.features.sizes().slice(1).vec();
  if (shape != train_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", features_field, ": samples have shape ", ShapeText(shape),
        " but the training samples have shape ", ShapeText(train_shape)));
  }
  if (split.features_scaled != train.features_scaled) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", features_field, ": features are ", split.features_type,
        " but the training features are ", train.features_type,
        "; unsigned bytes are scaled by 1/255 and other types are not, so "
        "give every split the same element type"));
  }
  const std::string kind = LabelKind(split.data);
  const std::string train_kind = LabelKind(train.data);
  if (kind != train_kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.", labels_field, ": labels are ", kind, " (",
        split.labels_type, " ", ShapeText(split.data.labels.sizes().vec()),
        ") but the training labels are ", train_kind, " (",
        train.labels_type, " ",
        ShapeText(train.data.labels.sizes().vec()), ")"));
  }
  return absl::OkStatus();
}

// Rows [block.begin, block.end) of `data`: a view sharing its storage.
Dataset RowsOf(const Dataset& data, const RowBlock& block) {
  Dataset rows;
  rows.features = data.features.narrow(0, block.begin, block.size());
  rows.labels = data.labels.narrow(0, block.begin, block.size());
  return rows;
}

// `data` less rows `block`, in order: a view when the block is at either
// end, else (a middle cross-validation fold) a copy of the two parts.
Dataset WithoutRows(const Dataset& data, const RowBlock& block) {
  const RowBlock before{0, block.begin};
  const RowBlock after{block.end, data.size()};
  if (after.size() == 0) return RowsOf(data, before);
  if (before.size() == 0) return RowsOf(data, after);
  const Dataset first = RowsOf(data, before);
  const Dataset second = RowsOf(data, after);
  return Dataset{torch::cat({first.features, second.features}),
                 torch::cat({first.labels, second.labels})};
}

}  // namespace

absl::Status CheckDataCounts(const DataSpec& spec) {
  MPILEARN_RETURN_IF_ERROR(CheckNonNegative("train_limit", spec.train_limit()));
  MPILEARN_RETURN_IF_ERROR(CheckNonNegative("test_limit", spec.test_limit()));
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegative("validation_count", spec.validation_count()));
  if (spec.folds() == 0 && !spec.has_fold()) return absl::OkStatus();
  // The spec was normalized (NormalizeJobSpec says why each is refused);
  // these guard the block arithmetic against a spec that was not.
  if (spec.folds() < 2 || spec.folds() > kMaxFolds || spec.fold() < 0 ||
      spec.fold() >= spec.folds()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.folds is ", spec.folds(), " and data.fold ", spec.fold(),
        "; folds must be 2 to ", kMaxFolds, " and fold in [0, folds)"));
  }
  if (!spec.validation_files().empty() || !spec.validation_images().empty() ||
      (spec.has_validation_count() && spec.validation_count() > 0)) {
    return absl::InvalidArgumentError(
        "data.folds chooses the validation rows; remove the validation files "
        "and data.validation_count");
  }
  return absl::OkStatus();
}

absl::StatusOr<RowBlock> HeldOutRows(const DataSpec& spec, int64_t rows,
                                     absl::string_view what,
                                     absl::string_view alternative) {
  MPILEARN_RETURN_IF_ERROR(CheckDataCounts(spec));
  const bool limited = spec.train_limit() > 0;
  if (spec.folds() > 0) {
    const int64_t folds = spec.folds();
    if (rows < folds) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.folds is ", folds, " but ", what, " only ", rows, " samples",
          limited ? " after data.train_limit" : "",
          "; every fold needs at least one, so lower data.folds",
          limited ? " or raise data.train_limit" : ""));
    }
    // rows < 2^40 and folds <= 100: the products do not overflow.
    return RowBlock{spec.fold() * rows / folds, (spec.fold() + 1) * rows / folds};
  }
  const int64_t validation_count = spec.has_validation_count()
                                       ? spec.validation_count()
                                       : kDefaultValidationCount;
  if (validation_count < rows) return RowBlock{rows - validation_count, rows};
  return absl::InvalidArgumentError(absl::StrCat(
      "data.validation_count is ", validation_count,
      (spec.has_validation_count() ? "" : " (the default)"), " but ", what,
      " only ", rows, " samples", (limited ? " after data.train_limit" : ""),
      "; the held-out validation samples must leave some to train on, so "
      "lower data.validation_count", (limited ? " or raise data.train_limit" : ""),
      ", or give ", alternative));
}

int64_t Dataset::size() const {
  return labels.defined() ? labels.size(0) : 0;
}

absl::StatusOr<DatasetSplits> LoadDatasets(const DataSpec& spec) {
  if (spec.train_images().empty() && spec.train_files().empty()) {
    return absl::InvalidArgumentError(
        "data.train_images is required: a gzip'd IDX file of training images "
        "such as /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz, "
        "or data.train_files (HDF5 or NumPy files)");
  }
  if (spec.train_labels().empty() && spec.train_files().empty()) {
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
  MPILEARN_RETURN_IF_ERROR(CheckDataCounts(spec));

  // IDX files, or the file lists (HDF5, NumPy).
  const bool files = !spec.train_files().empty();
  const DataFileNames names = DataFileNames::FromSpec(spec);
  if (names.several()) {
    return absl::InvalidArgumentError(
        "data.features_datasets / labels_datasets: several datasets are read by streaming "
        "only (the training groups and validation pools stream file lists)");
  }
  DatasetSplits splits;
  MPILEARN_ASSIGN_OR_RETURN(
      LoadedSplit train,
      files ? LoadFilesSplit("train_files", spec.train_files(), names,
                             spec.train_limit())
            : LoadSplit("train_images", spec.train_images(), "train_labels",
                        spec.train_labels(), spec.train_limit()));

  if (!spec.validation_images().empty() || !spec.validation_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        LoadedSplit validation,
        files ? LoadFilesSplit("validation_files", spec.validation_files(),
                               names, /*limit=*/0)
              : LoadSplit("validation_images", spec.validation_images(),
                          "validation_labels", spec.validation_labels(),
                          /*limit=*/0));
    MPILEARN_RETURN_IF_ERROR(CheckMatchesTrain(
        files ? "validation_files" : "validation_images",
        files ? "validation_files" : "validation_labels", validation, train));
    splits.validation = std::move(validation.data);
    splits.train = train.data;
  } else {
    MPILEARN_ASSIGN_OR_RETURN(
        const RowBlock held,
        HeldOutRows(spec, train.data.size(), "the training set has",
                    "data.validation_images and data.validation_labels"));
    if (held.size() > 0) splits.validation = RowsOf(train.data, held);
    splits.train = WithoutRows(train.data, held);
    if (held.begin > 0 && held.end < train.data.size()) {
      // A middle fold: the training rows are a copy, so a view would keep
      // the whole loaded set alive for the validation rows alone.
      splits.validation.features = splits.validation.features.clone();
      splits.validation.labels = splits.validation.labels.clone();
    }
  }

  if (!spec.test_images().empty() || !spec.test_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        LoadedSplit test,
        files ? LoadFilesSplit("test_files", spec.test_files(), names,
                               spec.test_limit())
              : LoadSplit("test_images", spec.test_images(), "test_labels",
                          spec.test_labels(), spec.test_limit()));
    MPILEARN_RETURN_IF_ERROR(CheckMatchesTrain(
        files ? "test_files" : "test_images", files ? "test_files" : "test_labels",
        test, train));
    splits.test = std::move(test.data);
  }

  splits.input_shape = train.data.features.sizes().slice(1).vec();
  splits.float_labels = train.data.labels.dim() == 2;
  if (splits.float_labels) {
    splits.num_classes = train.data.labels.size(1);
  } else {
    int64_t max_label = 0;
    for (const Dataset* d :
         {&splits.train, &splits.validation, &splits.test}) {
      if (d->size() > 0) {
        max_label = std::max(max_label, d->labels.max().item<int64_t>());
      }
    }
    splits.num_classes = max_label + 1;
  }
  return splits;
}

ShareRange ShareOf(int64_t rows, int rank, int world) {
  CHECK_GT(world, 0) << "ShareOf: world size must be positive";
  CHECK_GE(rank, 0) << "ShareOf: rank must be in [0, " << world << ")";
  CHECK_LT(rank, world) << "ShareOf: rank must be in [0, " << world << ")";
  const int64_t base = rows / world;
  const int64_t extra = rows % world;
  // The first `extra` ranks take one row more than the rest.
  ShareRange share;
  share.begin = rank * base + std::min<int64_t>(rank, extra);
  share.end = share.begin + base + (rank < extra ? 1 : 0);
  return share;
}

Dataset Shard(const Dataset& data, int rank, int world) {
  const ShareRange share = ShareOf(data.size(), rank, world);
  if (data.size() == 0) return data;
  return RowsOf(data, RowBlock{share.begin, share.end});
}

}  // namespace worker
}  // namespace mpilearn
