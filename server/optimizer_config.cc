#include "server/optimizer_config.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace mpilearn::server {
namespace {

// Ranges, shared by every optimizer that reads the field. common/job_spec.cc
// applies the same defaults and ranges when a job is submitted (it cannot
// depend on server/); the two must agree, and optimizer_test checks that
// they do.
//   learning_rate, epsilon:                        finite, > 0
//   weight_decay, lr_decay,
//   initial_accumulator_value:                     finite, >= 0
//   beta1, beta2, momentum, alpha, rho:            in [0, 1)
//   nesterov:                                      needs momentum > 0

absl::Status OutOfRange(absl::string_view field, absl::string_view range,
                        double value) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, " must be ", range, ", got ", value));
}

absl::Status CheckPositive(absl::string_view field, double value) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return OutOfRange(field, "a finite number > 0", value);
}

absl::Status CheckNonNegative(absl::string_view field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return OutOfRange(field, "a finite number >= 0", value);
}

absl::Status CheckUnitInterval(absl::string_view field, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();  // false for NaN
  return OutOfRange(field, "in [0, 1)", value);
}

struct NamedKind {
  const char* name;
  OptimizerKind kind;
};

// In the order the error message lists them.
constexpr NamedKind kKinds[] = {
    {"sgd", OptimizerKind::kSgd},
    {"adam", OptimizerKind::kAdam},
    {"adamw", OptimizerKind::kAdamW},
    {"rmsprop", OptimizerKind::kRmsprop},
    {"adadelta", OptimizerKind::kAdadelta},
    {"adagrad", OptimizerKind::kAdagrad},
};

absl::StatusOr<OptimizerKind> ParseKind(const std::string& name) {
  // An empty name is the default, as in common/job_spec.cc.
  if (name.empty()) return OptimizerKind::kAdam;
  for (const NamedKind& k : kKinds) {
    if (name == k.name) return k.kind;
  }
  std::string available;
  for (const NamedKind& k : kKinds) {
    absl::StrAppend(&available, available.empty() ? "" : ", ", "'", k.name,
                    "'");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.name: unknown optimizer '", name,
                   "'; available: ", available));
}

}  // namespace

std::string OptimizerKindName(OptimizerKind kind) {
  for (const NamedKind& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

std::vector<std::string> StateBufferNames(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      if (config.momentum > 0) return {"momentum_buffer"};
      return {};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kRmsprop: {
      std::vector<std::string> names = {"square_avg"};
      if (config.centered) names.push_back("grad_avg");
      if (config.momentum > 0) names.push_back("momentum_buffer");
      return names;
    }
    case OptimizerKind::kAdadelta:
      return {"square_avg", "acc_delta"};
    case OptimizerKind::kAdagrad:
      return {"sum"};
  }
  return {};
}

absl::StatusOr<OptimizerConfig> ResolveOptimizerConfig(
    const mpilearn::v1::OptimizerSpec& spec) {
  OptimizerConfig config;
  MPILEARN_ASSIGN_OR_RETURN(config.kind, ParseKind(spec.name()));
  const OptimizerKind kind = config.kind;

  // Every optimizer has a learning rate and weight decay; only the defaults
  // differ.
  double default_lr = 0.01;
  if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
    default_lr = 1e-3;
  } else if (kind == OptimizerKind::kAdadelta) {
    default_lr = 1.0;
  }
  config.learning_rate =
      spec.has_learning_rate() ? spec.learning_rate() : default_lr;
  MPILEARN_RETURN_IF_ERROR(
      CheckPositive("learning_rate", config.learning_rate));
  const double default_wd = kind == OptimizerKind::kAdamW ? 0.01 : 0.0;
  config.weight_decay =
      spec.has_weight_decay() ? spec.weight_decay() : default_wd;
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegative("weight_decay", config.weight_decay));

  // The rest only where the optimizer reads them; other fields of `spec` are
  // ignored and `config` keeps its struct defaults there.
  switch (kind) {
    case OptimizerKind::kSgd:
      config.momentum = spec.has_momentum() ? spec.momentum() : 0.0;
      config.nesterov = spec.has_nesterov() && spec.nesterov();
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("momentum", config.momentum));
      if (config.nesterov && config.momentum == 0) {
        // PyTorch rejects this too: Nesterov without momentum is plain SGD.
        return absl::InvalidArgumentError(
            "optimizer.nesterov requires optimizer.momentum > 0, got "
            "momentum 0");
      }
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      config.beta1 = spec.has_beta1() ? spec.beta1() : 0.9;
      config.beta2 = spec.has_beta2() ? spec.beta2() : 0.999;
      config.epsilon = spec.has_epsilon() ? spec.epsilon() : 1e-8;
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("beta1", config.beta1));
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("beta2", config.beta2));
      MPILEARN_RETURN_IF_ERROR(CheckPositive("epsilon", config.epsilon));
      break;
    case OptimizerKind::kRmsprop:
      config.alpha = spec.has_alpha() ? spec.alpha() : 0.99;
      config.epsilon = spec.has_epsilon() ? spec.epsilon() : 1e-8;
      config.momentum = spec.has_momentum() ? spec.momentum() : 0.0;
      config.centered = spec.has_centered() && spec.centered();
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("alpha", config.alpha));
      MPILEARN_RETURN_IF_ERROR(CheckPositive("epsilon", config.epsilon));
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("momentum", config.momentum));
      break;
    case OptimizerKind::kAdadelta:
      config.rho = spec.has_rho() ? spec.rho() : 0.9;
      config.epsilon = spec.has_epsilon() ? spec.epsilon() : 1e-6;
      MPILEARN_RETURN_IF_ERROR(CheckUnitInterval("rho", config.rho));
      MPILEARN_RETURN_IF_ERROR(CheckPositive("epsilon", config.epsilon));
      break;
    case OptimizerKind::kAdagrad:
      config.lr_decay = spec.has_lr_decay() ? spec.lr_decay() : 0.0;
      config.initial_accumulator_value = spec.has_initial_accumulator_value()
                                             ? spec.initial_accumulator_value()
                                             : 0.0;
      config.epsilon = spec.has_epsilon() ? spec.epsilon() : 1e-10;
      MPILEARN_RETURN_IF_ERROR(CheckNonNegative("lr_decay", config.lr_decay));
      MPILEARN_RETURN_IF_ERROR(CheckNonNegative(
          "initial_accumulator_value", config.initial_accumulator_value));
      MPILEARN_RETURN_IF_ERROR(CheckPositive("epsilon", config.epsilon));
      break;
  }
  return config;
}

}  // namespace mpilearn::server
