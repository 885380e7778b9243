#include "server/core/update/optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/core/update/cuda/cuda_engine.h"
#include "server/core/update/finite_bound.h"
#include "server/core/update/optimizer_rules.h"
#include "server/core/update/optimizer_step.h"

namespace mpilearn::server {
namespace {

// The kernels below split each range into a main loop whose trip count is a
// multiple of kBlock and a scalar tail of fewer than kBlock elements. GCC 12 at
// -O2 uses the "very cheap" vectorisation cost model, which only vectorises a
// loop whose trip count is known to be a multiple of the vector width and
// which needs no runtime alias checks; the split gives it the first, and the
// __restrict pointers the second. kBlock covers 8 floats (AVX) and 4 (SSE).
// sqrt vectorises only without errno, hence -fno-math-errno in BUILD.
//
// Every element is computed by the same fp32 operations whichever loop (and
// whichever thread) handles it, and IEEE sqrt and division are correctly
// rounded in vector and scalar form alike, so the result does not depend on
// how the elements are split.
constexpr size_t kBlock = 8;

// Thread slices start at a multiple of this many floats within a tensor
// (64 bytes: a cache line), so neighbouring slices share no line of an
// aligned buffer.
constexpr size_t kSliceAlign = 16;

// Below this many elements in all, a step takes a few microseconds and waking
// threads would cost more than it saves.
constexpr size_t kMinParallelElements = size_t{64} * 1024;

constexpr int kMaxThreads = 256;

inline size_t MainLoopEnd(size_t n) { return n & ~(kBlock - 1); }

// The largest magnitudes a step wrote, as AbsBits (finite_bound.h): an
// int32 max vectorises at -O2 where a float max (NaN-aware) does not.
struct Magnitudes {
  int32_t param = 0;
  int32_t state = 0;
};

// A kernel applies one rule to elements [0, n) of one tensor range. s0..s2
// are the rule's state operands (StateOperands), null where unused. With
// kTrack it returns the largest magnitudes it wrote (Rule::kWrites says
// which state operands it writes), tracked in the same pass; without, it
// returns zeros. Tracking is not free (SSE2 has no int32 max: each tracked
// array costs a compare and a blend per vector, up to twice the Adam step's
// time on one core), so a step runs untracked whenever its result can be
// bounded without it (CpuOptimizer::PrepareStep).
using Kernel = Magnitudes (*)(float* p, const float* g, float* s0, float* s1,
                              float* s2, size_t n, StepScalars scalars);

template <typename Rule, bool kTrack>
Magnitudes RunKernel(float* __restrict p, const float* __restrict g,
                     float* __restrict s0, float* __restrict s1,
                     float* __restrict s2, size_t n, const StepScalars scalars) {
  const size_t main_end = MainLoopEnd(n);
  int32_t param = 0;
  int32_t state = 0;
  const auto track = [&](size_t i) {
    if constexpr (!kTrack) return;
    param = std::max(param, AbsBits(p[i]));
    if constexpr (Rule::kWrites[0]) state = std::max(state, AbsBits(s0[i]));
    if constexpr (Rule::kWrites[1]) state = std::max(state, AbsBits(s1[i]));
    if constexpr (Rule::kWrites[2]) state = std::max(state, AbsBits(s2[i]));
  };
  size_t i = 0;
  for (; i < main_end; ++i) {
    Rule::Update(p, g, s0, s1, s2, i, scalars);
    track(i);
  }
  for (; i < n; ++i) {
    Rule::Update(p, g, s0, s1, s2, i, scalars);
    track(i);
  }
  return {param, state};
}

// Element i of each rule of optimizer_rules.h, with the rule's flags as
// template arguments: they take every branch out of the loops. A state
// operand is loaded only where the rule reads it and stored only where it
// writes it, so unused (null) operands are never touched.

template <bool kL2Decay, bool kMomentum, bool kFirstStep, bool kNesterov>
struct SgdKernel {
  static constexpr bool kWrites[3] = {kMomentum, false, false};
  static inline void Update(float* __restrict p, const float* __restrict g,
                            float* __restrict s0, float* __restrict,
                            float* __restrict, size_t i, const StepScalars& s) {
    // The first step only writes the buffer.
    float buffer = kMomentum && !kFirstStep ? s0[i] : 0.0f;
    rules::Sgd(s, kL2Decay, kMomentum, kFirstStep, kNesterov, p[i], g[i],
               buffer);
    if (kMomentum) s0[i] = buffer;
  }
};

template <bool kL2Decay, bool kDecoupledDecay>
struct AdamKernel {
  static constexpr bool kWrites[3] = {true, true, false};
  static inline void Update(float* __restrict p, const float* __restrict g,
                            float* __restrict s0, float* __restrict s1,
                            float* __restrict, size_t i, const StepScalars& s) {
    rules::Adam(s, kL2Decay, kDecoupledDecay, p[i], g[i], s0[i], s1[i]);
  }
};

template <bool kL2Decay, bool kCentered, bool kMomentum>
struct RmspropKernel {
  static constexpr bool kWrites[3] = {true, kCentered, kMomentum};
  static inline void Update(float* __restrict p, const float* __restrict g,
                            float* __restrict s0, float* __restrict s1,
                            float* __restrict s2, size_t i,
                            const StepScalars& s) {
    float grad_avg = kCentered ? s1[i] : 0.0f;
    float buffer = kMomentum ? s2[i] : 0.0f;
    rules::Rmsprop(s, kL2Decay, kCentered, kMomentum, p[i], g[i], s0[i],
                   grad_avg, buffer);
    if (kCentered) s1[i] = grad_avg;
    if (kMomentum) s2[i] = buffer;
  }
};

template <bool kL2Decay>
struct AdadeltaKernel {
  static constexpr bool kWrites[3] = {true, true, false};
  static inline void Update(float* __restrict p, const float* __restrict g,
                            float* __restrict s0, float* __restrict s1,
                            float* __restrict, size_t i, const StepScalars& s) {
    rules::Adadelta(s, kL2Decay, p[i], g[i], s0[i], s1[i]);
  }
};

template <bool kL2Decay>
struct AdagradKernel {
  static constexpr bool kWrites[3] = {true, false, false};
  static inline void Update(float* __restrict p, const float* __restrict g,
                            float* __restrict s0, float* __restrict,
                            float* __restrict, size_t i, const StepScalars& s) {
    rules::Adagrad(s, kL2Decay, p[i], g[i], s0[i]);
  }
};

// KernelFor<kTrack, Rule>::Get(a, b, ...) is
// &RunKernel<Rule<a, b, ...>, kTrack> for runtime flags a, b, ...: it
// instantiates every combination once.
template <bool kTrack, template <bool...> class Rule, bool... kFlags>
struct KernelFor {
  static Kernel Get() { return &RunKernel<Rule<kFlags...>, kTrack>; }
  template <typename... Rest>
  static Kernel Get(bool flag, Rest... rest) {
    return flag ? KernelFor<kTrack, Rule, kFlags..., true>::Get(rest...)
                : KernelFor<kTrack, Rule, kFlags..., false>::Get(rest...);
  }
};

// The kernel for `kind` with the flags of step scalars `s`, tracking what
// it writes or not.
template <bool kTrack>
Kernel SelectKernel(OptimizerKind kind, const StepScalars& s) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return KernelFor<kTrack, SgdKernel>::Get(s.l2_decay, s.has_momentum,
                                       s.has_momentum && s.first_step,
                                       s.has_momentum && s.nesterov);
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return KernelFor<kTrack, AdamKernel>::Get(s.l2_decay, s.decoupled_decay);
    case OptimizerKind::kRmsprop:
      return KernelFor<kTrack, RmspropKernel>::Get(s.l2_decay, s.centered,
                                           s.has_momentum);
    case OptimizerKind::kAdadelta:
      return KernelFor<kTrack, AdadeltaKernel>::Get(s.l2_decay);
    case OptimizerKind::kAdagrad:
      return KernelFor<kTrack, AdagradKernel>::Get(s.l2_decay);
  }
  return nullptr;  // unreachable: the config was validated
}

// InvalidArgumentError unless every field of `c` is in the range that
// ResolveOptimizerConfig enforces; it resolves the spec that sets them all, so
// the ranges live in one place.
absl::Status ValidateConfig(const OptimizerConfig& c) {
  v1::OptimizerSpec spec;
  spec.set_name(OptimizerKindName(c.kind));
  spec.set_learning_rate(c.learning_rate);
  spec.set_weight_decay(c.weight_decay);
  spec.set_momentum(c.momentum);
  spec.set_nesterov(c.nesterov);
  spec.set_beta1(c.beta1);
  spec.set_beta2(c.beta2);
  spec.set_epsilon(c.epsilon);
  spec.set_alpha(c.alpha);
  spec.set_centered(c.centered);
  spec.set_rho(c.rho);
  spec.set_lr_decay(c.lr_decay);
  spec.set_initial_accumulator_value(c.initial_accumulator_value);
  return ResolveOptimizerConfig(spec).status();
}

// True when one step of `c` with scalars `s` is certain to keep every
// intermediate and result finite, given that the parameters are at most
// `p`, the state values at most `state` and the gradients at most `g` in
// magnitude. Each line bounds the magnitude of a value of the rule in
// optimizer_rules.h by the triangle inequality; denominators are at least
// epsilon (> 0). Loose, but any real training step is far inside it; what
// it rejects (a gradient of 1e30, weights near 1e36) goes to the slow,
// undoable path, which still applies the step when it stays finite.
struct StepBounds {
  bool certain = false;
  double param = 0.0;  // the largest |parameter| after the step
  double state = 0.0;  // the largest |state value| after the step
};
StepBounds StepBound(const OptimizerConfig& c, const StepScalars& s, double p,
                     double state, double g) {
  const auto f = [](float x) { return std::fabs(static_cast<double>(x)); };
  const double lr = f(s.learning_rate);
  const double wd = s.l2_decay ? f(s.weight_decay) : 0.0;
  const double eps = f(s.epsilon);
  double most = std::max({p, state, g});
  double next_p = 0.0;
  double next_state = 0.0;
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      const double d = g + wd * p;
      const double b = f(s.momentum) * state + d;
      const double step = s.nesterov ? d + f(s.momentum) * b
                          : s.has_momentum ? b : d;
      most = std::max({most, d, b, lr * step});
      next_p = p + lr * step;
      next_state = s.has_momentum ? b : 0.0;
      break;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      if (s.epsilon <= 0) return {};
      const double param = s.decoupled_decay ? p * f(s.weight_scale) : p;
      const double grad = g + wd * param;
      const double m = f(s.decay) * state + grad;
      const double v = f(s.beta2) * state + grad * grad;
      const double ratio = m / eps;
      most = std::max({most, param, grad, m, grad * grad, v,
                       std::sqrt(v) * f(s.inv_bias_correction2_sqrt) + eps,
                       ratio, f(s.step_size) * ratio});
      next_p = param + f(s.step_size) * ratio;
      next_state = std::max(m, v);
      break;
    }
    case OptimizerKind::kRmsprop: {
      // sqrt(square_avg - grad_avg^2) can round below zero: never certain.
      if (s.centered || s.epsilon <= 0) return {};
      const double grad = g + wd * p;
      const double sq = f(s.decay) * state + grad * grad;
      const double ratio = grad / eps;
      const double b = f(s.momentum) * state + ratio;
      most = std::max({most, grad, grad * grad, sq, ratio, b, lr * b});
      next_p = p + lr * b;
      next_state = s.has_momentum ? std::max(sq, b) : sq;
      break;
    }
    case OptimizerKind::kAdadelta: {
      if (s.epsilon <= 0) return {};
      const double grad = g + wd * p;
      const double sq = f(s.decay) * state + grad * grad;
      const double delta = std::sqrt(state + eps) / std::sqrt(eps) * grad;
      const double acc = f(s.decay) * state + delta * delta;
      most = std::max({most, grad, grad * grad, sq + eps, delta, delta * delta,
                       acc, lr * delta});
      next_p = p + lr * delta;
      next_state = std::max(sq, acc);
      break;
    }
    case OptimizerKind::kAdagrad: {
      if (s.epsilon <= 0) return {};
      const double grad = g + wd * p;
      const double sum = state + grad * grad;
      const double ratio = grad / eps;
      most = std::max({most, grad, grad * grad, sum, ratio, lr * ratio});
      next_p = p + lr * ratio;
      next_state = sum;
      break;
    }
  }
  most = std::max({most, next_p, next_state});
  // A NaN bound (from a NaN input) is not within bound: not certain.
  StepBounds bounds;
  bounds.certain = WithinBound(most);
  bounds.param = next_p;
  bounds.state = next_state;
  return bounds;
}

// ---------------------------------------------------------------------------

// Runs a function on `slices` slice indices at once: slice 0 on the calling
// thread, the others on threads started at construction and joined at
// destruction.
//
// Threading: Run is called by one thread at a time.
class SliceWorkers {
 public:
  explicit SliceWorkers(int slices) {
    threads_.reserve(slices - 1);
    for (int slice = 1; slice < slices; ++slice) {
      threads_.emplace_back([this, slice] { Loop(slice); });
    }
  }

  ~SliceWorkers() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      work_.SignalAll();
    }
    for (std::thread& thread : threads_) thread.join();
  }

  SliceWorkers(const SliceWorkers&) = delete;
  SliceWorkers& operator=(const SliceWorkers&) = delete;

  // Calls fn(0), ..., fn(slices - 1) concurrently and returns when all have
  // returned.
  void Run(absl::FunctionRef<void(int)> fn) {
    {
      absl::MutexLock lock(&mu_);
      fn_ = &fn;
      ++generation_;
      running_ = static_cast<int>(threads_.size());
      work_.SignalAll();
    }
    fn(0);
    absl::MutexLock lock(&mu_);
    while (running_ > 0) done_.Wait(&mu_);
    fn_ = nullptr;
  }

 private:
  void Loop(int slice) {
    uint64_t seen = 0;
    for (;;) {
      const absl::FunctionRef<void(int)>* fn;
      {
        absl::MutexLock lock(&mu_);
        while (!stopping_ && generation_ == seen) work_.Wait(&mu_);
        if (stopping_) return;
        seen = generation_;
        fn = fn_;
      }
      (*fn)(slice);
      absl::MutexLock lock(&mu_);
      if (--running_ == 0) done_.Signal();
    }
  }

  absl::Mutex mu_;
  absl::CondVar work_;  // generation_ advanced or stopping_ set
  absl::CondVar done_;  // running_ reached 0
  // The function of the current Run; valid while running_ > 0.
  const absl::FunctionRef<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Advanced once per Run; each worker runs each generation exactly once,
  // since Run waits for all of them before the next can start.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers still in the current generation.
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------

// All six optimizers on the CPU, each tensor updated in one fused pass per
// step. With more than one thread and a model of at least
// kMinParallelElements, the concatenated elements of all tensors are split
// into one contiguous slice per thread at construction; each step runs every
// slice at once, the calling thread taking slice 0.
//
// Threading: as Optimizer; the workers only run inside Step.
class CpuOptimizer final : public Optimizer {
 public:
  CpuOptimizer(const OptimizerConfig& config,
               const std::vector<size_t>& tensor_sizes, int threads)
      : config_(config),
        tensor_sizes_(tensor_sizes),
        operands_(StateOperands(config)) {
    const size_t buffer_count = StateBufferNames(config).size();
    const float initial =
        config.kind == OptimizerKind::kAdagrad
            ? static_cast<float>(config.initial_accumulator_value)
            : 0.0f;
    state_.buffers.resize(buffer_count);
    for (auto& buffer : state_.buffers) {
      buffer.reserve(tensor_sizes.size());
      for (const size_t size : tensor_sizes) buffer.emplace_back(size, initial);
    }
    size_t total = 0;
    for (const size_t size : tensor_sizes) total += size;
    const int slices = total >= kMinParallelElements ? threads : 1;
    SplitIntoSlices(total, slices);
    if (slices > 1) workers_ = std::make_unique<SliceWorkers>(slices);
  }

  absl::Status Step(absl::Span<const absl::Span<float>> params,
                    absl::Span<const absl::Span<const float>> grads) override {
    const StepScalars scalars = ComputeStepScalars(config_, state_.steps + 1);
    // Tracked unless PrepareStep vouched for this step with bounds that
    // need no tracking (see there); a Step without PrepareStep runs
    // untracked and leaves the magnitudes unknown.
    const bool track = prepared_ && track_next_;
    undoable_ = undoable_ && prepared_;  // UndoStep undoes this step only
    const Kernel kernel = track ? SelectKernel<true>(config_.kind, scalars)
                                : SelectKernel<false>(config_.kind, scalars);
    ++state_.steps;
    // One entry per slice, each written by its own thread.
    std::array<Magnitudes, kMaxThreads> magnitudes;
    const auto run_slice = [&](int slice) {
      Magnitudes& most = magnitudes[slice];
      most = {};
      for (const Segment& seg : slices_[slice]) {
        std::array<float*, 3> s = {nullptr, nullptr, nullptr};
        for (size_t k = 0; k < s.size(); ++k) {
          if (operands_[k] >= 0) {
            s[k] = state_.buffers[operands_[k]][seg.tensor].data() + seg.begin;
          }
        }
        const Magnitudes m =
            kernel(params[seg.tensor].data() + seg.begin,
                   grads[seg.tensor].data() + seg.begin, s[0], s[1], s[2],
                   seg.end - seg.begin, scalars);
        most.param = std::max(most.param, m.param);
        most.state = std::max(most.state, m.state);
      }
    };
    if (workers_ == nullptr) {
      run_slice(0);
    } else {
      workers_->Run(run_slice);
    }
    if (track) {
      Magnitudes all;
      for (size_t k = 0; k < slices_.size(); ++k) {
        all.param = std::max(all.param, magnitudes[k].param);
        all.state = std::max(all.state, magnitudes[k].state);
      }
      finite_ = FiniteBits(all.param) && FiniteBits(all.state);
      known_ = finite_;
      bound_param_ = FromAbsBits(all.param);
      bound_state_ = FromAbsBits(all.state);
    } else if (prepared_) {
      // Certain: finite, within the bounds PrepareStep computed.
      finite_ = true;
      known_ = true;
      bound_param_ = next_.param;
      bound_state_ = next_.state;
    } else {
      finite_ = true;  // not tracked: the caller checks
      known_ = false;
    }
    prepared_ = false;
    return absl::OkStatus();
  }

  // Bounds the step from the magnitudes known after the last one: the
  // values a tracked step measured, or the bounds an untracked certain step
  // carried forward (StepBound's results, which grow slowly with each
  // untracked step; a tracked step re-anchors them on the real values).
  // Adadelta's bound on its accumulators grows geometrically when carried
  // forward, so its steps are always tracked (and their bound taken from
  // the measured values). An uncertain step is undoable: the state is
  // copied first (into buffers kept from the last copy).
  bool PrepareStep(double max_grad) override {
    prepared_ = true;
    track_next_ = true;
    next_ = {};
    if (known_) {
      next_ = StepBound(config_, ComputeStepScalars(config_, state_.steps + 1),
                        std::max(bound_param_, max_grad), bound_state_,
                        max_grad);
      track_next_ = !next_.certain || config_.kind == OptimizerKind::kAdadelta;
    }
    undoable_ = !next_.certain;
    if (undoable_) saved_ = state_;
    return next_.certain;
  }

  bool LastStepFinite(absl::Span<const absl::Span<float>>) const override {
    return finite_;
  }

  absl::Status UndoStep() override {
    if (!undoable_) {
      return absl::FailedPreconditionError(
          "no undoable optimizer step to undo (PrepareStep vouched for it)");
    }
    state_ = saved_;
    ForgetMagnitudes();
    return absl::OkStatus();
  }

  int64_t steps() const override { return state_.steps; }
  std::string name() const override { return OptimizerKindName(config_.kind); }
  const OptimizerConfig& config() const override { return config_; }
  void SetLearningRate(double rate) override { config_.learning_rate = rate; }
  absl::StatusOr<OptimizerState> SaveState() const override { return state_; }

  absl::Status RestoreState(const OptimizerState& state) override {
    if (state.steps < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state has a negative step count ", state.steps));
    }
    const std::vector<std::string> names = StateBufferNames(config_);
    if (state.buffers.size() != names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state has ", state.buffers.size(), " buffers, ", name(),
          " with this configuration keeps ", names.size()));
    }
    for (size_t b = 0; b < names.size(); ++b) {
      const auto& buffer = state.buffers[b];
      if (buffer.size() != tensor_sizes_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state buffer ", names[b], " has ", buffer.size(),
            " tensors, the model has ", tensor_sizes_.size()));
      }
      for (size_t i = 0; i < buffer.size(); ++i) {
        if (buffer[i].size() != tensor_sizes_[i]) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer state buffer ", names[b], " of tensor ",
                           i, " has ", buffer[i].size(),
                           " elements, the tensor has ", tensor_sizes_[i]));
        }
      }
    }
    state_ = state;
    ForgetMagnitudes();
    return absl::OkStatus();
  }

 private:
  // The state changed outside Step (UndoStep, RestoreState): nothing is
  // known of its magnitudes, and nothing is left to undo.
  void ForgetMagnitudes() {
    known_ = false;
    prepared_ = false;
    undoable_ = false;
    finite_ = true;
  }

  // Elements [begin, end) of one tensor.
  struct Segment {
    size_t tensor;
    size_t begin;
    size_t end;
  };

  // Fills slices_ with `slices` contiguous runs of about total / slices
  // elements each, every boundary rounded down to a multiple of kSliceAlign
  // within its tensor. Empty tensors and empty segments are left out.
  void SplitIntoSlices(size_t total, int slices) {
    slices_.assign(slices, {});
    // Slice k starts at element `begin` of `tensor`.
    size_t tensor = 0;
    size_t tensor_start = 0;  // global index of tensor's element 0
    size_t begin = 0;         // within `tensor`, of the current slice
    for (int k = 0; k < slices; ++k) {
      const size_t global_end = total * (k + 1) / slices;
      // Whole tensors that end at or before the boundary.
      while (tensor < tensor_sizes_.size() &&
             tensor_start + tensor_sizes_[tensor] <= global_end) {
        if (begin < tensor_sizes_[tensor]) {
          slices_[k].push_back({tensor, begin, tensor_sizes_[tensor]});
        }
        tensor_start += tensor_sizes_[tensor];
        ++tensor;
        begin = 0;
      }
      if (tensor == tensor_sizes_.size()) continue;
      // The boundary falls inside `tensor`. Rounding down is monotone, so
      // end >= begin.
      const size_t end =
          (global_end - tensor_start) / kSliceAlign * kSliceAlign;
      if (end > begin) slices_[k].push_back({tensor, begin, end});
      begin = end;
    }
  }

  OptimizerConfig config_;  // learning_rate changes with a schedule
  const std::vector<size_t> tensor_sizes_;
  // Kernel operands s0..s2 as indices into state_.buffers (-1: none).
  const std::array<int, 3> operands_;
  // buffers[b][i] is as long as tensor i; steps counts Step calls plus the
  // count last restored.
  OptimizerState state_;
  // slices_[k] is what thread k updates each step; together the slices cover
  // every element of every tensor exactly once.
  std::vector<std::vector<Segment>> slices_;
  // Null when steps run on the calling thread alone.
  std::unique_ptr<SliceWorkers> workers_;
  // Guarded steps (PrepareStep). known_: bound_param_ and bound_state_
  // bound every parameter and state value's magnitude (false before the
  // first tracked step, after an untracked unprepared one and after
  // RestoreState). finite_: the last step wrote only finite values (as far
  // as it was tracked or vouched for). prepared_: PrepareStep was called
  // for the next Step, which is tracked when track_next_, else carries
  // next_ forward. undoable_: saved_ holds the state before that Step
  // (PrepareStep was not certain), for UndoStep.
  bool known_ = false;
  double bound_param_ = 0.0;
  double bound_state_ = 0.0;
  bool finite_ = true;
  bool prepared_ = false;
  bool track_next_ = true;
  StepBounds next_;
  bool undoable_ = false;
  OptimizerState saved_;
};


// "cuda:N" -> N; error for anything else.
absl::StatusOr<int> CudaIndex(absl::string_view device) {
  int index = 0;
  if (!absl::ConsumePrefix(&device, "cuda:") || !absl::SimpleAtoi(device, &index) ||
      index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer device '", device, "' is not 'cpu' or 'cuda:N'"));
  }
  return index;
}

}  // namespace

absl::StatusOr<std::string> ResolveOptimizerDevice(const std::string& flag) {
  const int gpus = CudaEngine::DeviceCount();
  if (flag == "cpu") return std::string("cpu");
  if (flag == "auto") {
    if (gpus > 0) return std::string("cuda:0");
    LOG(INFO) << "--device=auto: no CUDA device found ("
              << (CudaEngine::BuiltWithCuda() ? "none visible to this process"
                                              : "this build has no CUDA")
              << "); optimizers run on the CPU";
    return std::string("cpu");
  }
  std::string device = flag == "cuda" ? "cuda:0" : flag;
  if (!absl::StartsWith(device, "cuda:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu, cuda or cuda:N, got '", flag, "'"));
  }
  MPILEARN_ASSIGN_OR_RETURN(int index, CudaIndex(device));
  if (index >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", flag, ": no CUDA device ", index, " (found ", gpus,
        CudaEngine::BuiltWithCuda() ? "" : "; this build has no CUDA",
        "); use --device=auto or --device=cpu"));
  }
  return device;
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const OptimizerConfig& config, const std::vector<size_t>& tensor_sizes,
    const EngineOptions& engine) {
  MPILEARN_RETURN_IF_ERROR(ValidateConfig(config));
  if (engine.device != "cpu") {
    MPILEARN_ASSIGN_OR_RETURN(int index, CudaIndex(engine.device));
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> cuda,
                              CudaEngine::Create(config, tensor_sizes, index));
    return std::unique_ptr<Optimizer>(std::move(cuda));
  }
  if (engine.threads < 1 || engine.threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer threads must be in [1, ", kMaxThreads,
                     "], got ", engine.threads));
  }
  return std::unique_ptr<Optimizer>(
      std::make_unique<CpuOptimizer>(config, tensor_sizes, engine.threads));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    const mpilearn::v1::OptimizerSpec& spec,
    const std::vector<size_t>& tensor_sizes, const EngineOptions& engine) {
  MPILEARN_ASSIGN_OR_RETURN(const OptimizerConfig config,
                            ResolveOptimizerConfig(spec));
  return CreateOptimizer(config, tensor_sizes, engine);
}

}  // namespace mpilearn::server
