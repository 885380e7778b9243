// JobRegistry (job_registry.h). About 700 lines: the job table, loading a
// state directory at start, when each durable write happens and how a job
// ends and leaves (cancel, releasing its tensors, delete) belong together
// (the write policy reads as one piece); the per-job logic lives in job.cc
// and its parts.
#include "server/core/job_registry.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

}  // namespace

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
  std::vector<std::shared_ptr<Job>> loaded;
  for (const std::string& id : store_->JobIds()) {
    absl::StatusOr<v1::JobSpec> spec = store_->ReadSpec(id);
    if (!spec.ok()) {
      LOG(WARNING) << "job " << id << " not loaded: " << spec.status();
      continue;
    }
    absl::StatusOr<v1::JobStatus> history = store_->ReadHistory(id);
    if (!history.ok() && !absl::IsNotFound(history.status())) {
      LOG(WARNING) << "job " << id << ": " << history.status()
                   << "; using its checkpoint or spec alone";
    }
    store_->RemoveTempFiles(id);  // of writes a crash interrupted
    if (history.ok() && Ended(history->state())) {
      // An ended job comes back from its record alone: its tensors stay on
      // disk (EndedWeights reads them when asked for).
      NoteGroupNumbers(*history, &last_group);
      auto job = std::make_shared<Job>(id, *spec, options_.engine);
      job->ResumeEnded(*history);
      LOG(INFO) << "job " << id << " loaded from its history.json: "
                << v1::JobState_Name(history->state()) << ", version "
                << history->version() << " (tensors left on disk)";
      loaded.push_back(std::move(job));
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
    // crash between the two writes): the checkpoint is on disk already.
    if (job->Releasable()) job->ReleaseMemory();
    if (history.ok()) {
      NoteGroupNumbers(*history, &last_group);
      job->ResumeEnded(*history);  // no-op unless it says the job ended
      if (Ended(history->state()) && !job->Weights().ok()) {
        source = "its history.json (no usable checkpoint)";
      }
    }
    const v1::JobStatus status = job->Status(/*with_history=*/false, Now());
    LOG(INFO) << "job " << id << " loaded from " << source << ": "
              << v1::JobState_Name(status.state()) << ", version "
              << status.version() << ", " << status.epochs_done() << " of "
              << job->spec().epochs() << " epochs done";
    loaded.push_back(std::move(job));
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& job : loaded) {
      jobs_[job->id()].job = job;
      order_.push_back(job->id());
    }
    last_group_number_ = std::max(last_group_number_, last_group);
  }
  // Resumed jobs are QUEUED now, with their in-flight units given back.
  for (const auto& job : loaded) {
    if (!Ended(job->state())) PersistHistory(*job);
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
      job->AddGroup(group_id, request.ranks(), request.host(), Now()));
  response.set_group_timeout_seconds(
      absl::ToDoubleSeconds(options_.group_timeout));
  // On disk before the group hears its id, so a restarted master, which
  // numbers groups after the highest in the histories, never reuses it.
  PersistHistory(*job);
  LOG(INFO) << "job " << job->id() << ": group " << group_id << " joined ("
            << request.ranks() << " ranks on " << request.host() << ")";
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
  MPILEARN_RETURN_IF_ERROR(job->RecordEpoch(record, Now()));
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
  ValidationEffect effect;
  MPILEARN_RETURN_IF_ERROR(job->RecordValidation(validation, Now(), &effect));
  AfterValidation(*job, effect);
  PersistHistory(*job);
  if (options_.on_job_changed) options_.on_job_changed(job_id);
  return job->state();
}

absl::StatusOr<v1::JobState> JobRegistry::ReportValidation(
    const std::string& job_id, const v1::ValidationRecord& record) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  ValidationEffect effect;
  MPILEARN_RETURN_IF_ERROR(job->RecordValidation(record, Now(), &effect));
  VLOG(1) << "job " << job_id << ": validation of version " << record.version()
          << " by " << record.source() << ": val_loss " << record.val_loss()
          << ", val_accuracy " << record.val_accuracy() << ", metrics {"
          << absl::StrJoin(
                 std::map<std::string, double>(record.metrics().begin(),
                                               record.metrics().end()),
                 ", ", absl::PairFormatter(": "))
          << "}";
  AfterValidation(*job, effect);
  PersistHistory(*job);
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
    jobs_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), job_id));
  }
  // A checkpoint write that found the job before it left the table ends
  // first; none starts after (WriteCheckpoint looks the job up).
  absl::MutexLock wait(checkpoint_mu.get());
  MPILEARN_RETURN_IF_ERROR(store_->RemoveJob(job_id));
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
  std::optional<v1::JobCheckpointFile> checkpoint =
      WriteCheckpoint(job, std::nullopt, /*wait=*/true, best);
  if (checkpoint.has_value() &&
      checkpoint->status().state() == v1::JOB_STATE_COMPLETED) {
    absl::Status written = store_->WriteWeights(job.id(), checkpoint->weights());
    if (written.ok()) {
      written =
          store_->WriteOptimizerState(job.id(), checkpoint->optimizer_state());
    }
    if (!written.ok()) LOG(ERROR) << "job " << job.id() << ": " << written;
  }
  // The final checkpoint is on disk (or the job never had weights): the
  // tensors go. A failed write keeps them for CheckpointAll to retry.
  const bool on_disk = checkpoint.has_value() || !job.Weights().ok();
  if (on_disk && job.Releasable() && job.ReleaseMemory()) {
    VLOG(1) << "job " << job.id() << ": weights and optimizer state released";
  }
  if (ended_now && options_.snapshot_sink != nullptr) {
    options_.snapshot_sink->OnJobEnded(job.id());
  }
}

std::optional<v1::JobCheckpointFile> JobRegistry::WriteCheckpoint(
    Job& job, std::optional<CheckpointTrigger> trigger, bool wait, bool best) {
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
    LOG(ERROR) << "job " << job.id() << ": checkpoint at version " << version
               << " not written: " << written;
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
  return job->Status(/*with_history=*/true, Now());
}

std::vector<std::shared_ptr<Job>> JobRegistry::AllJobs() const {
  std::vector<std::shared_ptr<Job>> jobs;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) jobs.push_back(jobs_.at(id).job);
  return jobs;
}

std::vector<v1::JobStatus> JobRegistry::List() const {
  const std::vector<std::shared_ptr<Job>> jobs = AllJobs();
  std::vector<v1::JobStatus> out;
  for (const auto& job : jobs) {
    out.push_back(job->Status(/*with_history=*/false, Now()));
  }
  return out;
}

std::vector<JobRegistry::ListedJob> JobRegistry::ListPage(
    int64_t after, const std::vector<v1::JobState>& states, size_t limit,
    bool* more) const {
  *more = false;
  std::vector<std::pair<int64_t, std::shared_ptr<Job>>> candidates;
  {
    absl::MutexLock lock(&mu_);
    // order_ is in ascending job number (ids are numbered as submitted).
    auto first = std::upper_bound(
        order_.begin(), order_.end(), after,
        [](int64_t number, const std::string& id) {
          return number < JobNumber(id);
        });
    for (auto it = first; it != order_.end(); ++it) {
      candidates.emplace_back(JobNumber(*it), jobs_.at(*it).job);
    }
  }
  std::vector<ListedJob> out;
  for (const auto& [number, job] : candidates) {
    if (!states.empty() &&
        std::find(states.begin(), states.end(), job->state()) == states.end()) {
      continue;
    }
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back({number, job->Status(/*with_history=*/false, Now())});
  }
  return out;
}

std::vector<JobMetricsView> JobRegistry::ListForMetrics() const {
  const std::vector<std::shared_ptr<Job>> jobs = AllJobs();
  std::vector<JobMetricsView> out;
  out.reserve(jobs.size());
  for (const auto& job : jobs) out.push_back(job->MetricsView(Now()));
  return out;
}

int JobRegistry::ReapLostGroups() {
  const std::vector<std::shared_ptr<Job>> jobs = AllJobs();
  int lost = 0;
  for (const auto& job : jobs) {
    const int n = job->ReapLostGroups(Now(), options_.group_timeout);
    if (n > 0) {
      LOG(WARNING) << "job " << job->id() << ": " << n
                   << " group(s) lost after "
                   << absl::FormatDuration(options_.group_timeout)
                   << " without contact; job is now "
                   << v1::JobState_Name(job->state());
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
}

void JobRegistry::CheckpointAll() {
  for (const auto& job : AllJobs()) {
    WriteCheckpoint(*job, CheckpointTrigger::kChanges, /*wait=*/true,
                    /*best=*/false);
  }
}

void JobRegistry::PersistHistory(const Job& job) const {
  {
    // Deleted meanwhile: its directory is gone and stays gone.
    absl::MutexLock lock(&mu_);
    if (jobs_.find(job.id()) == jobs_.end()) return;
  }
  absl::Status status =
      store_->WriteHistory(job.id(), job.Status(/*with_history=*/true, Now()));
  if (!status.ok()) LOG(ERROR) << "job " << job.id() << ": " << status;
}

}  // namespace mpilearn::server
