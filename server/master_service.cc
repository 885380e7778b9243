#include "server/master_service.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"

namespace mpilearn::server {
namespace {

// Times one RPC into mpilearn_rpc_duration_seconds{method,code} and, for a
// streaming RPC, counts it in mpilearn_open_streams while it runs. The
// handler returns its status through Finish; an RPC that never gets there
// counts as UNKNOWN. A no-op without metrics.
class RpcScope {
 public:
  RpcScope(MasterMetrics* metrics, const char* method, bool streaming = false)
      : metrics_(metrics),
        method_(method),
        streaming_(streaming),
        start_(std::chrono::steady_clock::now()) {
    if (metrics_ != nullptr && streaming_) metrics_->StreamOpened(method_);
  }
  ~RpcScope() {
    if (metrics_ == nullptr) return;
    const std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start_;
    metrics_->ObserveRpc(
        method_,
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code_)),
        elapsed.count());
    if (streaming_) metrics_->StreamClosed(method_);
  }
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  grpc::Status Finish(grpc::Status status) {
    code_ = status.error_code();
    return status;
  }

 private:
  MasterMetrics* const metrics_;
  const char* const method_;
  const bool streaming_;
  const std::chrono::steady_clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
};

// Holds the assembled tensors of one incoming stream.
struct IncomingTensors {
  std::vector<std::vector<float>> values;
  uint64_t bytes = 0;  // tensor bytes received
};

// Reads chunk messages from `next` (which returns false at end of stream)
// into fp32 buffers laid out as `header`.
template <typename NextChunk>
absl::StatusOr<IncomingTensors> ReceiveTensors(const v1::TensorSetHeader& header,
                                               NextChunk next) {
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> sizes,
                            TensorSetAssembler::ByteSizes(header));
  IncomingTensors in;
  std::vector<absl::Span<char>> dest;
  in.values.reserve(sizes.size());
  for (size_t bytes : sizes) {
    in.values.emplace_back(bytes / sizeof(float));
    dest.push_back(AsWritableBytes(absl::MakeSpan(in.values.back())));
    in.bytes += bytes;
  }
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler assembler,
                            TensorSetAssembler::Create(header, dest));
  const v1::TensorChunk* chunk = nullptr;
  absl::Status status;
  while ((chunk = next(&status)) != nullptr) {
    MPILEARN_RETURN_IF_ERROR(assembler.Add(*chunk));
  }
  MPILEARN_RETURN_IF_ERROR(status);
  MPILEARN_RETURN_IF_ERROR(assembler.Finish());
  return in;
}

// The rest of a client stream as a chunk source for ReceiveTensors: each
// call reads the next message into `message` and returns its chunk, or null
// at the end of the stream (or, with `*status` set, at a non-chunk message).
template <typename Reader, typename Request>
auto ChunkSource(Reader& reader, Request& message, absl::string_view rpc) {
  return [&reader, &message, rpc](absl::Status* status) -> const v1::TensorChunk* {
    if (!reader.Read(&message)) return nullptr;
    if (!message.has_chunk()) {
      *status = absl::InvalidArgumentError(
          absl::StrCat(rpc, ": expected only chunks after the header"));
      return nullptr;
    }
    return &message.chunk();
  };
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
    return absl::InvalidArgumentError(
        absl::StrCat(rpc, ": the first message of the stream must be a header"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status MasterServiceImpl::SubmitJob(grpc::ServerContext*,
                                          const v1::SubmitJobRequest* request,
                                          v1::SubmitJobResponse* response) {
  RpcScope rpc(metrics_, "SubmitJob");
  absl::StatusOr<std::string> job_id = registry_.Submit(request->spec());
  if (!job_id.ok()) return rpc.Finish(ToGrpcStatus(job_id.status()));
  response->set_job_id(*job_id);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::RegisterGroup(
    grpc::ServerContext*, const v1::RegisterGroupRequest* request,
    v1::RegisterGroupResponse* response) {
  RpcScope rpc(metrics_, "RegisterGroup");
  auto registered = registry_.RegisterGroup(*request);
  if (!registered.ok()) return rpc.Finish(ToGrpcStatus(registered.status()));
  *response = std::move(registered).value();
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::InitWeights(
    grpc::ServerContext*, grpc::ServerReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  RpcScope rpc(metrics_, "InitWeights", /*streaming=*/true);
  auto handle = [&]() -> absl::Status {
    v1::InitWeightsRequest message;
    MPILEARN_RETURN_IF_ERROR(ExpectHeader(
        reader->Read(&message) && message.has_header(), "InitWeights"));
    const v1::InitWeightsRequest::Header header = message.header();
    TraceSpan receive(trace_, "receive", "master");
    MPILEARN_ASSIGN_OR_RETURN(
        IncomingTensors in,
        ReceiveTensors(header.weights(),
                       ChunkSource(*reader, message, "InitWeights")));
    receive.Arg("bytes", static_cast<int64_t>(in.bytes));
    receive.End();
    // Counted for jobs the master holds only (no series for made-up ids).
    if (metrics_ != nullptr && registry_.FindJob(header.job_id()).ok()) {
      metrics_->AddReceivedBytes(header.job_id(), in.bytes);
    }
    MPILEARN_ASSIGN_OR_RETURN(
        *response, registry_.InitWeights(header.job_id(), header.group_id(),
                                         header.weights(), std::move(in.values)));
    return absl::OkStatus();
  };
  return rpc.Finish(ToGrpcStatus(handle()));
}

grpc::Status MasterServiceImpl::PushGradient(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<v1::WeightsPart, v1::PushGradientRequest>* stream) {
  RpcScope rpc(metrics_, "PushGradient", /*streaming=*/true);
  auto handle = [&]() -> absl::Status {
    v1::PushGradientRequest message;
    MPILEARN_RETURN_IF_ERROR(ExpectHeader(
        stream->Read(&message) && message.has_header(), "PushGradient"));
    const v1::PushGradientRequest::Header header = message.header();
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                              registry_.FindJob(header.job_id()));
    MPILEARN_ASSIGN_OR_RETURN(v1::TensorSetHeader layout, job->Layout());
    MPILEARN_RETURN_IF_ERROR(CheckSameLayout(layout, header.gradient()));
    TraceSpan receive(trace_, "receive", "master");
    MPILEARN_ASSIGN_OR_RETURN(
        IncomingTensors in,
        ReceiveTensors(header.gradient(),
                       ChunkSource(*stream, message, "PushGradient")));
    receive.Arg("bytes", static_cast<int64_t>(in.bytes));
    receive.End();
    if (metrics_ != nullptr) metrics_->AddReceivedBytes(job->id(), in.bytes);
    GradientUpdate update;
    update.group_id = header.group_id();
    update.rank = header.rank();
    update.kind = header.kind();
    update.base_version = header.gradient().version();
    update.samples = header.samples();
    update.train_loss = header.train_loss();
    update.values = std::move(in.values);
    // The registry records the "apply" event.
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              registry_.ApplyGradient(*job, update));
    VLOG(1) << "job " << job->id() << ": update from " << update.group_id
            << " rank " << update.rank << " -> version "
            << weights->header.version();
    TraceSpan send(trace_, "send", "master");
    uint64_t sent = 0;
    const absl::Status status = SendWeights(*weights, stream, &sent);
    send.Arg("version", static_cast<int64_t>(weights->header.version()));
    send.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(job->id(), sent);
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
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                              registry_.FindJob(request->job_id()));
    if (!request->group_id().empty()) {
      MPILEARN_RETURN_IF_ERROR(job->Touch(request->group_id(), registry_.Now()));
    }
    MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<const WeightsSnapshot> weights,
                              job->Weights());
    uint64_t sent = 0;
    const absl::Status status = SendWeights(*weights, writer, &sent);
    pull.Arg("version", static_cast<int64_t>(weights->header.version()));
    pull.Arg("bytes", static_cast<int64_t>(sent));
    if (metrics_ != nullptr) metrics_->AddSentBytes(job->id(), sent);
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
  auto next = registry_.NextDataUnit(*request);
  if (!next.ok()) return rpc.Finish(ToGrpcStatus(next.status()));
  *response = std::move(next).value();
  span.Arg("action", response->action());
  if (response->action() == v1::NextDataUnitResponse::TRAIN) {
    span.Arg("unit", response->unit().unit_id());
  }
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::ReportEpoch(
    grpc::ServerContext*, const v1::ReportEpochRequest* request,
    v1::ReportEpochResponse* response) {
  RpcScope rpc(metrics_, "ReportEpoch");
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("epoch", request->record().epoch());
  auto state = registry_.ReportEpoch(request->job_id(), request->record());
  if (!state.ok()) return rpc.Finish(ToGrpcStatus(state.status()));
  response->set_state(*state);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::Heartbeat(grpc::ServerContext*,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  RpcScope rpc(metrics_, "Heartbeat");
  auto state = registry_.Heartbeat(
      request->job_id(), request->group_id(),
      request->has_telemetry() ? &request->telemetry() : nullptr);
  if (!state.ok()) return rpc.Finish(ToGrpcStatus(state.status()));
  response->set_state(*state);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::Leave(grpc::ServerContext*,
                                      const v1::LeaveRequest* request,
                                      v1::LeaveResponse* response) {
  RpcScope rpc(metrics_, "Leave");
  auto state = registry_.Leave(*request);
  if (!state.ok()) return rpc.Finish(ToGrpcStatus(state.status()));
  response->set_state(*state);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::ReportValidation(
    grpc::ServerContext*, const v1::ReportValidationRequest* request,
    v1::ReportValidationResponse* response) {
  RpcScope rpc(metrics_, "ReportValidation");
  TraceSpan span(trace_, "validation_report", "master");
  span.Arg("version", static_cast<int64_t>(request->record().version()));
  span.Arg("epoch", request->record().epoch());
  auto state = registry_.ReportValidation(request->job_id(), request->record());
  if (!state.ok()) return rpc.Finish(ToGrpcStatus(state.status()));
  response->set_state(*state);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::SubscribeSnapshots(
    grpc::ServerContext* context, const v1::SubscribeSnapshotsRequest* request,
    grpc::ServerWriter<v1::SnapshotPart>* writer) {
  RpcScope rpc(metrics_, "SubscribeSnapshots", /*streaming=*/true);
  std::vector<std::string> job_ids(request->job_ids().begin(),
                                   request->job_ids().end());
  for (const std::string& job_id : job_ids) {
    auto job = registry_.FindJob(job_id);
    if (!job.ok()) return rpc.Finish(ToGrpcStatus(job.status()));
  }
  const std::string label =
      absl::StrCat(request->subscriber().empty() ? "unnamed"
                                                 : request->subscriber(),
                   " at ", context->peer());
  std::shared_ptr<SnapshotHub::Subscription> subscription =
      snapshots_.Subscribe(job_ids, label);
  // Tells the client it is subscribed: snapshots from now on reach it. The
  // key is common/master_client.h's kSubscribedMetadataKey.
  context->AddInitialMetadata("mpilearn-subscribed", "1");
  writer->SendInitialMetadata();
  while (!context->IsCancelled()) {
    std::optional<SnapshotHub::Delivery> delivery =
        subscription->Next(absl::Seconds(1));
    if (!delivery.has_value()) {
      if (subscription->closed()) {
        return rpc.Finish(
            ToGrpcStatus(absl::UnavailableError("the master is shutting down")));
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
  auto status = registry_.Status(request->job_id());
  if (!status.ok()) return rpc.Finish(ToGrpcStatus(status.status()));
  *response = std::move(status).value();
  snapshots_.FillCounters(*response);
  return rpc.Finish(grpc::Status::OK);
}

grpc::Status MasterServiceImpl::ListJobs(grpc::ServerContext*,
                                         const v1::ListJobsRequest*,
                                         v1::ListJobsResponse* response) {
  RpcScope rpc(metrics_, "ListJobs");
  for (v1::JobStatus& status : registry_.List()) {
    snapshots_.FillCounters(status);
    *response->add_jobs() = std::move(status);
  }
  return rpc.Finish(grpc::Status::OK);
}

}  // namespace mpilearn::server
