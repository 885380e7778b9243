// mpilearn-master: the MPI Learn parameter-server daemon.
//
// main() only parses flags, starts the MasterServer (gRPC service, Prometheus
// metrics endpoint, optional Chrome trace) and waits for SIGTERM or SIGINT,
// then shuts down cleanly.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/usage_config.h"
#include "glog/logging.h"
#include "common/client/client_security.h"
#include "server/master_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port for the gRPC service. Port 0 picks a free port (see "
          "--port_file). Use 0.0.0.0:PORT to serve other machines (a non-"
          "loopback address needs --tokens_file or --insecure).");
ABSL_FLAG(std::string, listen_unix, "",
          "Also serve on this Unix domain socket (a path; workers on the same "
          "machine then use --master unix:PATH). Tensor transfers over a "
          "Unix socket skip the TCP stack: about 1.7x the bytes per CPU "
          "second of loopback TCP here. An existing socket file is replaced.");
ABSL_FLAG(std::string, state_dir, "mpilearn-state",
          "Directory for job specs, histories (JSON) and final weights.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once serving (for "
          "scripts that start the master on port 0).");
ABSL_FLAG(std::string, device, "auto",
          "Where jobs' optimizers run: auto (a GPU when one is present, else "
          "the CPU), cpu, cuda, or cuda:N.");
ABSL_FLAG(int, optimizer_threads, 1,
          "CPU threads that share each optimizer step (device cpu). Give the "
          "master more on a node of its own.");
ABSL_FLAG(double, group_timeout_s, 60.0,
          "Seconds without any call after which a worker group is declared "
          "lost and its job re-queued.");
ABSL_FLAG(double, drain_s, 0,
          "On SIGTERM or SIGINT, seconds to keep serving while the gRPC health "
          "service (grpc.health.v1.Health) already says NOT_SERVING, so load "
          "balancers and Kubernetes readiness probes stop sending work before "
          "the master stops (e.g. 5 under Kubernetes).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:7071",
          "host:port for the Prometheus metrics endpoint (path /metrics; "
          "docs/observability.md lists the metrics). The default serves only "
          "this machine; use 0.0.0.0:PORT to let a Prometheus on another "
          "machine scrape it (a non-loopback address needs "
          "--metrics_token_file or --insecure). Port 0 picks a free port "
          "(see --metrics_port_file). Empty serves no metrics.");
ABSL_FLAG(std::string, metrics_token_file, "",
          "A file holding one token (16 to 4096 printable ASCII characters, "
          "surrounding whitespace ignored; e.g. `openssl rand -hex 32`): "
          "every scrape of the metrics endpoint must send it as the password "
          "of HTTP Basic auth (any user name; Prometheus: basic_auth with "
          "password_file), else it gets 401. Needed for a non-loopback "
          "--metrics_listen (or --insecure). A bad file stops the start.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, write the metrics endpoint's bound port to this file once "
          "serving (for scripts that use --metrics_listen HOST:0).");
ABSL_FLAG(int, metrics_ended_jobs, 20,
          "Ended (completed or failed) jobs whose series the metrics keep, "
          "the most recently ended ones; queued and running jobs always have "
          "theirs. Bounds the series of a master that runs many jobs. >= 0.");
// The limits (MasterLimits in server/core/master_core.h says what each
// bounds). Each refusal is RESOURCE_EXHAUSTED and names its flag.
ABSL_FLAG(int64_t, max_model_mib, 512,
          "Largest model a job may have, in MiB of fp32 weights (parameters "
          "and buffers): larger initial weights, and specs whose built-in "
          "model needs more, are refused with RESOURCE_EXHAUSTED before the "
          "master takes memory for them. Also bounds each tensor. Above "
          "about 680, a job with Adam's state cannot be checkpointed "
          "(protobuf's 2 GiB limit on one checkpoint file).");
ABSL_FLAG(int, max_tensors_per_set, 65536,
          "Most tensors in one set of initial weights.");
ABSL_FLAG(int, max_queued_jobs, 1000,
          "Most jobs waiting for a group (QUEUED); SubmitJob refuses more. 0: "
          "no bound.");
ABSL_FLAG(int, max_string_bytes, 4096,
          "Longest string the master stores from a request (spec names and "
          "paths, host names, validation sources, metric names, subscriber "
          "labels); such strings must also hold no control characters. A "
          "group's error message is cut to this length instead.");
ABSL_FLAG(int, max_subscriptions, 256,
          "Most SubscribeSnapshots streams (validation pools) open at once; "
          "each holds a server thread while it lasts. 0: no bound.");
ABSL_FLAG(int, max_streams_per_connection, 64,
          "Most calls one client connection may have open at once (HTTP/2 "
          "concurrent streams); further calls wait in the client until one "
          "ends. A training rank uses 1-2, a validation pool 2.");
ABSL_FLAG(int, max_message_mib, 4,
          "Largest request message the master receives, in MiB (gRPC's "
          "receive limit; tensors travel in 1 MiB chunks). Larger ones are "
          "refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this master: with --tls_key, the "
          "--listen port speaks TLS only (clients give --tls_ca). "
          "docs/security.md shows how to make one with openssl.");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key (unencrypted) of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "Mutual TLS: require every client on the --listen port to present "
          "a certificate signed by this PEM CA (clients give --tls_cert and "
          "--tls_key). Needs --tls_cert and --tls_key.");
ABSL_FLAG(std::string, tokens_file, "",
          "Bearer tokens and their roles, one 'ROLE NAME TOKEN [KEY=VALUE...]' "
          "a line (roles admin, owner, worker, reader; options owners=, "
          "share=, max_groups=, max_priority=; # comments): every call must "
          "then carry a token whose role allows it, and owners change only "
          "their own jobs (docs/security.md). Clients "
          "give --token_file or $MPILEARN_TOKEN. Without it nothing is "
          "checked and --listen must be a loopback address (or --insecure). "
          "The --listen_unix socket is plaintext either way (its file "
          "permissions guard it); tokens are checked there too.");
ABSL_FLAG(int, max_groups_per_owner, 0,
          "Groups the jobs of one owner may hold at once (a token's "
          "max_groups= overrides it); 0: no bound (docs/scheduling.md).");
ABSL_FLAG(int, max_groups_per_study, 0,
          "Groups the trials of one MPI Opt study may hold at once; 0: no "
          "bound.");
ABSL_FLAG(double, fair_share_half_life_s, 3600,
          "Fair share weighs each owner's groups held now and its recent use, "
          "an average that forgets half of itself in this many seconds.");
ABSL_FLAG(bool, insecure, false,
          "Serve a non-loopback --listen address without --tokens_file "
          "(anyone who reaches the port may do anything) and a non-loopback "
          "--metrics_listen without --metrics_token_file (anyone may read "
          "the metrics). For trusted networks only.");
ABSL_FLAG(int, shards_per_job, 0,
          "As a lead: spread each job's weights over this many of the "
          "parameter shards that sync with this master (0: every live one; a "
          "job's spec may ask for fewer with max_shards). A master no shard "
          "syncs with keeps every job's weights itself (docs/sharding.md).");
ABSL_FLAG(int, min_shards, 0,
          "As a lead: place no job until this many parameter shards are live; "
          "groups wait (their registration is retried) meanwhile. For a lead "
          "started together with its shards.");
ABSL_FLAG(std::string, shard_of, "",
          "Serve as a parameter shard of the lead master at this host:port: "
          "hold the slices of jobs the lead places here and take the groups' "
          "pushes for them. Needs --advertise unless --listen names a "
          "reachable address, and --lead_token_file when the lead has tokens.");
ABSL_FLAG(std::string, advertise, "",
          "With --shard_of: the host:port where groups reach this shard "
          "(default: the --listen host with the bound port).");
ABSL_FLAG(std::string, lead_tls_ca, "",
          "With --shard_of: speak TLS to the lead, trusting this CA (PEM).");
ABSL_FLAG(std::string, lead_token_file, "",
          "With --shard_of: a file holding a token of the admin role in the "
          "lead's tokens file.");
ABSL_FLAG(std::string, trace, "",
          "If set, write a Chrome trace of the master's work to this file: "
          "receive, apply, send, pull, next_unit, snapshot_send, checkpoint "
          "and validation_report events. Open it in ui.perfetto.dev or "
          "chrome://tracing (it is complete once the master stopped; the "
          "workers' --trace files share its time axis).");

namespace {

// Writes `port` to `path` atomically (a temporary file, then a rename), so a
// script polling the file never reads half of it.
bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "mpilearn-master: cannot write '%s'\n", tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "mpilearn-master: cannot rename '%s' to '%s'\n",
                 tmp.c_str(), path.c_str());
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "MPI Learn master: holds jobs' weights and applies workers' gradients.\n"
      "\n"
      "  mpilearn-master --listen 127.0.0.1:7070 --state_dir /var/lib/mpilearn\n"
      "\n"
      "To serve other machines, give TLS and tokens (docs/security.md):\n"
      "  mpilearn-master --listen 0.0.0.0:7070 --tls_cert server.pem \\\n"
      "      --tls_key server.key --tokens_file tokens.txt ...\n"
      "\n"
      "Then submit a job (mpilearnctl submit SPEC.json) and start workers:\n"
      "  mpirun -np 2 mpilearn-worker --master 127.0.0.1:7070\n"
      "Prometheus metrics are served on --metrics_listen (default\n"
      "http://127.0.0.1:7071/metrics); --trace FILE writes a Chrome trace.\n"
      "SIGTERM or SIGINT stops the master cleanly.");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/master_main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "mpilearn-master: unexpected argument '%s'; see --help\n",
                 positional[1]);
    return 2;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals in every thread; main waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!(absl::GetFlag(FLAGS_group_timeout_s) > 0)) {
    std::fprintf(stderr, "mpilearn-master: --group_timeout_s must be > 0\n");
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_drain_s) >= 0 && absl::GetFlag(FLAGS_drain_s) <= 3600)) {
    std::fprintf(stderr, "mpilearn-master: --drain_s must be in [0, 3600]\n");
    return 2;
  }
  const absl::StatusOr<std::string> device =
      mpilearn::server::ResolveOptimizerDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "mpilearn-master: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_metrics_ended_jobs) < 0) {
    std::fprintf(stderr, "mpilearn-master: --metrics_ended_jobs must be >= 0\n");
    return 2;
  }
  const int threads = absl::GetFlag(FLAGS_optimizer_threads);
  if (threads < 1 || threads > 256) {
    std::fprintf(stderr,
                 "mpilearn-master: --optimizer_threads must be in [1, 256]\n");
    return 2;
  }
  mpilearn::server::MasterServer::Options options;
  options.engine.device = *device;
  options.engine.threads = threads;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.listen_unix = absl::GetFlag(FLAGS_listen_unix);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.group_timeout = absl::Seconds(absl::GetFlag(FLAGS_group_timeout_s));
  options.drain = absl::Seconds(absl::GetFlag(FLAGS_drain_s));
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics_ended_jobs = absl::GetFlag(FLAGS_metrics_ended_jobs);
  options.metrics_token_file = absl::GetFlag(FLAGS_metrics_token_file);
  options.trace_file = absl::GetFlag(FLAGS_trace);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.scheduling.max_groups_per_owner = absl::GetFlag(FLAGS_max_groups_per_owner);
  options.scheduling.max_groups_per_study = absl::GetFlag(FLAGS_max_groups_per_study);
  options.scheduling.half_life = absl::Seconds(absl::GetFlag(FLAGS_fair_share_half_life_s));
  if (options.scheduling.max_groups_per_owner < 0 ||
      options.scheduling.max_groups_per_study < 0 ||
      !(absl::GetFlag(FLAGS_fair_share_half_life_s) >= 1) ||
      !(absl::GetFlag(FLAGS_fair_share_half_life_s) <= 1e8)) {
    std::fprintf(stderr,
                 "mpilearn-master: want --max_groups_per_owner >= 0, "
                 "--max_groups_per_study >= 0 and --fair_share_half_life_s from 1 to 1e8\n");
    return 2;
  }
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.shards_per_job = absl::GetFlag(FLAGS_shards_per_job);
  options.min_shards = absl::GetFlag(FLAGS_min_shards);
  if (options.min_shards < 0 || options.min_shards > 64) {
    std::fprintf(stderr, "mpilearn-master: --min_shards must be in [0, 64]\n");
    return 2;
  }
  options.shard_of = absl::GetFlag(FLAGS_shard_of);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.lead_security.tls_ca = absl::GetFlag(FLAGS_lead_tls_ca);
  if (options.shards_per_job < 0 || options.shards_per_job > 64) {
    std::fprintf(stderr, "mpilearn-master: --shards_per_job must be in [0, 64]\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_lead_token_file).empty()) {
    absl::StatusOr<std::string> token =
        mpilearn::ReadTokenFile(absl::GetFlag(FLAGS_lead_token_file));
    if (!token.ok()) {
      std::fprintf(stderr, "mpilearn-master: --lead_token_file: %s\n",
                   std::string(token.status().message()).c_str());
      return 2;
    }
    options.lead_security.token = *token;
  }
  const int64_t max_model_mib = absl::GetFlag(FLAGS_max_model_mib);
  if (max_model_mib < 1 || max_model_mib > (int64_t{1} << 30)) {
    std::fprintf(stderr,
                 "mpilearn-master: --max_model_mib must be in [1, 2^30], got "
                 "%lld\n",
                 static_cast<long long>(max_model_mib));
    return 2;
  }
  options.limits.max_model_bytes = static_cast<uint64_t>(max_model_mib) << 20;
  const int max_tensors = absl::GetFlag(FLAGS_max_tensors_per_set);
  const int max_queued = absl::GetFlag(FLAGS_max_queued_jobs);
  const int max_string = absl::GetFlag(FLAGS_max_string_bytes);
  const int max_message_mib = absl::GetFlag(FLAGS_max_message_mib);
  if (max_tensors < 1 || max_queued < 0 || max_string < 64 ||
      max_message_mib < 1 || max_message_mib > 2047) {
    std::fprintf(stderr,
                 "mpilearn-master: --max_tensors_per_set must be >= 1, "
                 "--max_queued_jobs >= 0, --max_string_bytes >= 64 and "
                 "--max_message_mib in [1, 2047]\n");
    return 2;
  }
  options.limits.max_tensors_per_set = max_tensors;
  const int max_subscriptions = absl::GetFlag(FLAGS_max_subscriptions);
  options.limits.max_subscriptions = max_subscriptions > 0 ? max_subscriptions : 0;
  options.limits.max_queued_jobs = max_queued;
  options.limits.max_string_bytes = static_cast<size_t>(max_string);
  options.max_message_bytes = max_message_mib << 20;
  const int max_streams = absl::GetFlag(FLAGS_max_streams_per_connection);
  if (max_streams < 2 || max_streams > 100000) {
    std::fprintf(stderr,
                 "mpilearn-master: --max_streams_per_connection must be in "
                 "[2, 100000], got %d\n",
                 max_streams);
    return 2;
  }
  options.max_streams_per_connection = max_streams;
  auto server = mpilearn::server::MasterServer::BuildAndStart(options);
  if (!server.ok()) {
    std::fprintf(stderr, "mpilearn-master: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  LOG(INFO) << "mpilearn-master serving on port " << (*server)->port()
            << (options.tls_cert.empty() ? " (plaintext"
                : options.tls_client_ca.empty() ? " (TLS"
                                                : " (mutual TLS")
            << (options.tokens_file.empty() ? ", no tokens;" : ", tokens;")
            << " state in " << options.state_dir << "; optimizers on "
            << options.engine.device
            << (options.engine.device == "cpu"
                    ? absl::StrCat(", ", threads, " thread(s)")
                    : std::string())
            << ")";
  if (!options.listen_unix.empty()) {
    LOG(INFO) << "also serving on unix:" << options.listen_unix;
  }
  if ((*server)->metrics_port() != 0) {
    // The host as given, the port as bound.
    const std::string& listen = options.metrics_listen;
    const size_t colon = listen.rfind(':');
    LOG(INFO) << "metrics at http://"
              << (colon == std::string::npos ? listen : listen.substr(0, colon))
              << ":" << (*server)->metrics_port() << "/metrics";
  } else {
    LOG(INFO) << "metrics off (--metrics_listen is empty)";
  }
  if (!options.trace_file.empty()) {
    LOG(INFO) << "tracing to " << options.trace_file;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  const std::string metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  if ((!port_file.empty() && !WritePortFile(port_file, (*server)->port())) ||
      (!metrics_port_file.empty() && (*server)->metrics_port() != 0 &&
       !WritePortFile(metrics_port_file, (*server)->metrics_port()))) {
    (*server)->Shutdown();
    return 1;
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LOG(INFO) << "received " << (signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
            << ", shutting down";
  (*server)->Shutdown();
  LOG(INFO) << "mpilearn-master stopped";
  return 0;
}
