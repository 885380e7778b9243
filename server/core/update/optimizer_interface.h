// The optimizer interface: what the master calls to apply a job's gradients,
// whichever device does the arithmetic. Backends implement it: the CPU one in
// optimizer.cc and the CUDA one (cuda/cuda_engine.h); CreateOptimizer
// (optimizer.h) picks one. Kept apart from optimizer.h so that a backend can
// implement the interface without depending on the factory that builds it.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_INTERFACE_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_INTERFACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/update/finite_bound.h"
#include "server/core/update/optimizer_config.h"

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

  // Guarded steps (UpdateRule::ApplyGuarded): a step must not leave the
  // parameters or the state non-finite, and one that did is undone. Per
  // step, in this order:
  //
  //   const bool certain = optimizer->PrepareStep(max_grad);
  //   (the caller keeps a copy of the parameters unless certain)
  //   MPILEARN_RETURN_IF_ERROR(optimizer->Step(params, grads));
  //   if (!optimizer->LastStepFinite(params)) {
  //     (the caller puts its copy of the parameters back)
  //     MPILEARN_RETURN_IF_ERROR(optimizer->UndoStep());
  //   }
  //
  // PrepareStep: the gradients of the coming Step are at most `max_grad` in
  // magnitude (the parameters being at most max(`max_grad`, what the
  // backend knows of them): a caller may set some, like buffers, to
  // gradient values between steps). True when that Step is certain to
  // leave every parameter and state value finite (WithinBound). The CPU
  // backend bounds the step's arithmetic from what it knows of the
  // magnitudes: measured in the pass of the last step that tracked them, or
  // bounded since. It answers false when it cannot tell (no tracked step
  // since creation or RestoreState, centered rmsprop, whose
  // sqrt(E[g^2] - E[g]^2) can round below zero, or a bound near the fp32
  // range); it then keeps a copy of its state for UndoStep and tracks the
  // next Step's magnitudes in its own pass. A Step without PrepareStep is
  // not tracked. A backend that tracks nothing answers false.
  virtual bool PrepareStep(double /*max_grad*/) { return false; }

  // Whether every parameter (`params`, as the last Step left them) and
  // state value is finite: measured when that step was tracked, vouched
  // for by PrepareStep when not. A backend that tracks nothing scans
  // `params` (its state is not checked).
  virtual bool LastStepFinite(
      absl::Span<const absl::Span<float>> params) const {
    return FirstNonFinite(params) < 0;
  }

  // After a Step that PrepareStep did not vouch for, whose parameters the
  // caller put back: puts the state back as it was before that Step. A
  // backend holding a copy of the parameters of its own reloads them
  // before the next Step (CUDA, whose device state is not put back).
  virtual absl::Status UndoStep() { return absl::OkStatus(); }

  // Number of steps applied (or restored) so far.
  virtual int64_t steps() const = 0;

  // OptimizerKindName(config().kind): "sgd", "adam", ...
  virtual std::string name() const = 0;

  // The resolved hyperparameters this optimizer applies.
  virtual const OptimizerConfig& config() const = 0;

  // The learning rate of the steps from now on (a schedule's, set before
  // each step's PrepareStep; config().learning_rate is the rate in use).
  virtual void SetLearningRate(double rate) = 0;

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

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_INTERFACE_H_
