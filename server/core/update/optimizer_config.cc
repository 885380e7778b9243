#include "server/core/update/optimizer_config.h"

#include <cmath>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"

namespace mpilearn::server {
namespace {

struct NamedKind {
  const char* name;
  OptimizerKind kind;
};

constexpr NamedKind kKinds[] = {
    {"sgd", OptimizerKind::kSgd},
    {"adam", OptimizerKind::kAdam},
    {"adamw", OptimizerKind::kAdamW},
    {"rmsprop", OptimizerKind::kRmsprop},
    {"adadelta", OptimizerKind::kAdadelta},
    {"adagrad", OptimizerKind::kAdagrad},
};

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

StepScalars ComputeStepScalars(const OptimizerConfig& c, int64_t t) {
  double lr = c.learning_rate;
  double decay = 0;
  double step_size = 0;
  double inv_bias_correction2_sqrt = 0;
  const bool has_weight_decay = c.weight_decay != 0;
  StepScalars s;
  switch (c.kind) {
    case OptimizerKind::kSgd:
      s.has_momentum = c.momentum != 0;
      s.nesterov = c.nesterov;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      const double td = static_cast<double>(t);
      decay = c.beta1;
      step_size = c.learning_rate / (1.0 - std::pow(c.beta1, td));
      inv_bias_correction2_sqrt = 1.0 / std::sqrt(1.0 - std::pow(c.beta2, td));
      break;
    }
    case OptimizerKind::kRmsprop:
      decay = c.alpha;
      s.has_momentum = c.momentum != 0;
      s.centered = c.centered;
      break;
    case OptimizerKind::kAdadelta:
      decay = c.rho;
      break;
    case OptimizerKind::kAdagrad:
      lr = c.learning_rate / (1.0 + static_cast<double>(t - 1) * c.lr_decay);
      break;
  }
  const bool adamw = c.kind == OptimizerKind::kAdamW;
  s.l2_decay = has_weight_decay && !adamw;
  s.decoupled_decay = has_weight_decay && adamw;
  s.first_step = t == 1;
  s.learning_rate = static_cast<float>(lr);
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.momentum = static_cast<float>(c.momentum);
  s.decay = static_cast<float>(decay);
  s.one_minus_decay = static_cast<float>(1.0 - decay);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.step_size = static_cast<float>(step_size);
  s.inv_bias_correction2_sqrt = static_cast<float>(inv_bias_correction2_sqrt);
  s.weight_scale = static_cast<float>(1.0 - c.learning_rate * c.weight_decay);
  s.epsilon = static_cast<float>(c.epsilon);
  return s;
}

std::array<int, 3> StateOperands(const OptimizerConfig& c) {
  // Mirrors StateBufferNames: buffers are numbered in that order.
  switch (c.kind) {
    case OptimizerKind::kSgd:
      return {c.momentum != 0 ? 0 : -1, -1, -1};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdadelta:
      return {0, 1, -1};
    case OptimizerKind::kRmsprop: {
      int next = 1;
      const int grad_avg = c.centered ? next++ : -1;
      const int momentum_buffer = c.momentum != 0 ? next++ : -1;
      return {0, grad_avg, momentum_buffer};
    }
    case OptimizerKind::kAdagrad:
      return {0, -1, -1};
  }
  return {-1, -1, -1};
}

absl::StatusOr<OptimizerConfig> ResolveOptimizerConfig(
    const mpilearn::v1::OptimizerSpec& spec) {
  // Defaults and ranges live in one place, the job spec's normalization, so
  // a spec the master accepted resolves here exactly as it was checked.
  v1::OptimizerSpec normalized = spec;
  MPILEARN_RETURN_IF_ERROR(NormalizeOptimizerSpec(&normalized));
  OptimizerConfig config;
  for (const NamedKind& k : kKinds) {
    if (normalized.name() == k.name) config.kind = k.kind;
  }
  config.learning_rate = normalized.learning_rate();
  config.weight_decay = normalized.weight_decay();
  // The rest only where the optimizer reads them; other fields of `spec` are
  // ignored and `config` keeps its struct defaults there.
  switch (config.kind) {
    case OptimizerKind::kSgd:
      config.momentum = normalized.momentum();
      config.nesterov = normalized.nesterov();
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      config.beta1 = normalized.beta1();
      config.beta2 = normalized.beta2();
      config.epsilon = normalized.epsilon();
      break;
    case OptimizerKind::kRmsprop:
      config.alpha = normalized.alpha();
      config.epsilon = normalized.epsilon();
      config.momentum = normalized.momentum();
      config.centered = normalized.centered();
      break;
    case OptimizerKind::kAdadelta:
      config.rho = normalized.rho();
      config.epsilon = normalized.epsilon();
      break;
    case OptimizerKind::kAdagrad:
      config.lr_decay = normalized.lr_decay();
      config.initial_accumulator_value = normalized.initial_accumulator_value();
      config.epsilon = normalized.epsilon();
      break;
  }
  return config;
}

}  // namespace mpilearn::server
