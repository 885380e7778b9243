// The master's optimizers: they apply a job's gradients to its parameters.
//
// A job's parameters are a list of flat fp32 tensors. An `Optimizer` owns the
// per-tensor state (Adam's moments, momentum buffers, ...) for one job and
// updates the parameters in place with the PyTorch rule of one of six
// optimizers (sgd, adam, adamw, rmsprop, adadelta, adagrad), as written out in
// server/core/update/optimizer_config.h.
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
// The interface (optimizer_interface.h) is the seam between the master and
// the device that does the arithmetic. CreateOptimizer builds the CPU backend
// (optimizer.cc) or the CUDA one (cuda/cuda_engine.h); both apply the update
// rules of optimizer_rules.h to the scalars of ComputeStepScalars.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/optimizer_config.h"
#include "server/core/update/optimizer_interface.h"

namespace mpilearn::server {

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

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_H_
