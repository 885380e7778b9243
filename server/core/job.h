// One training job on the master: its spec, weights, optimizer, progress,
// data queue and the groups serving it.
//
// Parts, each a value class used under the job's mutex (none has a lock of
// its own): GroupTable (groups, liveness, telemetry), DataQueue (units,
// epochs and their records), update admission (update_admission.h: whether
// an update is taken), UpdateRule (how it changes the weights, guarded),
// StopRules (validations); job_checkpoint.h encodes the weights and the
// rule's state. Job itself keeps the state machine below, the weights, the
// counters and the mutex.
//
// Threading: every public method is thread-safe; one mutex per job, so jobs
// never wait on each other. ApplyGradient checks the update for NaN/Inf
// before taking the job's mutex and holds it only for the update and the
// bookkeeping; the update is assembled by the caller beforehand and the reply
// weights are handed out as an immutable snapshot that is encoded after the
// lock is released.
//
// Lock order: JobRegistry::mu_ -> Job::mu_, nested only in RegisterGroup
// (it reads state() of each job under the registry's mutex to find a
// queued one); JobJournal::checkpoint_mu_ -> Job::mu_ in
// WriteCheckpoint (CheckpointDue, SaveCheckpoint, CheckpointWritten), taken
// after the registry's mutex is released. A Job never calls the registry
// and takes no other lock while holding mu_, so the reverse never occurs.
//
// Errors carry a v1::ErrorReason (common/error_reason.h): GROUP_UNKNOWN for
// a group unknown, lost or gone; STALE_UPDATE beyond max_staleness;
// JOB_ENDED for a COMPLETED, FAILED or CANCELLED job (also once its
// weights were released); JOB_STATE for no weights yet, a
// job not RUNNING or a data-queue mismatch; INVALID_REQUEST for a bad
// layout, NaN/Inf, a wrong update kind or a bad unit; INTERNAL for a
// checkpoint that does not fit or a failing optimizer.
//
// Lifecycle: QUEUED -> RUNNING (a group registered) -> COMPLETED, FAILED or
// CANCELLED, the ended states (JobStateEnded). A RUNNING job whose groups
// are all lost or gone goes back to QUEUED, keeping its weights and
// progress. Once an ended job's final checkpoint is on disk the registry
// calls ReleaseMemory; Status() then reports the job from its record.
//
// Updates, by config().algorithm(): one optimizer step on a gradient
// (downpour, sync), the centre moved towards the rank's weights (easgd), a
// delta added (gem). An update computed on version B while the master is at
// W has staleness W - B: refused beyond max_staleness, and with
// StalenessScaling::kInverse scaled by 1 / max(1, W - B).
//
// The rules of the data queue (units, epochs, read-ahead, data errors), of
// validations and stop rules, of checkpoints and of a job's end are in
// docs/master.md: "The data queue", "Snapshots, validation and stop rules",
// "Job states and the end of a job".
#ifndef MPILEARN_SERVER_CORE_JOB_H_
#define MPILEARN_SERVER_CORE_JOB_H_

#include <cstdint>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec/job_config.h"
#include "common/schedule/lr_schedule.h"
#include "proto/mpilearn.pb.h"
#include "server/core/data_queue.h"
#include "server/core/group_table.h"
#include "server/core/store/job_checkpoint.h"
#include "server/core/job_values.h"
#include "server/core/update/optimizer.h"
#include "server/core/stop_rules.h"
#include "server/core/update/update_rule.h"
#include "server/core/update_admission.h"

namespace mpilearn::server {

// COMPLETED, FAILED or CANCELLED: the job takes no more work.
inline bool JobStateEnded(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

class Job {
 public:
  // Guarded weights: after this many updates in a row refused because they
  // would have made the weights or the optimizer state non-finite, the job
  // FAILs (its message suggests a lower learning rate or clipping).
  static constexpr int kMaxRejectedInARow = 10;

  // `engine` says where the job's optimizer runs (EngineOptions).
  // `config` is normalized (JobConfig::Create).
  Job(std::string id, JobConfig config, EngineOptions engine = {});

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& id() const { return id_; }
  const JobConfig& config() const { return config_; }  // immutable
  const v1::JobSpec& spec() const { return config_.spec(); }

  v1::JobState state() const;

  // Adds a group, silent for at most `liveness` (GroupTable::CheckHeartbeat;
  // default: the timeout ReapLostGroups is given); the job becomes RUNNING.
  // FAILED_PRECONDITION when the job has already ended.
  absl::StatusOr<v1::RegisterGroupResponse> AddGroup(
      const std::string& group_id, int ranks, const std::string& host,
      absl::Time now, GroupTable::Liveness liveness = {});

  // Marks `group_id` as seen and, when given, keeps `telemetry` as its
  // latest. NOT_FOUND for a group this job never had, FAILED_PRECONDITION
  // for one declared lost or gone.
  absl::Status Touch(const std::string& group_id, absl::Time now,
                     const v1::GroupTelemetry* telemetry = nullptr);

  // Installs the initial weights and builds the optimizer for them (downpour,
  // sync). Returns false (not an error) when weights were already installed.
  // INVALID_ARGUMENT when `values` do not match `header` or hold NaN/Inf.
  absl::StatusOr<bool> InitWeights(v1::TensorSetHeader header,
                                   std::vector<std::vector<float>> values);

  // Installs `source`'s weights (spec.warm_start) as the initial ones, at
  // version 0, in `layout` (the first group's, which CheckWarmStartLayout
  // found to match), with a fresh optimizer, or with `source`'s optimizer
  // state when `optimizer_state`. False when weights were installed
  // already; InitWeights' errors, DecodeJobCheckpoint's for a state that
  // does not fit this job's optimizer.
  absl::StatusOr<bool> WarmStart(const JobCheckpoint& source, const v1::TensorSetHeader& layout,
                                 bool optimizer_state);

  // The weights' layout (names, shapes); FAILED_PRECONDITION before
  // InitWeights.
  absl::StatusOr<v1::TensorSetHeader> Layout() const;

  // Applies one update as the job's algorithm says (see the class comment)
  // and returns the weights for the reply: the new weights, or for easgd the
  // centre before the move. Errors, each leaving the job unchanged:
  // INVALID_ARGUMENT for a kind other than the algorithm's, tensors that do
  // not match Layout() in count or size, or NaN/Inf; FAILED_PRECONDITION
  // before InitWeights, when the job is not RUNNING or the group not active;
  // ABORTED (counted in stale_rejected) beyond max_staleness;
  // FAILED_PRECONDITION with ERROR_REASON_UPDATE_REJECTED (counted in
  // JobStatus.updates_rejected) when applying it would have made the weights
  // or the optimizer state NaN or Inf: the job's weights and optimizer
  // state stay exactly as they were (bit for bit), and kMaxRejectedInARow
  // such refusals in a row FAIL the job. The checks are update admission's
  // (update_admission.h: its scan runs before the job's mutex is taken),
  // the guard is the rule's (UpdateRule::ApplyGuarded). The guard costs no
  // extra pass in normal training: the rule bounds the step from the
  // magnitudes known from earlier ones, and only an update it cannot vouch
  // for is applied to a copy that can be undone (the CUDA optimizer's
  // device state is not put back; see cuda_engine.h).
  // optimizer.clip_grad_norm scales a gradient to that L2 norm first.
  //
  // After a stop rule ended the job, an update from a group still active is
  // dropped, not refused: the reply carries the final weights and
  // `applied->applied` is false. `applied`, when given, receives what the
  // update did.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ApplyGradient(
      const GradientUpdate& update, absl::Time now,
      AppliedUpdate* applied = nullptr);

  // Buffers for an incoming update of `counts[i]` floats per tensor, reused
  // from earlier updates when their sizes match (contents unspecified), so
  // a push does not pay for fresh pages (tens of MB for large models). Give
  // them back with ReturnUpdateBuffers once the update was applied.
  std::vector<std::vector<float>> TakeUpdateBuffers(
      const std::vector<int64_t>& counts);
  void ReturnUpdateBuffers(std::vector<std::vector<float>> buffers);

  // The data queue (see the class comment and NextDataUnitRequest in the
  // proto): records the units the group completed and hands it the next
  // one (the one reserved for it by its last answer, if any), plus with
  // read_ahead the one after it (next_unit), or tells it to wait or that
  // the data is done. Errors, each leaving the job unchanged:
  // INVALID_ARGUMENT for train_samples <= 0 before the job's count is
  // fixed, a bad file_rows list (too long, negative, not summing to
  // train_samples), a completed unit the group does not hold (or whose
  // samples + skipped is not its size, or with skipped rows when
  // data.bad_values is not "skip"), or asking while holding an unlisted unit;
  // FAILED_PRECONDITION for another train_samples or file list than the
  // job's, an inactive group or a FAILED job. A COMPLETED job answers
  // DONE; one a stop rule ended also gives finish = true to the first group
  // that asks until the test result is in (the units the group held are
  // dropped). Every answer carries the job's progress after the request; an
  // accepted request's telemetry, when present, becomes the group's latest.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request, absl::Time now);

  // Weights and optimizer state, for the state directory;
  // FAILED_PRECONDITION before InitWeights. SaveCheckpoint adds the rest of
  // the job to them.
  absl::StatusOr<JobCheckpoint> Checkpoint() const;

  // Whether the job's CheckpointSpec makes a checkpoint due now; never
  // before InitWeights. A job whose weights live on parameter shards (a
  // lead's) has none here: `on_shards` gives their version then.
  bool CheckpointDue(CheckpointTrigger trigger, absl::Time now,
                     std::optional<uint64_t> on_shards = std::nullopt) const;

  // The whole job at one moment, copied under its mutex so the caller
  // writes the file after releasing it: status (with history, validations
  // and groups), weights, optimizer state, data queue. Counts as the last
  // checkpoint for CheckpointDue. FAILED_PRECONDITION before InitWeights.
  // A lead's sharded job saves `on_shards`, the weights gathered from its
  // shards, without optimizer state (JobCheckpointFile.weights_on_shards);
  // FAILED_PRECONDITION when the job has weights of its own.
  absl::StatusOr<v1::JobCheckpointFile> SaveCheckpoint(
      absl::Time now, std::shared_ptr<const WeightsSnapshot> on_shards = nullptr);

  // The checkpoint of weight version `version` is on disk
  // (JobStatus.checkpoint_version).
  void CheckpointWritten(uint64_t version);

  // Makes a freshly constructed job (no InitWeights, no groups) the job
  // `checkpoint` was taken of: weights, optimizer state, version, counters,
  // history, validations (replayed through the stop rules), test result,
  // data queue. A job that had ended comes back as it was, any other
  // QUEUED. A checkpoint of weights on shards brings back everything but
  // the weights (the job gets them from its shards again). INVALID_ARGUMENT / DATA_LOSS when the checkpoint does not fit
  // the spec; the job is then unusable (build a new one).
  absl::Status Resume(v1::JobCheckpointFile checkpoint);

  // Marks the job ended as `status` (a history.json whose state is
  // COMPLETED or FAILED) says: state, message, stop reason, test result.
  // Counters, history and validations are taken from `status` too when the
  // job has no weights (no checkpoint was loaded). No-op for other states.
  void ResumeEnded(const v1::JobStatus& status);

  // A slice of a sharded job on its shard (docs/sharding.md): back to the
  // state of `checkpoint` (one of its own, weights and optimizer state), as
  // the lead orders when another shard of the job restarted from the
  // checkpoint of that version. Every group is dropped (their next call is
  // GROUP_UNKNOWN: they register again and pull the weights), the counters
  // are the checkpoint's. INVALID_ARGUMENT / DATA_LOSS when it does not fit,
  // FAILED_PRECONDITION once the job ended; the job is unchanged then.
  absl::Status Rollback(v1::JobCheckpointFile checkpoint);

  // The checkpoint version the job's weights were last loaded from
  // (Resume, Rollback; 0 if never), and a token new at each such load, so
  // that a lead tells a shard's restart from a slice it already knew
  // (ShardSliceStatus.restore_token).
  struct RestoreMark {
    uint64_t version = 0;
    uint64_t token = 0;
  };
  RestoreMark restored() const;

  // Installs weights and optimizer state from a checkpoint (instead of
  // InitWeights): training continues exactly where Checkpoint() was taken.
  // INVALID_ARGUMENT / DATA_LOSS if the checkpoint does not fit the job's
  // optimizer; FAILED_PRECONDITION if the job already has weights.
  absl::Status Restore(const JobCheckpoint& checkpoint);

  // Current weights; FAILED_PRECONDITION before InitWeights.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Weights() const;

  // Merges a group's validation metrics (val_loss, val_accuracy, group_id)
  // into the master's record of epoch record.epoch(), which the data queue
  // wrote when the epoch's last unit completed; the master's train_loss,
  // samples, wall_seconds, samples_per_second and updates_applied are kept.
  // INVALID_ARGUMENT for an epoch outside [1, epochs], NOT_FOUND for one not
  // finished yet.
  absl::Status RecordEpoch(const v1::EpochRecord& record, absl::Time now);
  // The record of finished epoch `epoch` (1-based) as the job holds it now
  // (the master's, with a group's report merged in); nullopt for an epoch
  // not finished.
  std::optional<v1::EpochRecord> FinishedEpoch(int32_t epoch) const;

  // Appends a validation to the job's list (unix_seconds defaults to `now`),
  // updates the best by checkpoint.best_metric and, while the job is QUEUED
  // or RUNNING, applies the stop rules (see the class comment). A job that
  // has ended still records validations (and its best) but never stops
  // again. `effect`, when given, receives what it did.
  absl::Status RecordValidation(const v1::ValidationRecord& record,
                                absl::Time now,
                                ValidationEffect* effect = nullptr);

  // Ends a QUEUED or RUNNING job the way a stop rule does (COMPLETED,
  // stop_reason and message set to `reason`; weights frozen; a group still
  // training gets DONE and leaves), except that no group is told to finish
  // it: nobody evaluates the test set of a trial that was stopped, and its
  // group moves on at once. MPI Opt's pruning and cancelling of trials.
  // FAILED_PRECONDITION (ERROR_REASON_JOB_ENDED) for a job that has ended.
  absl::Status Stop(const std::string& reason);
  // Ends a QUEUED or RUNNING job as CANCELLED with message "cancelled:
  // `reason`" (or "cancelled" without one): its groups get DONE at their
  // next NextDataUnit (without finish) and pushes are refused with
  // JOB_ENDED. FAILED_PRECONDITION (ERROR_REASON_JOB_ENDED) for a job that
  // has ended.
  absl::Status Cancel(const std::string& reason);
  // Ends a RUNNING job whose spec.max_wall_seconds have passed since it
  // first became RUNNING (JobStatus.started_unix_seconds) as FAILED, with
  // stop_reason "wall-time limit of N s reached" (kWallTimeStop) and a
  // message saying so; its groups are told DONE as for a cancelled job
  // (pushes answered with the weights, NextDataUnit DONE) and leave.
  // Returns whether it ended the job now.
  bool EndIfOverWallTime(absl::Time now);
  // Groups not lost nor gone.
  int LiveGroups() const;
  // Whether the job has ended (COMPLETED, FAILED, CANCELLED) and no group
  // is live (a group still training, or the one to finish a job a stop
  // rule ended, gets the final weights in its replies until it leaves or is
  // declared lost), so ReleaseMemory may drop its tensors once its final
  // checkpoint is written.
  bool Releasable() const;
  // Drops the weights, the update rule (optimizer state), the update
  // buffers and the spare snapshots of an ended job; the version and
  // parameter count stay in Status(). Weights() then fails with JOB_ENDED.
  // No-op for a job that has not ended (returns false) or has no weights.
  bool ReleaseMemory();
  // Whether ReleaseMemory dropped the job's tensors (or the job was loaded
  // ended, from its history alone).
  bool MemoryReleased() const;

  // A group leaves: completed => COMPLETED, error => FAILED, else the group
  // is removed and the job re-queued if no group is left. The group's data
  // units (held and reserved), if any, go back to the queue. An error with
  // data_error from a group that holds a unit fails the job only as the
  // class comment says (a group holding none fails it). On a job a
  // stop rule ended, completed stores the test result if none is stored
  // yet. `effect`, when given, receives what it did.
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request,
                                     LeaveEffect* effect = nullptr);

  // Declares lost the groups silent for longer than their own limit (3
  // missed heartbeats), or than `timeout` for a group without one, and
  // re-queues their data units; returns how many groups. The job's message
  // names the last one and its limit ("group g-3 lost after 3 missed
  // heartbeats (6s without contact)"); `lost`, when given, receives such a
  // line per group.
  int ReapLostGroups(absl::Time now, absl::Duration timeout,
                     std::vector<std::string>* lost = nullptr);

  // Groups carry their latest telemetry; train_loss and samples_per_epoch
  // are set once known.
  v1::JobStatus Status(bool with_history, absl::Time now) const;

  // Status for the metrics exporter (see JobMetricsView).
  JobMetricsView MetricsView(absl::Time now) const;

 private:
  bool EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return JobStateEnded(state_);
  }
  // Ended by a stop rule: weights frozen, a group may still finish it.
  bool StoppedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == v1::JOB_STATE_COMPLETED && !stop_reason_.empty();
  }
  // FAILED_PRECONDITION naming the job: ERROR_REASON_JOB_STATE before
  // InitWeights, ERROR_REASON_JOB_ENDED for an ended job (its weights, if
  // any, are in its last checkpoint).
  absl::Status NoWeightsError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ApplyGradient's second half, for an update AdmitUpdate admitted from
  // `group`: applies it with the rule's guard and books it (version,
  // counters, the group's sequence, the checkpoint schedule, `applied`).
  // Returns the reply's weights.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ApplyAdmittedLocked(
      const GradientUpdate& update, const Admission& admission,
      GroupTable::Group& group, absl::Time now, AppliedUpdate* applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts an update the rule's guard refused (`result`: undone, or not)
  // in stats_.rejected and rejected_in_a_row_, fails the job when it could
  // not be undone or after kMaxRejectedInARow in a row, and returns the
  // pusher's error (ERROR_REASON_UPDATE_REJECTED; INTERNAL when not undone).
  absl::Status RejectUpdateLocked(const UpdateRule::Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether anyone besides weights_ (and the spare list, which weights_
  // joins once it came from a copy) holds the current snapshot: a reply
  // still being encoded. Then an update must not change it in place.
  bool HeldElsewhereLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An AppliedUpdate that applied nothing: the current weights and counts.
  // Makes weights_ a snapshot nobody else holds, with the same contents
  // (reusing a spare one when possible); the previous one stays with its
  // holders.
  void CopyOnWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  AppliedUpdate UnappliedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobCheckpoint> CheckpointLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusLocked(bool with_history, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobProgress for NextDataUnit's answers.
  v1::JobProgress ProgressLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.Progress();
  }
  // A group left with a data error while training `unit_id` (its units
  // are given back already): counts the failure in the queue and fails the
  // job when the unit has failed max_unit_failures times or no live group
  // is left to retry it; else the job goes on. True when the job failed.
  bool DataErrorLocked(const std::string& group_id, int64_t unit_id,
                       const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING -> QUEUED when no live group is left.
  void RequeueIfOrphanedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the group's held and reserved units back to the queue (unless
  // the job ended); the group stops being the job's finisher.
  void ReleaseGroupLocked(const std::string& group_id, GroupTable::Group& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a NextDataUnit request of a COMPLETED or CANCELLED job.
  v1::NextDataUnitResponse DoneLocked(const std::string& group_id,
                                      GroupTable::Group& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // State, message, stop reason and test result as `status` says.
  void ResumeOutcomeLocked(const v1::JobStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the validations of `status`, fed to the stop rules and the
  // schedule (so a plateau's state comes back with them).
  void ReplayValidationsLocked(const v1::JobStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The schedule's position for the coming step (epochs finished, or the
  // optimizer's steps); its rate there, set on the optimizer; and that rate
  // as the status shows it.
  int64_t SchedulePositionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double LearningRateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What the group that finished the job measured on the test set.
  struct TestResult {
    double loss = 0.0;
    std::optional<double> accuracy;  // classification losses only
    std::map<std::string, double> metrics;  // every test metric by name

    // From a Leave request or a stored status (both carry the fields).
    template <typename Message>
    static TestResult Of(const Message& m) {
      TestResult result;
      result.loss = m.test_loss();
      if (m.has_test_accuracy()) result.accuracy = m.test_accuracy();
      result.metrics.insert(m.test_metrics().begin(), m.test_metrics().end());
      return result;
    }
  };

  const std::string id_;
  const JobConfig config_;
  const EngineOptions engine_;
  // UpdateRuleName(spec()), for AppliedUpdate.
  const std::string update_rule_;

  // Update buffers given back (TakeUpdateBuffers); their own lock, taken
  // alone, so receiving a push never waits for an update being applied.
  absl::Mutex scratch_mu_;
  std::vector<std::vector<std::vector<float>>> scratch_
      ABSL_GUARDED_BY(scratch_mu_);
  // Set by ReleaseMemory: buffers given back are dropped, not kept.
  bool scratch_released_ ABSL_GUARDED_BY(scratch_mu_) = false;

  mutable absl::Mutex mu_;
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_QUEUED;
  std::string message_ ABSL_GUARDED_BY(mu_);
  // Invariant: weights_ and rule_ are null before InitWeights (or Restore)
  // and both set after it. A snapshot handed out is never mutated: an
  // update changes weights_ in place only while nobody else holds it and
  // copies it first otherwise (copy-on-write).
  std::shared_ptr<WeightsSnapshot> weights_ ABSL_GUARDED_BY(mu_);
  // Snapshots handed out earlier, kept for reuse by copy-on-write once
  // nobody else holds them (use_count 1: only this list, and nothing can
  // take a new reference to them), so an update does not allocate and
  // fault in a fresh copy of the weights.
  std::vector<std::shared_ptr<WeightsSnapshot>> spare_snapshots_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<UpdateRule> rule_ ABSL_GUARDED_BY(mu_);
  // Updates applied and refused, staleness.
  UpdateStats stats_ ABSL_GUARDED_BY(mu_);
  // Updates refused by the guard since the last one applied.
  int rejected_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  GroupTable groups_ ABSL_GUARDED_BY(mu_);
  // Units, epochs, their records, samples trained, train loss.
  DataQueue queue_ ABSL_GUARDED_BY(mu_);
  // The group told to finish the job (finish = true), or empty.
  std::string finisher_ ABSL_GUARDED_BY(mu_);
  std::optional<TestResult> test_result_ ABSL_GUARDED_BY(mu_);

  // Every validation, in arrival order, and the rules they drive.
  std::vector<v1::ValidationRecord> validations_ ABSL_GUARDED_BY(mu_);
  StopRules rules_ ABSL_GUARDED_BY(mu_);
  // optimizer.schedule: the rate of each step (ApplyScheduleLocked), its
  // plateau fed by the validations of its metric.
  const StopRules::Metric schedule_metric_;
  LrSchedule schedule_ ABSL_GUARDED_BY(mu_);
  // Set when a stop rule ended the job (then state_ is COMPLETED).
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  // When the job first became RUNNING; InfinitePast before.
  absl::Time started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // A group left with completed = true after the stop, or Stop ended the
  // job: nobody (else) is told to finish.
  bool stop_finished_ ABSL_GUARDED_BY(mu_) = false;

  // Changes since the last checkpoint, the version on disk.
  CheckpointSchedule checkpoints_ ABSL_GUARDED_BY(mu_);
  // Shown by Status() while weights_ is null, for an ended job resumed from
  // its history alone.
  uint64_t resumed_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resumed_parameters_ ABSL_GUARDED_BY(mu_) = 0;
  RestoreMark restored_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_H_
