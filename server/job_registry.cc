#include "server/job_registry.h"

#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"

namespace mpilearn::server {

absl::StatusOr<std::unique_ptr<JobRegistry>> JobRegistry::Create(
    Options options) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                            JobStore::Open(options.state_dir));
  auto registry = std::unique_ptr<JobRegistry>(
      new JobRegistry(std::move(options), std::move(store)));
  return registry;
}

JobRegistry::JobRegistry(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)) {
  last_job_number_ = store_->LastJobNumber();
}

absl::StatusOr<std::string> JobRegistry::Submit(v1::JobSpec spec) {
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&spec));
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = absl::StrFormat("job-%06d", ++last_job_number_);
  }
  // Durable first: a job is queued only once its spec is on disk.
  MPILEARN_RETURN_IF_ERROR(store_->WriteSpec(id, spec));
  auto job = std::make_shared<Job>(id, std::move(spec), options_.engine);
  {
    absl::MutexLock lock(&mu_);
    jobs_[id] = job;
    order_.push_back(id);
  }
  PersistHistory(*job);
  LOG(INFO) << "job " << job->id() << " queued: model " << job->spec().model().name()
            << ", " << job->spec().algorithm() << ", "
            << job->spec().optimizer().name() << ", " << job->spec().epochs()
            << " epochs";
  return job->id();
}

absl::StatusOr<v1::RegisterGroupResponse> JobRegistry::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  if (request.ranks() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks must be >= 1, got ", request.ranks()));
  }
  std::shared_ptr<Job> job;
  std::string group_id;
  {
    absl::MutexLock lock(&mu_);
    if (request.job_id().empty()) {
      for (const std::string& id : order_) {
        if (jobs_[id]->state() == v1::JOB_STATE_QUEUED) {
          job = jobs_[id];
          break;
        }
      }
      if (job == nullptr) {
        return absl::NotFoundError(
            "no queued job; submit one with `mpilearnctl submit SPEC.json` "
            "or start the workers with --job SPEC.json");
      }
    } else {
      auto it = jobs_.find(request.job_id());
      if (it == jobs_.end()) {
        return absl::NotFoundError(absl::StrCat(
            "unknown job '", request.job_id(),
            "'; `mpilearnctl list` shows the jobs this master holds"));
      }
      job = it->second;
    }
    group_id = absl::StrFormat("g-%d", ++last_group_number_);
  }
  MPILEARN_ASSIGN_OR_RETURN(
      v1::RegisterGroupResponse response,
      job->AddGroup(group_id, request.ranks(), request.host(), Now()));
  response.set_group_timeout_seconds(
      absl::ToDoubleSeconds(options_.group_timeout));
  LOG(INFO) << "job " << job->id() << ": group " << group_id << " joined ("
            << request.ranks() << " ranks on " << request.host() << ")";
  return response;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindJob(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown job '", job_id,
        "'; `mpilearnctl list` shows the jobs this master holds"));
  }
  return it->second;
}

absl::StatusOr<v1::InitWeightsResponse> JobRegistry::InitWeights(
    const std::string& job_id, const std::string& group_id,
    v1::TensorSetHeader header, std::vector<std::vector<float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(group_id, Now()));
  MPILEARN_ASSIGN_OR_RETURN(bool accepted,
                            job->InitWeights(std::move(header), std::move(values)));
  if (accepted) {
    LOG(INFO) << "job " << job_id << ": initial weights from group " << group_id;
  }
  v1::InitWeightsResponse response;
  response.set_accepted(accepted);
  MPILEARN_ASSIGN_OR_RETURN(auto weights, job->Weights());
  response.set_version(weights->header.version());
  return response;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
JobRegistry::ApplyGradient(Job& job, const GradientUpdate& update) {
  return job.ApplyGradient(update, Now());
}

absl::StatusOr<v1::NextDataUnitResponse> JobRegistry::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            FindJob(request.job_id()));
  MPILEARN_RETURN_IF_ERROR(job->Touch(request.group_id(), Now()));
  MPILEARN_ASSIGN_OR_RETURN(v1::NextDataUnitResponse response,
                            job->NextDataUnit(request, Now()));
  if (!response.finished_epochs().empty()) {
    for (int32_t epoch : response.finished_epochs()) {
      LOG(INFO) << "job " << job->id() << ": epoch " << epoch + 1
                << " finished; group " << request.group_id()
                << " validates it";
    }
    PersistHistory(*job);
  }
  if (response.finish()) {
    VLOG(1) << "job " << job->id() << ": group " << request.group_id()
            << " is to finish the job";
  }
  return response;
}

absl::StatusOr<v1::JobState> JobRegistry::ReportEpoch(
    const std::string& job_id, const v1::EpochRecord& record) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(record.group_id(), Now()));
  MPILEARN_RETURN_IF_ERROR(job->RecordEpoch(record, Now()));
  PersistHistory(*job);
  return job->state();
}

absl::StatusOr<v1::JobState> JobRegistry::Heartbeat(
    const std::string& job_id, const std::string& group_id) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(group_id, Now()));
  return job->state();
}

absl::StatusOr<v1::JobState> JobRegistry::Leave(
    const v1::LeaveRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  MPILEARN_ASSIGN_OR_RETURN(v1::JobState state, job->Leave(request));
  LOG(INFO) << "job " << job->id() << ": group " << request.group_id()
            << " left" << (request.error().empty() ? "" : " with error: ")
            << request.error() << "; job is " << v1::JobState_Name(state);
  if (state == v1::JOB_STATE_COMPLETED) {
    absl::StatusOr<JobCheckpoint> checkpoint = job->Checkpoint();
    absl::Status written = checkpoint.status();
    if (checkpoint.ok()) {
      written = store_->WriteWeights(job->id(), checkpoint->weights);
      if (written.ok()) {
        written = store_->WriteOptimizerState(job->id(),
                                              checkpoint->optimizer_state);
      }
    }
    if (!written.ok()) LOG(ERROR) << "job " << job->id() << ": " << written;
  }
  PersistHistory(*job);
  return state;
}

absl::StatusOr<v1::JobStatus> JobRegistry::Status(
    const std::string& job_id) const {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  return job->Status(/*with_history=*/true, Now());
}

std::vector<v1::JobStatus> JobRegistry::List() const {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  }
  std::vector<v1::JobStatus> out;
  for (const auto& job : jobs) {
    out.push_back(job->Status(/*with_history=*/false, Now()));
  }
  return out;
}

int JobRegistry::ReapLostGroups() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& entry : jobs_) jobs.push_back(entry.second);
  }
  int lost = 0;
  for (const auto& job : jobs) {
    const int n = job->ReapLostGroups(Now(), options_.group_timeout);
    if (n > 0) {
      LOG(WARNING) << "job " << job->id() << ": " << n
                   << " group(s) lost after "
                   << absl::FormatDuration(options_.group_timeout)
                   << " without contact; job is now "
                   << v1::JobState_Name(job->state());
      PersistHistory(*job);
    }
    lost += n;
  }
  return lost;
}

void JobRegistry::PersistHistory(const Job& job) const {
  absl::Status status =
      store_->WriteHistory(job.id(), job.Status(/*with_history=*/true, Now()));
  if (!status.ok()) LOG(ERROR) << "job " << job.id() << ": " << status;
}

}  // namespace mpilearn::server
