// What makes an mpilearn-master a parameter shard of a lead
// (mpilearn-master --shard_of LEAD; docs/sharding.md): a thread that keeps
// syncing with the lead (ShardSync, a long poll of about a second) and
// carries out its orders on this master's core: a slice created for each
// job the lead places here, a slice stopped when the lead's job ends, a
// slice's weights sent when the lead wants a whole-model view.
// Groups then register, push and pull here directly.
//
//   ShardAgent::Options options;
//   options.lead = "10.0.0.1:7070";
//   options.advertise = "10.0.0.2:7071";
//   MPILEARN_ASSIGN_OR_RETURN(auto agent, ShardAgent::Start(options, core));
//
// The lead need not be up when the shard starts, and may restart: the
// agent retries every Options::retry, logging a change of state once, and
// the lead rebuilds its placements from the slices reported.
//
// Threading: Start's thread is the only one calling the lead; Stop (also
// the destructor) joins it.
#ifndef MPILEARN_SERVER_SHARD_SHARD_AGENT_H_
#define MPILEARN_SERVER_SHARD_SHARD_AGENT_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/client/client_security.h"
#include "proto/mpilearn.grpc.pb.h"
#include "server/core/master_core.h"

namespace mpilearn::server {

class ShardAgent {
 public:
  struct Options {
    // The lead's address (host:port).
    std::string lead;
    // Where groups reach this shard (host:port).
    std::string advertise;
    // How this shard reaches the lead: TLS and a token of the admin role.
    ClientSecurity security;
    // The long poll's bound, and the pause after a failed sync.
    absl::Duration wait = absl::Seconds(1);
    absl::Duration retry = absl::Seconds(1);
  };

  // INVALID_ARGUMENT for an empty lead or advertised address, or security
  // files that cannot be read.
  static absl::StatusOr<std::unique_ptr<ShardAgent>> Start(Options options, MasterCore& core);

  ~ShardAgent();
  ShardAgent(const ShardAgent&) = delete;
  ShardAgent& operator=(const ShardAgent&) = delete;

  void Stop();

 private:
  ShardAgent(Options options, MasterCore& core) : options_(std::move(options)), core_(core) {}
  void Run();
  // Sends this shard's slice of a job the lead wants (ReportSlice).
  absl::Status SendSlice(const v1::SliceWanted& wanted);

  const Options options_;
  MasterCore& core_;
  std::unique_ptr<v1::Master::Stub> stub_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_SHARD_SHARD_AGENT_H_
