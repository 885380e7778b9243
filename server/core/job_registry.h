// The master's core: every job it holds, the queue, and the groups serving
// them. The gRPC service (master_service.h) is a thin translation layer over
// this class; unit tests drive it directly, without a network.
//
//   auto registry = JobRegistry::Create({.state_dir = "/var/lib/mpilearn"});
//   std::string job_id = (*registry)->Submit(spec).value();
//   auto group = (*registry)->RegisterGroup(request);   // takes the job
//
// Threading: thread-safe. The registry's mutex guards only the job table; each
// job has its own mutex (job.h), so an update to one job never waits on
// another. Lock order: registry mu_ -> Job::mu_ (RegisterGroup calls
// Job::state() under mu_ to find a queued job; nothing else nests them), and
// an Entry's checkpoint_mu -> Job::mu_ (WriteCheckpoint, which takes
// checkpoint_mu only after releasing mu_). A Job never calls the registry,
// so the reverse order never occurs. Errors are absl::Status values whose
// messages tell the caller what to do and that carry a v1::ErrorReason
// (unknown job id: ERROR_REASON_JOB_UNKNOWN); the service maps them to gRPC
// codes unchanged.
//
// Durability (job_store.h): a job's spec is written before it is queued;
// its history.json (the status without the epoch and validation lists)
// whenever its state, groups or epochs change; each epoch record and
// validation is appended to records.jsonl as it arrives (ReportValidation
// only appends, unless it ends the job or improves the best); a checkpoint
// (status,
// weights, optimizer state, data queue) every checkpoint.every_updates
// updates (on the pushing thread), every checkpoint.every_seconds (Tick),
// whenever a validation improves the best (also as best.pb), when the job
// ends, and at CheckpointAll (master shutdown). Files are written after the
// job's mutex is released; one job's checkpoints are written one at a time,
// and so are its history.json and records.jsonl writes (Persistence::
// write_mu, held while a record is added to the job and appended, so the
// file's order is the job's).
//
// Unwritten records: a history.json, records.jsonl, final checkpoint or
// final weights.pb/optimizer.pb write that fails is remembered per job and
// retried by Tick (after 1 s, doubling to 30 s between tries) until it
// succeeds; the first failure of a streak is logged (ERROR) and so is the
// recovery (INFO). Meanwhile JobStatus.storage_error (Status, List,
// ListPage) says what is missing, since when and why. A job whose final
// checkpoint is unwritten keeps its tensors until it is written.
// CheckpointAll (shutdown) tries once more and logs what is lost.
//
// Observability: each applied update is reported to Options::metrics
// (apply time, staleness; see metrics_sink.h), and with Options::trace the
// registry records the trace events "apply" (the update itself, args version
// and staleness) and "checkpoint" (taking and writing one, arg version).
// ListForMetrics is the cheap per-scrape view of every job.
//
// Restart: Create loads every job under <state_dir>/jobs (Options::
// resume_jobs). A job with a checkpoint resumes from the newest one whose
// checksum verifies (damaged ones are logged and renamed *.corrupt): QUEUED
// with its weights, optimizer state, version, counters, history,
// validations and data queue, or, if it had ended, as it ended. A job
// without a usable checkpoint comes back as its history.json says if that
// says it ended, else QUEUED from its spec with no weights. A job whose
// history.json says it ended (COMPLETED, FAILED, CANCELLED) is loaded from
// that record (merged with records.jsonl) alone: its checkpoints' tensors
// are not kept (they stay on disk for PullWeights, EndedWeights); only
// when its newest checkpoint was written after history.json (a history
// write that failed) is that checkpoint read, and if it says the job
// ended, its outcome (state, test result, version, counters) wins. An
// ended state never regresses: a job whose history or checkpoint says it
// ended never comes back QUEUED.
//
// Ended jobs release memory: once a job has ended and its final checkpoint
// is written (WriteJobEnd), Job::ReleaseMemory drops its weights, optimizer
// state and buffers; EndedWeights reads them back from disk when asked.
// Delete removes an ended job from the table and its directory.
// Groups do not survive a restart: a group of the previous master is unknown
// to the new one (NOT_FOUND) and must register again. Job and group ids
// continue after the highest found on disk.
#ifndef MPILEARN_SERVER_CORE_JOB_REGISTRY_H_
#define MPILEARN_SERVER_CORE_JOB_REGISTRY_H_

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job.h"
#include "common/trace.h"
#include "server/core/store/job_store.h"
#include "server/core/metrics_sink.h"
#include "server/core/snapshot_sink.h"

namespace mpilearn::server {

class JobRegistry {
 public:
  struct Options {
    // Where job specs, histories and final weights are written.
    std::string state_dir;
    // A group with no call for this long is declared lost; its job is
    // re-queued if no other group serves it.
    absl::Duration group_timeout = absl::Seconds(60);
    // Where jobs' optimizers run (device, CPU threads).
    EngineOptions engine;
    // Gets every applied update's weights, epoch ends and job ends (the
    // snapshot hub); none when null. Must outlive the registry.
    SnapshotSink* snapshot_sink = nullptr;
    // Gets every applied update (the master's metrics); none when null.
    // Must outlive the registry.
    MetricsSink* metrics = nullptr;
    // Records "apply" and "checkpoint" events; none when null. Must outlive
    // the registry.
    TraceRecorder* trace = nullptr;
    // Called after a job recorded a validation (ReportEpoch,
    // ReportValidation) or a group left it, with the job's id and no lock
    // held: MPI Opt's study table wakes on it instead of waiting for its
    // next refresh. Must be cheap and must not call the registry.
    std::function<void(const std::string& job_id)> on_job_changed;
    // Load the jobs under <state_dir>/jobs at Create (see the class
    // comment); false starts with an empty table.
    bool resume_jobs = true;
    // Submit refuses a job while this many are QUEUED (RESOURCE_EXHAUSTED,
    // ERROR_REASON_LIMIT; mpilearn-master --max_queued_jobs); 0: no bound.
    // Jobs loaded at a restart count but are never refused.
    int max_queued_jobs = 0;
    // Injected for tests.
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // Opens the state directory and, with Options::resume_jobs, loads its
  // jobs. A job whose spec cannot be read is skipped with a warning.
  static absl::StatusOr<std::unique_ptr<JobRegistry>> Create(Options options);

  // Validates, fills defaults, stores and queues a job; returns its id.
  // RESOURCE_EXHAUSTED when Options::max_queued_jobs are queued already.
  absl::StatusOr<std::string> Submit(v1::JobSpec spec);

  // Attaches a group to the named job, or to the oldest queued job when
  // request.job_id() is empty.
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request);

  // NOT_FOUND with a hint for an unknown id.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id) const;
  // The id of the oldest job whose spec is named `name`, if any. Reads
  // only the immutable specs (no status is built), so it costs one pass
  // over the table however many jobs there are.
  std::optional<std::string> FindJobByName(const std::string& name) const;

  // Marks the group as seen and installs the initial weights if none are
  // installed yet (returns whether these were taken).
  absl::StatusOr<v1::InitWeightsResponse> InitWeights(
      const std::string& job_id, const std::string& group_id,
      v1::TensorSetHeader header, std::vector<std::vector<float>> values);

  // Applies an update (gradient, elastic or delta; see job.h). Checks it in
  // full (kind, layout sizes, NaN/Inf, staleness), so in-process callers
  // need no checks of their own.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ApplyGradient(
      Job& job, const GradientUpdate& update);

  // The data queue: marks the group as seen, records its completed units
  // and hands out the next one (Job::NextDataUnit). When the request
  // finished an epoch: appends its record to records.jsonl and writes
  // history.json.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request);

  // Merges the group's validation metrics into the master's record of a
  // finished epoch (Job::RecordEpoch), records them as a validation (source
  // "group G", version: the job's weight version now) that drives the stop
  // rules; appends both records to records.jsonl and writes history.json.
  absl::StatusOr<v1::JobState> ReportEpoch(const std::string& job_id,
                                           const v1::EpochRecord& record);
  // A validation pool's result (Job::RecordValidation), appended to
  // records.jsonl (history.json is written only when it ended the job or
  // improved the best). Returns the job's state after it (COMPLETED if a
  // stop rule fired).
  absl::StatusOr<v1::JobState> ReportValidation(
      const std::string& job_id, const v1::ValidationRecord& record);
  // Marks the group as seen and, when given, keeps its telemetry as the
  // group's latest (Job::Touch).
  absl::StatusOr<v1::JobState> Heartbeat(
      const std::string& job_id, const std::string& group_id,
      const v1::GroupTelemetry* telemetry = nullptr);
  // Ends the group's part; persists history (and weights on completion).
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request);

  // Stops a QUEUED or RUNNING job (Job::Stop) and writes its end like a
  // stop rule's: MPI Opt's pruning and cancelling.
  absl::Status Stop(const std::string& job_id, const std::string& reason);

  // Ends a QUEUED or RUNNING job as CANCELLED (Job::Cancel), writes its
  // final checkpoint and releases its memory. FAILED_PRECONDITION
  // (ERROR_REASON_JOB_ENDED) for a job that has ended.
  absl::Status Cancel(const std::string& job_id, const std::string& reason);
  // Removes an ended job from the table and its directory from the state
  // directory. FAILED_PRECONDITION (ERROR_REASON_JOB_STATE) for a job still
  // QUEUED or RUNNING.
  absl::Status Delete(const std::string& job_id);

  // The weights of an ended job whose memory was released, decoded from
  // its newest checkpoint on disk. FAILED_PRECONDITION (JOB_ENDED) naming
  // the checkpoint directory when none reads.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> EndedWeights(
      const Job& job) const;

  // One page of the job list (ListJobs): jobs whose number ("job-000041"
  // -> 41) is above `after`, whose state is in `states` (all when empty),
  // in submission order, at most `limit`; `more` tells whether further
  // matching jobs follow the last one returned.
  struct ListedJob {
    int64_t number = 0;
    v1::JobStatus status;  // without history
  };
  std::vector<ListedJob> ListPage(int64_t after,
                                  const std::vector<v1::JobState>& states,
                                  size_t limit, bool* more) const;

  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) const;
  // Every job's status without history or validations, in submission
  // order.
  std::vector<v1::JobStatus> List() const;
  // Every job as the metrics exporter reads it (Job::MetricsView), in
  // submission order.
  std::vector<JobMetricsView> ListForMetrics() const;

  // Declares silent groups lost (see Options::group_timeout); returns the
  // number.
  int ReapLostGroups();

  // The periodic work, called by the server at least every second:
  // ReapLostGroups, then the checkpoints checkpoint.every_seconds makes due.
  void Tick();

  // Checkpoints every job changed since its last checkpoint, waiting for
  // writes under way, then tries every unwritten record once more and logs
  // (ERROR) each job whose records are still not on disk; for a clean
  // shutdown, once no more calls arrive.
  void CheckpointAll();

  // Retries the unwritten records of every job whose retry is due (all of
  // them with `force`). Tick calls it.
  void RetryPendingWrites(bool force);

  absl::Duration group_timeout() const { return options_.group_timeout; }
  absl::Time Now() const { return options_.clock(); }

 private:
  // A job's records not on disk yet (a failed write), retried by Tick.
  struct PendingWrites {
    bool history = false;           // history.json
    bool records = false;           // records.jsonl, to be rewritten whole
    bool final_checkpoint = false;  // the ended job's final checkpoint
    bool final_best = false;        //   and best.pb with it
    // weights.pb and optimizer.pb of a COMPLETED job, from this final
    // checkpoint (whose own file is on disk).
    std::shared_ptr<const v1::JobCheckpointFile> final_files;
    // The streak: its first error, when it began, the next retry.
    absl::Status first_error;
    absl::Time since = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    absl::Time next_retry = absl::InfinitePast();

    bool Any() const {
      return history || records || final_checkpoint || final_files != nullptr;
    }
    // What is unwritten, since when and why ("final checkpoint and
    // history.json not written since 2026-11-25 00:41:07 UTC: <cause>").
    std::string Describe() const;
  };
  // The writes of a job's history.json and records.jsonl. Lock order:
  // write_mu -> Job::mu_ and write_mu -> the registry's mu_ (brief
  // lookups); state_mu is a leaf (nothing is taken while it is held).
  // write_mu and an Entry's checkpoint_mu are never held together.
  struct Persistence {
    // Serialises the job's history.json and records.jsonl writes; held
    // across adding a record to the job and appending it.
    absl::Mutex write_mu;
    absl::Mutex state_mu;
    PendingWrites pending ABSL_GUARDED_BY(state_mu);

    // A copy of `pending`, taken under state_mu.
    PendingWrites Pending() ABSL_LOCKS_EXCLUDED(state_mu) {
      absl::MutexLock lock(&state_mu);
      return pending;
    }
    // After a retry: while anything is still pending, the next try waits
    // twice as long as the last (at most `max`). Returns that wait, or zero
    // when nothing is pending.
    absl::Duration BackOff(absl::Time now, absl::Duration max)
        ABSL_LOCKS_EXCLUDED(state_mu) {
      absl::MutexLock lock(&state_mu);
      if (!pending.Any()) return absl::ZeroDuration();
      pending.backoff = std::min(2 * pending.backoff, max);
      pending.next_retry = now + pending.backoff;
      return pending.backoff;
    }
  };
  // A job and the mutex held while its checkpoint files are written (never
  // together with the job's own mutex).
  struct Entry {
    std::shared_ptr<Job> job;
    std::shared_ptr<absl::Mutex> checkpoint_mu = std::make_shared<absl::Mutex>();
    std::shared_ptr<Persistence> persistence = std::make_shared<Persistence>();
  };

  JobRegistry(Options options, std::unique_ptr<JobStore> store);

  // Loads the jobs of the state directory (see the class comment).
  void LoadJobs();

  // Writes the job's history.json, and with `rewrite_records` (or while
  // records.jsonl is unwritten) first records.jsonl in full. Failures are
  // not returned: the in-memory state stays authoritative, the write is
  // remembered (PendingWrites) and retried by Tick.
  void PersistHistory(const Job& job, bool rewrite_records = false) const;

  // Appends `records` (just added to the job) to its records.jsonl, unless
  // the file is to be rewritten anyway. Call with p.write_mu held.
  void AppendRecords(const Job& job, Persistence& p,
                     const JobStore::Records& records) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.write_mu);

  // The job's Persistence; null when the job is not (or no longer) in the
  // table.
  std::shared_ptr<Persistence> PersistenceOf(const std::string& job_id) const;

  // Applies `change` to the job's PendingWrites after a write whose result
  // is `error`: starts a streak (logged once, first retry in 1 s) when
  // something became pending, ends it (logged) when nothing is left.
  void UpdatePending(const std::string& job_id, Persistence& p,
                     const std::function<void(PendingWrites&)>& change,
                     const absl::Status& error) const;

  // JobStatus.storage_error of the job: empty when nothing is pending.
  std::string StorageError(Persistence& p) const;

  // Writes weights.pb and optimizer.pb from a COMPLETED job's final
  // checkpoint.
  absl::Status WriteFinalFiles(const std::string& job_id,
                               const v1::JobCheckpointFile& checkpoint) const;

  // Takes a checkpoint of `job` and writes it, and with `best` best.pb too.
  // With a trigger, only if the checkpoint is due once the job's previous
  // write is done; without `wait`, not at all while another write of the job
  // is under way. Returns what was written; nothing when no checkpoint was
  // taken (not due, busy, no weights yet) or the write failed (logged).
  // With `error`, a failed write is returned there instead of logged.
  std::optional<v1::JobCheckpointFile> WriteCheckpoint(
      Job& job, std::optional<CheckpointTrigger> trigger, bool wait,
      bool best, absl::Status* error = nullptr);

  // After a job ended (`ended_now`) or got the test result after a stop
  // rule ended it: final checkpoint (and best.pb with `best`), weights.pb
  // and optimizer.pb for a COMPLETED job, the snapshot sink told. What
  // fails to write becomes pending (retried by Tick, which calls this again
  // for a final checkpoint); the tensors are released once the final
  // checkpoint is on disk.
  void WriteJobEnd(Job& job, bool ended_now, bool best);

  // Acts on what a validation did: best.pb, or the job's end.
  void AfterValidation(Job& job, const ValidationEffect& effect);

  std::vector<std::shared_ptr<Job>> AllJobs() const;
  // Every job with its Persistence, in submission order.
  std::vector<std::pair<std::shared_ptr<Job>, std::shared_ptr<Persistence>>>
  AllEntries() const;

  const Options options_;
  const std::unique_ptr<JobStore> store_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for taking the oldest queued job.
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  int64_t last_job_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Submits past the queue check and not yet in jobs_: they count as
  // queued, so concurrent submits cannot overshoot max_queued_jobs.
  int submits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_group_number_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_REGISTRY_H_
