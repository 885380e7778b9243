#include "worker/local_master.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::worker {
namespace {

// Copies a snapshot into the caller's buffers; returns its version.
absl::StatusOr<uint64_t> CopyOut(const server::WeightsSnapshot& snapshot,
                                 absl::Span<const absl::Span<float>> weights) {
  if (weights.size() != snapshot.values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", snapshot.values.size(), " weight buffers, got ",
                     weights.size()));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i].size() != snapshot.values[i].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight buffer ", i, " holds ", weights[i].size(),
                       " floats; the job's tensor has ", snapshot.values[i].size()));
    }
    std::memcpy(weights[i].data(), snapshot.values[i].data(),
                weights[i].size() * sizeof(float));
  }
  return snapshot.header.version();
}

std::vector<std::vector<float>> Copy(absl::Span<const absl::Span<const float>> in) {
  std::vector<std::vector<float>> out;
  out.reserve(in.size());
  for (const auto& v : in) out.emplace_back(v.begin(), v.end());
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalMaster>> LocalMaster::Create(
    const std::string& state_dir, const server::EngineOptions& engine) {
  server::JobRegistry::Options options;
  options.state_dir = state_dir;
  options.engine = engine;
  // A baseline run is one job: earlier runs' jobs in the same directory
  // are not picked up again.
  options.resume_jobs = false;
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<server::JobRegistry> registry,
                            server::JobRegistry::Create(options));
  return std::unique_ptr<LocalMaster>(new LocalMaster(std::move(registry)));
}

absl::StatusOr<std::string> LocalMaster::SubmitJob(const v1::JobSpec& spec) {
  return registry_->Submit(spec);
}

absl::StatusOr<v1::RegisterGroupResponse> LocalMaster::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  return registry_->RegisterGroup(request);
}

absl::StatusOr<bool> LocalMaster::InitWeights(
    const std::string& job_id, const std::string& group_id,
    const v1::TensorSetHeader& header,
    absl::Span<const absl::Span<const float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(
      v1::InitWeightsResponse response,
      registry_->InitWeights(job_id, group_id, header, Copy(values)));
  return response.accepted();
}

absl::StatusOr<uint64_t> LocalMaster::PushGradient(
    const v1::PushGradientRequest::Header& header,
    absl::Span<const absl::Span<const float>> gradient,
    absl::Span<const absl::Span<float>> weights) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<server::Job> job,
                            registry_->FindJob(header.job_id()));
  MPILEARN_ASSIGN_OR_RETURN(v1::TensorSetHeader layout, job->Layout());
  MPILEARN_RETURN_IF_ERROR(CheckSameLayout(layout, header.gradient()));
  server::GradientUpdate update;
  update.group_id = header.group_id();
  update.rank = header.rank();
  update.base_version = header.gradient().version();
  update.samples = header.samples();
  update.train_loss = header.train_loss();
  update.kind = header.kind();
  update.values = Copy(gradient);
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const server::WeightsSnapshot> snapshot,
                            registry_->ApplyGradient(*job, update));
  return CopyOut(*snapshot, weights);
}

absl::StatusOr<uint64_t> LocalMaster::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<server::Job> job,
                            registry_->FindJob(job_id));
  (void)group_id;
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const server::WeightsSnapshot> snapshot,
                            job->Weights());
  return CopyOut(*snapshot, weights);
}

absl::StatusOr<v1::NextDataUnitResponse> LocalMaster::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  return registry_->NextDataUnit(request);
}

absl::StatusOr<v1::JobState> LocalMaster::ReportEpoch(
    const v1::ReportEpochRequest& request) {
  return registry_->ReportEpoch(request.job_id(), request.record());
}

absl::StatusOr<v1::JobState> LocalMaster::Leave(const v1::LeaveRequest& request) {
  return registry_->Leave(request);
}

absl::StatusOr<v1::JobStatus> LocalMaster::GetJobStatus(const std::string& job_id) {
  return registry_->Status(job_id);
}

}  // namespace mpilearn::worker
