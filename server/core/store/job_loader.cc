#include "server/core/store/job_loader.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "proto/mpilearn.pb.h"
#include "server/core/store/job_checkpoint.h"

namespace mpilearn::server {
namespace {

bool Ended(v1::JobState state) { return JobStateEnded(state); }

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

}  // namespace

LoadedJobs LoadJobs(JobStore& store, const EngineOptions& engine,
                    const std::function<absl::Time()>& clock) {
  LoadedJobs loaded;
  int64_t& last_group = loaded.last_group_number;
  for (const std::string& id : store.JobIds()) {
    absl::StatusOr<JobConfig> spec = store.ReadSpec(id);
    if (!spec.ok()) {
      LOG(WARNING) << "job " << id << " not loaded: " << spec.status();
      continue;
    }
    JobStore::HistoryFormat format;
    absl::StatusOr<v1::JobStatus> history = store.ReadHistory(id, &format);
    // records.jsonl unreadable: history.json alone still says whether the
    // job ended; the lists come from the checkpoint.
    bool records_lost = false;
    if (!history.ok() && !absl::IsNotFound(history.status())) {
      LOG(WARNING) << "job " << id << ": " << history.status();
      absl::StatusOr<v1::JobStatus> alone = store.ReadHistoryStatus(id);
      if (alone.ok()) {
        records_lost = true;
        const absl::Status moved = store.QuarantineRecords(id);
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
    store.RemoveTempFiles(id);  // of writes a crash interrupted
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
      const std::vector<std::string> paths = store.CheckpointPaths(id);
      if (!paths.empty() &&
          (records_lost || store.ModifiedTime(paths[0]) >
                               store.ModifiedTime(store.HistoryPath(id)))) {
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
      auto job = std::make_shared<Job>(id, *spec, engine);
      job->ResumeEnded(record);
      LOG(INFO) << "job " << id << " loaded from its history: "
                << v1::JobState_Name(record.state()) << ", version "
                << record.version() << " (tensors left on disk)";
      loaded.jobs.push_back(
          {std::move(job), newer || rewrite, newer || rewrite});
      continue;
    }
    // The newest checkpoint that reads and fits. Newer ones that do not are
    // renamed *.corrupt, so that pruning never keeps them over good ones.
    std::shared_ptr<Job> job;
    std::string source = "its spec (no usable checkpoint)";
    for (const std::string& path : store.CheckpointPaths(id)) {
      absl::StatusOr<v1::JobCheckpointFile> file =
          JobStore::ReadCheckpoint(path);
      absl::Status status = file.status();
      if (file.ok()) {
        NoteGroupNumbers(file->status(), &last_group);
        auto candidate = std::make_shared<Job>(id, *spec, engine);
        status = candidate->Resume(std::move(file).value());
        if (status.ok()) {
          job = std::move(candidate);
          source = absl::StrCat("checkpoint '", path, "'");
          break;
        }
      }
      LOG(WARNING) << "job " << id << ": skipping checkpoint: " << status
                   << "; trying the previous one";
      const absl::Status renamed = store.QuarantineCheckpoint(path);
      if (!renamed.ok()) LOG(WARNING) << "job " << id << ": " << renamed;
    }
    if (job == nullptr) job = std::make_shared<Job>(id, *spec, engine);
    // Ended by its checkpoint although its history had not said so yet (a
    // crash between the two writes, or a history write that failed): the
    // checkpoint is on disk already, and its word wins.
    if (job->Releasable()) job->ReleaseMemory();
    if (history.ok()) {
      NoteGroupNumbers(*history, &last_group);
      job->ResumeEnded(*history);  // no-op: it does not say the job ended
    }
    const v1::JobStatus status = job->Status(/*with_history=*/false, clock());
    LOG(INFO) << "job " << id << " loaded from " << source << ": "
              << v1::JobState_Name(status.state()) << ", version "
              << status.version() << ", " << status.epochs_done() << " of "
              << job->spec().epochs() << " epochs done";
    // Resumed jobs are QUEUED now, with their in-flight units given back,
    // and their lists are the checkpoint's: both files are rewritten.
    loaded.jobs.push_back({std::move(job), true, true});
  }
  return loaded;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ReadEndedWeights(
    const JobStore& store, const Job& job) {
  for (const std::string& path : store.CheckpointPaths(job.id())) {
    absl::StatusOr<v1::JobCheckpointFile> file = JobStore::ReadCheckpoint(path);
    if (!file.ok()) continue;
    if (file->weights_on_shards()) {
      // A lead's: the weights gathered from the shards, no optimizer state.
      absl::StatusOr<Float32Tensors> weights = FromTensorSet(file->weights());
      if (!weights.ok()) continue;
      auto snapshot = std::make_shared<WeightsSnapshot>();
      snapshot->header = std::move(weights->header);
      snapshot->values = std::move(weights->values);
      return std::shared_ptr<const WeightsSnapshot>(std::move(snapshot));
    }
    absl::StatusOr<DecodedCheckpoint> decoded = DecodeJobCheckpoint(
        TakeCheckpointTensors(*file), job.spec(), EngineOptions{}, job.id());
    if (!decoded.ok()) continue;
    return std::make_shared<const WeightsSnapshot>(std::move(decoded->weights));
  }
  return WithReason(
      absl::FailedPreconditionError(
          absl::StrCat("job ", job.id(), " has ended and no checkpoint under '",
                       store.CheckpointDir(job.id()), "' holds its weights")),
      v1::ERROR_REASON_JOB_ENDED);
}

}  // namespace mpilearn::server
