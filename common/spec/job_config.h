// A job's configuration: its spec, normalized once, with every named choice
// read into an enum (common/spec/spec_kinds.h). The master's core, the workers
// and the tools take a JobConfig where they used to compare spec strings.
//
//   MPILEARN_ASSIGN_OR_RETURN(JobConfig config, JobConfig::Create(request.spec()));
//   if (config.bad_values() == BadValues::kSkip) { ... }
//
// Create is how a spec from outside the process (a submit, a spec file, a
// master's reply, a stored spec.json) becomes a JobConfig: it normalizes
// and checks it (NormalizeJobSpec). FromNormalized is for a spec this
// process already normalized.
#ifndef MPILEARN_COMMON_SPEC_JOB_CONFIG_H_
#define MPILEARN_COMMON_SPEC_JOB_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/spec_kinds.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

class JobConfig {
 public:
  // Normalizes `spec` (every default explicit, every range checked) and
  // reads its names. Errors are InvalidArgument naming the field.
  static absl::StatusOr<JobConfig> Create(v1::JobSpec spec);
  // ParseJobSpecJson or ReadJobSpecFile, then the same.
  static absl::StatusOr<JobConfig> FromJson(absl::string_view json);
  static absl::StatusOr<JobConfig> FromFile(const std::string& path);

  // Reads the names of a spec that NormalizeJobSpec already accepted, without
  // normalizing it again. A name left empty reads as normalization's default
  // (so a test may pass a partial spec); a name outside the tables is a bug
  // in the caller and aborts the process.
  static JobConfig FromNormalized(v1::JobSpec spec);

  const v1::JobSpec& spec() const { return spec_; }

  v1::Algorithm algorithm() const { return algorithm_; }
  // What pushes carry under this algorithm (UpdateKindOf).
  v1::UpdateKind update_kind() const;
  ModelKind model() const { return model_; }
  LossKind loss() const { return loss_; }
  // The job's single loss takes classes as labels, so val_accuracy is a
  // metric (false for a job of several outputs: JobSpec.outputs).
  bool classification() const {
    return !multi_output() && InfoOf(loss_).classification;
  }
  // The model has several outputs, each with its loss (JobSpec.outputs).
  bool multi_output() const { return spec_.outputs_size() > 0; }
  NormalizationMode normalization() const { return normalization_; }
  BadValues bad_values() const { return bad_values_; }
  bool skips_bad_values() const { return bad_values_ == BadValues::kSkip; }
  StalenessScaling staleness_scaling() const { return staleness_scaling_; }

 private:
  explicit JobConfig(v1::JobSpec spec) : spec_(std::move(spec)) {}

  v1::JobSpec spec_;
  v1::Algorithm algorithm_ = v1::ALGORITHM_DOWNPOUR;
  ModelKind model_ = ModelKind::kMlp;
  LossKind loss_ = LossKind::kCategoricalCrossentropy;
  NormalizationMode normalization_ = NormalizationMode::kNone;
  BadValues bad_values_ = BadValues::kFail;
  StalenessScaling staleness_scaling_ = StalenessScaling::kNone;
};

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_SPEC_JOB_CONFIG_H_
