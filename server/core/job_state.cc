// Job's saved and restored state (job.h): checkpoints taken and resumed,
// and the learning-rate schedule, whose plateau state comes back with the
// validations a checkpoint holds. The rest of Job is job.cc.
#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "server/core/job.h"
#include "server/core/store/job_checkpoint.h"

namespace mpilearn::server {
namespace {

absl::Status FailedPrecondition(v1::ErrorReason reason, const std::string& message) {
  return WithReason(absl::FailedPreconditionError(message), reason);
}

// New at each load of a job's weights from a checkpoint; differs between
// processes (seeded by the clock) and between loads in one.
uint64_t NextRestoreToken() {
  static std::atomic<uint64_t> last{static_cast<uint64_t>(absl::GetCurrentTimeNanos())};
  return ++last;
}

}  // namespace

absl::StatusOr<JobCheckpoint> Job::Checkpoint() const {
  absl::MutexLock lock(&mu_);
  return CheckpointLocked();
}

absl::StatusOr<JobCheckpoint> Job::CheckpointLocked() const {
  if (weights_ == nullptr) return NoWeightsError();
  return EncodeJobCheckpoint(*weights_, *rule_, stats_.applied);
}

absl::Status Job::Restore(const JobCheckpoint& checkpoint) {
  MPILEARN_ASSIGN_OR_RETURN(DecodedCheckpoint decoded,
                            DecodeJobCheckpoint(checkpoint, spec(), engine_, id_));
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) {
    return FailedPrecondition(v1::ERROR_REASON_JOB_STATE,
                              absl::StrCat("job ", id_, " already has weights"));
  }
  rule_ = std::move(decoded.rule);
  weights_ = std::make_shared<WeightsSnapshot>(std::move(decoded.weights));
  return absl::OkStatus();
}

bool Job::CheckpointDue(CheckpointTrigger trigger, absl::Time now,
                        std::optional<uint64_t> on_shards) const {
  // A shard's slice with update checkpoints takes only those (and its last
  // one), so that its checkpoints are of the versions the other shards'
  // are: a timed one would push the grid's out of the kept set.
  if (trigger == CheckpointTrigger::kSeconds && spec().has_slice() &&
      spec().checkpoint().every_updates() > 0) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr && !on_shards.has_value()) return false;
  const uint64_t version = weights_ != nullptr ? weights_->header.version() : *on_shards;
  return checkpoints_.Due(trigger, version, EndedLocked(), now);
}

absl::StatusOr<v1::JobCheckpointFile> Job::SaveCheckpoint(
    absl::Time now, std::shared_ptr<const WeightsSnapshot> on_shards) {
  absl::MutexLock lock(&mu_);
  JobCheckpoint tensors;
  if (on_shards == nullptr) {
    MPILEARN_ASSIGN_OR_RETURN(tensors, CheckpointLocked());
  } else if (weights_ != nullptr) {
    return FailedPrecondition(v1::ERROR_REASON_JOB_STATE,
                              absl::StrCat("job ", id_, " has weights of its own, not on shards"));
  } else {
    tensors = WeightsOnlyCheckpoint(*on_shards, stats_.applied);
  }
  checkpoints_.Taken(tensors.weights.header().version(), now);
  v1::JobCheckpointFile file = MakeCheckpointFile(StatusLocked(/*with_history=*/true, now),
                                                  std::move(tensors), queue_.Save(), stats_, now);
  file.set_weights_on_shards(on_shards != nullptr);
  return file;
}

void Job::CheckpointWritten(uint64_t version) {
  absl::MutexLock lock(&mu_);
  checkpoints_.Written(version);
}

absl::Status Job::Resume(v1::JobCheckpointFile checkpoint) {
  const uint64_t version = checkpoint.weights().header().version();
  // A lead's checkpoint of weights on shards: they stay there.
  if (!checkpoint.weights_on_shards()) {
    MPILEARN_RETURN_IF_ERROR(Restore(TakeCheckpointTensors(checkpoint)));
  }
  const v1::JobStatus& status = checkpoint.status();
  absl::MutexLock lock(&mu_);
  MPILEARN_RETURN_IF_ERROR(queue_.Resume(checkpoint.queue(), status));
  stats_.Resume(status);
  stats_.staleness_sum = checkpoint.staleness_sum();
  stats_.staleness_count = checkpoint.staleness_count();
  ReplayValidationsLocked(status);
  ResumeOutcomeLocked(status);
  if (!EndedLocked()) state_ = v1::JOB_STATE_QUEUED;
  checkpoints_.Resumed(version);
  if (!checkpoint.weights_on_shards()) restored_ = {version, NextRestoreToken()};
  return absl::OkStatus();
}

absl::StatusOr<bool> Job::WarmStart(const JobCheckpoint& source,
                                    const v1::TensorSetHeader& layout, bool optimizer_state) {
  if (!optimizer_state) {
    MPILEARN_ASSIGN_OR_RETURN(Float32Tensors weights, FromTensorSet(source.weights));
    return InitWeights(layout, std::move(weights.values));
  }
  absl::StatusOr<DecodedCheckpoint> decoded = DecodeJobCheckpoint(source, spec(), engine_, id_);
  if (!decoded.ok()) {
    return absl::Status(decoded.status().code(),
                        absl::StrCat("warm_start.optimizer_state: ", decoded.status().message()));
  }
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) return false;
  if (EndedLocked()) return NoWeightsError();
  rule_ = std::move(decoded->rule);
  weights_ = std::make_shared<WeightsSnapshot>(std::move(decoded->weights));
  weights_->header = layout;
  weights_->header.set_version(0);
  checkpoints_.Changed();
  return true;
}

absl::Status Job::Rollback(v1::JobCheckpointFile checkpoint) {
  if (checkpoint.weights_on_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", id_, ": a checkpoint of weights on shards has no slice to roll back to"));
  }
  const uint64_t version = checkpoint.weights().header().version();
  MPILEARN_ASSIGN_OR_RETURN(
      DecodedCheckpoint decoded,
      DecodeJobCheckpoint(TakeCheckpointTensors(checkpoint), spec(), engine_, id_));
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) {
    return FailedPrecondition(v1::ERROR_REASON_JOB_ENDED,
                              absl::StrCat("job ", id_, " has ended; nothing to roll back"));
  }
  for (const std::string& group_id : groups_.LiveIds()) {
    GroupTable::Group* group = groups_.Find(group_id);
    ReleaseGroupLocked(group_id, *group);
    group->alive = false;
  }
  rule_ = std::move(decoded.rule);
  weights_ = std::make_shared<WeightsSnapshot>(std::move(decoded.weights));
  spare_snapshots_.clear();
  stats_.Resume(checkpoint.status());
  stats_.staleness_sum = checkpoint.staleness_sum();
  stats_.staleness_count = checkpoint.staleness_count();
  rejected_in_a_row_ = 0;
  checkpoints_.Resumed(version);
  restored_ = {version, NextRestoreToken()};
  RequeueIfOrphanedLocked();
  return absl::OkStatus();
}

Job::RestoreMark Job::restored() const {
  absl::MutexLock lock(&mu_);
  return restored_;
}

void Job::ResumeEnded(const v1::JobStatus& status) {
  if (!JobStateEnded(status.state())) return;
  absl::MutexLock lock(&mu_);
  ResumeOutcomeLocked(status);
  if (weights_ != nullptr) return;
  resumed_version_ = status.version();
  resumed_parameters_ = status.parameters();
  checkpoints_.Written(status.checkpoint_version());
  stats_.Resume(status);
  queue_.ResumeEnded(status);
  validations_.clear();
  ReplayValidationsLocked(status);
}

void Job::ResumeOutcomeLocked(const v1::JobStatus& status) {
  state_ = status.state();
  message_ = status.message();
  stop_reason_ = status.stop_reason();
  if (status.started_unix_seconds() > 0) {
    started_ = absl::FromUnixSeconds(0) + absl::Seconds(status.started_unix_seconds());
  }
  if (status.has_test_loss() || status.has_test_accuracy()) {
    test_result_ = TestResult::Of(status);
  }
}

void Job::ReplayValidationsLocked(const v1::JobStatus& status) {
  for (const v1::ValidationRecord& record : status.validations()) {
    validations_.push_back(record);
    rules_.Add(record);
    const std::optional<double> value = StopRules::ValueOf(schedule_metric_, record);
    if (value.has_value()) schedule_.Observe(*value);
  }
}

int64_t Job::SchedulePositionLocked() const {
  if (schedule_.by_epochs()) return queue_.epochs_done();
  // Without an optimizer here (released at the job's end, or one that
  // never had weights) the updates applied stand for its steps.
  const Optimizer* optimizer = rule_ != nullptr ? rule_->optimizer() : nullptr;
  return optimizer != nullptr ? optimizer->steps() : static_cast<int64_t>(stats_.applied);
}

void Job::ApplyScheduleLocked() {
  if (schedule_.constant() || rule_ == nullptr || rule_->optimizer() == nullptr) return;
  rule_->SetLearningRate(schedule_.RateAt(SchedulePositionLocked()));
}

double Job::LearningRateLocked() const { return schedule_.RateAt(SchedulePositionLocked()); }

}  // namespace mpilearn::server
