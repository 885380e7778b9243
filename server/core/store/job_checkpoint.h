// Encoding a job's weights and update-rule state as a checkpoint
// (JobCheckpoint, the tensors of a v1::JobCheckpointFile) and decoding them
// back. The file's framing and checksum on disk are job_store's; the data
// queue's part is DataQueue::Save / Resume.
//
// optimizer_state lists, for each state buffer B of the optimizer and each
// weight tensor W, a tensor "B/W" shaped like W; its header's version is the
// optimizer's step count. A rule without an optimizer (easgd, gem) stores no
// tensors, and the job's updates applied as the version.
//
//   MPILEARN_ASSIGN_OR_RETURN(JobCheckpoint saved,
//                             EncodeJobCheckpoint(*weights, *rule, updates));
//   MPILEARN_ASSIGN_OR_RETURN(DecodedCheckpoint restored,
//                             DecodeJobCheckpoint(saved, spec, engine, id));
//
// CheckpointSchedule says when the next checkpoint is due.
//
// Threading: plain functions, and a value class a Job uses under its own
// mutex.
#ifndef MPILEARN_SERVER_CORE_STORE_JOB_CHECKPOINT_H_
#define MPILEARN_SERVER_CORE_STORE_JOB_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"
#include "server/core/update/optimizer.h"
#include "server/core/update/update_rule.h"

namespace mpilearn::server {

// When the registry asks whether a checkpoint is due (Job::CheckpointDue).
enum class CheckpointTrigger {
  // checkpoint.every_updates updates since the last checkpoint.
  kUpdates,
  // checkpoint.every_seconds since the last checkpoint, with changes since,
  // for a job that has not ended.
  kSeconds,
  // Any change since the last checkpoint (master shutdown).
  kChanges,
};

// When a job's next checkpoint is due, from its CheckpointSpec, the weight
// version and the changes since the last checkpoint taken.
class CheckpointSchedule {
 public:
  explicit CheckpointSchedule(const v1::CheckpointSpec& spec) : spec_(spec) {}

  // Counts `n` changes a checkpoint would capture (weights, completed
  // units, epoch reports, validations, leaves).
  void Changed(uint64_t n = 1) { changes_ += n; }

  // Whether `trigger` makes a checkpoint due at `now`, with the weights at
  // `version`, for a job that has `ended` or not.
  bool Due(CheckpointTrigger trigger, uint64_t version, bool ended,
           absl::Time now) const;

  // A checkpoint of the weights at `version` was taken at `now`.
  void Taken(uint64_t version, absl::Time now);
  // The checkpoint of weight version `version` is on disk.
  void Written(uint64_t version) { written_version_ = version; }
  // The job was resumed from the checkpoint of `version`, on disk; nothing
  // changed since.
  void Resumed(uint64_t version);

  // Weight version of the newest checkpoint on disk
  // (JobStatus.checkpoint_version).
  uint64_t written_version() const { return written_version_; }

 private:
  const v1::CheckpointSpec spec_;
  uint64_t changes_ = 0;
  uint64_t changes_at_checkpoint_ = 0;
  uint64_t version_at_checkpoint_ = 0;
  absl::Time checkpoint_time_ = absl::InfinitePast();
  uint64_t written_version_ = 0;
};

// `weights` with an optimizer state of no tensors whose version is
// `updates_applied`: a rule without an optimizer (easgd, gem), or a lead's
// checkpoint of weights gathered from its shards.
JobCheckpoint WeightsOnlyCheckpoint(const WeightsSnapshot& weights, uint64_t updates_applied);

// `weights` and the state of `rule` (its optimizer's, if any), with
// `updates_applied` as the version of an empty optimizer state. Errors
// (a device optimizer failing to save) carry ERROR_REASON_INTERNAL.
absl::StatusOr<JobCheckpoint> EncodeJobCheckpoint(const WeightsSnapshot& weights,
                                                  const UpdateRule& rule,
                                                  uint64_t updates_applied);

// A job's checkpoint file: its `status` (with history, validations and
// groups), `tensors` (EncodeJobCheckpoint), data `queue` and the staleness
// sums of `stats` that the status does not show, created at `now`.
v1::JobCheckpointFile MakeCheckpointFile(v1::JobStatus status,
                                         JobCheckpoint tensors,
                                         v1::CheckpointQueue queue,
                                         const UpdateStats& stats,
                                         absl::Time now);

// Moves the tensors out of `file`, for DecodeJobCheckpoint.
JobCheckpoint TakeCheckpointTensors(v1::JobCheckpointFile& file);

// What a checkpoint decodes to: the weights (at the saved version) and the
// update rule with the saved optimizer state.
struct DecodedCheckpoint {
  WeightsSnapshot weights;
  std::unique_ptr<UpdateRule> rule;
};

// Decodes `checkpoint` for a job of `spec` (id `job_id`, named in
// messages) whose optimizer runs on `engine`. INVALID_ARGUMENT or DATA_LOSS
// (ERROR_REASON_INTERNAL: the master's own state does not fit) when the
// tensors do not decode or the optimizer state does not fit the spec.
absl::StatusOr<DecodedCheckpoint> DecodeJobCheckpoint(
    const JobCheckpoint& checkpoint, const v1::JobSpec& spec,
    const EngineOptions& engine, const std::string& job_id);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_STORE_JOB_CHECKPOINT_H_
