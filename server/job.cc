#include "server/job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {

Job::Job(std::string id, v1::JobSpec spec, EngineOptions engine)
    : id_(std::move(id)), spec_(std::move(spec)), engine_(std::move(engine)) {}

v1::JobState Job::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::StatusOr<v1::RegisterGroupResponse> Job::AddGroup(
    const std::string& group_id, int ranks, const std::string& host,
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (state_ == v1::JOB_STATE_COMPLETED || state_ == v1::JOB_STATE_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " has already ended (",
                     v1::JobState_Name(state_),
                     "); submit a new job with mpilearnctl submit"));
  }
  Group& group = groups_[group_id];
  group.ranks = ranks;
  group.host = host;
  group.last_seen = now;
  group.alive = true;
  state_ = v1::JOB_STATE_RUNNING;

  v1::RegisterGroupResponse response;
  response.set_job_id(id_);
  response.set_group_id(group_id);
  *response.mutable_spec() = spec_;
  response.set_weights_initialized(weights_ != nullptr);
  response.set_epochs_done(static_cast<int32_t>(history_.size()));
  return response;
}

absl::Status Job::Touch(const std::string& group_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(group_id);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "group '", group_id, "' is not registered with job ", id_,
        "; call RegisterGroup first"));
  }
  if (!it->second.alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group_id, " of job ", id_,
        " was declared lost or has left; restart the group to rejoin"));
  }
  it->second.last_seen = now;
  return absl::OkStatus();
}

absl::StatusOr<bool> Job::InitWeights(v1::TensorSetHeader header,
                                      std::vector<std::vector<float>> values) {
  if (header.tensors_size() == 0) {
    return absl::InvalidArgumentError("initial weights hold no tensors");
  }
  std::vector<size_t> sizes;
  for (const auto& v : values) sizes.push_back(v.size());
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) return false;
  MPILEARN_ASSIGN_OR_RETURN(optimizer_,
                            CreateOptimizer(spec_.optimizer(), sizes, engine_));
  header.set_version(0);
  weights_ = std::make_shared<WeightsSnapshot>();
  weights_->header = std::move(header);
  weights_->values = std::move(values);
  return true;
}

absl::StatusOr<v1::TensorSetHeader> Job::Layout() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id_, " has no weights yet; a group must call InitWeights"));
  }
  return weights_->header;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::ApplyGradient(
    const GradientUpdate& update, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id_, " has no weights yet; a group must call InitWeights"));
  }
  if (state_ != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " is ", v1::JobState_Name(state_),
                     " and takes no more updates"));
  }
  auto group = groups_.find(update.group_id);
  if (group == groups_.end() || !group->second.alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", update.group_id, " is not an active group of job ", id_,
        "; restart the group to rejoin"));
  }
  group->second.last_seen = now;
  if (update.values.size() != weights_->values.size()) {
    return absl::InvalidArgumentError("gradient does not match the weights");
  }
  // Copy-on-write: a reply may still be encoding the current snapshot.
  if (weights_.use_count() > 1) {
    weights_ = std::make_shared<WeightsSnapshot>(*weights_);
  }
  std::vector<absl::Span<float>> params;
  std::vector<absl::Span<const float>> grads;
  params.reserve(update.values.size());
  grads.reserve(update.values.size());
  for (size_t i = 0; i < update.values.size(); ++i) {
    params.emplace_back(weights_->values[i]);
    grads.emplace_back(update.values[i]);
  }
  MPILEARN_RETURN_IF_ERROR(optimizer_->Step(params, grads));
  weights_->header.set_version(weights_->header.version() + 1);
  ++updates_applied_;
  samples_trained_ += update.samples;
  return std::shared_ptr<const WeightsSnapshot>(weights_);
}

absl::StatusOr<JobCheckpoint> Job::Checkpoint() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id_, " has no weights yet; a group must call InitWeights"));
  }
  JobCheckpoint checkpoint;
  checkpoint.weights = ToTensorSet(weights_->header, weights_->values);
  MPILEARN_ASSIGN_OR_RETURN(OptimizerState state, optimizer_->SaveState());
  const std::vector<std::string> buffers = StateBufferNames(optimizer_->config());
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (int t = 0; t < weights_->header.tensors_size(); ++t) {
      const v1::TensorInfo& info = weights_->header.tensors(t);
      names.push_back(absl::StrCat(buffers[b], "/", info.name()));
      shapes.emplace_back(info.shape().begin(), info.shape().end());
      values.push_back(std::move(state.buffers[b][t]));
    }
  }
  checkpoint.optimizer_state = ToTensorSet(
      MakeFloat32Header(static_cast<uint64_t>(state.steps), names, shapes),
      values);
  return checkpoint;
}

absl::Status Job::Restore(const JobCheckpoint& checkpoint) {
  MPILEARN_ASSIGN_OR_RETURN(Float32Tensors weights,
                            FromTensorSet(checkpoint.weights));
  MPILEARN_ASSIGN_OR_RETURN(Float32Tensors saved,
                            FromTensorSet(checkpoint.optimizer_state));
  std::vector<size_t> sizes;
  for (const auto& v : weights.values) sizes.push_back(v.size());
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                            CreateOptimizer(spec_.optimizer(), sizes, engine_));
  const std::vector<std::string> buffers = StateBufferNames(optimizer->config());
  if (saved.values.size() != buffers.size() * sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state holds ", saved.values.size(), " tensors; ",
        optimizer->name(), " over ", sizes.size(), " weight tensors needs ",
        buffers.size() * sizes.size()));
  }
  OptimizerState state;
  state.steps = static_cast<int64_t>(saved.header.version());
  state.buffers.resize(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = b * sizes.size() + t;
      const std::string want = absl::StrCat(
          buffers[b], "/", weights.header.tensors(static_cast<int>(t)).name());
      if (saved.header.tensors(static_cast<int>(k)).name() != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state tensor ", k, " is '",
            saved.header.tensors(static_cast<int>(k)).name(), "'; expected '",
            want, "'"));
      }
      state.buffers[b].push_back(std::move(saved.values[k]));
    }
  }
  MPILEARN_RETURN_IF_ERROR(optimizer->RestoreState(state));
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " already has weights"));
  }
  optimizer_ = std::move(optimizer);
  weights_ = std::make_shared<WeightsSnapshot>();
  weights_->header = std::move(weights.header);
  weights_->values = std::move(weights.values);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::Weights() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id_, " has no weights yet; a group must call InitWeights"));
  }
  return std::shared_ptr<const WeightsSnapshot>(weights_);
}

absl::Status Job::RecordEpoch(const v1::EpochRecord& record, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto group = groups_.find(record.group_id());
  if (group != groups_.end()) group->second.last_seen = now;
  v1::EpochRecord stored = record;
  stored.set_updates_applied(updates_applied_);
  history_.push_back(std::move(stored));
  return absl::OkStatus();
}

absl::StatusOr<v1::JobState> Job::Leave(const v1::LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  auto group = groups_.find(request.group_id());
  if (group == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("group '", request.group_id(),
                     "' is not registered with job ", id_));
  }
  const bool was_alive = group->second.alive;
  group->second.alive = false;
  const bool ended =
      state_ == v1::JOB_STATE_COMPLETED || state_ == v1::JOB_STATE_FAILED;
  if (ended || !was_alive) {
    // A group that was declared lost (or leaves twice), or one leaving a job
    // that already ended, changes nothing: the job may be serving another
    // group by now, or its outcome is settled.
    if (!request.error().empty()) {
      message_ = absl::StrCat("group ", request.group_id(),
                              " (no longer active) reported: ", request.error());
    }
  } else if (!request.error().empty()) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat("group ", request.group_id(),
                            " failed: ", request.error());
  } else if (request.completed() && state_ == v1::JOB_STATE_RUNNING) {
    state_ = v1::JOB_STATE_COMPLETED;
    if (request.has_test_accuracy()) {
      has_test_result_ = true;
      test_loss_ = request.test_loss();
      test_accuracy_ = request.test_accuracy();
    }
  } else {
    RequeueIfOrphanedLocked();
  }
  return state_;
}

int Job::ReapLostGroups(absl::Time now, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  int lost = 0;
  for (auto& [group_id, group] : groups_) {
    if (group.alive && now - group.last_seen > timeout) {
      group.alive = false;
      ++lost;
      message_ = absl::StrCat("group ", group_id, " lost after ",
                              absl::FormatDuration(timeout),
                              " without contact");
    }
  }
  if (lost > 0) RequeueIfOrphanedLocked();
  return lost;
}

int Job::LiveGroupsLocked() const {
  int live = 0;
  for (const auto& entry : groups_) live += entry.second.alive ? 1 : 0;
  return live;
}

void Job::RequeueIfOrphanedLocked() {
  if (state_ == v1::JOB_STATE_RUNNING && LiveGroupsLocked() == 0) {
    state_ = v1::JOB_STATE_QUEUED;
  }
}

v1::JobStatus Job::Status(bool with_history, absl::Time now) const {
  v1::JobStatus status;
  status.set_job_id(id_);
  *status.mutable_spec() = spec_;
  absl::MutexLock lock(&mu_);
  status.set_state(state_);
  status.set_message(message_);
  if (weights_ != nullptr) {
    status.set_version(weights_->header.version());
    uint64_t parameters = 0;
    for (const auto& v : weights_->values) parameters += v.size();
    status.set_parameters(parameters);
  }
  status.set_updates_applied(updates_applied_);
  status.set_samples_trained(samples_trained_);
  status.set_epochs_done(static_cast<int32_t>(history_.size()));
  if (with_history) {
    for (const auto& record : history_) *status.add_history() = record;
  }
  for (const auto& [group_id, group] : groups_) {
    v1::GroupInfo* info = status.add_groups();
    info->set_group_id(group_id);
    info->set_ranks(group.ranks);
    info->set_host(group.host);
    info->set_alive(group.alive);
    info->set_seconds_since_seen(absl::ToDoubleSeconds(now - group.last_seen));
  }
  if (has_test_result_) {
    status.set_test_loss(test_loss_);
    status.set_test_accuracy(test_accuracy_);
  }
  return status;
}

}  // namespace mpilearn::server
