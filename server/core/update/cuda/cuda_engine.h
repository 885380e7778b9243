// The CUDA backend of the Optimizer interface (server/core/
// optimizer_interface.h): applies one job's optimizer steps on a GPU, with the
// parameters and the optimizer state resident in device memory, using the
// update rules of server/core/update/optimizer_rules.h (one fused kernel launch per
// step covers every tensor). CreateOptimizer returns one for a "cuda:N"
// device; code that needs the GPU-only calls below creates it directly:
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine,
//                             CudaEngine::Create(config, tensor_sizes, 0));
//   MPILEARN_RETURN_IF_ERROR(engine->Step(params, grads));  // per update
//
// Each Step stages the gradients through pinned host memory to the device,
// runs the kernel, and copies the updated parameters back into `params`, so
// the caller's host copy is always current (for replies and checkpoints).
// The device copy of the parameters is authoritative between steps: it is
// uploaded from `params` on the first Step (or by UploadParams) and not
// again, so a caller that changes its host parameters outside Step must call
// UploadParams or MarkHostParamsChanged before the next Step. RestoreState
// does the latter itself.
//
// This header does not include CUDA headers, so any code can include it.
// Without nvcc at build time the same header is backed by a stub whose
// Create returns UnimplementedError and whose DeviceCount is 0; code that
// must know at compile time can test MPILEARN_WITH_CUDA, which the CUDA
// build defines.
//
// Threading: not thread-safe; the caller serialises every call, const ones
// included. Calls may come from different threads (each sets the device).
// Step and UploadParams spread the host copies of large updates (over 4 MiB)
// over up to 8 threads of their own, joined before they return.
// Every call returns with the engine's stream idle; no other stream is
// synchronised.
//
// Errors: a CUDA failure inside Step, UploadParams or RestoreState leaves the
// device state unknown, so the engine then refuses every later call with the
// first error (InternalError carrying cudaGetErrorString's text); create a
// new engine (and RestoreState from a checkpoint) to go on. Bad arguments
// are InvalidArgument and change nothing.
#ifndef MPILEARN_SERVER_CORE_UPDATE_CUDA_CUDA_ENGINE_H_
#define MPILEARN_SERVER_CORE_UPDATE_CUDA_CUDA_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/core/update/optimizer_config.h"
#include "server/core/update/optimizer_interface.h"

namespace mpilearn::server {

class CudaEngine final : public Optimizer {
 public:
  // Allocates device and pinned memory for tensors of `tensor_sizes`
  // elements on device `device_index`, with the state zeroed (adagrad's sum
  // set to initial_accumulator_value). `config` must be resolved
  // (ResolveOptimizerConfig). FailedPreconditionError "no CUDA device N
  // (found M)" when that device does not exist (M is 0 without a GPU or
  // driver); UnimplementedError when built without CUDA; InternalError if
  // StateBufferNames(config) names a buffer the kernels do not keep.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(
      const OptimizerConfig& config, const std::vector<size_t>& tensor_sizes,
      int device_index);

  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  // Copies `params` to the device now (else the next Step does). Sizes must
  // match the creation sizes.
  absl::Status UploadParams(absl::Span<const absl::Span<const float>> params);

  // Makes the next Step upload `params` first: call after changing the host
  // parameters outside Step.
  void MarkHostParamsChanged();

  // Optimizer. Step applies one step with gradient i to tensor i, on the
  // device, and writes the updated parameters into `params`; unlike the CPU
  // backend it checks the shapes (InvalidArgumentError, changing nothing,
  // when the tensor count or a tensor size differs from creation).
  // SaveState copies the state to the host. RestoreState also marks the host
  // parameters changed.
  absl::Status Step(absl::Span<const absl::Span<float>> params,
                    absl::Span<const absl::Span<const float>> grads) override;
  int64_t steps() const override;
  std::string name() const override;
  const OptimizerConfig& config() const override;
  void SetLearningRate(double rate) override;
  absl::StatusOr<OptimizerState> SaveState() const override;
  absl::Status RestoreState(const OptimizerState& state) override;
  // Guarded steps: the engine tracks no magnitudes (its state stays on the
  // device), so every step is undoable by the caller's copy of the
  // weights, checked on the host (LastStepFinite's scan); an undone step's
  // optimizer state is not put back. UndoStep is MarkHostParamsChanged.
  absl::Status UndoStep() override {
    MarkHostParamsChanged();
    return absl::OkStatus();
  }

  int device_index() const;

  // Number of usable CUDA devices; 0 when there is no GPU, no driver, or no
  // CUDA in this build. Never fails.
  static int DeviceCount();

  // Benchmarks only: runs the fused kernel `iterations` times on the
  // gradient already on the device (no transfers) and returns the mean
  // milliseconds per kernel step. Changes the weights and state; needs one
  // Step first.
  absl::StatusOr<double> TimeKernelMs(int iterations);

  // Whether this binary was built with the CUDA engine (nvcc was found).
  static bool BuiltWithCuda();

  // Device-to-device cudaMemcpy bandwidth of `device` for copies of `bytes`
  // (bytes read + bytes written per second, in 1e9 bytes/s), timed with
  // events over several copies. For benchmarks: a reference for what the
  // memory-bound optimizer kernels could reach.
  static absl::StatusOr<double> MeasureCopyBandwidthGBps(size_t bytes,
                                                         int device);

  // Host<->device bandwidth of `device` for copies of `bytes` between pinned
  // host memory and the device, each direction timed alone with events (1e9
  // bytes moved per second, each byte counted once). For benchmarks: what
  // Step's gradient upload and weights download could reach.
  struct HostTransferGBps {
    double to_device = 0;
    double to_host = 0;
  };
  static absl::StatusOr<HostTransferGBps> MeasureHostTransferGBps(size_t bytes,
                                                                  int device);

 private:
  struct Impl;
  explicit CudaEngine(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_CUDA_CUDA_ENGINE_H_
