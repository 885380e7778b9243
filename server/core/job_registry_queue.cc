// JobRegistry's scheduling between jobs (job_registry.h; the order itself is
// server/sched/queue_order.h): which queued job a group takes, the groups
// an owner or a study may hold, and jobs past their wall-time limit.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "glog/logging.h"
#include "server/core/job_registry.h"

namespace mpilearn::server {
namespace {

QueueEntry EntryOf(const Job& job, int64_t number, v1::JobState state, int groups) {
  QueueEntry entry;
  entry.job_id = job.id();
  entry.number = number;
  entry.owner = job.spec().owner();
  entry.study = job.spec().study();
  entry.priority = job.spec().priority();
  entry.queued = state == v1::JOB_STATE_QUEUED;
  entry.groups = groups;
  return entry;
}

}  // namespace

std::vector<QueueEntry> JobRegistry::QueueEntriesLocked(const OwnerFilter& may_train) const {
  std::vector<QueueEntry> entries;
  for (size_t i = 0; i < order_.size(); ++i) {
    const Job& job = *jobs_.at(order_[i]).job;
    const v1::JobState state = job.state();
    const int groups = job.LiveGroups();
    if (state != v1::JOB_STATE_QUEUED && groups == 0) continue;
    entries.push_back(EntryOf(job, static_cast<int64_t>(i), state, groups));
    if (may_train != nullptr && !may_train(entries.back().owner)) entries.back().queued = false;
  }
  return entries;
}

absl::StatusOr<JobRegistry::Entry> JobRegistry::PickQueuedLocked(
    const OwnerFilter& may_train) const {
  const std::vector<QueueEntry> entries = QueueEntriesLocked(may_train);
  const std::vector<QueuePlace> order =
      OrderQueue(entries, usage_, options_.scheduling, /*most=*/1);
  if (!order.empty() && order.front().note.empty()) {
    return jobs_.at(entries[order.front().index].job_id);
  }
  int queued = 0;
  for (const auto& [id, entry] : jobs_) queued += entry.job->state() == v1::JOB_STATE_QUEUED;
  if (queued == 0) {
    return NoQueuedJobError(
        "no queued job; submit one with `mpilearnctl submit SPEC.json` "
        "or start the workers with --job SPEC.json");
  }
  if (!order.empty()) {
    return NoQueuedJobError(absl::StrCat(queued, " queued job(s) wait, none may take a group now: ",
                                         order.front().note, "; waiting for a group to leave"));
  }
  return NoQueuedJobError(absl::StrCat(
      queued, " queued job(s), none of an owner this group's token trains (owners= in the "
              "tokens file; docs/security.md)"));
}

absl::Status JobRegistry::CheckGroupLimitLocked(const Job& job) const {
  const std::vector<QueueEntry> entries = QueueEntriesLocked(nullptr);
  QueueEntry self = EntryOf(job, 0, job.state(), 0);
  const std::string note = LimitNote(self, entries, options_.scheduling);
  if (note.empty()) return absl::OkStatus();
  return LimitError(absl::StrCat("job ", job.id(), " takes no more groups now: ", note,
                                 "; retry once one of them left"));
}

void JobRegistry::ServedLocked(const Job& job) {
  usage_.Served(EntryOf(job, 0, v1::JOB_STATE_RUNNING, 0));
}

std::map<std::string, JobRegistry::QueueSlot> JobRegistry::QueueOrder() const {
  absl::MutexLock lock(&mu_);
  const std::vector<QueueEntry> entries = QueueEntriesLocked(nullptr);
  std::map<std::string, QueueSlot> places;
  int position = 0;
  for (const QueuePlace& place : OrderQueue(entries, usage_, options_.scheduling)) {
    places[entries[place.index].job_id] = QueueSlot{++position, place.note};
  }
  return places;
}

std::map<std::string, JobRegistry::OwnerLoad> JobRegistry::OwnerLoads() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, OwnerLoad> loads;
  for (const QueueEntry& entry : QueueEntriesLocked(nullptr)) {
    OwnerLoad& load = loads[entry.owner];
    load.groups += entry.groups;
    load.queued_jobs += entry.queued;
  }
  for (auto& [owner, load] : loads) {
    load.recent_groups = usage_.Owner(owner);
    load.share = options_.scheduling.ShareOf(owner);
  }
  return loads;
}

int JobRegistry::EndJobsOverWallTime() {
  int ended = 0;
  for (const Entry& entry : AllEntries()) {
    if (!entry.job->EndIfOverWallTime(Now())) continue;
    ++ended;
    LOG(WARNING) << "job " << entry.job->id() << " FAILED: "
                 << entry.job->Status(/*with_history=*/false, Now()).message();
    entry.journal->WriteJobEnd(/*ended_now=*/true, /*best=*/false);
    entry.journal->PersistHistory();
    observers_.OnJobChanged(entry.job->id());
  }
  return ended;
}

}  // namespace mpilearn::server
