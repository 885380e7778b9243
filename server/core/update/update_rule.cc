#include "server/core/update/update_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/error_reason.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {
namespace {

// Bit patterns of |x| as int32 (see ScanUpdate): ordered as the magnitudes,
// NaN and Inf above kMaxFiniteBits.
constexpr int32_t kAbsMask = 0x7fffffff;
constexpr int32_t kMaxFiniteBits = 0x7f7fffff;

inline int32_t AbsBits(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & kAbsMask;
}

inline double FromBits(int32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return static_cast<double>(x);
}

// A guarded rule's values stay this far inside the fp32 range (3.4e38) when
// PrepareApply says yes, so the bound (in double) covers fp32 rounding.
constexpr double kCertainlyFiniteBound = 1e36;

// The bound a guarded rule carries on its weights (see UpdateRule): the
// largest |weight| after its last Apply, measured (tracked Apply) or
// bounded (untracked). `known` is false before the first tracked Apply and
// after Undo; `finite` says whether the last Apply wrote only finite
// values. `previous_update` is the last update's largest value: the job
// sets buffers to the update's values after an Apply, so the weights the
// next Apply reads are bounded by it too.
struct WeightBound {
  bool known = false;
  bool finite = true;
  double weights = 0.0;
  double previous_update = 0.0;
};

// Runs `update(c[i], x[i])` over every element of `weights` and `values`
// and, with kTrack, returns AbsBits of the largest weight written (else 0).
template <bool kTrack, typename Update>
int32_t ForEachElement(std::vector<std::vector<float>>& weights,
                       const std::vector<std::vector<float>>& values,
                       Update update) {
  int32_t most = 0;
  for (size_t t = 0; t < weights.size(); ++t) {
    float* __restrict c = weights[t].data();
    const float* __restrict x = values[t].data();
    const size_t n = weights[t].size();
    for (size_t i = 0; i < n; ++i) {
      c[i] = update(c[i], x[i]);
      if constexpr (kTrack) most = std::max(most, AbsBits(c[i]));
    }
  }
  return most;
}

// downpour, sync: one optimizer step on the (scaled) gradient.
class GradientRule final : public UpdateRule {
 public:
  explicit GradientRule(std::unique_ptr<Optimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}

  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_GRADIENT; }
  const Optimizer* optimizer() const override { return optimizer_.get(); }

  absl::Status Apply(std::vector<std::vector<float>>& weights,
                     const std::vector<std::vector<float>>& update,
                     float scale) override {
    std::vector<absl::Span<float>> params;
    std::vector<absl::Span<const float>> grads;
    params.reserve(weights.size());
    grads.reserve(weights.size());
    if (scale != 1.0f) scaled_.resize(weights.size());
    for (size_t t = 0; t < weights.size(); ++t) {
      params.emplace_back(weights[t]);
      if (scale == 1.0f) {
        grads.emplace_back(update[t]);
        continue;
      }
      const std::vector<float>& g = update[t];
      std::vector<float>& scaled = scaled_[t];
      scaled.resize(g.size());
      for (size_t i = 0; i < g.size(); ++i) scaled[i] = scale * g[i];
      grads.emplace_back(scaled);
    }
    return WithReason(optimizer_->Step(params, grads),
                      v1::ERROR_REASON_INTERNAL);
  }

  bool PrepareApply(double max_update) override {
    // The previous update's values may be in the buffers the step reads.
    const double bound = std::max(max_update, previous_update_);
    previous_update_ = max_update;
    return optimizer_->PrepareStep(bound);
  }

  absl::Status BeginUndoable() override {
    saved_.reset();
    if (!optimizer_->tracks_finiteness()) return absl::OkStatus();
    absl::StatusOr<OptimizerState> state = optimizer_->SaveState();
    if (!state.ok()) return WithReason(state.status(), v1::ERROR_REASON_INTERNAL);
    saved_ = *std::move(state);
    return absl::OkStatus();
  }

  bool Finite(const std::vector<std::vector<float>>& weights) const override {
    if (optimizer_->tracks_finiteness()) return optimizer_->LastStepFinite();
    return FirstNonFinite(weights) < 0;
  }

  absl::Status Undo() override {
    // The CUDA engine reloads the host weights (put back by the caller)
    // before its next step.
    optimizer_->HostParamsChanged();
    if (!saved_.has_value()) return absl::OkStatus();
    absl::Status restored = optimizer_->RestoreState(*saved_);
    saved_.reset();
    return WithReason(restored, v1::ERROR_REASON_INTERNAL);
  }

 private:
  const std::unique_ptr<Optimizer> optimizer_;  // never null
  // Gradients scaled for staleness; reused to spare the hot path an
  // allocation per update.
  std::vector<std::vector<float>> scaled_;
  // The optimizer's state before an undoable Apply (BeginUndoable).
  std::optional<OptimizerState> saved_;
  // The largest value of the last update PrepareApply saw.
  double previous_update_ = 0.0;
};

// easgd and gem: one loop over the weights, guarded by a WeightBound.
// PrepareApply bounds the Apply from the carried bound (`Next`); a certain
// Apply runs untracked and carries the bound forward, any other tracks the
// weights it writes and measures the bound afresh.
class WeightLoopRule : public UpdateRule {
 public:
  bool PrepareApply(double max_update) override {
    const double reads = std::max(max_update, bound_.previous_update);
    bound_.previous_update = max_update;
    next_ = bound_.known && bound_.finite
                ? Next(std::max(bound_.weights, reads), max_update)
                : kCertainlyFiniteBound;
    track_ = !(next_ < kCertainlyFiniteBound);
    prepared_ = true;
    return !track_;
  }

  bool Finite(const std::vector<std::vector<float>>&) const override {
    return bound_.finite;
  }

  absl::Status Undo() override {
    bound_.known = false;
    bound_.finite = true;
    return absl::OkStatus();
  }

 protected:
  // A bound on every weight after an Apply whose weights were at most `c`
  // and update values at most `x` in magnitude (scale <= 1).
  virtual double Next(double c, double x) const = 0;

  // Runs `update` over the weights, tracked unless PrepareApply vouched
  // for it, and updates the bound.
  template <typename Update>
  void Run(std::vector<std::vector<float>>& weights,
           const std::vector<std::vector<float>>& values, Update update) {
    const bool track = !prepared_ || track_;
    if (track) {
      const int32_t most = ForEachElement<true>(weights, values, update);
      bound_.finite = most <= kMaxFiniteBits;
      bound_.known = bound_.finite;
      bound_.weights = FromBits(most);
    } else {
      ForEachElement<false>(weights, values, update);
      bound_.finite = true;
      bound_.known = true;
      bound_.weights = next_;
    }
    prepared_ = false;
  }

 private:
  WeightBound bound_;
  double next_ = 0.0;
  bool track_ = true;
  bool prepared_ = false;
};

// easgd: c += alpha * scale * (x - c); the rank makes the opposite move
// itself.
class ElasticRule final : public WeightLoopRule {
 public:
  explicit ElasticRule(double alpha) : alpha_(alpha) {}

  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_ELASTIC; }
  bool replies_with_previous() const override { return true; }

  absl::Status Apply(std::vector<std::vector<float>>& weights,
                     const std::vector<std::vector<float>>& update,
                     float scale) override {
    const float alpha = static_cast<float>(alpha_ * scale);
    Run(weights, update,
        [alpha](float c, float x) { return c + alpha * (x - c); });
    return absl::OkStatus();
  }

 protected:
  // For 0 <= a <= 1 the move is a convex combination, |c'| <= max(C, X)
  // (plus rounding); otherwise |c'| <= C + |a| (X + C).
  double Next(double c, double x) const override {
    const double a = std::fabs(static_cast<double>(static_cast<float>(alpha_)));
    const double difference = x + c;  // bounds |x - c|, computed in fp32
    if (!(difference < kCertainlyFiniteBound)) return difference;
    const double move = c + a * difference;
    return a <= 1.0 ? std::min(move, 1.001 * std::max(c, x)) : move;
  }

 private:
  const double alpha_;
};

// gem: c += scale * delta.
class DeltaRule final : public WeightLoopRule {
 public:
  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_DELTA; }

  absl::Status Apply(std::vector<std::vector<float>>& weights,
                     const std::vector<std::vector<float>>& update,
                     float scale) override {
    Run(weights, update, [scale](float c, float d) { return c + scale * d; });
    return absl::OkStatus();
  }

 protected:
  // |c + s d| <= C + D for a scale s <= 1.
  double Next(double c, double x) const override { return c + x; }
};

v1::UpdateKind KindOf(const v1::JobSpec& spec) {
  return UpdateKindOf(AlgorithmOf(spec));
}

}  // namespace

std::string UpdateRuleName(const v1::JobSpec& spec) {
  if (KindOf(spec) != v1::UPDATE_KIND_GRADIENT) return spec.algorithm();
  return spec.optimizer().name();
}

float StalenessScale(const v1::JobSpec& spec, uint64_t staleness) {
  return spec.staleness_scaling() == "inverse" && staleness > 1
             ? static_cast<float>(1.0 / static_cast<double>(staleness))
             : 1.0f;
}

int FirstNonFinite(const std::vector<std::vector<float>>& values) {
  // A float is NaN or Inf exactly when its exponent bits are all ones, so
  // when |x|'s bit pattern, as a non-negative int32, exceeds the largest
  // finite one. The scan ORs those comparisons over fixed blocks, which
  // GCC's -O2 vectoriser turns into SSE2 compares (a float sum, the
  // obvious test, cannot be vectorised without -ffast-math and made this
  // scan cost as much as the optimizer step).
  constexpr int32_t kAbs = 0x7fffffff;
  constexpr int32_t kMaxFinite = 0x7f7fffff;
  constexpr size_t kBlock = 64;
  for (size_t t = 0; t < values.size(); ++t) {
    const float* x = values[t].data();
    const size_t n = values[t].size();
    int32_t bad = 0;
    size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
      int32_t bits[kBlock];
      std::memcpy(bits, x + i, sizeof(bits));
      for (size_t k = 0; k < kBlock; ++k) bad |= (bits[k] & kAbs) > kMaxFinite;
      if (bad != 0) return static_cast<int>(t);
    }
    for (; i < n; ++i) {
      int32_t bits;
      std::memcpy(&bits, x + i, sizeof(bits));
      bad |= (bits & kAbs) > kMaxFinite;
    }
    if (bad != 0) return static_cast<int>(t);
  }
  return -1;
}

UpdateScan ScanUpdate(const std::vector<std::vector<float>>& values,
                      bool squares) {
  // One int32 max over |x|'s bit patterns per tensor (vectorised like
  // FirstNonFinite's compares): its value says both how large the tensor
  // gets and, above kMaxFiniteBits, that it holds NaN or Inf.
  constexpr size_t kBlock = 64;
  UpdateScan scan;
  int32_t most = 0;
  for (size_t t = 0; t < values.size(); ++t) {
    const float* x = values[t].data();
    const size_t n = values[t].size();
    int32_t tensor_most = 0;
    size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
      int32_t bits[kBlock];
      std::memcpy(bits, x + i, sizeof(bits));
      for (size_t k = 0; k < kBlock; ++k) {
        tensor_most = std::max(tensor_most, bits[k] & kAbsMask);
      }
    }
    for (; i < n; ++i) tensor_most = std::max(tensor_most, AbsBits(x[i]));
    if (tensor_most > kMaxFiniteBits) {
      scan.non_finite = static_cast<int>(t);
      return scan;
    }
    most = std::max(most, tensor_most);
  }
  scan.max_abs = FromBits(most);
  if (squares) {
    scan.sum_squares.reserve(values.size());
    for (const std::vector<float>& v : values) {
      // Four partial sums: the additions are independent, so they overlap.
      double sum[4] = {0.0, 0.0, 0.0, 0.0};
      size_t i = 0;
      for (; i + 4 <= v.size(); i += 4) {
        for (size_t k = 0; k < 4; ++k) {
          const double x = v[i + k];
          sum[k] += x * x;
        }
      }
      for (; i < v.size(); ++i) sum[0] += static_cast<double>(v[i]) * v[i];
      scan.sum_squares.push_back((sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
  }
  return scan;
}

bool ClipsGradients(const v1::JobSpec& spec) {
  return KindOf(spec) == v1::UPDATE_KIND_GRADIENT &&
         spec.optimizer().clip_grad_norm() > 0.0;
}

double ClipScale(const v1::JobSpec& spec, const UpdateScan& scan,
                 const v1::TensorSetHeader& layout) {
  if (!ClipsGradients(spec)) return 1.0;
  double sum = 0.0;
  for (size_t t = 0; t < scan.sum_squares.size(); ++t) {
    const int index = static_cast<int>(t);
    if (index < layout.tensors_size() && layout.tensors(index).buffer()) continue;
    sum += scan.sum_squares[t];
  }
  // PyTorch's clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6),
  // applied when below 1.
  const double coefficient =
      spec.optimizer().clip_grad_norm() / (std::sqrt(sum) + 1e-6);
  return std::min(1.0, coefficient);
}

absl::Status NonFiniteError(absl::string_view what, absl::string_view name) {
  return InvalidRequestError(absl::StrCat(
      what, " tensor '", name,
      "' contains NaN or Inf; lower the learning rate or check the loss for "
      "overflow"));
}

absl::StatusOr<std::unique_ptr<UpdateRule>> UpdateRule::Create(
    const v1::JobSpec& spec, const std::vector<size_t>& sizes,
    const EngineOptions& engine) {
  std::unique_ptr<Optimizer> optimizer;
  if (KindOf(spec) == v1::UPDATE_KIND_GRADIENT) {
    absl::StatusOr<std::unique_ptr<Optimizer>> created =
        CreateOptimizer(spec.optimizer(), sizes, engine);
    if (!created.ok()) {
      return WithReason(created.status(), v1::ERROR_REASON_INTERNAL);
    }
    optimizer = *std::move(created);
  }
  return WithOptimizer(spec, std::move(optimizer));
}

absl::StatusOr<std::unique_ptr<UpdateRule>> UpdateRule::WithOptimizer(
    const v1::JobSpec& spec, std::unique_ptr<Optimizer> optimizer) {
  const v1::UpdateKind kind = KindOf(spec);
  if ((kind == v1::UPDATE_KIND_GRADIENT) != (optimizer != nullptr)) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "algorithm '", spec.algorithm(), "' ",
            kind == v1::UPDATE_KIND_GRADIENT ? "needs" : "takes no",
            " optimizer on the master")),
        v1::ERROR_REASON_INTERNAL);
  }
  switch (kind) {
    case v1::UPDATE_KIND_ELASTIC:
      return std::unique_ptr<UpdateRule>(
          std::make_unique<ElasticRule>(spec.easgd().alpha()));
    case v1::UPDATE_KIND_DELTA:
      return std::unique_ptr<UpdateRule>(std::make_unique<DeltaRule>());
    default:
      return std::unique_ptr<UpdateRule>(
          std::make_unique<GradientRule>(std::move(optimizer)));
  }
}

absl::Status CheckUpdate(const GradientUpdate& update, int non_finite,
                         const v1::JobSpec& spec, const std::string& job_id,
                         const WeightsSnapshot& weights) {
  const v1::UpdateKind kind = KindOf(spec);
  if (update.kind != kind) {
    return InvalidRequestError(absl::StrCat(
        "update of kind ", v1::UpdateKind_Name(update.kind), " sent to job ",
        job_id, ", whose algorithm '", spec.algorithm(), "' takes ",
        v1::UpdateKind_Name(kind)));
  }
  const absl::string_view what =
      kind == v1::UPDATE_KIND_GRADIENT ? "gradient" : "update";
  if (update.values.size() != weights.values.size()) {
    return InvalidRequestError(absl::StrCat(
        what, " holds ", update.values.size(), " tensors; job ", job_id,
        "'s weights hold ", weights.values.size()));
  }
  for (size_t t = 0; t < weights.values.size(); ++t) {
    if (update.values[t].size() != weights.values[t].size()) {
      return InvalidRequestError(absl::StrCat(
          what, " tensor '", weights.header.tensors(static_cast<int>(t)).name(),
          "' holds ", update.values[t].size(), " values; the weights hold ",
          weights.values[t].size()));
    }
  }
  if (non_finite >= 0) {
    return NonFiniteError(what, weights.header.tensors(non_finite).name());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StalenessOf(const v1::JobSpec& spec,
                                     uint64_t base_version, uint64_t version) {
  const uint64_t staleness = base_version < version ? version - base_version : 0;
  if (spec.max_staleness() > 0 &&
      staleness > static_cast<uint64_t>(spec.max_staleness())) {
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "stale update: computed on weight version ", base_version,
            ", the master is at ", version, " (staleness ", staleness,
            " > max_staleness ", spec.max_staleness(),
            "); pull the weights and continue")),
        v1::ERROR_REASON_STALE_UPDATE);
  }
  return staleness;
}

absl::StatusOr<std::vector<size_t>> CheckInitialWeights(
    const v1::TensorSetHeader& header,
    const std::vector<std::vector<float>>& values) {
  if (header.tensors_size() == 0) {
    return InvalidRequestError("initial weights hold no tensors");
  }
  // The service assembles `values` from `header`; in-process callers may not.
  absl::StatusOr<std::vector<size_t>> bytes =
      TensorSetAssembler::ByteSizes(header);
  if (!bytes.ok()) {
    return WithReason(bytes.status(), v1::ERROR_REASON_INVALID_REQUEST);
  }
  if (values.size() != bytes->size()) {
    return InvalidRequestError(
        absl::StrCat("initial weights: header lists ", bytes->size(),
                     " tensors but ", values.size(), " were given"));
  }
  std::vector<size_t> sizes;
  for (size_t t = 0; t < values.size(); ++t) {
    const v1::TensorInfo& info = header.tensors(static_cast<int>(t));
    if (info.dtype() != v1::DTYPE_FLOAT32 ||
        values[t].size() * sizeof(float) != (*bytes)[t]) {
      return InvalidRequestError(absl::StrCat(
          "initial weight tensor '", info.name(), "' holds ", values[t].size(),
          " fp32 values; its header says ", (*bytes)[t], " bytes of ",
          v1::DType_Name(info.dtype())));
    }
    sizes.push_back(values[t].size());
  }
  const int non_finite = FirstNonFinite(values);
  if (non_finite >= 0) {
    return NonFiniteError("initial weight", header.tensors(non_finite).name());
  }
  return sizes;
}

void UpdateStats::Applied(uint64_t staleness) {
  ++applied;
  max_staleness = std::max(max_staleness, staleness);
  staleness_sum += staleness;
  ++staleness_count;
}

void UpdateStats::FillStatus(v1::JobStatus* status) const {
  status->set_updates_applied(applied);
  status->set_stale_rejected(stale_rejected);
  status->set_updates_rejected(rejected);
  status->set_max_staleness_seen(max_staleness);
  status->set_mean_staleness(staleness_count > 0
                                 ? static_cast<double>(staleness_sum) /
                                       static_cast<double>(staleness_count)
                                 : 0.0);
}

void UpdateStats::Resume(const v1::JobStatus& status) {
  applied = status.updates_applied();
  stale_rejected = status.stale_rejected();
  rejected = status.updates_rejected();
  max_staleness = status.max_staleness_seen();
}

}  // namespace mpilearn::server
