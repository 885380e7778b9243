#include "server/master_service.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "server/rpc_scope.h"

namespace mpilearn::server {
namespace {

// Reads the rest of a client stream's messages into `pending`: every
// message after the header must be a chunk.
template <typename Request, typename Reader>
absl::Status ReceiveChunks(Reader& reader, absl::string_view rpc,
                           PendingTensors& pending) {
  Request message;
  while (reader.Read(&message)) {
    if (!message.has_chunk()) {
      return InvalidRequestError(
          absl::StrCat(rpc, ": expected only chunks after the header"));
    }
    MPILEARN_RETURN_IF_ERROR(pending.AddChunk(message.chunk()));
  }
  return absl::OkStatus();
}

// Streams the weights' tensor chunks as `Part` messages (WeightsPart,
// SnapshotPart); the caller has written the header. Adds the tensor bytes
// written to `*sent`.
template <typename Part, typename Writer>
absl::Status SendChunks(const WeightsSnapshot& weights, Writer* writer,
                        uint64_t* sent) {
  std::vector<absl::Span<const char>> buffers;
  buffers.reserve(weights.values.size());
  for (const auto& v : weights.values) buffers.push_back(AsBytes(v));
  Part part;
  return ForEachChunk(buffers, kDefaultChunkBytes,
                      [&](v1::TensorChunk& chunk) -> absl::Status {
                        part.mutable_chunk()->Swap(&chunk);
                        if (!writer->Write(part)) {
                          return absl::UnavailableError(
                              "client went away while receiving weights");
                        }
                        *sent += part.chunk().data().size();
                        return absl::OkStatus();
                      });
}

// Streams a weights snapshot: header, then chunks (their bytes added to
// `*sent`).
template <typename Writer>
absl::Status SendWeights(const WeightsSnapshot& weights, Writer* writer,
                         uint64_t* sent) {
  v1::WeightsPart part;
  *part.mutable_header() = weights.header;
  if (!writer->Write(part)) {
    return absl::UnavailableError("client went away while receiving weights");
  }
  return SendChunks<v1::WeightsPart>(weights, writer, sent);
}

// Streams a published snapshot: its SnapshotHeader, then the chunks (their
// bytes added to `*sent`).
absl::Status SendSnapshot(const SnapshotHub::Delivery& delivery,
                          grpc::ServerWriter<v1::SnapshotPart>* writer,
                          uint64_t* sent) {
  v1::SnapshotPart part;
  v1::SnapshotHeader* header = part.mutable_header();
  header->set_job_id(delivery.job_id);
  *header->mutable_spec() = *delivery.spec;
  *header->mutable_weights() = delivery.weights->header;
  header->set_epoch(delivery.epoch);
  header->set_skipped(delivery.skipped);
  if (!writer->Write(part)) {
    return absl::UnavailableError("subscriber went away");
  }
  return SendChunks<v1::SnapshotPart>(*delivery.weights, writer, sent);
}

absl::Status ExpectHeader(bool has_header, absl::string_view rpc) {
  if (!has_header) {
    return InvalidRequestError(
        absl::StrCat(rpc, ": the first message of the stream must be a header"));
  }
  return absl::OkStatus();
}


}  // namespace

grpc::Status MasterServiceImpl::SubmitJob(grpc::ServerContext*,
                                          const v1::SubmitJobRequest* request,
                                          v1::SubmitJobResponse* response) {
  RpcScope rpc(metrics_, "SubmitJob");
  return rpc.Finish(Reply(core_.SubmitJob(*request), response));
}

grpc::Status MasterServiceImpl::RegisterGroup(
    grpc::ServerContext*, const v1::RegisterGroupRequest* request,
    v1::RegisterGroupResponse* response) {
  RpcScope rpc(metrics_, "RegisterGroup");
  return rpc.Finish(Reply(core_.RegisterGroup(*request), response));
}

grpc::Status MasterServiceImpl::InitWeights(
    grpc::ServerContext*, grpc::ServerReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  RpcScope rpc(metrics_, "InitWeights", /*streaming=*/true);
  auto handle = [&]() -> absl::Status {
    v1::InitWeightsRequest first;
    MPILEARN_RETURN_IF_ERROR(
        ExpectHeader(reader->Read(&first) && first.has_header(), "InitWeights"));
    MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending,
                              core_.BeginInitWeights(first.header()));
    TraceSpan receive(trace_, "receive", "master");
    MPILEARN_RETURN_IF_ERROR(ReceiveChunks<v1::InitWeightsRequest>(*reader, "InitWeights", pending));
    receive.Arg("bytes", static_cast<int64_t>(pending.bytes()));
    receive.End();
    if (metrics_ != nullptr) {
      metrics_->AddReceivedBytes(pending.job_id(), pending.bytes());
    }
    MPILEARN_ASSIGN_OR_RETURN(*response,
                              core_.CommitInitWeights(std::move(pending)));
    return absl::OkStatus();
  };
  return rpc.Finish(ToGrpcStatus(handle()));
}

grpc::Status MasterServiceImpl::PushGradient(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<v1::WeightsPart, v1::PushGradientRequest>* stream) {
  RpcScope rpc(metrics_, "PushGradient", /*streaming=*/true);
  auto handle = [&]() -> absl::Status {
    v1::PushGradientRequest first;
    MPILEARN_RETURN_IF_ERROR(
        ExpectHeader(stream->Read(&first) && first.has_header(), "PushGradient"));
    MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending,
                              core_.BeginPush(first.header()));
    const std::string job_id = pending.job_id();
    TraceSpan receive(trace_, "receive", "master");
    MPILEARN_RETURN_IF_ERROR(ReceiveChunks<v1::PushGradientRequest>(*stream, "PushGradient",
                                                   pending));
    receive.Arg("bytes", static_cast<int64_t>(pending.bytes()));
    receive.End();
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(job_id, pending.bytes());
    // The core records the "apply" event.
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              core_.CommitPush(std::move(pending)));
    VLOG(1) << "job " << job_id << ": update from " << first.header().group_id()
            << " rank " << first.header().rank() << " -> version "
            << weights->header.version();
    TraceSpan send(trace_, "send", "master");
    uint64_t sent = 0;
    const absl::Status status = SendWeights(*weights, stream, &sent);
    send.Arg("version", static_cast<int64_t>(weights->header.version()));
    send.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(job_id, sent);
    return status;
  };
  return rpc.Finish(ToGrpcStatus(handle()));
}

grpc::Status MasterServiceImpl::PullWeights(
    grpc::ServerContext*, const v1::PullWeightsRequest* request,
    grpc::ServerWriter<v1::WeightsPart>* writer) {
  RpcScope rpc(metrics_, "PullWeights", /*streaming=*/true);
  TraceSpan pull(trace_, "pull", "master");
  auto handle = [&]() -> absl::Status {
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              core_.PullWeights(*request));
    uint64_t sent = 0;
    const absl::Status status = SendWeights(*weights, writer, &sent);
    pull.Arg("version", static_cast<int64_t>(weights->header.version()));
    pull.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(request->job_id(), sent);
    return status;
  };
  return rpc.Finish(ToGrpcStatus(handle()));
}

grpc::Status MasterServiceImpl::NextDataUnit(
    grpc::ServerContext*, const v1::NextDataUnitRequest* request,
    v1::NextDataUnitResponse* response) {
  RpcScope rpc(metrics_, "NextDataUnit");
  TraceSpan span(trace_, "next_unit", "master");
  span.Arg("completed", request->completed_size());
  const grpc::Status status = Reply(core_.NextDataUnit(*request), response);
  if (status.ok()) {
    span.Arg("action", response->action());
    if (response->action() == v1::NextDataUnitResponse::TRAIN) {
      span.Arg("unit", response->unit().unit_id());
    }
  }
  return rpc.Finish(status);
}

grpc::Status MasterServiceImpl::ReportEpoch(
    grpc::ServerContext*, const v1::ReportEpochRequest* request,
    v1::ReportEpochResponse* response) {
  RpcScope rpc(metrics_, "ReportEpoch");
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("epoch", request->record().epoch());
  return rpc.Finish(Reply(core_.ReportEpoch(*request), response));
}

grpc::Status MasterServiceImpl::Heartbeat(grpc::ServerContext*,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  RpcScope rpc(metrics_, "Heartbeat");
  return rpc.Finish(Reply(core_.Heartbeat(*request), response));
}

grpc::Status MasterServiceImpl::Leave(grpc::ServerContext*,
                                      const v1::LeaveRequest* request,
                                      v1::LeaveResponse* response) {
  RpcScope rpc(metrics_, "Leave");
  return rpc.Finish(Reply(core_.Leave(*request), response));
}

grpc::Status MasterServiceImpl::ReportValidation(
    grpc::ServerContext*, const v1::ReportValidationRequest* request,
    v1::ReportValidationResponse* response) {
  RpcScope rpc(metrics_, "ReportValidation");
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("version", static_cast<int64_t>(request->record().version()));
  span.Arg("epoch", request->record().epoch());
  return rpc.Finish(Reply(core_.ReportValidation(*request), response));
}

grpc::Status MasterServiceImpl::SubscribeSnapshots(
    grpc::ServerContext* context, const v1::SubscribeSnapshotsRequest* request,
    grpc::ServerWriter<v1::SnapshotPart>* writer) {
  RpcScope rpc(metrics_, "SubscribeSnapshots", /*streaming=*/true);
  const std::string label =
      absl::StrCat(request->subscriber().empty() ? "unnamed"
                                                 : request->subscriber(),
                   " at ", context->peer());
  absl::StatusOr<std::shared_ptr<SnapshotHub::Subscription>> subscribed =
      core_.SubscribeSnapshots(*request, label);
  if (!subscribed.ok()) return rpc.Finish(ToGrpcStatus(subscribed.status()));
  std::shared_ptr<SnapshotHub::Subscription> subscription = *subscribed;
  // Tells the client it is subscribed: snapshots from now on reach it. The
  // key is common/master_client.h's kSubscribedMetadataKey.
  context->AddInitialMetadata("mpilearn-subscribed", "1");
  writer->SendInitialMetadata();
  while (!context->IsCancelled()) {
    std::optional<SnapshotHub::Delivery> delivery =
        subscription->Next(absl::Seconds(1));
    if (!delivery.has_value()) {
      if (subscription->closed()) {
        return rpc.Finish(ToGrpcStatus(
            WithReason(absl::UnavailableError("the master is shutting down"),
                       v1::ERROR_REASON_UNAVAILABLE)));
      }
      continue;
    }
    VLOG(1) << "snapshot of job " << delivery->job_id << " v"
            << delivery->weights->header.version() << " to " << label;
    TraceSpan span(trace_, "snapshot_send", "master");
    uint64_t sent_bytes = 0;
    absl::Status sent = SendSnapshot(*delivery, writer, &sent_bytes);
    span.Arg("version", static_cast<int64_t>(delivery->weights->header.version()));
    span.Arg("bytes", static_cast<int64_t>(sent_bytes));
    if (metrics_ != nullptr) metrics_->AddSentBytes(delivery->job_id, sent_bytes);
    if (!sent.ok()) return rpc.Finish(ToGrpcStatus(sent));
  }
  return rpc.Finish(ToGrpcStatus(absl::CancelledError("the subscriber cancelled")));
}

grpc::Status MasterServiceImpl::GetJobStatus(
    grpc::ServerContext*, const v1::GetJobStatusRequest* request,
    v1::JobStatus* response) {
  RpcScope rpc(metrics_, "GetJobStatus");
  return rpc.Finish(Reply(core_.GetJobStatus(*request), response));
}

grpc::Status MasterServiceImpl::ListJobs(grpc::ServerContext*,
                                         const v1::ListJobsRequest* request,
                                         v1::ListJobsResponse* response) {
  RpcScope rpc(metrics_, "ListJobs");
  *response = core_.ListJobs(*request);
  return rpc.Finish(grpc::Status::OK);
}

}  // namespace mpilearn::server
