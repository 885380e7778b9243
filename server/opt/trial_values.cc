#include "server/opt/trial_values.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"

namespace mpilearn::opt {
namespace {

// The objective's value in a validation, if it has one.
std::optional<double> MetricOf(const v1::ValidationRecord& record,
                               const std::string& metric) {
  auto it = record.metrics().find(metric);
  if (it != record.metrics().end()) return it->second;
  if (metric == "val_loss") return record.val_loss();
  if (metric == "val_accuracy" && record.metrics().empty()) {
    return record.val_accuracy();
  }
  return std::nullopt;
}

}  // namespace

bool Maximizing(const v1::StudySpec& spec) {
  return spec.objective().direction() == "maximize";
}

bool Better(const v1::StudySpec& spec, double a, double b) {
  return Maximizing(spec) ? a > b : a < b;
}

std::map<int, double> ObjectiveCurve(const v1::StudySpec& spec,
                                     const v1::JobStatus& job) {
  std::map<int, double> curve;
  for (const v1::ValidationRecord& record : job.validations()) {
    if (record.epoch() < 1) continue;
    std::optional<double> value = MetricOf(record, spec.objective().metric());
    if (value.has_value()) curve[record.epoch()] = *value;
  }
  return curve;
}

std::optional<double> BestValue(const v1::StudySpec& spec,
                                const std::map<int, double>& curve) {
  std::optional<double> best;
  for (const auto& [epoch, value] : curve) {
    if (!best.has_value() || Better(spec, value, *best)) best = value;
  }
  return best;
}

bool SetIntermediate(
    const std::map<int, double>& curve,
    google::protobuf::RepeatedPtrField<v1::IntermediateValue>* stored) {
  bool same = static_cast<int>(curve.size()) == stored->size();
  int i = 0;
  for (auto it = curve.begin(); same && it != curve.end(); ++it, ++i) {
    const v1::IntermediateValue& old = stored->Get(i);
    same = old.epoch() == it->first && old.value() == it->second;
  }
  if (same) return false;
  stored->Clear();
  for (const auto& [epoch, value] : curve) {
    v1::IntermediateValue* added = stored->Add();
    added->set_epoch(epoch);
    added->set_value(value);
  }
  return true;
}

absl::StatusOr<std::vector<double>> ObjectiveValues(const v1::StudySpec& spec,
                                                    const v1::JobStatus& job) {
  std::vector<double> values;
  for (const v1::Objective& objective : spec.objectives()) {
    std::optional<double> value;
    if (objective.metric() == kParametersObjective) {
      if (job.parameters() > 0) value = static_cast<double>(job.parameters());
    } else {
      for (int i = job.validations_size() - 1; i >= 0 && !value.has_value(); --i) {
        value = MetricOf(job.validations(i), objective.metric());
      }
    }
    if (!value.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("completed without reporting ", objective.metric(),
                       objective.metric() == kParametersObjective
                           ? " (the master had no weights of it)"
                           : "; keep inband_validation on or attach a validation pool"));
    }
    values.push_back(*value);
  }
  return values;
}

JobOutcome JudgeJob(const v1::StudySpec& spec, const v1::JobStatus& job, bool has_value,
                    int retries, const std::string& label) {
  using Kind = JobOutcome::Kind;
  switch (job.state()) {
    case v1::JOB_STATE_COMPLETED: {
      if (absl::StartsWith(job.stop_reason(), "pruned by study ")) {
        // Pruned before a restart that came before the study was written.
        return {Kind::kPruned, job.stop_reason(), {}};
      }
      if (!has_value) {
        return {Kind::kFailed,
                absl::StrCat(label, " completed without reporting ", spec.objective().metric(),
                             "; keep inband_validation on or attach a validation pool"),
                {}};
      }
      absl::StatusOr<std::vector<double>> values = ObjectiveValues(spec, job);
      if (!values.ok()) return {Kind::kFailed, absl::StrCat(label, " ", values.status().message()), {}};
      return {Kind::kCompleted, job.stop_reason(), *std::move(values)};
    }
    case v1::JOB_STATE_FAILED:
      // An attempt that ran past its wall-time limit would only do so again.
      if (retries < spec.max_retries() && !absl::StartsWith(job.stop_reason(), kWallTimeStop)) {
        return {Kind::kRetry, job.message(), {}};
      }
      return {Kind::kFailed, absl::StrCat(label, " failed: ", job.message()), {}};
    case v1::JOB_STATE_CANCELLED:
      // Cancelled outside the study (mpilearnctl cancel): the trial ends.
      return {Kind::kCancelled, absl::StrCat(label, " was cancelled: ", job.message()), {}};
    default:
      return {};
  }
}

std::string TrialJobName(const std::string& study_id, int trial, int fold,
                         int retries) {
  std::string name = absl::StrCat(study_id, "/trial-", trial);
  if (fold >= 0) absl::StrAppend(&name, "/fold-", fold);
  if (retries > 0) absl::StrAppend(&name, "/retry-", retries);
  return name;
}

}  // namespace mpilearn::opt
