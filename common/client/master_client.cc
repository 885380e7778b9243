#include "common/client/master_client.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/client/channel_args.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tensor_wire.h"
#include "glog/logging.h"

namespace mpilearn {
namespace {

// Reads a raw WeightsPart stream (header, then chunks) into `weights`,
// decoding the wire dtype the header names; returns the version. A stream
// that does not fit `weights` (another layout, bad bytes) is cancelled
// through `context` at once, so that the caller's Finish does not wait for
// the master to send the rest of it.
absl::StatusOr<uint64_t> ReadRawWeights(
    grpc::internal::ReaderInterface<grpc::ByteBuffer>& reader,
    grpc::ClientContext& context, absl::Span<const absl::Span<float>> weights) {
  grpc::ByteBuffer message;
  if (!reader.Read(&message)) {
    return absl::UnavailableError("weight stream ended before its header");
  }
  auto abandon = [&context](absl::Status status) {
    context.TryCancel();
    return status;
  };
  v1::TensorSetHeader header;
  absl::StatusOr<TensorPart> first =
      ReadTensorPart(message, &header, nullptr, "weight stream");
  if (!first.ok()) return abandon(absl::InternalError(first.status().message()));
  absl::StatusOr<TensorSetAssembler> assembler = TensorSetAssembler::Create(
      header, std::vector<absl::Span<float>>(weights.begin(), weights.end()));
  if (!assembler.ok()) return abandon(assembler.status());
  while (reader.Read(&message)) {
    absl::Status read =
        ReadTensorPart(message, nullptr, &*assembler, "weight stream").status();
    if (!read.ok()) return abandon(absl::InternalError(read.message()));
  }
  // The stream's final status is checked by the caller (Finish); an error
  // there explains a short stream better than "incomplete".
  absl::Status complete = assembler->Finish();
  if (!complete.ok()) return absl::UnavailableError(complete.message());
  return header.version();
}

bool IsReduced(v1::DType dtype) {
  return dtype == v1::DTYPE_BFLOAT16 || dtype == v1::DTYPE_FLOAT16;
}

// The wire dtype for a JobSpec.exchange setting: a reduced one as given,
// anything else fp32.
v1::DType WireDType(v1::DType setting) {
  return IsReduced(setting) ? setting : v1::DTYPE_FLOAT32;
}

// Adds "master at <address>" context to transport errors.
absl::Status AnnotateStatus(const std::string& address,
                            const grpc::Status& status) {
  absl::Status converted = FromGrpcStatus(status);
  if (converted.code() == absl::StatusCode::kUnavailable ||
      converted.code() == absl::StatusCode::kDeadlineExceeded) {
    return WithReason(absl::Status(converted.code(),
                                   absl::StrCat("master at ", address, ": ",
                                                converted.message())),
                      ReasonOf(converted));
  }
  return converted;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MasterClient>> MasterClient::Connect(
    const std::string& address, const Options& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  SetBulkTransferArgs(&args);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> created =
      CreateMasterChannel(address, options.security, args);
  if (!created.ok()) return created.status();
  std::shared_ptr<grpc::Channel> channel = *std::move(created);
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options.connect_timeout);
  if (!channel->WaitForConnected(deadline)) {
    const bool tls = !options.security.tls_ca.empty() &&
                     !absl::StartsWith(address, "unix:");
    return absl::UnavailableError(absl::StrCat(
        "cannot reach mpilearn-master at ", address, " within ",
        absl::FormatDuration(options.connect_timeout),
        "; is it running (mpilearn-master --listen ", address,
        ") and is the address right?",
        tls ? " With --tls_ca: does the master serve TLS, does its "
              "certificate name this host and is it signed by that CA (and "
              "with mutual TLS, is --tls_cert signed by its --tls_client_ca)?"
            : " If the master serves TLS, give --tls_ca (docs/security.md)."));
  }
  return std::unique_ptr<MasterClient>(new MasterClient(address, options, channel));
}

std::unique_ptr<MasterClient> MasterClient::ForChannel(
    std::shared_ptr<grpc::Channel> channel, const std::string& address,
    const Options& options) {
  return std::unique_ptr<MasterClient>(
      new MasterClient(address, options, std::move(channel)));
}

MasterClient::MasterClient(std::string address, Options options,
                           std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(options),
      channel_(channel),
      stub_(v1::Master::NewStub(channel)),
      push_method_("/mpilearn.v1.Master/PushGradient",
                   grpc::internal::RpcMethod::BIDI_STREAMING, channel),
      pull_method_("/mpilearn.v1.Master/PullWeights",
                   grpc::internal::RpcMethod::SERVER_STREAMING, channel),
      subscribe_method_("/mpilearn.v1.Master/SubscribeSnapshots",
                        grpc::internal::RpcMethod::SERVER_STREAMING, channel) {}

void MasterClient::UseWireFormat(const v1::ExchangeSpec& exchange) {
  absl::MutexLock lock(&push_mu_);
  wire_ = exchange;
  residual_.clear();
}

std::unique_ptr<grpc::ClientContext> MasterClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.rpc_timeout));
  return context;
}

absl::Status MasterClient::Annotate(const grpc::Status& status) const {
  return AnnotateStatus(address_, status);
}

absl::StatusOr<uint64_t> MasterClient::WeightsOutcome(
    absl::StatusOr<uint64_t> version, const grpc::Status& status) const {
  // Cancelled by ReadRawWeights: its local error says why.
  if (!version.ok() && status.error_code() == grpc::StatusCode::CANCELLED) {
    return version;
  }
  if (!status.ok()) return Annotate(status);
  return version;
}

void MasterClient::LogReconnecting(const absl::Status& status) const {
  LOG(WARNING) << status.message() << "; retrying for up to "
               << absl::FormatDuration(options_.reconnect_timeout);
}

absl::StatusOr<std::string> MasterClient::SubmitJob(const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  MPILEARN_ASSIGN_OR_RETURN(v1::SubmitJobResponse response,
                            Call(&Stub::SubmitJob, request));
  return response.job_id();
}

absl::StatusOr<v1::RegisterGroupResponse> MasterClient::RegisterGroup(
    const v1::RegisterGroupRequest& request) {
  return Call(&Stub::RegisterGroup, request);
}

absl::StatusOr<bool> MasterClient::InitWeights(
    const std::string& job_id, const std::string& group_id,
    const v1::TensorSetHeader& header,
    absl::Span<const absl::Span<const float>> values) {
  return Retrying([&]() -> absl::StatusOr<bool> {
    auto context = NewContext();
    v1::InitWeightsResponse response;
    auto writer = stub_->InitWeights(context.get(), &response);
    absl::Status sent = WriteTensorStream<v1::InitWeightsRequest>(
        *writer,
        [&](v1::InitWeightsRequest& request) {
          request.mutable_header()->set_job_id(job_id);
          request.mutable_header()->set_group_id(group_id);
          *request.mutable_header()->mutable_weights() = header;
        },
        values);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (!status.ok()) return Annotate(status);
    MPILEARN_RETURN_IF_ERROR(sent);
    return response.accepted();
  });
}

absl::StatusOr<uint64_t> MasterClient::PushGradient(
    const v1::PushGradientRequest::Header& header_in,
    absl::Span<const absl::Span<const float>> gradient,
    absl::Span<const absl::Span<float>> weights) {
  v1::PushGradientRequest::Header header = header_in;
  // Numbered and encoded under the lock (error feedback carries from one
  // push to the next); sent outside it.
  absl::ReleasableMutexLock lock(&push_mu_);
  const v1::DType dtype = WireDType(wire_.update_dtype());
  SetWireDType(header.mutable_gradient(), dtype);
  if (header.reply_dtype() == v1::DTYPE_UNSPECIFIED) {
    header.set_reply_dtype(WireDType(wire_.weights_dtype()));
  }
  if (header.sequence() == 0) header.set_sequence(++push_sequence_);
  // Error feedback carries rounding error between gradients (and gem's
  // deltas); easgd pushes weights, where it would make no sense.
  const bool feedback = IsReduced(dtype) &&
                        (!wire_.has_error_feedback() || wire_.error_feedback()) &&
                        header.kind() != v1::UPDATE_KIND_ELASTIC;
  std::vector<absl::Span<float>> residual;
  if (feedback) {
    bool fits = residual_.size() == gradient.size();
    for (size_t t = 0; fits && t < gradient.size(); ++t) {
      fits = residual_[t].size() == gradient[t].size();
    }
    if (!fits) {
      residual_.assign(gradient.size(), {});
      for (size_t t = 0; t < gradient.size(); ++t) {
        residual_[t].assign(gradient[t].size(), 0.0f);
      }
    }
    for (std::vector<float>& r : residual_) residual.push_back(absl::MakeSpan(r));
  }
  // Encoded once, so a retry resends the same bytes (and feedback is taken
  // once).
  std::vector<grpc::ByteBuffer> messages;
  {
    v1::PushGradientRequest first;
    *first.mutable_header() = header;
    messages.push_back(SerializeToByteBuffer(first));
  }
  MPILEARN_RETURN_IF_ERROR(ForEachChunkMessage(
      gradient, dtype, kDefaultChunkBytes, nullptr,
      [&](grpc::ByteBuffer& message, size_t) {
        messages.push_back(std::move(message));
        return absl::OkStatus();
      },
      residual));
  lock.Release();
  return Retrying([&]() -> absl::StatusOr<uint64_t> {
    auto context = NewContext();
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           push_method_,
                                                           context.get()));
    absl::Status sent;
    for (const grpc::ByteBuffer& message : messages) {
      if (!stream->Write(message)) {
        sent = absl::UnavailableError("master closed the stream");
        break;
      }
    }
    stream->WritesDone();
    absl::StatusOr<uint64_t> version =
        sent.ok() ? ReadRawWeights(*stream, *context, weights) : sent;
    return WeightsOutcome(std::move(version), stream->Finish());
  });
}

absl::StatusOr<uint64_t> MasterClient::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  v1::PullWeightsRequest request;
  request.set_job_id(job_id);
  request.set_group_id(group_id);
  request.set_dtype(WireDType(wire_.weights_dtype()));
  return Retrying([&]() -> absl::StatusOr<uint64_t> {
    auto context = NewContext();
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_.get(), pull_method_, context.get(), request));
    absl::StatusOr<uint64_t> version = ReadRawWeights(*reader, *context, weights);
    return WeightsOutcome(std::move(version), reader->Finish());
  });
}

absl::StatusOr<v1::NextDataUnitResponse> MasterClient::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  return Call(&Stub::NextDataUnit, request);
}

absl::StatusOr<v1::JobState> MasterClient::ReportEpoch(
    const v1::ReportEpochRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::ReportEpochResponse response,
                            Call(&Stub::ReportEpoch, request));
  return response.state();
}

absl::StatusOr<v1::JobState> MasterClient::Heartbeat(
    const std::string& job_id, const std::string& group_id) {
  v1::HeartbeatRequest request;
  request.set_job_id(job_id);
  request.set_group_id(group_id);
  MPILEARN_ASSIGN_OR_RETURN(v1::HeartbeatResponse response,
                            Call(&Stub::Heartbeat, request));
  return response.state();
}

absl::StatusOr<v1::JobState> MasterClient::Heartbeat(
    const v1::HeartbeatRequest& request, absl::Duration timeout) {
  MPILEARN_ASSIGN_OR_RETURN(v1::HeartbeatResponse response,
                            CallOnce(&Stub::Heartbeat, request, timeout));
  return response.state();
}

absl::StatusOr<v1::JobState> MasterClient::LeaveWithin(
    const v1::LeaveRequest& request, absl::Duration timeout) {
  MPILEARN_ASSIGN_OR_RETURN(v1::LeaveResponse response,
                            CallOnce(&Stub::Leave, request, timeout));
  return response.state();
}

absl::StatusOr<v1::JobState> MasterClient::Leave(const v1::LeaveRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::LeaveResponse response,
                            Call(&Stub::Leave, request));
  return response.state();
}

absl::StatusOr<v1::JobState> MasterClient::ReportValidation(
    const v1::ReportValidationRequest& request) {
  MPILEARN_ASSIGN_OR_RETURN(v1::ReportValidationResponse response,
                            Call(&Stub::ReportValidation, request));
  return response.state();
}

absl::StatusOr<std::unique_ptr<SnapshotStream>> MasterClient::SubscribeSnapshots(
    const v1::SubscribeSnapshotsRequest& request) {
  auto context = std::make_unique<grpc::ClientContext>();  // no deadline
  std::unique_ptr<grpc::ClientReaderInterface<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel_.get(), subscribe_method_, context.get(), request));
  std::unique_ptr<SnapshotStream> stream(
      new SnapshotStream(address_, std::move(context), std::move(reader)));
  // The master sends this metadata once subscribed; a refused call ends
  // without it.
  stream->reader_->WaitForInitialMetadata();
  const auto& metadata = stream->context_->GetServerInitialMetadata();
  if (metadata.find(kSubscribedMetadataKey) == metadata.end()) {
    absl::Status status = stream->Finish();
    if (status.ok()) {
      status = absl::UnavailableError(absl::StrCat(
          "master at ", address_, " ended the snapshot stream at once"));
    }
    return status;
  }
  return stream;
}

absl::StatusOr<v1::JobStatus> MasterClient::GetJobStatus(
    const std::string& job_id) {
  v1::GetJobStatusRequest request;
  request.set_job_id(job_id);
  return Call(&Stub::GetJobStatus, request);
}

absl::StatusOr<std::vector<v1::JobStatus>> MasterClient::ListJobs(
    const std::vector<v1::JobState>& states, uint32_t* left_out) {
  v1::ListJobsRequest request;
  for (const v1::JobState state : states) request.add_states(state);
  std::vector<v1::JobStatus> jobs;
  uint32_t skipped = 0;
  while (true) {
    MPILEARN_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                              ListJobsPage(request));
    for (v1::JobStatus& job : *response.mutable_jobs()) {
      jobs.push_back(std::move(job));
    }
    skipped += response.left_out();
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (left_out != nullptr) *left_out = skipped;
  return jobs;
}

absl::StatusOr<v1::ListJobsResponse> MasterClient::ListJobsPage(
    const v1::ListJobsRequest& request) {
  return Call(&Stub::ListJobs, request);
}

absl::StatusOr<v1::JobStatus> MasterClient::CancelJob(
    const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  return Call(&Stub::CancelJob, request);
}

absl::Status MasterClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return Call(&Stub::DeleteJob, request).status();
}

SnapshotStream::~SnapshotStream() {
  if (!finished_) {
    Cancel();
    (void)Finish();
  }
}

void SnapshotStream::Cancel() {
  cancelled_ = true;
  context_->TryCancel();
}

absl::Status SnapshotStream::Finish() {
  finished_ = true;
  grpc::ByteBuffer part;
  while (reader_->Read(&part)) {
  }
  grpc::Status status = reader_->Finish();
  if (cancelled_) return absl::OkStatus();
  if (status.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "master at ", address_, " ended the snapshot stream"));
  }
  return AnnotateStatus(address_, status);
}

absl::StatusOr<bool> SnapshotStream::Next(
    v1::SnapshotHeader* header, std::vector<std::vector<float>>* weights) {
  if (finished_) {
    if (cancelled_) return false;
    return absl::FailedPreconditionError("the snapshot stream has ended");
  }
  // An end of stream: false when we cancelled it, else the master's error.
  auto ended = [this]() -> absl::StatusOr<bool> {
    absl::Status status = Finish();
    if (!status.ok()) return status;
    return false;
  };
  grpc::ByteBuffer message;
  if (!reader_->Read(&message)) return ended();
  absl::StatusOr<TensorPart> first =
      ReadTensorPart(message, header, nullptr, "snapshot stream");
  if (!first.ok()) return absl::InternalError(first.status().message());
  MPILEARN_ASSIGN_OR_RETURN(std::vector<int64_t> counts,
                            TensorSetAssembler::ElementCounts(header->weights()));
  weights->resize(counts.size());
  std::vector<absl::Span<float>> dest;
  dest.reserve(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    (*weights)[i].resize(static_cast<size_t>(counts[i]));
    dest.push_back(absl::MakeSpan((*weights)[i]));
  }
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler assembler,
                            TensorSetAssembler::Create(header->weights(), dest));
  // The header gives the size, so the snapshot ends after its last byte.
  while (!assembler.complete()) {
    if (!reader_->Read(&message)) return ended();
    absl::Status read =
        ReadTensorPart(message, nullptr, &assembler, "snapshot stream").status();
    if (!read.ok()) return absl::InternalError(read.message());
  }
  return true;
}

}  // namespace mpilearn
