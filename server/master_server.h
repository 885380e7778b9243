// mpilearn-master's top-level object: owns the job registry, the snapshot
// hub (validation pools' feed), the gRPC service and server, and the thread
// that declares silent groups lost and writes time-based checkpoints
// (JobRegistry::Tick).
//
//   auto server = MasterServer::BuildAndStart(options);  // listening now
//   ...                                                  // until a signal
//   (*server)->Shutdown();                               // drains RPCs
//
// Threading: BuildAndStart and Shutdown are called from one thread; RPCs run
// on gRPC's threads.
#ifndef MPILEARN_SERVER_MASTER_SERVER_H_
#define MPILEARN_SERVER_MASTER_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/job_registry.h"
#include "server/master_service.h"
#include "server/optimizer.h"
#include "server/snapshot_hub.h"

namespace mpilearn::server {

class MasterServer {
 public:
  struct Options {
    // host:port to listen on; port 0 picks a free port (see port()).
    std::string listen = "127.0.0.1:7070";
    std::string state_dir = "mpilearn-state";
    absl::Duration group_timeout = absl::Seconds(60);
    // Where jobs' optimizers run; device already resolved ("cpu", "cuda:N").
    EngineOptions engine;
  };

  static absl::StatusOr<std::unique_ptr<MasterServer>> BuildAndStart(
      const Options& options);

  ~MasterServer();

  // The port actually bound.
  int port() const { return port_; }

  // Ends snapshot streams, stops accepting RPCs, waits up to `grace` for
  // running ones, then cancels the rest, and checkpoints every job changed
  // since its last checkpoint (JobRegistry::CheckpointAll). Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

 private:
  MasterServer() = default;

  // Declared before the registry (its sink) and the service (streams hold
  // subscriptions), so it outlives both.
  std::unique_ptr<SnapshotHub> snapshots_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<MasterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stopping_;
  std::thread reaper_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_SERVER_H_
