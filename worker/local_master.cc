#include "worker/local_master.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"

namespace mpilearn::worker {
namespace {

// Copies a snapshot into the caller's buffers; returns its version.
absl::StatusOr<uint64_t> CopyOut(const server::WeightsSnapshot& snapshot,
                                 absl::Span<const absl::Span<float>> weights) {
  if (weights.size() != snapshot.values.size()) {
    return InvalidRequestError(absl::StrCat("expected ", snapshot.values.size(),
                                            " weight buffers, got ",
                                            weights.size()));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i].size() != snapshot.values[i].size()) {
      return InvalidRequestError(absl::StrCat(
          "weight buffer ", i, " holds ", weights[i].size(),
          " floats; the job's tensor has ", snapshot.values[i].size()));
    }
    std::memcpy(weights[i].data(), snapshot.values[i].data(),
                weights[i].size() * sizeof(float));
  }
  return snapshot.header.version();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalMaster>> LocalMaster::Create(
    const std::string& state_dir, const server::EngineOptions& engine) {
  server::Master::Options master_options;
  // One job, no studies: a study left in the same directory by a
  // mpilearn-master is not run here.
  master_options.studies = false;
  server::MasterCore::Options& options = master_options.core;
  options.registry.state_dir = state_dir;
  options.registry.engine = engine;
  // A baseline run is one job: earlier runs' jobs in the same directory
  // are not picked up again.
  options.registry.resume_jobs = false;
  // The master's --max_* limits guard a shared service against its
  // clients; here the one client is this process, whose own allocation is
  // the bound (a model that does not fit fails in LibTorch, as in a group).
  options.limits.max_model_bytes = std::numeric_limits<uint64_t>::max() / 4;
  options.limits.max_tensors_per_set = std::numeric_limits<int>::max();
  options.limits.max_queued_jobs = 0;
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<server::Master> master,
                            server::Master::Create(std::move(master_options)));
  master->Start();
  return std::unique_ptr<LocalMaster>(new LocalMaster(std::move(master)));
}

absl::StatusOr<std::string> LocalMaster::SubmitJob(const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  MPILEARN_ASSIGN_OR_RETURN(v1::SubmitJobResponse response,
                            core_.SubmitJob(request));
  return response.job_id();
}

absl::StatusOr<v1::RegisterGroupResponse> LocalMaster::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  return core_.RegisterGroup(caller_, request);
}

absl::StatusOr<bool> LocalMaster::InitWeights(
    const std::string& job_id, const std::string& group_id,
    const v1::TensorSetHeader& header,
    absl::Span<const absl::Span<const float>> values) {
  v1::InitWeightsRequest::Header init;
  init.set_job_id(job_id);
  init.set_group_id(group_id);
  *init.mutable_weights() = header;
  MPILEARN_ASSIGN_OR_RETURN(server::PendingTensors pending,
                            core_.BeginInitWeights(caller_, init));
  MPILEARN_RETURN_IF_ERROR(pending.CopyFrom(values));
  MPILEARN_ASSIGN_OR_RETURN(v1::InitWeightsResponse response,
                            core_.CommitInitWeights(std::move(pending)));
  return response.accepted();
}

absl::StatusOr<uint64_t> LocalMaster::PushGradient(
    const v1::PushGradientRequest::Header& header,
    absl::Span<const absl::Span<const float>> gradient,
    absl::Span<const absl::Span<float>> weights) {
  MPILEARN_ASSIGN_OR_RETURN(server::PendingTensors pending,
                            core_.BeginPush(caller_, header));
  MPILEARN_RETURN_IF_ERROR(pending.CopyFrom(gradient));
  MPILEARN_ASSIGN_OR_RETURN(
      std::shared_ptr<const server::WeightsSnapshot> reply,
      core_.CommitPush(std::move(pending)));
  return CopyOut(*reply, weights);
}

absl::StatusOr<uint64_t> LocalMaster::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  v1::PullWeightsRequest request;
  request.set_job_id(job_id);
  request.set_group_id(group_id);
  MPILEARN_ASSIGN_OR_RETURN(
      std::shared_ptr<const server::WeightsSnapshot> snapshot,
      core_.PullWeights(caller_, request));
  return CopyOut(*snapshot, weights);
}

absl::StatusOr<v1::NextDataUnitResponse> LocalMaster::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  return core_.NextDataUnit(caller_, request);
}

absl::StatusOr<v1::JobState> LocalMaster::ReportEpoch(
    const v1::ReportEpochRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::ReportEpochResponse response,
                            core_.ReportEpoch(caller_, request));
  return response.state();
}

absl::StatusOr<v1::JobState> LocalMaster::Leave(const v1::LeaveRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::LeaveResponse response,
                            core_.Leave(caller_, request));
  return response.state();
}

absl::StatusOr<v1::JobState> LocalMaster::Heartbeat(
    const v1::HeartbeatRequest& request, absl::Duration /*timeout*/) {
  MPILEARN_ASSIGN_OR_RETURN(v1::HeartbeatResponse response,
                            core_.Heartbeat(caller_, request));
  return response.state();
}

absl::StatusOr<v1::JobStatus> LocalMaster::GetJobStatus(const std::string& job_id) {
  v1::GetJobStatusRequest request;
  request.set_job_id(job_id);
  return core_.GetJobStatus(request);
}

}  // namespace mpilearn::worker
