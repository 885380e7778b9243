// The master's optimizers: they apply a job's gradients to its parameters.
//
// A job's parameters are a list of flat fp32 tensors. An `Optimizer` owns the
// per-tensor state (Adam's moments, momentum buffers, ...) for one job and
// updates the parameters in place with the PyTorch rule of one of six
// optimizers (sgd, adam, adamw, rmsprop, adadelta, adagrad), as written out in
// server/optimizer_config.h.
//
//   MPILEARN_ASSIGN_OR_RETURN(OptimizerConfig config,
//                             ResolveOptimizerConfig(job.optimizer()));
//   EngineOptions engine;
//   engine.threads = 4;
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
//                             CreateOptimizer(config, sizes, engine));
//   ...
//   MPILEARN_RETURN_IF_ERROR(optimizer->Step(params, grads));  // per update
//
// The interface is the seam between the master and the device that does the
// arithmetic; this file has the CPU backend.
#ifndef MPILEARN_SERVER_CORE_OPTIMIZER_H_
#define MPILEARN_SERVER_CORE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"
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

// Where and how an optimizer computes.
struct EngineOptions {
  // "cpu" or "cuda:N" (see ResolveOptimizerDevice). A build without CUDA
  // returns UnimplementedError for "cuda:N".
  std::string device = "cpu";
  // CPU threads that share each step, the calling thread included; >= 1.
  // Models under 64K elements always step on the calling thread alone.
  int threads = 1;
};

// Builds the optimizer `config` describes (normally ResolveOptimizerConfig's
// result) for tensors of `tensor_sizes` elements, with zeroed state (adagrad's
// sums start at initial_accumulator_value). Returns InvalidArgumentError if a
// field of `config` is out of the range ResolveOptimizerConfig enforces or
// engine.threads < 1, UnimplementedError for a device other than "cpu".
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const OptimizerConfig& config, const std::vector<size_t>& tensor_sizes,
    const EngineOptions& engine = {});

// Turns the master's --device flag into an EngineOptions::device:
//   "cpu" -> "cpu";  "cuda" / "cuda:N" -> "cuda:N" if that GPU exists, else
//   FailedPreconditionError;  "auto" -> "cuda:0" when a GPU is present, else
//   "cpu" (logging one line that says why).
absl::StatusOr<std::string> ResolveOptimizerDevice(const std::string& flag);

// ResolveOptimizerConfig(spec), then the overload above.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const mpilearn::v1::OptimizerSpec& spec,
    const std::vector<size_t>& tensor_sizes, const EngineOptions& engine = {});

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_OPTIMIZER_H_
