#include "server/core/update_admission.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/spec/job_config.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {

UpdateScan ScanUpdate(const std::vector<std::vector<float>>& values,
                      bool squares) {
  UpdateScan scan;
  int32_t most = 0;
  for (size_t t = 0; t < values.size(); ++t) {
    const int32_t tensor_most = MaxAbsBits(values[t].data(), values[t].size());
    if (!FiniteBits(tensor_most)) {
      scan.non_finite = static_cast<int>(t);
      return scan;
    }
    most = std::max(most, tensor_most);
  }
  scan.max_abs = FromAbsBits(most);
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

bool ClipsGradients(const JobConfig& config) {
  return config.update_kind() == v1::UPDATE_KIND_GRADIENT &&
         config.spec().optimizer().clip_grad_norm() > 0.0;
}

double ClipScale(const JobConfig& config, const UpdateScan& scan,
                 const v1::TensorSetHeader& layout, double whole_norm) {
  if (!ClipsGradients(config)) return 1.0;
  double sum = 0.0;
  for (size_t t = 0; t < scan.sum_squares.size(); ++t) {
    const int index = static_cast<int>(t);
    if (index < layout.tensors_size() && layout.tensors(index).buffer()) continue;
    sum += scan.sum_squares[t];
  }
  // PyTorch's clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6),
  // applied when below 1.
  const double norm = std::max(std::sqrt(sum), whole_norm);
  const double coefficient = config.spec().optimizer().clip_grad_norm() / (norm + 1e-6);
  return std::min(1.0, coefficient);
}

float StalenessScale(const JobConfig& config, uint64_t staleness) {
  return config.staleness_scaling() == StalenessScaling::kInverse && staleness > 1
             ? static_cast<float>(1.0 / static_cast<double>(staleness))
             : 1.0f;
}

absl::Status NonFiniteError(absl::string_view what, absl::string_view name) {
  return InvalidRequestError(absl::StrCat(
      what, " tensor '", name,
      "' contains NaN or Inf; lower the learning rate or check the loss for "
      "overflow"));
}

absl::Status CheckUpdate(const GradientUpdate& update, int non_finite,
                         const JobConfig& config, const std::string& job_id,
                         const WeightsSnapshot& weights) {
  const v1::UpdateKind kind = config.update_kind();
  if (update.kind != kind) {
    return InvalidRequestError(absl::StrCat(
        "update of kind ", v1::UpdateKind_Name(update.kind), " sent to job ",
        job_id, ", whose algorithm '", config.spec().algorithm(), "' takes ",
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

absl::StatusOr<uint64_t> StalenessOf(const JobConfig& config,
                                     uint64_t base_version, uint64_t version) {
  const uint64_t staleness = base_version < version ? version - base_version : 0;
  if (config.spec().max_staleness() > 0 &&
      staleness > static_cast<uint64_t>(config.spec().max_staleness())) {
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "stale update: computed on weight version ", base_version,
            ", the master is at ", version, " (staleness ", staleness,
            " > max_staleness ", config.spec().max_staleness(),
            "); pull the weights and continue")),
        v1::ERROR_REASON_STALE_UPDATE);
  }
  return staleness;
}

bool IsStaleRefusal(const absl::Status& status) {
  return ReasonOf(status) == v1::ERROR_REASON_STALE_UPDATE;
}

bool AlreadyApplied(const GradientUpdate& update,
                    const std::map<int, AppliedSequences>& applied) {
  const auto rank = applied.find(update.rank);
  return rank != applied.end() && rank->second.Contains(update.sequence);
}

absl::StatusOr<Admission> AdmitUpdate(const GradientUpdate& update,
                                      const UpdateScan& scan,
                                      const JobConfig& config,
                                      const std::string& job_id,
                                      const WeightsSnapshot& weights) {
  if (absl::Status checked =
          CheckUpdate(update, scan.non_finite, config, job_id, weights);
      !checked.ok()) {
    return checked;
  }
  absl::StatusOr<uint64_t> staleness =
      StalenessOf(config, update.base_version, weights.header.version());
  if (!staleness.ok()) return staleness.status();
  Admission admission;
  admission.staleness = *staleness;
  admission.scale = static_cast<float>(
      StalenessScale(config, *staleness) *
      ClipScale(config, scan, weights.header, update.update_norm));
  admission.max_update = scan.max_abs;
  return admission;
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

}  // namespace mpilearn::server
