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
#include "server/master_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port for the gRPC service. Port 0 picks a free port (see "
          "--port_file). Use 0.0.0.0:PORT to serve other machines.");
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
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:7071",
          "host:port for the Prometheus metrics endpoint (path /metrics; "
          "docs/observability.md lists the metrics). The default serves only "
          "this machine; use 0.0.0.0:PORT to let a Prometheus on another "
          "machine scrape it. Port 0 picks a free port (see "
          "--metrics_port_file). Empty serves no metrics.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, write the metrics endpoint's bound port to this file once "
          "serving (for scripts that use --metrics_listen HOST:0).");
ABSL_FLAG(int, metrics_ended_jobs, 20,
          "Ended (completed or failed) jobs whose series the metrics keep, "
          "the most recently ended ones; queued and running jobs always have "
          "theirs. Bounds the series of a master that runs many jobs. >= 0.");
ABSL_FLAG(int64_t, max_model_mib, 4096,
          "Largest model a job may have, in MiB of fp32 weights (parameters "
          "and buffers): larger initial weights are refused with "
          "RESOURCE_EXHAUSTED before the master takes memory for them.");
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
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics_ended_jobs = absl::GetFlag(FLAGS_metrics_ended_jobs);
  options.trace_file = absl::GetFlag(FLAGS_trace);
  const int64_t max_model_mib = absl::GetFlag(FLAGS_max_model_mib);
  if (max_model_mib < 1 || max_model_mib > (int64_t{1} << 30)) {
    std::fprintf(stderr,
                 "mpilearn-master: --max_model_mib must be in [1, 2^30], got "
                 "%lld\n",
                 static_cast<long long>(max_model_mib));
    return 2;
  }
  options.max_model_bytes = static_cast<uint64_t>(max_model_mib) << 20;
  auto server = mpilearn::server::MasterServer::BuildAndStart(options);
  if (!server.ok()) {
    std::fprintf(stderr, "mpilearn-master: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  LOG(INFO) << "mpilearn-master serving on port " << (*server)->port()
            << " (state in " << options.state_dir << "; optimizers on "
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
