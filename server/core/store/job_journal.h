// A job's journal: every write of one job's files after its spec
// (history.json, records.jsonl, checkpoints, best.pb, and for a COMPLETED
// job weights.pb and optimizer.pb; job_store.h has the formats), and the
// retries of those that failed. The job registry owns one per job and says
// when to write; the journal says how.
//
// Failed writes: a history.json, records.jsonl, final checkpoint or final
// weights.pb/optimizer.pb write that fails is remembered and retried by
// RetryIfDue (after 1 s, doubling to 30 s between tries) until it
// succeeds; the first failure of a streak is logged (ERROR) and so is the
// recovery (INFO). Meanwhile StorageError says what is missing, since when
// and why. A job whose final checkpoint is unwritten keeps its tensors
// until it is written. Other checkpoint writes are logged, not retried.
//
// Threading: thread-safe. write_mu_ serialises the history.json and
// records.jsonl writes and is held across adding records to the job and
// appending them (Record), so the file's order is the job's; checkpoint_mu_
// serialises checkpoint writes. Lock order: write_mu_ -> Job::mu_ and
// checkpoint_mu_ -> Job::mu_; state_mu_ is a leaf; write_mu_ and
// checkpoint_mu_ are never held together. The journal never calls the
// registry. After Close nothing is written.
#ifndef MPILEARN_SERVER_CORE_STORE_JOB_JOURNAL_H_
#define MPILEARN_SERVER_CORE_STORE_JOB_JOURNAL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job.h"
#include "server/core/job_observer.h"
#include "server/core/store/job_store.h"

namespace mpilearn::server {

class JobJournal {
 public:
  // What every journal of a registry shares; must outlive them.
  struct Context {
    JobStore* store = nullptr;
    // Told of checkpoints written and of jobs ended; never null.
    JobObserver* observer = nullptr;
    std::function<absl::Time()> clock;
  };

  JobJournal(std::shared_ptr<Job> job, const Context& context);
  JobJournal(const JobJournal&) = delete;
  JobJournal& operator=(const JobJournal&) = delete;

  // Writes history.json, and with `rewrite_records` (or while records.jsonl
  // is unwritten) first records.jsonl in full. A failure is not returned:
  // the job in memory stays authoritative and the write is retried.
  void PersistHistory(bool rewrite_records = false)
      ABSL_LOCKS_EXCLUDED(write_mu_);

  // Runs `add`, which adds records to the job and returns them, under
  // write_mu_, and appends what it returns to records.jsonl (unless the
  // file is to be rewritten anyway). Returns add's error, appending nothing.
  absl::Status Record(
      absl::FunctionRef<absl::StatusOr<JobStore::Records>()> add)
      ABSL_LOCKS_EXCLUDED(write_mu_);

  // Takes a checkpoint of the job and writes it, and with `best` best.pb
  // too. With a trigger, only if the checkpoint is due once the job's
  // previous write is done; without `wait`, not at all while another write
  // is under way. Returns what was written; nothing when no checkpoint was
  // taken (not due, busy, no weights yet, closed) or the write failed
  // (logged, or with `error` returned there instead). `on_shards`: a
  // lead's sharded job, whose weights were gathered from its shards
  // (Job::SaveCheckpoint).
  std::optional<v1::JobCheckpointFile> WriteCheckpoint(
      std::optional<CheckpointTrigger> trigger, bool wait, bool best,
      absl::Status* error = nullptr,
      std::shared_ptr<const WeightsSnapshot> on_shards = nullptr)
      ABSL_LOCKS_EXCLUDED(checkpoint_mu_);

  // A slice on its shard rolled back to its own checkpoint of `version`
  // (Job::Rollback), and its newer checkpoints deleted, between checkpoint
  // writes. NOT_FOUND naming the file when there is no such checkpoint.
  absl::Status Rollback(uint64_t version) ABSL_LOCKS_EXCLUDED(checkpoint_mu_);

  // After the job ended (`ended_now`) or got the test result after a stop
  // rule ended it: final checkpoint (and best.pb with `best`), weights.pb
  // and optimizer.pb for a COMPLETED job, the observer told with
  // `ended_now`. What fails becomes pending; the tensors are released once
  // the final checkpoint is on disk.
  void WriteJobEnd(bool ended_now, bool best);

  // weights.pb and optimizer.pb from a COMPLETED job's final checkpoint
  // (also a lead's of a sharded job, whose weights it gathered).
  absl::Status WriteFinalFiles(const v1::JobCheckpointFile& checkpoint) const;

  // Acts on what a validation did: best.pb, or the job's end.
  void AfterValidation(const ValidationEffect& effect);

  // Retries the unwritten records if their retry is due (always with
  // `force`).
  void RetryIfDue(bool force);

  // What is unwritten, since when and why; empty when nothing is.
  std::string Unwritten() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // JobStatus.storage_error: Unwritten() and that it is being retried.
  std::string StorageError() const ABSL_LOCKS_EXCLUDED(state_mu_);

  // The job was deleted: waits for the writes under way; none starts after.
  void Close() ABSL_LOCKS_EXCLUDED(write_mu_, checkpoint_mu_, state_mu_);

 private:
  // The job's records not on disk yet (failed writes).
  struct PendingWrites {
    bool history = false;           // history.json
    bool records = false;           // records.jsonl, to be rewritten whole
    bool final_checkpoint = false;  // the ended job's final checkpoint
    bool final_best = false;        //   and best.pb with it
    // weights.pb and optimizer.pb of a COMPLETED job, from this final
    // checkpoint (whose own file is on disk).
    std::shared_ptr<const v1::JobCheckpointFile> final_files;
    // The streak: its first error, when it began, the next retry.
    absl::Status first_error;
    absl::Time since = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    absl::Time next_retry = absl::InfinitePast();

    bool Any() const {
      return history || records || final_checkpoint || final_files != nullptr;
    }
    // "final checkpoint and history.json not written since 2026-11-25
    // 00:41:07 UTC: <cause>".
    std::string Describe() const;
  };

  absl::Time Now() const { return context_.clock(); }
  bool Closed() const ABSL_LOCKS_EXCLUDED(state_mu_);
  PendingWrites Pending() const ABSL_LOCKS_EXCLUDED(state_mu_);

  // Applies `change` to the pending writes after a write whose result is
  // `error`: starts a streak (logged once, first retry in 1 s) when
  // something became pending, ends it (logged) when nothing is left.
  void UpdatePending(const std::function<void(PendingWrites&)>& change,
                     const absl::Status& error) ABSL_LOCKS_EXCLUDED(state_mu_);
  // After a retry: while anything is still pending, the next try waits
  // twice as long as the last (at most `max`). Returns that wait, or zero
  // when nothing is pending.
  absl::Duration BackOff(absl::Duration max) ABSL_LOCKS_EXCLUDED(state_mu_);

  void AppendRecords(const JobStore::Records& records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  const std::shared_ptr<Job> job_;
  const Context& context_;

  absl::Mutex write_mu_;
  absl::Mutex checkpoint_mu_;
  mutable absl::Mutex state_mu_;
  PendingWrites pending_ ABSL_GUARDED_BY(state_mu_);
  bool closed_ ABSL_GUARDED_BY(state_mu_) = false;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_STORE_JOB_JOURNAL_H_
