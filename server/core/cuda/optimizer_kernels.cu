// Fused optimizer kernels: one grid-stride kernel per update rule, each
// reading and writing every array exactly once per element. See
// optimizer_kernels.h for the contract and server/optimizer_config.h for the
// rules.
//
// Build with --fmad=false: the rules are then evaluated with exactly the
// rounding of a plain fp32 C++ implementation of the same expressions (IEEE
// sqrt and division are nvcc's defaults), so CPU and CUDA agree to the bit
// where their expression order agrees. The kernels are memory-bound, so the
// lost FMAs cost nothing measurable.
#include <algorithm>
#include <cstdint>

#include "server/core/cuda/optimizer_kernels.h"

namespace mpilearn::server::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;

// Each rule updates one element: p, g, and up to three state values, of which
// only those the rule's Uses*() report are loaded and stored. The Uses*()
// flags are uniform across the grid, so their branches never diverge.

struct SgdRule {
  SgdScalars s;
  __device__ bool Uses0() const { return s.has_momentum; }
  __device__ bool Uses1() const { return false; }
  __device__ bool Uses2() const { return false; }
  __device__ void Apply(float& p, float g, float& buf, float&, float&) const {
    float d = g;
    if (s.weight_decay != 0.0f) d += s.weight_decay * p;
    if (s.has_momentum) {
      const float b = s.first_step ? d : s.momentum * buf + d;
      buf = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p -= s.learning_rate * d;
  }
};

struct AdamRule {
  AdamScalars s;
  __device__ bool Uses0() const { return true; }
  __device__ bool Uses1() const { return true; }
  __device__ bool Uses2() const { return false; }
  __device__ void Apply(float& p, float g, float& m, float& v, float&) const {
    p *= s.decay;  // adamw's decoupled decay; exactly 1 for adam
    if (s.weight_decay != 0.0f) g += s.weight_decay * p;
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
    const float denom = sqrtf(v) * s.inv_bias_correction2_sqrt + s.epsilon;
    p -= s.step_size * (m / denom);
  }
};

struct RmspropRule {
  RmspropScalars s;
  __device__ bool Uses0() const { return true; }
  __device__ bool Uses1() const { return s.has_momentum; }
  __device__ bool Uses2() const { return s.centered; }
  __device__ void Apply(float& p, float g, float& sq, float& buf,
                        float& ga) const {
    if (s.weight_decay != 0.0f) g += s.weight_decay * p;
    sq = s.alpha * sq + s.one_minus_alpha * g * g;
    float avg;
    if (s.centered) {
      ga = s.alpha * ga + s.one_minus_alpha * g;
      avg = sqrtf(sq - ga * ga) + s.epsilon;
    } else {
      avg = sqrtf(sq) + s.epsilon;
    }
    if (s.has_momentum) {
      buf = s.momentum * buf + g / avg;
      p -= s.learning_rate * buf;
    } else {
      p -= s.learning_rate * g / avg;
    }
  }
};

struct AdadeltaRule {
  AdadeltaScalars s;
  __device__ bool Uses0() const { return true; }
  __device__ bool Uses1() const { return true; }
  __device__ bool Uses2() const { return false; }
  __device__ void Apply(float& p, float g, float& sq, float& acc,
                        float&) const {
    if (s.weight_decay != 0.0f) g += s.weight_decay * p;
    sq = s.rho * sq + s.one_minus_rho * g * g;
    const float delta = sqrtf(acc + s.epsilon) / sqrtf(sq + s.epsilon) * g;
    acc = s.rho * acc + s.one_minus_rho * delta * delta;
    p -= s.learning_rate * delta;
  }
};

struct AdagradRule {
  AdagradScalars s;
  __device__ bool Uses0() const { return true; }
  __device__ bool Uses1() const { return false; }
  __device__ bool Uses2() const { return false; }
  __device__ void Apply(float& p, float g, float& sum, float&, float&) const {
    if (s.weight_decay != 0.0f) g += s.weight_decay * p;
    sum += g * g;
    p -= s.clr * g / (sqrtf(sum) + s.epsilon);
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
  const bool uses0 = rule.Uses0();
  const bool uses1 = rule.Uses1();
  const bool uses2 = rule.Uses2();
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

cudaError_t LaunchSgdStep(const StepArrays& arrays, const SgdScalars& scalars,
                          int max_blocks, cudaStream_t stream) {
  return Launch(SgdRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdamStep(const StepArrays& arrays, const AdamScalars& scalars,
                           int max_blocks, cudaStream_t stream) {
  return Launch(AdamRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchRmspropStep(const StepArrays& arrays,
                              const RmspropScalars& scalars, int max_blocks,
                              cudaStream_t stream) {
  return Launch(RmspropRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdadeltaStep(const StepArrays& arrays,
                               const AdadeltaScalars& scalars, int max_blocks,
                               cudaStream_t stream) {
  return Launch(AdadeltaRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t LaunchAdagradStep(const StepArrays& arrays,
                              const AdagradScalars& scalars, int max_blocks,
                              cudaStream_t stream) {
  return Launch(AdagradRule{scalars}, arrays, max_blocks, stream);
}

cudaError_t TimeDeviceCopies(void* dst, const void* src, size_t bytes,
                             int iterations, cudaStream_t stream,
                             float* milliseconds) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cudaError_t error = cudaEventCreate(&start);
  if (error == cudaSuccess) error = cudaEventCreate(&stop);
  // Warm-up: first-touch and clock ramp stay out of the timing.
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  if (error == cudaSuccess) error = cudaEventRecord(start, stream);
  for (int i = 0; i < iterations && error == cudaSuccess; ++i) {
    error = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
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
