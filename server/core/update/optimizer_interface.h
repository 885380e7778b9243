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

  // Guarded updates (UpdateRule, Job::ApplyGradient): a step must not make
  // the parameters or the state non-finite, and the caller undoes one that
  // did. Undoing needs a copy taken before the step; these two calls let
  // the caller take it only when a step could overflow.
  //
  // Called right before a Step whose gradients are at most `max_grad` in
  // magnitude (the parameters being at most max(`max_grad`, what the
  // backend knows of them): a caller may set some, like buffers, to
  // gradient values between steps). True when that Step is certain to
  // leave every parameter and state value finite. The CPU backend bounds
  // the step's arithmetic from what it knows of the magnitudes: measured
  // in the pass of the last step that tracked them, or bounded since. It
  // answers false when it cannot tell (no tracked step since creation or
  // RestoreState, centered rmsprop, whose sqrt(E[g^2] - E[g]^2) can round
  // below zero, or a bound near the fp32 range), and then tracks the next
  // Step's magnitudes in its own pass. A Step without PrepareStep is not
  // tracked. A backend that tracks nothing answers false.
  virtual bool PrepareStep(double /*max_grad*/) { return false; }

  // Whether every parameter and state value the last Step wrote is finite:
  // measured when that step was tracked, vouched for by PrepareStep when
  // not. A backend that does not track answers true and leaves the check of
  // the parameters to the caller (tracks_finiteness() false).
  virtual bool LastStepFinite() const { return true; }
  virtual bool tracks_finiteness() const { return false; }

  // The caller changed the parameters outside Step (it undid a step): a
  // backend holding a copy of its own (CUDA) reloads them before the next.
  virtual void HostParamsChanged() {}

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

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_INTERFACE_H_
