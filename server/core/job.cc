#include "server/core/job.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {
namespace {

// What pushes to a job of `algorithm` carry. Anything but easgd and gem
// (NormalizeJobSpec admits only downpour and sync besides) is a gradient.
v1::UpdateKind UpdateKindFor(const std::string& algorithm) {
  if (algorithm == "easgd") return v1::UPDATE_KIND_ELASTIC;
  if (algorithm == "gem") return v1::UPDATE_KIND_DELTA;
  return v1::UPDATE_KIND_GRADIENT;
}

// Index of the first tensor holding NaN or Inf, or -1.
int FirstNonFinite(const std::vector<std::vector<float>>& values) {
  for (size_t t = 0; t < values.size(); ++t) {
    float sum = 0.0f;  // NaN/Inf anywhere makes the sum non-finite
    for (float x : values[t]) sum += x * 0.0f;
    if (!std::isfinite(sum)) return static_cast<int>(t);
  }
  return -1;
}

// `what` names the tensors ("gradient", "update", "initial weight").
absl::Status NonFiniteError(absl::string_view what, absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " tensor '", name,
      "' contains NaN or Inf; lower the learning rate or check the loss for "
      "overflow"));
}

absl::Status NoWeightsError(const std::string& job_id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job_id, " has no weights yet; a group must call InitWeights"));
}

absl::Status InactiveGroupError(const std::string& job_id,
                                const std::string& group_id) {
  return absl::FailedPreconditionError(
      absl::StrCat("group ", group_id, " is not an active group of job ",
                   job_id, "; restart the group to rejoin"));
}

// Builds the optimizer `spec` describes for `weights` with the state that
// Job::Checkpoint saved in `saved` (whose tensors it moves from).
absl::StatusOr<std::unique_ptr<Optimizer>> RestoreOptimizer(
    const v1::OptimizerSpec& spec, const EngineOptions& engine,
    const Float32Tensors& weights, Float32Tensors& saved) {
  std::vector<size_t> sizes;
  for (const auto& v : weights.values) sizes.push_back(v.size());
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                            CreateOptimizer(spec, sizes, engine));
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
  return optimizer;
}

double ToUnixSecondsDouble(absl::Time time) {
  return absl::ToDoubleSeconds(time - absl::UnixEpoch());
}

absl::Time FromUnixSecondsDouble(double seconds) {
  return absl::UnixEpoch() + absl::Seconds(seconds);
}

absl::Status BadQueueError(const std::string& job_id, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "checkpoint of job ", job_id, " has an inconsistent data queue: ", what));
}

}  // namespace

std::string UpdateRuleName(const v1::JobSpec& spec) {
  if (UpdateKindFor(spec.algorithm()) != v1::UPDATE_KIND_GRADIENT) {
    return spec.algorithm();
  }
  return spec.optimizer().name();
}

Job::Job(std::string id, v1::JobSpec spec, EngineOptions engine)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      engine_(std::move(engine)),
      update_kind_(UpdateKindFor(spec_.algorithm())),
      update_rule_(UpdateRuleName(spec_)),
      rules_(spec_) {}

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

absl::Status Job::Touch(const std::string& group_id, absl::Time now,
                        const v1::GroupTelemetry* telemetry) {
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
  if (telemetry != nullptr) it->second.telemetry = *telemetry;
  return absl::OkStatus();
}

absl::StatusOr<bool> Job::InitWeights(v1::TensorSetHeader header,
                                      std::vector<std::vector<float>> values) {
  if (header.tensors_size() == 0) {
    return absl::InvalidArgumentError("initial weights hold no tensors");
  }
  // The service assembles `values` from `header`; in-process callers may not.
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> bytes,
                            TensorSetAssembler::ByteSizes(header));
  if (values.size() != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial weights: header lists ", bytes.size(),
                     " tensors but ", values.size(), " were given"));
  }
  std::vector<size_t> sizes;
  for (size_t t = 0; t < values.size(); ++t) {
    const v1::TensorInfo& info = header.tensors(static_cast<int>(t));
    if (info.dtype() != v1::DTYPE_FLOAT32 ||
        values[t].size() * sizeof(float) != bytes[t]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial weight tensor '", info.name(), "' holds ", values[t].size(),
          " fp32 values; its header says ", bytes[t], " bytes of ",
          v1::DType_Name(info.dtype())));
    }
    sizes.push_back(values[t].size());
  }
  const int non_finite = FirstNonFinite(values);
  if (non_finite >= 0) {
    return NonFiniteError("initial weight", header.tensors(non_finite).name());
  }
  absl::MutexLock lock(&mu_);
  if (weights_ != nullptr) return false;
  if (update_kind_ == v1::UPDATE_KIND_GRADIENT) {
    MPILEARN_ASSIGN_OR_RETURN(optimizer_,
                              CreateOptimizer(spec_.optimizer(), sizes, engine_));
  }
  header.set_version(0);
  weights_ = std::make_shared<WeightsSnapshot>();
  weights_->header = std::move(header);
  weights_->values = std::move(values);
  ++changes_;
  return true;
}

absl::StatusOr<v1::TensorSetHeader> Job::Layout() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) return NoWeightsError(id_);
  return weights_->header;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::ApplyGradient(
    const GradientUpdate& update, absl::Time now, AppliedUpdate* applied) {
  // The scan is the costly part of the checks; it needs no lock.
  const int non_finite = FirstNonFinite(update.values);
  absl::MutexLock lock(&mu_);
  // Every check comes before the first change, so a refused update leaves
  // the job as it was (except stale_rejected_, which counts refusals).
  if (weights_ == nullptr) return NoWeightsError(id_);
  if (StoppedLocked()) {
    // The weights are frozen; a group still training its last unit gets
    // them back and learns the job is done at its next NextDataUnit.
    auto group = groups_.find(update.group_id);
    if (group == groups_.end() || !group->second.alive) {
      return InactiveGroupError(id_, update.group_id);
    }
    group->second.last_seen = now;
    if (applied != nullptr) {
      *applied = AppliedUpdate();
      applied->weights = weights_;
      applied->updates_applied = updates_applied_;
      applied->epochs_done = static_cast<int>(history_.size());
    }
    return std::shared_ptr<const WeightsSnapshot>(weights_);
  }
  // The group first: a group the job no longer has (lost, or unknown
  // after a master restart, when the job is QUEUED again) must hear that
  // it has to register again, not that the job is not running.
  auto group = groups_.find(update.group_id);
  if (group == groups_.end() || !group->second.alive) {
    return InactiveGroupError(id_, update.group_id);
  }
  if (state_ != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " is ", v1::JobState_Name(state_),
                     " and takes no more updates"));
  }
  if (update.kind != update_kind_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update of kind ", v1::UpdateKind_Name(update.kind), " sent to job ",
        id_, ", whose algorithm '", spec_.algorithm(), "' takes ",
        v1::UpdateKind_Name(update_kind_)));
  }
  const absl::string_view what =
      update_kind_ == v1::UPDATE_KIND_GRADIENT ? "gradient" : "update";
  const std::vector<std::vector<float>>& weights = weights_->values;
  if (update.values.size() != weights.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", update.values.size(), " tensors; job ",
                     id_, "'s weights hold ", weights.size()));
  }
  for (size_t t = 0; t < weights.size(); ++t) {
    if (update.values[t].size() != weights[t].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " tensor '", weights_->header.tensors(static_cast<int>(t)).name(),
          "' holds ", update.values[t].size(), " values; the weights hold ",
          weights[t].size()));
    }
  }
  if (non_finite >= 0) {
    return NonFiniteError(what, weights_->header.tensors(non_finite).name());
  }
  group->second.last_seen = now;

  const uint64_t version = weights_->header.version();
  const uint64_t staleness =
      update.base_version < version ? version - update.base_version : 0;
  if (spec_.max_staleness() > 0 &&
      staleness > static_cast<uint64_t>(spec_.max_staleness())) {
    ++stale_rejected_;
    return absl::AbortedError(absl::StrCat(
        "stale update: computed on weight version ", update.base_version,
        ", the master is at ", version, " (staleness ", staleness,
        " > max_staleness ", spec_.max_staleness(),
        "); pull the weights and continue"));
  }
  const float scale =
      spec_.staleness_scaling() == "inverse" && staleness > 1
          ? static_cast<float>(1.0 / static_cast<double>(staleness))
          : 1.0f;

  // The reply: the new weights, or for easgd the centre before the move.
  std::shared_ptr<const WeightsSnapshot> reply;
  if (update_kind_ == v1::UPDATE_KIND_ELASTIC) {
    reply = weights_;
    weights_ = std::make_shared<WeightsSnapshot>(*weights_);
  } else if (weights_.use_count() > 1) {
    // Copy-on-write: a reply may still be encoding the current snapshot.
    weights_ = std::make_shared<WeightsSnapshot>(*weights_);
  }
  std::vector<std::vector<float>>& params = weights_->values;
  // The update itself, timed for the metrics and the trace.
  const absl::Time apply_start = absl::Now();
  switch (update_kind_) {
    case v1::UPDATE_KIND_GRADIENT: {
      std::vector<absl::Span<float>> param_spans;
      std::vector<absl::Span<const float>> grads;
      param_spans.reserve(params.size());
      grads.reserve(params.size());
      if (scale != 1.0f) scaled_.resize(params.size());
      for (size_t t = 0; t < params.size(); ++t) {
        param_spans.emplace_back(params[t]);
        if (scale == 1.0f) {
          grads.emplace_back(update.values[t]);
          continue;
        }
        const std::vector<float>& g = update.values[t];
        std::vector<float>& scaled = scaled_[t];
        scaled.resize(g.size());
        for (size_t i = 0; i < g.size(); ++i) scaled[i] = scale * g[i];
        grads.emplace_back(scaled);
      }
      MPILEARN_RETURN_IF_ERROR(optimizer_->Step(param_spans, grads));
      break;
    }
    case v1::UPDATE_KIND_ELASTIC: {
      // c += alpha * (x - c); the rank makes the opposite move itself.
      const float alpha = static_cast<float>(spec_.easgd().alpha() * scale);
      for (size_t t = 0; t < params.size(); ++t) {
        float* c = params[t].data();
        const float* x = update.values[t].data();
        for (size_t i = 0; i < params[t].size(); ++i) c[i] += alpha * (x[i] - c[i]);
      }
      break;
    }
    default: {  // UPDATE_KIND_DELTA
      for (size_t t = 0; t < params.size(); ++t) {
        float* c = params[t].data();
        const float* d = update.values[t].data();
        for (size_t i = 0; i < params[t].size(); ++i) c[i] += scale * d[i];
      }
      break;
    }
  }
  const absl::Time apply_end = absl::Now();
  weights_->header.set_version(version + 1);
  ++updates_applied_;
  ++group->second.updates_applied;
  max_staleness_seen_ = std::max(max_staleness_seen_, staleness);
  staleness_sum_ += staleness;
  ++staleness_count_;
  ++changes_;
  if (reply == nullptr) reply = weights_;
  if (applied != nullptr) {
    applied->applied = true;
    applied->weights = weights_;
    applied->updates_applied = updates_applied_;
    applied->epochs_done = static_cast<int>(history_.size());
    const int64_t every = spec_.checkpoint().every_updates();
    applied->checkpoint_due =
        every > 0 && version + 1 - version_at_checkpoint_ >=
                         static_cast<uint64_t>(every);
    applied->staleness = staleness;
    applied->apply_start = apply_start;
    applied->apply_end = apply_end;
    applied->device = engine_.device;
    applied->optimizer = update_rule_;
  }
  return reply;
}

absl::StatusOr<JobCheckpoint> Job::Checkpoint() const {
  absl::MutexLock lock(&mu_);
  return CheckpointLocked();
}

absl::StatusOr<JobCheckpoint> Job::CheckpointLocked() const {
  if (weights_ == nullptr) return NoWeightsError(id_);
  JobCheckpoint checkpoint;
  checkpoint.weights = ToTensorSet(weights_->header, weights_->values);
  if (optimizer_ == nullptr) {  // easgd, gem: no master optimizer state
    checkpoint.optimizer_state =
        ToTensorSet(MakeFloat32Header(updates_applied_, {}, {}), {});
    return checkpoint;
  }
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
  std::unique_ptr<Optimizer> optimizer;
  if (update_kind_ != v1::UPDATE_KIND_GRADIENT) {
    if (!saved.values.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state holds ", saved.values.size(), " tensors; job ", id_,
          " (", spec_.algorithm(), ") keeps no optimizer state on the master"));
    }
  } else {
    MPILEARN_ASSIGN_OR_RETURN(
        optimizer, RestoreOptimizer(spec_.optimizer(), engine_, weights, saved));
  }
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

bool Job::CheckpointDue(CheckpointTrigger trigger, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) return false;
  const v1::CheckpointSpec& spec = spec_.checkpoint();
  switch (trigger) {
    case CheckpointTrigger::kUpdates:
      return spec.every_updates() > 0 &&
             weights_->header.version() - version_at_checkpoint_ >=
                 static_cast<uint64_t>(spec.every_updates());
    case CheckpointTrigger::kSeconds:
      return spec.every_seconds() > 0 && !EndedLocked() &&
             changes_ != changes_at_checkpoint_ &&
             now - checkpoint_time_ >= absl::Seconds(spec.every_seconds());
    case CheckpointTrigger::kChanges:
      return changes_ != changes_at_checkpoint_;
  }
  return false;
}

absl::StatusOr<v1::JobCheckpointFile> Job::SaveCheckpoint(absl::Time now) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(JobCheckpoint tensors, CheckpointLocked());
  v1::JobCheckpointFile file;
  *file.mutable_status() = StatusLocked(/*with_history=*/true, now);
  *file.mutable_weights() = std::move(tensors.weights);
  *file.mutable_optimizer_state() = std::move(tensors.optimizer_state);
  v1::CheckpointQueue* queue = file.mutable_queue();
  queue->set_train_samples(train_samples_);
  queue->set_next_epoch(next_epoch_);
  queue->set_next_unit(next_unit_);
  for (const auto& [epoch, progress] : open_epochs_) {
    v1::CheckpointEpochProgress* out = queue->add_open_epochs();
    out->set_epoch(epoch);
    for (size_t i = 0; i < progress.completed.size(); ++i) {
      if (progress.completed[i]) {
        out->add_completed_units(epoch * units_per_epoch_ +
                                 static_cast<int64_t>(i));
      }
    }
    out->set_samples(progress.samples);
    out->set_loss_sum(progress.loss_sum);
    out->set_first_handout_unix_seconds(
        ToUnixSecondsDouble(progress.first_handout));
    if (progress.units_completed == units_per_epoch_) {
      out->set_completed_unix_seconds(ToUnixSecondsDouble(progress.completed_at));
      out->set_updates_at_completion(progress.updates_at_completion);
    }
  }
  file.set_staleness_sum(staleness_sum_);
  file.set_staleness_count(staleness_count_);
  file.set_created_unix_seconds(ToUnixSecondsDouble(now));
  version_at_checkpoint_ = weights_->header.version();
  changes_at_checkpoint_ = changes_;
  checkpoint_time_ = now;
  return file;
}

void Job::CheckpointWritten(uint64_t version) {
  absl::MutexLock lock(&mu_);
  checkpoint_version_ = version;
}

absl::Status Job::Resume(v1::JobCheckpointFile checkpoint) {
  JobCheckpoint tensors;
  tensors.weights = std::move(*checkpoint.mutable_weights());
  tensors.optimizer_state = std::move(*checkpoint.mutable_optimizer_state());
  MPILEARN_RETURN_IF_ERROR(Restore(tensors));
  const v1::JobStatus& status = checkpoint.status();
  absl::MutexLock lock(&mu_);
  if (status.history_size() > spec_.epochs()) {
    return BadQueueError(id_, absl::StrCat(status.history_size(),
                                           " epochs recorded of ",
                                           spec_.epochs()));
  }
  history_.assign(status.history().begin(), status.history().end());
  MPILEARN_RETURN_IF_ERROR(ResumeQueueLocked(checkpoint.queue()));
  updates_applied_ = status.updates_applied();
  samples_trained_ = status.samples_trained();
  if (status.has_train_loss()) train_loss_ = status.train_loss();
  stale_rejected_ = status.stale_rejected();
  max_staleness_seen_ = status.max_staleness_seen();
  staleness_sum_ = checkpoint.staleness_sum();
  staleness_count_ = checkpoint.staleness_count();
  units_requeued_ += status.units_requeued();
  for (const v1::ValidationRecord& record : status.validations()) {
    validations_.push_back(record);
    rules_.Add(record);
  }
  has_test_result_ = status.has_test_accuracy();
  test_loss_ = status.test_loss();
  test_accuracy_ = status.test_accuracy();
  message_ = status.message();
  stop_reason_ = status.stop_reason();
  state_ = status.state() == v1::JOB_STATE_COMPLETED ||
                   status.state() == v1::JOB_STATE_FAILED
               ? status.state()
               : v1::JOB_STATE_QUEUED;
  version_at_checkpoint_ = weights_->header.version();
  checkpoint_version_ = version_at_checkpoint_;
  changes_at_checkpoint_ = changes_;
  return absl::OkStatus();
}

absl::Status Job::ResumeQueueLocked(const v1::CheckpointQueue& queue) {
  const int64_t epochs = spec_.epochs();
  const int64_t unit_size = spec_.data_unit_size();
  if (queue.train_samples() == 0) {
    if (queue.next_epoch() != 0 || queue.next_unit() != 0 ||
        queue.open_epochs_size() != 0 || !history_.empty()) {
      return BadQueueError(id_, "progress without train_samples");
    }
    return absl::OkStatus();
  }
  if (queue.train_samples() < 0 || epochs < 1 || unit_size < 1) {
    return BadQueueError(id_, absl::StrCat("train_samples ",
                                           queue.train_samples(), ", epochs ",
                                           epochs, ", data_unit_size ",
                                           unit_size));
  }
  const int64_t samples = queue.train_samples();
  const int64_t per_epoch = samples / unit_size + (samples % unit_size != 0);
  const int64_t recorded = static_cast<int64_t>(history_.size());
  if (queue.next_epoch() < recorded || queue.next_epoch() > epochs ||
      queue.next_unit() < 0 || queue.next_unit() >= per_epoch ||
      (queue.next_epoch() == epochs && queue.next_unit() != 0)) {
    return BadQueueError(id_, absl::StrCat("next unit ", queue.next_unit(),
                                           " of epoch ", queue.next_epoch()));
  }
  train_samples_ = samples;
  units_per_epoch_ = per_epoch;
  next_epoch_ = queue.next_epoch();
  next_unit_ = queue.next_unit();
  // Units of epoch e handed out so far.
  auto handed_out = [this](int64_t epoch) {
    return epoch < next_epoch_ ? units_per_epoch_
                               : epoch == next_epoch_ ? next_unit_ : 0;
  };
  for (const v1::CheckpointEpochProgress& in : queue.open_epochs()) {
    const int32_t epoch = in.epoch();
    if (epoch < recorded || epoch >= epochs || handed_out(epoch) == 0 ||
        open_epochs_.count(epoch) != 0) {
      return BadQueueError(id_, absl::StrCat("open epoch ", epoch));
    }
    EpochProgress& progress = open_epochs_[epoch];
    progress.completed.assign(static_cast<size_t>(units_per_epoch_), false);
    for (int64_t unit_id : in.completed_units()) {
      const int64_t index = unit_id - epoch * units_per_epoch_;
      if (index < 0 || index >= handed_out(epoch) ||
          progress.completed[static_cast<size_t>(index)]) {
        return BadQueueError(
            id_, absl::StrCat("unit ", unit_id, " completed in epoch ", epoch));
      }
      progress.completed[static_cast<size_t>(index)] = true;
      ++progress.units_completed;
    }
    progress.samples = in.samples();
    progress.loss_sum = in.loss_sum();
    progress.first_handout = FromUnixSecondsDouble(in.first_handout_unix_seconds());
    if (progress.units_completed == units_per_epoch_) {
      progress.completed_at = FromUnixSecondsDouble(in.completed_unix_seconds());
      progress.updates_at_completion = in.updates_at_completion();
    }
  }
  // What was handed out and not completed was in flight: hand it out again,
  // oldest first.
  for (int64_t epoch = recorded; epoch < epochs; ++epoch) {
    const int64_t count = handed_out(epoch);
    if (count == 0) break;
    auto progress = open_epochs_.find(static_cast<int32_t>(epoch));
    if (progress == open_epochs_.end()) {
      return BadQueueError(id_, absl::StrCat("epoch ", epoch,
                                             " has units handed out but no "
                                             "progress"));
    }
    for (int64_t i = 0; i < count; ++i) {
      if (progress->second.completed[static_cast<size_t>(i)]) continue;
      requeued_units_.push_back(epoch * units_per_epoch_ + i);
      ++units_requeued_;
    }
  }
  return absl::OkStatus();
}

void Job::ResumeEnded(const v1::JobStatus& status) {
  if (status.state() != v1::JOB_STATE_COMPLETED &&
      status.state() != v1::JOB_STATE_FAILED) {
    return;
  }
  absl::MutexLock lock(&mu_);
  state_ = status.state();
  message_ = status.message();
  stop_reason_ = status.stop_reason();
  if (status.has_test_accuracy()) {
    has_test_result_ = true;
    test_loss_ = status.test_loss();
    test_accuracy_ = status.test_accuracy();
  }
  if (weights_ != nullptr) return;
  resumed_version_ = status.version();
  resumed_parameters_ = status.parameters();
  updates_applied_ = status.updates_applied();
  samples_trained_ = status.samples_trained();
  if (status.has_train_loss()) train_loss_ = status.train_loss();
  stale_rejected_ = status.stale_rejected();
  max_staleness_seen_ = status.max_staleness_seen();
  units_requeued_ = status.units_requeued();
  history_.assign(status.history().begin(), status.history().end());
  validations_.clear();
  for (const v1::ValidationRecord& record : status.validations()) {
    validations_.push_back(record);
    rules_.Add(record);
  }
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Job::Weights() const {
  absl::MutexLock lock(&mu_);
  if (weights_ == nullptr) return NoWeightsError(id_);
  return std::shared_ptr<const WeightsSnapshot>(weights_);
}

absl::Status Job::RecordEpoch(const v1::EpochRecord& record, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (record.epoch() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epoch must be >= 1 (epochs are numbered from 1), got ",
        record.epoch()));
  }
  if (static_cast<size_t>(record.epoch()) > history_.size()) {
    return absl::NotFoundError(absl::StrCat(
        "epoch ", record.epoch(), " of job ", id_, " is not finished (",
        history_.size(),
        " are); report an epoch once NextDataUnit lists it in finished_epochs"));
  }
  auto group = groups_.find(record.group_id());
  if (group != groups_.end()) group->second.last_seen = now;
  v1::EpochRecord& stored = history_[static_cast<size_t>(record.epoch() - 1)];
  stored.set_val_loss(record.val_loss());
  stored.set_val_accuracy(record.val_accuracy());
  stored.set_group_id(record.group_id());
  ++changes_;
  return absl::OkStatus();
}

absl::Status Job::RecordValidation(const v1::ValidationRecord& record,
                                   absl::Time now, ValidationEffect* effect) {
  absl::MutexLock lock(&mu_);
  validations_.push_back(record);
  v1::ValidationRecord& stored = validations_.back();
  if (stored.unix_seconds() == 0) {
    stored.set_unix_seconds(ToUnixSecondsDouble(now));
  }
  ++changes_;
  const StopRules::Outcome outcome = rules_.Add(stored);
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

absl::StatusOr<v1::JobState> Job::Leave(const v1::LeaveRequest& request,
                                        LeaveEffect* effect) {
  absl::MutexLock lock(&mu_);
  auto group = groups_.find(request.group_id());
  if (group == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("group '", request.group_id(),
                     "' is not registered with job ", id_));
  }
  const bool was_alive = group->second.alive;
  group->second.alive = false;
  ReleaseGroupLocked(request.group_id(), group->second);
  ++changes_;
  LeaveEffect done;
  const bool ended = EndedLocked();
  if (StoppedLocked() && was_alive && request.completed() &&
      request.error().empty() && !stop_finished_) {
    // The group that finished a job a stop rule ended.
    stop_finished_ = true;
    if (request.has_test_accuracy()) {
      has_test_result_ = true;
      test_loss_ = request.test_loss();
      test_accuracy_ = request.test_accuracy();
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
  } else if (!request.error().empty()) {
    state_ = v1::JOB_STATE_FAILED;
    message_ = absl::StrCat("group ", request.group_id(),
                            " failed: ", request.error());
    done.ended = true;
  } else if (request.completed() && state_ == v1::JOB_STATE_RUNNING) {
    state_ = v1::JOB_STATE_COMPLETED;
    if (request.has_test_accuracy()) {
      has_test_result_ = true;
      test_loss_ = request.test_loss();
      test_accuracy_ = request.test_accuracy();
    }
    done.ended = true;
  } else {
    RequeueIfOrphanedLocked();
  }
  if (effect != nullptr) *effect = done;
  return state_;
}

int Job::ReapLostGroups(absl::Time now, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  int lost = 0;
  for (auto& [group_id, group] : groups_) {
    if (group.alive && now - group.last_seen > timeout) {
      group.alive = false;
      ReleaseGroupLocked(group_id, group);
      ++lost;
      message_ = absl::StrCat("group ", group_id, " lost after ",
                              absl::FormatDuration(timeout),
                              " without contact");
    }
  }
  if (lost > 0) RequeueIfOrphanedLocked();
  return lost;
}

absl::StatusOr<v1::NextDataUnitResponse> Job::NextDataUnit(
    const v1::NextDataUnitRequest& request, absl::Time now) {
  const std::string& group_id = request.group_id();
  absl::MutexLock lock(&mu_);
  auto found = groups_.find(group_id);
  if (found == groups_.end() || !found->second.alive) {
    return InactiveGroupError(id_, group_id);
  }
  Group& group = found->second;
  if (state_ == v1::JOB_STATE_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id_, " has FAILED (", message_, ")"));
  }
  v1::NextDataUnitResponse response;
  if (state_ == v1::JOB_STATE_COMPLETED) {
    group.last_seen = now;
    if (request.has_telemetry()) group.telemetry = request.telemetry();
    response.set_action(v1::NextDataUnitResponse::DONE);
    if (StoppedLocked()) {
      // A stop rule ended the job: the unit the group trained is dropped,
      // and one group finishes the job (test set, Leave(completed)).
      group.held_unit = kNoUnit;
      if (!stop_finished_) {
        if (finisher_.empty()) finisher_ = group_id;
        response.set_finish(finisher_ == group_id);
      }
    }
    *response.mutable_progress() = ProgressLocked();
    return response;
  }

  // Every check comes before the first change, so a refused request leaves
  // the job as it was.
  const int64_t epochs = spec_.epochs();
  const int64_t unit_size = spec_.data_unit_size();
  if (epochs < 1 || unit_size < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id_, " has epochs ", epochs, " and data_unit_size ", unit_size,
        "; its spec was not normalized (NormalizeJobSpec)"));
  }
  const int64_t asked = request.train_samples();
  if (asked < 0 || (asked == 0 && train_samples_ == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_samples must be > 0 (the training samples group ", group_id,
        " sees after train_limit and the validation hold-out), got ", asked));
  }
  if (train_samples_ != 0 && asked != 0 && asked != train_samples_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group_id, " sees ", asked, " samples but job ", id_, " has ",
        train_samples_,
        "; do all groups read the same data files with the same train_limit?"));
  }
  const int64_t samples = train_samples_ != 0 ? train_samples_ : asked;
  const int64_t units_per_epoch =
      samples / unit_size + (samples % unit_size != 0 ? 1 : 0);
  if (units_per_epoch > std::numeric_limits<int64_t>::max() / epochs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_samples ", samples, " in units of ", unit_size, " over ", epochs,
        " epochs makes too many data units; raise data_unit_size"));
  }
  bool listed_held = false;
  for (const v1::CompletedUnit& done : request.completed()) {
    if (group.held_unit == kNoUnit || done.unit_id() != group.held_unit ||
        listed_held) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", group_id, " lists unit ", done.unit_id(),
          " as completed but ",
          group.held_unit == kNoUnit
              ? std::string("holds no unit")
              : absl::StrCat("holds unit ", group.held_unit,
                             listed_held ? ", already listed" : "")));
    }
    listed_held = true;
    const v1::DataUnit unit = UnitLocked(done.unit_id());
    const uint64_t unit_samples = static_cast<uint64_t>(unit.end() - unit.begin());
    if (done.samples() != unit_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unit ", done.unit_id(), " covers ", unit_samples,
          " samples but group ", group_id, " reports ", done.samples()));
    }
  }
  if (group.held_unit != kNoUnit && !listed_held) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", group_id, " still holds unit ", group.held_unit,
        "; list it in completed"));
  }

  group.last_seen = now;
  if (request.has_telemetry()) group.telemetry = request.telemetry();
  if (train_samples_ == 0) {
    train_samples_ = samples;
    units_per_epoch_ = units_per_epoch;
  }
  uint64_t request_samples = 0;
  double request_loss_sum = 0.0;
  for (const v1::CompletedUnit& done : request.completed()) {
    const int32_t epoch = static_cast<int32_t>(done.unit_id() / units_per_epoch_);
    EpochProgress& progress = open_epochs_[epoch];
    if (progress.completed.empty()) {
      progress.completed.assign(static_cast<size_t>(units_per_epoch_), false);
    }
    progress.completed[static_cast<size_t>(done.unit_id() % units_per_epoch_)] =
        true;
    ++progress.units_completed;
    ++changes_;
    progress.samples += done.samples();
    progress.loss_sum += done.loss_sum();
    if (progress.units_completed == units_per_epoch_) {
      progress.completed_at = now;
      progress.updates_at_completion = updates_applied_;
    }
    ++group.units_completed;
    group.samples_trained += done.samples();
    samples_trained_ += done.samples();
    group.held_unit = kNoUnit;
    request_samples += done.samples();
    request_loss_sum += done.loss_sum();
  }
  if (request_samples > 0) {
    train_loss_ = request_loss_sum / static_cast<double>(request_samples);
  }
  RecordCompletedEpochsLocked(response.mutable_finished_epochs());

  if (static_cast<int64_t>(history_.size()) >= epochs) {
    // Every unit of every epoch is done. The group that completed the last
    // one finishes the job; if it left or was lost (ReleaseGroupLocked
    // cleared finisher_), the next group to ask does.
    if (finisher_.empty()) finisher_ = group_id;
    response.set_action(v1::NextDataUnitResponse::DONE);
    response.set_finish(finisher_ == group_id);
    *response.mutable_progress() = ProgressLocked();
    return response;
  }
  int64_t unit = kNoUnit;
  if (!requeued_units_.empty()) {
    unit = requeued_units_.front();
    requeued_units_.pop_front();
  } else if (next_epoch_ < epochs &&
             next_epoch_ <= static_cast<int64_t>(history_.size()) + 1) {
    // next_epoch_ is at most one past the oldest unfinished epoch.
    unit = next_epoch_ * units_per_epoch_ + next_unit_;
    if (next_unit_ == 0) open_epochs_[next_epoch_].first_handout = now;
    if (++next_unit_ == units_per_epoch_) {
      ++next_epoch_;
      next_unit_ = 0;
    }
  }
  if (unit == kNoUnit) {
    // Every unit that may be handed out now is held by another group.
    response.set_action(v1::NextDataUnitResponse::WAIT);
    *response.mutable_progress() = ProgressLocked();
    return response;
  }
  group.held_unit = unit;
  response.set_action(v1::NextDataUnitResponse::TRAIN);
  *response.mutable_unit() = UnitLocked(unit);
  *response.mutable_progress() = ProgressLocked();
  return response;
}

v1::JobProgress Job::ProgressLocked() const {
  v1::JobProgress progress;
  progress.set_epochs_done(static_cast<int32_t>(history_.size()));
  progress.set_epochs(spec_.epochs());
  progress.set_samples_trained(samples_trained_);
  progress.set_samples_per_epoch(static_cast<uint64_t>(train_samples_));
  if (train_loss_.has_value()) progress.set_train_loss(*train_loss_);
  return progress;
}

v1::DataUnit Job::UnitLocked(int64_t unit_id) const {
  const int64_t index = unit_id % units_per_epoch_;
  v1::DataUnit unit;
  unit.set_epoch(static_cast<int32_t>(unit_id / units_per_epoch_));
  unit.set_unit_id(unit_id);
  unit.set_begin(index * spec_.data_unit_size());
  unit.set_end(std::min(train_samples_, unit.begin() + spec_.data_unit_size()));
  return unit;
}

void Job::RecordCompletedEpochsLocked(
    google::protobuf::RepeatedField<int32_t>* finished) {
  for (;;) {
    const int32_t epoch = static_cast<int32_t>(history_.size());
    auto it = open_epochs_.find(epoch);
    if (it == open_epochs_.end() ||
        it->second.units_completed < units_per_epoch_) {
      return;
    }
    const EpochProgress& progress = it->second;
    v1::EpochRecord record;
    record.set_epoch(epoch + 1);
    record.set_samples(progress.samples);
    record.set_train_loss(progress.samples > 0
                              ? progress.loss_sum /
                                    static_cast<double>(progress.samples)
                              : 0.0);
    const double seconds =
        absl::ToDoubleSeconds(progress.completed_at - progress.first_handout);
    record.set_wall_seconds(seconds);
    record.set_samples_per_second(
        seconds > 0.0 ? static_cast<double>(progress.samples) / seconds : 0.0);
    record.set_updates_applied(progress.updates_at_completion);
    history_.push_back(std::move(record));
    open_epochs_.erase(it);
    finished->Add(epoch);
  }
}

void Job::ReleaseGroupLocked(const std::string& group_id, Group& group) {
  if (group.held_unit != kNoUnit && !EndedLocked()) {
    requeued_units_.push_back(group.held_unit);
    ++units_requeued_;
  }
  group.held_unit = kNoUnit;
  if (finisher_ == group_id) finisher_.clear();
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
  *status.mutable_spec() = spec_;
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
  status.set_checkpoint_version(checkpoint_version_);
  if (rules_.best_value().has_value()) {
    status.set_best_metric_value(*rules_.best_value());
  }
  status.set_updates_applied(updates_applied_);
  status.set_samples_trained(samples_trained_);
  status.set_epochs_done(static_cast<int32_t>(history_.size()));
  status.set_stale_rejected(stale_rejected_);
  status.set_max_staleness_seen(max_staleness_seen_);
  status.set_mean_staleness(
      staleness_count_ > 0 ? static_cast<double>(staleness_sum_) /
                                 static_cast<double>(staleness_count_)
                           : 0.0);
  status.set_units_requeued(units_requeued_);
  if (train_loss_.has_value()) status.set_train_loss(*train_loss_);
  status.set_samples_per_epoch(static_cast<uint64_t>(train_samples_));
  if (with_history) {
    for (const auto& record : history_) *status.add_history() = record;
    for (const auto& record : validations_) *status.add_validations() = record;
  }
  for (const auto& [group_id, group] : groups_) {
    v1::GroupInfo* info = status.add_groups();
    info->set_group_id(group_id);
    info->set_ranks(group.ranks);
    info->set_host(group.host);
    info->set_alive(group.alive);
    info->set_seconds_since_seen(absl::ToDoubleSeconds(now - group.last_seen));
    info->set_units_completed(group.units_completed);
    info->set_samples_trained(group.samples_trained);
    info->set_updates_applied(group.updates_applied);
    if (group.telemetry.has_value()) *info->mutable_telemetry() = *group.telemetry;
  }
  if (has_test_result_) {
    status.set_test_loss(test_loss_);
    status.set_test_accuracy(test_accuracy_);
  }
  return status;
}

}  // namespace mpilearn::server
