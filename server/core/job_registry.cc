// JobRegistry (job_registry.h). About 1,050 lines: the job table, loading a
// state directory at start, when each durable write happens, how failed
// writes are remembered and retried, and how a job ends and leaves (cancel,
// releasing its tensors, delete) belong together (the write policy reads as
// one piece); the per-job logic lives in job.cc and its parts.
#include "server/core/job_registry.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/bounded_text.h"
#include "common/error_reason.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"

namespace mpilearn::server {
namespace {

bool Ended(v1::JobState state) { return JobStateEnded(state); }

// "job-000041" -> 41; -1 for an id of another form.
int64_t JobNumber(const std::string& job_id) {
  int64_t number = 0;
  if (absl::StartsWith(job_id, "job-") &&
      absl::SimpleAtoi(job_id.substr(4), &number)) {
    return number;
  }
  return -1;
}

// Raises `last` to the highest group number ("g-12" -> 12) in `status`.
void NoteGroupNumbers(const v1::JobStatus& status, int64_t* last) {
  for (const v1::GroupInfo& group : status.groups()) {
    int64_t number = 0;
    if (absl::StartsWith(group.group_id(), "g-") &&
        absl::SimpleAtoi(group.group_id().substr(2), &number)) {
      *last = std::max(*last, number);
    }
  }
}

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
  return absl::StrCat(
      absl::StrJoin(items.begin(), items.end() - 1, ", "), " and ",
      items.back());
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

std::string JobRegistry::PendingWrites::Describe() const {
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

absl::StatusOr<std::unique_ptr<JobRegistry>> JobRegistry::Create(
    Options options) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                            JobStore::Open(options.state_dir));
  auto registry = std::unique_ptr<JobRegistry>(
      new JobRegistry(std::move(options), std::move(store)));
  if (registry->options_.resume_jobs) registry->LoadJobs();
  return registry;
}

JobRegistry::JobRegistry(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)) {
  last_job_number_ = store_->LastJobNumber();
}

void JobRegistry::LoadJobs() {
  int64_t last_group = 0;
  struct Loaded {
    std::shared_ptr<Job> job;
    bool persist = false;          // its history.json is to be written
    bool rewrite_records = false;  // and records.jsonl in full before it
  };
  std::vector<Loaded> loaded;
  for (const std::string& id : store_->JobIds()) {
    absl::StatusOr<v1::JobSpec> spec = store_->ReadSpec(id);
    if (!spec.ok()) {
      LOG(WARNING) << "job " << id << " not loaded: " << spec.status();
      continue;
    }
    JobStore::HistoryFormat format;
    absl::StatusOr<v1::JobStatus> history = store_->ReadHistory(id, &format);
    // records.jsonl unreadable: history.json alone still says whether the
    // job ended; the lists come from the checkpoint.
    bool records_lost = false;
    if (!history.ok() && !absl::IsNotFound(history.status())) {
      LOG(WARNING) << "job " << id << ": " << history.status();
      absl::StatusOr<v1::JobStatus> alone = store_->ReadHistoryStatus(id);
      if (alone.ok()) {
        records_lost = true;
        const absl::Status moved = store_->QuarantineRecords(id);
        LOG(WARNING) << "job " << id << ": "
                     << (moved.ok() ? "records.jsonl renamed "
                                      "records.jsonl.corrupt"
                                    : moved.ToString())
                     << "; its epoch and validation lists come from its "
                        "checkpoint";
        history = std::move(alone);
      } else {
        LOG(WARNING) << "job " << id << ": using its checkpoint or spec alone";
      }
    }
    store_->RemoveTempFiles(id);  // of writes a crash interrupted
    // Written before records.jsonl existed, or cut by a crash: rewritten
    // whole (a reset line first) before anything is appended.
    const bool rewrite =
        format.lists_in_history || format.torn_tail || records_lost;
    if (history.ok() && Ended(history->state())) {
      // An ended job comes back from its record alone: its tensors stay on
      // disk (EndedWeights reads them when asked for). Unless its newest
      // checkpoint is younger than history.json (a history write failed
      // after it) or the lists were lost: then that checkpoint is read, and
      // if it says the job ended, its word wins (never a non-ended one).
      v1::JobStatus record = *std::move(history);
      bool newer = false;
      const std::vector<std::string> paths = store_->CheckpointPaths(id);
      if (!paths.empty() &&
          (records_lost || store_->ModifiedTime(paths[0]) >
                               store_->ModifiedTime(store_->HistoryPath(id)))) {
        absl::StatusOr<v1::JobCheckpointFile> file =
            JobStore::ReadCheckpoint(paths[0]);
        if (file.ok() && Ended(file->status().state())) {
          v1::JobStatus from_file = file->status();
          // records.jsonl was appended as records came: at least as new.
          if (!records_lost &&
              record.validations_size() >= from_file.validations_size() &&
              record.history_size() >= from_file.history_size()) {
            *from_file.mutable_history() = record.history();
            *from_file.mutable_validations() = record.validations();
          }
          // A test result is never lost to an older checkpoint.
          if (!from_file.has_test_loss() && record.has_test_loss()) {
            from_file.set_test_loss(record.test_loss());
            if (record.has_test_accuracy()) {
              from_file.set_test_accuracy(record.test_accuracy());
            }
            *from_file.mutable_test_metrics() = record.test_metrics();
          }
          // Taken before its own write: the file's version is on disk.
          from_file.set_checkpoint_version(file->weights().header().version());
          record = std::move(from_file);
          newer = true;
          LOG(INFO) << "job " << id << ": its checkpoint '" << paths[0]
                    << "' is newer than its history.json and says "
                    << v1::JobState_Name(record.state()) << "; using it";
        } else if (!file.ok()) {
          LOG(WARNING) << "job " << id << ": " << file.status();
        }
      }
      NoteGroupNumbers(record, &last_group);
      auto job = std::make_shared<Job>(id, *spec, options_.engine);
      job->ResumeEnded(record);
      LOG(INFO) << "job " << id << " loaded from its history: "
                << v1::JobState_Name(record.state()) << ", version "
                << record.version() << " (tensors left on disk)";
      loaded.push_back({std::move(job), newer || rewrite, newer || rewrite});
      continue;
    }
    // The newest checkpoint that reads and fits. Newer ones that do not are
    // renamed *.corrupt, so that pruning never keeps them over good ones.
    std::shared_ptr<Job> job;
    std::string source = "its spec (no usable checkpoint)";
    for (const std::string& path : store_->CheckpointPaths(id)) {
      absl::StatusOr<v1::JobCheckpointFile> file = JobStore::ReadCheckpoint(path);
      absl::Status status = file.status();
      if (file.ok()) {
        NoteGroupNumbers(file->status(), &last_group);
        auto candidate = std::make_shared<Job>(id, *spec, options_.engine);
        status = candidate->Resume(std::move(file).value());
        if (status.ok()) {
          job = std::move(candidate);
          source = absl::StrCat("checkpoint '", path, "'");
          break;
        }
      }
      LOG(WARNING) << "job " << id << ": skipping checkpoint: " << status
                   << "; trying the previous one";
      const absl::Status renamed = store_->QuarantineCheckpoint(path);
      if (!renamed.ok()) LOG(WARNING) << "job " << id << ": " << renamed;
    }
    if (job == nullptr) job = std::make_shared<Job>(id, *spec, options_.engine);
    // Ended by its checkpoint although its history had not said so yet (a
    // crash between the two writes, or a history write that failed): the
    // checkpoint is on disk already, and its word wins.
    if (job->Releasable()) job->ReleaseMemory();
    if (history.ok()) {
      NoteGroupNumbers(*history, &last_group);
      job->ResumeEnded(*history);  // no-op: it does not say the job ended
    }
    const v1::JobStatus status = job->Status(/*with_history=*/false, Now());
    LOG(INFO) << "job " << id << " loaded from " << source << ": "
              << v1::JobState_Name(status.state()) << ", version "
              << status.version() << ", " << status.epochs_done() << " of "
              << job->spec().epochs() << " epochs done";
    // Resumed jobs are QUEUED now, with their in-flight units given back,
    // and their lists are the checkpoint's: both files are rewritten.
    loaded.push_back({std::move(job), true, true});
  }
  {
    absl::MutexLock lock(&mu_);
    for (const Loaded& entry : loaded) {
      jobs_[entry.job->id()].job = entry.job;
      order_.push_back(entry.job->id());
    }
    last_group_number_ = std::max(last_group_number_, last_group);
  }
  for (const Loaded& entry : loaded) {
    if (entry.persist) PersistHistory(*entry.job, entry.rewrite_records);
  }
}

absl::StatusOr<std::string> JobRegistry::Submit(v1::JobSpec spec) {
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&spec));
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (options_.max_queued_jobs > 0) {
      int queued = submits_in_flight_;
      for (const auto& [job_id, entry] : jobs_) {
        if (entry.job->state() == v1::JOB_STATE_QUEUED) ++queued;
      }
      if (queued >= options_.max_queued_jobs) {
        return LimitError(absl::StrCat(
            queued, " jobs are queued, the most this master holds "
            "(mpilearn-master --max_queued_jobs); submit again once groups "
            "have taken some"));
      }
    }
    ++submits_in_flight_;
    id = absl::StrFormat("job-%06d", ++last_job_number_);
  }
  // Durable first: a job is queued only once its spec is on disk.
  const absl::Status written = store_->WriteSpec(id, spec);
  if (!written.ok()) {
    absl::MutexLock lock(&mu_);
    --submits_in_flight_;
    return written;
  }
  auto job = std::make_shared<Job>(id, std::move(spec), options_.engine);
  {
    absl::MutexLock lock(&mu_);
    --submits_in_flight_;
    jobs_[id].job = job;
    order_.push_back(id);
  }
  PersistHistory(*job);
  LOG(INFO) << "job " << job->id() << " queued: model " << job->spec().model().name()
            << ", " << job->spec().algorithm() << ", "
            << job->spec().optimizer().name() << ", " << job->spec().epochs()
            << " epochs";
  return job->id();
}

absl::StatusOr<v1::RegisterGroupResponse> JobRegistry::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  if (request.ranks() < 1) {
    return InvalidRequestError(
        absl::StrCat("ranks must be >= 1, got ", request.ranks()));
  }
  // Checked before any change: a refused group takes no job and no id.
  MPILEARN_ASSIGN_OR_RETURN(
      const GroupTable::Liveness liveness,
      GroupTable::CheckHeartbeat(request.heartbeat_seconds(),
                                 options_.group_timeout));
  std::shared_ptr<Job> job;
  std::string group_id;
  {
    absl::MutexLock lock(&mu_);
    if (request.job_id().empty()) {
      for (const std::string& id : order_) {
        if (jobs_[id].job->state() == v1::JOB_STATE_QUEUED) {
          job = jobs_[id].job;
          break;
        }
      }
      if (job == nullptr) {
        return NoQueuedJobError(
            "no queued job; submit one with `mpilearnctl submit SPEC.json` "
            "or start the workers with --job SPEC.json");
      }
    } else {
      auto it = jobs_.find(request.job_id());
      if (it == jobs_.end()) {
        return JobUnknownError(absl::StrCat(
            "unknown job '", EchoPrefix(request.job_id()),
            "'; `mpilearnctl list` shows the jobs this master holds"));
      }
      job = it->second.job;
    }
    group_id = absl::StrFormat("g-%d", ++last_group_number_);
  }
  MPILEARN_ASSIGN_OR_RETURN(
      v1::RegisterGroupResponse response,
      job->AddGroup(group_id, request.ranks(), request.host(), Now(),
                    liveness));
  response.set_group_timeout_seconds(
      absl::ToDoubleSeconds(options_.group_timeout));
  // On disk before the group hears its id, so a restarted master, which
  // numbers groups after the highest in the histories, never reuses it.
  PersistHistory(*job);
  LOG(INFO) << "job " << job->id() << ": group " << group_id << " joined ("
            << request.ranks() << " ranks on " << request.host() << ", "
            << (liveness.heartbeat > absl::ZeroDuration()
                    ? absl::StrCat("heartbeat every ",
                                   absl::FormatDuration(liveness.heartbeat))
                    : std::string("no heartbeat"))
            << ", lost after " << absl::FormatDuration(liveness.lost_after)
            << " without contact)";
  return response;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindJob(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return JobUnknownError(absl::StrCat(
        "unknown job '", EchoPrefix(job_id),
        "'; `mpilearnctl list` shows the jobs this master holds"));
  }
  return it->second.job;
}

absl::StatusOr<v1::InitWeightsResponse> JobRegistry::InitWeights(
    const std::string& job_id, const std::string& group_id,
    v1::TensorSetHeader header, std::vector<std::vector<float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(group_id, Now()));
  MPILEARN_ASSIGN_OR_RETURN(bool accepted,
                            job->InitWeights(std::move(header), std::move(values)));
  if (accepted) {
    LOG(INFO) << "job " << job_id << ": initial weights from group " << group_id;
  }
  v1::InitWeightsResponse response;
  response.set_accepted(accepted);
  MPILEARN_ASSIGN_OR_RETURN(auto weights, job->Weights());
  response.set_version(weights->header.version());
  return response;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
JobRegistry::ApplyGradient(Job& job, const GradientUpdate& update) {
  AppliedUpdate applied;
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> reply =
      job.ApplyGradient(update, Now(), &applied);
  if (!reply.ok() || !applied.applied) return reply;
  if (options_.metrics != nullptr) {
    options_.metrics->OnUpdateApplied(job.id(), applied);
  }
  if (options_.trace != nullptr) {
    const TraceRecorder::Arg args[] = {
        {"version", static_cast<int64_t>(applied.weights->header.version())},
        {"staleness", static_cast<int64_t>(applied.staleness)}};
    options_.trace->Complete("apply", "master", applied.apply_start,
                             applied.apply_end, args);
  }
  if (options_.snapshot_sink != nullptr) {
    options_.snapshot_sink->OnUpdate(job.id(), job.spec(),
                                     std::move(applied.weights),
                                     applied.updates_applied,
                                     applied.epochs_done);
  }
  applied.weights.reset();  // lets the next update change the weights in place
  if (applied.checkpoint_due) {
    WriteCheckpoint(job, CheckpointTrigger::kUpdates, /*wait=*/false,
                    /*best=*/false);
  }
  return reply;
}

absl::StatusOr<v1::NextDataUnitResponse> JobRegistry::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                            FindJob(request.job_id()));
  MPILEARN_RETURN_IF_ERROR(job->Touch(request.group_id(), Now()));
  MPILEARN_ASSIGN_OR_RETURN(v1::NextDataUnitResponse response,
                            job->NextDataUnit(request, Now()));
  if (!response.finished_epochs().empty()) {
    for (int32_t epoch : response.finished_epochs()) {
      LOG(INFO) << "job " << job->id() << ": epoch " << epoch + 1
                << " finished; group " << request.group_id()
                << " validates it";
    }
    if (std::shared_ptr<Persistence> p = PersistenceOf(job->id())) {
      absl::MutexLock lock(&p->write_mu);
      // Read under write_mu: a record merged meanwhile (ReportEpoch) is
      // appended as it is now, after the earlier one.
      JobStore::Records records;
      for (int32_t epoch : response.finished_epochs()) {
        // finished_epochs are 0-based.
        std::optional<v1::EpochRecord> record = job->FinishedEpoch(epoch + 1);
        if (record.has_value()) records.epochs.push_back(*std::move(record));
      }
      AppendRecords(*job, *p, records);
    }
    PersistHistory(*job);
    if (options_.snapshot_sink != nullptr) {
      absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
          job->Weights();
      const int32_t epochs_done =
          1 + *std::max_element(response.finished_epochs().begin(),
                                response.finished_epochs().end());
      if (weights.ok()) {
        options_.snapshot_sink->OnEpochEnd(job->id(), job->spec(),
                                           std::move(weights).value(),
                                           epochs_done);
      }
    }
  }
  if (response.finish()) {
    VLOG(1) << "job " << job->id() << ": group " << request.group_id()
            << " is to finish the job";
  }
  return response;
}

absl::StatusOr<v1::JobState> JobRegistry::ReportEpoch(
    const std::string& job_id, const v1::EpochRecord& record) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(record.group_id(), Now()));
  const std::shared_ptr<Persistence> p = PersistenceOf(job_id);
  if (p == nullptr) return FindJob(job_id).status();  // deleted meanwhile
  // The merged record and the validation are added and appended under
  // write_mu, so records.jsonl has them in the job's order.
  absl::ReleasableMutexLock write_lock(&p->write_mu);
  const absl::Time now = Now();
  MPILEARN_RETURN_IF_ERROR(job->RecordEpoch(record, now));
  v1::ValidationRecord validation;
  {
    // Released at once, so the next update need not copy the weights.
    absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
        job->Weights();
    validation.set_version(weights.ok() ? (*weights)->header.version() : 0);
  }
  validation.set_epoch(record.epoch());
  validation.set_val_loss(record.val_loss());
  validation.set_val_accuracy(record.val_accuracy());
  *validation.mutable_metrics() = record.metrics();
  validation.set_source(absl::StrCat("group ", record.group_id()));
  // As Job::RecordValidation would stamp it, so the appended copy is the
  // stored one.
  validation.set_unix_seconds(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  ValidationEffect effect;
  MPILEARN_RETURN_IF_ERROR(job->RecordValidation(validation, now, &effect));
  JobStore::Records records;
  std::optional<v1::EpochRecord> merged = job->FinishedEpoch(record.epoch());
  if (merged.has_value()) records.epochs.push_back(*std::move(merged));
  records.validations.push_back(validation);
  AppendRecords(*job, *p, records);
  write_lock.Release();
  AfterValidation(*job, effect);
  PersistHistory(*job);
  if (options_.on_job_changed) options_.on_job_changed(job_id);
  return job->state();
}

absl::StatusOr<v1::JobState> JobRegistry::ReportValidation(
    const std::string& job_id, const v1::ValidationRecord& record) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  const std::shared_ptr<Persistence> p = PersistenceOf(job_id);
  if (p == nullptr) return FindJob(job_id).status();  // deleted meanwhile
  const absl::Time now = Now();
  // As Job::RecordValidation stamps it, so the appended copy is the stored
  // one.
  v1::ValidationRecord stored = record;
  if (stored.unix_seconds() == 0) {
    stored.set_unix_seconds(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  }
  ValidationEffect effect;
  {
    // Added and appended together: records.jsonl keeps the job's order.
    absl::MutexLock write_lock(&p->write_mu);
    MPILEARN_RETURN_IF_ERROR(job->RecordValidation(stored, now, &effect));
    JobStore::Records records;
    records.validations.push_back(std::move(stored));
    AppendRecords(*job, *p, records);
  }
  VLOG(1) << "job " << job_id << ": validation of version " << record.version()
          << " by " << record.source() << ": val_loss " << record.val_loss()
          << ", val_accuracy " << record.val_accuracy() << ", metrics {"
          << absl::StrJoin(
                 std::map<std::string, double>(record.metrics().begin(),
                                               record.metrics().end()),
                 ", ", absl::PairFormatter(": "))
          << "}";
  AfterValidation(*job, effect);
  // history.json changes only with the job's end or a new best (its
  // checkpoint version and best value); the record itself is appended.
  if (effect.stopped || effect.best_improved) PersistHistory(*job);
  if (options_.on_job_changed) options_.on_job_changed(job_id);
  return job->state();
}

void JobRegistry::AfterValidation(Job& job, const ValidationEffect& effect) {
  if (effect.stopped) {
    LOG(INFO) << "job " << job.id() << " stopped: "
              << job.Status(/*with_history=*/false, Now()).stop_reason();
    WriteJobEnd(job, /*ended_now=*/true, effect.best_improved);
  } else if (effect.best_improved) {
    WriteCheckpoint(job, std::nullopt, /*wait=*/true, /*best=*/true);
  }
}

absl::StatusOr<v1::JobState> JobRegistry::Heartbeat(
    const std::string& job_id, const std::string& group_id,
    const v1::GroupTelemetry* telemetry) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(group_id, Now(), telemetry));
  return job->state();
}

absl::StatusOr<v1::JobState> JobRegistry::Leave(
    const v1::LeaveRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  LeaveEffect effect;
  MPILEARN_ASSIGN_OR_RETURN(v1::JobState state, job->Leave(request, &effect));
  LOG(INFO) << "job " << job->id() << ": group " << request.group_id()
            << " left" << (request.error().empty() ? "" : " with error: ")
            << request.error() << "; job is " << v1::JobState_Name(state);
  if (effect.ended || effect.test_result_recorded) {
    WriteJobEnd(*job, effect.ended, /*best=*/false);
  } else if (job->Releasable() && !job->MemoryReleased()) {
    // An ended job's last group left: its final state goes to disk and its
    // tensors go.
    WriteJobEnd(*job, /*ended_now=*/false, /*best=*/false);
  }
  PersistHistory(*job);
  if (options_.on_job_changed) options_.on_job_changed(request.job_id());
  return state;
}

absl::Status JobRegistry::Stop(const std::string& job_id,
                               const std::string& reason) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Stop(reason));
  LOG(INFO) << "job " << job_id << " stopped: " << reason;
  WriteJobEnd(*job, /*ended_now=*/true, /*best=*/false);
  PersistHistory(*job);
  return absl::OkStatus();
}

absl::Status JobRegistry::Cancel(const std::string& job_id,
                                 const std::string& reason) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Cancel(reason));
  LOG(INFO) << "job " << job_id << " cancelled"
            << (reason.empty() ? "" : ": ") << reason;
  WriteJobEnd(*job, /*ended_now=*/true, /*best=*/false);
  PersistHistory(*job);
  if (options_.on_job_changed) options_.on_job_changed(job_id);
  return absl::OkStatus();
}

absl::Status JobRegistry::Delete(const std::string& job_id) {
  std::shared_ptr<absl::Mutex> checkpoint_mu;
  std::shared_ptr<Persistence> persistence;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return JobUnknownError(absl::StrCat(
          "unknown job '", EchoPrefix(job_id),
          "'; `mpilearnctl list` shows the jobs this master holds"));
    }
    const v1::JobState state = it->second.job->state();
    if (!Ended(state)) {
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              "job ", job_id, " is ", v1::JobState_Name(state),
              "; cancel it first: mpilearnctl cancel ", job_id)),
          v1::ERROR_REASON_JOB_STATE);
    }
    checkpoint_mu = it->second.checkpoint_mu;
    persistence = it->second.persistence;
    jobs_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), job_id));
  }
  // A history write under way ends first; none starts after
  // (PersistHistory and AppendRecords look the job up under write_mu).
  { absl::MutexLock wait_writes(&persistence->write_mu); }
  // A checkpoint write that found the job before it left the table ends
  // first; none starts after (WriteCheckpoint looks the job up).
  absl::MutexLock wait(checkpoint_mu.get());
  MPILEARN_RETURN_IF_ERROR(store_->RemoveJob(job_id));
  if (options_.metrics != nullptr) options_.metrics->OnJobDeleted(job_id);
  if (options_.snapshot_sink != nullptr) {
    options_.snapshot_sink->OnJobDeleted(job_id);
  }
  LOG(INFO) << "job " << job_id << " deleted";
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
JobRegistry::EndedWeights(const Job& job) const {
  for (const std::string& path : store_->CheckpointPaths(job.id())) {
    absl::StatusOr<v1::JobCheckpointFile> file = JobStore::ReadCheckpoint(path);
    if (!file.ok()) continue;
    absl::StatusOr<DecodedCheckpoint> decoded = DecodeJobCheckpoint(
        TakeCheckpointTensors(*file), job.spec(), EngineOptions{}, job.id());
    if (!decoded.ok()) continue;
    return std::make_shared<const WeightsSnapshot>(
        std::move(decoded->weights));
  }
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id(), " has ended and no checkpoint under '",
          store_->CheckpointDir(job.id()), "' holds its weights")),
      v1::ERROR_REASON_JOB_ENDED);
}

void JobRegistry::WriteJobEnd(Job& job, bool ended_now, bool best) {
  absl::Status error;
  std::optional<v1::JobCheckpointFile> checkpoint =
      WriteCheckpoint(job, std::nullopt, /*wait=*/true, best, &error);
  // The final checkpoint is on disk (or the job never had weights): the
  // tensors go. A failed write keeps them for the retry (Tick).
  const bool on_disk = checkpoint.has_value() || !job.Weights().ok();
  if (const std::shared_ptr<Persistence> p = PersistenceOf(job.id())) {
    UpdatePending(
        job.id(), *p,
        [&](PendingWrites& pending) {
          pending.final_best = !on_disk && (best || pending.final_best);
          pending.final_checkpoint = !on_disk;
        },
        error);
    if (checkpoint.has_value() &&
        checkpoint->status().state() == v1::JOB_STATE_COMPLETED) {
      const absl::Status written = WriteFinalFiles(job.id(), *checkpoint);
      std::shared_ptr<const v1::JobCheckpointFile> unwritten;
      if (!written.ok()) {
        unwritten =
            std::make_shared<const v1::JobCheckpointFile>(*std::move(checkpoint));
      }
      UpdatePending(
          job.id(), *p,
          [&](PendingWrites& pending) {
            pending.final_files = std::move(unwritten);
          },
          written);
    }
  }
  if (on_disk && job.Releasable() && job.ReleaseMemory()) {
    VLOG(1) << "job " << job.id() << ": weights and optimizer state released";
  }
  if (ended_now && options_.snapshot_sink != nullptr) {
    options_.snapshot_sink->OnJobEnded(job.id());
  }
}

std::optional<v1::JobCheckpointFile> JobRegistry::WriteCheckpoint(
    Job& job, std::optional<CheckpointTrigger> trigger, bool wait, bool best,
    absl::Status* error) {
  std::shared_ptr<absl::Mutex> checkpoint_mu;
  {
    absl::MutexLock lock(&mu_);
    auto entry = jobs_.find(job.id());
    if (entry == jobs_.end()) return std::nullopt;  // not this registry's
    checkpoint_mu = entry->second.checkpoint_mu;
  }
  if (wait) {
    checkpoint_mu->Lock();
  } else if (!checkpoint_mu->TryLock()) {
    return std::nullopt;  // the write under way is at least as recent
  }
  UnlockOnExit unlock(*checkpoint_mu);
  if (trigger.has_value() && !job.CheckpointDue(*trigger, Now())) {
    return std::nullopt;
  }
  // Traced only when a checkpoint was written.
  const absl::Time start =
      options_.trace != nullptr ? absl::Now() : absl::InfinitePast();
  absl::StatusOr<v1::JobCheckpointFile> checkpoint = job.SaveCheckpoint(Now());
  if (!checkpoint.ok()) return std::nullopt;  // no weights yet
  const uint64_t version = checkpoint->weights().header().version();
  absl::Status written =
      store_->WriteCheckpoint(job.id(), *checkpoint, job.spec().checkpoint().keep());
  if (!written.ok()) {
    if (error != nullptr) {
      *error = written;
    } else {
      LOG(ERROR) << "job " << job.id() << ": checkpoint at version "
                 << version << " not written: " << written;
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
    written = store_->WriteBestCheckpoint(job.id(), *checkpoint);
    if (written.ok()) {
      LOG(INFO) << "job " << job.id() << ": best.pb at version " << version
                << " (" << job.spec().checkpoint().best_metric() << " "
                << checkpoint->status().best_metric_value() << ")";
    } else {
      LOG(ERROR) << "job " << job.id() << ": best.pb not written: " << written;
    }
  }
  if (options_.trace != nullptr) {
    const TraceRecorder::Arg args[] = {{"version", static_cast<int64_t>(version)}};
    options_.trace->Complete("checkpoint", "master", start, absl::Now(), args);
  }
  return std::move(checkpoint).value();
}

absl::StatusOr<v1::JobStatus> JobRegistry::Status(
    const std::string& job_id) const {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  v1::JobStatus status = job->Status(/*with_history=*/true, Now());
  if (const std::shared_ptr<Persistence> p = PersistenceOf(job_id)) {
    status.set_storage_error(StorageError(*p));
  }
  return status;
}

std::vector<std::shared_ptr<Job>> JobRegistry::AllJobs() const {
  std::vector<std::shared_ptr<Job>> jobs;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) jobs.push_back(jobs_.at(id).job);
  return jobs;
}

std::vector<std::pair<std::shared_ptr<Job>,
                      std::shared_ptr<JobRegistry::Persistence>>>
JobRegistry::AllEntries() const {
  std::vector<std::pair<std::shared_ptr<Job>, std::shared_ptr<Persistence>>>
      entries;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) {
    const Entry& entry = jobs_.at(id);
    entries.emplace_back(entry.job, entry.persistence);
  }
  return entries;
}

std::vector<v1::JobStatus> JobRegistry::List() const {
  std::vector<v1::JobStatus> out;
  for (const auto& [job, persistence] : AllEntries()) {
    out.push_back(job->Status(/*with_history=*/false, Now()));
    out.back().set_storage_error(StorageError(*persistence));
  }
  return out;
}

std::vector<JobRegistry::ListedJob> JobRegistry::ListPage(
    int64_t after, const std::vector<v1::JobState>& states, size_t limit,
    bool* more) const {
  *more = false;
  struct Candidate {
    int64_t number;
    std::shared_ptr<Job> job;
    std::shared_ptr<Persistence> persistence;
  };
  std::vector<Candidate> candidates;
  {
    absl::MutexLock lock(&mu_);
    // order_ is in ascending job number (ids are numbered as submitted).
    auto first = std::upper_bound(
        order_.begin(), order_.end(), after,
        [](int64_t number, const std::string& id) {
          return number < JobNumber(id);
        });
    for (auto it = first; it != order_.end(); ++it) {
      const Entry& entry = jobs_.at(*it);
      candidates.push_back({JobNumber(*it), entry.job, entry.persistence});
    }
  }
  std::vector<ListedJob> out;
  for (const auto& [number, job, persistence] : candidates) {
    if (!states.empty() &&
        std::find(states.begin(), states.end(), job->state()) == states.end()) {
      continue;
    }
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back({number, job->Status(/*with_history=*/false, Now())});
    out.back().status.set_storage_error(StorageError(*persistence));
  }
  return out;
}

std::optional<std::string> JobRegistry::FindJobByName(
    const std::string& name) const {
  for (const auto& job : AllJobs()) {
    if (job->spec().name() == name) return job->id();
  }
  return std::nullopt;
}

std::vector<JobMetricsView> JobRegistry::ListForMetrics() const {
  std::vector<JobMetricsView> out;
  for (const auto& [job, persistence] : AllEntries()) {
    out.push_back(job->MetricsView(Now()));
    out.back().status.set_storage_error(StorageError(*persistence));
  }
  return out;
}

int JobRegistry::ReapLostGroups() {
  const std::vector<std::shared_ptr<Job>> jobs = AllJobs();
  int lost = 0;
  for (const auto& job : jobs) {
    std::vector<std::string> lines;
    const int n = job->ReapLostGroups(Now(), options_.group_timeout, &lines);
    if (n > 0) {
      // Each line names the group and its limit: "group g-3 lost after 3
      // missed heartbeats (6s without contact)".
      LOG(WARNING) << "job " << job->id() << ": " << absl::StrJoin(lines, "; ")
                   << "; job is now " << v1::JobState_Name(job->state());
      if (job->Releasable() && !job->MemoryReleased()) {
        // An ended job's last group is gone: as when it leaves (Leave).
        WriteJobEnd(*job, /*ended_now=*/false, /*best=*/false);
      }
      PersistHistory(*job);
    }
    lost += n;
  }
  return lost;
}

void JobRegistry::Tick() {
  ReapLostGroups();
  for (const auto& job : AllJobs()) {
    if (job->CheckpointDue(CheckpointTrigger::kSeconds, Now())) {
      WriteCheckpoint(*job, CheckpointTrigger::kSeconds, /*wait=*/false,
                      /*best=*/false);
    }
  }
  RetryPendingWrites(/*force=*/false);
}

void JobRegistry::CheckpointAll() {
  for (const auto& job : AllJobs()) {
    WriteCheckpoint(*job, CheckpointTrigger::kChanges, /*wait=*/true,
                    /*best=*/false);
  }
  RetryPendingWrites(/*force=*/true);
  for (const auto& [job, p] : AllEntries()) {
    const PendingWrites w = p->Pending();
    if (!w.Any()) continue;
    const std::string lost = w.Describe();
    const v1::JobStatus status = job->Status(/*with_history=*/false, Now());
    LOG(ERROR) << "job " << job->id() << ": LOST at shutdown: " << lost
               << "; a restarted master will not see what they held (the job "
                  "is "
               << v1::JobState_Name(status.state()) << " at version "
               << status.version() << ")";
  }
}

void JobRegistry::RetryPendingWrites(bool force) {
  for (const auto& [job, p] : AllEntries()) {
    // A copy: the writes below update the job's own PendingWrites.
    const PendingWrites w = p->Pending();
    if (!w.Any() || (!force && Now() < w.next_retry)) continue;
    VLOG(1) << "job " << job->id() << ": retrying unwritten records";
    if (w.final_checkpoint) {
      // As at the end: the checkpoint from the kept tensors, weights.pb and
      // optimizer.pb with it, then the tensors go.
      WriteJobEnd(*job, /*ended_now=*/false, w.final_best);
    } else if (w.final_files != nullptr) {
      const absl::Status written = WriteFinalFiles(job->id(), *w.final_files);
      UpdatePending(
          job->id(), *p,
          [&](PendingWrites& now) {
            if (written.ok() && now.final_files == w.final_files) {
              now.final_files.reset();
            }
          },
          written);
    }
    if (w.history || w.records) PersistHistory(*job);
    const absl::Duration wait = p->BackOff(Now(), kMaxRetry);
    if (wait > absl::ZeroDuration()) {
      VLOG(1) << "job " << job->id() << ": still unwritten; next try in "
              << absl::FormatDuration(wait);
    }
  }
}

absl::Status JobRegistry::WriteFinalFiles(
    const std::string& job_id, const v1::JobCheckpointFile& checkpoint) const {
  MPILEARN_RETURN_IF_ERROR(store_->WriteWeights(job_id, checkpoint.weights()));
  return store_->WriteOptimizerState(job_id, checkpoint.optimizer_state());
}

std::shared_ptr<JobRegistry::Persistence> JobRegistry::PersistenceOf(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.persistence;
}

void JobRegistry::UpdatePending(
    const std::string& job_id, Persistence& p,
    const std::function<void(PendingWrites&)>& change,
    const absl::Status& error) const {
  absl::MutexLock lock(&p.state_mu);
  PendingWrites& w = p.pending;
  const bool was_pending = w.Any();
  change(w);
  if (w.Any() && !was_pending) {
    // A streak begins: logged once, retried from Tick with a backoff.
    w.first_error = error.ok() ? absl::UnknownError("cause not reported")
                               : error;
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

std::string JobRegistry::StorageError(Persistence& p) const {
  const PendingWrites w = p.Pending();
  if (!w.Any()) return "";
  return absl::StrCat(w.Describe(), "; retrying");
}

void JobRegistry::AppendRecords(const Job& job, Persistence& p,
                                const JobStore::Records& records) const {
  if (records.epochs.empty() && records.validations.empty()) return;
  if (PersistenceOf(job.id()).get() != &p) return;  // deleted meanwhile
  {
    absl::MutexLock lock(&p.state_mu);
    // The rewrite that is due will hold them.
    if (p.pending.records) return;
  }
  const absl::Status appended = store_->AppendRecords(job.id(), records);
  if (appended.ok()) return;
  // Rewritten whole by the retry: no cut line stays in the file.
  UpdatePending(
      job.id(), p, [](PendingWrites& w) { w.records = true; }, appended);
}

void JobRegistry::PersistHistory(const Job& job, bool rewrite_records) const {
  const std::shared_ptr<Persistence> p = PersistenceOf(job.id());
  if (p == nullptr) return;  // deleted: its directory is gone and stays gone
  absl::MutexLock write_lock(&p->write_mu);
  if (PersistenceOf(job.id()) != p) return;  // deleted meanwhile
  bool records = rewrite_records;
  {
    absl::MutexLock lock(&p->state_mu);
    records = records || p->pending.records;
  }
  absl::Status history_written;
  absl::Status records_written;
  if (records) {
    // records.jsonl first: history.json without the lists is written only
    // once they are on disk (it may be a file that still holds them).
    const v1::JobStatus status = job.Status(/*with_history=*/true, Now());
    records_written = store_->WriteRecords(job.id(), status);
    history_written = records_written.ok()
                          ? store_->WriteHistory(job.id(), status)
                          : records_written;
  } else {
    history_written = store_->WriteHistory(
        job.id(), job.Status(/*with_history=*/false, Now()));
  }
  UpdatePending(
      job.id(), *p,
      [&](PendingWrites& w) {
        w.history = !history_written.ok();
        if (records) w.records = !records_written.ok();
      },
      records_written.ok() ? history_written : records_written);
}

}  // namespace mpilearn::server
