// k-fold trials (StudySpec.folds): TrialScheduler's part that runs one
// configuration as `folds` jobs at once, job i holding out the i-th block of
// the training rows (DataSpec.fold = i), and reads them back as one trial.
//
// Each fold is read exactly as a one-job trial reads its job (trial_values.h):
// its intermediate values, its value (the best of them), its retries. The
// trial then holds the means: the mean at each epoch every fold reached
// (what the pruner and the sampler see), the mean of the folds' values and
// their spread, and at completion the mean of each objective. One fold
// failing max_retries + 1 times fails the trial (its other folds stop); one
// cancelled outside the study cancels it; one pruned before a restart
// prunes it.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "server/opt/trial_scheduler.h"
#include "server/opt/trial_values.h"

namespace mpilearn::opt {
namespace {

// The mean and the standard deviation (over n, as numpy.std) of `values`.
std::pair<double, double> MeanAndSpread(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += (v - mean) * (v - mean);
  return {mean, std::sqrt(squares / static_cast<double>(values.size()))};
}

// Why a trial ends while reading its folds.
struct FoldEnd {
  v1::TrialState state = v1::TRIAL_STATE_UNSPECIFIED;
  std::string message;
};

}  // namespace

bool FoldInFlight(const v1::TrialFold& fold) {
  return fold.state() == v1::TRIAL_STATE_QUEUED ||
         fold.state() == v1::TRIAL_STATE_RUNNING;
}

bool CombineFolds(v1::Trial& trial) {
  if (trial.folds_size() == 0) return false;
  // The epochs every fold reached, and the mean there.
  std::map<int, double> mean;
  std::map<int, int> reached;
  int epochs_done = trial.folds(0).epochs_done();
  for (const v1::TrialFold& fold : trial.folds()) {
    epochs_done = std::min(epochs_done, fold.epochs_done());
    for (const v1::IntermediateValue& value : fold.intermediate()) {
      mean[value.epoch()] += value.value();
      ++reached[value.epoch()];
    }
  }
  const int folds = trial.folds_size();
  for (auto it = mean.begin(); it != mean.end();) {
    if (reached[it->first] < folds) {
      it = mean.erase(it);
    } else {
      it->second /= folds;
      ++it;
    }
  }
  trial.set_epochs_done(epochs_done);
  bool changed = SetIntermediate(mean, trial.mutable_intermediate());

  std::vector<double> values;
  for (const v1::TrialFold& fold : trial.folds()) {
    if (fold.has_value()) values.push_back(fold.value());
  }
  if (static_cast<int>(values.size()) < folds) {
    changed |= trial.has_value();
    trial.clear_value();
    trial.clear_value_spread();
    return changed;
  }
  const auto [value, spread] = MeanAndSpread(values);
  changed |= !trial.has_value() || trial.value() != value;
  trial.set_value(value);
  trial.set_value_spread(spread);
  return changed;
}

void TrialScheduler::SubmitFoldJobs(Study& study, v1::Trial& trial,
                                    bool may_exist) {
  for (v1::TrialFold& fold : *trial.mutable_folds()) {
    if (!TrialInFlight(trial)) return;  // a refused spec ended the trial
    if (!FoldInFlight(fold) || !fold.job_id().empty()) continue;
    const std::optional<std::string> job_id =
        SubmitJob(study, trial, fold.fold(), fold.retries(), may_exist);
    if (!job_id.has_value()) continue;
    fold.set_job_id(*job_id);
    fold.set_state(v1::TRIAL_STATE_QUEUED);
    if (fold.fold() == 0) trial.set_job_id(*job_id);
    trial.add_job_ids(*job_id);
    study.dirty = true;
    VLOG(1) << "study " << study.status.study_id() << ": trial "
            << trial.number() << " fold " << fold.fold() << " is job " << *job_id;
    events_.Log(study, v1::StudyEvent::KIND_CREATED, &trial, "");
  }
}

void TrialScheduler::RefreshFoldTrial(Study& study, v1::Trial& trial) {
  const v1::StudySpec& spec = study.status.spec();
  const std::string& study_id = study.status.study_id();
  const bool may_exist = study.maybe_submitted.erase(trial.number()) > 0;
  bool started = false;
  FoldEnd end;
  for (v1::TrialFold& fold : *trial.mutable_folds()) {
    if (!FoldInFlight(fold) || fold.job_id().empty()) continue;
    const std::string job_name = absl::StrCat("fold ", fold.fold(), ": job ", fold.job_id());
    absl::StatusOr<v1::JobStatus> job = jobs_.Status(fold.job_id());
    if (!job.ok()) {
      LOG(WARNING) << "study " << study_id << ": trial " << trial.number()
                   << " " << job_name << ": " << job.status()
                   << (job.status().code() == absl::StatusCode::kNotFound
                           ? "; submitting it again" : "");
      if (job.status().code() == absl::StatusCode::kNotFound) fold.clear_job_id();
      continue;
    }
    int new_epochs = 0;
    if (ReadAttempt(spec, *job, fold, &new_epochs) || new_epochs != 0) {
      trial.set_epochs_trained(trial.epochs_trained() + new_epochs);
      study.dirty = true;
    }
    if (fold.state() == v1::TRIAL_STATE_QUEUED && job->state() != v1::JOB_STATE_QUEUED) {
      fold.set_state(v1::TRIAL_STATE_RUNNING);
      started = true;
    }
    JobOutcome outcome = JudgeJob(spec, *job, fold.has_value(), fold.retries(), job_name);
    switch (outcome.kind) {
      case JobOutcome::Kind::kGoingOn:
        break;
      case JobOutcome::Kind::kCompleted:
        fold.clear_values();
        for (double value : outcome.values) fold.add_values(value);
        fold.set_state(v1::TRIAL_STATE_COMPLETED);
        fold.set_message(TruncatedMessage(outcome.message));
        break;
      case JobOutcome::Kind::kRetry:
        LOG(INFO) << "study " << study_id << ": trial " << trial.number() << " "
                  << job_name << " failed (" << outcome.message << "); running it again";
        fold.set_retries(fold.retries() + 1);
        trial.set_retries(trial.retries() + 1);
        fold.set_epochs_done(0);
        fold.clear_intermediate();
        fold.clear_value();
        fold.set_message(TruncatedMessage(
            absl::StrCat("attempt ", fold.retries(), " failed: ", outcome.message)));
        fold.clear_job_id();
        fold.set_state(v1::TRIAL_STATE_QUEUED);
        study.dirty = true;
        break;
      case JobOutcome::Kind::kPruned:
        end = {v1::TRIAL_STATE_PRUNED, outcome.message};
        break;
      case JobOutcome::Kind::kFailed:
        fold.set_state(v1::TRIAL_STATE_FAILED);
        if (job->state() == v1::JOB_STATE_FAILED) {
          fold.set_message(TruncatedMessage(job->message()));
        }
        end = {v1::TRIAL_STATE_FAILED, outcome.message};
        break;
      case JobOutcome::Kind::kCancelled:
        end = {v1::TRIAL_STATE_CANCELLED, outcome.message};
        break;
    }
    if (end.state != v1::TRIAL_STATE_UNSPECIFIED) break;
  }

  if (started && trial.state() == v1::TRIAL_STATE_QUEUED) {
    trial.set_state(v1::TRIAL_STATE_RUNNING);
    study.dirty = true;
    events_.Log(study, v1::StudyEvent::KIND_STARTED, &trial, "");
  }
  const bool reported = CombineFolds(trial);
  if (reported) {
    study.dirty = true;
    events_.Log(study, v1::StudyEvent::KIND_REPORTED, &trial, "");
  }
  if (end.state != v1::TRIAL_STATE_UNSPECIFIED) {
    EndTrial(study, trial, end.state, end.message);
    return;
  }
  // Folds retried, or left without a job (a restart, a lost job, a submit
  // that may pass next time).
  SubmitFoldJobs(study, trial, may_exist);
  if (!TrialInFlight(trial)) return;

  const bool all_completed =
      std::all_of(trial.folds().begin(), trial.folds().end(), [](const v1::TrialFold& fold) {
        return fold.state() == v1::TRIAL_STATE_COMPLETED;
      });
  if (all_completed) {
    trial.clear_values();
    trial.clear_values_spread();
    for (int i = 0; i < spec.objectives_size(); ++i) {
      std::vector<double> values;
      for (const v1::TrialFold& fold : trial.folds()) values.push_back(fold.values(i));
      const auto [mean, spread] = MeanAndSpread(values);
      trial.add_values(mean);
      trial.add_values_spread(spread);
    }
    EndTrial(study, trial, v1::TRIAL_STATE_COMPLETED,
             absl::StrFormat("the mean of %d folds (spread %g)", trial.folds_size(),
                             trial.value_spread()));
    return;
  }
  if (reported && trial.intermediate_size() > 0) MaybePrune(study, trial);
}

void TrialScheduler::StopFolds(Study& study, v1::Trial& trial,
                               v1::TrialState state, const std::string& reason) {
  for (v1::TrialFold& fold : *trial.mutable_folds()) {
    if (!FoldInFlight(fold)) continue;
    if (!fold.job_id().empty()) StopJob(study, trial, fold.job_id(), reason);
    fold.set_state(state == v1::TRIAL_STATE_PRUNED ? state : v1::TRIAL_STATE_CANCELLED);
    fold.set_message(TruncatedMessage(reason));
  }
}

}  // namespace mpilearn::opt
