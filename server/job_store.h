// Durable per-job files under the master's --state_dir:
//
//   <state_dir>/jobs/<job_id>/spec.json      the normalized job spec
//   <state_dir>/jobs/<job_id>/history.json   JobStatus with per-epoch history
//   <state_dir>/jobs/<job_id>/weights.pb     final weights (a TensorSet)
//   <state_dir>/jobs/<job_id>/optimizer.pb   final optimizer state (a
//                                            TensorSet, see JobCheckpoint)
//
// Every file is written atomically: a temporary file in the same directory,
// fsync, rename. A reader therefore sees the old or the new file, never half
// of one. Thread-safe (no shared mutable state; one job's files are written
// by that job's callers in order).
#ifndef MPILEARN_SERVER_JOB_STORE_H_
#define MPILEARN_SERVER_JOB_STORE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

class JobStore {
 public:
  // Creates <state_dir>/jobs if needed; error if it cannot be written.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& state_dir);

  // Highest numeric suffix of an existing job directory ("job-000041" -> 41),
  // 0 if none, so a restarted master never reuses a job id.
  int64_t LastJobNumber() const;

  absl::Status WriteSpec(const std::string& job_id, const v1::JobSpec& spec);
  absl::Status WriteHistory(const std::string& job_id,
                            const v1::JobStatus& status);
  absl::Status WriteWeights(const std::string& job_id,
                            const v1::TensorSet& weights);

  absl::Status WriteOptimizerState(const std::string& job_id,
                                   const v1::TensorSet& state);

  std::string JobDir(const std::string& job_id) const;

 private:
  absl::Status WriteTensorSet(const std::string& job_id, const std::string& file,
                              const v1::TensorSet& set);

  explicit JobStore(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}

  const std::string jobs_dir_;
};

// Writes `contents` to `path` atomically (temp file, fsync, rename).
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_JOB_STORE_H_
