#include "server/master.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/core/job_tracer.h"

namespace mpilearn::server {

// The master's jobs as the study table needs them. Thread-safe (MasterCore
// is); never calls into the table.
class Master::CoreTrialJobs final : public opt::TrialJobs {
 public:
  explicit CoreTrialJobs(MasterCore& core) : core_(core) {}

  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec) override {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    MPILEARN_ASSIGN_OR_RETURN(v1::SubmitJobResponse response,
                              core_.SubmitJob(request));
    return response.job_id();
  }
  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) override {
    v1::GetJobStatusRequest request;
    request.set_job_id(job_id);
    return core_.GetJobStatus(request);
  }
  absl::Status Stop(const std::string& job_id,
                    const std::string& reason) override {
    return core_.StopJob(job_id, reason);
  }
  std::optional<std::string> FindByName(const std::string& name) override {
    return core_.FindJobByName(name);
  }

 private:
  MasterCore& core_;
};

// Wakes MPI Opt's study table when a trial's job recorded a validation, a
// group left it or it was cancelled, instead of leaving that to the table's
// next refresh. `studies` is set once the table exists.
class Master::StudyWake final : public JobObserver {
 public:
  explicit StudyWake(const std::atomic<opt::StudyTable*>& studies)
      : studies_(studies) {}

  void OnJobChanged(const std::string& /*job_id*/) override {
    opt::StudyTable* studies = studies_.load();
    if (studies != nullptr) studies->Wake();
  }

 private:
  const std::atomic<opt::StudyTable*>& studies_;
};

Master::Master() = default;

absl::StatusOr<std::unique_ptr<Master>> Master::Create(Options options) {
  auto master = std::unique_ptr<Master>(new Master());
  master->trace_ = options.trace;
  if (options.trace != nullptr) {
    master->job_tracer_ = std::make_unique<JobTracer>(*options.trace);
  }
  master->study_wake_ = std::make_unique<StudyWake>(master->studies_for_wake_);
  std::vector<JobObserver*>& observers = options.core.registry.observers;
  observers.push_back(master->job_tracer_.get());
  observers.push_back(master->study_wake_.get());
  const std::string state_dir = options.core.registry.state_dir;
  MPILEARN_ASSIGN_OR_RETURN(master->core_,
                            MasterCore::Create(std::move(options.core)));
  if (options.studies) {
    master->trial_jobs_ = std::make_unique<CoreTrialJobs>(*master->core_);
    opt::StudyTable::Options study_options;
    study_options.state_dir = state_dir;
    MPILEARN_ASSIGN_OR_RETURN(
        master->studies_,
        opt::StudyTable::Create(study_options, *master->trial_jobs_));
    master->studies_for_wake_.store(master->studies_.get());
  }
  return master;
}

void Master::Start() {
  if (ticker_.joinable() || stopping_.HasBeenNotified()) return;
  ticker_ = std::thread([this] {
    const absl::Duration period = core_->TickPeriod();
    bool flush_failed = false;
    while (!stopping_.WaitForNotificationWithTimeout(period)) {
      core_->Tick();  // lost groups, time-based checkpoints, write retries
      if (trace_ != nullptr) {
        const absl::Status flushed = trace_->Flush();
        if (!flushed.ok() && !flush_failed) {
          LOG(ERROR) << "trace: " << flushed;  // once; the disk may be full
        }
        flush_failed = !flushed.ok();
      }
    }
  });
}

void Master::CloseStreams() {
  if (stopping_.HasBeenNotified()) return;
  stopping_.Notify();
  // Snapshot streams never end on their own; closing the hub ends them now
  // rather than at the end of the transport's grace period.
  if (core_ != nullptr) core_->CloseSnapshots();
  // Study watches end too, and the table's thread stops.
  if (studies_ != nullptr) studies_->CloseWatches();
}

void Master::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  CloseStreams();
  if (ticker_.joinable()) ticker_.join();
  studies_for_wake_.store(nullptr);
  studies_.reset();  // joins its thread; no call uses it any more
  // No call runs any more: the checkpoints hold everything the jobs did.
  if (core_ != nullptr) core_->CheckpointAll();
}

Master::~Master() { Shutdown(); }

}  // namespace mpilearn::server
