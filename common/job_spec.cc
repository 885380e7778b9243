#include "common/job_spec.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/lr_schedule.h"
#include "common/spec_kinds.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn {
namespace {

absl::Status RangeError(absl::string_view field, absl::string_view range,
                        double got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be ", range, ", got ", got));
}

// Checks lo <= value <= hi for integers.
absl::Status CheckIntRange(absl::string_view field, int64_t value, int64_t lo,
                           int64_t hi) {
  if (value < lo || value > hi) {
    return RangeError(field, absl::StrCat("in [", lo, ", ", hi, "]"),
                      static_cast<double>(value));
  }
  return absl::OkStatus();
}

// Checks that `field` lists at most `most` values, each in [lo, hi].
absl::Status CheckIntList(
    absl::string_view field,
    const google::protobuf::RepeatedField<int32_t>& values, int most,
    int64_t lo, int64_t hi) {
  if (values.size() > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must list 1 to ", most, " values, got ", values.size()));
  }
  for (int i = 0; i < values.size(); ++i) {
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange(absl::StrCat(field, "[", i, "]"), values.Get(i), lo, hi));
  }
  return absl::OkStatus();
}

// Checks value in [0, 1) (false for NaN).
absl::Status CheckUnitInterval(absl::string_view field, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return RangeError(field, "in [0, 1)", value);
  }
  return absl::OkStatus();
}

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
  if (*kind == ModelKind::kMlp) {
    if (model->hidden().empty()) {
      model->add_hidden(256);
      model->add_hidden(128);
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
  if (data->features_dataset().empty()) data->set_features_dataset("features");
  if (data->labels_dataset().empty()) data->set_labels_dataset("labels");
  for (const auto& [field, name] :
       {std::pair<const char*, const std::string&>{"data.features_dataset",
                                                   data->features_dataset()},
        {"data.labels_dataset", data->labels_dataset()}}) {
    if (name.size() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be at most 1024 bytes"));
    }
  }
  if (data->features_dataset() == data->labels_dataset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.features_dataset and data.labels_dataset are both '",
        data->features_dataset(), "'"));
  }
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

absl::Status CheckPositiveFinite(absl::string_view field, double value) {
  if (!(std::isfinite(value) && value > 0.0)) {
    return RangeError(field, "a finite number > 0", value);
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegativeFinite(absl::string_view field, double value) {
  if (!(std::isfinite(value) && value >= 0.0)) {
    return RangeError(field, "a finite number >= 0", value);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NormalizeOptimizerSpec(v1::OptimizerSpec* opt) {
  if (opt->name().empty()) opt->set_name("adam");
  const std::string& name = opt->name();
  const bool sgd = name == "sgd";
  const bool adam = name == "adam" || name == "adamw";
  const bool rmsprop = name == "rmsprop";
  const bool adadelta = name == "adadelta";
  const bool adagrad = name == "adagrad";
  if (!sgd && !adam && !rmsprop && !adadelta && !adagrad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.name: unknown optimizer '", name,
        "'; available: 'sgd', 'adam', 'adamw', 'rmsprop', 'adadelta', "
        "'adagrad'"));
  }
  if (!opt->has_learning_rate()) {
    opt->set_learning_rate(adam ? 1e-3 : adadelta ? 1.0 : 1e-2);
  }
  MPILEARN_RETURN_IF_ERROR(
      CheckPositiveFinite("optimizer.learning_rate", opt->learning_rate()));
  if (!opt->has_weight_decay()) {
    opt->set_weight_decay(name == "adamw" ? 0.01 : 0.0);
  }
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegativeFinite("optimizer.weight_decay", opt->weight_decay()));
  // Every optimizer: absent or 0 means no clipping (not defaulted, so a
  // stored spec says whether it was asked for).
  if (opt->has_clip_grad_norm()) {
    MPILEARN_RETURN_IF_ERROR(CheckNonNegativeFinite("optimizer.clip_grad_norm",
                                                    opt->clip_grad_norm()));
  }
  if (sgd) {
    if (!opt->has_momentum()) opt->set_momentum(0.0);
    if (!opt->has_nesterov()) opt->set_nesterov(false);
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("optimizer.momentum", opt->momentum()));
    if (opt->nesterov() && opt->momentum() == 0.0) {
      return absl::InvalidArgumentError(
          "optimizer.nesterov requires optimizer.momentum > 0, got momentum 0");
    }
  } else if (adam) {
    if (!opt->has_beta1()) opt->set_beta1(0.9);
    if (!opt->has_beta2()) opt->set_beta2(0.999);
    if (!opt->has_epsilon()) opt->set_epsilon(1e-8);
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("optimizer.beta1", opt->beta1()));
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("optimizer.beta2", opt->beta2()));
    MPILEARN_RETURN_IF_ERROR(
        CheckPositiveFinite("optimizer.epsilon", opt->epsilon()));
  } else if (rmsprop) {
    if (!opt->has_alpha()) opt->set_alpha(0.99);
    if (!opt->has_epsilon()) opt->set_epsilon(1e-8);
    if (!opt->has_momentum()) opt->set_momentum(0.0);
    if (!opt->has_centered()) opt->set_centered(false);
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("optimizer.alpha", opt->alpha()));
    MPILEARN_RETURN_IF_ERROR(
        CheckPositiveFinite("optimizer.epsilon", opt->epsilon()));
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval("optimizer.momentum", opt->momentum()));
  } else if (adadelta) {
    if (!opt->has_rho()) opt->set_rho(0.9);
    if (!opt->has_epsilon()) opt->set_epsilon(1e-6);
    MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("optimizer.rho", opt->rho()));
    MPILEARN_RETURN_IF_ERROR(
        CheckPositiveFinite("optimizer.epsilon", opt->epsilon()));
  } else {  // adagrad
    if (!opt->has_lr_decay()) opt->set_lr_decay(0.0);
    if (!opt->has_initial_accumulator_value()) {
      opt->set_initial_accumulator_value(0.0);
    }
    if (!opt->has_epsilon()) opt->set_epsilon(1e-10);
    MPILEARN_RETURN_IF_ERROR(
        CheckNonNegativeFinite("optimizer.lr_decay", opt->lr_decay()));
    MPILEARN_RETURN_IF_ERROR(CheckNonNegativeFinite(
        "optimizer.initial_accumulator_value",
        opt->initial_accumulator_value()));
    MPILEARN_RETURN_IF_ERROR(
        CheckPositiveFinite("optimizer.epsilon", opt->epsilon()));
  }
  return absl::OkStatus();
}

namespace {

// Checks lo < value < hi (false for NaN).
absl::Status CheckOpenInterval(absl::string_view field, double value, double lo,
                               double hi) {
  if (!(value > lo && value < hi)) {
    return RangeError(field, absl::StrCat("in (", lo, ", ", hi, ")"), value);
  }
  return absl::OkStatus();
}

// The rank-local optimizer of EASGD: SGD only, with its own defaults
// (learning rate 0.05, momentum 0.9), since the workers step with it.
absl::Status NormalizeEasgdWorkerOptimizer(v1::OptimizerSpec* opt) {
  if (opt->name().empty()) opt->set_name("sgd");
  if (opt->name() != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat(
        "easgd.worker_optimizer.name: only 'sgd' runs on the workers, got '",
        opt->name(), "'"));
  }
  if (!opt->has_learning_rate()) opt->set_learning_rate(0.05);
  MPILEARN_RETURN_IF_ERROR(CheckPositiveFinite(
      "easgd.worker_optimizer.learning_rate", opt->learning_rate()));
  if (!opt->has_momentum()) opt->set_momentum(0.9);
  MPILEARN_RETURN_IF_ERROR(
      CheckUnitInterval("easgd.worker_optimizer.momentum", opt->momentum()));
  if (!opt->has_nesterov()) opt->set_nesterov(false);
  if (opt->nesterov() && opt->momentum() == 0.0) {
    return absl::InvalidArgumentError(
        "easgd.worker_optimizer.nesterov requires "
        "easgd.worker_optimizer.momentum > 0, got momentum 0");
  }
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.0);
  MPILEARN_RETURN_IF_ERROR(CheckNonNegativeFinite(
      "easgd.worker_optimizer.weight_decay", opt->weight_decay()));
  return absl::OkStatus();
}

absl::Status NormalizeEasgd(v1::EasgdSpec* easgd) {
  if (!easgd->has_alpha()) easgd->set_alpha(0.1);
  MPILEARN_RETURN_IF_ERROR(
      CheckOpenInterval("easgd.alpha", easgd->alpha(), 0.0, 1.0));
  return NormalizeEasgdWorkerOptimizer(easgd->mutable_worker_optimizer());
}

// GEM's defaults, tuned on Fashion-MNIST (MLP, 2 ranks, batch 64, one
// epoch) to reach downpour's test accuracy: mpi_learn's 0.01 and 0.9 left
// the proxy's energy budget, and so every step, too small.
absl::Status NormalizeGem(v1::GemSpec* gem) {
  if (!gem->has_learning_rate()) gem->set_learning_rate(0.05);
  MPILEARN_RETURN_IF_ERROR(
      CheckPositiveFinite("gem.learning_rate", gem->learning_rate()));
  if (!gem->has_momentum()) gem->set_momentum(0.99);
  MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("gem.momentum", gem->momentum()));
  if (!gem->has_kappa()) gem->set_kappa(1.0);
  MPILEARN_RETURN_IF_ERROR(CheckPositiveFinite("gem.kappa", gem->kappa()));
  return absl::OkStatus();
}

// Whether a normalized spec's loss takes classes as labels.
bool IsClassificationLoss(const std::string& loss) {
  const std::optional<LossKind> kind = LossKindFromName(loss);
  return kind && InfoOf(*kind).classification;
}

// The loss (default categorical_crossentropy) and, for huber, its delta.
absl::Status NormalizeLoss(v1::JobSpec* spec) {
  if (spec->loss().empty()) {
    spec->set_loss(std::string(InfoOf(LossKind::kCategoricalCrossentropy).name));
  }
  const std::optional<LossKind> loss = LossKindFromName(spec->loss());
  if (!loss) return UnknownName("loss", "loss", spec->loss(), LossNames());
  if (*loss == LossKind::kHuber) {
    if (!spec->has_huber_delta()) spec->set_huber_delta(1.0);
    MPILEARN_RETURN_IF_ERROR(
        CheckPositiveFinite("huber_delta", spec->huber_delta()));
  }
  return absl::OkStatus();
}

// The exchange's wire dtypes: fp32 (the default, also for UNSPECIFIED),
// bf16 or fp16, filled in; error_feedback defaults to true.
absl::Status NormalizeExchange(v1::JobSpec* spec) {
  v1::ExchangeSpec* exchange = spec->mutable_exchange();
  auto check = [](absl::string_view field, v1::DType dtype) -> absl::Status {
    switch (dtype) {
      case v1::DTYPE_FLOAT32:
      case v1::DTYPE_BFLOAT16:
      case v1::DTYPE_FLOAT16:
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "exchange.", field, ": expected DTYPE_FLOAT32, DTYPE_BFLOAT16 or ",
            "DTYPE_FLOAT16, got ", static_cast<int>(dtype)));
    }
  };
  if (exchange->update_dtype() == v1::DTYPE_UNSPECIFIED) {
    exchange->set_update_dtype(v1::DTYPE_FLOAT32);
  }
  if (exchange->weights_dtype() == v1::DTYPE_UNSPECIFIED) {
    exchange->set_weights_dtype(v1::DTYPE_FLOAT32);
  }
  MPILEARN_RETURN_IF_ERROR(check("update_dtype", exchange->update_dtype()));
  MPILEARN_RETURN_IF_ERROR(check("weights_dtype", exchange->weights_dtype()));
  if (!exchange->has_error_feedback()) exchange->set_error_feedback(true);
  if (!exchange->has_updates_in_flight()) exchange->set_updates_in_flight(1);
  return CheckIntRange("exchange.updates_in_flight", exchange->updates_in_flight(), 1,
                       kMaxUpdatesInFlight);
}

// Checks that `metric`, named by `field`, is a validation metric the job's
// loss reports (val_loss, and val_accuracy for classification losses or
// val_mae and val_mse for regression losses), or "none" when `none_ok`.
absl::Status CheckMetric(absl::string_view field, const std::string& metric,
                         const v1::JobSpec& spec, bool none_ok) {
  const bool classification = IsClassificationLoss(spec.loss());
  // binary_crossentropy also reports val_auc (a single-output model's).
  const bool binary = spec.loss() == "binary_crossentropy";
  std::vector<std::string> reported = {"'val_loss'"};
  if (classification) reported.push_back("'val_accuracy'");
  if (binary) reported.push_back("'val_auc'");
  if (classification && !binary) reported.push_back("'val_top5_accuracy' (over 5+ classes)");
  if (!classification) reported.insert(reported.end(), {"'val_mae'", "'val_mse'"});
  const std::string reports =
      absl::StrCat("loss '", spec.loss(), "' reports ", absl::StrJoin(reported, ", "));
  if (metric == "val_loss" || (none_ok && metric == "none") || (binary && metric == "val_auc") ||
      (classification && !binary && metric == "val_top5_accuracy")) {
    return absl::OkStatus();
  }
  if (metric == "val_accuracy") {
    if (classification) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": val_accuracy needs a classification loss "
               "(categorical_crossentropy or binary_crossentropy); ",
        reports));
  }
  if (metric == "val_mae" || metric == "val_mse") {
    if (!classification) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", metric, " needs a regression loss (mse, mae or huber); ",
        reports));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown metric '", metric, "'; available: ",
      absl::StrJoin(reported, ", "), " (the metrics loss '", spec.loss(),
      "' reports)", none_ok ? " or 'none'" : ""));
}

absl::Status NormalizeEarlyStopping(const v1::JobSpec& spec,
                                    v1::EarlyStoppingSpec* stopping) {
  if (stopping->metric().empty()) stopping->set_metric("val_loss");
  MPILEARN_RETURN_IF_ERROR(CheckMetric("early_stopping.metric",
                                       stopping->metric(), spec,
                                       /*none_ok=*/false));
  if (!stopping->has_patience()) stopping->set_patience(4);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("early_stopping.patience",
                                         stopping->patience(), 1, 1000000));
  if (!stopping->has_min_delta()) stopping->set_min_delta(0.0);
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegativeFinite("early_stopping.min_delta", stopping->min_delta()));
  if (!stopping->has_smoothing()) stopping->set_smoothing(1);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("early_stopping.smoothing",
                                         stopping->smoothing(), 1, 1000));
  return absl::OkStatus();
}

absl::Status NormalizeTarget(const v1::JobSpec& spec, v1::TargetSpec* target) {
  if (target->metric().empty()) {
    target->set_metric(IsClassificationLoss(spec.loss()) ? "val_accuracy"
                                                         : "val_loss");
  }
  MPILEARN_RETURN_IF_ERROR(
      CheckMetric("target.metric", target->metric(), spec, /*none_ok=*/false));
  if (!target->has_value()) return absl::OkStatus();  // the rule is off
  if (!std::isfinite(target->value())) {
    return RangeError("target.value", "a finite number", target->value());
  }
  if (target->metric() == "val_accuracy" &&
      !(target->value() >= 0.0 && target->value() <= 1.0)) {
    return RangeError("target.value", "in [0, 1] for val_accuracy",
                      target->value());
  }
  if ((target->metric() == "val_mae" || target->metric() == "val_mse") &&
      !(target->value() >= 0.0)) {
    return RangeError("target.value",
                      absl::StrCat(">= 0 for ", target->metric()),
                      target->value());
  }
  return absl::OkStatus();
}

absl::Status NormalizeCheckpoint(const v1::JobSpec& spec,
                                 v1::CheckpointSpec* checkpoint) {
  if (!checkpoint->has_every_updates()) checkpoint->set_every_updates(0);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("checkpoint.every_updates",
                                         checkpoint->every_updates(), 0,
                                         int64_t{1} << 40));
  if (!checkpoint->has_every_seconds()) checkpoint->set_every_seconds(60.0);
  MPILEARN_RETURN_IF_ERROR(CheckNonNegativeFinite("checkpoint.every_seconds",
                                                  checkpoint->every_seconds()));
  if (!checkpoint->has_keep()) checkpoint->set_keep(3);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("checkpoint.keep", checkpoint->keep(), 1, 1000));
  if (checkpoint->best_metric().empty()) checkpoint->set_best_metric("val_loss");
  return CheckMetric("checkpoint.best_metric", checkpoint->best_metric(), spec,
                     /*none_ok=*/true);
}

absl::Status NormalizeSnapshots(v1::SnapshotSpec* snapshots) {
  if (!snapshots->has_every_updates()) snapshots->set_every_updates(0);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("snapshots.every_updates",
                                         snapshots->every_updates(), 0,
                                         int64_t{1} << 40));
  if (!snapshots->has_at_epoch_end()) snapshots->set_at_epoch_end(true);
  return absl::OkStatus();
}

}  // namespace

v1::Algorithm AlgorithmFromName(absl::string_view name) {
  return AlgorithmKindFromName(name).value_or(v1::ALGORITHM_UNSPECIFIED);
}

v1::Algorithm AlgorithmOf(const v1::JobSpec& spec) {
  // Normalized specs name one of the four; an empty name is the default.
  if (spec.algorithm().empty()) return v1::ALGORITHM_DOWNPOUR;
  return AlgorithmFromName(spec.algorithm());
}

v1::UpdateKind UpdateKindOf(v1::Algorithm algorithm) {
  switch (algorithm) {
    case v1::ALGORITHM_EASGD:
      return v1::UPDATE_KIND_ELASTIC;
    case v1::ALGORITHM_GEM:
      return v1::UPDATE_KIND_DELTA;
    default:
      return v1::UPDATE_KIND_GRADIENT;
  }
}

absl::Status NormalizeJobSpec(v1::JobSpec* spec) {
  MPILEARN_RETURN_IF_ERROR(NormalizeModel(spec->mutable_model()));
  MPILEARN_RETURN_IF_ERROR(NormalizeData(spec->mutable_data()));
  MPILEARN_RETURN_IF_ERROR(NormalizeLoss(spec));
  MPILEARN_RETURN_IF_ERROR(NormalizeExchange(spec));
  MPILEARN_RETURN_IF_ERROR(NormalizeOptimizerSpec(spec->mutable_optimizer()));
  if (spec->algorithm().empty()) spec->set_algorithm("downpour");
  const v1::Algorithm algorithm = AlgorithmFromName(spec->algorithm());
  if (algorithm == v1::ALGORITHM_UNSPECIFIED) {
    return UnknownName("algorithm", "algorithm", spec->algorithm(),
                       AlgorithmNames());
  }
  if (spec->optimizer().has_schedule()) {
    v1::LrScheduleSpec* schedule = spec->mutable_optimizer()->mutable_schedule();
    MPILEARN_RETURN_IF_ERROR(NormalizeLrSchedule(schedule));
    if (schedule->name() == "plateau") {
      MPILEARN_RETURN_IF_ERROR(CheckMetric("optimizer.schedule.metric", schedule->metric(), *spec,
                                           /*none_ok=*/false));
    }
  }
  if (!spec->has_epochs()) spec->set_epochs(5);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("epochs", spec->epochs(), 1, 100000));
  if (!spec->has_batch_size()) spec->set_batch_size(64);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("batch_size", spec->batch_size(), 1, 1 << 20));
  if (!spec->has_sync_every()) spec->set_sync_every(1);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("sync_every", spec->sync_every(), 1, 1 << 20));
  if (!spec->has_seed()) spec->set_seed(1);
  if (!spec->has_max_staleness()) spec->set_max_staleness(0);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("max_staleness", spec->max_staleness(), 0, 1 << 30));
  if (spec->staleness_scaling().empty()) spec->set_staleness_scaling("none");
  if (!StalenessScalingFromName(spec->staleness_scaling())) {
    return UnknownName("staleness_scaling", "scaling",
                       spec->staleness_scaling(), StalenessScalingNames());
  }
  if (!spec->has_max_shards()) spec->set_max_shards(0);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("max_shards", spec->max_shards(), 0, 64));
  if (spec->has_slice() && (spec->slice().shards() < 1 || spec->slice().shards() > 64 ||
                            spec->slice().shard() < 0 ||
                            spec->slice().shard() >= spec->slice().shards())) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice: shard ", spec->slice().shard(), " of ", spec->slice().shards(),
                     " is not a shard (0 <= shard < shards <= 64)"));
  }
  if (!spec->has_data_unit_size()) spec->set_data_unit_size(2048);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("data_unit_size",
                                         spec->data_unit_size(), 1,
                                         int64_t{1} << 40));
  if (spec->exchange().updates_in_flight() > 1 && algorithm != v1::ALGORITHM_DOWNPOUR &&
      algorithm != v1::ALGORITHM_SYNC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exchange.updates_in_flight is ", spec->exchange().updates_in_flight(),
        " but algorithm '", spec->algorithm(),
        "' exchanges the rank's own weights (only downpour and sync keep several "
        "updates in flight); remove it or set it to 1"));
  }
  // The algorithms' own sections are filled in and checked only for the
  // algorithm that uses them; the others are left as given.
  if ((algorithm == v1::ALGORITHM_EASGD || algorithm == v1::ALGORITHM_GEM) &&
      spec->optimizer().has_schedule() && spec->optimizer().schedule().name() != "constant") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.schedule: algorithm '",
        spec->algorithm(), "' applies its own rule on the master, not the optimizer; remove it"));
  }
  if (algorithm == v1::ALGORITHM_EASGD) {
    MPILEARN_RETURN_IF_ERROR(NormalizeEasgd(spec->mutable_easgd()));
  } else if (algorithm == v1::ALGORITHM_GEM) {
    MPILEARN_RETURN_IF_ERROR(NormalizeGem(spec->mutable_gem()));
  }
  // Early stopping is on only when its section is present; the target rule
  // only when target.value is set.
  if (spec->has_early_stopping()) {
    MPILEARN_RETURN_IF_ERROR(
        NormalizeEarlyStopping(*spec, spec->mutable_early_stopping()));
  }
  if (spec->has_target()) {
    MPILEARN_RETURN_IF_ERROR(NormalizeTarget(*spec, spec->mutable_target()));
  }
  MPILEARN_RETURN_IF_ERROR(
      NormalizeCheckpoint(*spec, spec->mutable_checkpoint()));
  MPILEARN_RETURN_IF_ERROR(NormalizeSnapshots(spec->mutable_snapshots()));
  if (!spec->has_inband_validation()) spec->set_inband_validation(true);
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not valid JSON for JobSpec: ",
                     std::string(status.message()),
                     " (see docs/protocol.md for the fields)"));
  }
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&spec));
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job spec '", path, "'"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(contents.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

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
  if (*kind == ModelKind::kMlp) {
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

std::string JobSpecToJson(const v1::JobSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  return json;
}

}  // namespace mpilearn
