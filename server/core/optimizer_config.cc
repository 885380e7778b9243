#include "server/core/optimizer_config.h"

#include "absl/status/status.h"
#include "common/job_spec.h"
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
