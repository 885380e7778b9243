// The per-element update rules of the six optimizers, written once for both
// backends: the CPU loops of optimizer.cc and the CUDA kernels of
// cuda/optimizer_kernels.cu call these functions, so the CPU tests check the
// arithmetic the GPU runs.
//
// Each rule updates one element: the parameter `p` and the rule's state
// values in place, from the gradient `g` and the step's scalars (see
// optimizer_step.h; the formulas are those of optimizer_config.h). The bool
// arguments choose the optional terms and are uniform across a step: the CPU
// passes compile-time constants (so its loops have no branches and
// vectorise), the GPU passes the StepScalars flags (uniform, so its branches
// never diverge). A state argument the flags leave unused is neither read
// nor written.
//
// The arithmetic is fp32 in a fixed order, and IEEE sqrt and division are
// correctly rounded on both devices; the CUDA build compiles with
// --fmad=false, so CPU and GPU agree to the bit.
//
// Plain header: nvcc compiles it (MPILEARN_HD marks the functions
// __host__ __device__ there); nothing here may include Abseil or protobuf.
#ifndef MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_RULES_H_
#define MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_RULES_H_

#include <cmath>

#include "server/core/update/optimizer_step.h"

#if defined(__CUDACC__)
#define MPILEARN_HD __host__ __device__ __forceinline__
#else
#define MPILEARN_HD inline __attribute__((always_inline))
#endif

namespace mpilearn::server::rules {

// fp32 square root, correctly rounded (GCC vectorises it under
// -fno-math-errno; nvcc's sqrtf is IEEE unless -use_fast_math).
MPILEARN_HD float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// sgd. Reads learning_rate, weight_decay, momentum. `first_step`: the buffer
// is set to the gradient rather than accumulated into (PyTorch, a
// parameter's first step); `momentum_buffer` is then only written.
MPILEARN_HD void Sgd(const StepScalars& s, bool l2_decay, bool momentum,
                     bool first_step, bool nesterov, float& p, float g,
                     float& momentum_buffer) {
  float d = g;
  if (l2_decay) d += s.weight_decay * p;
  if (momentum) {
    const float b = first_step ? d : s.momentum * momentum_buffer + d;
    momentum_buffer = b;
    d = nesterov ? d + s.momentum * b : b;
  }
  p -= s.learning_rate * d;
}

// adam and adamw. Reads decay (beta1), one_minus_decay, beta2,
// one_minus_beta2, step_size, inv_bias_correction2_sqrt, epsilon, and
// weight_decay (l2_decay) or weight_scale (decoupled_decay).
MPILEARN_HD void Adam(const StepScalars& s, bool l2_decay, bool decoupled_decay,
                      float& p, float g, float& exp_avg, float& exp_avg_sq) {
  float param = p;
  if (decoupled_decay) param *= s.weight_scale;
  float grad = g;
  if (l2_decay) grad += s.weight_decay * param;
  const float m = s.decay * exp_avg + s.one_minus_decay * grad;
  const float v = s.beta2 * exp_avg_sq + s.one_minus_beta2 * grad * grad;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = Sqrt(v) * s.inv_bias_correction2_sqrt + s.epsilon;
  p = param - s.step_size * (m / denom);
}

// rmsprop. Reads learning_rate, weight_decay, decay (alpha),
// one_minus_decay, epsilon, momentum. `grad_avg` only when centered,
// `momentum_buffer` only with momentum.
MPILEARN_HD void Rmsprop(const StepScalars& s, bool l2_decay, bool centered,
                         bool momentum, float& p, float g, float& square_avg,
                         float& grad_avg, float& momentum_buffer) {
  float grad = g;
  if (l2_decay) grad += s.weight_decay * p;
  const float sq = s.decay * square_avg + s.one_minus_decay * grad * grad;
  square_avg = sq;
  float avg;
  if (centered) {
    const float ga = s.decay * grad_avg + s.one_minus_decay * grad;
    grad_avg = ga;
    avg = Sqrt(sq - ga * ga) + s.epsilon;
  } else {
    avg = Sqrt(sq) + s.epsilon;
  }
  if (momentum) {
    const float b = s.momentum * momentum_buffer + grad / avg;
    momentum_buffer = b;
    p -= s.learning_rate * b;
  } else {
    p -= s.learning_rate * (grad / avg);
  }
}

// adadelta. Reads learning_rate, weight_decay, decay (rho),
// one_minus_decay, epsilon.
MPILEARN_HD void Adadelta(const StepScalars& s, bool l2_decay, float& p,
                          float g, float& square_avg, float& acc_delta) {
  float grad = g;
  if (l2_decay) grad += s.weight_decay * p;
  const float sq = s.decay * square_avg + s.one_minus_decay * grad * grad;
  square_avg = sq;
  const float std_dev = Sqrt(sq + s.epsilon);
  const float delta = Sqrt(acc_delta + s.epsilon) / std_dev * grad;
  acc_delta = s.decay * acc_delta + s.one_minus_decay * delta * delta;
  p -= s.learning_rate * delta;
}

// adagrad. Reads learning_rate (the decayed clr), weight_decay, epsilon.
MPILEARN_HD void Adagrad(const StepScalars& s, bool l2_decay, float& p,
                         float g, float& sum) {
  float grad = g;
  if (l2_decay) grad += s.weight_decay * p;
  const float new_sum = sum + grad * grad;
  sum = new_sum;
  p -= s.learning_rate * (grad / (Sqrt(new_sum) + s.epsilon));
}

}  // namespace mpilearn::server::rules

#endif  // MPILEARN_SERVER_CORE_UPDATE_OPTIMIZER_RULES_H_
