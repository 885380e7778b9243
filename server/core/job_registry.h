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
// its history.json whenever its record changes; a checkpoint (status,
// weights, optimizer state, data queue) every checkpoint.every_updates
// updates (on the pushing thread), every checkpoint.every_seconds (Tick),
// whenever a validation improves the best (also as best.pb), when the job
// ends, and at CheckpointAll (master shutdown). Files are written after the
// job's mutex is released; one job's checkpoints are written one at a time.
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
// that record alone: its checkpoints' tensors are not decoded (they stay on
// disk for PullWeights, EndedWeights).
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
#include "server/core/job_store.h"
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
  // and hands out the next one (Job::NextDataUnit). Persists the history
  // when the request finished an epoch.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request);

  // Merges the group's validation metrics into the master's record of a
  // finished epoch (Job::RecordEpoch), records them as a validation (source
  // "group G", version: the job's weight version now) that drives the stop
  // rules, and persists the history.
  absl::StatusOr<v1::JobState> ReportEpoch(const std::string& job_id,
                                           const v1::EpochRecord& record);
  // A validation pool's result (Job::RecordValidation); persists the
  // history. Returns the job's state after it (COMPLETED if a stop rule
  // fired).
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
  // writes under way; for a clean shutdown, once no more calls arrive.
  void CheckpointAll();

  absl::Duration group_timeout() const { return options_.group_timeout; }
  absl::Time Now() const { return options_.clock(); }

 private:
  // A job and the mutex held while its checkpoint files are written (never
  // together with the job's own mutex).
  struct Entry {
    std::shared_ptr<Job> job;
    std::shared_ptr<absl::Mutex> checkpoint_mu = std::make_shared<absl::Mutex>();
  };

  JobRegistry(Options options, std::unique_ptr<JobStore> store);

  // Loads the jobs of the state directory (see the class comment).
  void LoadJobs();

  // Persists the job's status; failures are logged, not returned, because
  // the in-memory state stays authoritative and the next write retries.
  void PersistHistory(const Job& job) const;

  // Takes a checkpoint of `job` and writes it, and with `best` best.pb too.
  // With a trigger, only if the checkpoint is due once the job's previous
  // write is done; without `wait`, not at all while another write of the job
  // is under way. Returns what was written; nothing when no checkpoint was
  // taken (not due, busy, no weights yet) or the write failed (logged).
  std::optional<v1::JobCheckpointFile> WriteCheckpoint(
      Job& job, std::optional<CheckpointTrigger> trigger, bool wait,
      bool best);

  // After a job ended (`ended_now`) or got the test result after a stop
  // rule ended it: final checkpoint (and best.pb with `best`), weights.pb
  // and optimizer.pb for a COMPLETED job, the snapshot sink told.
  void WriteJobEnd(Job& job, bool ended_now, bool best);

  // Acts on what a validation did: best.pb, or the job's end.
  void AfterValidation(Job& job, const ValidationEffect& effect);

  std::vector<std::shared_ptr<Job>> AllJobs() const;

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
