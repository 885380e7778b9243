// One training job on the master: its spec, weights, optimizer, progress and
// the groups serving it.
//
// Threading: every public method is thread-safe; one mutex per job, so jobs
// never wait on each other. ApplyGradient holds the job's mutex only for the
// optimizer step and the bookkeeping; the gradient is assembled by the caller
// beforehand and the reply weights are handed out as an immutable snapshot
// that is encoded after the lock is released.
//
// Lifecycle: QUEUED -> RUNNING (a group registered) -> COMPLETED (a group
// left having trained every epoch) or FAILED (a group reported an error).
// A RUNNING job whose groups are all lost or gone goes back to QUEUED, keeping
// its weights and progress, so the next group continues it.
#ifndef MPILEARN_SERVER_JOB_H_
#define MPILEARN_SERVER_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/optimizer.h"

namespace mpilearn::server {

// Weights at one version. Immutable once published, so replies can encode it
// without holding the job's lock.
struct WeightsSnapshot {
  v1::TensorSetHeader header;  // header.version is the weight version
  std::vector<std::vector<float>> values;
};

// A gradient assembled from a PushGradient stream.
struct GradientUpdate {
  std::string group_id;
  int rank = 0;
  uint64_t base_version = 0;  // weight version the gradient was computed on
  uint64_t samples = 0;
  double train_loss = 0.0;
  std::vector<std::vector<float>> values;  // laid out as the job's weights
};

// A job's weights and optimizer state as the state directory stores them.
// optimizer_state lists, for each state buffer B of the optimizer and each
// weight tensor W, a tensor named "B/W" shaped like W; its header's version
// is the optimizer's step count.
struct JobCheckpoint {
  v1::TensorSet weights;
  v1::TensorSet optimizer_state;
};

class Job {
 public:
  // `engine` says where the job's optimizer runs (EngineOptions).
  Job(std::string id, v1::JobSpec spec, EngineOptions engine = {});

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& id() const { return id_; }
  const v1::JobSpec& spec() const { return spec_; }  // immutable

  v1::JobState state() const;

  // Adds a group; the job becomes RUNNING. FAILED_PRECONDITION when the job
  // has already ended.
  absl::StatusOr<v1::RegisterGroupResponse> AddGroup(const std::string& group_id,
                                                     int ranks,
                                                     const std::string& host,
                                                     absl::Time now);

  // Marks `group_id` as seen. NOT_FOUND for a group this job never had,
  // FAILED_PRECONDITION for one declared lost or gone.
  absl::Status Touch(const std::string& group_id, absl::Time now);

  // Installs the initial weights and builds the optimizer for them. Returns
  // false (not an error) when weights were already installed.
  absl::StatusOr<bool> InitWeights(v1::TensorSetHeader header,
                                   std::vector<std::vector<float>> values);

  // The weights' layout (names, shapes); FAILED_PRECONDITION before
  // InitWeights.
  absl::StatusOr<v1::TensorSetHeader> Layout() const;

  // Applies one update with the job's optimizer and returns the new weights.
  // The update must match Layout() (the caller checks it while assembling).
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ApplyGradient(
      const GradientUpdate& update, absl::Time now);

  // Weights and optimizer state, for the state directory;
  // FAILED_PRECONDITION before InitWeights.
  absl::StatusOr<JobCheckpoint> Checkpoint() const;

  // Installs weights and optimizer state from a checkpoint (instead of
  // InitWeights): training continues exactly where Checkpoint() was taken.
  // INVALID_ARGUMENT / DATA_LOSS if the checkpoint does not fit the job's
  // optimizer; FAILED_PRECONDITION if the job already has weights.
  absl::Status Restore(const JobCheckpoint& checkpoint);

  // Current weights; FAILED_PRECONDITION before InitWeights.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Weights() const;

  // Appends an epoch's metrics to the history.
  absl::Status RecordEpoch(const v1::EpochRecord& record, absl::Time now);

  // A group leaves: completed => COMPLETED, error => FAILED, else the group
  // is removed and the job re-queued if no group is left.
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request);

  // Declares groups silent for longer than `timeout` lost; returns how many.
  int ReapLostGroups(absl::Time now, absl::Duration timeout);

  v1::JobStatus Status(bool with_history, absl::Time now) const;

 private:
  struct Group {
    int ranks = 0;
    std::string host;
    absl::Time last_seen;
    bool alive = true;
  };

  int LiveGroupsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING -> QUEUED when no live group is left.
  void RequeueIfOrphanedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string id_;
  const v1::JobSpec spec_;
  const EngineOptions engine_;

  mutable absl::Mutex mu_;
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_QUEUED;
  std::string message_ ABSL_GUARDED_BY(mu_);
  // Invariant: weights_ and optimizer_ are both null before InitWeights and
  // both set after it. A snapshot handed out is never mutated: an update
  // steps weights_ in place only while nobody else holds it and copies it
  // first otherwise (copy-on-write).
  std::shared_ptr<WeightsSnapshot> weights_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  uint64_t updates_applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t samples_trained_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::EpochRecord> history_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  bool has_test_result_ ABSL_GUARDED_BY(mu_) = false;
  double test_loss_ ABSL_GUARDED_BY(mu_) = 0.0;
  double test_accuracy_ ABSL_GUARDED_BY(mu_) = 0.0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_JOB_H_
