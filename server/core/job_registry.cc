#include "server/core/job_registry.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/bounded_text.h"
#include "common/checkpoint_file.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/validation_record.h"
#include "glog/logging.h"
#include "server/core/store/job_checkpoint.h"
#include "server/core/store/job_loader.h"

namespace mpilearn::server {
namespace {

// "job-000041" -> 41; -1 for an id of another form.
int64_t JobNumber(const std::string& job_id) {
  int64_t number = 0;
  if (absl::StartsWith(job_id, "job-") &&
      absl::SimpleAtoi(job_id.substr(4), &number)) {
    return number;
  }
  return -1;
}

absl::Status UnknownJob(const std::string& job_id) {
  return JobUnknownError(
      absl::StrCat("unknown job '", EchoPrefix(job_id),
                   "'; `mpilearnctl list` shows the jobs this master holds"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobRegistry>> JobRegistry::Create(
    Options options) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                            JobStore::Open(options.state_dir));
  auto registry = std::unique_ptr<JobRegistry>(
      new JobRegistry(std::move(options), std::move(store)));
  if (registry->options_.resume_jobs) registry->Load();
  return registry;
}

JobRegistry::JobRegistry(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      observers_(options_.observers),
      journal_context_{store_.get(), &observers_, options_.clock} {
  last_job_number_ = store_->LastJobNumber();
}

void JobRegistry::Load() {
  const LoadedJobs loaded = LoadJobs(*store_, options_.engine, options_.clock);
  std::vector<std::shared_ptr<JobJournal>> journals;
  {
    absl::MutexLock lock(&mu_);
    for (const LoadedJob& entry : loaded.jobs) {
      journals.push_back(AddLocked(entry.job).journal);
    }
    last_group_number_ = std::max(last_group_number_, loaded.last_group_number);
  }
  for (size_t i = 0; i < loaded.jobs.size(); ++i) {
    if (loaded.jobs[i].persist) {
      journals[i]->PersistHistory(loaded.jobs[i].rewrite_records);
    }
  }
}

JobRegistry::Entry JobRegistry::AddLocked(std::shared_ptr<Job> job) {
  const std::string id = job->id();
  Entry& entry = jobs_[id];
  entry.journal = std::make_shared<JobJournal>(job, journal_context_);
  entry.job = std::move(job);
  order_.push_back(id);
  return entry;
}

absl::StatusOr<std::string> JobRegistry::Submit(JobConfig config, std::string as_id) {
  std::string id = std::move(as_id);
  {
    absl::MutexLock lock(&mu_);
    if (!id.empty()) {
      if (jobs_.count(id) > 0) {
        return absl::AlreadyExistsError(absl::StrCat("job ", id, " exists already"));
      }
    } else if (options_.max_queued_jobs > 0) {
      int queued = submits_in_flight_;
      for (const auto& [job_id, entry] : jobs_) {
        if (entry.job->state() == v1::JOB_STATE_QUEUED) ++queued;
      }
      if (queued >= options_.max_queued_jobs) {
        return LimitError(absl::StrCat(
            queued,
            " jobs are queued, the most this master holds "
            "(mpilearn-master --max_queued_jobs); submit again once groups "
            "have taken some"));
      }
    }
    ++submits_in_flight_;
    if (id.empty()) id = absl::StrFormat("job-%06d", ++last_job_number_);
  }
  // Durable first: a job is queued only once its spec is on disk.
  const absl::Status written = store_->WriteSpec(id, config.spec());
  if (!written.ok()) {
    absl::MutexLock lock(&mu_);
    --submits_in_flight_;
    return written;
  }
  auto job = std::make_shared<Job>(id, std::move(config), options_.engine);
  std::shared_ptr<JobJournal> journal;
  {
    absl::MutexLock lock(&mu_);
    --submits_in_flight_;
    journal = AddLocked(job).journal;
  }
  journal->PersistHistory();
  LOG(INFO) << "job " << job->id() << " queued: model "
            << job->spec().model().name() << ", " << job->spec().algorithm()
            << ", " << job->spec().optimizer().name() << ", "
            << job->spec().epochs() << " epochs";
  return job->id();
}

absl::StatusOr<v1::RegisterGroupResponse> JobRegistry::RegisterGroup(
    const v1::RegisterGroupRequest& request, const OwnerFilter& may_train) {
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
  std::shared_ptr<JobJournal> journal;
  std::string group_id;
  v1::RegisterGroupResponse response;
  {
    // The pick, the limits and the group's joining happen under one lock,
    // so groups arriving together see each other's picks.
    absl::MutexLock lock(&mu_);
    if (request.job_id().empty()) {
      MPILEARN_ASSIGN_OR_RETURN(const Entry picked, PickQueuedLocked(may_train));
      job = picked.job;
      journal = picked.journal;
    } else {
      auto it = jobs_.find(request.job_id());
      if (it == jobs_.end()) return UnknownJob(request.job_id());
      job = it->second.job;
      journal = it->second.journal;
      // A shard's group is the lead's, counted there.
      if (request.group_id().empty()) MPILEARN_RETURN_IF_ERROR(CheckGroupLimitLocked(*job));
    }
    // A shard registers a group under the id its lead gave it.
    group_id = request.group_id().empty()
                   ? absl::StrFormat("g-%d", last_group_number_ + 1)
                   : request.group_id();
    MPILEARN_ASSIGN_OR_RETURN(response, job->AddGroup(group_id, request.ranks(),
                                                      request.host(), Now(), liveness));
    if (request.group_id().empty()) {
      ++last_group_number_;
      ServedLocked(*job);
    }
  }
  response.set_group_timeout_seconds(
      absl::ToDoubleSeconds(options_.group_timeout));
  // On disk before the group hears its id, so a restarted master, which
  // numbers groups after the highest in the histories, never reuses it.
  journal->PersistHistory();
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

absl::StatusOr<JobRegistry::Entry> JobRegistry::FindEntry(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return UnknownJob(job_id);
  return it->second;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindJob(
    const std::string& job_id) const {
  MPILEARN_ASSIGN_OR_RETURN(Entry entry, FindEntry(job_id));
  return std::move(entry.job);
}

absl::StatusOr<v1::InitWeightsResponse> JobRegistry::InitWeights(
    const std::string& job_id, const std::string& group_id,
    v1::TensorSetHeader header, std::vector<std::vector<float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  MPILEARN_RETURN_IF_ERROR(job->Touch(group_id, Now()));
  bool accepted = false;
  if (WarmStartsOnMaster(job->spec())) {
    // The group's weights only tell the layout: it pulls the source's.
    std::string from;
    MPILEARN_ASSIGN_OR_RETURN(JobCheckpoint source,
                              WarmStartSource(job->id(), job->spec().warm_start(), &from));
    MPILEARN_RETURN_IF_ERROR(CheckWarmStartLayout(source.weights.header(), header, from));
    MPILEARN_ASSIGN_OR_RETURN(
        const bool started,
        job->WarmStart(source, header, job->spec().warm_start().optimizer_state()));
    if (started) LOG(INFO) << "job " << job_id << ": starts from " << from;
  } else {
    MPILEARN_ASSIGN_OR_RETURN(accepted, job->InitWeights(std::move(header), std::move(values)));
    if (accepted) {
      LOG(INFO) << "job " << job_id << ": initial weights from group " << group_id;
    }
  }
  v1::InitWeightsResponse response;
  response.set_accepted(accepted);
  MPILEARN_ASSIGN_OR_RETURN(auto weights, job->Weights());
  response.set_version(weights->header.version());
  return response;
}

absl::StatusOr<JobCheckpoint> JobRegistry::WarmStartSource(const std::string& job_id,
                                                           const v1::WarmStartSpec& warm,
                                                           std::string* from) const {
  if (!warm.checkpoint().empty()) {
    *from = absl::StrCat("checkpoint '", warm.checkpoint(), "'");
    absl::StatusOr<v1::JobCheckpointFile> file =
        ReadWeightsOrCheckpointFile(warm.checkpoint(), options_.max_warm_start_bytes);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat("warm_start.checkpoint: ", file.status().message()));
    }
    if (file->weights_on_shards()) file->clear_optimizer_state();
    return TakeCheckpointTensors(*file);
  }
  *from = absl::StrCat("job ", warm.job_id(), "'s weights");
  if (warm.job_id() == job_id) {
    return absl::InvalidArgumentError("warm_start.job_id names the job itself");
  }
  absl::StatusOr<std::shared_ptr<Job>> source = FindJob(warm.job_id());
  if (!source.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "warm_start.job_id: no job ", warm.job_id(), " on this master (deleted?)"));
  }
  absl::StatusOr<JobCheckpoint> in_memory = (*source)->Checkpoint();
  if (in_memory.ok()) return in_memory;
  // Released at its end: its newest checkpoint on disk.
  for (const std::string& path : store_->CheckpointPaths(warm.job_id())) {
    absl::StatusOr<v1::JobCheckpointFile> file = JobStore::ReadCheckpoint(path);
    if (!file.ok()) continue;
    if (file->weights_on_shards()) file->clear_optimizer_state();
    return TakeCheckpointTensors(*file);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "warm_start.job_id: job ", warm.job_id(),
      " has no weights to start from (none yet, or its weights live on parameter shards)"));
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
JobRegistry::ApplyGradient(Job& job, const GradientUpdate& update) {
  AppliedUpdate applied;
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> reply =
      job.ApplyGradient(update, Now(), &applied);
  if (!reply.ok() || !applied.applied) return reply;
  observers_.OnUpdateApplied(job.id(), job.spec(), applied);
  applied.weights.reset();  // lets the next update change the weights in place
  if (applied.checkpoint_due) {
    absl::StatusOr<Entry> entry = FindEntry(job.id());
    if (entry.ok()) {
      entry->journal->WriteCheckpoint(CheckpointTrigger::kUpdates,
                                      /*wait=*/false, /*best=*/false);
    }
  }
  return reply;
}

absl::StatusOr<v1::NextDataUnitResponse> JobRegistry::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(request.job_id()));
  Job& job = *entry.job;
  MPILEARN_RETURN_IF_ERROR(job.Touch(request.group_id(), Now()));
  MPILEARN_ASSIGN_OR_RETURN(v1::NextDataUnitResponse response,
                            job.NextDataUnit(request, Now()));
  if (!response.finished_epochs().empty()) {
    for (int32_t epoch : response.finished_epochs()) {
      LOG(INFO) << "job " << job.id() << ": epoch " << epoch + 1
                << " finished; group " << request.group_id() << " validates it";
    }
    // Read under the journal's lock: a record merged meanwhile (ReportEpoch)
    // is appended as it is now, after the earlier one.
    entry.journal
        ->Record([&]() -> absl::StatusOr<JobStore::Records> {
          JobStore::Records records;
          for (int32_t epoch : response.finished_epochs()) {
            // finished_epochs are 0-based.
            std::optional<v1::EpochRecord> record =
                job.FinishedEpoch(epoch + 1);
            if (record.has_value())
              records.epochs.push_back(*std::move(record));
          }
          return records;
        })
        .IgnoreError();  // nothing to fail: the records are read, not added
    entry.journal->PersistHistory();
    // Without weights here (they live on parameter shards) the observers
    // hear of the epoch's end with none.
    absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
        job.Weights();
    const int32_t epochs_done =
        1 + *std::max_element(response.finished_epochs().begin(),
                              response.finished_epochs().end());
    observers_.OnEpochEnd(job.id(), job.spec(), weights.ok() ? *weights : nullptr,
                          epochs_done);
  }
  if (response.finish()) {
    VLOG(1) << "job " << job.id() << ": group " << request.group_id()
            << " is to finish the job";
  }
  return response;
}

absl::StatusOr<v1::JobState> JobRegistry::ReportEpoch(
    const std::string& job_id, const v1::EpochRecord& record) {
  MPILEARN_RETURN_IF_ERROR(CheckEpochReport(record));
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  Job& job = *entry.job;
  MPILEARN_RETURN_IF_ERROR(job.Touch(record.group_id(), Now()));
  // The merged record and the validation are added and appended under the
  // journal's lock, so records.jsonl has them in the job's order.
  ValidationEffect effect;
  MPILEARN_RETURN_IF_ERROR(
      entry.journal->Record([&]() -> absl::StatusOr<JobStore::Records> {
        const absl::Time now = Now();
        MPILEARN_RETURN_IF_ERROR(job.RecordEpoch(record, now));
        v1::ValidationRecord validation;
        {
          // Released at once, so the next update need not copy the weights.
          absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
              job.Weights();
          validation.set_version(weights.ok() ? (*weights)->header.version()
                                              : 0);
        }
        validation.set_epoch(record.epoch());
        validation.set_val_loss(record.val_loss());
        validation.set_val_accuracy(record.val_accuracy());
        *validation.mutable_metrics() = record.metrics();
        validation.set_source(absl::StrCat("group ", record.group_id()));
        // As Job::RecordValidation would stamp it, so the appended copy is
        // the stored one.
        validation.set_unix_seconds(
            absl::ToDoubleSeconds(now - absl::UnixEpoch()));
        MPILEARN_RETURN_IF_ERROR(
            job.RecordValidation(validation, now, &effect));
        JobStore::Records records;
        std::optional<v1::EpochRecord> merged =
            job.FinishedEpoch(record.epoch());
        if (merged.has_value()) records.epochs.push_back(*std::move(merged));
        records.validations.push_back(std::move(validation));
        return records;
      }));
  entry.journal->AfterValidation(effect);
  entry.journal->PersistHistory();
  observers_.OnJobChanged(job_id);
  return job.state();
}

absl::StatusOr<v1::JobState> JobRegistry::ReportValidation(
    const std::string& job_id, const v1::ValidationRecord& record) {
  MPILEARN_RETURN_IF_ERROR(CheckValidationRecord(record));
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  Job& job = *entry.job;
  {
    // No weights validated yet can be newer than the job's (a sharded job's
    // lead holds none: its shards' versions are not checked here).
    absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights = job.Weights();
    if (weights.ok() && record.version() > (*weights)->header.version()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record.version: ", record.version(), " is ahead of the job's weights (version ",
          (*weights)->header.version(),
          "); report the version of the snapshot validated (the report is refused and the "
          "job's history and best value stay as they were)"));
    }
  }
  const absl::Time now = Now();
  // As Job::RecordValidation stamps it, so the appended copy is the stored
  // one.
  v1::ValidationRecord stored = record;
  if (stored.unix_seconds() == 0) {
    stored.set_unix_seconds(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  }
  ValidationEffect effect;
  // Added and appended together: records.jsonl keeps the job's order.
  MPILEARN_RETURN_IF_ERROR(
      entry.journal->Record([&]() -> absl::StatusOr<JobStore::Records> {
        MPILEARN_RETURN_IF_ERROR(job.RecordValidation(stored, now, &effect));
        JobStore::Records records;
        records.validations.push_back(std::move(stored));
        return records;
      }));
  VLOG(1) << "job " << job_id << ": validation of version " << record.version()
          << " by " << record.source() << ": val_loss " << record.val_loss()
          << ", val_accuracy " << record.val_accuracy() << ", metrics {"
          << absl::StrJoin(
                 std::map<std::string, double>(record.metrics().begin(),
                                               record.metrics().end()),
                 ", ", absl::PairFormatter(": "))
          << "}";
  entry.journal->AfterValidation(effect);
  // history.json changes only with the job's end or a new best (its
  // checkpoint version and best value); the record itself is appended.
  if (effect.stopped || effect.best_improved) entry.journal->PersistHistory();
  observers_.OnJobChanged(job_id);
  return job.state();
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
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(request.job_id()));
  Job& job = *entry.job;
  LeaveEffect effect;
  MPILEARN_ASSIGN_OR_RETURN(v1::JobState state, job.Leave(request, &effect));
  LOG(INFO) << "job " << job.id() << ": group " << request.group_id() << " left"
            << (request.error().empty() ? "" : " with error: ")
            << request.error() << "; job is " << v1::JobState_Name(state);
  if (effect.ended || effect.test_result_recorded) {
    entry.journal->WriteJobEnd(effect.ended, /*best=*/false);
  } else if (job.Releasable() && !job.MemoryReleased()) {
    // An ended job's last group left: its final state goes to disk and its
    // tensors go.
    entry.journal->WriteJobEnd(/*ended_now=*/false, /*best=*/false);
  }
  entry.journal->PersistHistory();
  observers_.OnJobChanged(request.job_id());
  return state;
}

absl::Status JobRegistry::Stop(const std::string& job_id,
                               const std::string& reason) {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  MPILEARN_RETURN_IF_ERROR(entry.job->Stop(reason));
  LOG(INFO) << "job " << job_id << " stopped: " << reason;
  entry.journal->WriteJobEnd(/*ended_now=*/true, /*best=*/false);
  entry.journal->PersistHistory();
  return absl::OkStatus();
}

absl::Status JobRegistry::Cancel(const std::string& job_id,
                                 const std::string& reason) {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  MPILEARN_RETURN_IF_ERROR(entry.job->Cancel(reason));
  LOG(INFO) << "job " << job_id << " cancelled" << (reason.empty() ? "" : ": ")
            << reason;
  entry.journal->WriteJobEnd(/*ended_now=*/true, /*best=*/false);
  entry.journal->PersistHistory();
  observers_.OnJobChanged(job_id);
  return absl::OkStatus();
}

absl::Status JobRegistry::Delete(const std::string& job_id) {
  std::shared_ptr<JobJournal> journal;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return UnknownJob(job_id);
    const v1::JobState state = it->second.job->state();
    if (!JobStateEnded(state)) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "job ", job_id, " is ", v1::JobState_Name(state),
                            "; cancel it first: mpilearnctl cancel ", job_id)),
                        v1::ERROR_REASON_JOB_STATE);
    }
    journal = it->second.journal;
    jobs_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), job_id));
  }
  // Writes under way end first; none starts after.
  journal->Close();
  MPILEARN_RETURN_IF_ERROR(store_->RemoveJob(job_id));
  observers_.OnJobDeleted(job_id);
  LOG(INFO) << "job " << job_id << " deleted";
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>>
JobRegistry::EndedWeights(const Job& job) const {
  return ReadEndedWeights(*store_, job);
}

absl::StatusOr<v1::JobStatus> JobRegistry::Status(
    const std::string& job_id) const {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  v1::JobStatus status = entry.job->Status(/*with_history=*/true, Now());
  status.set_storage_error(entry.journal->StorageError());
  return status;
}

std::vector<JobRegistry::Entry> JobRegistry::AllEntries() const {
  std::vector<Entry> entries;
  absl::MutexLock lock(&mu_);
  entries.reserve(order_.size());
  for (const std::string& id : order_) entries.push_back(jobs_.at(id));
  return entries;
}

std::vector<v1::JobStatus> JobRegistry::List() const {
  std::vector<v1::JobStatus> out;
  for (const Entry& entry : AllEntries()) {
    out.push_back(entry.job->Status(/*with_history=*/false, Now()));
    out.back().set_storage_error(entry.journal->StorageError());
  }
  return out;
}

std::vector<JobRegistry::ListedJob> JobRegistry::ListPage(
    int64_t after, const std::vector<v1::JobState>& states, size_t limit,
    bool* more) const {
  *more = false;
  std::vector<std::pair<int64_t, Entry>> candidates;
  {
    absl::MutexLock lock(&mu_);
    // order_ is in ascending job number (ids are numbered as submitted).
    auto first = std::upper_bound(order_.begin(), order_.end(), after,
                                  [](int64_t number, const std::string& id) {
                                    return number < JobNumber(id);
                                  });
    for (auto it = first; it != order_.end(); ++it) {
      candidates.emplace_back(JobNumber(*it), jobs_.at(*it));
    }
  }
  std::vector<ListedJob> out;
  for (const auto& [number, entry] : candidates) {
    if (!states.empty() && std::find(states.begin(), states.end(),
                                     entry.job->state()) == states.end()) {
      continue;
    }
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back({number, entry.job->Status(/*with_history=*/false, Now())});
    out.back().status.set_storage_error(entry.journal->StorageError());
  }
  return out;
}

std::optional<std::string> JobRegistry::FindJobByName(
    const std::string& name) const {
  for (const Entry& entry : AllEntries()) {
    if (entry.job->spec().name() == name) return entry.job->id();
  }
  return std::nullopt;
}

std::vector<JobMetricsView> JobRegistry::ListForMetrics() const {
  std::vector<JobMetricsView> out;
  for (const Entry& entry : AllEntries()) {
    out.push_back(entry.job->MetricsView(Now()));
    out.back().status.set_storage_error(entry.journal->StorageError());
  }
  return out;
}

int JobRegistry::ReapLostGroups() {
  int lost = 0;
  for (const Entry& entry : AllEntries()) {
    Job& job = *entry.job;
    std::vector<std::string> lines;
    const int n = job.ReapLostGroups(Now(), options_.group_timeout, &lines);
    if (n > 0) {
      // Each line names the group and its limit: "group g-3 lost after 3
      // missed heartbeats (6s without contact)".
      LOG(WARNING) << "job " << job.id() << ": " << absl::StrJoin(lines, "; ")
                   << "; job is now " << v1::JobState_Name(job.state());
      if (job.Releasable() && !job.MemoryReleased()) {
        // An ended job's last group is gone: as when it leaves (Leave).
        entry.journal->WriteJobEnd(/*ended_now=*/false, /*best=*/false);
      }
      entry.journal->PersistHistory();
    }
    lost += n;
  }
  return lost;
}

absl::Status JobRegistry::CheckpointFromShards(const std::string& job_id,
                                              std::shared_ptr<const WeightsSnapshot> weights,
                                              bool final) {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  absl::Status error;
  const std::optional<v1::JobCheckpointFile> written = entry.journal->WriteCheckpoint(
      final ? CheckpointTrigger::kChanges : CheckpointTrigger::kSeconds, /*wait=*/true,
      /*best=*/false, &error, std::move(weights));
  // A completed job's final weights, as a job with its own weights leaves
  // them (mpilearn-export reads weights.pb).
  if (final && written.has_value() && written->status().state() == v1::JOB_STATE_COMPLETED) {
    error = entry.journal->WriteFinalFiles(*written);
  }
  return error;
}

absl::Status JobRegistry::RollbackSlice(const std::string& job_id, uint64_t version) {
  MPILEARN_ASSIGN_OR_RETURN(const Entry entry, FindEntry(job_id));
  return entry.journal->Rollback(version);
}

std::vector<uint64_t> JobRegistry::CheckpointVersions(const std::string& job_id,
                                                      size_t limit) const {
  return store_->CheckpointVersions(job_id, limit);
}

absl::Status JobRegistry::WriteShardManifest(const v1::ShardManifest& manifest) {
  MPILEARN_RETURN_IF_ERROR(FindEntry(manifest.job_id()).status());
  return store_->WriteShardManifest(manifest.job_id(), manifest);
}

void JobRegistry::Tick() {
  ReapLostGroups();
  EndJobsOverWallTime();
  {
    absl::MutexLock lock(&mu_);
    usage_.Advance(QueueEntriesLocked(nullptr), Now(), options_.scheduling.half_life);
  }
  for (const Entry& entry : AllEntries()) {
    if (entry.job->CheckpointDue(CheckpointTrigger::kSeconds, Now())) {
      entry.journal->WriteCheckpoint(CheckpointTrigger::kSeconds,
                                     /*wait=*/false, /*best=*/false);
    }
  }
  RetryPendingWrites(/*force=*/false);
}

void JobRegistry::CheckpointAll() {
  for (const Entry& entry : AllEntries()) {
    entry.journal->WriteCheckpoint(CheckpointTrigger::kChanges, /*wait=*/true,
                                   /*best=*/false);
  }
  RetryPendingWrites(/*force=*/true);
  for (const Entry& entry : AllEntries()) {
    const std::string lost = entry.journal->Unwritten();
    if (lost.empty()) continue;
    const v1::JobStatus status =
        entry.job->Status(/*with_history=*/false, Now());
    LOG(ERROR) << "job " << entry.job->id() << ": LOST at shutdown: " << lost
               << "; a restarted master will not see what they held (the job "
                  "is "
               << v1::JobState_Name(status.state()) << " at version "
               << status.version() << ")";
  }
}

void JobRegistry::RetryPendingWrites(bool force) {
  for (const Entry& entry : AllEntries()) entry.journal->RetryIfDue(force);
}

}  // namespace mpilearn::server
