#include "server/master_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::server {

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::BuildAndStart(
    const Options& options) {
  auto server = std::unique_ptr<MasterServer>(new MasterServer());
  server->snapshots_ = std::make_unique<SnapshotHub>();
  JobRegistry::Options registry_options;
  registry_options.snapshot_sink = server->snapshots_.get();
  registry_options.state_dir = options.state_dir;
  registry_options.group_timeout = options.group_timeout;
  registry_options.engine = options.engine;
  MPILEARN_ASSIGN_OR_RETURN(server->registry_,
                            JobRegistry::Create(registry_options));
  server->service_ = std::make_unique<MasterServiceImpl>(*server->registry_,
                                                         *server->snapshots_);

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options.listen,
        "'; is the port in use or the address not local? Use --listen "
        "HOST:PORT (port 0 picks a free one)"));
  }

  MasterServer* self = server.get();
  server->reaper_ = std::thread([self] {
    const absl::Duration period =
        std::min(absl::Seconds(1), self->registry_->group_timeout() / 4);
    while (!self->stopping_.WaitForNotificationWithTimeout(period)) {
      self->registry_->Tick();  // lost groups, time-based checkpoints
    }
  });
  return server;
}

void MasterServer::Shutdown(absl::Duration grace) {
  if (stopping_.HasBeenNotified()) return;
  stopping_.Notify();
  // Snapshot streams never end on their own; closing the hub ends them now
  // rather than at the end of the grace period.
  if (snapshots_ != nullptr) snapshots_->Close();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoSeconds(grace));
  }
  if (reaper_.joinable()) reaper_.join();
  // No call runs any more: the checkpoints hold everything the jobs did.
  if (registry_ != nullptr) registry_->CheckpointAll();
}

MasterServer::~MasterServer() { Shutdown(); }

}  // namespace mpilearn::server
