#include "common/master_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"

namespace mpilearn {
namespace {

std::vector<absl::Span<const char>> ByteViews(
    absl::Span<const absl::Span<const float>> values) {
  std::vector<absl::Span<const char>> bytes;
  bytes.reserve(values.size());
  for (const auto& v : values) bytes.push_back(AsBytes(v));
  return bytes;
}

// Sends header-then-chunks messages of type Request through `writer`.
template <typename Request, typename Writer, typename SetHeader>
absl::Status WriteTensorStream(Writer& writer, SetHeader set_header,
                               absl::Span<const absl::Span<const float>> values) {
  Request request;
  set_header(request);
  if (!writer.Write(request)) {
    return absl::UnavailableError("master closed the stream");
  }
  request.Clear();
  return ForEachChunk(ByteViews(values), kDefaultChunkBytes,
                      [&](v1::TensorChunk& chunk) -> absl::Status {
                        request.mutable_chunk()->Swap(&chunk);
                        if (!writer.Write(request)) {
                          return absl::UnavailableError(
                              "master closed the stream");
                        }
                        return absl::OkStatus();
                      });
}

// Reads a WeightsPart stream (header, then chunks) into `weights`, checking
// the layout; returns the version.
template <typename Reader>
absl::StatusOr<uint64_t> ReadWeightsStream(
    Reader& reader,
    absl::Span<const absl::Span<float>> weights) {
  v1::WeightsPart part;
  if (!reader.Read(&part)) {
    return absl::UnavailableError("weight stream ended before its header");
  }
  if (!part.has_header()) {
    return absl::InternalError("weight stream did not start with a header");
  }
  const v1::TensorSetHeader header = part.header();
  std::vector<absl::Span<char>> dest;
  dest.reserve(weights.size());
  for (const auto& w : weights) dest.push_back(AsWritableBytes(w));
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler assembler,
                            TensorSetAssembler::Create(header, dest));
  while (reader.Read(&part)) {
    if (!part.has_chunk()) {
      return absl::InternalError("weight stream: expected chunks after header");
    }
    MPILEARN_RETURN_IF_ERROR(assembler.Add(part.chunk()));
  }
  // The stream's final status is checked by the caller (Finish); an error
  // there explains a short stream better than "incomplete".
  absl::Status complete = assembler.Finish();
  if (!complete.ok()) return absl::UnavailableError(complete.message());
  return header.version();
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
  auto channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options.connect_timeout);
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach mpilearn-master at ", address, " within ",
        absl::FormatDuration(options.connect_timeout),
        "; is it running (mpilearn-master --listen ", address,
        ") and is the address right?"));
  }
  return std::unique_ptr<MasterClient>(
      new MasterClient(address, options, v1::Master::NewStub(channel)));
}

std::unique_ptr<MasterClient> MasterClient::ForChannel(
    std::shared_ptr<grpc::Channel> channel, const std::string& address,
    const Options& options) {
  return std::unique_ptr<MasterClient>(
      new MasterClient(address, options, v1::Master::NewStub(channel)));
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
    const v1::PushGradientRequest::Header& header,
    absl::Span<const absl::Span<const float>> gradient,
    absl::Span<const absl::Span<float>> weights) {
  return Retrying([&]() -> absl::StatusOr<uint64_t> {
    auto context = NewContext();
    auto stream = stub_->PushGradient(context.get());
    absl::Status sent = WriteTensorStream<v1::PushGradientRequest>(
        *stream,
        [&](v1::PushGradientRequest& request) {
          *request.mutable_header() = header;
        },
        gradient);
    stream->WritesDone();
    absl::StatusOr<uint64_t> version =
        sent.ok() ? ReadWeightsStream(*stream, weights) : sent;
    grpc::Status status = stream->Finish();
    if (!status.ok()) return Annotate(status);
    return version;
  });
}

absl::StatusOr<uint64_t> MasterClient::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  return Retrying([&]() -> absl::StatusOr<uint64_t> {
    auto context = NewContext();
    v1::PullWeightsRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    auto reader = stub_->PullWeights(context.get(), request);
    absl::StatusOr<uint64_t> version = ReadWeightsStream(*reader, weights);
    grpc::Status status = reader->Finish();
    if (!status.ok()) return Annotate(status);
    return version;
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
  auto reader = stub_->SubscribeSnapshots(context.get(), request);
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

absl::StatusOr<std::vector<v1::JobStatus>> MasterClient::ListJobs() {
  MPILEARN_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                            Call(&Stub::ListJobs, v1::ListJobsRequest()));
  return std::vector<v1::JobStatus>(response.jobs().begin(),
                                    response.jobs().end());
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
  v1::SnapshotPart part;
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
  v1::SnapshotPart part;
  if (!reader_->Read(&part)) return ended();
  if (!part.has_header()) {
    return absl::InternalError("snapshot stream: expected a header");
  }
  header->Swap(part.mutable_header());
  MPILEARN_ASSIGN_OR_RETURN(std::vector<size_t> sizes,
                            TensorSetAssembler::ByteSizes(header->weights()));
  weights->resize(sizes.size());
  std::vector<absl::Span<char>> dest;
  dest.reserve(sizes.size());
  size_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    (*weights)[i].resize(sizes[i] / sizeof(float));
    dest.push_back(AsWritableBytes(absl::MakeSpan((*weights)[i])));
    total += sizes[i];
  }
  MPILEARN_ASSIGN_OR_RETURN(TensorSetAssembler assembler,
                            TensorSetAssembler::Create(header->weights(), dest));
  // The header gives the size, so the snapshot ends after its last byte.
  size_t received = 0;
  while (received < total) {
    if (!reader_->Read(&part)) return ended();
    if (!part.has_chunk()) {
      return absl::InternalError("snapshot stream: expected chunks after the header");
    }
    received += part.chunk().data().size();
    MPILEARN_RETURN_IF_ERROR(assembler.Add(part.chunk()));
  }
  MPILEARN_RETURN_IF_ERROR(assembler.Finish());
  return true;
}

}  // namespace mpilearn
