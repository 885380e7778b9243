// A rank's own optimizer step for gem (gem.worker_optimizer, docs/protocol.md
// "Worker optimizers"): PyTorch's SGD and Adam rules, elementwise on the
// rank's flat parameter buffers, giving the step instead of taking it (gem
// scales it before it is pushed). Its state (momentum buffer, Adam's
// moments) lives here across windows.
//
//   MPILEARN_ASSIGN_OR_RETURN(LocalStep step,
//                             LocalStep::Create(spec.gem().worker_optimizer(), size));
//   step.Begin();                          // once per window
//   step.Step(offset, weights, gradient);  // each tensor: gradient -> step u
//
// Not thread-safe: the rank's training thread only.
#ifndef MPILEARN_WORKER_LOCAL_STEP_H_
#define MPILEARN_WORKER_LOCAL_STEP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

class LocalStep {
 public:
  // For flat buffers of `size` elements (the parameters first, at the
  // offsets Step is given); `spec` normalized ("sgd" or "adam").
  // INVALID_ARGUMENT for another name.
  static absl::StatusOr<LocalStep> Create(const v1::OptimizerSpec& spec, size_t size);

  // Starts a step (Adam counts them for its bias corrections).
  void Begin() { ++steps_; }

  // Replaces `gradient` (a tensor's mean gradient, at `offset` in the flat
  // parameters) by the step to add to `weights`: sgd -lr b with
  // b = momentum b + g (nesterov: -lr (g + momentum b)); adam
  // -lr m1 / (1 - beta1^t) / (sqrt(m2 / (1 - beta2^t)) + epsilon); g with
  // weight_decay * weights added first.
  void Step(size_t offset, absl::Span<const float> weights, absl::Span<float> gradient);

 private:
  enum class Kind { kSgd, kAdam };
  LocalStep(Kind kind, const v1::OptimizerSpec& spec, size_t size);

  Kind kind_;
  float learning_rate_;
  float momentum_;
  bool nesterov_;
  float beta1_, beta2_, epsilon_;
  float weight_decay_;
  // sgd: the momentum buffer; adam: the first and second moments.
  std::vector<float> first_;
  std::vector<float> second_;
  int64_t steps_ = 0;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_LOCAL_STEP_H_
