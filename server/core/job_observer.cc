#include "server/core/job_observer.h"

namespace mpilearn::server {

JobObservers::JobObservers(const std::vector<JobObserver*>& observers) {
  for (JobObserver* observer : observers) {
    if (observer != nullptr) observers_.push_back(observer);
  }
}

void JobObservers::OnUpdateApplied(const std::string& job_id,
                                   const v1::JobSpec& spec,
                                   const AppliedUpdate& update) {
  for (JobObserver* observer : observers_) {
    observer->OnUpdateApplied(job_id, spec, update);
  }
}

void JobObservers::OnEpochEnd(
    const std::string& job_id, const v1::JobSpec& spec,
    const std::shared_ptr<const WeightsSnapshot>& weights, int epochs_done) {
  for (JobObserver* observer : observers_) {
    observer->OnEpochEnd(job_id, spec, weights, epochs_done);
  }
}

void JobObservers::OnCheckpointWritten(const std::string& job_id,
                                       uint64_t version, absl::Time start,
                                       absl::Time end) {
  for (JobObserver* observer : observers_) {
    observer->OnCheckpointWritten(job_id, version, start, end);
  }
}

void JobObservers::OnJobChanged(const std::string& job_id) {
  for (JobObserver* observer : observers_) observer->OnJobChanged(job_id);
}

void JobObservers::OnJobEnded(const std::string& job_id) {
  for (JobObserver* observer : observers_) observer->OnJobEnded(job_id);
}

void JobObservers::OnJobDeleted(const std::string& job_id) {
  for (JobObserver* observer : observers_) observer->OnJobDeleted(job_id);
}

}  // namespace mpilearn::server
