// What the job registry tells the rest of the master as it happens, so that
// the registry needs none of it: the snapshot hub publishes weights, the
// metrics time updates, the trace records events (job_tracer.h) and MPI
// Opt's study table wakes when a trial's job changed. Each implements the
// calls it needs; the others do nothing.
//
// Threading: called from RPC threads and the master's tick, for many jobs
// at once, with no lock of the registry or of the job held. Implementations
// must be thread-safe, must not block (OnUpdateApplied runs on the update
// path) and must not call the registry. Observers must outlive the registry.
#ifndef MPILEARN_SERVER_CORE_JOB_OBSERVER_H_
#define MPILEARN_SERVER_CORE_JOB_OBSERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"

namespace mpilearn::server {

class JobObserver {
 public:
  virtual ~JobObserver() = default;

  // After every applied update (update.applied is true). Keep
  // update.weights only to publish them: while it is held, the next update
  // copies the weights instead of changing them in place.
  virtual void OnUpdateApplied(const std::string& /*job_id*/,
                               const v1::JobSpec& /*spec*/,
                               const AppliedUpdate& /*update*/) {}

  // When an epoch's last data unit completed (weights as of that moment;
  // null when the job has none on this master: its weights live on
  // parameter shards, or no group offered them yet).
  virtual void OnEpochEnd(
      const std::string& /*job_id*/, const v1::JobSpec& /*spec*/,
      const std::shared_ptr<const WeightsSnapshot>& /*weights*/,
      int /*epochs_done*/) {}

  // A checkpoint at `version` was taken and written between start and end.
  virtual void OnCheckpointWritten(const std::string& /*job_id*/,
                                   uint64_t /*version*/, absl::Time /*start*/,
                                   absl::Time /*end*/) {}

  // The job recorded a validation (ReportEpoch, ReportValidation), a group
  // left it, or it was cancelled.
  virtual void OnJobChanged(const std::string& /*job_id*/) {}

  // The job ended (completed, failed, stopped, cancelled).
  virtual void OnJobEnded(const std::string& /*job_id*/) {}

  // The ended job was deleted: whatever is kept for it can go.
  virtual void OnJobDeleted(const std::string& /*job_id*/) {}
};

// Several observers as one: each call goes to each, in the order given
// (null entries are left out). Immutable, hence thread-safe.
class JobObservers final : public JobObserver {
 public:
  explicit JobObservers(const std::vector<JobObserver*>& observers);

  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec& spec,
                       const AppliedUpdate& update) override;
  void OnEpochEnd(const std::string& job_id, const v1::JobSpec& spec,
                  const std::shared_ptr<const WeightsSnapshot>& weights,
                  int epochs_done) override;
  void OnCheckpointWritten(const std::string& job_id, uint64_t version,
                           absl::Time start, absl::Time end) override;
  void OnJobChanged(const std::string& job_id) override;
  void OnJobEnded(const std::string& job_id) override;
  void OnJobDeleted(const std::string& job_id) override;

 private:
  std::vector<JobObserver*> observers_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_OBSERVER_H_
