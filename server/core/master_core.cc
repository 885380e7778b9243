#include "server/core/master_core.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"

namespace mpilearn::server {

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
  core->max_model_bytes_ = options.max_model_bytes;
  core->snapshots_ = std::make_unique<SnapshotHub>();
  options.registry.snapshot_sink = core->snapshots_.get();
  MPILEARN_ASSIGN_OR_RETURN(core->registry_,
                            JobRegistry::Create(std::move(options.registry)));
  return core;
}

absl::StatusOr<v1::SubmitJobResponse> MasterCore::SubmitJob(
    const v1::SubmitJobRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::string job_id, registry_->Submit(request.spec()));
  v1::SubmitJobResponse response;
  response.set_job_id(std::move(job_id));
  return response;
}

absl::StatusOr<v1::RegisterGroupResponse> MasterCore::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  return registry_->RegisterGroup(request);
}

absl::StatusOr<PendingTensors> MasterCore::BeginInitWeights(
    const v1::InitWeightsRequest::Header& header) {
  MPILEARN_RETURN_IF_ERROR(registry_->FindJob(header.job_id()).status());
  // The size is known from the header alone: refuse before allocating.
  absl::StatusOr<std::vector<size_t>> sizes =
      TensorSetAssembler::ByteSizes(header.weights());
  if (!sizes.ok()) {
    return WithReason(sizes.status(), v1::ERROR_REASON_INVALID_REQUEST);
  }
  uint64_t bytes = 0;
  for (size_t size : *sizes) {
    // Stops past the limit, before the sum could wrap.
    bytes += std::min<uint64_t>(size, max_model_bytes_ + 1);
    if (bytes > max_model_bytes_) break;
  }
  if (bytes > max_model_bytes_) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "the model's weights for job ", header.job_id(), " are more than ",
            max_model_bytes_, " bytes, the most this master takes",
            " (mpilearn-master --max_model_mib): make the model smaller")),
        v1::ERROR_REASON_INVALID_REQUEST);
  }
  return PendingTensors::ForCall(header);
}

absl::StatusOr<v1::InitWeightsResponse> MasterCore::CommitInitWeights(
    PendingTensors pending) {
  MPILEARN_RETURN_IF_ERROR(pending.Finish());
  const auto* header =
      std::get_if<v1::InitWeightsRequest::Header>(&pending.call_);
  if (header == nullptr) {
    return WithReason(absl::InternalError("CommitInitWeights of a push"),
                      v1::ERROR_REASON_INTERNAL);
  }
  return registry_->InitWeights(header->job_id(), header->group_id(),
                                header->weights(), std::move(pending.values_));
}

absl::StatusOr<PendingTensors> MasterCore::BeginPush(
    const v1::PushGradientRequest::Header& header) {
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
  MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending,
                            PendingTensors::ForCall(header, job.get()));
  pending.job_ = std::move(job);
  return pending;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::CommitPush(
    PendingTensors pending) {
  MPILEARN_RETURN_IF_ERROR(pending.Finish());
  const auto* header =
      std::get_if<v1::PushGradientRequest::Header>(&pending.call_);
  if (header == nullptr || pending.job_ == nullptr) {
    return WithReason(absl::InternalError("CommitPush of initial weights"),
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
  update.values = std::move(pending.values_);
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> reply =
      registry_->ApplyGradient(*pending.job_, update);
  pending.job_->ReturnUpdateBuffers(std::move(update.values));
  return reply;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::PullWeights(
    const v1::PullWeightsRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            registry_->FindJob(request.job_id()));
  if (!request.group_id().empty()) {
    MPILEARN_RETURN_IF_ERROR(job->Touch(request.group_id(), registry_->Now()));
  }
  return job->Weights();
}

absl::StatusOr<v1::NextDataUnitResponse> MasterCore::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  return registry_->NextDataUnit(request);
}

absl::StatusOr<v1::ReportEpochResponse> MasterCore::ReportEpoch(
    const v1::ReportEpochRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(
      v1::JobState state, registry_->ReportEpoch(request.job_id(), request.record()));
  v1::ReportEpochResponse response;
  response.set_state(state);
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> MasterCore::Heartbeat(
    const v1::HeartbeatRequest& request) {
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
    const v1::LeaveRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::JobState state, registry_->Leave(request));
  v1::LeaveResponse response;
  response.set_state(state);
  return response;
}

absl::StatusOr<std::shared_ptr<SnapshotHub::Subscription>>
MasterCore::SubscribeSnapshots(const v1::SubscribeSnapshotsRequest& request,
                               const std::string& label) {
  std::vector<std::string> job_ids(request.job_ids().begin(),
                                   request.job_ids().end());
  for (const std::string& job_id : job_ids) {
    MPILEARN_RETURN_IF_ERROR(registry_->FindJob(job_id).status());
  }
  return snapshots_->Subscribe(job_ids, label);
}

absl::StatusOr<v1::ReportValidationResponse> MasterCore::ReportValidation(
    const v1::ReportValidationRequest& request) {
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
  return status;
}

v1::ListJobsResponse MasterCore::ListJobs(const v1::ListJobsRequest&) const {
  v1::ListJobsResponse response;
  for (v1::JobStatus& status : registry_->List()) {
    snapshots_->FillCounters(status);
    *response.add_jobs() = std::move(status);
  }
  return response;
}

std::vector<JobMetricsView> MasterCore::ListForMetrics() const {
  std::vector<JobMetricsView> jobs = registry_->ListForMetrics();
  for (JobMetricsView& job : jobs) snapshots_->FillCounters(job.status);
  return jobs;
}

void MasterCore::Tick() { registry_->Tick(); }

absl::Duration MasterCore::TickPeriod() const {
  return std::min(absl::Seconds(1), registry_->group_timeout() / 4);
}

void MasterCore::CloseSnapshots() { snapshots_->Close(); }

void MasterCore::CheckpointAll() { registry_->CheckpointAll(); }

}  // namespace mpilearn::server
