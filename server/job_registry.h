// The master's core: every job it holds, the queue, and the groups serving
// them. The gRPC service (master_service.h) is a thin translation layer over
// this class; unit tests drive it directly, without a network.
//
//   auto registry = JobRegistry::Create({.state_dir = "/var/lib/mpilearn"});
//   std::string job_id = (*registry)->Submit(spec).value();
//   auto group = (*registry)->RegisterGroup(request);   // takes the job
//
// Threading: thread-safe. The registry's mutex guards only the job table; each
// job has its own mutex (job.h), so an update to one job never waits on
// another. Errors are absl::Status values whose messages tell the caller what
// to do; the service maps them to gRPC codes unchanged.
#ifndef MPILEARN_SERVER_JOB_REGISTRY_H_
#define MPILEARN_SERVER_JOB_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/job.h"
#include "server/job_store.h"

namespace mpilearn::server {

class JobRegistry {
 public:
  struct Options {
    // Where job specs, histories and final weights are written.
    std::string state_dir;
    // A group with no call for this long is declared lost; its job is
    // re-queued if no other group serves it.
    absl::Duration group_timeout = absl::Seconds(60);
    // Where jobs' optimizers run (device, CPU threads).
    EngineOptions engine;
    // Injected for tests.
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  static absl::StatusOr<std::unique_ptr<JobRegistry>> Create(Options options);

  // Validates, fills defaults, stores and queues a job; returns its id.
  absl::StatusOr<std::string> Submit(v1::JobSpec spec);

  // Attaches a group to the named job, or to the oldest queued job when
  // request.job_id() is empty.
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request);

  // NOT_FOUND with a hint for an unknown id.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id) const;

  // Marks the group as seen and installs the initial weights if none are
  // installed yet (returns whether these were taken).
  absl::StatusOr<v1::InitWeightsResponse> InitWeights(
      const std::string& job_id, const std::string& group_id,
      v1::TensorSetHeader header, std::vector<std::vector<float>> values);

  // Applies an update (gradient, elastic or delta; see job.h). Checks it in
  // full (kind, layout sizes, NaN/Inf, staleness), so in-process callers
  // need no checks of their own.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ApplyGradient(
      Job& job, const GradientUpdate& update);

  // The data queue: marks the group as seen, records its completed units
  // and hands out the next one (Job::NextDataUnit). Persists the history
  // when the request finished an epoch.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request);

  // Merges the group's validation metrics into the master's record of a
  // finished epoch (Job::RecordEpoch) and persists the history.
  absl::StatusOr<v1::JobState> ReportEpoch(const std::string& job_id,
                                           const v1::EpochRecord& record);
  absl::StatusOr<v1::JobState> Heartbeat(const std::string& job_id,
                                         const std::string& group_id);
  // Ends the group's part; persists history (and weights on completion).
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request);

  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) const;
  std::vector<v1::JobStatus> List() const;

  // Declares silent groups lost (see Options::group_timeout); returns the
  // number. The server calls this periodically.
  int ReapLostGroups();

  absl::Duration group_timeout() const { return options_.group_timeout; }
  absl::Time Now() const { return options_.clock(); }

 private:
  JobRegistry(Options options, std::unique_ptr<JobStore> store);

  // Persists the job's status; failures are logged, not returned, because
  // the in-memory state stays authoritative and the next write retries.
  void PersistHistory(const Job& job) const;

  const Options options_;
  const std::unique_ptr<JobStore> store_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order, for taking the oldest queued job.
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  int64_t last_job_number_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_group_number_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_JOB_REGISTRY_H_
