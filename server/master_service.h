// The gRPC face of the master: translates each Master RPC into a call on the
// JobRegistry (or, for snapshot subscriptions, the SnapshotHub) and its
// status back. Holds no state of its own beyond those references; all logic
// lives in job_registry.h / job.h / snapshot_hub.h.
#ifndef MPILEARN_SERVER_MASTER_SERVICE_H_
#define MPILEARN_SERVER_MASTER_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "proto/mpilearn.grpc.pb.h"
#include "server/job_registry.h"
#include "server/snapshot_hub.h"

namespace mpilearn::server {

class MasterServiceImpl final : public v1::Master::Service {
 public:
  MasterServiceImpl(JobRegistry& registry, SnapshotHub& snapshots)
      : registry_(registry), snapshots_(snapshots) {}

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status RegisterGroup(grpc::ServerContext* context,
                             const v1::RegisterGroupRequest* request,
                             v1::RegisterGroupResponse* response) override;
  grpc::Status InitWeights(grpc::ServerContext* context,
                           grpc::ServerReader<v1::InitWeightsRequest>* reader,
                           v1::InitWeightsResponse* response) override;
  grpc::Status PushGradient(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::WeightsPart, v1::PushGradientRequest>* stream)
      override;
  grpc::Status PullWeights(grpc::ServerContext* context,
                           const v1::PullWeightsRequest* request,
                           grpc::ServerWriter<v1::WeightsPart>* writer) override;
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
  // UNAVAILABLE). NOT_FOUND for an unknown job id in the request.
  grpc::Status SubscribeSnapshots(
      grpc::ServerContext* context, const v1::SubscribeSnapshotsRequest* request,
      grpc::ServerWriter<v1::SnapshotPart>* writer) override;
  grpc::Status ReportValidation(grpc::ServerContext* context,
                                const v1::ReportValidationRequest* request,
                                v1::ReportValidationResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;

 private:
  // Fills status.snapshots_published/skipped from the hub.
  void AddSnapshotCounters(v1::JobStatus& status) const;

  JobRegistry& registry_;
  SnapshotHub& snapshots_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_SERVICE_H_
