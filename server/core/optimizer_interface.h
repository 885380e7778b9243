// The optimizer interface: what the master calls to apply a job's gradients,
// whichever device does the arithmetic. Backends implement it: the CPU one in
// optimizer.cc and the CUDA one (cuda/cuda_engine.h); CreateOptimizer
// (optimizer.h) picks one. Kept apart from optimizer.h so that a backend can
// implement the interface without depending on the factory that builds it.
#ifndef MPILEARN_SERVER_CORE_OPTIMIZER_INTERFACE_H_
#define MPILEARN_SERVER_CORE_OPTIMIZER_INTERFACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/optimizer_config.h"

namespace mpilearn::server {

// A snapshot of an optimizer's state, as a checkpoint stores it.
struct OptimizerState {
  // Steps applied so far (PyTorch's `step`; t - 1 for the next step).
  int64_t steps = 0;
  // buffers[b][i] is buffer StateBufferNames(config)[b] of tensor i, as long
  // as tensor i.
  std::vector<std::vector<std::vector<float>>> buffers;
};

// Applies optimizer steps to the parameters of one job.
//
// Threading: not thread-safe. The caller (the job) serialises every call,
// including the const ones, against Step. An implementation may use threads
// of its own inside Step; they are done when Step returns.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Applies one step: tensor i of `params` is updated in place with gradient
  // i of `grads`.
  //
  // Precondition (not checked, this is the hot path): `params.size()` and
  // `grads.size()` equal the number of tensors given at creation, and
  // `params[i].size() == grads[i].size()` equals tensor size i given at
  // creation. No params tensor overlaps another tensor or any gradient.
  //
  // The CPU backend cannot fail; a device backend returns its device's
  // error (and refuses later calls).
  virtual absl::Status Step(absl::Span<const absl::Span<float>> params,
                            absl::Span<const absl::Span<const float>> grads) = 0;

  // Number of steps applied (or restored) so far.
  virtual int64_t steps() const = 0;

  // OptimizerKindName(config().kind): "sgd", "adam", ...
  virtual std::string name() const = 0;

  // The resolved hyperparameters this optimizer applies.
  virtual const OptimizerConfig& config() const = 0;

  // A copy of the step count and every state buffer.
  virtual absl::StatusOr<OptimizerState> SaveState() const = 0;

  // Replaces the step count and state buffers with `state`, e.g. one that
  // SaveState returned; the next Step continues exactly as the saved
  // optimizer would have. Returns InvalidArgumentError, leaving the state
  // unchanged, unless `state` has one buffer per StateBufferNames(config())
  // entry, each with the tensor sizes given at creation, and steps >= 0.
  virtual absl::Status RestoreState(const OptimizerState& state) = 0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_OPTIMIZER_INTERFACE_H_
