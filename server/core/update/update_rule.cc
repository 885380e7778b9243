#include "server/core/update/update_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "server/core/update/finite_bound.h"

namespace mpilearn::server {
namespace {

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

// downpour, sync: one optimizer step on the (scaled) gradient, guarded by
// the optimizer (PrepareStep, LastStepFinite, UndoStep).
class GradientRule final : public UpdateRule {
 public:
  explicit GradientRule(std::unique_ptr<Optimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}

  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_GRADIENT; }
  const Optimizer* optimizer() const override { return optimizer_.get(); }
  void SetLearningRate(double rate) override { optimizer_->SetLearningRate(rate); }

  absl::StatusOr<Result> ApplyGuarded(
      absl::FunctionRef<Writable(bool undoable)> writable,
      const std::vector<std::vector<float>>& update, float scale,
      double max_update) override {
    // The previous update's values may be in the buffers the step reads.
    const bool certain =
        optimizer_->PrepareStep(std::max(max_update, previous_update_));
    previous_update_ = max_update;
    const Writable weights = writable(!certain);
    params_.clear();
    grads_.clear();
    if (scale != 1.0f) scaled_.resize(update.size());
    for (size_t t = 0; t < update.size(); ++t) {
      params_.emplace_back((*weights.values)[t]);
      if (scale == 1.0f) {
        grads_.emplace_back(update[t]);
        continue;
      }
      const std::vector<float>& g = update[t];
      std::vector<float>& scaled = scaled_[t];
      scaled.resize(g.size());
      for (size_t i = 0; i < g.size(); ++i) scaled[i] = scale * g[i];
      grads_.emplace_back(scaled);
    }
    MPILEARN_RETURN_IF_ERROR(
        WithReason(optimizer_->Step(params_, grads_), v1::ERROR_REASON_INTERNAL));
    if (optimizer_->LastStepFinite(params_)) return Result{};
    if (certain || weights.original == nullptr) {
      return Result{Outcome::kNotUndone, absl::OkStatus()};
    }
    PutBack(weights);
    const absl::Status undone = optimizer_->UndoStep();
    if (!undone.ok()) {
      return Result{Outcome::kStateLost,
                    WithReason(undone, v1::ERROR_REASON_INTERNAL)};
    }
    return Result{Outcome::kUndone, absl::OkStatus()};
  }

 private:
  const std::unique_ptr<Optimizer> optimizer_;  // never null
  // The step's operands, and gradients scaled for staleness or clipping;
  // reused to spare the hot path an allocation per update.
  std::vector<absl::Span<float>> params_;
  std::vector<absl::Span<const float>> grads_;
  std::vector<std::vector<float>> scaled_;
  // The largest value of the last update applied.
  double previous_update_ = 0.0;
};

// easgd and gem: one loop over the weights, guarded by the bound the rule
// carries on them: the largest |weight| after its last Apply, measured
// (tracked Apply) or bounded (untracked, from `Next`). A certain Apply runs
// untracked and carries the bound forward; any other tracks the weights it
// writes, measures the bound afresh and is undone when they are not finite.
class WeightLoopRule : public UpdateRule {
 protected:
  // A bound on every weight after an Apply whose weights were at most `c`
  // and update values at most `x` in magnitude (scale <= 1).
  virtual double Next(double c, double x) const = 0;

  // The guarded Apply of `update` (c[i] = update(c[i], x[i])).
  template <typename Update>
  Result Run(absl::FunctionRef<Writable(bool undoable)> writable,
             const std::vector<std::vector<float>>& values, double max_update,
             Update update) {
    // The job sets buffers to the previous update's values after an
    // Apply, so the weights this one reads are bounded by them too.
    const double reads = std::max(max_update, previous_update_);
    previous_update_ = max_update;
    const double next =
        known_ ? Next(std::max(weights_bound_, reads), max_update)
               : kCertainlyFiniteBound;
    const bool certain = WithinBound(next);
    const Writable weights = writable(!certain);
    if (certain) {
      ForEachElement<false>(*weights.values, values, update);
      weights_bound_ = next;
      return Result{};
    }
    const int32_t most = ForEachElement<true>(*weights.values, values, update);
    known_ = FiniteBits(most);
    weights_bound_ = FromAbsBits(most);
    if (known_) return Result{};
    if (weights.original == nullptr) {
      return Result{Outcome::kNotUndone, absl::OkStatus()};
    }
    PutBack(weights);
    return Result{Outcome::kUndone, absl::OkStatus()};
  }

 private:
  // weights_bound_ bounds every |weight| (false before the first tracked
  // Apply and after an undone one).
  bool known_ = false;
  double weights_bound_ = 0.0;
  // The largest value of the last update applied.
  double previous_update_ = 0.0;
};

// easgd: c += alpha * scale * (x - c); the rank makes the opposite move
// itself.
class ElasticRule final : public WeightLoopRule {
 public:
  explicit ElasticRule(double alpha) : alpha_(alpha) {}

  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_ELASTIC; }
  bool replies_with_previous() const override { return true; }

  absl::StatusOr<Result> ApplyGuarded(
      absl::FunctionRef<Writable(bool undoable)> writable,
      const std::vector<std::vector<float>>& update, float scale,
      double max_update) override {
    const float alpha = static_cast<float>(alpha_ * scale);
    return Run(writable, update, max_update,
               [alpha](float c, float x) { return c + alpha * (x - c); });
  }

 protected:
  // For 0 <= a <= 1 the move is a convex combination, |c'| <= max(C, X)
  // (plus rounding); otherwise |c'| <= C + |a| (X + C).
  double Next(double c, double x) const override {
    const double a = std::fabs(static_cast<double>(static_cast<float>(alpha_)));
    const double difference = x + c;  // bounds |x - c|, computed in fp32
    if (!WithinBound(difference)) return difference;
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

  absl::StatusOr<Result> ApplyGuarded(
      absl::FunctionRef<Writable(bool undoable)> writable,
      const std::vector<std::vector<float>>& update, float scale,
      double max_update) override {
    return Run(writable, update, max_update,
               [scale](float c, float d) { return c + scale * d; });
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

absl::StatusOr<UpdateRule::Result> UpdateRule::Apply(
    std::vector<std::vector<float>>& weights,
    const std::vector<std::vector<float>>& update, float scale) {
  int32_t most = 0;
  for (const std::vector<float>& v : update) {
    most = std::max(most, MaxAbsBits(v.data(), v.size()));
  }
  std::vector<std::vector<float>> original;
  const auto writable = [&](bool undoable) {
    if (undoable) original = weights;
    return Writable{&weights, undoable ? &original : nullptr};
  };
  return ApplyGuarded(writable, update, scale, FromAbsBits(most));
}

void UpdateRule::PutBack(const Writable& weights) {
  for (size_t t = 0; t < weights.values->size(); ++t) {
    const std::vector<float>& from = (*weights.original)[t];
    std::copy(from.begin(), from.end(), (*weights.values)[t].begin());
  }
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
