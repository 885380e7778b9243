// The model and data parts of NormalizeJobSpec, and MinModelParameters
// (job_spec.h).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_internal.h"
#include "common/spec/spec_kinds.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace spec_internal {

// Fills in and checks the fields the spec's model uses (ModelSpec in
// proto/mpilearn.proto); fields of other models are left as given. A
// TorchScript model has none of the built-in fields to check.
absl::Status NormalizeModel(v1::ModelSpec* model) {
  if (!model->torchscript().empty()) {
    model->set_name(std::string(InfoOf(ModelKind::kTorchScript).name));
    return absl::OkStatus();
  }
  if (model->name().empty()) {
    model->set_name(std::string(InfoOf(ModelKind::kMlp).name));
  }
  const std::string& name = model->name();
  if (name == InfoOf(ModelKind::kTorchScript).name) {
    return absl::InvalidArgumentError(
        "model.torchscript: path required (model.name is 'torchscript' but "
        "no scripted module file is given)");
  }
  const std::optional<ModelKind> kind = BuiltInModelFromName(name);
  if (!kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.name: unknown model '", name, "'; built-in models are ",
        ModelNames(), " (or set model.torchscript to a scripted module)"));
  }
  const bool conv = InfoOf(*kind).conv_dims > 0;
  if (*kind == ModelKind::kMlp || *kind == ModelKind::kTowers) {
    // towers: hidden[0] is each input's tower, the rest shared.
    if (model->hidden().empty()) {
      const bool mlp = *kind == ModelKind::kMlp;
      model->add_hidden(mlp ? 256 : 128);
      model->add_hidden(mlp ? 128 : 64);
    }
    for (int i = 0; i < model->hidden_size(); ++i) {
      MPILEARN_RETURN_IF_ERROR(CheckIntRange(absl::StrCat("model.hidden[", i, "]"),
                                             model->hidden(i), 1, 1 << 20));
    }
  } else if (conv) {
    if (model->channels().empty()) {
      model->add_channels(32);
      model->add_channels(64);
    }
    MPILEARN_RETURN_IF_ERROR(
        CheckIntList("model.channels", model->channels(), 64, 1, 4096));
    if (!model->has_kernel_size()) model->set_kernel_size(3);
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange("model.kernel_size", model->kernel_size(), 1, 64));
    if (model->padding().empty()) model->set_padding("same");
    if (model->padding() != "same" && model->padding() != "valid") {
      return absl::InvalidArgumentError(
          absl::StrCat("model.padding: unknown padding '", model->padding(),
                       "'; available: 'same', 'valid'"));
    }
    if (!model->has_pool_every()) model->set_pool_every(1);
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange("model.pool_every", model->pool_every(), 0, 64));
    if (!model->has_dense()) model->set_dense(128);
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange("model.dense", model->dense(), 0, 1 << 20));
    if (!model->has_conv_dropout()) model->set_conv_dropout(0.0);
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("model.conv_dropout", model->conv_dropout()));
  } else {  // gru, lstm
    if (model->recurrent().empty()) model->add_recurrent(64);
    MPILEARN_RETURN_IF_ERROR(
        CheckIntList("model.recurrent", model->recurrent(), 16, 1, 1 << 16));
    if (!model->has_dense()) model->set_dense(0);
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange("model.dense", model->dense(), 0, 1 << 20));
  }
  if (!model->has_batch_norm()) model->set_batch_norm(false);
  if (!model->has_dropout()) model->set_dropout(0.0);
  return CheckUnitInterval("model.dropout", model->dropout());
}

// Bounds a file list's entries: at most kMaxFiles paths of at most
// kMaxPathBytes each, none empty.
absl::Status CheckFileList(absl::string_view field,
                           const google::protobuf::RepeatedPtrField<std::string>& files) {
  constexpr int kMaxFiles = 100000;
  constexpr size_t kMaxPathBytes = 4096;
  if (files.size() > kMaxFiles) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " lists ", files.size(), " files; at most ", kMaxFiles,
        " (list more in a text file, one path per line)"));
  }
  for (int i = 0; i < files.size(); ++i) {
    if (files[i].empty() || files[i].size() > kMaxPathBytes ||
        files[i].find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] must be a path of 1 to ", kMaxPathBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// The file-list form of DataSpec (HDF5, NumPy).
absl::Status NormalizeDataFiles(v1::DataSpec* data) {
  if (!data->train_images().empty() || !data->train_labels().empty() ||
      !data->validation_images().empty() || !data->test_images().empty()) {
    return absl::InvalidArgumentError(
        "data: give either the IDX files (train_images, train_labels, ...) or "
        "the file lists (train_files, ...), not both");
  }
  MPILEARN_RETURN_IF_ERROR(CheckFileList("data.train_files", data->train_files()));
  MPILEARN_RETURN_IF_ERROR(
      CheckFileList("data.validation_files", data->validation_files()));
  MPILEARN_RETURN_IF_ERROR(CheckFileList("data.test_files", data->test_files()));
  // One dataset each (features_dataset, labels_dataset), or lists.
  constexpr int kMaxDatasets = 16;
  std::vector<std::pair<std::string, std::string>> named;  // field, name
  for (const auto& [single, list, fallback] :
       {std::tuple<const char*, const char*, const char*>{"features_dataset",
                                                          "features_datasets", "features"},
        {"labels_dataset", "labels_datasets", "labels"}}) {
    const bool features = std::string(single) == "features_dataset";
    std::string* one =
        features ? data->mutable_features_dataset() : data->mutable_labels_dataset();
    const auto& many = features ? data->features_datasets() : data->labels_datasets();
    if (many.empty()) {
      if (one->empty()) *one = fallback;
      named.emplace_back(absl::StrCat("data.", single), *one);
      continue;
    }
    if (!one->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("data: give ", single, " (one dataset) or ",
                                                     list, " (several), not both"));
    }
    if (many.size() > kMaxDatasets) {
      return absl::InvalidArgumentError(absl::StrCat("data.", list, " names ", many.size(),
                                                     " datasets; at most ", kMaxDatasets));
    }
    for (int i = 0; i < many.size(); ++i) {
      named.emplace_back(absl::StrCat("data.", list, "[", i, "]"), many[i]);
    }
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [field, name] = named[i];
    if (name.empty() || name.size() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be a name of 1 to 1024 bytes"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (named[j].second == name) {
        return absl::InvalidArgumentError(absl::StrCat(
            named[j].first, " and ", field, " are both '", name,
            "'; every features and labels dataset must be a different one"));
      }
    }
  }
  return absl::OkStatus();
}

// Cross-validation (data.folds, data.fold): the held-out rows are one block
// of the training rows, so nothing else may choose them: validation_count
// defaults to 0 instead of 5000. Passes again on its own output (a spec is
// normalized again when it is resubmitted).
absl::Status NormalizeFolds(v1::DataSpec* data) {
  const int32_t folds = data->folds();
  if (folds == 0) {  // unset or off
    if (data->has_fold()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.fold is ", data->fold(),
          " but data.folds is not set; set data.folds (2 to 100 blocks, one held out for "
          "validation) or remove data.fold"));
    }
    return absl::OkStatus();
  }
  if (folds == 1) {
    return absl::InvalidArgumentError(
        "data.folds is 1, but cross-validation holds out one of at least 2 blocks; give 2 "
        "or more, or leave it unset");
  }
  if (folds < 0 || folds > 100) {
    return RangeError("data.folds", "0 (off) or in [2, 100]", folds);
  }
  if (!data->has_fold()) data->set_fold(0);
  if (data->fold() < 0 || data->fold() >= folds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.fold is ", data->fold(), " but data.folds is ", folds,
        "; the held-out block must be in [0, ", folds - 1, "]"));
  }
  if (!data->validation_files().empty() || !data->validation_images().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.folds holds out each fold in turn; remove ",
        data->validation_files().empty()
            ? "data.validation_images and data.validation_labels"
            : "data.validation_files",
        ", or data.folds to validate on those files"));
  }
  if (data->validation_count() > 0) {
    return absl::InvalidArgumentError(
        "data.validation_count and data.folds both choose the validation rows; give one");
  }
  if (!data->has_validation_count()) data->set_validation_count(0);
  return absl::OkStatus();
}

absl::Status NormalizeData(v1::DataSpec* data) {
  const bool files = !data->train_files().empty();
  if (files) {
    MPILEARN_RETURN_IF_ERROR(NormalizeDataFiles(data));
  } else if (!data->validation_files().empty() || !data->test_files().empty()) {
    return absl::InvalidArgumentError(
        "data.validation_files and data.test_files need data.train_files");
  }
  if (!files && (data->train_images().empty() || data->train_labels().empty())) {
    return absl::InvalidArgumentError(
        "data.train_images and data.train_labels are required (gzip'd IDX "
        "files, e.g. /usr/share/datasets/fashion-mnist/"
        "train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz), or "
        "data.train_files (HDF5 or NumPy files)");
  }
  if (data->validation_images().empty() != data->validation_labels().empty()) {
    return absl::InvalidArgumentError(
        "data.validation_images and data.validation_labels must be given "
        "together (or both left out to hold out data.validation_count "
        "training samples)");
  }
  if (data->test_images().empty() != data->test_labels().empty()) {
    return absl::InvalidArgumentError(
        "data.test_images and data.test_labels must be given together");
  }
  MPILEARN_RETURN_IF_ERROR(NormalizeFolds(data));
  if (!data->has_train_limit()) data->set_train_limit(0);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("data.train_limit", data->train_limit(), 0, int64_t{1} << 40));
  if (!data->has_validation_count()) {
    const bool separate = !data->validation_images().empty() ||
                          !data->validation_files().empty();
    data->set_validation_count(separate ? 0 : 5000);
  }
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("data.validation_count",
                                         data->validation_count(), 0,
                                         int64_t{1} << 40));
  if (!data->has_test_limit()) data->set_test_limit(0);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("data.test_limit", data->test_limit(), 0, int64_t{1} << 40));
  if (!data->has_shuffle_within_unit()) data->set_shuffle_within_unit(true);
  if (data->bad_values().empty()) data->set_bad_values("fail");
  if (!BadValuesFromName(data->bad_values())) {
    return UnknownName("data.bad_values", "policy", data->bad_values(),
                       BadValuesNames());
  }
  if (!data->has_max_unit_failures()) data->set_max_unit_failures(3);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("data.max_unit_failures",
                                         data->max_unit_failures(), 1, 1000));
  v1::Normalization* norm = data->mutable_normalization();
  if (norm->mode().empty()) norm->set_mode("none");
  const std::optional<NormalizationMode> mode =
      NormalizationModeFromName(norm->mode());
  if (!mode) {
    return UnknownName("data.normalization.mode", "mode", norm->mode(),
                       absl::StrCat(NormalizationModeNames(),
                                    " ('scale' is x * scale + offset, "
                                    "'standardize' per feature from the "
                                    "training rows)"));
  }
  if (*mode == NormalizationMode::kScale) {
    if (!norm->has_scale()) norm->set_scale(1.0);
    if (!norm->has_offset()) norm->set_offset(0.0);
    if (!std::isfinite(norm->scale()) || norm->scale() == 0.0) {
      return RangeError("data.normalization.scale", "finite and not 0",
                        norm->scale());
    }
    if (!std::isfinite(norm->offset())) {
      return RangeError("data.normalization.offset", "finite", norm->offset());
    }
  }
  if (*mode == NormalizationMode::kStandardize) {
    if (!norm->has_sample_rows()) norm->set_sample_rows(100000);
    MPILEARN_RETURN_IF_ERROR(CheckIntRange("data.normalization.sample_rows",
                                           norm->sample_rows(), 1,
                                           int64_t{100000000}));
  }
  return absl::OkStatus();
}

}  // namespace spec_internal

namespace {

// Saturating arithmetic for MinModelParameters.
uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}
uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t product;
  return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

// Weights and biases of a dense layer `in` -> `out`.
uint64_t DenseParameters(uint64_t in, uint64_t out) {
  return SatAdd(SatMul(in, out), out);
}

uint64_t NonNegative(int64_t value) {
  return value > 0 ? static_cast<uint64_t>(value) : 0;
}

}  // namespace

uint64_t MinModelParameters(const v1::ModelSpec& model) {
  const std::optional<ModelKind> kind = BuiltInModelFromName(model.name());
  if (!kind) return 0;  // TorchScript: only the workers know
  const ModelKindInfo& info = InfoOf(*kind);
  uint64_t total = 0;
  if (*kind == ModelKind::kMlp || *kind == ModelKind::kTowers) {
    uint64_t in = 1;  // the input's size, at least 1
    for (int32_t width : model.hidden()) {
      total = SatAdd(total, DenseParameters(in, NonNegative(width)));
      in = NonNegative(width);
    }
    return SatAdd(total, DenseParameters(in, 1));  // to at least one output
  }
  if (info.conv_dims > 0) {
    const uint64_t kernel = NonNegative(model.kernel_size());
    const uint64_t window = info.conv_dims == 2 ? SatMul(kernel, kernel) : kernel;
    uint64_t in = 1;  // input channels, at least 1
    for (int32_t channels : model.channels()) {
      total = SatAdd(total, DenseParameters(SatMul(in, window),
                                            NonNegative(channels)));
      in = NonNegative(channels);
    }
    const uint64_t dense = NonNegative(model.dense());
    if (dense > 0) {
      total = SatAdd(total, DenseParameters(in, dense));
      in = dense;
    }
    return SatAdd(total, DenseParameters(in, 1));
  }
  if (info.recurrent_gates > 0) {
    const uint64_t gates = static_cast<uint64_t>(info.recurrent_gates);
    uint64_t in = 1;
    for (int32_t units : model.recurrent()) {
      const uint64_t u = NonNegative(units);
      // weight_ih, weight_hh and two biases per gate row.
      total = SatAdd(total, SatMul(SatMul(gates, u), SatAdd(SatAdd(in, u), 2)));
      in = u;
    }
    const uint64_t dense = NonNegative(model.dense());
    if (dense > 0) {
      total = SatAdd(total, DenseParameters(in, dense));
      in = dense;
    }
    return SatAdd(total, DenseParameters(in, 1));
  }
  return total;  // not reached: every built-in kind is one of the above
}

}  // namespace mpilearn
