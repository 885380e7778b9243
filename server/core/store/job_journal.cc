#include "server/core/store/job_journal.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::server {
namespace {

// Unlocks a mutex locked (or TryLock'ed) by hand. Annotated as a scoped
// lock that takes over the held mutex, so clang's thread-safety analysis
// sees the release at scope exit.
class ABSL_SCOPED_LOCKABLE UnlockOnExit {
 public:
  explicit UnlockOnExit(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)
      : mu_(mu) {}
  ~UnlockOnExit() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  UnlockOnExit(const UnlockOnExit&) = delete;
  UnlockOnExit& operator=(const UnlockOnExit&) = delete;

 private:
  absl::Mutex& mu_;
};

// Retries of unwritten records: the first after kFirstRetry, then each
// twice as long after the previous, at most kMaxRetry apart.
constexpr absl::Duration kFirstRetry = absl::Seconds(1);
constexpr absl::Duration kMaxRetry = absl::Seconds(30);

// "a", "a and b", "a, b and c".
std::string JoinWithAnd(const std::vector<std::string>& items) {
  if (items.size() <= 1) return items.empty() ? "" : items[0];
  return absl::StrCat(absl::StrJoin(items.begin(), items.end() - 1, ", "),
                      " and ", items.back());
}

// A write error's message, cut to a length a status reply and a log line
// can carry (it names our own paths, not a client's text).
std::string BoundedCause(const absl::Status& cause) {
  constexpr size_t kMaxBytes = 400;
  const absl::string_view message = cause.message();
  if (message.size() <= kMaxBytes) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxBytes), "...");
}

}  // namespace

std::string JobJournal::PendingWrites::Describe() const {
  std::vector<std::string> what;
  if (final_checkpoint) what.push_back("final checkpoint");
  if (final_files != nullptr) {
    what.push_back("final weights.pb and optimizer.pb");
  }
  if (history) what.push_back("history.json");
  if (records) what.push_back("records.jsonl");
  return absl::StrCat(
      JoinWithAnd(what), " not written since ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", since, absl::UTCTimeZone()),
      ": ", BoundedCause(first_error));
}

JobJournal::JobJournal(std::shared_ptr<Job> job, const Context& context)
    : job_(std::move(job)), context_(context) {}

bool JobJournal::Closed() const {
  absl::MutexLock lock(&state_mu_);
  return closed_;
}

JobJournal::PendingWrites JobJournal::Pending() const {
  absl::MutexLock lock(&state_mu_);
  return pending_;
}

void JobJournal::Close() {
  {
    absl::MutexLock lock(&state_mu_);
    closed_ = true;
  }
  // A write under way ends first; one that takes its lock after this sees
  // closed_ and writes nothing.
  { absl::MutexLock wait_writes(&write_mu_); }
  { absl::MutexLock wait_checkpoint(&checkpoint_mu_); }
}

void JobJournal::PersistHistory(bool rewrite_records) {
  absl::MutexLock write_lock(&write_mu_);
  if (Closed()) return;  // deleted: its directory is gone and stays gone
  bool records = rewrite_records;
  {
    absl::MutexLock lock(&state_mu_);
    records = records || pending_.records;
  }
  const Job& job = *job_;
  absl::Status history_written;
  absl::Status records_written;
  if (records) {
    // records.jsonl first: history.json without the lists is written only
    // once they are on disk (it may be a file that still holds them).
    const v1::JobStatus status = job.Status(/*with_history=*/true, Now());
    records_written = context_.store->WriteRecords(job.id(), status);
    history_written = records_written.ok()
                          ? context_.store->WriteHistory(job.id(), status)
                          : records_written;
  } else {
    history_written = context_.store->WriteHistory(
        job.id(), job.Status(/*with_history=*/false, Now()));
  }
  UpdatePending(
      [&](PendingWrites& w) {
        w.history = !history_written.ok();
        if (records) w.records = !records_written.ok();
      },
      records_written.ok() ? history_written : records_written);
}

absl::Status JobJournal::Record(
    absl::FunctionRef<absl::StatusOr<JobStore::Records>()> add) {
  absl::MutexLock write_lock(&write_mu_);
  MPILEARN_ASSIGN_OR_RETURN(const JobStore::Records records, add());
  AppendRecords(records);
  return absl::OkStatus();
}

void JobJournal::AppendRecords(const JobStore::Records& records) {
  if (records.epochs.empty() && records.validations.empty()) return;
  {
    absl::MutexLock lock(&state_mu_);
    if (closed_) return;  // deleted meanwhile
    // The rewrite that is due will hold them.
    if (pending_.records) return;
  }
  const absl::Status appended =
      context_.store->AppendRecords(job_->id(), records);
  if (appended.ok()) return;
  // Rewritten whole by the retry: no cut line stays in the file.
  UpdatePending([](PendingWrites& w) { w.records = true; }, appended);
}

absl::Status JobJournal::Rollback(uint64_t version) {
  absl::MutexLock lock(&checkpoint_mu_);
  if (Closed()) return absl::FailedPreconditionError("the job was deleted");
  const std::string path = context_.store->CheckpointPath(job_->id(), version);
  MPILEARN_ASSIGN_OR_RETURN(v1::JobCheckpointFile file, JobStore::ReadCheckpoint(path));
  MPILEARN_RETURN_IF_ERROR(job_->Rollback(std::move(file)));
  return context_.store->RemoveCheckpointsAfter(job_->id(), version);
}

std::optional<v1::JobCheckpointFile> JobJournal::WriteCheckpoint(
    std::optional<CheckpointTrigger> trigger, bool wait, bool best,
    absl::Status* error, std::shared_ptr<const WeightsSnapshot> on_shards) {
  if (wait) {
    checkpoint_mu_.Lock();
  } else if (!checkpoint_mu_.TryLock()) {
    return std::nullopt;  // the write under way is at least as recent
  }
  UnlockOnExit unlock(checkpoint_mu_);
  if (Closed()) return std::nullopt;
  Job& job = *job_;
  std::optional<uint64_t> shards_version;
  if (on_shards != nullptr) shards_version = on_shards->header.version();
  if (trigger.has_value() && !job.CheckpointDue(*trigger, Now(), shards_version)) {
    return std::nullopt;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JobCheckpointFile> checkpoint = job.SaveCheckpoint(Now(), on_shards);
  if (!checkpoint.ok()) return std::nullopt;  // no weights yet
  const uint64_t version = checkpoint->weights().header().version();
  absl::Status written = context_.store->WriteCheckpoint(
      job.id(), *checkpoint, job.spec().checkpoint().keep());
  if (!written.ok()) {
    if (error != nullptr) {
      *error = written;
    } else {
      LOG(ERROR) << "job " << job.id() << ": checkpoint at version " << version
                 << " not written: " << written;
    }
    return std::nullopt;
  }
  job.CheckpointWritten(version);
  // every_updates may checkpoint many times a second; the others are rare.
  if (trigger == CheckpointTrigger::kUpdates) {
    VLOG(1) << "job " << job.id() << ": checkpoint at version " << version;
  } else {
    LOG(INFO) << "job " << job.id() << ": checkpoint at version " << version;
  }
  if (best) {
    written = context_.store->WriteBestCheckpoint(job.id(), *checkpoint);
    if (written.ok()) {
      LOG(INFO) << "job " << job.id() << ": best.pb at version " << version
                << " (" << job.spec().checkpoint().best_metric() << " "
                << checkpoint->status().best_metric_value() << ")";
    } else {
      LOG(ERROR) << "job " << job.id() << ": best.pb not written: " << written;
    }
  }
  context_.observer->OnCheckpointWritten(job.id(), version, start, absl::Now());
  return std::move(checkpoint).value();
}

void JobJournal::WriteJobEnd(bool ended_now, bool best) {
  Job& job = *job_;
  absl::Status error;
  std::optional<v1::JobCheckpointFile> checkpoint =
      WriteCheckpoint(std::nullopt, /*wait=*/true, best, &error);
  // The final checkpoint is on disk (or the job never had weights): the
  // tensors go. A failed write keeps them for the retry.
  const bool on_disk = checkpoint.has_value() || !job.Weights().ok();
  if (!Closed()) {
    UpdatePending(
        [&](PendingWrites& pending) {
          pending.final_best = !on_disk && (best || pending.final_best);
          pending.final_checkpoint = !on_disk;
        },
        error);
    if (checkpoint.has_value() &&
        checkpoint->status().state() == v1::JOB_STATE_COMPLETED) {
      const absl::Status written = WriteFinalFiles(*checkpoint);
      std::shared_ptr<const v1::JobCheckpointFile> unwritten;
      if (!written.ok()) {
        unwritten = std::make_shared<const v1::JobCheckpointFile>(
            *std::move(checkpoint));
      }
      UpdatePending(
          [&](PendingWrites& pending) {
            pending.final_files = std::move(unwritten);
          },
          written);
    }
  }
  if (on_disk && job.Releasable() && job.ReleaseMemory()) {
    VLOG(1) << "job " << job.id() << ": weights and optimizer state released";
  }
  if (ended_now) context_.observer->OnJobEnded(job.id());
}

void JobJournal::AfterValidation(const ValidationEffect& effect) {
  if (effect.stopped) {
    LOG(INFO) << "job " << job_->id() << " stopped: "
              << job_->Status(/*with_history=*/false, Now()).stop_reason();
    WriteJobEnd(/*ended_now=*/true, effect.best_improved);
  } else if (effect.best_improved) {
    WriteCheckpoint(std::nullopt, /*wait=*/true, /*best=*/true);
  }
}

void JobJournal::RetryIfDue(bool force) {
  // A copy: the writes below update the pending writes themselves.
  const PendingWrites w = Pending();
  if (!w.Any() || (!force && Now() < w.next_retry)) return;
  VLOG(1) << "job " << job_->id() << ": retrying unwritten records";
  if (w.final_checkpoint) {
    // As at the end: the checkpoint from the kept tensors, weights.pb and
    // optimizer.pb with it, then the tensors go.
    WriteJobEnd(/*ended_now=*/false, w.final_best);
  } else if (w.final_files != nullptr) {
    const absl::Status written = WriteFinalFiles(*w.final_files);
    UpdatePending(
        [&](PendingWrites& now) {
          if (written.ok() && now.final_files == w.final_files) {
            now.final_files.reset();
          }
        },
        written);
  }
  if (w.history || w.records) PersistHistory();
  const absl::Duration wait = BackOff(kMaxRetry);
  if (wait > absl::ZeroDuration()) {
    VLOG(1) << "job " << job_->id() << ": still unwritten; next try in "
            << absl::FormatDuration(wait);
  }
}

std::string JobJournal::Unwritten() const {
  const PendingWrites w = Pending();
  return w.Any() ? w.Describe() : "";
}

std::string JobJournal::StorageError() const {
  const std::string unwritten = Unwritten();
  if (unwritten.empty()) return "";
  return absl::StrCat(unwritten, "; retrying");
}

absl::Status JobJournal::WriteFinalFiles(
    const v1::JobCheckpointFile& checkpoint) const {
  MPILEARN_RETURN_IF_ERROR(
      context_.store->WriteWeights(job_->id(), checkpoint.weights()));
  return context_.store->WriteOptimizerState(job_->id(),
                                             checkpoint.optimizer_state());
}

void JobJournal::UpdatePending(
    const std::function<void(PendingWrites&)>& change,
    const absl::Status& error) {
  const std::string& job_id = job_->id();
  absl::MutexLock lock(&state_mu_);
  PendingWrites& w = pending_;
  const bool was_pending = w.Any();
  change(w);
  if (w.Any() && !was_pending) {
    // A streak begins: logged once, retried with a backoff.
    w.first_error =
        error.ok() ? absl::UnknownError("cause not reported") : error;
    w.since = Now();
    w.backoff = kFirstRetry;
    w.next_retry = w.since + w.backoff;
    LOG(ERROR) << "job " << job_id << ": " << w.Describe()
               << "; retrying (after " << absl::FormatDuration(kFirstRetry)
               << ", backing off to " << absl::FormatDuration(kMaxRetry)
               << ") until written";
  } else if (w.Any() && !error.ok()) {
    VLOG(1) << "job " << job_id << ": still not written: " << error;
  } else if (!w.Any() && was_pending) {
    LOG(INFO) << "job " << job_id
              << ": storage recovered, every record written ("
              << absl::FormatDuration(Now() - w.since)
              << " after the first failure)";
    w.first_error = absl::OkStatus();
    w.since = absl::InfinitePast();
    w.backoff = absl::ZeroDuration();
    w.next_retry = absl::InfinitePast();
  }
}

absl::Duration JobJournal::BackOff(absl::Duration max) {
  const absl::Time now = Now();
  absl::MutexLock lock(&state_mu_);
  if (!pending_.Any()) return absl::ZeroDuration();
  pending_.backoff = std::min(2 * pending_.backoff, max);
  pending_.next_retry = now + pending_.backoff;
  return pending_.backoff;
}

}  // namespace mpilearn::server
