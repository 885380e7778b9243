#include "server/shard/shard_agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"

namespace mpilearn::server {

absl::StatusOr<std::unique_ptr<ShardAgent>> ShardAgent::Start(Options options,
                                                              MasterCore& core) {
  if (options.lead.empty()) return absl::InvalidArgumentError("--shard_of: the lead's address is empty");
  if (options.advertise.empty()) {
    return absl::InvalidArgumentError(
        "--advertise: a shard needs the host:port where groups reach it");
  }
  MPILEARN_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      CreateMasterChannel(options.lead, options.security, grpc::ChannelArguments()));
  auto agent = std::unique_ptr<ShardAgent>(new ShardAgent(std::move(options), core));
  agent->stub_ = v1::Master::NewStub(std::move(channel));
  agent->thread_ = std::thread([raw = agent.get()] { raw->Run(); });
  return agent;
}

ShardAgent::~ShardAgent() { Stop(); }

void ShardAgent::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::Status ShardAgent::SendSlice(const v1::SliceWanted& wanted) {
  MasterCore::SliceForLead slice = core_.SliceFor(wanted);
  slice.header.set_address(options_.advertise);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ReportSliceResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ReportSliceRequest>> writer =
      stub_->ReportSlice(&context, &response);
  std::vector<absl::Span<const float>> values;
  if (slice.weights != nullptr) {
    for (const std::vector<float>& tensor : slice.weights->values) values.emplace_back(tensor);
  }
  const absl::Status sent = WriteTensorStream<v1::ReportSliceRequest>(
      *writer, [&](v1::ReportSliceRequest& request) { *request.mutable_header() = slice.header; },
      values);
  writer->WritesDone();
  // A closed stream: Finish says why.
  MPILEARN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return sent;
}

void ShardAgent::Run() {
  LOG(INFO) << "shard: syncing with the lead at " << options_.lead << "; groups reach this shard at "
            << options_.advertise;
  std::string last_error;
  while (!stop_.HasBeenNotified()) {
    v1::ShardSyncRequest request;
    request.set_address(options_.advertise);
    request.set_wait_seconds(absl::ToDoubleSeconds(options_.wait));
    for (v1::ShardSliceStatus& slice : core_.SliceReports()) {
      *request.add_slices() = std::move(slice);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(options_.wait + absl::Seconds(10)));
    v1::ShardSyncResponse response;
    const grpc::Status status = stub_->ShardSync(&context, request, &response);
    absl::Status outcome = FromGrpcStatus(status);
    if (outcome.ok()) outcome = core_.ServeSliceOrders(response);
    // Slices the lead wants for a whole-model view; a failure is the lead's
    // to report (its gather names this shard), and logged here.
    for (const v1::SliceWanted& wanted : response.send()) {
      const absl::Status sent = SendSlice(wanted);
      if (!sent.ok()) {
        LOG(WARNING) << "shard: sending the slice of job " << wanted.job_id()
                     << " to the lead: " << sent;
      }
    }
    if (!outcome.ok()) {
      const std::string error = std::string(outcome.message());
      if (error != last_error) {
        LOG(WARNING) << "shard: sync with the lead at " << options_.lead << ": " << outcome
                     << "; retrying every " << absl::FormatDuration(options_.retry);
      }
      last_error = error;
      stop_.WaitForNotificationWithTimeout(options_.retry);
      continue;
    }
    if (!last_error.empty()) LOG(INFO) << "shard: in sync with the lead at " << options_.lead;
    last_error.clear();
  }
}

}  // namespace mpilearn::server
