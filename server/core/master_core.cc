// MasterCore (master_core.h). Over ~500 lines: every call of the Master
// service has its checks here (limits, strings, headers) before it reaches
// the registry, and ListJobs' paging under the reply bound.
#include "server/core/master_core.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::server {
namespace {

// `bytes` in the unit a person reads best (MiB, GiB, TiB).
std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " bytes")
                   : absl::StrCat(absl::SixDigits(value), " ", units[unit]);
}

std::string ModelLimitText(uint64_t max_model_bytes) {
  return absl::StrCat("this master takes models of at most ",
                      HumanBytes(max_model_bytes),
                      " of fp32 weights (mpilearn-master --max_model_mib)");
}

// The fp32 bytes `header`'s tensors take once received, saturating at
// UINT64_MAX; INVALID_ARGUMENT for a shape that is not one.
absl::StatusOr<uint64_t> Float32Bytes(const v1::TensorSetHeader& header) {
  uint64_t total = 0;
  for (const v1::TensorInfo& info : header.tensors()) {
    absl::StatusOr<int64_t> count = ElementCount(info.shape());
    if (!count.ok()) {
      return InvalidRequestError(absl::StrCat(
          "tensor '", EchoPrefix(info.name()), "': ",
          count.status().message()));
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(static_cast<uint64_t>(*count), sizeof(float),
                               &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return UINT64_MAX;
    }
  }
  return total;
}

// The bulky parts of a listed job's status: the spec's file lists.
void ClearFileLists(v1::JobStatus& status) {
  v1::DataSpec* data = status.mutable_spec()->mutable_data();
  data->clear_train_files();
  data->clear_validation_files();
  data->clear_test_files();
}


}  // namespace

absl::StatusOr<PendingTensors> PendingTensors::ForCall(CallHeader call,
                                                      Job* job) {
  PendingTensors pending(std::move(call));
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> sizes,
                            TensorSetAssembler::ByteSizes(pending.tensors()));
  MPILEARN_ASSIGN_OR_RETURN(std::vector<int64_t> counts,
                            TensorSetAssembler::ElementCounts(pending.tensors()));
  for (size_t bytes : sizes) pending.bytes_ += bytes;
  if (job != nullptr) {
    pending.values_ = job->TakeUpdateBuffers(counts);
  } else {
    pending.values_.reserve(counts.size());
    for (int64_t count : counts) {
      pending.values_.emplace_back(static_cast<size_t>(count));
    }
  }
  return pending;
}

const std::string& PendingTensors::job_id() const {
  return std::visit([](const auto& call) -> const std::string& {
    return call.job_id();
  }, call_);
}

const v1::TensorSetHeader& PendingTensors::tensors() const {
  if (const auto* init = std::get_if<v1::InitWeightsRequest::Header>(&call_)) {
    return init->weights();
  }
  if (const auto* slice = std::get_if<v1::ReportSliceRequest::Header>(&call_)) {
    return slice->weights();
  }
  return std::get<v1::PushGradientRequest::Header>(call_).gradient();
}

absl::StatusOr<TensorSetAssembler*> PendingTensors::Assembler() {
  if (copied_) {
    return InvalidRequestError("tensors were already copied in whole");
  }
  if (!assembler_.has_value()) {
    std::vector<absl::Span<float>> destinations;
    destinations.reserve(values_.size());
    for (std::vector<float>& v : values_) {
      destinations.push_back(absl::MakeSpan(v));
    }
    absl::StatusOr<TensorSetAssembler> assembler =
        TensorSetAssembler::Create(tensors(), std::move(destinations));
    if (!assembler.ok()) {
      return WithReason(assembler.status(), v1::ERROR_REASON_INVALID_REQUEST);
    }
    assembler_.emplace(std::move(*assembler));
  }
  return &*assembler_;
}

absl::Status PendingTensors::AddChunk(const v1::TensorChunk& chunk) {
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler * assembler, Assembler());
  return WithReason(assembler->Add(chunk), v1::ERROR_REASON_INVALID_REQUEST);
}

absl::Status PendingTensors::CopyFrom(
    absl::Span<const absl::Span<const float>> values) {
  if (assembler_.has_value() || copied_) {
    return InvalidRequestError("tensors were already received");
  }
  if (values.size() != values_.size()) {
    return InvalidRequestError(absl::StrCat("expected ", values_.size(),
                                            " tensors, got ", values.size()));
  }
  for (size_t t = 0; t < values.size(); ++t) {
    if (values[t].size() != values_[t].size()) {
      return InvalidRequestError(absl::StrCat(
          "tensor '", tensors().tensors(static_cast<int>(t)).name(), "' holds ",
          values[t].size(), " values; its header says ", values_[t].size()));
    }
    if (!values[t].empty()) {
      std::memcpy(values_[t].data(), values[t].data(),
                  values[t].size() * sizeof(float));
    }
  }
  copied_ = true;
  return absl::OkStatus();
}

absl::Status PendingTensors::Finish() const {
  if (copied_) return absl::OkStatus();
  if (assembler_.has_value()) {
    return WithReason(assembler_->Finish(), v1::ERROR_REASON_INVALID_REQUEST);
  }
  // No chunk arrived: complete only when there is nothing to send.
  if (bytes_ == 0) return absl::OkStatus();
  return InvalidRequestError(
      absl::StrCat("the stream ended before any of the ", bytes_,
                   " tensor bytes its header announced"));
}

absl::StatusOr<std::unique_ptr<MasterCore>> MasterCore::Create(Options options) {
  auto core = std::unique_ptr<MasterCore>(new MasterCore());
  core->limits_ = options.limits;
  core->shard_of_ = options.shard_of;
  core->shard_table_ = std::make_unique<ShardTable>(options.shard_table);
  options.registry.max_queued_jobs = options.limits.max_queued_jobs;
  // A warm start's file: the weights and at most three times as much
  // optimizer state (Adam), plus the checkpoint's records.
  options.registry.max_warm_start_bytes =
      options.limits.max_model_bytes > (UINT64_MAX >> 3)
          ? UINT64_MAX
          : 4 * options.limits.max_model_bytes + (uint64_t{64} << 20);
  // Bindings are judged by the registry's clock and group timeout.
  core->callers_ = std::make_unique<CallerBindings>(
      options.check_callers, options.registry.group_timeout,
      options.registry.clock);
  core->snapshots_ = std::make_unique<SnapshotHub>();
  core->gather_ = std::make_unique<SliceGather>();
  // In front of the hub: it passes every call on, and gathers a sharded
  // job's weights for its epoch-end snapshot.
  core->CreateShardSnapshots();
  options.registry.observers.push_back(core->ShardSnapshotsObserver());
  MPILEARN_ASSIGN_OR_RETURN(core->registry_,
                            JobRegistry::Create(std::move(options.registry)));
  core->StartShardSnapshots();
  return core;
}

absl::StatusOr<v1::SubmitJobResponse> MasterCore::SubmitJob(
    const v1::SubmitJobRequest& request) {
  return SubmitJob(Caller{}, request);
}

absl::StatusOr<v1::SubmitJobResponse> MasterCore::SubmitJob(
    const Caller& caller, const v1::SubmitJobRequest& request) {
  if (!shard_of_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this master is a parameter shard of the lead at ", shard_of_,
        ": submit jobs to the lead"));
  }
  if (request.spec().has_slice()) {
    return InvalidRequestError(
        "slice is set by a lead master on its shards' copies of a job only; remove it");
  }
  // Strings first (a 4 MiB name is refused, not parsed further), then the
  // spec's own checks, then its model's size.
  MPILEARN_RETURN_IF_ERROR(
      CheckStringFields(request.spec(), "spec", limits_.max_string_bytes));
  // The owner is the submitter's unless an admin names another.
  v1::JobSpec spec = request.spec();
  MPILEARN_RETURN_IF_ERROR(
      CheckSubmission(caller, spec.mutable_owner(), spec.priority(), "SubmitJob"));
  MPILEARN_ASSIGN_OR_RETURN(JobConfig config, JobConfig::Create(std::move(spec)));
  MPILEARN_RETURN_IF_ERROR(CheckModelBound(config.spec()));
  MPILEARN_RETURN_IF_ERROR(CheckWarmStartSource(config.spec()));
  MPILEARN_ASSIGN_OR_RETURN(std::string job_id,
                            registry_->Submit(std::move(config)));
  v1::SubmitJobResponse response;
  response.set_job_id(std::move(job_id));
  return response;
}

absl::Status MasterCore::CheckWarmStartSource(const v1::JobSpec& spec) const {
  if (!WarmStartsOnMaster(spec)) return absl::OkStatus();
  const v1::WarmStartSpec& warm = spec.warm_start();
  if (!warm.job_id().empty()) {
    if (registry_->FindJob(warm.job_id()).ok()) return absl::OkStatus();
    return InvalidRequestError(absl::StrCat("warm_start.job_id: no job ", warm.job_id(),
                                            " on this master; list them with mpilearnctl list"));
  }
  // The file is read when the first group brings the model's layout; here
  // only whether the master can open it.
  if (std::ifstream(warm.checkpoint()).good()) return absl::OkStatus();
  return InvalidRequestError(absl::StrCat("warm_start.checkpoint: the master cannot read '",
                                          warm.checkpoint(),
                                          "'; give a path on the master's host"));
}

absl::Status MasterCore::CheckModelBound(const v1::JobSpec& spec) const {
  const uint64_t parameters = MinModelParameters(spec.model());
  const uint64_t bytes =
      parameters > UINT64_MAX / sizeof(float) ? UINT64_MAX
                                              : parameters * sizeof(float);
  if (bytes <= limits_.max_model_bytes) return absl::OkStatus();
  return LimitError(absl::StrCat(
      "model: the ", spec.model().name(), " this spec describes has at least ",
      parameters, " parameters (", HumanBytes(bytes), " of fp32 weights); ",
      ModelLimitText(limits_.max_model_bytes),
      ": make the model smaller (model.hidden, model.channels, "
      "model.recurrent, model.dense)"));
}

absl::StatusOr<v1::RegisterGroupResponse> MasterCore::RegisterGroup(
    const Caller& caller, const v1::RegisterGroupRequest& request) {
  // The host goes into the job's status and the master's log.
  MPILEARN_RETURN_IF_ERROR(
      CheckStringField("host", request.host(), limits_.max_string_bytes));
  MPILEARN_RETURN_IF_ERROR(CheckShardRegistration(request));
  // A job waiting for shards refuses the group before it joins (its
  // retries then leave no trace in the job's history).
  if (shard_of_.empty() && !request.job_id().empty()) {
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(request.job_id());
    if (job.ok() && !(*job)->Layout().ok()) {
      MPILEARN_RETURN_IF_ERROR(shard_table_->ReadyToPlace(request.job_id(), registry_->Now()));
    }
  }
  // Only jobs of owners the caller's token trains.
  JobRegistry::OwnerFilter may_train;
  if (Scoped(caller)) {
    if (!request.job_id().empty()) {
      absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(request.job_id());
      if (job.ok()) {
        MPILEARN_RETURN_IF_ERROR(
            CheckTrains(caller, (*job)->spec().owner(), absl::StrCat("job ", request.job_id())));
      }
    }
    may_train = [&caller](const std::string& owner) { return MayTrain(caller, owner); };
  }
  MPILEARN_ASSIGN_OR_RETURN(v1::RegisterGroupResponse response,
                            registry_->RegisterGroup(request, may_train));
  // No other caller may act for this group.
  MPILEARN_RETURN_IF_ERROR(
      callers_->BindGroup(response.group_id(), response.job_id(), caller));
  MPILEARN_RETURN_IF_ERROR(PlaceOnShards(response));
  return response;
}

absl::StatusOr<PendingTensors> MasterCore::BeginInitWeights(
    const Caller& caller, const v1::InitWeightsRequest::Header& header) {
  MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(header.group_id(), caller));
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            registry_->FindJob(header.job_id()));
  // Only a group of the job may offer its weights: a stranger's header is
  // refused before anything is sized for it.
  MPILEARN_RETURN_IF_ERROR(job->Touch(header.group_id(), registry_->Now()));
  MPILEARN_RETURN_IF_ERROR(CheckIncomingSet(
      header.weights(), absl::StrCat("the initial weights for job ", header.job_id())));
  return PendingTensors::ForCall(header);
}

absl::Status MasterCore::CheckIncomingSet(const v1::TensorSetHeader& weights,
                                          const std::string& what) const {
  // Everything is known from the header alone: refuse before allocating.
  if (weights.tensors_size() > limits_.max_tensors_per_set) {
    return LimitError(absl::StrCat(
        what, " list ", weights.tensors_size(), " tensors; this master takes at most ",
        limits_.max_tensors_per_set, " per set (mpilearn-master --max_tensors_per_set)"));
  }
  MPILEARN_ASSIGN_OR_RETURN(const uint64_t bytes, Float32Bytes(weights));
  if (bytes > limits_.max_model_bytes) {
    return LimitError(absl::StrCat(
        what, " are ", bytes == UINT64_MAX ? "more than 16 EiB" : HumanBytes(bytes),
        " as fp32; ", ModelLimitText(limits_.max_model_bytes), ": make the model smaller"));
  }
  // Tensor names are kept in the job's checkpoints.
  return CheckStringFields(weights, "weights", limits_.max_string_bytes);
}

absl::StatusOr<v1::InitWeightsResponse> MasterCore::CommitInitWeights(
    PendingTensors pending) {
  MPILEARN_ASSIGN_OR_RETURN(
      const v1::InitWeightsRequest::Header* header,
      pending.Finished<v1::InitWeightsRequest::Header>("CommitInitWeights"));
  return registry_->InitWeights(header->job_id(), header->group_id(),
                                header->weights(), std::move(pending.values_));
}

absl::StatusOr<PendingTensors> MasterCore::BeginPush(
    const Caller& caller, const v1::PushGradientRequest::Header& header) {
  MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(header.group_id(), caller));
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            registry_->FindJob(header.job_id()));
  absl::StatusOr<v1::TensorSetHeader> layout = job->Layout();
  if (!layout.ok()) {
    // No weights: the job came back from a restart without a checkpoint.
    // A group of the previous master hears GROUP_UNKNOWN, so it registers
    // again and installs the weights, rather than a JOB_STATE error it
    // cannot act on.
    if (!header.group_id().empty()) {
      MPILEARN_RETURN_IF_ERROR(job->Touch(header.group_id(), registry_->Now()));
    }
    return layout.status();
  }
  MPILEARN_RETURN_IF_ERROR(WithReason(CheckSameLayout(*layout, header.gradient()),
                                      v1::ERROR_REASON_INVALID_REQUEST));
  if (!std::isfinite(header.update_norm()) || header.update_norm() < 0.0) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "update_norm must be a finite number >= 0, got ",
                          header.update_norm())),
                      v1::ERROR_REASON_INVALID_REQUEST);
  }
  MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending,
                            PendingTensors::ForCall(header, job.get()));
  pending.job_ = std::move(job);
  return pending;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::CommitPush(
    PendingTensors pending) {
  MPILEARN_ASSIGN_OR_RETURN(
      const v1::PushGradientRequest::Header* header,
      pending.Finished<v1::PushGradientRequest::Header>("CommitPush"));
  if (pending.job_ == nullptr) {
    return WithReason(absl::InternalError("CommitPush without its job"),
                      v1::ERROR_REASON_INTERNAL);
  }
  GradientUpdate update;
  update.group_id = header->group_id();
  update.rank = header->rank();
  update.kind = header->kind();
  update.base_version = header->gradient().version();
  update.sequence = header->sequence();
  update.samples = header->samples();
  update.train_loss = header->train_loss();
  update.update_norm = header->update_norm();
  update.values = std::move(pending.values_);
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> reply =
      registry_->ApplyGradient(*pending.job_, update);
  pending.job_->ReturnUpdateBuffers(std::move(update.values));
  return reply;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::PullWeights(
    const Caller& caller, const v1::PullWeightsRequest& request) {
  // A pull without a group (a worker token reading a job's weights) names
  // no group to own.
  if (!request.group_id().empty()) {
    MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(request.group_id(), caller));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            registry_->FindJob(request.job_id()));
  if (!request.group_id().empty()) {
    MPILEARN_RETURN_IF_ERROR(job->Touch(request.group_id(), registry_->Now()));
  } else {
    MPILEARN_RETURN_IF_ERROR(
        CheckTrains(caller, job->spec().owner(), absl::StrCat("job ", request.job_id())));
  }
  if (OnShards(request.job_id())) return GatherWeights(request.job_id(), job->spec());
  return WeightsOf(*job);
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::WeightsOf(
    const Job& job) const {
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights = job.Weights();
  if (!weights.ok() && job.MemoryReleased()) return registry_->EndedWeights(job);
  return weights;
}

absl::StatusOr<v1::NextDataUnitResponse> MasterCore::NextDataUnit(
    const Caller& caller, const v1::NextDataUnitRequest& request) {
  MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(request.group_id(), caller));
  return registry_->NextDataUnit(request);
}

absl::StatusOr<v1::ReportEpochResponse> MasterCore::ReportEpoch(
    const Caller& caller, const v1::ReportEpochRequest& request) {
  MPILEARN_RETURN_IF_ERROR(
      callers_->CheckGroup(request.record().group_id(), caller));
  // Metric names go into the job's history.
  MPILEARN_RETURN_IF_ERROR(
      CheckStringFields(request.record(), "record", limits_.max_string_bytes));
  MPILEARN_ASSIGN_OR_RETURN(
      v1::JobState state, registry_->ReportEpoch(request.job_id(), request.record()));
  v1::ReportEpochResponse response;
  response.set_state(state);
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> MasterCore::Heartbeat(
    const Caller& caller, const v1::HeartbeatRequest& request) {
  MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(request.group_id(), caller));
  MPILEARN_ASSIGN_OR_RETURN(
      v1::JobState state,
      registry_->Heartbeat(request.job_id(), request.group_id(),
                           request.has_telemetry() ? &request.telemetry()
                                                   : nullptr));
  v1::HeartbeatResponse response;
  response.set_state(state);
  return response;
}

absl::StatusOr<v1::LeaveResponse> MasterCore::Leave(
    const Caller& caller, const v1::LeaveRequest& request) {
  MPILEARN_RETURN_IF_ERROR(callers_->CheckGroup(request.group_id(), caller));
  for (const auto& [name, value] : request.test_metrics()) {
    MPILEARN_RETURN_IF_ERROR(
        CheckStringField("test_metrics key", name, limits_.max_string_bytes));
  }
  // A group's error (or why it abandoned the job) is never refused (the job
  // must hear it): it is kept cut to the string limit, as one line.
  auto is_plain = [&](const std::string& text) {
    return text.size() <= limits_.max_string_bytes && !HasControlBytes(text);
  };
  const bool plain = is_plain(request.error()) && is_plain(request.abandoned());
  v1::LeaveRequest bounded;
  if (!plain) {
    bounded = request;
    bounded.set_error(SanitizeText(request.error(), limits_.max_string_bytes));
    bounded.set_abandoned(
        SanitizeText(request.abandoned(), limits_.max_string_bytes));
  }
  MPILEARN_ASSIGN_OR_RETURN(v1::JobState state,
                            registry_->Leave(plain ? request : bounded));
  callers_->UnbindGroup(request.group_id());
  v1::LeaveResponse response;
  response.set_state(state);
  return response;
}

absl::StatusOr<std::shared_ptr<SnapshotHub::Subscription>>
MasterCore::SubscribeSnapshots(const Caller& caller,
                               const v1::SubscribeSnapshotsRequest& request,
                               const std::string& label) {
  MPILEARN_RETURN_IF_ERROR(CheckStringField(
      "subscriber", request.subscriber(), limits_.max_string_bytes));
  std::vector<std::string> job_ids(request.job_ids().begin(),
                                   request.job_ids().end());
  for (const std::string& job_id : job_ids) {
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->FindJob(job_id));
    MPILEARN_RETURN_IF_ERROR(
        CheckTrains(caller, job->spec().owner(), absl::StrCat("job ", job_id)));
  }
  if (job_ids.empty() && Scoped(caller)) {
    return PermissionError(absl::StrCat(
        "SubscribeSnapshots: token '", caller.name,
        "' reads some owners' jobs only, so it must name the jobs to follow (rule \"tokens "
        "train the owners they serve\"; mpilearn-worker --role validate --jobs ID,ID)"));
  }
  // The subscription handed out owns a Counted, so the count drops, and the
  // caller stops following its jobs, when the last reference to it goes.
  struct Counted {
    std::shared_ptr<SnapshotHub::Subscription> subscription;
    CallerBindings::Subscription following;
    std::shared_ptr<std::atomic<int>> count;
    ~Counted() {
      if (count != nullptr) count->fetch_sub(1);
    }
  };
  auto counted = std::make_shared<Counted>();
  const int before = subscriptions_->fetch_add(1);
  counted->count = subscriptions_;
  const int most = limits_.max_subscriptions;
  if (most > 0 && before >= most) {
    return LimitError(absl::StrCat(
        before, " snapshot subscriptions are open, the most this master ",
        "serves (mpilearn-master --max_subscriptions); retry once one ended"));
  }
  counted->subscription = snapshots_->Subscribe(job_ids, label);
  // Recorded before the transport tells the client it is subscribed.
  counted->following = callers_->RecordSubscription(caller, job_ids);
  SnapshotHub::Subscription* subscription = counted->subscription.get();
  return std::shared_ptr<SnapshotHub::Subscription>(std::move(counted),
                                                    subscription);
}

absl::StatusOr<v1::ReportValidationResponse> MasterCore::ReportValidation(
    const Caller& caller, const v1::ReportValidationRequest& request) {
  // Only a caller following the job's snapshots, or training it, reports
  // its validations (a report may complete the job by a target).
  MPILEARN_RETURN_IF_ERROR(callers_->CheckValidation(request.job_id(), caller));
  // The source and metric names go into the job's history.
  MPILEARN_RETURN_IF_ERROR(
      CheckStringFields(request.record(), "record", limits_.max_string_bytes));
  MPILEARN_ASSIGN_OR_RETURN(
      v1::JobState state,
      registry_->ReportValidation(request.job_id(), request.record()));
  v1::ReportValidationResponse response;
  response.set_state(state);
  return response;
}

absl::Status MasterCore::StopJob(const std::string& job_id,
                               const std::string& reason) {
  return registry_->Stop(job_id, reason);
}

absl::StatusOr<v1::JobStatus> MasterCore::GetJobStatus(
    const v1::GetJobStatusRequest& request) const {
  MPILEARN_ASSIGN_OR_RETURN(v1::JobStatus status,
                            registry_->Status(request.job_id()));
  snapshots_->FillCounters(status);
  FillShards(status);
  if (status.state() == v1::JOB_STATE_QUEUED) {
    FillQueuePlaces(registry_->QueueOrder(), status);
  }
  return status;
}

void MasterCore::FillQueuePlaces(const std::map<std::string, JobRegistry::QueueSlot>& order,
                                 v1::JobStatus& status) {
  const auto it = order.find(status.job_id());
  if (it == order.end()) return;
  status.set_queue_position(it->second.position);
  status.set_queue_note(it->second.note);
}

absl::Status MasterCore::CheckManagesJob(const Caller& caller, const std::string& job_id) const {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->FindJob(job_id));
  return CheckManages(caller, job->spec().owner(), absl::StrCat("job ", job_id));
}

absl::StatusOr<v1::JobStatus> MasterCore::CancelJob(
    const Caller& caller, const v1::CancelJobRequest& request) {
  MPILEARN_RETURN_IF_ERROR(CheckManagesJob(caller, request.job_id()));
  return CancelJob(request);
}

absl::StatusOr<v1::DeleteJobResponse> MasterCore::DeleteJob(
    const Caller& caller, const v1::DeleteJobRequest& request) {
  MPILEARN_RETURN_IF_ERROR(CheckManagesJob(caller, request.job_id()));
  return DeleteJob(request);
}

absl::StatusOr<v1::JobStatus> MasterCore::CancelJob(
    const v1::CancelJobRequest& request) {
  MPILEARN_RETURN_IF_ERROR(registry_->Cancel(
      request.job_id(),
      SanitizeText(request.reason(), limits_.max_string_bytes)));
  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(request.job_id());
  return GetJobStatus(status_request);
}

absl::StatusOr<v1::DeleteJobResponse> MasterCore::DeleteJob(
    const v1::DeleteJobRequest& request) {
  MPILEARN_RETURN_IF_ERROR(registry_->Delete(request.job_id()));
  shard_table_->Forget(request.job_id());
  return v1::DeleteJobResponse();
}

absl::StatusOr<v1::ListJobsResponse> MasterCore::ListJobPage(
    const v1::ListJobsRequest& request) const {
  int64_t after = 0;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &after) || after < 0 ||
       absl::StrCat(after) != request.page_token())) {
    return InvalidRequestError(absl::StrCat(
        "page_token '", EchoPrefix(request.page_token()),
        "' is not a token this master handed out; pass the next_page_token "
        "of the previous ListJobs reply, or none for the first page"));
  }
  int page_size = request.page_size();
  if (page_size <= 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  std::vector<v1::JobState> states(request.states().size());
  for (int i = 0; i < request.states_size(); ++i) {
    states[i] = request.states(i);
  }
  bool more = false;
  std::vector<JobRegistry::ListedJob> jobs =
      registry_->ListPage(after, states, page_size, &more);
  uint64_t total = 0;
  std::map<std::string, JobRegistry::QueueSlot> order;
  for (const JobRegistry::ListedJob& job : jobs) {
    if (job.status.state() == v1::JOB_STATE_QUEUED) {
      order = registry_->QueueOrder();
      break;
    }
  }
  for (JobRegistry::ListedJob& job : jobs) {
    snapshots_->FillCounters(job.status);
    FillQueuePlaces(order, job.status);
    total += job.status.ByteSizeLong();
  }
  const uint64_t budget = limits_.max_list_bytes;
  // Over the reply's bound: without the spec's file lists, then the page
  // ends early; a job too large on its own is left out.
  if (total > budget) {
    for (JobRegistry::ListedJob& job : jobs) ClearFileLists(job.status);
  }
  v1::ListJobsResponse response;
  // Room for the token and left_out fields.
  constexpr uint64_t kReplyOverhead = 64;
  uint64_t used = kReplyOverhead;
  uint32_t left_out = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    // A repeated field's element costs its size plus tag and length.
    const uint64_t size = jobs[i].status.ByteSizeLong() + 16;
    if (size + kReplyOverhead > budget) {
      ++left_out;
      continue;
    }
    if (used + size > budget) {
      // The page ends before job i; the next starts with it.
      more = true;
      response.set_next_page_token(absl::StrCat(jobs[i - 1].number));
      break;
    }
    used += size;
    *response.add_jobs() = std::move(jobs[i].status);
  }
  if (response.next_page_token().empty() && more && !jobs.empty()) {
    response.set_next_page_token(absl::StrCat(jobs.back().number));
  }
  if (left_out > 0) {
    LOG_EVERY_N(WARNING, 100)
        << "ListJobs: " << left_out
        << " job(s) left out, each larger than the reply bound of " << budget
        << " bytes";
  }
  response.set_left_out(left_out);
  return response;
}

std::optional<std::string> MasterCore::FindJobByName(
    const std::string& name) const {
  return registry_->FindJobByName(name);
}

v1::ListJobsResponse MasterCore::ListJobs(
    const v1::ListJobsRequest& request) const {
  v1::ListJobsResponse response;
  v1::ListJobsRequest page = request;
  page.set_page_size(kMaxPageSize);
  page.clear_page_token();
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> part = ListJobPage(page);
    if (!part.ok()) break;
    for (v1::JobStatus& job : *part->mutable_jobs()) {
      *response.add_jobs() = std::move(job);
    }
    response.set_left_out(response.left_out() + part->left_out());
    if (part->next_page_token().empty()) break;
    page.set_page_token(part->next_page_token());
  }
  return response;
}

std::vector<JobMetricsView> MasterCore::ListForMetrics() const {
  std::vector<JobMetricsView> jobs = registry_->ListForMetrics();
  for (JobMetricsView& job : jobs) {
    snapshots_->FillCounters(job.status);
    FillShards(job.status);  // a sharded job's counters are its shards'
  }
  return jobs;
}

std::map<std::string, JobRegistry::OwnerLoad> MasterCore::OwnerLoads() const {
  return registry_->OwnerLoads();
}

void MasterCore::Tick() { registry_->Tick(); }

absl::Duration MasterCore::TickPeriod() const {
  // A group is declared lost at the first tick after its limit: at most one
  // period late. Groups with a heartbeat (lost after 3 periods, at least
  // 0.3 s) are not counted here: the 1 s cap keeps them within 1 s of their
  // limit, which is all a heartbeat of a few seconds needs, and the period
  // stays fixed (the reaper reads it once).
  return std::min(absl::Seconds(1), registry_->group_timeout() / 4);
}

void MasterCore::CloseSnapshots() { snapshots_->Close(); }

void MasterCore::CheckpointAll() { registry_->CheckpointAll(); }

}  // namespace mpilearn::server
