// Launchers for the fused optimizer kernels (optimizer_kernels.cu), compiled
// by nvcc. This header holds plain structs and pointers only: no Abseil, no
// protobuf, no OptimizerConfig, so nvcc never sees the rest of the master.
// CudaEngine (cuda_engine.cc) is its one user.
//
// Every kernel updates one flat fp32 range of `n` elements: the engine packs
// all of a job's tensors back to back in one device array per role
// (parameters, gradients, each state buffer), and since every update rule is
// elementwise with per-step scalars shared by all tensors, one launch per
// step covers every tensor.
//
// The per-element arithmetic is that of server/core/update/optimizer_rules.h, the
// same functions the CPU backend runs; the per-step scalars and flags arrive
// as a StepScalars (server/core/update/optimizer_step.h), which the host computes
// with ComputeStepScalars.
#ifndef MPILEARN_SERVER_CORE_UPDATE_CUDA_OPTIMIZER_KERNELS_H_
#define MPILEARN_SERVER_CORE_UPDATE_CUDA_OPTIMIZER_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "server/core/update/optimizer_step.h"

namespace mpilearn::server::cuda {

// The device arrays of one step, all `n` floats long. state<k> is the rule's
// state operand s<k> (StateOperands in server/core/update/optimizer_config.h): null
// where the rule keeps none, and only there.
struct StepArrays {
  float* param = nullptr;
  const float* grad = nullptr;
  float* state0 = nullptr;
  float* state1 = nullptr;
  float* state2 = nullptr;
  int64_t n = 0;
};

// Enqueue one fused step on `stream` (nothing when n == 0). `max_blocks`
// caps the grid (the kernels are grid-stride loops); pass a few blocks per
// SM. float4 loads and stores are used when every pointer is 16-byte aligned,
// scalar ones otherwise. Returns the launch error (cudaGetLastError), not
// errors of the kernel's execution, which the stream reports later. One
// launcher per rule of optimizer_rules.h (adam's also runs adamw).
cudaError_t LaunchSgdStep(const StepArrays& arrays, const StepScalars& scalars,
                          int max_blocks, cudaStream_t stream);
cudaError_t LaunchAdamStep(const StepArrays& arrays, const StepScalars& scalars,
                           int max_blocks, cudaStream_t stream);
cudaError_t LaunchRmspropStep(const StepArrays& arrays,
                              const StepScalars& scalars, int max_blocks,
                              cudaStream_t stream);
cudaError_t LaunchAdadeltaStep(const StepArrays& arrays,
                               const StepScalars& scalars, int max_blocks,
                               cudaStream_t stream);
cudaError_t LaunchAdagradStep(const StepArrays& arrays,
                              const StepScalars& scalars, int max_blocks,
                              cudaStream_t stream);

// Times `iterations` copies of `bytes` from `src` to `dst` of `kind`
// (device to device, or between pinned host memory and the device) on
// `stream` (cudaMemcpyAsync between two events, after one untimed warm-up
// copy) and stores the total in `*milliseconds`. Synchronises `stream`.
cudaError_t TimeCopies(void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind, int iterations,
                       cudaStream_t stream, float* milliseconds);

}  // namespace mpilearn::server::cuda

#endif  // MPILEARN_SERVER_CORE_UPDATE_CUDA_OPTIMIZER_KERNELS_H_
