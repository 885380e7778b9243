// Durable per-job files under the master's --state_dir:
//
//   <state_dir>/jobs/<job_id>/spec.json      the normalized job spec
//   <state_dir>/jobs/<job_id>/history.json   JobStatus with per-epoch history
//   <state_dir>/jobs/<job_id>/weights.pb     final weights (a TensorSet)
//   <state_dir>/jobs/<job_id>/optimizer.pb   final optimizer state (a
//                                            TensorSet, see JobCheckpoint)
//   <state_dir>/jobs/<job_id>/checkpoints/ckpt-<version>.pb
//                                            the job's newest checkpoints,
//                                            <version> the weight version in
//                                            12 zero-padded digits
//   <state_dir>/jobs/<job_id>/checkpoints/best.pb
//                                            the checkpoint taken when the
//                                            best validation arrived
//
// Checkpoint files are in the format of common/checkpoint_file.h (a
// serialized v1::JobCheckpointFile, then a CRC-32 and "MLCK" trailer), so a
// truncated or damaged file is never mistaken for a checkpoint.
// A file that fails the check is renamed <name>.corrupt when a master loads
// the job (QuarantineCheckpoint).
//
// Every file is written atomically: a temporary file in the same directory,
// fsync, rename. A reader therefore sees the old or the new file, never half
// of one. Thread-safe (no shared mutable state); the caller serialises the
// writes of one job's checkpoints (WriteCheckpoint prunes the older ones).
#ifndef MPILEARN_SERVER_CORE_JOB_STORE_H_
#define MPILEARN_SERVER_CORE_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint_file.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

class JobStore {
 public:
  // Creates <state_dir>/jobs if needed; error if it cannot be written.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& state_dir);

  // Highest numeric suffix of an existing job directory ("job-000041" -> 41)
  // or of a removed one (RemoveJob records it in <jobs>/last_job_number),
  // 0 if none, so a restarted master never reuses a job id.
  int64_t LastJobNumber() const;

  absl::Status WriteSpec(const std::string& job_id, const v1::JobSpec& spec);
  absl::Status WriteHistory(const std::string& job_id,
                            const v1::JobStatus& status);
  absl::Status WriteWeights(const std::string& job_id,
                            const v1::TensorSet& weights);

  absl::Status WriteOptimizerState(const std::string& job_id,
                                   const v1::TensorSet& state);

  // Writes checkpoints/ckpt-<version>.pb (version: the weights' header
  // version), replacing one of the same version, then deletes all but the
  // newest `keep` (>= 1) ckpt files.
  absl::Status WriteCheckpoint(const std::string& job_id,
                               const v1::JobCheckpointFile& checkpoint,
                               int keep);
  // Writes checkpoints/best.pb in the same format.
  absl::Status WriteBestCheckpoint(const std::string& job_id,
                                   const v1::JobCheckpointFile& checkpoint);
  // Paths of the job's ckpt files, newest (highest version) first.
  std::vector<std::string> CheckpointPaths(const std::string& job_id) const;
  // Reads and checks one checkpoint file: NOT_FOUND if it cannot be read,
  // DATA_LOSS (naming the file) if it is truncated, damaged or not a
  // checkpoint. Same as ReadCheckpointFile (common/checkpoint_file.h).
  static absl::StatusOr<v1::JobCheckpointFile> ReadCheckpoint(
      const std::string& path);
  // Renames a checkpoint that cannot be used to <path>.corrupt, so that it
  // is neither read again nor kept by the pruning in place of good ones.
  absl::Status QuarantineCheckpoint(const std::string& path);

  // Deletes the temporary files of atomic writes (WriteFileAtomically) that
  // a crash left in the job's directories. Only while no write is under way.
  void RemoveTempFiles(const std::string& job_id);

  // Deletes the job's directory and everything in it (DeleteJob), after
  // recording its number for LastJobNumber. Only while no write of the job
  // is under way.
  absl::Status RemoveJob(const std::string& job_id);

  // Ids of the job directories ("job-000041"), in ascending number.
  std::vector<std::string> JobIds() const;
  // The job's spec.json, normalized (ReadJobSpecFile).
  absl::StatusOr<v1::JobSpec> ReadSpec(const std::string& job_id) const;
  // The job's history.json; NOT_FOUND when there is none.
  absl::StatusOr<v1::JobStatus> ReadHistory(const std::string& job_id) const;

  std::string JobDir(const std::string& job_id) const;
  std::string CheckpointDir(const std::string& job_id) const;

 private:
  absl::Status WriteTensorSet(const std::string& job_id, const std::string& file,
                              const v1::TensorSet& set);

  explicit JobStore(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}

  const std::string jobs_dir_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_STORE_H_
