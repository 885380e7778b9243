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
// The per-element arithmetic is fp32, in the order of the formulas in
// server/optimizer_config.h; the per-step scalars arrive precomputed (in
// double on the host, then rounded to float).
#ifndef MPILEARN_SERVER_CORE_CUDA_OPTIMIZER_KERNELS_H_
#define MPILEARN_SERVER_CORE_CUDA_OPTIMIZER_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mpilearn::server::cuda {

// The device arrays of one step, all `n` floats long. A state pointer the
// rule does not use must be null; one it uses must not be.
struct StepArrays {
  float* param = nullptr;
  const float* grad = nullptr;
  float* state0 = nullptr;
  float* state1 = nullptr;
  float* state2 = nullptr;
  int64_t n = 0;
};

// sgd. state0: momentum_buffer (momentum > 0 only).
struct SgdScalars {
  float learning_rate;
  float weight_decay;
  float momentum;
  bool has_momentum;  // momentum > 0
  bool nesterov;
  bool first_step;  // t == 1: the buffer starts as the gradient
};

// adam and adamw. state0: exp_avg, state1: exp_avg_sq.
struct AdamScalars {
  float decay;         // adamw: 1 - lr*wd; adam: 1 (p *= decay is exact)
  float weight_decay;  // adam: wd (L2 added to g); adamw: 0
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;                  // lr / (1 - beta1^t)
  float inv_bias_correction2_sqrt;  // 1 / sqrt(1 - beta2^t)
  float epsilon;
};

// rmsprop. state0: square_avg, state1: momentum_buffer (momentum > 0 only),
// state2: grad_avg (centered only).
struct RmspropScalars {
  float learning_rate;
  float weight_decay;
  float alpha;
  float one_minus_alpha;
  float epsilon;
  float momentum;
  bool has_momentum;
  bool centered;
};

// adadelta. state0: square_avg, state1: acc_delta.
struct AdadeltaScalars {
  float learning_rate;
  float weight_decay;
  float rho;
  float one_minus_rho;
  float epsilon;
};

// adagrad. state0: sum.
struct AdagradScalars {
  float clr;  // lr / (1 + (t-1)*lr_decay)
  float weight_decay;
  float epsilon;
};

// Enqueue one fused step on `stream` (nothing when n == 0). `max_blocks`
// caps the grid (the kernels are grid-stride loops); pass a few blocks per
// SM. float4 loads and stores are used when every pointer is 16-byte aligned,
// scalar ones otherwise. Returns the launch error (cudaGetLastError), not
// errors of the kernel's execution, which the stream reports later.
cudaError_t LaunchSgdStep(const StepArrays& arrays, const SgdScalars& scalars,
                          int max_blocks, cudaStream_t stream);
cudaError_t LaunchAdamStep(const StepArrays& arrays, const AdamScalars& scalars,
                           int max_blocks, cudaStream_t stream);
cudaError_t LaunchRmspropStep(const StepArrays& arrays,
                              const RmspropScalars& scalars, int max_blocks,
                              cudaStream_t stream);
cudaError_t LaunchAdadeltaStep(const StepArrays& arrays,
                               const AdadeltaScalars& scalars, int max_blocks,
                               cudaStream_t stream);
cudaError_t LaunchAdagradStep(const StepArrays& arrays,
                              const AdagradScalars& scalars, int max_blocks,
                              cudaStream_t stream);

// Times `iterations` device-to-device copies of `bytes` from `src` to `dst`
// on `stream` (cudaMemcpyAsync between two events, after one untimed warm-up
// copy) and stores the total in `*milliseconds`. Synchronises `stream`.
cudaError_t TimeDeviceCopies(void* dst, const void* src, size_t bytes,
                             int iterations, cudaStream_t stream,
                             float* milliseconds);

}  // namespace mpilearn::server::cuda

#endif  // MPILEARN_SERVER_CORE_CUDA_OPTIMIZER_KERNELS_H_
