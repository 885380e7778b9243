// What a study reads of one trial job: the objective's value at each epoch,
// the best of them, the several objectives' values of a completed job, and
// the job's name. Shared by one-job trials (trial_scheduler.cc) and k-fold
// trials (trial_folds.cc), so a fold's value is exactly what a one-job
// trial of the same job would record.
//
//   std::map<int, double> curve = ObjectiveCurve(spec, job);
//   if (SetIntermediate(curve, trial.mutable_intermediate())) { ... }
//   std::optional<double> value = BestValue(spec, curve);
//
// Pure functions; thread-compatible.
#ifndef MPILEARN_SERVER_OPT_TRIAL_VALUES_H_
#define MPILEARN_SERVER_OPT_TRIAL_VALUES_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

// The objective (StudySpec.objectives) that is a trial job's parameter
// count rather than a reported metric.
inline constexpr char kParametersObjective[] = "parameters";

// The study's (first) objective is maximized.
bool Maximizing(const v1::StudySpec& spec);
// `a` is better than `b` in the study's direction.
bool Better(const v1::StudySpec& spec, double a, double b);

// The job's validations of the study's objective by epoch (>= 1), the
// latest at each epoch.
std::map<int, double> ObjectiveCurve(const v1::StudySpec& spec,
                                     const v1::JobStatus& job);
// The best value of `curve` in the study's direction; nullopt when empty.
std::optional<double> BestValue(const v1::StudySpec& spec,
                                const std::map<int, double>& curve);
// Replaces `stored` with `curve`; false when they were already equal.
bool SetIntermediate(
    const std::map<int, double>& curve,
    google::protobuf::RepeatedPtrField<v1::IntermediateValue>* stored);

// Each of spec.objectives' values for a completed job: a metric's last
// validation, or the parameter count. The error says which is missing.
absl::StatusOr<std::vector<double>> ObjectiveValues(const v1::StudySpec& spec,
                                                    const v1::JobStatus& job);

// Reads `job` into an attempt, a one-job Trial or a TrialFold (the same
// fields): epochs_done, the objective's intermediate values, and value, the
// best of them so far. Returns whether the intermediate values changed;
// `*new_epochs` is the epochs done since the last read (for epochs_trained).
template <typename Attempt>
bool ReadAttempt(const v1::StudySpec& spec, const v1::JobStatus& job,
                 Attempt& attempt, int* new_epochs) {
  *new_epochs = job.epochs_done() - attempt.epochs_done();
  attempt.set_epochs_done(job.epochs_done());
  const std::map<int, double> curve = ObjectiveCurve(spec, job);
  if (!SetIntermediate(curve, attempt.mutable_intermediate())) return false;
  const std::optional<double> best = BestValue(spec, curve);
  if (best.has_value() && (!attempt.has_value() || Better(spec, *best, attempt.value()))) {
    attempt.set_value(*best);
  }
  return true;
}

// What an attempt's job means for its trial, by the study's rules (the same
// for a one-job trial and for each fold of a k-fold trial).
struct JobOutcome {
  enum class Kind {
    kGoingOn,    // queued or running
    kCompleted,  // with the objective; `values` for several objectives
    kPruned,     // pruned by the study before a restart wrote it so
    kRetry,      // failed, with retries left: run the attempt again
    kFailed,     // the attempt cannot give a value
    kCancelled,  // cancelled outside the study
  };
  Kind kind = Kind::kGoingOn;
  // The trial's message if it ends (naming the job by `label`); for
  // kCompleted the job's stop reason, for kRetry the job's failure.
  std::string message;
  std::vector<double> values;
};
// `has_value`: the attempt recorded the objective; `retries`: its attempts
// so far; `label` names the job in messages ("job job-7", "fold 1: job
// job-7").
JobOutcome JudgeJob(const v1::StudySpec& spec, const v1::JobStatus& job, bool has_value,
                    int retries, const std::string& label);

// A trial job's name: "s-K/trial-N", with "/fold-F" for fold F of a k-fold
// trial (fold >= 0) and "/retry-R" for attempt R > 0.
std::string TrialJobName(const std::string& study_id, int trial, int fold,
                         int retries);

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_TRIAL_VALUES_H_
