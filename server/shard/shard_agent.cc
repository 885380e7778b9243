#include "server/shard/shard_agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
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
