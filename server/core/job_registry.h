// The master's job table: every job it holds, the queue, and the groups
// serving them; each call says which of a job's files it changes, and the
// job's journal (store/job_journal.h) writes them. master_core.h adapts it
// for the gRPC service and the worker's local mode; tests drive it directly.
//
//   auto registry = JobRegistry::Create({.state_dir = "/var/lib/mpilearn"});
//   std::string job_id = (*registry)->Submit(std::move(config)).value();
//   auto group = (*registry)->RegisterGroup(request);   // takes the job
//
// Durability: a job's spec is written before it is queued; its history.json
// whenever its state, groups or epochs change; each epoch record and
// validation is appended to records.jsonl as it arrives; a checkpoint every
// checkpoint.every_updates updates (on the pushing thread), every
// checkpoint.every_seconds (Tick), when a validation improves the best (also
// best.pb), when the job ends, and at CheckpointAll. Failed writes are
// retried by Tick; JobStatus.storage_error names them meanwhile. Create
// reloads the state directory (store/job_loader.h); groups do not survive a
// restart, job and group ids continue after the highest on disk. An ended
// job's tensors are released once its final checkpoint is written;
// EndedWeights reads them back.
//
// Threading: thread-safe. mu_ guards only the table; each job has its own
// mutex (job.h) and journal. Lock order: mu_ -> Job::mu_ (Submit and
// RegisterGroup read job states under mu_); no journal lock is taken under
// mu_, and neither a Job nor a journal calls the registry. Errors carry a
// v1::ErrorReason (an unknown job id: ERROR_REASON_JOB_UNKNOWN).
#ifndef MPILEARN_SERVER_CORE_JOB_REGISTRY_H_
#define MPILEARN_SERVER_CORE_JOB_REGISTRY_H_

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
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job.h"
#include "server/core/job_observer.h"
#include "server/core/store/job_journal.h"
#include "server/core/store/job_store.h"
#include "server/sched/queue_order.h"

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
    // Told of applied updates, epoch ends, checkpoints, validations, ends
    // and deletions (job_observer.h), in this order; null entries are
    // skipped. Each must outlive the registry.
    std::vector<JobObserver*> observers;
    // Load the jobs under <state_dir>/jobs at Create (see the class
    // comment); false starts with an empty table.
    bool resume_jobs = true;
    // Submit refuses a job while this many are QUEUED (RESOURCE_EXHAUSTED,
    // ERROR_REASON_LIMIT; mpilearn-master --max_queued_jobs); 0: no bound.
    // Jobs loaded at a restart count but are never refused.
    int max_queued_jobs = 0;
    // The largest file a warm start reads (a checkpoint holds the weights and
    // up to three times as much optimizer state).
    uint64_t max_warm_start_bytes = uint64_t{8} << 30;
    // Which queued job a group without a job id takes, and the limits on
    // the groups an owner or a study holds (docs/scheduling.md).
    SchedulingPolicy scheduling;
    // Injected for tests.
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // Opens the state directory and, with Options::resume_jobs, loads its
  // jobs (store/job_loader.h).
  static absl::StatusOr<std::unique_ptr<JobRegistry>> Create(Options options);

  // Validates, fills defaults, stores and queues a job; returns its id.
  // RESOURCE_EXHAUSTED when Options::max_queued_jobs are queued already.
  // `as_id`, for a shard's slice of a lead's job: the job's id (no queue
  // bound; ALREADY_EXISTS when taken).
  absl::StatusOr<std::string> Submit(JobConfig config, std::string as_id = {});

  // Which owners' jobs a group may take (its token's scope); empty: any.
  using OwnerFilter = std::function<bool(const std::string& owner)>;

  // Attaches a group to the named job, or, when request.job_id() is empty,
  // to the queued job first in the queue order (server/sched/queue_order.h)
  // among those `may_train` allows and no limit holds back; as
  // request.group_id() when given (a shard: the lead's id; registering it
  // again refreshes it). RESOURCE_EXHAUSTED (LIMIT) when the named job's
  // owner or study holds as many groups as its limit; NO_QUEUED_JOB when
  // no queued job may be taken (the message says why).
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request, const OwnerFilter& may_train = nullptr);

  // Each QUEUED job's place in the queue order (1 is next) and, when a
  // limit holds it back, the note saying which.
  struct QueueSlot {
    int position = 0;
    std::string note;
  };
  std::map<std::string, QueueSlot> QueueOrder() const;
  // What each owner's jobs hold and wait with, for the metrics.
  struct OwnerLoad {
    int groups = 0;       // live groups of its jobs
    int queued_jobs = 0;  // QUEUED
    double recent_groups = 0;  // OwnerUsage: its recent use
    double share = 1.0;
  };
  std::map<std::string, OwnerLoad> OwnerLoads() const;

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

  // A lead's checkpoint of a sharded job, `weights` gathered from its
  // shards (Job::SaveCheckpoint): written when checkpoint.every_seconds
  // makes one due, or with `final` (the job's end) whenever anything
  // changed, and then for a COMPLETED job weights.pb too. NOT_FOUND for an
  // unknown job; the write's error.
  absl::Status CheckpointFromShards(const std::string& job_id,
                                    std::shared_ptr<const WeightsSnapshot> weights, bool final);

  // The weights (and optimizer state) job `job_id` starts from by `warm`
  // (its spec's warm_start): job warm.job_id()'s (in memory, else its newest
  // checkpoint), or the file warm.checkpoint() (at most
  // Options::max_warm_start_bytes). `from` names the source for messages.
  // FAILED_PRECONDITION for a source job that is gone or has no weights;
  // the file's errors, prefixed with the field.
  absl::StatusOr<JobCheckpoint> WarmStartSource(const std::string& job_id,
                                                const v1::WarmStartSpec& warm,
                                                std::string* from) const;

  // A shard's slice of a sharded job rolled back to its own checkpoint of
  // `version` (JobJournal::Rollback), as the lead orders. NOT_FOUND for an
  // unknown job or checkpoint.
  absl::Status RollbackSlice(const std::string& job_id, uint64_t version);
  // The weight versions of the job's checkpoints on disk, newest first (at
  // most `limit`).
  std::vector<uint64_t> CheckpointVersions(const std::string& job_id, size_t limit) const;
  // A lead's restore set of a sharded job: <job>/shard_manifest.json.
  absl::Status WriteShardManifest(const v1::ShardManifest& manifest);

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
  // ReapLostGroups, ends jobs past their max_wall_seconds, moves the
  // owners' recent use on, then the checkpoints checkpoint.every_seconds
  // makes due.
  void Tick();
  // Ends every RUNNING job past its spec.max_wall_seconds (Job::
  // EndIfOverWallTime) and writes its end; returns how many.
  int EndJobsOverWallTime();

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
  // A job and its journal, which writes its files.
  struct Entry {
    std::shared_ptr<Job> job;
    std::shared_ptr<JobJournal> journal;
  };

  JobRegistry(Options options, std::unique_ptr<JobStore> store);

  // Puts the jobs of the state directory in the table and writes the files
  // the loader asks for.
  void Load();
  // Adds `job` to the table, with a new journal, as the newest job.
  Entry AddLocked(std::shared_ptr<Job> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // NOT_FOUND (JOB_UNKNOWN) with a hint for an unknown id.
  absl::StatusOr<Entry> FindEntry(const std::string& job_id) const;
  // Every job that is QUEUED or holds groups, as the queue order sees it
  // (job_registry_queue.cc); `may_train`, when given, leaves the jobs it
  // refuses out of the candidates (they still count their groups).
  std::vector<QueueEntry> QueueEntriesLocked(const OwnerFilter& may_train) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job a group without a job id takes, or NO_QUEUED_JOB saying why
  // none.
  absl::StatusOr<Entry> PickQueuedLocked(const OwnerFilter& may_train) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that a group took or joined `job` (fair share's turns).
  void ServedLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LIMIT when `job`'s owner or study holds its limit of groups.
  absl::Status CheckGroupLimitLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job with its journal, in submission order.
  std::vector<Entry> AllEntries() const;

  const Options options_;
  const std::unique_ptr<JobStore> store_;
  JobObservers observers_;
  // What every journal uses; declared before the table, so it outlives them.
  const JobJournal::Context journal_context_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for taking the oldest queued job.
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  int64_t last_job_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Submits past the queue check and not yet in jobs_: they count as
  // queued, so concurrent submits cannot overshoot max_queued_jobs.
  int submits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_group_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Each owner's and study's recent use, for fair share (Tick moves it).
  OwnerUsage usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_REGISTRY_H_
