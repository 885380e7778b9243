// The training parts of NormalizeJobSpec: optimizer (NormalizeOptimizerSpec,
// job_spec.h), loss, exchange, easgd and gem, stop rules, checkpoints and
// snapshots.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/lr_schedule.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_internal.h"
#include "common/spec/spec_kinds.h"
#include "common/status_macros.h"

namespace mpilearn {

using spec_internal::CheckNonNegativeFinite;
using spec_internal::CheckOpenInterval;
using spec_internal::CheckPositiveFinite;
using spec_internal::CheckUnitInterval;

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

namespace spec_internal {

// A rank-local optimizer (easgd.worker_optimizer, gem.worker_optimizer):
// "sgd" (the default; learning rate `sgd_lr`, momentum `sgd_momentum` unless
// given) or "adam" (PyTorch's defaults), named `field` in messages.
absl::Status NormalizeWorkerOptimizer(absl::string_view field, v1::OptimizerSpec* opt,
                                      double sgd_lr, double sgd_momentum) {
  if (opt->name().empty()) opt->set_name("sgd");
  const std::string at = absl::StrCat(field, ".");
  if (opt->name() == "adam") {
    if (!opt->has_learning_rate()) opt->set_learning_rate(1e-3);
    MPILEARN_RETURN_IF_ERROR(CheckPositiveFinite(at + "learning_rate", opt->learning_rate()));
    if (!opt->has_beta1()) opt->set_beta1(0.9);
    MPILEARN_RETURN_IF_ERROR(CheckUnitInterval(at + "beta1", opt->beta1()));
    if (!opt->has_beta2()) opt->set_beta2(0.999);
    MPILEARN_RETURN_IF_ERROR(CheckUnitInterval(at + "beta2", opt->beta2()));
    if (!opt->has_epsilon()) opt->set_epsilon(1e-8);
    MPILEARN_RETURN_IF_ERROR(CheckPositiveFinite(at + "epsilon", opt->epsilon()));
  } else if (opt->name() == "sgd") {
    if (!opt->has_learning_rate()) opt->set_learning_rate(sgd_lr);
    MPILEARN_RETURN_IF_ERROR(CheckPositiveFinite(at + "learning_rate", opt->learning_rate()));
    if (!opt->has_momentum()) opt->set_momentum(sgd_momentum);
    MPILEARN_RETURN_IF_ERROR(CheckUnitInterval(at + "momentum", opt->momentum()));
    if (!opt->has_nesterov()) opt->set_nesterov(false);
    if (opt->nesterov() && opt->momentum() == 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(at, "nesterov requires ", at,
                                                     "momentum > 0, got momentum 0"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        at, "name: the ranks step with 'sgd' or 'adam', got '", opt->name(), "'"));
  }
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.0);
  return CheckNonNegativeFinite(at + "weight_decay", opt->weight_decay());
}

absl::Status NormalizeEasgd(v1::EasgdSpec* easgd) {
  if (!easgd->has_alpha()) easgd->set_alpha(0.1);
  MPILEARN_RETURN_IF_ERROR(
      CheckOpenInterval("easgd.alpha", easgd->alpha(), 0.0, 1.0));
  return NormalizeWorkerOptimizer("easgd.worker_optimizer", easgd->mutable_worker_optimizer(),
                               /*sgd_lr=*/0.05, /*sgd_momentum=*/0.9);
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
  if (gem->has_worker_optimizer()) {
    return NormalizeWorkerOptimizer("gem.worker_optimizer", gem->mutable_worker_optimizer(),
                                    /*sgd_lr=*/0.05, /*sgd_momentum=*/0.0);
  }
  return absl::OkStatus();
}

// Whether a normalized spec's loss takes classes as labels.
bool IsClassificationLoss(const std::string& loss) {
  const std::optional<LossKind> kind = LossKindFromName(loss);
  return kind && InfoOf(*kind).classification;
}

// The loss (default categorical_crossentropy) and, for huber, its delta.
absl::Status NormalizeLoss(v1::JobSpec* spec) {
  if (spec->outputs_size() > 0) return NormalizeOutputs(spec);
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
  return NormalizeLossOptions(*loss, spec->loss(), spec->loss_options(), "this job", "");
}

namespace {

// The most class weights or pos_weight values a spec holds (classes or
// outputs, far above any data set's).
constexpr int kMaxLossWeights = 100000;
constexpr int kMaxTopK = 1000;
constexpr size_t kMaxPathBytes = 4096;

// Each of `values` finite and >= `lo` (> lo when `open`); at most
// kMaxLossWeights of them.
absl::Status CheckWeights(absl::string_view field,
                          const google::protobuf::RepeatedField<double>& values, bool open) {
  if (values.size() > kMaxLossWeights) {
    return absl::InvalidArgumentError(absl::StrCat(field, " holds at most ", kMaxLossWeights,
                                                   " values, got ", values.size()));
  }
  for (int i = 0; i < values.size(); ++i) {
    const std::string at = absl::StrCat(field, "[", i, "]");
    MPILEARN_RETURN_IF_ERROR(open ? CheckPositiveFinite(at, values.Get(i))
                                  : CheckNonNegativeFinite(at, values.Get(i)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NormalizeWarmStart(const v1::WarmStartSpec& warm) {
  const int sources = (warm.job_id().empty() ? 0 : 1) + (warm.checkpoint().empty() ? 0 : 1) +
                      (warm.torchscript().empty() ? 0 : 1);
  if (sources != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warm_start names ", sources,
        " sources; give exactly one: job_id (a job on this master), checkpoint (a file the "
        "master reads) or torchscript (an exported model the workers read)"));
  }
  if (!warm.torchscript().empty() && warm.optimizer_state()) {
    return absl::InvalidArgumentError(
        "warm_start.optimizer_state: a TorchScript file holds no optimizer state; start from "
        "the job (job_id) or its checkpoint for that");
  }
  if (warm.torchscript().size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("warm_start.torchscript: a path of at most ",
                                                   kMaxPathBytes, " bytes, got ",
                                                   warm.torchscript().size()));
  }
  if (warm.job_id().size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warm_start.job_id: at most 128 bytes, got ", warm.job_id().size()));
  }
  if (warm.checkpoint().size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("warm_start.checkpoint: a path of at most ",
                                                   kMaxPathBytes, " bytes, got ",
                                                   warm.checkpoint().size()));
  }
  return absl::OkStatus();
}

absl::Status NormalizeLossOptions(LossKind loss, const std::string& loss_name,
                                  const v1::LossOptions& options, absl::string_view owner,
                                  absl::string_view prefix) {
  const bool categorical = loss == LossKind::kCategoricalCrossentropy;
  const bool binary = loss == LossKind::kBinaryCrossentropy;
  auto only = [&](absl::string_view field, absl::string_view losses) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "loss_options.", field, " applies to ",
                                                   losses, " only; ", owner, "'s loss is '",
                                                   loss_name, "'"));
  };
  if (options.class_weights_size() > 0) {
    if (!categorical) return only("class_weights", "categorical_crossentropy");
    MPILEARN_RETURN_IF_ERROR(
        CheckWeights(absl::StrCat(prefix, "loss_options.class_weights"), options.class_weights(), /*open=*/false));
    bool any = false;
    for (double weight : options.class_weights()) any = any || weight > 0;
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "loss_options.class_weights are all 0: at least one class must count"));
    }
  }
  if (options.has_label_smoothing()) {
    if (!categorical) return only("label_smoothing", "categorical_crossentropy");
    MPILEARN_RETURN_IF_ERROR(
        CheckUnitInterval(absl::StrCat(prefix, "loss_options.label_smoothing"), options.label_smoothing()));
  }
  if (options.pos_weight_size() > 0) {
    if (!binary) return only("pos_weight", "binary_crossentropy");
    MPILEARN_RETURN_IF_ERROR(
        CheckWeights(absl::StrCat(prefix, "loss_options.pos_weight"), options.pos_weight(), /*open=*/true));
  }
  if (options.has_top_k()) {
    if (!categorical) return only("top_k", "categorical_crossentropy");
    MPILEARN_RETURN_IF_ERROR(CheckIntRange(absl::StrCat(prefix, "loss_options.top_k"), options.top_k(), 2, kMaxTopK));
  }
  if (!options.torchscript().empty()) {
    if (options.torchscript().size() > kMaxPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "loss_options.torchscript: a path of at most ", kMaxPathBytes, " bytes, got ",
          options.torchscript().size()));
    }
    if (options.class_weights_size() > 0 || options.has_label_smoothing() ||
        options.pos_weight_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix,
          "loss_options.torchscript replaces the built-in loss: leave out class_weights, "
          "label_smoothing and pos_weight (weigh inside the script)"));
    }
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
    target->set_metric(spec.outputs_size() == 0 && IsClassificationLoss(spec.loss())
                           ? "val_accuracy"
                           : "val_loss");
  }
  MPILEARN_RETURN_IF_ERROR(
      CheckMetric("target.metric", target->metric(), spec, /*none_ok=*/false));
  if (!target->has_value()) return absl::OkStatus();  // the rule is off
  if (!std::isfinite(target->value())) {
    return RangeError("target.value", "a finite number", target->value());
  }
  // Accuracies and AUCs are fractions; errors are not negative.
  if (HigherIsBetter(target->metric()) && !(target->value() >= 0.0 && target->value() <= 1.0)) {
    return RangeError("target.value", absl::StrCat("in [0, 1] for ", target->metric()),
                      target->value());
  }
  if ((absl::EndsWith(target->metric(), "_mae") || absl::EndsWith(target->metric(), "_mse")) &&
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

}  // namespace spec_internal
}  // namespace mpilearn
