// Durable per-job files under the master's --state_dir:
//
//   <state_dir>/jobs/<job_id>/spec.json      the normalized job spec
//   <state_dir>/jobs/<job_id>/history.json   JobStatus without its `history`
//                                            and `validations` lists
//   <state_dir>/jobs/<job_id>/records.jsonl  those lists, appended to as
//                                            each record arrives (below)
//   <state_dir>/jobs/<job_id>/weights.pb     final weights (a TensorSet)
//   <state_dir>/jobs/<job_id>/optimizer.pb   final optimizer state (a
//                                            TensorSet, see JobCheckpoint)
//   <state_dir>/jobs/<job_id>/checkpoints/ckpt-<version>.pb
//                                            the job's newest checkpoints,
//                                            <version> the weight version in
//                                            12 zero-padded digits
//   <state_dir>/jobs/<job_id>/shard_manifest.json
//                                            on a lead, a sharded job's set
//                                            of shard checkpoints that
//                                            restore together
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
// records.jsonl holds one JSON object per line, each ending in "\n":
//
//   {"epoch":{...}}       a v1::EpochRecord (proto JSON, proto field names);
//                         it replaces an earlier record of the same epoch
//                         number (the master's record, then the one merged
//                         with the group's validation), else it is added
//   {"validation":{...}}  a v1::ValidationRecord, added to the list
//   {"reset":true}        drops every record before it, those in
//                         history.json included: a rewrite (WriteRecords)
//                         starts with it
//
// ReadHistory merges: history.json's status, then the lines replayed in
// order. A history.json written before records.jsonl existed holds both
// lists itself and still loads (lines, if any, replay on top of them).
// A last line that is cut short (a crash during an append: no final "\n",
// or unparsable) is skipped with a warning; a bad line before it is
// DATA_LOSS naming the file and line; a line of another kind than these
// three is skipped with a warning (written by a newer master). A
// records.jsonl over kMaxRecordsBytes is refused unread, one with a line
// over kMaxRecordLineBytes when that line is reached (RESOURCE_EXHAUSTED).
//
// Every other file is written atomically: a temporary file in the same
// directory, fsync, rename. A reader therefore sees the old or the new file,
// never half of one. AppendRecords appends and fdatasyncs instead (a crash
// can cut only its last line). Thread-safe (no shared mutable state); the
// caller serialises the writes of one job's checkpoints (WriteCheckpoint
// prunes the older ones) and of one job's records.jsonl (AppendRecords,
// WriteRecords).
#ifndef MPILEARN_SERVER_CORE_STORE_JOB_STORE_H_
#define MPILEARN_SERVER_CORE_STORE_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/checkpoint_file.h"
#include "common/spec/job_config.h"
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

  // Bounds on what ReadHistory reads of records.jsonl.
  static constexpr int64_t kMaxRecordsBytes = int64_t{256} << 20;
  static constexpr int64_t kMaxRecordLineBytes = int64_t{1} << 20;

  // Epoch and validation records, for records.jsonl.
  struct Records {
    std::vector<v1::EpochRecord> epochs;
    std::vector<v1::ValidationRecord> validations;
  };

  // What ReadHistory found besides the status.
  struct HistoryFormat {
    // history.json held the lists itself (written before records.jsonl
    // existed): WriteRecords must run before the next WriteHistory, which
    // leaves them out.
    bool lists_in_history = false;
    // Lines replayed from records.jsonl, and whether a cut last line was
    // skipped.
    int64_t record_lines = 0;
    bool torn_tail = false;
  };

  absl::Status WriteSpec(const std::string& job_id, const v1::JobSpec& spec);
  // Writes history.json: `status` without its history and validations
  // lists (they belong in records.jsonl).
  absl::Status WriteHistory(const std::string& job_id,
                            const v1::JobStatus& status);
  // Replaces records.jsonl (atomically) by a reset line and every record of
  // `status`'s history and validations lists.
  absl::Status WriteRecords(const std::string& job_id,
                            const v1::JobStatus& status);
  // Appends `records` to records.jsonl (epochs first), one line each, in
  // one write, then fdatasync. The job's directory must exist. A file that
  // does not end in "\n" (a cut line) is refused (DATA_LOSS) untouched:
  // the caller rewrites it with WriteRecords. A failed write is cut back
  // to the old length where possible; either way the caller must rewrite
  // the file before appending again.
  absl::Status AppendRecords(const std::string& job_id, const Records& records);
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
  // Weight versions of the job's ckpt files, newest first (at most
  // `limit`), from their names.
  std::vector<uint64_t> CheckpointVersions(const std::string& job_id,
                                           size_t limit) const;
  // Where the ckpt file of `version` is, relative to the state directory
  // ("jobs/<id>/checkpoints/ckpt-<version>.pb"; ShardManifest), and on disk.
  static std::string CheckpointName(const std::string& job_id, uint64_t version);
  std::string CheckpointPath(const std::string& job_id, uint64_t version) const;
  // Deletes the ckpt files of versions above `version` (a roll-back to it),
  // so that a restart never loads one of them.
  absl::Status RemoveCheckpointsAfter(const std::string& job_id, uint64_t version);
  // Writes <job>/shard_manifest.json (a lead's restore set of a sharded job).
  absl::Status WriteShardManifest(const std::string& job_id,
                                  const v1::ShardManifest& manifest);
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
  absl::StatusOr<JobConfig> ReadSpec(const std::string& job_id) const;
  // The job's history.json merged with its records.jsonl (see the file
  // comment); NOT_FOUND when there is no history.json. `format`, when
  // given, receives what was found.
  absl::StatusOr<v1::JobStatus> ReadHistory(
      const std::string& job_id, HistoryFormat* format = nullptr) const;
  // history.json alone (its lists, if any, but no records): the job's
  // state when records.jsonl cannot be read.
  absl::StatusOr<v1::JobStatus> ReadHistoryStatus(
      const std::string& job_id) const;
  // Renames an unreadable records.jsonl to records.jsonl.corrupt (kept for
  // a human), so that WriteRecords can start a new one.
  absl::Status QuarantineRecords(const std::string& job_id);
  // The last-modified times of history.json and of a checkpoint file;
  // InfinitePast when missing. LoadJobs uses them to tell which was
  // written last.
  absl::Time ModifiedTime(const std::string& path) const;
  std::string HistoryPath(const std::string& job_id) const;
  std::string RecordsPath(const std::string& job_id) const;

  std::string JobDir(const std::string& job_id) const;
  std::string CheckpointDir(const std::string& job_id) const;

 private:
  // Renames `path` to <path>.corrupt (QuarantineCheckpoint,
  // QuarantineRecords).
  static absl::Status Quarantine(const std::string& path);
  absl::Status WriteTensorSet(const std::string& job_id,
                              const std::string& file,
                              const v1::TensorSet& set);

  explicit JobStore(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}

  const std::string jobs_dir_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_STORE_JOB_STORE_H_
