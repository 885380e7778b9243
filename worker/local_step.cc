#include "worker/local_step.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mpilearn::worker {

absl::StatusOr<LocalStep> LocalStep::Create(const v1::OptimizerSpec& spec, size_t size) {
  if (spec.name() == "sgd") return LocalStep(Kind::kSgd, spec, size);
  if (spec.name() == "adam") return LocalStep(Kind::kAdam, spec, size);
  return absl::InvalidArgumentError(
      absl::StrCat("worker_optimizer.name: the ranks step with 'sgd' or 'adam', got '",
                   spec.name(), "'"));
}

LocalStep::LocalStep(Kind kind, const v1::OptimizerSpec& spec, size_t size)
    : kind_(kind),
      learning_rate_(static_cast<float>(spec.learning_rate())),
      momentum_(static_cast<float>(spec.momentum())),
      nesterov_(spec.nesterov()),
      beta1_(static_cast<float>(spec.beta1())),
      beta2_(static_cast<float>(spec.beta2())),
      epsilon_(static_cast<float>(spec.epsilon())),
      weight_decay_(static_cast<float>(spec.weight_decay())),
      first_(size, 0.0f),
      second_(kind == Kind::kAdam ? size : 0, 0.0f) {}

void LocalStep::Step(size_t offset, absl::Span<const float> weights, absl::Span<float> gradient) {
  float* first = first_.data() + offset;
  if (kind_ == Kind::kSgd) {
    for (size_t k = 0; k < gradient.size(); ++k) {
      const float g = gradient[k] + weight_decay_ * weights[k];
      first[k] = momentum_ * first[k] + g;
      gradient[k] = -learning_rate_ * (nesterov_ ? g + momentum_ * first[k] : first[k]);
    }
    return;
  }
  float* second = second_.data() + offset;
  const double t = static_cast<double>(steps_);
  const float correction1 = static_cast<float>(1.0 - std::pow(beta1_, t));
  const float correction2 = static_cast<float>(1.0 - std::pow(beta2_, t));
  const float root2 = std::sqrt(correction2);
  for (size_t k = 0; k < gradient.size(); ++k) {
    const float g = gradient[k] + weight_decay_ * weights[k];
    first[k] = beta1_ * first[k] + (1.0f - beta1_) * g;
    second[k] = beta2_ * second[k] + (1.0f - beta2_) * g * g;
    gradient[k] =
        -learning_rate_ / correction1 * first[k] / (std::sqrt(second[k]) / root2 + epsilon_);
  }
}

}  // namespace mpilearn::worker
