#include "server/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace mpilearn::server {
namespace {

// The kernels below split each tensor into a main loop whose trip count is a
// multiple of kBlock and a scalar tail of fewer than kBlock elements. GCC 12 at
// -O2 uses the "very cheap" vectorisation cost model, which only vectorises a
// loop whose trip count is known to be a multiple of the vector width and
// which needs no runtime alias checks; the split gives it the first, and the
// __restrict pointers the second. kBlock covers 8 floats (AVX) and 4 (SSE).
// The sqrt in Adam vectorises only without errno, hence -fno-math-errno in
// BUILD.
constexpr size_t kBlock = 8;

inline size_t MainLoopEnd(size_t n) { return n & ~(kBlock - 1); }

absl::Status OutOfRange(absl::string_view field, absl::string_view requirement,
                        double value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer.", field, " must be ", requirement, ", got ", value));
}

absl::Status CheckPositive(absl::string_view field, double value) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return OutOfRange(field, "finite and > 0", value);
}

absl::Status CheckNonNegative(absl::string_view field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return OutOfRange(field, "finite and >= 0", value);
}

absl::Status CheckBeta(absl::string_view field, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();  // false for NaN
  return OutOfRange(field, "in [0, 1)", value);
}

// ---------------------------------------------------------------------------
// Adam.

// Per-step constants of the Adam update, in fp32.
struct AdamScalars {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;                 // lr / (1 - beta1^t)
  float inv_bias_correction2_sqrt;  // 1 / sqrt(1 - beta2^t)
  float epsilon;
  float weight_decay;
};

template <bool kWeightDecay>
inline void AdamElement(float* __restrict p, const float* __restrict g,
                        float* __restrict m, float* __restrict v, size_t i,
                        const AdamScalars& s) {
  float grad = g[i];
  if (kWeightDecay) grad += s.weight_decay * p[i];
  const float m_i = s.beta1 * m[i] + s.one_minus_beta1 * grad;
  const float v_i = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad;
  m[i] = m_i;
  v[i] = v_i;
  const float denom =
      std::sqrt(v_i) * s.inv_bias_correction2_sqrt + s.epsilon;
  p[i] -= s.step_size * (m_i / denom);
}

template <bool kWeightDecay>
void AdamTensor(float* __restrict p, const float* __restrict g,
                float* __restrict m, float* __restrict v, size_t n,
                const AdamScalars scalars) {
  const size_t main_end = MainLoopEnd(n);
  size_t i = 0;
  for (; i < main_end; ++i) AdamElement<kWeightDecay>(p, g, m, v, i, scalars);
  for (; i < n; ++i) AdamElement<kWeightDecay>(p, g, m, v, i, scalars);
}

// ---------------------------------------------------------------------------
// SGD.

struct SgdScalars {
  float learning_rate;
  float momentum;
  float weight_decay;
};

// kFirstStep: the momentum buffer is initialised to the gradient rather than
// accumulated into, as PyTorch does on a parameter's first step.
template <bool kWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov>
inline void SgdElement(float* __restrict p, const float* __restrict g,
                       float* __restrict buf, size_t i, const SgdScalars& s) {
  float d = g[i];
  if (kWeightDecay) d += s.weight_decay * p[i];
  if (kMomentum) {
    const float b = kFirstStep ? d : s.momentum * buf[i] + d;
    buf[i] = b;
    d = kNesterov ? d + s.momentum * b : b;
  }
  p[i] -= s.learning_rate * d;
}

template <bool kWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov>
void SgdTensor(float* __restrict p, const float* __restrict g,
               float* __restrict buf, size_t n, const SgdScalars scalars) {
  const size_t main_end = MainLoopEnd(n);
  size_t i = 0;
  for (; i < main_end; ++i) {
    SgdElement<kWeightDecay, kMomentum, kFirstStep, kNesterov>(p, g, buf, i,
                                                               scalars);
  }
  for (; i < n; ++i) {
    SgdElement<kWeightDecay, kMomentum, kFirstStep, kNesterov>(p, g, buf, i,
                                                               scalars);
  }
}

using SgdKernel = void (*)(float* __restrict, const float* __restrict,
                           float* __restrict, size_t, SgdScalars);

template <bool kWeightDecay>
SgdKernel SelectSgdKernel(bool momentum, bool first_step, bool nesterov) {
  if (!momentum) return &SgdTensor<kWeightDecay, false, false, false>;
  if (first_step) {
    return nesterov ? &SgdTensor<kWeightDecay, true, true, true>
                    : &SgdTensor<kWeightDecay, true, true, false>;
  }
  return nesterov ? &SgdTensor<kWeightDecay, true, false, true>
                  : &SgdTensor<kWeightDecay, true, false, false>;
}

}  // namespace

absl::Status ValidateAdamOptions(const AdamOptions& options) {
  MPILEARN_RETURN_IF_ERROR(
      CheckPositive("learning_rate", options.learning_rate));
  MPILEARN_RETURN_IF_ERROR(CheckBeta("beta1", options.beta1));
  MPILEARN_RETURN_IF_ERROR(CheckBeta("beta2", options.beta2));
  MPILEARN_RETURN_IF_ERROR(CheckPositive("epsilon", options.epsilon));
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegative("weight_decay", options.weight_decay));
  return absl::OkStatus();
}

absl::Status ValidateSgdOptions(const SgdOptions& options) {
  MPILEARN_RETURN_IF_ERROR(
      CheckPositive("learning_rate", options.learning_rate));
  MPILEARN_RETURN_IF_ERROR(CheckNonNegative("momentum", options.momentum));
  MPILEARN_RETURN_IF_ERROR(
      CheckNonNegative("weight_decay", options.weight_decay));
  if (options.nesterov && options.momentum == 0) {
    // PyTorch rejects this too: Nesterov without momentum is plain SGD.
    return absl::InvalidArgumentError(
        "optimizer.nesterov requires optimizer.momentum > 0, got momentum 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const mpilearn::v1::OptimizerSpec& spec,
    const std::vector<size_t>& tensor_sizes) {
  if (spec.name() == "adam") {
    AdamOptions options;
    if (spec.has_learning_rate()) options.learning_rate = spec.learning_rate();
    if (spec.has_beta1()) options.beta1 = spec.beta1();
    if (spec.has_beta2()) options.beta2 = spec.beta2();
    if (spec.has_epsilon()) options.epsilon = spec.epsilon();
    if (spec.has_weight_decay()) options.weight_decay = spec.weight_decay();
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<CpuAdamOptimizer> optimizer,
                              CpuAdamOptimizer::Create(options, tensor_sizes));
    return std::unique_ptr<Optimizer>(std::move(optimizer));
  }
  if (spec.name() == "sgd") {
    SgdOptions options;
    if (spec.has_learning_rate()) options.learning_rate = spec.learning_rate();
    if (spec.has_momentum()) options.momentum = spec.momentum();
    if (spec.has_nesterov()) options.nesterov = spec.nesterov();
    if (spec.has_weight_decay()) options.weight_decay = spec.weight_decay();
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<CpuSgdOptimizer> optimizer,
                              CpuSgdOptimizer::Create(options, tensor_sizes));
    return std::unique_ptr<Optimizer>(std::move(optimizer));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.name must be one of \"adam\", \"sgd\", got \"",
                   spec.name(), "\""));
}

// ---------------------------------------------------------------------------
// CpuAdamOptimizer.

absl::StatusOr<std::unique_ptr<CpuAdamOptimizer>> CpuAdamOptimizer::Create(
    const AdamOptions& options, const std::vector<size_t>& tensor_sizes) {
  MPILEARN_RETURN_IF_ERROR(ValidateAdamOptions(options));
  return absl::WrapUnique(new CpuAdamOptimizer(options, tensor_sizes));
}

CpuAdamOptimizer::CpuAdamOptimizer(const AdamOptions& options,
                                   const std::vector<size_t>& tensor_sizes)
    : options_(options) {
  exp_avg_.reserve(tensor_sizes.size());
  exp_avg_sq_.reserve(tensor_sizes.size());
  for (const size_t size : tensor_sizes) {
    exp_avg_.emplace_back(size, 0.0f);
    exp_avg_sq_.emplace_back(size, 0.0f);
  }
}

void CpuAdamOptimizer::Step(absl::Span<const absl::Span<float>> params,
                            absl::Span<const absl::Span<const float>> grads) {
  ++steps_;
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double t = static_cast<double>(steps_);
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, t);
  const AdamScalars scalars = {
      static_cast<float>(options_.beta1),
      static_cast<float>(1.0 - options_.beta1),
      static_cast<float>(options_.beta2),
      static_cast<float>(1.0 - options_.beta2),
      static_cast<float>(options_.learning_rate / bias_correction1),
      static_cast<float>(1.0 / std::sqrt(bias_correction2)),
      static_cast<float>(options_.epsilon),
      static_cast<float>(options_.weight_decay),
  };
  const auto kernel = options_.weight_decay != 0 ? &AdamTensor<true>
                                                 : &AdamTensor<false>;
  for (size_t i = 0; i < params.size(); ++i) {
    kernel(params[i].data(), grads[i].data(), exp_avg_[i].data(),
           exp_avg_sq_[i].data(), params[i].size(), scalars);
  }
}

// ---------------------------------------------------------------------------
// CpuSgdOptimizer.

absl::StatusOr<std::unique_ptr<CpuSgdOptimizer>> CpuSgdOptimizer::Create(
    const SgdOptions& options, const std::vector<size_t>& tensor_sizes) {
  MPILEARN_RETURN_IF_ERROR(ValidateSgdOptions(options));
  return absl::WrapUnique(new CpuSgdOptimizer(options, tensor_sizes));
}

CpuSgdOptimizer::CpuSgdOptimizer(const SgdOptions& options,
                                 const std::vector<size_t>& tensor_sizes)
    : options_(options) {
  if (options_.momentum == 0) return;
  momentum_buffer_.reserve(tensor_sizes.size());
  for (const size_t size : tensor_sizes) {
    momentum_buffer_.emplace_back(size, 0.0f);
  }
}

void CpuSgdOptimizer::Step(absl::Span<const absl::Span<float>> params,
                           absl::Span<const absl::Span<const float>> grads) {
  const bool momentum = options_.momentum != 0;
  const bool first_step = steps_ == 0;
  ++steps_;
  const SgdScalars scalars = {
      static_cast<float>(options_.learning_rate),
      static_cast<float>(options_.momentum),
      static_cast<float>(options_.weight_decay),
  };
  const SgdKernel kernel =
      options_.weight_decay != 0
          ? SelectSgdKernel<true>(momentum, first_step, options_.nesterov)
          : SelectSgdKernel<false>(momentum, first_step, options_.nesterov);
  for (size_t i = 0; i < params.size(); ++i) {
    float* buffer = momentum ? momentum_buffer_[i].data() : nullptr;
    kernel(params[i].data(), grads[i].data(), buffer, params[i].size(),
           scalars);
  }
}

}  // namespace mpilearn::server
