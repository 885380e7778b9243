// The scheduling of a study's trials: asking the sampler for new trials up
// to the study's parallelism and budget, submitting each trial's job,
// reading the job back into the trial (intermediate values, epochs, state),
// pruning, retrying failed jobs, and ending trials and the study. The study
// table (study_table.h) holds the studies and calls this on them, from its
// refresh thread and from its calls.
//
//   TrialScheduler scheduler(jobs, store, events, clock);
//   auto study = scheduler.NewStudy(status);   // space, sampler, pruner
//   scheduler.Refresh(**study);                // one pass over its trials
//
// The rules (trials and jobs, the restart rule) are study_table.h's.
//
// Threading: not thread-safe and holds no lock. Every call is made under
// the study table's lock, which guards every Study. Calls into TrialJobs,
// StudyEvents and StudyStore are made from within those calls, so none of
// them may call back into the table. Lock order: the table's lock, then
// whatever TrialJobs takes (the master's job registry).
#ifndef MPILEARN_SERVER_OPT_TRIAL_SCHEDULER_H_
#define MPILEARN_SERVER_OPT_TRIAL_SCHEDULER_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "proto/study.pb.h"
#include "server/opt/pruner.h"
#include "server/opt/sampler.h"
#include "server/opt/search_space.h"
#include "server/opt/study_store.h"
#include "server/opt/trial_values.h"

namespace mpilearn::opt {

// What the study table needs of the master's jobs. The master implements it
// over MasterCore (server/study_service.cc); tests use a fake.
class TrialJobs {
 public:
  virtual ~TrialJobs() = default;
  // Validates and queues a job; returns its id.
  virtual absl::StatusOr<std::string> Submit(const v1::JobSpec& spec) = 0;
  // The job's status with its validations; NOT_FOUND for an unknown id.
  virtual absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) = 0;
  // Stops a QUEUED or RUNNING job (JobRegistry::Stop).
  virtual absl::Status Stop(const std::string& job_id,
                            const std::string& reason) = 0;
  // The id of the job with exactly this name, if any (the restart rule).
  virtual std::optional<std::string> FindByName(const std::string& name) = 0;
};

// One study as the table holds it.
struct Study {
  v1::StudyStatus status;
  std::unique_ptr<SearchSpace> space;
  // Null for sampler "external" (trials only come from AskTrial).
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Pruner> pruner;
  // Trials created, with the budget (grid: at most its size).
  int budget = 0;
  // Sampler said the grid is spent.
  bool exhausted = false;
  // The event log watchers read (StudyEvents appends to it).
  std::deque<v1::StudyEvent> events;
  // The study changed since it was last written.
  bool dirty = false;
  // Trials loaded in flight without a job id: their job may exist (the
  // master died between submitting it and writing the study), so the
  // first submit looks for it by name.
  std::set<int> maybe_submitted;
};

// Where the scheduler reports what happened to a study: the table's event
// log. Called under the table's lock.
class StudyEvents {
 public:
  virtual ~StudyEvents() = default;
  // Appends an event of `kind` (about `trial`, if given) to the study's log
  // and wakes its watchers.
  virtual void Log(Study& study, v1::StudyEvent::Kind kind,
                   const v1::Trial* trial, const std::string& message) = 0;
};

// A trial whose job is queued or running.
bool TrialInFlight(const v1::Trial& trial);
// A fold of a k-fold trial whose job is queued or running.
bool FoldInFlight(const v1::TrialFold& fold);
// A trial in flight with a job (or a fold's job) not yet submitted: after a
// restart that job may exist (the restart rule), so it is looked up first.
bool TrialAwaitsJob(const v1::Trial& trial);
// A k-fold trial's means over its folds (StudySpec.folds): intermediate
// values at the epochs every fold reached, value and value_spread once every
// fold has a value, epochs_done the fewest any fold did. Returns whether
// intermediate or value changed.
bool CombineFolds(v1::Trial& trial);
// `text` cut to the length trials and studies keep of a message.
std::string TruncatedMessage(absl::string_view text);

class TrialScheduler {
 public:
  // All must outlive the scheduler.
  TrialScheduler(TrialJobs& jobs, const StudyStore& store, StudyEvents& events,
                 std::function<absl::Time()> clock)
      : jobs_(jobs), store_(store), events_(events), clock_(std::move(clock)) {}

  // Builds the space, sampler and pruner of a study with a normalized spec.
  absl::StatusOr<std::unique_ptr<Study>> NewStudy(v1::StudyStatus status) const;

  // One pass over a running study: refreshes its trials in flight, ends it
  // at its target or once every trial ended, else starts new trials up to
  // its parallelism and budget.
  void Refresh(Study& study);
  // Creates the next trial with `point` (else the sampler's), writes the
  // study, submits the trial's job. OUT_OF_RANGE when the grid is spent.
  absl::StatusOr<v1::Trial*> NewTrial(Study& study, std::optional<Point> point,
                                      bool asked);
  // Ends a trial in `state`; stops its job if it still runs.
  void EndTrial(Study& study, v1::Trial& trial, v1::TrialState state,
                const std::string& message);
  // Cancels the trials in flight and ends the study in `state`; trial
  // `reached` (its value reached the study's target) ends COMPLETED, so it
  // counts as the study's best even while its job was still running.
  void EndStudy(Study& study, v1::StudyState state, const std::string& message,
                int reached = -1);
  // Best trial, counts and epochs from the trials.
  void Summarize(Study& study) const;
  // Writes the study's file if it changed (failures are logged and retried
  // at the next refresh).
  void Persist(Study& study);

  double NowSeconds() const;

 private:
  // Reads a trial's job; records values, prunes, retries, ends the trial.
  void RefreshTrial(Study& study, v1::Trial& trial);
  // Prunes a running trial whose values changed, if its pruner says so.
  void MaybePrune(Study& study, v1::Trial& trial);
  // Submits the trial's job (attempt trial.retries()), or a k-fold trial's
  // fold jobs not yet submitted; with `may_exist` first looks for a job of
  // the same name (the restart rule).
  void SubmitTrialJob(Study& study, v1::Trial& trial, bool may_exist);
  // Submits (or with `may_exist` finds) the job of the trial's configuration
  // for fold `fold` (-1: a one-job trial), attempt `retries`. nullopt when
  // none was: the trial ended FAILED (a spec the master refuses), or the
  // next refresh tries again.
  std::optional<std::string> SubmitJob(Study& study, v1::Trial& trial,
                                       int fold, int retries, bool may_exist);
  // Stops a trial's job that may still run (logs what is not expected).
  void StopJob(const Study& study, const v1::Trial& trial,
               const std::string& job_id, const std::string& reason);

  // k-fold trials (trial_folds.cc): reads every fold's job, retries a failed
  // fold, ends the trial when every fold completed (the means) or one
  // cannot, prunes on the mean curve.
  void RefreshFoldTrial(Study& study, v1::Trial& trial);
  void SubmitFoldJobs(Study& study, v1::Trial& trial, bool may_exist);
  // Stops the folds still in flight of a trial ending in `state`.
  void StopFolds(Study& study, v1::Trial& trial, v1::TrialState state,
                 const std::string& reason);
  std::vector<Observation> History(const Study& study, int except) const;

  TrialJobs& jobs_;
  const StudyStore& store_;
  StudyEvents& events_;
  const std::function<absl::Time()> clock_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_TRIAL_SCHEDULER_H_
