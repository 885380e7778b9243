#include "server/core/update_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/error_reason.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {
namespace {

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

 private:
  const std::unique_ptr<Optimizer> optimizer_;  // never null
  // Gradients scaled for staleness; reused to spare the hot path an
  // allocation per update.
  std::vector<std::vector<float>> scaled_;
};

// easgd: c += alpha * scale * (x - c); the rank makes the opposite move
// itself.
class ElasticRule final : public UpdateRule {
 public:
  explicit ElasticRule(double alpha) : alpha_(alpha) {}

  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_ELASTIC; }
  bool replies_with_previous() const override { return true; }

  absl::Status Apply(std::vector<std::vector<float>>& weights,
                     const std::vector<std::vector<float>>& update,
                     float scale) override {
    const float alpha = static_cast<float>(alpha_ * scale);
    for (size_t t = 0; t < weights.size(); ++t) {
      float* c = weights[t].data();
      const float* x = update[t].data();
      for (size_t i = 0; i < weights[t].size(); ++i) c[i] += alpha * (x[i] - c[i]);
    }
    return absl::OkStatus();
  }

 private:
  const double alpha_;
};

// gem: c += scale * delta.
class DeltaRule final : public UpdateRule {
 public:
  v1::UpdateKind kind() const override { return v1::UPDATE_KIND_DELTA; }

  absl::Status Apply(std::vector<std::vector<float>>& weights,
                     const std::vector<std::vector<float>>& update,
                     float scale) override {
    for (size_t t = 0; t < weights.size(); ++t) {
      float* c = weights[t].data();
      const float* d = update[t].data();
      for (size_t i = 0; i < weights[t].size(); ++i) c[i] += scale * d[i];
    }
    return absl::OkStatus();
  }
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
  status->set_max_staleness_seen(max_staleness);
  status->set_mean_staleness(staleness_count > 0
                                 ? static_cast<double>(staleness_sum) /
                                       static_cast<double>(staleness_count)
                                 : 0.0);
}

void UpdateStats::Resume(const v1::JobStatus& status) {
  applied = status.updates_applied();
  stale_rejected = status.stale_rejected();
  max_staleness = status.max_staleness_seen();
}

}  // namespace mpilearn::server
