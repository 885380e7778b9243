// mpilearn-worker: one rank of a training group, started by mpirun.
//
//   mpirun -np 2 mpilearn-worker --master HOST:PORT [--job SPEC.json | --job_id ID]
//   mpirun -np 2 mpilearn-worker --master HOST:PORT --serve [--exit_when_idle_s S]
//   mpirun -np 2 mpilearn-worker --master HOST:PORT --role validate [--jobs ID,ID]
//   ... [--progress auto|plain|off] [--trace FILE]
//
// This file parses and checks the flags; GroupSession (session.h) runs the
// group: rank 0 (the leader) obtains the job from the master and broadcasts
// it; every rank loads its data, builds the model and runs the Trainer. With
// --serve the group does that for queued job after queued job. With
// --role validate the ranks form a validation pool (validation_pool.h)
// instead. The leader prints a progress line (--progress); with --trace every
// rank records spans in memory and rank 0 writes them all to one Chrome trace
// file when the group ends.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/client/client_security_flags.h"
#include "glog/logging.h"
#include "worker/progress.h"
#include "worker/session.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master (required).");
ABSL_FLAG(std::string, job, "",
          "Job spec JSON file to submit and train. Without --job or --job_id "
          "the group takes the master's oldest queued job.");
ABSL_FLAG(std::string, job_id, "", "Existing job to serve.");
ABSL_FLAG(bool, serve, false,
          "Serve the master's queue: train its oldest queued job, then the "
          "next, without restarting mpirun (MPI Opt trials are queued jobs "
          "too). While no job is queued the group asks again every "
          "--serve_poll_s. A job that fails (bad spec, data error) is left "
          "with its error and the group goes on. Ends with exit code 0 after "
          "--exit_when_idle_s without a queued job, or when its ranks get "
          "SIGTERM/SIGINT: after the current job (a second signal ends them "
          "at once; mpirun itself, signalled, ends its ranks at once). With "
          "--summary_json the file is rewritten after every job that "
          "trained, so it holds the last one's; --trace writes one file "
          "when the group ends. Not with --job, --job_id or --local.");
ABSL_FLAG(double, serve_poll_s, 1,
          "--serve: seconds between asking the master for a queued job while "
          "none is queued. Must be > 0.");
ABSL_FLAG(int, threads, 0,
          "Compute threads per rank; 0 divides this node's cores among its "
          "ranks.");
ABSL_FLAG(std::string, device, "auto",
          "Where each rank trains: auto (a GPU when this worker's LibTorch "
          "has CUDA and the node a GPU, else the CPU), cpu, cuda (GPU = "
          "node-local rank mod the node's GPUs), or cuda:N.");
ABSL_FLAG(double, connect_timeout_s, 10, "Seconds to wait for the master.");
ABSL_FLAG(bool, local, false,
          "Local baseline mode: one process, no mpirun, no master: the "
          "master's optimizer runs in this process (needs --job). The "
          "reference point for scaling studies.");
ABSL_FLAG(std::string, local_state_dir, "mpilearn-local-state",
          "--local: where the job's history and final weights are written.");
ABSL_FLAG(int, optimizer_threads, 1,
          "--local: CPU threads of the in-process optimizer.");
ABSL_FLAG(std::string, summary_json, "",
          "Write this group's figures (samples/s, time shares, accuracy) as "
          "one JSON object to this file when done (leader only); --serve: "
          "after every job that trained, so it holds the last one's.");
ABSL_FLAG(int, fail_unit_reads, 0,
          "Test aid: the first N reads of streamed training units fail as a "
          "bad file would (fault injection for the unit retry).");
ABSL_FLAG(int, slowdown_ms_per_batch, 0,
          "Testing aid: sleep this long after every batch (a slow group).");
ABSL_FLAG(double, rpc_timeout_s, 120, "Deadline of each call to the master.");
ABSL_FLAG(double, reconnect_timeout_s, 300,
          "How long calls keep retrying while the master is unreachable "
          "(restarting); the group then registers again and continues from "
          "the master's last checkpoint.");
ABSL_FLAG(double, heartbeat_s, 2,
          "Training: the leader calls the master's Heartbeat every this many "
          "seconds while its group is registered to a job (also while it "
          "loads data), and promises that period at registration, so the "
          "master declares a dead group lost after 3 missed heartbeats "
          "instead of after its --group_timeout_s (60 s by default). 0: no "
          "heartbeat. Else at least 0.1 and at most a third of the master's "
          "--group_timeout_s; a master that refuses the period is told "
          "none (with a warning). Independently of it, a leader terminated "
          "by SIGTERM/SIGINT while training one job (mpirun does that to the "
          "other ranks when one dies) leaves its group at once, so the "
          "master re-queues the group's data units, and exits with code 1; "
          "--serve keeps its own stop-after-the-job handling.");
ABSL_FLAG(std::string, role, "train",
          "train: a training group; validate: a validation pool, validating "
          "the weight snapshots the master publishes (the job spec's "
          "`snapshots`) until SIGTERM/SIGINT.");
ABSL_FLAG(std::string, jobs, "",
          "--role validate: comma-separated job ids to validate; empty "
          "validates every job, including later ones.");
ABSL_FLAG(double, exit_when_idle_s, 0,
          "--role validate: exit after this many seconds without a snapshot; "
          "--serve: exit (code 0) after this many seconds without a queued "
          "job (0: never).");
ABSL_FLAG(std::string, pool_label, "",
          "--role validate: the pool's name in validation records (\"pool "
          "LABEL\"); default HOST:PID of the leader.");
ABSL_FLAG(std::string, progress, "auto",
          "The group leader's progress line on stdout: current epoch, percent "
          "of it done, job-wide samples/s (all groups, last ~15 s), training "
          "loss and ETA, e.g. `progress: epoch 2/5  43.1%  samples/s=9650  "
          "loss=0.4123  eta=0m21s`. auto: a live line rewritten in place "
          "(at most every 0.5 s) when stdout is a terminal, else plain lines; "
          "plain: a plain line every --progress_interval_s; off: none.");
ABSL_FLAG(double, progress_interval_s, 30,
          "Seconds between plain progress lines (--progress=plain, or auto "
          "when stdout is not a terminal); the first comes after one "
          "interval. Must be > 0.");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome trace of this group (or validation pool) to FILE "
          "when the worker exits: every rank's spans (data_load, "
          "forward_backward, push, pull, next_unit, allreduce, broadcast, "
          "wait, validation, test, ...) in one file, each rank a process "
          "(pid 1000 x group number + rank; pool ranks 1000000 + rank). Open "
          "it in ui.perfetto.dev or chrome://tracing. Ranks keep events in "
          "memory (at most 256 MiB each) and rank 0 writes the file; its "
          "directory must exist and be writable. Off by default (no cost).");

namespace mpilearn::worker {
namespace {

// The rank mpirun gave this process, from its environment (before MPI is
// initialized); -1 when not known.
int LaunchRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    int rank = -1;
    const char* value = std::getenv(name);
    if (value != nullptr && absl::SimpleAtoi(value, &rank)) return rank;
  }
  return -1;
}

// --trace FILE: its directory must exist and be writable, so that a long
// run does not end without its trace.
absl::Status CheckTracePath(const std::string& path) {
  struct stat info;
  if (path.back() == '/' || (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace '", path, "' is a directory; give a file name"));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace '", path, "': the directory '", dir, "' does not exist"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace '", path, "': the directory '", dir, "' is not writable"));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "worker/worker_main.cc") ||
           absl::EndsWith(path, mpilearn::kClientSecurityFlagsSource);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "MPI Learn worker: one rank of a training group. Start it with mpirun:\n"
      "\n"
      "  mpirun -np 2 mpilearn-worker --master 127.0.0.1:7070 --job spec.json\n"
      "  mpirun -np 4 mpilearn-worker --master HOST:7070   # next queued job\n"
      "  mpirun -np 4 mpilearn-worker --master HOST:7070 --serve   # every one\n"
      "  mpilearn-worker --local --job spec.json   # one process, no master\n"
      "  mpirun -np 2 mpilearn-worker --master HOST:7070 --role validate\n"
      "\n"
      "A master with TLS and tokens (docs/security.md): --tls_ca FILE (and\n"
      "--tls_cert/--tls_key for mutual TLS), --token_file FILE or\n"
      "$MPILEARN_TOKEN (a worker token; every rank reads it).\n"
      "\n"
      "The job spec format is in docs/protocol.md; examples in docs/examples/.");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  const bool local = absl::GetFlag(FLAGS_local);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "train" && role != "validate") {
    std::fprintf(stderr,
                 "mpilearn-worker: --role must be 'train' or 'validate', got '%s'\n",
                 role.c_str());
    return 2;
  }
  if (role == "validate" && (local || !absl::GetFlag(FLAGS_job).empty() ||
                             !absl::GetFlag(FLAGS_job_id).empty())) {
    std::fprintf(stderr,
                 "mpilearn-worker: --role validate takes --jobs ID,ID (or none "
                 "for every job), not --local, --job or --job_id\n");
    return 2;
  }
  const std::optional<ProgressMode> progress_mode =
      ParseProgressMode(absl::GetFlag(FLAGS_progress));
  if (!progress_mode.has_value()) {
    std::fprintf(stderr,
                 "mpilearn-worker: --progress must be one of auto, plain, off; "
                 "got '%s'\n",
                 absl::GetFlag(FLAGS_progress).c_str());
    return 2;
  }
  const double progress_interval_s = absl::GetFlag(FLAGS_progress_interval_s);
  if (!(progress_interval_s > 0) || !std::isfinite(progress_interval_s)) {
    std::fprintf(stderr,
                 "mpilearn-worker: --progress_interval_s must be a number of "
                 "seconds > 0, got %g\n",
                 progress_interval_s);
    return 2;
  }
  // Rank 0 writes the trace; checked there (or when not under mpirun).
  const std::string trace_path = absl::GetFlag(FLAGS_trace);
  if (!trace_path.empty() && LaunchRank() <= 0) {
    absl::Status usable = CheckTracePath(trace_path);
    if (!usable.ok()) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(usable.message()).c_str());
      return 2;
    }
  }
  const bool serve = absl::GetFlag(FLAGS_serve);
  if (serve && (role != "train" || local || !absl::GetFlag(FLAGS_job).empty() ||
                !absl::GetFlag(FLAGS_job_id).empty())) {
    std::fprintf(stderr,
                 "mpilearn-worker: --serve trains the master's queued jobs; it "
                 "takes no --job, --job_id, --local or --role validate\n");
    return 2;
  }
  const double serve_poll_s = absl::GetFlag(FLAGS_serve_poll_s);
  if (!(serve_poll_s > 0) || !std::isfinite(serve_poll_s)) {
    std::fprintf(stderr,
                 "mpilearn-worker: --serve_poll_s must be a number of seconds "
                 "> 0, got %g\n",
                 serve_poll_s);
    return 2;
  }
  const double heartbeat_s = absl::GetFlag(FLAGS_heartbeat_s);
  if (!std::isfinite(heartbeat_s) || (heartbeat_s != 0 && heartbeat_s < 0.1)) {
    std::fprintf(stderr,
                 "mpilearn-worker: --heartbeat_s must be 0 (no heartbeat) or a "
                 "number of seconds >= 0.1, got %g\n",
                 heartbeat_s);
    return 2;
  }
  if (local && absl::GetFlag(FLAGS_job).empty()) {
    std::fprintf(stderr, "mpilearn-worker: --local needs --job SPEC.json\n");
    return 2;
  }
  if (!local && absl::GetFlag(FLAGS_master).empty()) {
    std::fprintf(stderr,
                 "mpilearn-worker: --master HOST:PORT is required (or --local "
                 "--job SPEC.json for the single-process baseline); see --help\n");
    return 2;
  }

  GroupSession::Options options;
  options.role = role == "validate" ? GroupSession::Role::kValidate
                                    : GroupSession::Role::kTrain;
  options.local = local;
  options.local_state_dir = absl::GetFlag(FLAGS_local_state_dir);
  options.optimizer_threads = absl::GetFlag(FLAGS_optimizer_threads);
  options.master = absl::GetFlag(FLAGS_master);
  options.connection.connect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  options.connection.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  options.connection.reconnect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_reconnect_timeout_s));
  if (!local) {
    absl::StatusOr<mpilearn::ClientSecurity> security =
        mpilearn::ClientSecurityFromFlags();
    if (!security.ok()) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(security.status().message()).c_str());
      return 2;
    }
    options.connection.security = *std::move(security);
  }
  options.job_spec_path = absl::GetFlag(FLAGS_job);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.serve = serve;
  options.serve_poll = absl::Seconds(serve_poll_s);
  options.heartbeat = absl::Seconds(heartbeat_s);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.device = absl::GetFlag(FLAGS_device);
  options.summary_json = absl::GetFlag(FLAGS_summary_json);
  options.slowdown_ms_per_batch = absl::GetFlag(FLAGS_slowdown_ms_per_batch);
  options.fail_unit_reads = absl::GetFlag(FLAGS_fail_unit_reads);
  options.progress.mode = *progress_mode;
  options.progress.interval = absl::Seconds(progress_interval_s);
  options.trace_path = trace_path;
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_jobs), ',', absl::SkipWhitespace())) {
    options.validate_job_ids.emplace_back(id);
  }
  options.pool_label = absl::GetFlag(FLAGS_pool_label);
  const double idle_s = absl::GetFlag(FLAGS_exit_when_idle_s);
  if (idle_s > 0) options.exit_when_idle = absl::Seconds(idle_s);

  GroupSession session(std::move(options));
  return session.Run(&argc, &argv);
}

}  // namespace
}  // namespace mpilearn::worker

int main(int argc, char** argv) { return mpilearn::worker::Main(argc, argv); }
