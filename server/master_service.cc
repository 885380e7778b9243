#include "server/master_service.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tensor_wire.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/method_handler.h"
#include "glog/logging.h"
#include "server/call_guard.h"
#include "server/rpc_scope.h"

namespace mpilearn::server {
namespace {

// Reads the rest of a client stream's messages into `pending`: every
// message after the header must be a chunk (InitWeights, typed).
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

// The raw twin of ReceiveChunks: chunk bytes go from gRPC's buffers into
// the pending tensors (a second header is refused).
absl::Status ReceiveRawChunks(MasterServiceImpl::RawStream& stream,
                              absl::string_view rpc, PendingTensors& pending) {
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler * assembler, pending.Assembler());
  grpc::ByteBuffer message;
  while (stream.Read(&message)) {
    MPILEARN_RETURN_IF_ERROR(
        WithReason(ReadTensorPart(message, nullptr, assembler, rpc).status(),
                   v1::ERROR_REASON_INVALID_REQUEST));
  }
  return absl::OkStatus();
}

// Element type for a requested wire dtype (UNSPECIFIED: fp32).
absl::StatusOr<v1::DType> ReplyDType(v1::DType requested) {
  if (requested == v1::DTYPE_UNSPECIFIED) return v1::DTYPE_FLOAT32;
  absl::Status supported = DTypeSize(requested).status();
  if (!supported.ok()) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("reply dtype: ", supported.message())),
                      v1::ERROR_REASON_INVALID_REQUEST);
  }
  return requested;
}

// Streams `header` (already set in `first`, a WeightsPart or SnapshotPart)
// and then the weights' chunks in `dtype`. fp32 chunks reference the
// snapshot itself (immutable, kept alive until gRPC is done with it); a
// reduced dtype is encoded chunk by chunk. Adds the tensor bytes written to
// `*sent`.
template <typename Part>
absl::Status SendRawWeights(const Part& first,
                            std::shared_ptr<const WeightsSnapshot> weights,
                            v1::DType dtype, MasterServiceImpl::RawStream& stream,
                            uint64_t* sent) {
  grpc::ByteBuffer header = SerializeToByteBuffer(first);
  if (!stream.Write(header)) {
    return absl::UnavailableError("client went away while receiving weights");
  }
  std::vector<absl::Span<const float>> values;
  values.reserve(weights->values.size());
  for (const std::vector<float>& v : weights->values) values.push_back(v);
  return ForEachChunkMessage(
      values, dtype, kDefaultChunkBytes, weights,
      [&](grpc::ByteBuffer& message, size_t data_bytes) -> absl::Status {
        if (!stream.Write(message)) {
          return absl::UnavailableError(
              "client went away while receiving weights");
        }
        *sent += data_bytes;
        return absl::OkStatus();
      });
}

// A WeightsPart header for `weights` sent as `dtype`.
v1::WeightsPart WeightsHeader(const WeightsSnapshot& weights, v1::DType dtype) {
  v1::WeightsPart part;
  *part.mutable_header() = weights.header;
  SetWireDType(part.mutable_header(), dtype);
  return part;
}

// Reads a raw stream's single request message into `request`.
absl::Status ReadRequest(MasterServiceImpl::RawStream& stream,
                         google::protobuf::MessageLite* request,
                         absl::string_view rpc) {
  grpc::ByteBuffer message;
  if (!stream.Read(&message)) {
    return InvalidRequestError(absl::StrCat(rpc, ": no request message"));
  }
  return WithReason(ParseFromByteBuffer(message, request, rpc),
                    v1::ERROR_REASON_INVALID_REQUEST);
}

absl::Status ExpectHeader(bool has_header, absl::string_view rpc) {
  if (!has_header) {
    return InvalidRequestError(
        absl::StrCat(rpc, ": the first message of the stream must be a header"));
  }
  return absl::OkStatus();
}

// The index of Master's `method` as the generated code numbers methods
// (declaration order, which is the descriptor's).
int MasterMethodIndex(const std::string& method) {
  // Loads proto/mpilearn.proto's descriptors into the generated pool.
  (void)v1::PushGradientRequest::descriptor();
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          "mpilearn.v1.Master." + method);
  CHECK(descriptor != nullptr) << "no method Master." << method;
  return descriptor->index();
}

}  // namespace

MasterServiceImpl::MasterServiceImpl(MasterCore& core, MasterMetrics* metrics,
                                     TraceRecorder* trace, Authorizer* auth)
    : core_(core), metrics_(metrics), trace_(trace), auth_(auth) {
  // The tensor streams take byte buffers instead of messages: the handler
  // is swapped for one of the same (bidirectional) shape on ByteBuffers;
  // clients see the same protocol.
  using Handler = grpc::internal::BidiStreamingHandler<
      MasterServiceImpl, grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(MasterMethodIndex("PushGradient"),
                     new Handler(&MasterServiceImpl::PushGradientRaw, this));
  MarkMethodStreamed(MasterMethodIndex("PullWeights"),
                     new Handler(&MasterServiceImpl::PullWeightsRaw, this));
  MarkMethodStreamed(MasterMethodIndex("SubscribeSnapshots"),
                     new Handler(&MasterServiceImpl::SubscribeSnapshotsRaw, this));
}

grpc::Status MasterServiceImpl::SubmitJob(grpc::ServerContext* context,
                                          const v1::SubmitJobRequest* request,
                                          v1::SubmitJobResponse* response) {
  RpcScope rpc(metrics_, "SubmitJob");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("SubmitJob", [&]() -> grpc::Status {
    if (!request->spec().study().empty()) {
      return ToGrpcStatus(InvalidRequestError(
          "study is set by MPI Opt on its trials' jobs; remove it (mpilearn-opt creates "
          "studies)"));
    }
    return Reply(core_.SubmitJob(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::ShardSync(grpc::ServerContext* context,
                                          const v1::ShardSyncRequest* request,
                                          v1::ShardSyncResponse* response) {
  RpcScope rpc(metrics_, "ShardSync");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("ShardSync", [&] {
    return Reply(core_.ShardSync(*request, absl::Seconds(10)), response);
  }));
}

grpc::Status MasterServiceImpl::ReportSlice(grpc::ServerContext* context,
                                            grpc::ServerReader<v1::ReportSliceRequest>* reader,
                                            v1::ReportSliceResponse* /*response*/) {
  RpcScope rpc(metrics_, "ReportSlice", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("ReportSlice", [&]() -> absl::Status {
    v1::ReportSliceRequest first;
    MPILEARN_RETURN_IF_ERROR(
        ExpectHeader(reader->Read(&first) && first.has_header(), "ReportSlice"));
    MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending, core_.BeginSliceReport(first.header()));
    MPILEARN_RETURN_IF_ERROR(
        ReceiveChunks<v1::ReportSliceRequest>(*reader, "ReportSlice", pending));
    return core_.CommitSliceReport(std::move(pending));
  }));
}

grpc::Status MasterServiceImpl::RegisterGroup(
    grpc::ServerContext* context, const v1::RegisterGroupRequest* request,
    v1::RegisterGroupResponse* response) {
  RpcScope rpc(metrics_, "RegisterGroup");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("RegisterGroup", [&] {
    return Reply(core_.RegisterGroup(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::InitWeights(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  RpcScope rpc(metrics_, "InitWeights", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  auto handle = [&]() -> absl::Status {
    v1::InitWeightsRequest first;
    MPILEARN_RETURN_IF_ERROR(
        ExpectHeader(reader->Read(&first) && first.has_header(), "InitWeights"));
    MPILEARN_ASSIGN_OR_RETURN(
        PendingTensors pending,
        core_.BeginInitWeights(rpc.caller(), first.header()));
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
  return rpc.Finish(GuardCall("InitWeights", handle));
}

grpc::Status MasterServiceImpl::PushGradientRaw(grpc::ServerContext* context,
                                                RawStream* stream) {
  RpcScope rpc(metrics_, "PushGradient", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  auto handle = [&]() -> absl::Status {
    grpc::ByteBuffer message;
    v1::PushGradientRequest::Header header;
    MPILEARN_RETURN_IF_ERROR(ExpectHeader(stream->Read(&message), "PushGradient"));
    absl::StatusOr<TensorPart> first =
        ReadTensorPart(message, &header, nullptr, "PushGradient");
    if (!first.ok()) {
      return WithReason(first.status(), v1::ERROR_REASON_INVALID_REQUEST);
    }
    // The core checks the caller owns the group before anything else.
    MPILEARN_ASSIGN_OR_RETURN(PendingTensors pending,
                              core_.BeginPush(rpc.caller(), header));
    MPILEARN_ASSIGN_OR_RETURN(const v1::DType reply_dtype,
                              ReplyDType(header.reply_dtype()));
    const std::string job_id = pending.job_id();
    TraceSpan receive(trace_, "receive", "master");
    MPILEARN_RETURN_IF_ERROR(ReceiveRawChunks(*stream, "PushGradient", pending));
    receive.Arg("bytes", static_cast<int64_t>(pending.bytes()));
    receive.End();
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(job_id, pending.bytes());
    // The core records the "apply" event.
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              core_.CommitPush(std::move(pending)));
    VLOG(1) << "job " << job_id << ": update from " << header.group_id()
            << " rank " << header.rank() << " -> version "
            << weights->header.version();
    TraceSpan send(trace_, "send", "master");
    uint64_t sent = 0;
    const absl::Status status =
        SendRawWeights(WeightsHeader(*weights, reply_dtype), weights,
                       reply_dtype, *stream, &sent);
    send.Arg("version", static_cast<int64_t>(weights->header.version()));
    send.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(job_id, sent);
    return status;
  };
  return rpc.Finish(GuardCall("PushGradient", handle));
}

grpc::Status MasterServiceImpl::PullWeightsRaw(grpc::ServerContext* context,
                                               RawStream* stream) {
  RpcScope rpc(metrics_, "PullWeights", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  TraceSpan pull(trace_, "pull", "master");
  auto handle = [&]() -> absl::Status {
    v1::PullWeightsRequest request;
    MPILEARN_RETURN_IF_ERROR(ReadRequest(*stream, &request, "PullWeights"));
    // The core checks the caller owns the group (if the pull names one)
    // before anything else.
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              core_.PullWeights(rpc.caller(), request));
    MPILEARN_ASSIGN_OR_RETURN(const v1::DType dtype,
                              ReplyDType(request.dtype()));
    uint64_t sent = 0;
    const absl::Status status = SendRawWeights(WeightsHeader(*weights, dtype),
                                               weights, dtype, *stream, &sent);
    pull.Arg("version", static_cast<int64_t>(weights->header.version()));
    pull.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(request.job_id(), sent);
    return status;
  };
  return rpc.Finish(GuardCall("PullWeights", handle));
}

grpc::Status MasterServiceImpl::NextDataUnit(
    grpc::ServerContext* context, const v1::NextDataUnitRequest* request,
    v1::NextDataUnitResponse* response) {
  RpcScope rpc(metrics_, "NextDataUnit");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  TraceSpan span(trace_, "next_unit", "master");
  span.Arg("completed", request->completed_size());
  const grpc::Status status = GuardCall("NextDataUnit", [&] {
    return Reply(core_.NextDataUnit(rpc.caller(), *request), response);
  });
  if (status.ok()) {
    span.Arg("action", response->action());
    if (response->action() == v1::NextDataUnitResponse::TRAIN) {
      span.Arg("unit", response->unit().unit_id());
    }
  }
  return rpc.Finish(status);
}

grpc::Status MasterServiceImpl::ReportEpoch(
    grpc::ServerContext* context, const v1::ReportEpochRequest* request,
    v1::ReportEpochResponse* response) {
  RpcScope rpc(metrics_, "ReportEpoch");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("epoch", request->record().epoch());
  return rpc.Finish(GuardCall("ReportEpoch", [&] {
    return Reply(core_.ReportEpoch(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  RpcScope rpc(metrics_, "Heartbeat");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("Heartbeat", [&] {
    return Reply(core_.Heartbeat(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::Leave(grpc::ServerContext* context,
                                      const v1::LeaveRequest* request,
                                      v1::LeaveResponse* response) {
  RpcScope rpc(metrics_, "Leave");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("Leave", [&] {
    return Reply(core_.Leave(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::ReportValidation(
    grpc::ServerContext* context, const v1::ReportValidationRequest* request,
    v1::ReportValidationResponse* response) {
  RpcScope rpc(metrics_, "ReportValidation");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("version", static_cast<int64_t>(request->record().version()));
  span.Arg("epoch", request->record().epoch());
  return rpc.Finish(GuardCall("ReportValidation", [&] {
    // The core checks the caller follows the job or trains it.
    return Reply(core_.ReportValidation(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::SubscribeSnapshotsRaw(
    grpc::ServerContext* context, RawStream* stream) {
  RpcScope rpc(metrics_, "SubscribeSnapshots", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  v1::SubscribeSnapshotsRequest request;
  absl::Status read = ReadRequest(*stream, &request, "SubscribeSnapshots");
  if (!read.ok()) return rpc.Finish(ToGrpcStatus(read));
  const std::string label =
      absl::StrCat(request.subscriber().empty() ? "unnamed"
                                                : request.subscriber(),
                   " at ", context->peer());
  // While `subscription` lives (until this handler returns) its caller may
  // report validations of the jobs it follows (MasterCore::ReportValidation).
  std::shared_ptr<SnapshotHub::Subscription> subscription;
  const grpc::Status subscribed = GuardCall("SubscribeSnapshots", [&] {
    absl::StatusOr<std::shared_ptr<SnapshotHub::Subscription>> made =
        core_.SubscribeSnapshots(rpc.caller(), request, label);
    if (made.ok()) subscription = *std::move(made);
    return made.status();
  });
  if (!subscribed.ok()) return rpc.Finish(subscribed);
  // Tells the client it is subscribed: snapshots from now on reach it. The
  // key is common/client/master_client.h's kSubscribedMetadataKey.
  context->AddInitialMetadata("mpilearn-subscribed", "1");
  stream->SendInitialMetadata();
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
    v1::SnapshotPart part;
    v1::SnapshotHeader* header = part.mutable_header();
    header->set_job_id(delivery->job_id);
    *header->mutable_spec() = *delivery->spec;
    *header->mutable_weights() = delivery->weights->header;
    header->set_epoch(delivery->epoch);
    header->set_skipped(delivery->skipped);
    uint64_t sent_bytes = 0;
    // Pools always get fp32: they validate the master's exact weights.
    const grpc::Status sent = GuardCall("SubscribeSnapshots", [&] {
      return SendRawWeights(part, delivery->weights, v1::DTYPE_FLOAT32,
                            *stream, &sent_bytes);
    });
    span.Arg("version", static_cast<int64_t>(delivery->weights->header.version()));
    span.Arg("bytes", static_cast<int64_t>(sent_bytes));
    if (metrics_ != nullptr) metrics_->AddSentBytes(delivery->job_id, sent_bytes);
    if (!sent.ok()) return rpc.Finish(sent);
  }
  return rpc.Finish(ToGrpcStatus(absl::CancelledError("the subscriber cancelled")));
}

grpc::Status MasterServiceImpl::GetJobStatus(
    grpc::ServerContext* context, const v1::GetJobStatusRequest* request,
    v1::JobStatus* response) {
  RpcScope rpc(metrics_, "GetJobStatus");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("GetJobStatus", [&] {
    return Reply(core_.GetJobStatus(*request), response);
  }));
}

grpc::Status MasterServiceImpl::ListJobs(grpc::ServerContext* context,
                                         const v1::ListJobsRequest* request,
                                         v1::ListJobsResponse* response) {
  RpcScope rpc(metrics_, "ListJobs");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("ListJobs", [&] {
    return Reply(core_.ListJobPage(*request), response);
  }));
}

grpc::Status MasterServiceImpl::CancelJob(grpc::ServerContext* context,
                                          const v1::CancelJobRequest* request,
                                          v1::JobStatus* response) {
  RpcScope rpc(metrics_, "CancelJob");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("CancelJob", [&] {
    return Reply(core_.CancelJob(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::DeleteJob(grpc::ServerContext* context,
                                          const v1::DeleteJobRequest* request,
                                          v1::DeleteJobResponse* response) {
  RpcScope rpc(metrics_, "DeleteJob");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("DeleteJob", [&] {
    return Reply(core_.DeleteJob(rpc.caller(), *request), response);
  }));
}

grpc::Status MasterServiceImpl::GetServerInfo(grpc::ServerContext* context,
                                              const v1::GetServerInfoRequest* /*request*/,
                                              v1::ServerInfo* response) {
  RpcScope rpc(metrics_, "GetServerInfo");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  response->set_version(kMpiLearnVersion);
  response->set_caller(rpc.caller().name);
  response->set_role(std::string(RoleName(rpc.caller().role)));
  return rpc.Finish(grpc::Status::OK);
}

}  // namespace mpilearn::server
