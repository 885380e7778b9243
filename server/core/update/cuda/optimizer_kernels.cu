// Fused optimizer kernels: one grid-stride kernel per update rule, each
// reading and writing every array exactly once per element. See
// optimizer_kernels.h for the contract and server/core/update/optimizer_rules.h for
// the rules, which the CPU backend runs too.
//
// Build with --fmad=false: the rules are then evaluated with exactly the
// rounding of the host compiler's fp32 code for the same functions (IEEE
// sqrt and division are nvcc's defaults), so CPU and CUDA agree to the bit.
// The kernels are memory-bound, so the lost FMAs cost nothing measurable.
#include <algorithm>
#include <cstdint>

#include "server/core/update/cuda/optimizer_kernels.h"
#include "server/core/update/optimizer_rules.h"
#include "server/core/update/optimizer_step.h"

namespace mpilearn::server::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;

// Each rule updates one element: p, g, and the state operands s0..s2 that
// the rule keeps (StepArrays: a null array is one it does not keep, and is
// neither loaded nor stored; the value passed for it is a dummy). The
// arithmetic is optimizer_rules.h's; the flags come from the StepScalars and
// are uniform across the grid, so their branches never diverge.

struct SgdRule {
  StepScalars s;
  __device__ void Apply(float& p, float g, float& s0, float&, float&) const {
    rules::Sgd(s, s.l2_decay, s.has_momentum, s.first_step, s.nesterov, p, g,
               s0);
  }
};

struct AdamRule {
  StepScalars s;
  __device__ void Apply(float& p, float g, float& s0, float& s1,
                        float&) const {
    rules::Adam(s, s.l2_decay, s.decoupled_decay, p, g, s0, s1);
  }
};

struct RmspropRule {
  StepScalars s;
  __device__ void Apply(float& p, float g, float& s0, float& s1,
                        float& s2) const {
    rules::Rmsprop(s, s.l2_decay, s.centered, s.has_momentum, p, g, s0, s1, s2);
  }
};

struct AdadeltaRule {
  StepScalars s;
  __device__ void Apply(float& p, float g, float& s0, float& s1,
                        float&) const {
    rules::Adadelta(s, s.l2_decay, p, g, s0, s1);
  }
};

struct AdagradRule {
  StepScalars s;
  __device__ void Apply(float& p, float g, float& s0, float&, float&) const {
    rules::Adagrad(s, s.l2_decay, p, g, s0);
  }
};

template <class Rule>
__device__ __forceinline__ void ApplyVector(const Rule& rule, float4& p,
                                            const float4& g, float4& s0,
                                            float4& s1, float4& s2) {
  rule.Apply(p.x, g.x, s0.x, s1.x, s2.x);
  rule.Apply(p.y, g.y, s0.y, s1.y, s2.y);
  rule.Apply(p.z, g.z, s0.z, s1.z, s2.z);
  rule.Apply(p.w, g.w, s0.w, s1.w, s2.w);
}

// Updates elements [0, a.n). With kVector, thread k handles float4 groups
// k, k + stride, ... of the first n/4*4 elements, then the last n%4 elements
// go to the first n%4 threads of the grid; otherwise every element is a
// scalar grid-stride step.
template <class Rule, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock)
    FusedStepKernel(const Rule rule, const StepArrays a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool uses0 = a.state0 != nullptr;
  const bool uses1 = a.state1 != nullptr;
  const bool uses2 = a.state2 != nullptr;
  int64_t scalar_begin = 0;
  if (kVector) {
    const int64_t n4 = a.n / 4;
    float4* __restrict__ p4 = reinterpret_cast<float4*>(a.param);
    const float4* __restrict__ g4 = reinterpret_cast<const float4*>(a.grad);
    float4* __restrict__ s04 = reinterpret_cast<float4*>(a.state0);
    float4* __restrict__ s14 = reinterpret_cast<float4*>(a.state1);
    float4* __restrict__ s24 = reinterpret_cast<float4*>(a.state2);
    for (int64_t i = first; i < n4; i += stride) {
      float4 p = p4[i];
      const float4 g = g4[i];
      float4 s0 = make_float4(0.f, 0.f, 0.f, 0.f);
      float4 s1 = s0;
      float4 s2 = s0;
      if (uses0) s0 = s04[i];
      if (uses1) s1 = s14[i];
      if (uses2) s2 = s24[i];
      ApplyVector(rule, p, g, s0, s1, s2);
      p4[i] = p;
      if (uses0) s04[i] = s0;
      if (uses1) s14[i] = s1;
      if (uses2) s24[i] = s2;
    }
    scalar_begin = n4 * 4;
  }
  float* __restrict__ p1 = a.param;
  const float* __restrict__ g1 = a.grad;
  float* __restrict__ s01 = a.state0;
  float* __restrict__ s11 = a.state1;
  float* __restrict__ s21 = a.state2;
  for (int64_t i = scalar_begin + first; i < a.n; i += stride) {
    float p = p1[i];
    float s0 = 0.f, s1 = 0.f, s2 = 0.f;
    if (uses0) s0 = s01[i];
    if (uses1) s1 = s11[i];
    if (uses2) s2 = s21[i];
    rule.Apply(p, g1[i], s0, s1, s2);
    p1[i] = p;
    if (uses0) s01[i] = s0;
    if (uses1) s11[i] = s1;
    if (uses2) s21[i] = s2;
  }
}

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <class Rule>
cudaError_t Launch(const Rule& rule, const StepArrays& arrays, int max_blocks,
                   cudaStream_t stream) {
  if (arrays.n <= 0) return cudaSuccess;
  const bool vector = Aligned16(arrays.param) && Aligned16(arrays.grad) &&
                      Aligned16(arrays.state0) && Aligned16(arrays.state1) &&
                      Aligned16(arrays.state2);  // null is aligned
  // Work items: float4 groups (or the tail, if longer), else elements.
  const int64_t items =
      vector ? std::max<int64_t>(arrays.n / 4, arrays.n % 4) : arrays.n;
  const int64_t wanted = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(wanted, std::max(max_blocks, 1))));
  if (vector) {
    FusedStepKernel<Rule, true>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(rule, arrays);
  } else {
    FusedStepKernel<Rule, false>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(rule, arrays);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSgdStep(const StepArrays& arrays, const StepScalars& scalars,
                          int max_blocks, cudaStream_t stream) {
  return Launch(SgdRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdamStep(const StepArrays& arrays, const StepScalars& scalars,
                           int max_blocks, cudaStream_t stream) {
  return Launch(AdamRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchRmspropStep(const StepArrays& arrays,
                              const StepScalars& scalars, int max_blocks,
                              cudaStream_t stream) {
  return Launch(RmspropRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdadeltaStep(const StepArrays& arrays,
                               const StepScalars& scalars, int max_blocks,
                               cudaStream_t stream) {
  return Launch(AdadeltaRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdagradStep(const StepArrays& arrays,
                              const StepScalars& scalars, int max_blocks,
                              cudaStream_t stream) {
  return Launch(AdagradRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t TimeCopies(void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind, int iterations,
                       cudaStream_t stream, float* milliseconds) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cudaError_t error = cudaEventCreate(&start);
  if (error == cudaSuccess) error = cudaEventCreate(&stop);
  // Warm-up: first-touch and clock ramp stay out of the timing.
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  }
  if (error == cudaSuccess) error = cudaEventRecord(start, stream);
  for (int i = 0; i < iterations && error == cudaSuccess; ++i) {
    error = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  }
  if (error == cudaSuccess) error = cudaEventRecord(stop, stream);
  if (error == cudaSuccess) error = cudaEventSynchronize(stop);
  if (error == cudaSuccess)
    error = cudaEventElapsedTime(milliseconds, start, stop);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (start != nullptr) cudaEventDestroy(start);
  return error;
}

}  // namespace mpilearn::server::cuda
