// The gRPC face of the master: a thin adapter that turns each Master RPC
// into a call on the master's core (server/core/master_core.h) and its
// status back (common/grpc_status.h, reason included). It only moves bytes:
// reading a stream's chunks into the core's PendingTensors, streaming reply
// weights and snapshots as chunks. Holds no state of its own; all logic
// lives in the core.
//
// Observability (both optional, null in tests that need neither):
//   - MasterMetrics: every RPC's latency and status code
//     (mpilearn_rpc_duration_seconds{method,code}), the streaming RPCs open
//     now (PushGradient, PullWeights, InitWeights, SubscribeSnapshots), and
//     tensor bytes received (PushGradient, InitWeights) and sent (the
//     PushGradient reply, PullWeights, snapshots) per job.
//   - TraceRecorder: the trace events "receive" (reading a PushGradient or
//     InitWeights stream's tensors, arg bytes), "send" (streaming a
//     PushGradient's reply weights), "pull" (PullWeights), "next_unit"
//     (NextDataUnit), "snapshot_send" (one snapshot to a subscriber) and
//     "validation_report" (ReportEpoch, ReportValidation); the registry
//     records "apply" and "checkpoint".
#ifndef MPILEARN_SERVER_MASTER_SERVICE_H_
#define MPILEARN_SERVER_MASTER_SERVICE_H_

#include "common/trace.h"
#include "grpcpp/grpcpp.h"
#include "proto/mpilearn.grpc.pb.h"
#include "server/auth.h"
#include "server/core/master_core.h"
#include "server/master_metrics.h"

namespace mpilearn::server {

class MasterServiceImpl final : public v1::Master::Service {
 public:
  using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

  // The tensor streams (PushGradient, PullWeights, SubscribeSnapshots) are
  // served on raw byte buffers (common/tensor_wire.h): chunks are read
  // into the job's buffers and weights are sent from the master's
  // immutable snapshots without building messages around the bytes.
  // `metrics` and `trace` may be null; when given they must outlive the
  // service.
  // `auth`, when given (it must outlive the service), checks every call's
  // token and role (server/auth.h); the caller it gives is passed to the
  // core, which binds each registered group to it and refuses a call
  // naming a group another caller registered, and a ReportValidation from
  // a caller neither following the job's snapshots nor owning a live group
  // of it (MasterCore::Options::check_callers). Null: every caller is an
  // admin named "".
  explicit MasterServiceImpl(MasterCore& core, MasterMetrics* metrics = nullptr,
                             TraceRecorder* trace = nullptr,
                             Authorizer* auth = nullptr);

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  // A parameter shard's sync with this lead (MasterCore::ShardSync).
  grpc::Status ShardSync(grpc::ServerContext* context, const v1::ShardSyncRequest* request,
                         v1::ShardSyncResponse* response) override;
  // A shard's slice for a whole-model view (MasterCore::BeginSliceReport).
  grpc::Status ReportSlice(grpc::ServerContext* context,
                           grpc::ServerReader<v1::ReportSliceRequest>* reader,
                           v1::ReportSliceResponse* response) override;
  grpc::Status RegisterGroup(grpc::ServerContext* context,
                             const v1::RegisterGroupRequest* request,
                             v1::RegisterGroupResponse* response) override;
  grpc::Status InitWeights(grpc::ServerContext* context,
                           grpc::ServerReader<v1::InitWeightsRequest>* reader,
                           v1::InitWeightsResponse* response) override;
  // Raw: the PushGradientRequest stream in, the WeightsPart stream out.
  grpc::Status PushGradientRaw(grpc::ServerContext* context, RawStream* stream);
  // Raw: one PullWeightsRequest in, the WeightsPart stream out.
  grpc::Status PullWeightsRaw(grpc::ServerContext* context, RawStream* stream);
  grpc::Status NextDataUnit(grpc::ServerContext* context,
                            const v1::NextDataUnitRequest* request,
                            v1::NextDataUnitResponse* response) override;
  grpc::Status ReportEpoch(grpc::ServerContext* context,
                           const v1::ReportEpochRequest* request,
                           v1::ReportEpochResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context,
                     const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override;
  // Streams snapshots as the hub delivers them until the client cancels
  // (noticed within a second) or the hub closes (server shutdown:
  // UNAVAILABLE). NOT_FOUND for an unknown job id in the request. While
  // open, its token may report validations of the jobs it follows.
  // Raw: one SubscribeSnapshotsRequest in, the SnapshotPart stream out.
  grpc::Status SubscribeSnapshotsRaw(grpc::ServerContext* context,
                                     RawStream* stream);
  // PERMISSION_DENIED (with tokens) unless the caller's token follows the
  // job with an open SubscribeSnapshots stream, owns a live group of it,
  // or is an admin's.
  grpc::Status ReportValidation(grpc::ServerContext* context,
                                const v1::ReportValidationRequest* request,
                                v1::ReportValidationResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const v1::CancelJobRequest* request,
                         v1::JobStatus* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  // The master's version (common/version.h) and the caller's name and role.
  grpc::Status GetServerInfo(grpc::ServerContext* context,
                             const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

 private:
  MasterCore& core_;
  MasterMetrics* const metrics_;
  TraceRecorder* const trace_;
  Authorizer* const auth_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_SERVICE_H_
