#include "common/spec/job_config.h"

#include <optional>
#include <utility>

#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn {
namespace {

// The enum a normalized spec's name reads as: `fallback` when empty.
template <typename Kind>
Kind Read(std::optional<Kind> (*from_name)(absl::string_view),
          absl::string_view field, const std::string& name, Kind fallback) {
  if (name.empty()) return fallback;
  const std::optional<Kind> kind = from_name(name);
  if (!kind) {
    LOG(FATAL) << "JobConfig::FromNormalized: " << field << " '" << name
               << "' is not a known name; the spec was not normalized";
  }
  return *kind;
}

std::optional<ModelKind> ModelOf(absl::string_view name) {
  if (name == InfoOf(ModelKind::kTorchScript).name) {
    return ModelKind::kTorchScript;
  }
  return BuiltInModelFromName(name);
}

}  // namespace

absl::StatusOr<JobConfig> JobConfig::Create(v1::JobSpec spec) {
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&spec));
  return FromNormalized(std::move(spec));
}

absl::StatusOr<JobConfig> JobConfig::FromJson(absl::string_view json) {
  MPILEARN_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobSpecJson(json));
  return FromNormalized(std::move(spec));  // ParseJobSpecJson normalizes
}

absl::StatusOr<JobConfig> JobConfig::FromFile(const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(v1::JobSpec spec, ReadJobSpecFile(path));
  return FromNormalized(std::move(spec));  // ReadJobSpecFile normalizes
}

JobConfig JobConfig::FromNormalized(v1::JobSpec spec) {
  JobConfig config(std::move(spec));
  const v1::JobSpec& s = config.spec_;
  config.algorithm_ = Read(&AlgorithmKindFromName, "algorithm", s.algorithm(),
                           v1::ALGORITHM_DOWNPOUR);
  config.model_ = s.model().torchscript().empty()
                      ? Read(&ModelOf, "model.name", s.model().name(),
                             ModelKind::kMlp)
                      : ModelKind::kTorchScript;
  config.loss_ = Read(&LossKindFromName, "loss", s.loss(),
                      LossKind::kCategoricalCrossentropy);
  config.normalization_ =
      Read(&NormalizationModeFromName, "data.normalization.mode",
           s.data().normalization().mode(), NormalizationMode::kNone);
  config.bad_values_ = Read(&BadValuesFromName, "data.bad_values",
                            s.data().bad_values(), BadValues::kFail);
  config.staleness_scaling_ =
      Read(&StalenessScalingFromName, "staleness_scaling",
           s.staleness_scaling(), StalenessScaling::kNone);
  return config;
}

v1::UpdateKind JobConfig::update_kind() const { return UpdateKindOf(algorithm_); }

}  // namespace mpilearn
