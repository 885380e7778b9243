// The master's studies (MPI Opt): each study's trials, run as ordinary jobs
// of the master's queue, its sampler and pruner, its event log for
// watchers, and its file under the state directory. The gRPC service
// (server/study_service.h) is a thin adapter over this class.
//
//   auto table = StudyTable::Create({.state_dir = dir}, trial_jobs);
//   auto created = (*table)->CreateStudy(request);   // checks the spec
//   // A thread of the table refreshes every study every refresh_period:
//   // reads its trials' jobs, records their validations as intermediate
//   // values, prunes, retries failed jobs, starts new trials up to the
//   // study's parallelism, ends the study, and writes its file.
//
// Trials and jobs. Trial N of study s-K runs as a job named "s-K/trial-N"
// (a retry: "s-K/trial-N/retry-R"), the base spec with the trial's values
// applied. Every ValidationRecord of the job whose epoch is >= 1 gives the
// trial an intermediate value (the objective metric; the latest record of
// an epoch wins); the trial's value is the best of them. A job that
// COMPLETED makes the trial COMPLETED (FAILED if it recorded no value); a
// job that FAILED is submitted again (max_retries) before the trial is
// FAILED with the job's message. Pruning stops the job (TrialJobs::Stop:
// COMPLETED with a stop reason, so its group moves on to the next job).
//
// Durability and the restart rule. Each study is written to
// <state_dir>/studies/<id>/study.pb (atomically) whenever it changes, and a
// trial is written before its job is submitted. Create loads every study.
// A trial in flight at a restart keeps its job: the master's registry
// resumes that job from its last checkpoint, so at most the epochs since
// that checkpoint are trained again. A trial whose job the master does not
// hold (the master died between writing the trial and submitting the job,
// or the job's files were lost) is matched to a job by its name if one
// exists, else submitted again; it never runs twice at once.
//
// The table holds the studies, their event logs and watches, and the
// refresh thread; TrialScheduler (trial_scheduler.h) runs each study's
// trials and StudyStore (study_store.h) writes and loads the files.
//
// Threading: thread-safe. One mutex guards every study; the scheduler, and
// through it TrialJobs, run while it is held, so TrialJobs must never call
// back into the table. Watches wait on a condition of the same mutex. Lock
// order: the table's mutex, then TrialJobs' locks; the wake-up mutex is a
// leaf (nothing is taken under it).
#ifndef MPILEARN_SERVER_OPT_STUDY_TABLE_H_
#define MPILEARN_SERVER_OPT_STUDY_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "proto/study.pb.h"
#include "server/opt/study_store.h"
#include "server/opt/trial_scheduler.h"

namespace mpilearn::opt {

// Fills a StudySpec's defaults and checks it; INVALID_ARGUMENT names the
// field. Exposed for tests and clients' dry runs.
absl::Status NormalizeStudySpec(v1::StudySpec* spec);

class StudyTable : private StudyEvents {
 public:
  struct Options {
    // Studies are written under <state_dir>/studies; empty keeps them in
    // memory only.
    std::string state_dir;
    // How often the table's thread refreshes every running study.
    absl::Duration refresh_period = absl::Milliseconds(200);
    // False: no thread; the caller calls Refresh (tests).
    bool run_thread = true;
    // Events kept per study; a watcher that falls behind more than this
    // goes on from the oldest event still kept.
    int max_events = 4096;
    // Limits on what clients may create.
    int max_studies = 10000;
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // Loads the studies under the state directory and starts the thread.
  // `jobs` must outlive the table.
  static absl::StatusOr<std::unique_ptr<StudyTable>> Create(Options options,
                                                            TrialJobs& jobs);
  // Stops the thread and ends every watch.
  ~StudyTable();

  StudyTable(const StudyTable&) = delete;
  StudyTable& operator=(const StudyTable&) = delete;

  absl::StatusOr<v1::CreateStudyResponse> CreateStudy(
      const v1::CreateStudyRequest& request);
  absl::StatusOr<v1::StudyStatus> GetStudy(const std::string& study_id) const;
  // Who created the study (its base job's owner), without copying it: the
  // study service's ownership rule asks on every ask, tell and cancel.
  absl::StatusOr<std::string> StudyOwner(const std::string& study_id) const;
  v1::ListStudiesResponse ListStudies() const;
  absl::StatusOr<v1::StudyStatus> CancelStudy(
      const v1::CancelStudyRequest& request);
  absl::StatusOr<v1::Trial> CancelTrial(const v1::CancelTrialRequest& request);
  absl::StatusOr<v1::Trial> AskTrial(const v1::AskTrialRequest& request);
  absl::StatusOr<v1::Trial> TellTrial(const v1::TellTrialRequest& request);

  // One watcher of one study: every trial as it stands (KIND_SNAPSHOT),
  // then each event, ending after KIND_STUDY_ENDED. Not thread-safe; one
  // per stream.
  class Watch {
   public:
    // The next event; false when none came within `timeout` (call again)
    // or the watch has ended (ended() tells which).
    bool Next(v1::StudyEvent* event, absl::Duration timeout);
    bool ended() const { return ended_; }

   private:
    friend class StudyTable;
    Watch(StudyTable* table, std::string study_id)
        : table_(table), study_id_(std::move(study_id)) {}
    StudyTable* table_;
    std::string study_id_;
    std::deque<v1::StudyEvent> pending_;  // snapshot events not yet given
    uint64_t next_sequence_ = 0;          // first live event not yet given
    bool ended_ = false;
  };
  // NOT_FOUND for an unknown study.
  absl::StatusOr<std::unique_ptr<Watch>> WatchStudy(const std::string& study_id);

  // One pass over every running study (the thread calls it).
  void Refresh();
  // Asks the thread for a refresh now (a trial's job recorded a
  // validation or ended): pruning and the next trial need not wait for the
  // refresh period. Takes only a small lock of its own; callable from any
  // thread, also while the caller holds locks the table may take.
  void Wake();
  // Ends every watch (their Next returns false with ended()); the master's
  // shutdown, before the server stops.
  void CloseWatches();

 private:
  StudyTable(Options options, TrialJobs& jobs);

  absl::Status LoadStudies();

  Study* FindLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // spec.warm_start_from: `from`'s finished trials that fit `study`'s space
  // into study.status.seeded (StudyStatus.seeded).
  void SeedLocked(const Study& from, Study& study) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Study*> FindOrError(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::Trial*> TrialOrError(Study& study, int number) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // StudyEvents, for the scheduler (which runs under mu_).
  void Log(Study& study, v1::StudyEvent::Kind kind, const v1::Trial* trial,
           const std::string& message) override;

  const Options options_;
  const StudyStore store_;
  // Runs every study's trials; called with mu_ held.
  TrialScheduler scheduler_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Study>> studies_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // creation order
  int last_study_number_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;  // an event was logged, or closing_ set

  // The thread's wake-up: set by Wake and CloseWatches, cleared by the
  // thread before each refresh. A leaf lock (nothing is taken under it).
  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_STUDY_TABLE_H_
