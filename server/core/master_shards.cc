// MasterCore's part in the sharded parameter service (docs/sharding.md): the
// lead places jobs on its shards and answers their syncs (ShardTable keeps
// the table); a shard carries out the lead's orders on its own registry.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bounded_text.h"
#include "common/error_reason.h"
#include "common/spec/job_config.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/core/master_core.h"
#include "server/core/store/job_store.h"

namespace mpilearn::server {
namespace {

// How long a group's registration waits for the shards of a job just
// placed to take their slices (they long-poll the lead, so this is one
// round trip when they are up).
constexpr absl::Duration kSliceWait = absl::Seconds(5);
// Bounds of a shard's report.
constexpr int kMaxReportedSlices = 10000;
constexpr double kMaxSyncWaitSeconds = 10.0;
constexpr int kMaxReportedCheckpoints = 100;
// A whole-model view: how long the lead waits for its shards' slices (a
// long-polling shard answers within a round trip and the slice's
// transfer), and how often a sync job's gather is repeated to find every
// slice at one version.
constexpr absl::Duration kGatherWait = absl::Seconds(30);
constexpr int kSyncGatherTries = 5;

}  // namespace

// The registry's observer in front of the snapshot hub: every call goes on
// to the hub, except a sharded job's epoch end, which has no weights on the
// lead: a thread gathers them from the shards and publishes them then. A
// job's end (or deletion) waits behind its gathers, so the hub hears of
// them in the order they happened. The same thread takes the lead's
// checkpoints of sharded jobs (their data queue with the gathered weights)
// when checkpoint.every_seconds makes one due, and a last one at the end.
class MasterCore::ShardSnapshots final : public JobObserver {
 public:
  explicit ShardSnapshots(MasterCore& core) : core_(core) {}
  // Once the core's registry exists (it is the registry's observer, so it
  // is made first).
  void Start() { thread_ = std::thread([this] { Run(); }); }
  ~ShardSnapshots() override { Stop(); }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec& spec,
                       const AppliedUpdate& update) override {
    core_.snapshots_->OnUpdateApplied(job_id, spec, update);
  }
  void OnEpochEnd(const std::string& job_id, const v1::JobSpec& spec,
                  const std::shared_ptr<const WeightsSnapshot>& weights,
                  int epochs_done) override {
    const bool wanted =
        !spec.snapshots().has_at_epoch_end() || spec.snapshots().at_epoch_end();
    if (weights != nullptr || !wanted || !core_.OnShards(job_id)) {
      core_.snapshots_->OnEpochEnd(job_id, spec, weights, epochs_done);
      return;
    }
    Enqueue(Task{Task::kEpochEnd, job_id, spec, epochs_done}, /*always=*/true);
  }
  void OnJobEnded(const std::string& job_id) override {
    // A sharded job's last checkpoint is gathered first.
    if (!Enqueue(Task{Task::kEnded, job_id, {}, 0}, /*always=*/core_.OnShards(job_id))) {
      core_.snapshots_->OnJobEnded(job_id);
    }
  }
  void OnJobDeleted(const std::string& job_id) override {
    if (!Enqueue(Task{Task::kDeleted, job_id, {}, 0}, /*always=*/false)) {
      core_.snapshots_->OnJobDeleted(job_id);
    }
  }

 private:
  struct Task {
    enum Kind { kEpochEnd, kEnded, kDeleted, kScan } kind = kScan;
    std::string job_id;
    v1::JobSpec spec;
    int epochs_done = 0;
  };

  // Queues `task` when `always`, or when the job has tasks queued; returns
  // whether it did.
  bool Enqueue(Task task, bool always) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    int& queued = queued_[task.job_id];
    if (!always && queued == 0) {
      queued_.erase(task.job_id);
      return false;
    }
    ++queued;
    tasks_.push_back(std::move(task));
    return true;
  }

  // The lead's checkpoints of sharded jobs that are due.
  void CheckpointShardedJobs() {
    const absl::Time now = core_.registry_->Now();
    for (const std::string& job_id : core_.shard_table_->PlacedJobs()) {
      WriteManifest(job_id, now);
      absl::StatusOr<std::shared_ptr<Job>> job = core_.registry_->FindJob(job_id);
      if (!job.ok() || JobStateEnded((*job)->state())) continue;
      uint64_t version = 0;
      for (const v1::ShardSliceStatus& slice : core_.shard_table_->SlicesOf(job_id, now)) {
        version += slice.version();
      }
      if (!(*job)->CheckpointDue(CheckpointTrigger::kSeconds, now, version)) continue;
      Checkpoint(job_id, (*job)->spec(), /*final=*/false);
    }
  }

  // The job's shard_manifest.json, when its restore set has moved on.
  void WriteManifest(const std::string& job_id, absl::Time now) {
    const uint64_t version = core_.shard_table_->SetVersion(job_id);
    uint64_t& written = manifests_[job_id];
    if (version == 0 || version == written) return;
    v1::ShardManifest manifest;
    manifest.set_job_id(job_id);
    manifest.set_version(version);
    for (const v1::ShardSliceStatus& slice : core_.shard_table_->SlicesOf(job_id, now)) {
      manifest.set_shards(slice.shards());
      v1::ShardManifest::Slice* entry = manifest.add_slices();
      entry->set_shard(slice.shard());
      entry->set_address(slice.address());
      entry->set_checkpoint(JobStore::CheckpointName(job_id, version));
    }
    const absl::Status status = core_.registry_->WriteShardManifest(manifest);
    if (status.ok()) {
      written = version;
    } else {
      LOG(WARNING) << "job " << job_id << ": shard manifest of version " << version
                   << " not written: " << status;
    }
  }

  void Checkpoint(const std::string& job_id, const v1::JobSpec& spec, bool final) {
    absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
        core_.GatherWeights(job_id, spec);
    absl::Status written = weights.status();
    if (written.ok()) written = core_.registry_->CheckpointFromShards(job_id, *weights, final);
    std::string& last = last_errors_[job_id];
    if (!written.ok() && last != written.message()) {
      LOG(WARNING) << "job " << job_id << ": no checkpoint of its weights on shards: " << written;
    }
    last = written.ok() ? "" : std::string(written.message());
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Time last_scan = absl::InfinitePast();
    while (true) {
      Task task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !tasks_.empty();
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
        if (stop_) return;
        if (tasks_.empty()) {
          task.kind = Task::kScan;
        } else {
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
      }
      if (absl::Now() - last_scan >= absl::Seconds(1)) {
        last_scan = absl::Now();
        CheckpointShardedJobs();
      }
      if (task.kind == Task::kScan) continue;
      SnapshotHub& hub = *core_.snapshots_;
      if (task.kind == Task::kEpochEnd) {
        absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
            core_.GatherWeights(task.job_id, task.spec);
        if (weights.ok()) {
          hub.OnEpochEnd(task.job_id, task.spec, *weights, task.epochs_done);
        } else {
          LOG(WARNING) << "job " << task.job_id << ": no snapshot of epoch " << task.epochs_done
                       << " for validation pools: " << weights.status();
        }
      } else if (task.kind == Task::kEnded) {
        if (core_.OnShards(task.job_id)) {
          absl::StatusOr<std::shared_ptr<Job>> job = core_.registry_->FindJob(task.job_id);
          if (job.ok()) Checkpoint(task.job_id, (*job)->spec(), /*final=*/true);
          last_errors_.erase(task.job_id);
        }
        hub.OnJobEnded(task.job_id);
      } else {
        hub.OnJobDeleted(task.job_id);
      }
      absl::MutexLock lock(&mu_);
      if (--queued_[task.job_id] == 0) queued_.erase(task.job_id);
    }
  }

  MasterCore& core_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  // The restore set's version in each job's shard_manifest.json (Run's
  // thread only).
  std::map<std::string, uint64_t> manifests_;
  // Tasks queued or running, by job.
  std::map<std::string, int> queued_ ABSL_GUARDED_BY(mu_);
  // The thread's own: the last checkpoint error logged, by job.
  std::map<std::string, std::string> last_errors_;
  std::thread thread_;
};

void MasterCore::CreateShardSnapshots() {
  shard_snapshots_ = std::make_unique<ShardSnapshots>(*this);
}

void MasterCore::StartShardSnapshots() { shard_snapshots_->Start(); }

JobObserver* MasterCore::ShardSnapshotsObserver() { return shard_snapshots_.get(); }

MasterCore::MasterCore() = default;

MasterCore::~MasterCore() {
  // A gather under way ends at once; then the thread stops.
  if (gather_ != nullptr) gather_->Close();
  if (shard_snapshots_ != nullptr) shard_snapshots_->Stop();
}

absl::Status MasterCore::CheckShardRegistration(const v1::RegisterGroupRequest& request) const {
  if (shard_of_.empty()) {
    if (request.group_id().empty()) return absl::OkStatus();
    return InvalidRequestError(
        "group_id is given only when registering on a parameter shard; this master is not "
        "one (leave it empty: the master names the group)");
  }
  if (request.job_id().empty() || request.group_id().empty()) {
    return InvalidRequestError(absl::StrCat(
        "this master is a parameter shard of the lead at ", shard_of_,
        ": register with the lead; a shard takes a group only under the lead's job and group "
        "ids"));
  }
  MPILEARN_RETURN_IF_ERROR(CheckStringField("group_id", request.group_id(), 128));
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->FindJob(request.job_id()));
  if (!job->spec().has_slice()) {
    return InvalidRequestError(absl::StrCat("job ", request.job_id(),
                                            " is not a slice this shard holds"));
  }
  return absl::OkStatus();
}

absl::Status MasterCore::PlaceOnShards(v1::RegisterGroupResponse& response) {
  // A shard's slices are not sharded again; a job whose weights are here
  // already stays here.
  if (!shard_of_.empty() || response.weights_initialized()) return absl::OkStatus();
  // A schedule that follows the lead's epochs or validations cannot run on
  // shards, which see neither: such a job stays on the lead.
  const v1::LrScheduleSpec& schedule = response.spec().optimizer().schedule();
  if (schedule.unit() == "epochs" || schedule.name() == "plateau") return absl::OkStatus();
  // A warm start's source is whole: such a job stays on the lead too.
  if (WarmStartsOnMaster(response.spec())) return absl::OkStatus();
  absl::StatusOr<v1::ShardPlacement> placement =
      shard_table_->Place(response.job_id(), response.spec().max_shards(), registry_->Now());
  absl::Status ready = placement.status();
  if (ready.ok() && placement->addresses_size() == 0) return absl::OkStatus();
  if (ready.ok()) ready = shard_table_->AwaitSlices(response.job_id(), kSliceWait);
  if (!ready.ok()) {
    // The group cannot train without its shards: it leaves again (its
    // client retries UNAVAILABLE).
    v1::LeaveRequest leave;
    leave.set_job_id(response.job_id());
    leave.set_group_id(response.group_id());
    (void)registry_->Leave(leave);
    callers_->UnbindGroup(response.group_id());
    return ready;
  }
  *response.mutable_shards() = *std::move(placement);
  return absl::OkStatus();
}

bool MasterCore::OnShards(const std::string& job_id) const {
  const std::optional<v1::ShardPlacement> placement = shard_table_->PlacementOf(job_id);
  return placement.has_value() && placement->addresses_size() > 0;
}

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> MasterCore::GatherWeights(
    const std::string& job_id, const v1::JobSpec& spec) {
  const std::optional<v1::ShardPlacement> placement = shard_table_->PlacementOf(job_id);
  if (!placement.has_value() || placement->addresses_size() == 0) {
    return absl::UnavailableError(absl::StrCat(
        "job ", job_id, "'s placement on its shards is not known yet (they report after a "
        "lead restart); retry"));
  }
  const std::vector<std::string> addresses(placement->addresses().begin(),
                                           placement->addresses().end());
  const int tries = spec.algorithm() == "sync" ? kSyncGatherTries : 1;
  absl::StatusOr<SliceGather::Gathered> gathered;
  for (int attempt = 1; attempt <= tries; ++attempt) {
    const SliceGather::Ticket ticket = gather_->Begin(job_id, addresses);
    MPILEARN_RETURN_IF_ERROR(shard_table_->WantSlices(job_id, ticket.request()));
    gathered = gather_->Await(ticket, kGatherWait);
    if (!gathered.ok()) return gathered.status();
    if (gathered->oldest_slice == gathered->newest_slice) break;
  }
  return gathered->weights;
}

void MasterCore::FillShards(v1::JobStatus& status) const {
  std::vector<v1::ShardSliceStatus> slices =
      shard_table_->SlicesOf(status.job_id(), registry_->Now());
  if (slices.empty()) return;
  uint64_t version = 0;
  uint64_t parameters = 0;
  uint64_t applied = UINT64_MAX;
  uint64_t stale = 0;
  for (v1::ShardSliceStatus& slice : slices) {
    version += slice.version();
    parameters += slice.parameters();
    applied = std::min(applied, slice.updates_applied());
    stale = std::max(stale, slice.updates_stale());
    *status.add_shards() = std::move(slice);
  }
  status.set_version(version);
  status.set_parameters(parameters);
  status.set_updates_applied(applied);
  status.set_stale_rejected(stale);
  // Each shard schedules its own slice's rate; the first shard's stands
  // for them (with sync they agree).
  status.set_learning_rate(status.shards(0).learning_rate());
  status.set_shard_set_version(shard_table_->SetVersion(status.job_id()));
}

absl::StatusOr<v1::ShardSyncResponse> MasterCore::ShardSync(const v1::ShardSyncRequest& request,
                                                           absl::Duration wait) {
  if (!shard_of_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this master is itself a shard of ", shard_of_, "; a shard syncs with a lead"));
  }
  MPILEARN_RETURN_IF_ERROR(
      CheckStringField("address", request.address(), limits_.max_string_bytes));
  if (request.address().empty()) {
    return InvalidRequestError("address is empty: a shard says where groups reach it");
  }
  if (request.slices_size() > kMaxReportedSlices) {
    return LimitError(absl::StrCat("a shard reports at most ", kMaxReportedSlices,
                                   " slices, got ", request.slices_size()));
  }
  if (!std::isfinite(request.wait_seconds()) || request.wait_seconds() < 0 ||
      request.wait_seconds() > kMaxSyncWaitSeconds) {
    return InvalidRequestError(absl::StrCat("wait_seconds must be within [0, ",
                                            kMaxSyncWaitSeconds, "], got ",
                                            request.wait_seconds()));
  }
  std::map<std::string, const v1::ShardSliceStatus*> reported;
  for (const v1::ShardSliceStatus& slice : request.slices()) {
    MPILEARN_RETURN_IF_ERROR(
        CheckStringField("slices.job_id", slice.job_id(), limits_.max_string_bytes));
    if (slice.checkpoint_versions_size() > kMaxReportedCheckpoints) {
      return LimitError(absl::StrCat("a slice reports at most ", kMaxReportedCheckpoints,
                                     " checkpoint versions, got ",
                                     slice.checkpoint_versions_size()));
    }
    reported[slice.job_id()] = &slice;
  }
  // A job goes on (and a rebuilt placement adopts its slices) while it is
  // queued or running here.
  auto going_on = [this](const std::string& job_id) {
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(job_id);
    return job.ok() && !JobStateEnded((*job)->state());
  };
  const ShardTable::Orders orders = shard_table_->Sync(
      request, registry_->Now(), std::min(wait, absl::Seconds(request.wait_seconds())),
      going_on);
  v1::ShardSyncResponse response;
  auto stop = [&](const std::string& job_id, std::string reason) {
    const auto slice = reported.find(job_id);
    if (slice == reported.end() || JobStateEnded(slice->second->state())) return;
    v1::SliceOrder* order = response.add_orders();
    order->set_job_id(job_id);
    order->set_ended(true);
    order->set_reason(std::move(reason));
  };
  for (const auto& [job_id, slice] : orders.hold) {
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(job_id);
    if (!job.ok()) {
      stop(job_id, "the lead has no such job any more");
    } else if (JobStateEnded((*job)->state())) {
      stop(job_id, absl::StrCat("the lead's job ended ", v1::JobState_Name((*job)->state())));
    } else if (reported.count(job_id) == 0) {
      v1::SliceOrder* order = response.add_orders();
      order->set_job_id(job_id);
      *order->mutable_spec() = (*job)->spec();
      *order->mutable_spec()->mutable_slice() = slice;
    }
  }
  for (const std::string& job_id : orders.unplaced) {
    stop(job_id, "the lead placed no slice of this job on this shard");
  }
  for (const auto& [job_id, version] : orders.restore) {
    v1::SliceOrder* order = response.add_orders();
    order->set_job_id(job_id);
    order->set_restore_version(version);
  }
  for (const auto& [job_id, request] : orders.send) {
    v1::SliceWanted* wanted = response.add_send();
    wanted->set_job_id(job_id);
    wanted->set_request(request);
  }
  return response;
}

MasterCore::SliceForLead MasterCore::SliceFor(const v1::SliceWanted& wanted) const {
  SliceForLead slice;
  slice.header.set_job_id(wanted.job_id());
  slice.header.set_request(wanted.request());
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(wanted.job_id());
  if (!job.ok() || !(*job)->spec().has_slice()) {
    slice.header.set_error("this shard holds no slice of the job");
    return slice;
  }
  slice.header.set_shard((*job)->spec().slice().shard());
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights = WeightsOf(**job);
  if (!weights.ok()) {
    slice.header.set_error(std::string(weights.status().message()));
    return slice;
  }
  *slice.header.mutable_weights() = (*weights)->header;
  SetWireDType(slice.header.mutable_weights(), v1::DTYPE_FLOAT32);
  slice.weights = *std::move(weights);
  return slice;
}

absl::StatusOr<PendingTensors> MasterCore::BeginSliceReport(
    const v1::ReportSliceRequest::Header& header) {
  if (!shard_of_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this master is itself a shard of ", shard_of_, "; a shard sends slices to its lead"));
  }
  MPILEARN_RETURN_IF_ERROR(CheckStringField("job_id", header.job_id(), limits_.max_string_bytes));
  MPILEARN_RETURN_IF_ERROR(
      CheckStringField("address", header.address(), limits_.max_string_bytes));
  MPILEARN_RETURN_IF_ERROR(CheckIncomingSet(
      header.weights(), absl::StrCat("shard ", header.shard(), "'s slice of job ", header.job_id())));
  if (!header.error().empty() && header.weights().tensors_size() > 0) {
    return InvalidRequestError("a slice report with an error carries no tensors");
  }
  v1::ReportSliceRequest::Header bounded = header;
  bounded.set_error(SanitizeText(header.error(), limits_.max_string_bytes));
  return PendingTensors::ForCall(std::move(bounded));
}

absl::Status MasterCore::CommitSliceReport(PendingTensors pending) {
  MPILEARN_ASSIGN_OR_RETURN(
      const v1::ReportSliceRequest::Header* header,
      pending.Finished<v1::ReportSliceRequest::Header>("CommitSliceReport"));
  ShardSliceWeights slice;
  slice.shard = header->shard();
  slice.address = header->address();
  slice.header = header->weights();
  slice.values = std::move(pending.values_);
  return gather_->Deliver(header->job_id(), header->request(), std::move(slice),
                          header->error());
}

std::vector<v1::ShardSliceStatus> MasterCore::SliceReports() const {
  std::vector<v1::ShardSliceStatus> slices;
  for (const v1::JobStatus& status : registry_->List()) {
    if (!status.spec().has_slice()) continue;
    v1::ShardSliceStatus slice;
    slice.set_job_id(status.job_id());
    slice.set_shard(status.spec().slice().shard());
    slice.set_shards(status.spec().slice().shards());
    slice.set_state(status.state());
    slice.set_parameters(status.parameters());
    slice.set_version(status.version());
    slice.set_updates_applied(status.updates_applied());
    slice.set_updates_stale(status.stale_rejected());
    slice.set_learning_rate(status.learning_rate());
    for (uint64_t version :
         registry_->CheckpointVersions(status.job_id(), kMaxReportedCheckpoints)) {
      slice.add_checkpoint_versions(version);
    }
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->FindJob(status.job_id());
    if (job.ok()) {
      const Job::RestoreMark restored = (*job)->restored();
      slice.set_restored_version(restored.version);
      slice.set_restore_token(restored.token);
    }
    slices.push_back(std::move(slice));
  }
  return slices;
}

absl::Status MasterCore::ServeSliceOrders(const v1::ShardSyncResponse& orders) {
  absl::Status result = absl::OkStatus();
  for (const v1::SliceOrder& order : orders.orders()) {
    absl::Status done = absl::OkStatus();
    if (order.ended()) {
      done = registry_->Stop(order.job_id(), absl::StrCat("stopped by the lead: ", order.reason()));
      if (absl::IsFailedPrecondition(done)) done = absl::OkStatus();  // ended already
      if (done.ok()) LOG(INFO) << "slice of job " << order.job_id() << " stopped: " << order.reason();
    } else if (order.restore_version() > 0) {
      done = registry_->RollbackSlice(order.job_id(), order.restore_version());
      if (done.ok()) {
        LOG(INFO) << "slice of job " << order.job_id() << " rolled back to its checkpoint of "
                  << "version " << order.restore_version()
                  << " (another shard restarted from it); its groups register again";
      }
    } else if (!registry_->FindJob(order.job_id()).ok()) {
      absl::StatusOr<JobConfig> config = JobConfig::Create(order.spec());
      done = config.status();
      if (done.ok() && !order.spec().has_slice()) {
        done = absl::InvalidArgumentError("the lead's order has no slice");
      }
      if (done.ok()) done = registry_->Submit(*std::move(config), order.job_id()).status();
      if (done.ok()) {
        LOG(INFO) << "holding slice " << order.spec().slice().shard() << " of "
                  << order.spec().slice().shards() << " of job " << order.job_id();
      }
    }
    if (!done.ok() && result.ok()) {
      result = absl::Status(done.code(),
                            absl::StrCat("job ", order.job_id(), ": ", done.message()));
    }
  }
  return result;
}

}  // namespace mpilearn::server
