// The master's request-level API: every call of the protocol's Master
// service as one method that takes and returns the protocol's own messages.
// The gRPC service (server/master_service.h) and the worker's in-process
// local mode (worker/local_master.h) are thin adapters over this class, so
// both do exactly the same lookups, checks and bookkeeping per call; only
// how tensors and errors travel differs.
//
//   auto core = MasterCore::Create({.registry = {.state_dir = dir}});
//   auto job = (*core)->SubmitJob(submit_request);
//   auto group = (*core)->RegisterGroup(caller, register_request);
//   // A push: Begin checks the header against the job and sizes buffers
//   // that the transport fills in place; Commit applies the update.
//   MPILEARN_ASSIGN_OR_RETURN(PendingTensors push,
//                             core->BeginPush(caller, header));
//   while (more chunks) MPILEARN_RETURN_IF_ERROR(push.AddChunk(chunk));
//   MPILEARN_ASSIGN_OR_RETURN(auto weights, core->CommitPush(std::move(push)));
//
// Owns the job registry (jobs, queue, update rules, state directory; see
// job_registry.h), the snapshot hub (validation pools' feed; see
// snapshot_hub.h), wired together, and the callers' bindings (which caller
// owns which group, and follows which jobs; caller_bindings.h). The calls
// that name a group or report a validation take the Caller the transport
// authenticated and check it first.
//
// Threading: thread-safe; every method may be called from any thread. A
// PendingTensors belongs to the one call that began it.
//
// Errors: absl::Status values whose messages tell the caller what to do and
// that carry a v1::ErrorReason (common/error_reason.h) for clients to branch
// on; transports pass them on unchanged.
#ifndef MPILEARN_SERVER_CORE_MASTER_CORE_H_
#define MPILEARN_SERVER_CORE_MASTER_CORE_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "server/core/caller_bindings.h"
#include "server/core/job_registry.h"
#include "server/core/job_values.h"
#include "server/core/snapshot_hub.h"
#include "server/shard/shard_table.h"
#include "server/shard/slice_gather.h"

namespace mpilearn::server {

// The tensors of one InitWeights, PushGradient or ReportSlice call while
// they arrive:
// fp32 buffers sized from the call's header, filled by the transport either
// chunk by chunk (AddChunk, the gRPC stream) or whole (CopyFrom, in
// process), then handed to the matching Commit. Move-only; not thread-safe.
class PendingTensors {
 public:
  PendingTensors(PendingTensors&&) = default;
  PendingTensors& operator=(PendingTensors&&) = default;

  // The job the call is for.
  const std::string& job_id() const;
  // Tensor bytes the call carries (the header's announced sizes).
  uint64_t bytes() const { return bytes_; }

  // Copies the next chunk into place (chunks in order, as the protocol
  // sends them). INVALID_ARGUMENT for a chunk that does not fit.
  absl::Status AddChunk(const v1::TensorChunk& chunk);
  // The assembler that chunks go into (created on first use), for
  // transports that read chunk bytes themselves (common/tensor_wire.h).
  // Its errors are INVALID_ARGUMENT without a reason; AddChunk adds one.
  absl::StatusOr<TensorSetAssembler*> Assembler();
  // Copies whole tensors, one span per tensor of the header.
  // INVALID_ARGUMENT for a count or size that does not match.
  absl::Status CopyFrom(absl::Span<const absl::Span<const float>> values);

 private:
  friend class MasterCore;
  using CallHeader = std::variant<v1::InitWeightsRequest::Header,
                                  v1::PushGradientRequest::Header,
                                  v1::ReportSliceRequest::Header>;

  explicit PendingTensors(CallHeader call) : call_(std::move(call)) {}

  // Sizes the buffers for the call's tensors; INVALID_ARGUMENT for a header
  // whose sizes cannot be computed.
  // `job`, when given, lends its reusable update buffers.
  static absl::StatusOr<PendingTensors> ForCall(CallHeader call,
                                                Job* job = nullptr);
  // The tensors' header inside the call's header.
  const v1::TensorSetHeader& tensors() const;
  // OK once every tensor arrived in full (by chunks or CopyFrom).
  absl::Status Finish() const;
  // Finish's status, then the call's header for `commit` (the Commit
  // method's name): INTERNAL when the call began as another kind.
  template <typename Header>
  absl::StatusOr<const Header*> Finished(const char* commit) const {
    MPILEARN_RETURN_IF_ERROR(Finish());
    const Header* header = std::get_if<Header>(&call_);
    if (header == nullptr) {
      return WithReason(absl::InternalError(absl::StrCat(commit, " of another call")),
                        v1::ERROR_REASON_INTERNAL);
    }
    return header;
  }

  // The call's header, for Commit; it holds the tensors' header too.
  CallHeader call_;
  std::vector<std::vector<float>> values_;
  // Set for chunked filling; its spans point into values_' heap buffers,
  // which moving the object does not relocate.
  std::optional<TensorSetAssembler> assembler_;
  bool copied_ = false;
  uint64_t bytes_ = 0;
  // PushGradient: the job, found at Begin.
  std::shared_ptr<Job> job_;
};

// What the master lets clients make it hold: its --max_* flags (docs/security.md,
// "Resource limits", lists them). Each is checked before memory is taken for
// what it bounds; a request over one is refused with RESOURCE_EXHAUSTED,
// reason ERROR_REASON_LIMIT, and a message naming the limit and the flag
// that raises it. The largest message the master takes (--max_message_mib)
// is gRPC's, set on the server (master_server.h).
struct MasterLimits {
  // --max_model_mib: a job's weights as fp32 (parameters and buffers):
  // the tensors an InitWeights header announces, in any wire dtype, and the
  // least a submitted spec's built-in model needs (MinModelParameters in
  // common/spec/job_spec.h). Bounds each tensor too. The default keeps a
  // checkpoint (weights plus Adam's two moments, 3x the model) under
  // protobuf's 2 GiB message limit (common/checkpoint_file.h).
  uint64_t max_model_bytes = uint64_t{512} << 20;
  // --max_tensors_per_set: tensors in one InitWeights header.
  int max_tensors_per_set = 65536;
  // --max_queued_jobs: jobs waiting for a group (QUEUED); SubmitJob
  // refuses more. 0: no bound.
  int max_queued_jobs = 1000;
  // --max_string_bytes: each string the master stores or logs from a
  // request (spec strings and paths, host names, validation sources,
  // metric names, subscriber labels). Such strings must also be free of
  // control characters. A group's error message is kept cut to this
  // length with its control characters escaped, never refused.
  size_t max_string_bytes = 4096;
  // --max_subscriptions: SubscribeSnapshots streams open at once (each
  // holds one of the server's threads for as long as it lasts; the other
  // streams end with their call). 0: no bound.
  int max_subscriptions = 256;
  // ListJobs' reply, in serialized bytes (not a flag: it follows clients'
  // default 4 MiB receive limit). A page whose jobs would outgrow it is
  // listed without the spec's file lists; still over, the page ends early
  // (next_page_token set). A job whose status alone is over it is left out
  // (ListJobsResponse.left_out) and still shown by GetJobStatus.
  uint64_t max_list_bytes = uint64_t{3} << 20;
};

class MasterCore {
 public:
  struct Options {
    // The registry's options (state directory, group timeout, engine,
    // observers). Create adds the core's own snapshot hub to its observers
    // and sets its max_queued_jobs from `limits`.
    JobRegistry::Options registry;
    MasterLimits limits;
    // Tokens are in use: each group is bound to the caller that registered
    // it and only that caller may name it; a validation report needs a
    // subscription or a group of the job (CallerBindings). False: callers
    // are not told apart (a master without --tokens_file; --local).
    bool check_callers = false;
    // Parameter shards (docs/sharding.md). As a lead (every master not a
    // shard): how jobs are placed on the shards that sync with it; a master
    // none syncs with keeps every job's weights itself, as always.
    ShardTable::Options shard_table;
    // Non-empty: this master is a parameter shard of the lead at this
    // address (mpilearn-master --shard_of): it holds the slices the lead
    // orders (ServeSliceOrders), refuses SubmitJob, and registers a group
    // only under the lead's group id for a slice it holds.
    std::string shard_of;
  };

  // Opens the state directory and, per Options::registry.resume_jobs,
  // loads its jobs.
  static absl::StatusOr<std::unique_ptr<MasterCore>> Create(Options options);

  MasterCore(const MasterCore&) = delete;
  MasterCore& operator=(const MasterCore&) = delete;
  ~MasterCore();

  // Jobs and groups. The job's owner is `caller`'s name unless the spec
  // names one; only an admin names another, or a priority above the
  // caller's max_priority (CheckSubmission: PERMISSION_DENIED). Without a
  // caller: an admin named "" (in-process callers, MPI Opt's trials).
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(
      const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(
      const Caller& caller, const v1::SubmitJobRequest& request);
  // Binds the new group to `caller`. A scoped caller (an owner, a worker
  // with owners=) joins or takes only jobs of the owners it trains
  // (CheckTrains); without a job id the group takes the job first in the
  // queue order (server/sched/queue_order.h).
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const Caller& caller, const v1::RegisterGroupRequest& request);

  // Initial weights: Begin needs only the header (an unknown job fails
  // here, before any tensor is received); Commit marks the group as seen
  // and installs the weights unless another group's were taken first.
  absl::StatusOr<PendingTensors> BeginInitWeights(
      const Caller& caller, const v1::InitWeightsRequest::Header& header);
  absl::StatusOr<v1::InitWeightsResponse> CommitInitWeights(
      PendingTensors pending);

  // An update (gradient, elastic or delta): Begin finds the job and checks
  // the header's layout against the job's weights; Commit applies it
  // (job.h: kind, staleness, NaN/Inf) and returns the weights for the reply.
  absl::StatusOr<PendingTensors> BeginPush(
      const Caller& caller, const v1::PushGradientRequest::Header& header);
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> CommitPush(
      PendingTensors pending);

  // The job's current weights; a group named in the request is marked as
  // seen (and must be an active group of the job). For an ended job whose
  // memory was released, the weights of its newest checkpoint, read from
  // disk (JobRegistry::EndedWeights). A lead gathers a sharded job's
  // weights from its shards (GatherWeights).
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> PullWeights(
      const Caller& caller, const v1::PullWeightsRequest& request);

  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const Caller& caller, const v1::NextDataUnitRequest& request);
  absl::StatusOr<v1::ReportEpochResponse> ReportEpoch(
      const Caller& caller, const v1::ReportEpochRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const Caller& caller, const v1::HeartbeatRequest& request);
  // Unbinds the group once it left.
  absl::StatusOr<v1::LeaveResponse> Leave(const Caller& caller,
                                          const v1::LeaveRequest& request);

  // Validation pools. Subscribe checks every job id first (NOT_FOUND for an
  // unknown one); `label` names the subscriber in logs. RESOURCE_EXHAUSTED
  // while MasterLimits::max_subscriptions subscriptions are alive. While
  // the subscription lives, `caller` may report validations of the jobs it
  // follows; others need a live group of the job, or the admin role.
  absl::StatusOr<std::shared_ptr<SnapshotHub::Subscription>> SubscribeSnapshots(
      const Caller& caller, const v1::SubscribeSnapshotsRequest& request,
      const std::string& label);
  absl::StatusOr<v1::ReportValidationResponse> ReportValidation(
      const Caller& caller, const v1::ReportValidationRequest& request);

  // Stops a QUEUED or RUNNING job as a stop rule would (JobRegistry::Stop):
  // MPI Opt prunes and cancels trials with it.
  absl::Status StopJob(const std::string& job_id, const std::string& reason);

  // Status, with the snapshot counters filled in.
  absl::StatusOr<v1::JobStatus> GetJobStatus(
      const v1::GetJobStatusRequest& request) const;
  // One page of the job list (ListJobsRequest: page_size, default
  // kDefaultPageSize, at most kMaxPageSize; page_token; states), bounded
  // by MasterLimits::max_list_bytes. The token is the number of the page's
  // last job ("job-000041" -> "41"); INVALID_ARGUMENT for a malformed one.
  absl::StatusOr<v1::ListJobsResponse> ListJobPage(
      const v1::ListJobsRequest& request) const;
  static constexpr int kDefaultPageSize = 100;
  static constexpr int kMaxPageSize = 1000;
  // Every job matching request.states(), unpaged, for in-process callers;
  // each page is still bounded by max_list_bytes (left_out counts what was
  // dropped).
  v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request) const;
  // The oldest job whose spec is named `name` (MPI Opt's study table finds
  // a trial's job this way after a restart), if any.
  std::optional<std::string> FindJobByName(const std::string& name) const;

  // Ends a QUEUED or RUNNING job as CANCELLED (JobRegistry::Cancel) and
  // returns its status. The reason is kept cut to max_string_bytes with
  // control characters escaped. FAILED_PRECONDITION (JOB_ENDED) for a job
  // that has ended; NOT_FOUND for an unknown id.
  absl::StatusOr<v1::JobStatus> CancelJob(const v1::CancelJobRequest& request);
  // The same after the ownership check: the job's owner or an admin
  // (CheckManages: PERMISSION_DENIED naming the rule).
  absl::StatusOr<v1::JobStatus> CancelJob(const Caller& caller,
                                          const v1::CancelJobRequest& request);
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const Caller& caller,
                                                  const v1::DeleteJobRequest& request);
  // Removes an ended job (JobRegistry::Delete). FAILED_PRECONDITION for a
  // QUEUED or RUNNING one; NOT_FOUND for an unknown id.
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(
      const v1::DeleteJobRequest& request);
  // Every job as the metrics exporter reads it, snapshot counters filled.
  std::vector<JobMetricsView> ListForMetrics() const;
  // What each owner's jobs hold and wait with (JobRegistry::OwnerLoads).
  std::map<std::string, JobRegistry::OwnerLoad> OwnerLoads() const;

  // Sharding, the lead's side: a shard's report and its orders (ShardSync;
  // `wait` bounds the long poll). INVALID_ARGUMENT for a report over its
  // bounds.
  absl::StatusOr<v1::ShardSyncResponse> ShardSync(const v1::ShardSyncRequest& request,
                                                 absl::Duration wait);
  // Sharding, the shard's side (a master with Options::shard_of): the
  // slices it holds, as reported to the lead, and the lead's orders carried
  // out (a slice created from its spec, or stopped). Errors name the job.
  std::vector<v1::ShardSliceStatus> SliceReports() const;
  absl::Status ServeSliceOrders(const v1::ShardSyncResponse& orders);
  // Sharding, the shard's side: its slice of a job the lead wants
  // (SliceWanted), to send with ReportSlice: the header (job id, request,
  // shard index, layout; `error` set when it has none to send) and the
  // weights. The caller sets the header's address.
  struct SliceForLead {
    v1::ReportSliceRequest::Header header;
    std::shared_ptr<const WeightsSnapshot> weights;
  };
  SliceForLead SliceFor(const v1::SliceWanted& wanted) const;
  // Sharding, the lead's side: a shard's slice arriving (ReportSlice).
  // Begin checks the header (a lead only; the bounds of initial weights)
  // before anything is sized; Commit hands the slice to the gather waiting
  // for it (SliceGather::Deliver's errors).
  absl::StatusOr<PendingTensors> BeginSliceReport(const v1::ReportSliceRequest::Header& header);
  absl::Status CommitSliceReport(PendingTensors pending);

  // Periodic work (lost groups, time-based checkpoints); call at least
  // every TickPeriod().
  void Tick();
  absl::Duration TickPeriod() const;
  // Shutdown, in this order: CloseSnapshots (ends every subscription's
  // stream), then once no call runs any more CheckpointAll.
  void CloseSnapshots();
  void CheckpointAll();

 private:
  MasterCore();  // master_shards.cc, where ShardSnapshots is complete

  // The model bound of MasterLimits, checked on a normalized spec.
  absl::Status CheckModelBound(const v1::JobSpec& spec) const;
  // SubmitJob: a warm start's source job exists, its file can be opened.
  absl::Status CheckWarmStartSource(const v1::JobSpec& spec) const;
  // RegisterGroup's sharding (master_shards.cc): a shard checks the lead's
  // group id; a lead places a job without weights on its shards, waits for
  // their slices and tells the group where they are (the group leaves
  // again if they do not come).
  absl::Status CheckShardRegistration(const v1::RegisterGroupRequest& request) const;
  absl::Status PlaceOnShards(v1::RegisterGroupResponse& response);
  // GetJobStatus' shards, version and parameters of a sharded job.
  void FillShards(v1::JobStatus& status) const;
  // The job's weights: in memory, or an ended job's from its newest
  // checkpoint on disk (JobRegistry::EndedWeights) once they were released.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> WeightsOf(const Job& job) const;
  // Whether the job's weights live on shards (a lead's placement of it).
  bool OnShards(const std::string& job_id) const;
  // A sharded job's whole weights, its shards' slices gathered and joined
  // (docs/sharding.md, "Whole-model views"). With `sync` the gather is
  // repeated (a few times at most) until every slice is at the same
  // version, so the view is one state of the model.
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> GatherWeights(
      const std::string& job_id, const v1::JobSpec& spec);
  // QUEUED `status`'s queue_position and queue_note from `order`.
  static void FillQueuePlaces(const std::map<std::string, JobRegistry::QueueSlot>& order,
                              v1::JobStatus& status);
  // CheckManages for job `job_id`'s owner; NOT_FOUND for an unknown job.
  absl::Status CheckManagesJob(const Caller& caller, const std::string& job_id) const;
  // The bounds of a tensor set arriving (InitWeights, ReportSlice): tensor
  // count, fp32 bytes, names. `what` names it in errors.
  absl::Status CheckIncomingSet(const v1::TensorSetHeader& weights, const std::string& what) const;

  // Publishes sharded jobs' snapshots at their epoch ends: the hub's
  // observer in front of it (master_shards.cc).
  class ShardSnapshots;
  void CreateShardSnapshots();
  void StartShardSnapshots();
  JobObserver* ShardSnapshotsObserver();

  MasterLimits limits_;
  // Declared before the hub: its subscriptions hold records of it.
  std::unique_ptr<CallerBindings> callers_;
  // Subscriptions alive (handed out and not yet destroyed).
  std::shared_ptr<std::atomic<int>> subscriptions_ =
      std::make_shared<std::atomic<int>>(0);
  // Declared before the registry, whose observer it is, so it outlives it.
  std::unique_ptr<SnapshotHub> snapshots_;
  // A lead's gathers of sharded jobs' slices.
  std::unique_ptr<SliceGather> gather_;
  // The registry's observer in front of the hub; outlives the registry
  // too, its thread stopped first (~MasterCore).
  std::unique_ptr<ShardSnapshots> shard_snapshots_;
  std::unique_ptr<JobRegistry> registry_;
  std::string shard_of_;
  std::unique_ptr<ShardTable> shard_table_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_MASTER_CORE_H_
