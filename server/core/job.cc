// Job (job.h). Over ~500 lines: the job's state machine (groups, data
// queue, updates, checkpoints, stop rules) is one lock's worth of code; the
// parts with state of their own are in GroupTable, DataQueue, UpdateRule and
// StopRules.
#include "server/core/job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/core/store/job_checkpoint.h"

namespace mpilearn::server {
namespace {

static_assert(GroupTable::kNoUnit == DataQueue::kNoUnit,
              "a group's held unit is a unit id of the job's queue");

absl::Status FailedPrecondition(v1::ErrorReason reason,
                                absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message), reason);
}

// A job ended for its wall-time limit (EndIfOverWallTime): its groups'
// next NextDataUnit says DONE, as for a cancelled job (the limit is no
// failure of theirs), where another failure answers JOB_ENDED there.
bool EndedByWallTime(v1::JobState state, const std::string& stop_reason) {
  return state == v1::JOB_STATE_FAILED && absl::StartsWith(stop_reason, kWallTimeStop);
}

}  // namespace

Job::Job(std::string id, JobConfig config, EngineOptions engine)
    : id_(std::move(id)),
      config_(std::move(config)),
      engine_(std::move(engine)),
      update_rule_(UpdateRuleName(spec())),
      groups_(id_),
      queue_(id_, config_),
      rules_(spec()),
      schedule_metric_(StopRules::MetricNamed(spec().optimizer().schedule().metric(), "val_loss")),
      schedule_(spec().optimizer().schedule(), spec().optimizer().learning_rate(),
                !schedule_metric_.lower_is_better),
      checkpoints_(spec().checkpoint()) {}

absl::Status Job::NoWeightsError() const {
  if (EndedLocked()) {
    return FailedPrecondition(
        v1::ERROR_REASON_JOB_ENDED,
        absl::StrCat("job ", id_, " has ended (", v1::JobState_Name(state_),
                     ") and holds no weights in memory; its last weights "
                     "are in its checkpoint (version ",
                     checkpoints_.written_version(), ") under the state "
                     "directory"));
  }
  return FailedPrecondition(
      v1::ERROR_REASON_JOB_STATE,
      absl::StrCat("job ", id_,
                   " has no weights yet; a group must call InitWeights"));
}

v1::JobState Job::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::StatusOr<v1::RegisterGroupResponse> Job::AddGroup(
    const std::string& group_id, int ranks, const std::string& host,
    absl::Time now, GroupTable::Liveness liveness) {
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) {
    return FailedPrecondition(
        v1::ERROR_REASON_JOB_ENDED,
        absl::StrCat("job ", id_, " has already ended (",
                     v1::JobState_Name(state_),
                     "); submit a new job with mpilearnctl submit"));
  }
  groups_.Add(group_id, ranks, host, now, liveness);
  state_ = v1::JOB_STATE_RUNNING;
  if (started_ == absl::InfinitePast()) started_ = now;

  v1::RegisterGroupResponse response;
  response.set_job_id(id_);
  response.set_group_id(group_id);
  *response.mutable_spec() = spec();
  response.set_weights_initialized(weights_ != nullptr);
  response.set_epochs_done(queue_.epochs_done());
  return response;
}

absl::Status Job::Touch(const std::string& group_id, absl::Time now,
                        const v1::GroupTelemetry* telemetry) {
  absl::MutexLock lock(&mu_);
  return groups_.Touch(group_id, now, telemetry);
}

absl::StatusOr<bool> Job::InitWeights(v1::TensorSetHeader header,
                                      std::vector<std::vector<float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(const std::vector<size_t> sizes,
                            CheckInitialWeights(header, values));
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) return false;
  // An ended job's weights may have been released (ReleaseMemory): never
  // install fresh ones in their place.
  if (EndedLocked()) return NoWeightsError();
  MPILEARN_ASSIGN_OR_RETURN(rule_, UpdateRule::Create(spec(), sizes, engine_));
  header.set_version(0);
  weights_ = std::make_shared<WeightsSnapshot>();
  weights_->header = std::move(header);
  weights_->values = std::move(values);
  checkpoints_.Changed();
  return true;
}

absl::StatusOr<v1::TensorSetHeader> Job::Layout() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) return NoWeightsError();
  return weights_->header;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::ApplyGradient(
    const GradientUpdate& update, absl::Time now, AppliedUpdate* applied) {
  // Admission's costly part, the scan, needs no lock. Its maximum feeds the
  // guard, its sums of squares the clipping.
  const UpdateScan scan = ScanUpdate(update.values, ClipsGradients(config_));
  absl::MutexLock lock(&mu_);
  // Every check comes before the first change, so a refused update leaves
  // the job as it was (except stats_.stale_rejected, which counts refusals).
  if (weights_ == nullptr) return NoWeightsError();
  // The group first: a group the job no longer has (lost, or unknown
  // after a master restart, when the job is QUEUED again) must hear that
  // it has to register again, not that the job is not running.
  MPILEARN_ASSIGN_OR_RETURN(GroupTable::Group * group,
                            groups_.Active(update.group_id));
  // Weights frozen (a group still training its unit gets them back and
  // learns the job is done, or failed, at its next NextDataUnit, so every
  // rank of it ends its unit together and the group leaves cleanly: a
  // refusal here would end a downpour rank on its own, and with it a
  // serving group that other jobs wait for), or a push applied already.
  const bool frozen = StoppedLocked() || state_ == v1::JOB_STATE_CANCELLED ||
                      state_ == v1::JOB_STATE_FAILED;
  if (!frozen && state_ != v1::JOB_STATE_RUNNING) {
    return FailedPrecondition(
        EndedLocked() ? v1::ERROR_REASON_JOB_ENDED : v1::ERROR_REASON_JOB_STATE,
        absl::StrCat("job ", id_, " is ", v1::JobState_Name(state_),
                     " and takes no more updates"));
  }
  if (frozen || AlreadyApplied(update, group->applied_sequences)) {
    group->last_seen = now;
    if (applied != nullptr) *applied = UnappliedLocked();
    return std::shared_ptr<const WeightsSnapshot>(weights_);
  }
  absl::StatusOr<Admission> admission =
      AdmitUpdate(update, scan, config_, id_, *weights_);
  if (!admission.ok()) {
    if (IsStaleRefusal(admission.status())) {
      group->last_seen = now;
      ++stats_.stale_rejected;
    }
    return admission.status();
  }
  group->last_seen = now;
  return ApplyAdmittedLocked(update, *admission, *group, now, applied);
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
Job::ApplyAdmittedLocked(const GradientUpdate& update,
                         const Admission& admission, GroupTable::Group& group,
                         absl::Time now, AppliedUpdate* applied) {
  // The update itself, guarded by the rule, timed for the metrics and the
  // trace (from after the copy it may need).
  absl::Time apply_start;
  const uint64_t version = weights_->header.version();
  // The weights before the update, kept when they are not updated in place.
  std::shared_ptr<WeightsSnapshot> before;
  const auto writable =
      [&](bool undoable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (undoable || rule_->replies_with_previous() ||
            HeldElsewhereLocked()) {
          // Copy-on-write: a reply may still be encoding the current
          // snapshot, easgd replies with it, and an undoable update needs it.
          before = weights_;
          CopyOnWriteLocked();
        }
        apply_start = absl::Now();
        return UpdateRule::Writable{&weights_->values,
                                    before == nullptr ? nullptr
                                                      : &before->values};
      };
  ApplyScheduleLocked();
  MPILEARN_ASSIGN_OR_RETURN(
      const UpdateRule::Result result,
      rule_->ApplyGuarded(writable, update.values, admission.scale,
                          admission.max_update));
  if (result.outcome != UpdateRule::Outcome::kApplied) {
    return RejectUpdateLocked(result);
  }
  rejected_in_a_row_ = 0;
  // Buffers (BatchNorm's running statistics) are not trained: whatever the
  // rule did to them, the update's values replace them.
  for (int t = 0; t < weights_->header.tensors_size(); ++t) {
    if (weights_->header.tensors(t).buffer()) weights_->values[t] = update.values[t];
  }
  const absl::Time apply_end = absl::Now();
  weights_->header.set_version(version + 1);
  stats_.Applied(admission.staleness);
  ++group.updates_applied;
  group.applied_sequences[update.rank].Add(update.sequence);
  checkpoints_.Changed();
  if (applied != nullptr) {
    *applied = UnappliedLocked();
    applied->applied = true;
    applied->checkpoint_due = checkpoints_.Due(CheckpointTrigger::kUpdates,
                                               version + 1, false, now);
    applied->staleness = admission.staleness;
    applied->apply_start = apply_start;
    applied->apply_end = apply_end;
    applied->device = engine_.device;
    applied->optimizer = update_rule_;
  }
  // The reply: the new weights, or for easgd the centre before the move.
  return std::shared_ptr<const WeightsSnapshot>(
      rule_->replies_with_previous() ? before : weights_);
}

absl::Status Job::RejectUpdateLocked(const UpdateRule::Result& result) {
  ++stats_.rejected;
  ++rejected_in_a_row_;
  if (result.outcome == UpdateRule::Outcome::kNotUndone) {
    // Applied in place because the rule showed it would stay finite, and
    // yet it did not: nothing to go back to. Cannot happen unless a rule's
    // bound is wrong; the job stops rather than train on NaN.
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat(
        "an update made the weights non-finite and could not be undone "
        "(internal error: the update guard's bound did not hold); lower "
        "optimizer.learning_rate or set optimizer.clip_grad_norm and "
        "resubmit");
    checkpoints_.Changed();
    return WithReason(absl::InternalError(message_), v1::ERROR_REASON_INTERNAL);
  }
  std::string message = absl::StrCat(
      "update refused: applying it would have made job ", id_,
      "'s weights or optimizer state NaN or Inf (it was not applied); lower "
      "optimizer.learning_rate or set optimizer.clip_grad_norm");
  if (result.outcome == UpdateRule::Outcome::kStateLost) {
    // The optimizer's state could not be put back: the job cannot go on.
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat(message, "; restoring the optimizer state failed: ",
                            result.undo_error.message());
  } else if (rejected_in_a_row_ >= kMaxRejectedInARow) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat(
        kMaxRejectedInARow,
        " updates in a row were refused because they would have made the "
        "weights or optimizer state NaN or Inf; the training diverges: "
        "resubmit with a lower optimizer.learning_rate or with "
        "optimizer.clip_grad_norm set");
    checkpoints_.Changed();
    message = message_;
  }
  return WithReason(absl::FailedPreconditionError(message),
                    v1::ERROR_REASON_UPDATE_REJECTED);
}

bool Job::HeldElsewhereLocked() const {
  long owners = weights_.use_count();
  for (const std::shared_ptr<WeightsSnapshot>& spare : spare_snapshots_) {
    if (spare == weights_) --owners;  // the list's own reference
  }
  return owners > 1;
}

void Job::CopyOnWriteLocked() {
  // At most this many snapshots are kept for reuse: one per reply in
  // flight is enough for a few ranks; more would only hold memory.
  constexpr size_t kMaxSpareSnapshots = 4;
  std::shared_ptr<WeightsSnapshot> copy;
  for (std::shared_ptr<WeightsSnapshot>& spare : spare_snapshots_) {
    if (spare.use_count() == 1) {
      copy = spare;
      break;
    }
  }
  if (copy == nullptr) {
    copy = std::make_shared<WeightsSnapshot>(*weights_);
    if (spare_snapshots_.size() < kMaxSpareSnapshots) {
      spare_snapshots_.push_back(copy);
    }
  } else {
    // Same layout (a job's layout never changes): copy in place.
    copy->header = weights_->header;
    for (size_t t = 0; t < copy->values.size(); ++t) {
      std::copy(weights_->values[t].begin(), weights_->values[t].end(),
                copy->values[t].begin());
    }
  }
  weights_ = std::move(copy);
}

std::vector<std::vector<float>> Job::TakeUpdateBuffers(
    const std::vector<int64_t>& counts) {
  std::vector<std::vector<float>> buffers;
  {
    absl::MutexLock lock(&scratch_mu_);
    for (auto it = scratch_.begin(); it != scratch_.end(); ++it) {
      bool fits = it->size() == counts.size();
      for (size_t t = 0; fits && t < counts.size(); ++t) {
        fits = static_cast<int64_t>((*it)[t].size()) == counts[t];
      }
      if (fits) {
        buffers = std::move(*it);
        scratch_.erase(it);
        return buffers;
      }
    }
  }
  buffers.reserve(counts.size());
  for (int64_t count : counts) buffers.emplace_back(static_cast<size_t>(count));
  return buffers;
}

void Job::ReturnUpdateBuffers(std::vector<std::vector<float>> buffers) {
  // One set per rank pushing at once is plenty.
  constexpr size_t kMaxScratchSets = 4;
  absl::MutexLock lock(&scratch_mu_);
  if (scratch_released_) return;  // an ended job keeps no buffers
  if (scratch_.size() < kMaxScratchSets) scratch_.push_back(std::move(buffers));
}

AppliedUpdate Job::UnappliedLocked() const {
  AppliedUpdate update;
  update.weights = weights_;
  update.updates_applied = stats_.applied;
  update.epochs_done = queue_.epochs_done();
  return update;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::Weights() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) return NoWeightsError();
  return std::shared_ptr<const WeightsSnapshot>(weights_);
}

absl::Status Job::RecordEpoch(const v1::EpochRecord& record, absl::Time now) {
  absl::MutexLock lock(&mu_);
  MPILEARN_RETURN_IF_ERROR(queue_.MergeEpochReport(record));
  GroupTable::Group* group = groups_.Find(record.group_id());
  if (group != nullptr) group->last_seen = now;
  checkpoints_.Changed();
  return absl::OkStatus();
}

std::optional<v1::EpochRecord> Job::FinishedEpoch(int32_t epoch) const {
  absl::MutexLock lock(&mu_);
  const std::vector<v1::EpochRecord>& history = queue_.history();
  if (epoch < 1 || static_cast<size_t>(epoch) > history.size()) {
    return std::nullopt;
  }
  return history[epoch - 1];
}

absl::Status Job::RecordValidation(const v1::ValidationRecord& record,
                                   absl::Time now, ValidationEffect* effect) {
  absl::MutexLock lock(&mu_);
  validations_.push_back(record);
  v1::ValidationRecord& stored = validations_.back();
  if (stored.unix_seconds() == 0) {
    stored.set_unix_seconds(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  }
  checkpoints_.Changed();
  const StopRules::Outcome outcome = rules_.Add(stored);
  const std::optional<double> value = StopRules::ValueOf(schedule_metric_, stored);
  if (value.has_value() && schedule_.Observe(*value)) {
    LOG(INFO) << "job " << id_ << ": " << schedule_metric_.name << " on a plateau; learning rate now "
              << schedule_.state().rate();
  }
  ValidationEffect done;
  done.best_improved = outcome.best_improved;
  if (!outcome.stop_reason.empty() && !EndedLocked()) {
    state_ = v1::JOB_STATE_COMPLETED;
    stop_reason_ = outcome.stop_reason;
    message_ = outcome.stop_reason;
    done.stopped = true;
  }
  if (effect != nullptr) *effect = done;
  return absl::OkStatus();
}

absl::Status Job::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) {
    return FailedPrecondition(
        v1::ERROR_REASON_JOB_ENDED,
        absl::StrCat("job ", id_, " has already ended (",
                     v1::JobState_Name(state_), "); nothing to stop"));
  }
  state_ = v1::JOB_STATE_COMPLETED;
  stop_reason_ = reason;
  message_ = reason;
  stop_finished_ = true;  // no test set: see the declaration
  checkpoints_.Changed();
  return absl::OkStatus();
}

absl::Status Job::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) {
    return FailedPrecondition(
        v1::ERROR_REASON_JOB_ENDED,
        absl::StrCat("job ", id_, " has already ended (",
                     v1::JobState_Name(state_), "); nothing to cancel"));
  }
  state_ = v1::JOB_STATE_CANCELLED;
  message_ = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
  checkpoints_.Changed();
  return absl::OkStatus();
}

bool Job::EndIfOverWallTime(absl::Time now) {
  const double limit = spec().max_wall_seconds();
  if (limit <= 0) return false;
  absl::MutexLock lock(&mu_);
  if (state_ != v1::JOB_STATE_RUNNING || started_ == absl::InfinitePast() ||
      now - started_ < absl::Seconds(limit)) {
    return false;
  }
  state_ = v1::JOB_STATE_FAILED;
  stop_reason_ = absl::StrCat(kWallTimeStop, " of ", limit, " s reached");
  message_ = absl::StrCat("ran past its wall-time limit of ", limit,
                          " s (max_wall_seconds), running since ",
                          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", started_, absl::UTCTimeZone()),
                          "; its groups were told to leave");
  checkpoints_.Changed();
  return true;
}

int Job::LiveGroups() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(groups_.Live());
}

bool Job::Releasable() const {
  absl::MutexLock lock(&mu_);
  // A group still training gets its updates dropped with the final
  // weights in the reply (see ApplyGradient): keep them until it leaves.
  // A stop rule's end waits for its finisher only while a group is live:
  // an ended job takes no new group, so once none is left nobody can
  // finish it any more.
  return EndedLocked() && groups_.Live() == 0;
}

bool Job::ReleaseMemory() {
  {
    absl::MutexLock lock(&mu_);
    if (!EndedLocked() || weights_ == nullptr) return false;
    resumed_version_ = weights_->header.version();
    uint64_t parameters = 0;
    for (const auto& v : weights_->values) parameters += v.size();
    resumed_parameters_ = parameters;
    // Snapshots still held by a reply being encoded live on with it.
    weights_.reset();
    rule_.reset();
    spare_snapshots_.clear();
    spare_snapshots_.shrink_to_fit();
  }
  absl::MutexLock lock(&scratch_mu_);
  scratch_released_ = true;
  scratch_.clear();
  scratch_.shrink_to_fit();
  return true;
}

bool Job::MemoryReleased() const {
  absl::MutexLock lock(&mu_);
  return EndedLocked() && weights_ == nullptr && rule_ == nullptr;
}

absl::StatusOr<v1::JobState> Job::Leave(const v1::LeaveRequest& request,
                                        LeaveEffect* effect) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(GroupTable::Group * group,
                            groups_.Registered(request.group_id()));
  const bool was_alive = group->alive;
  // The unit a data error is charged to: the one the group trains.
  const int64_t held_unit = group->held_unit;
  group->alive = false;
  ReleaseGroupLocked(request.group_id(), *group);
  checkpoints_.Changed();
  LeaveEffect done;
  const bool ended = EndedLocked();
  if (StoppedLocked() && was_alive && request.completed() &&
      request.error().empty() && !stop_finished_) {
    // The group that finished a job a stop rule ended.
    stop_finished_ = true;
    if (request.has_test_loss() || request.has_test_accuracy()) {
      test_result_ = TestResult::Of(request);
      done.test_result_recorded = true;
    }
  } else if (ended || !was_alive) {
    // A group that was declared lost (or leaves twice), or one leaving a job
    // that already ended, changes nothing: the job may be serving another
    // group by now, or its outcome is settled.
    // An ended job keeps the message that explains its outcome.
    if (!ended && !request.error().empty()) {
      message_ = absl::StrCat("group ", request.group_id(),
                              " (no longer active) reported: ", request.error());
    }
  } else if (!request.error().empty() && request.data_error() &&
             held_unit != GroupTable::kNoUnit) {
    // Its units are back in the queue; another group may read them.
    done.ended =
        DataErrorLocked(request.group_id(), held_unit, request.error());
  } else if (!request.error().empty()) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat("group ", request.group_id(),
                            " failed: ", request.error());
    done.ended = true;
  } else if (request.completed() && state_ == v1::JOB_STATE_RUNNING) {
    state_ = v1::JOB_STATE_COMPLETED;
    if (request.has_test_loss() || request.has_test_accuracy()) {
      test_result_ = TestResult::Of(request);
    }
    done.ended = true;
  } else {
    if (!request.abandoned().empty()) {
      message_ = absl::StrCat("group ", request.group_id(),
                              " left without finishing: ", request.abandoned());
    }
    RequeueIfOrphanedLocked();
  }
  if (effect != nullptr) *effect = done;
  return state_;
}

bool Job::DataErrorLocked(const std::string& group_id, int64_t unit_id,
                          const std::string& error) {
  const DataQueue::Failure failure = queue_.UnitFailed(unit_id, error);
  const std::string bounded = DataQueue::BoundDataError(error);
  if (failure.exhausted) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat(queue_.Describe(unit_id), " failed ",
                            failure.unit_failures, " times: ", bounded);
    return true;
  }
  if (groups_.Live() == 0) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat("group ", group_id, " failed: ", bounded,
                            " (no other group serves the job to retry unit ",
                            unit_id, ")");
    return true;
  }
  message_ = absl::StrCat("group ", group_id, " could not train ",
                          queue_.Describe(unit_id), " (failure ",
                          failure.unit_failures, " of ",
                          queue_.max_unit_failures(),
                          " allowed); another group retries it");
  return false;
}

int Job::ReapLostGroups(absl::Time now, absl::Duration timeout,
                        std::vector<std::string>* lost_lines) {
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> lost = groups_.ReapLost(now, timeout);
  for (const std::string& group_id : lost) {
    GroupTable::Group& group = *groups_.Find(group_id);
    ReleaseGroupLocked(group_id, group);
    message_ = absl::StrCat("group ", group_id, " lost ",
                            GroupTable::LostAfterText(group, timeout));
    if (lost_lines != nullptr) lost_lines->push_back(message_);
  }
  if (!lost.empty()) RequeueIfOrphanedLocked();
  return static_cast<int>(lost.size());
}

absl::StatusOr<v1::NextDataUnitResponse> Job::NextDataUnit(
    const v1::NextDataUnitRequest& request, absl::Time now) {
  const std::string& group_id = request.group_id();
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(GroupTable::Group * group, groups_.Active(group_id));
  const bool wall_time = EndedByWallTime(state_, stop_reason_);
  if (state_ == v1::JOB_STATE_FAILED && !wall_time) {
    return FailedPrecondition(
        v1::ERROR_REASON_JOB_ENDED,
        absl::StrCat("job ", id_, " has FAILED (", message_, ")"));
  }
  if (state_ == v1::JOB_STATE_COMPLETED ||
      state_ == v1::JOB_STATE_CANCELLED || wall_time) {
    group->last_seen = now;
    if (request.has_telemetry()) group->telemetry = request.telemetry();
    return DoneLocked(group_id, *group);
  }
  // Every check comes before the first change, so a refused request leaves
  // the job as it was.
  MPILEARN_RETURN_IF_ERROR(queue_.Check(request, group->held_unit));

  group->last_seen = now;
  if (request.has_telemetry()) group->telemetry = request.telemetry();
  v1::NextDataUnitResponse response;
  // The rate of the updates just made, for the epochs they finish.
  const double rate = LearningRateLocked();
  const DataQueue::Completed completed = queue_.Accept(
      request, now, stats_.applied, response.mutable_finished_epochs());
  for (const int32_t epoch : response.finished_epochs()) {
    queue_.SetEpochLearningRate(epoch + 1, rate);  // finished_epochs are 0-based
  }
  if (completed.units > 0) group->held_unit = GroupTable::kNoUnit;
  group->units_completed += completed.units;
  group->samples_trained += completed.samples;
  checkpoints_.Changed(completed.units);

  if (queue_.done()) {
    // Every unit of every epoch is done. The group that completed the last
    // one finishes the job; if it left or was lost (ReleaseGroupLocked
    // cleared finisher_), the next group to ask does.
    if (finisher_.empty()) finisher_ = group_id;
    response.set_action(v1::NextDataUnitResponse::DONE);
    response.set_finish(finisher_ == group_id);
  } else {
    // A group holding a reservation is never here with the data done: the
    // reserved unit is not completed. That unit is trained next, read ahead
    // or not; otherwise the queue hands one out.
    int64_t unit = group->reserved_unit;
    group->reserved_unit = GroupTable::kNoUnit;
    if (unit == GroupTable::kNoUnit) unit = queue_.HandOut(now);
    if (unit != DataQueue::kNoUnit) {
      group->held_unit = unit;
      response.set_action(v1::NextDataUnitResponse::TRAIN);
      *response.mutable_unit() = queue_.Unit(unit);
      if (request.read_ahead()) {
        // The unit after it, for the group to read while it trains this
        // one; none when every other unit that may go out now is held.
        const int64_t next = queue_.HandOut(now);
        if (next != DataQueue::kNoUnit) {
          group->reserved_unit = next;
          *response.mutable_next_unit() = queue_.Unit(next);
        }
      }
    } else {
      // Every unit that may be handed out now is held by another group.
      response.set_action(v1::NextDataUnitResponse::WAIT);
    }
  }
  *response.mutable_progress() = ProgressLocked();
  return response;
}

v1::NextDataUnitResponse Job::DoneLocked(const std::string& group_id,
                                         GroupTable::Group& group) {
  v1::NextDataUnitResponse response;
  response.set_action(v1::NextDataUnitResponse::DONE);
  if (state_ == v1::JOB_STATE_CANCELLED || EndedByWallTime(state_, stop_reason_)) {
    // Nobody finishes a cancelled job; what the group held is dropped.
    group.ReleaseUnits();
  } else if (StoppedLocked()) {
    // A stop rule ended the job: the units the group held (trained and
    // reserved) are dropped, and one group finishes the job (test set,
    // Leave(completed)).
    group.ReleaseUnits();
    if (!stop_finished_) {
      if (finisher_.empty()) finisher_ = group_id;
      response.set_finish(finisher_ == group_id);
    }
  }
  *response.mutable_progress() = ProgressLocked();
  return response;
}

void Job::ReleaseGroupLocked(const std::string& group_id,
                             GroupTable::Group& group) {
  // Held first, then reserved: the order they were handed out.
  for (const int64_t unit : group.ReleaseUnits()) {
    if (!EndedLocked()) queue_.GiveBack(unit);
  }
  if (finisher_ == group_id) finisher_.clear();
}

void Job::RequeueIfOrphanedLocked() {
  if (state_ == v1::JOB_STATE_RUNNING && groups_.Live() == 0) {
    state_ = v1::JOB_STATE_QUEUED;
  }
}

v1::JobStatus Job::Status(bool with_history, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return StatusLocked(with_history, now);
}

JobMetricsView Job::MetricsView(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  JobMetricsView view;
  view.status = StatusLocked(/*with_history=*/false, now);
  if (!validations_.empty()) {
    *view.status.add_validations() = validations_.back();
  }
  view.validations = validations_.size();
  return view;
}

v1::JobStatus Job::StatusLocked(bool with_history, absl::Time now) const {
  v1::JobStatus status;
  status.set_job_id(id_);
  *status.mutable_spec() = spec();
  status.set_state(state_);
  status.set_message(message_);
  status.set_stop_reason(stop_reason_);
  if (weights_ != nullptr) {
    status.set_version(weights_->header.version());
    uint64_t parameters = 0;
    for (const auto& v : weights_->values) parameters += v.size();
    status.set_parameters(parameters);
  } else {
    status.set_version(resumed_version_);
    status.set_parameters(resumed_parameters_);
  }
  status.set_checkpoint_version(checkpoints_.written_version());
  if (started_ != absl::InfinitePast()) {
    status.set_started_unix_seconds(absl::ToDoubleSeconds(started_ - absl::UnixEpoch()));
  }
  status.set_learning_rate(LearningRateLocked());
  if (rules_.best_value().has_value()) {
    status.set_best_metric_value(*rules_.best_value());
  }
  stats_.FillStatus(&status);
  queue_.FillStatus(with_history, &status);
  if (with_history) {
    for (const auto& record : validations_) *status.add_validations() = record;
  }
  groups_.FillStatus(now, &status);
  if (test_result_.has_value()) {
    status.set_test_loss(test_result_->loss);
    if (test_result_->accuracy.has_value()) {
      status.set_test_accuracy(*test_result_->accuracy);
    }
    status.mutable_test_metrics()->insert(test_result_->metrics.begin(),
                                          test_result_->metrics.end());
  }
  return status;
}

}  // namespace mpilearn::server
