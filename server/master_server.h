// mpilearn-master's top-level object: the master (Master: the core, the
// study table and their threads; master.h) served over gRPC, with the
// authorizer that turns a call's token into a caller (auth.h), the metrics
// (MasterMetrics, served by a prometheus::Exposer on Options::metrics_listen
// at /metrics) and the trace recorder (Options::trace_file).
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

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/trace.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "server/auth.h"
#include "server/core/master_core.h"
#include "server/core/update/optimizer.h"
#include "server/master.h"
#include "server/master_metrics.h"
#include "server/master_service.h"
#include "server/shard/shard_agent.h"
#include "server/study_service.h"

namespace mpilearn::server {

// True when `listen` ("host:port") names a loopback host: 127.0.0.0/8,
// [::1] or localhost.
bool IsLoopbackListen(const std::string& listen);

class MasterServer {
 public:
  struct Options {
    // host:port to listen on; port 0 picks a free port (see port()).
    std::string listen = "127.0.0.1:7070";
    // When set, a Unix domain socket path served as well (same-machine
    // clients use the target "unix:PATH"); a stale socket file there is
    // removed first.
    std::string listen_unix;
    std::string state_dir = "mpilearn-state";
    absl::Duration group_timeout = absl::Seconds(60);
    // Where jobs' optimizers run; device already resolved ("cpu", "cuda:N").
    EngineOptions engine;
    // host:port for the Prometheus endpoint (/metrics); port 0 picks a free
    // port (see metrics_port()); empty serves no metrics.
    std::string metrics_listen;
    // Ended jobs whose series the metrics keep (MasterMetrics::Options).
    int metrics_ended_jobs = 20;
    // A file holding the metrics endpoint's token (auth.h LoadMetricsToken):
    // a scrape must send it as the password of HTTP Basic auth (any user
    // name), else 401. Empty: scrapes need nothing, and metrics_listen must
    // be loopback unless `insecure`.
    std::string metrics_token_file;
    // If set, a Chrome trace of the master's work is streamed to this file
    // (complete once Shutdown returns).
    std::string trace_file;
    // What clients may make the master hold (master_core.h: each limit's
    // flag and what it bounds).
    MasterLimits limits;
    // The largest request message gRPC takes (--max_message_mib); larger
    // ones are refused with RESOURCE_EXHAUSTED by the library itself.
    int max_message_bytes = 4 << 20;
    // Calls one client connection may have open at once
    // (--max_streams_per_connection; GRPC_ARG_MAX_CONCURRENT_STREAMS): more
    // wait in the client until one ends.
    int max_streams_per_connection = 64;
    // Shutdown first turns the gRPC health service (grpc.health.v1.Health,
    // served on every listening address) to NOT_SERVING, then keeps serving
    // this long (--drain_s) before it stops accepting calls.
    absl::Duration drain = absl::ZeroDuration();

    // Security (docs/security.md). With tls_cert and tls_key (PEM files)
    // the `listen` port speaks TLS only; with tls_client_ca as well it
    // requires and verifies a client certificate signed by that CA (mutual
    // TLS). The Unix socket (listen_unix) stays plaintext: its file
    // permissions guard it. Tokens are checked on both.
    std::string tls_cert;
    std::string tls_key;
    std::string tls_client_ca;
    // A tokens file (server/auth.h): every call must carry a token of a
    // role allowed to make it. Empty: no checks, everyone is an admin.
    std::string tokens_file;
    // Scheduling between jobs (docs/scheduling.md): --max_groups_per_owner,
    // --max_groups_per_study, --fair_share_half_life_s; each owner's share
    // and limit are taken from its line in tokens_file.
    SchedulingPolicy scheduling;
    // Without a tokens file the master refuses a `listen` address other
    // than loopback unless this is set; likewise a `metrics_listen` address
    // without a metrics_token_file.
    bool insecure = false;

    // Parameter shards (docs/sharding.md). As a lead: shards per job (0:
    // every live shard). As a shard: the lead's address (non-empty makes
    // this master a shard), where groups reach this shard (empty: the
    // --listen host with the bound port, unless it is a wildcard), and how
    // it reaches the lead (TLS, an admin token).
    int shards_per_job = 0;
    int min_shards = 0;
    std::string shard_of;
    std::string advertise;
    ClientSecurity lead_security;
  };

  // Errors say what to change: a trace file that cannot be written, a
  // --listen or --metrics_listen address that cannot be bound, TLS files
  // that cannot be read or do not match, a bad tokens file (with its line),
  // a non-loopback --listen without tokens or --insecure, a bad metrics
  // token file, a non-loopback --metrics_listen without a metrics token or
  // --insecure.
  static absl::StatusOr<std::unique_ptr<MasterServer>> BuildAndStart(
      const Options& options);

  ~MasterServer();

  // The port actually bound.
  int port() const { return port_; }
  // The metrics endpoint's port actually bound; 0 when metrics are off.
  int metrics_port() const { return metrics_port_; }

  // Turns the health service to NOT_SERVING and waits Options::drain, then
  // stops serving metrics, ends snapshot streams, stops accepting RPCs,
  // waits up to `grace` for running ones, then cancels the rest,
  // checkpoints every job changed since its last checkpoint
  // (JobRegistry::CheckpointAll) and closes the trace file. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

 private:
  MasterServer() = default;

  // The trace and the metrics are declared first: the registry and the
  // service record into them, so they outlive both. So is the authorizer,
  // which both services use.
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<TraceRecorder> trace_;
  std::shared_ptr<MasterMetrics> metrics_;
  // Declared before the services (streams hold its subscriptions, and the
  // Studies service its table), so it outlives them.
  std::unique_ptr<Master> master_;
  std::unique_ptr<MasterServiceImpl> service_;
  std::unique_ptr<StudyServiceImpl> study_service_;
  std::unique_ptr<grpc::Server> server_;
  // A shard's link to its lead; stopped first.
  std::unique_ptr<ShardAgent> shard_agent_;
  // Declared last: its scrapes read the core, so it stops first.
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  int metrics_port_ = 0;
  absl::Duration drain_;
  bool stopping_ = false;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_SERVER_H_
