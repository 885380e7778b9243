// mpilearn-worker: one rank of a training group, started by mpirun.
//
//   mpirun -np 2 mpilearn-worker --master HOST:PORT [--job SPEC.json | --job_id ID]
//   mpirun -np 2 mpilearn-worker --master HOST:PORT --role validate [--jobs ID,ID]
//   ... [--progress auto|plain|off] [--trace FILE]
//
// Rank 0 (the leader) obtains the job from the master and broadcasts it;
// every rank loads its data, builds the model and runs the Trainer. With
// --role validate the ranks form a validation pool (validation_pool.h)
// instead. The leader prints a progress line (--progress); with --trace every
// rank records spans in memory and rank 0 writes them all to one Chrome trace
// file when the group ends.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/master_client.h"
#include "common/master_connection.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "glog/logging.h"
#include "worker/dataset.h"
#include "worker/local_master.h"
#include "worker/mpi_group.h"
#include "worker/progress.h"
#include "worker/trainer.h"
#include "worker/validation_pool.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master (required).");
ABSL_FLAG(std::string, job, "",
          "Job spec JSON file to submit and train. Without --job or --job_id "
          "the group takes the master's oldest queued job.");
ABSL_FLAG(std::string, job_id, "", "Existing job to serve.");
ABSL_FLAG(int, threads, 0,
          "Compute threads per rank; 0 divides this node's cores among its "
          "ranks.");
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
          "one JSON object to this file when done (leader only).");
ABSL_FLAG(int, slowdown_ms_per_batch, 0,
          "Testing aid: sleep this long after every batch (a slow group).");
ABSL_FLAG(double, rpc_timeout_s, 120, "Deadline of each call to the master.");
ABSL_FLAG(double, reconnect_timeout_s, 300,
          "How long calls keep retrying while the master is unreachable "
          "(restarting); the group then registers again and continues from "
          "the master's last checkpoint.");
ABSL_FLAG(std::string, role, "train",
          "train: a training group; validate: a validation pool, validating "
          "the weight snapshots the master publishes (the job spec's "
          "`snapshots`) until SIGTERM/SIGINT.");
ABSL_FLAG(std::string, jobs, "",
          "--role validate: comma-separated job ids to validate; empty "
          "validates every job, including later ones.");
ABSL_FLAG(double, exit_when_idle_s, 0,
          "--role validate: exit after this many seconds without a snapshot "
          "(0: never).");
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

// Debian's LibTorch does its matrix products in OpenBLAS, which starts one
// thread per core in every rank unless told otherwise.
void SetBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

std::string HostName() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Leader: submits (--job) and registers; the result is broadcast so every
// rank sees the same registration or the same error.
//
// `rejoin_job` non-empty: register again with that job (the master
// restarted or declared the group lost), submitting nothing.
absl::StatusOr<v1::RegisterGroupResponse> ObtainJob(
    Collectives& group, MasterConnection& master,
    const std::string& rejoin_job = "") {
  std::string payload;  // "E<message>" or "R<serialized response>"
  if (group.rank() == 0) {
    auto obtain = [&]() -> absl::StatusOr<v1::RegisterGroupResponse> {
      v1::RegisterGroupRequest request;
      request.set_job_id(rejoin_job.empty() ? absl::GetFlag(FLAGS_job_id) : rejoin_job);
      request.set_ranks(group.size());
      request.set_host(HostName());
      if (rejoin_job.empty() && !absl::GetFlag(FLAGS_job).empty()) {
        MPILEARN_ASSIGN_OR_RETURN(v1::JobSpec spec,
                                  ReadJobSpecFile(absl::GetFlag(FLAGS_job)));
        MPILEARN_ASSIGN_OR_RETURN(std::string job_id, master.SubmitJob(spec));
        LOG(INFO) << "[rank 0] submitted job " << job_id;
        request.set_job_id(job_id);
      }
      return master.RegisterGroup(request);
    };
    absl::StatusOr<v1::RegisterGroupResponse> registered = obtain();
    payload = registered.ok()
                  ? "R" + registered->SerializeAsString()
                  : absl::StrCat("E", registered.status().ToString());
  }
  group.Broadcast(&payload, 0);
  if (payload.empty() || payload[0] == 'E') {
    return absl::FailedPreconditionError(payload.substr(1));
  }
  v1::RegisterGroupResponse response;
  response.ParseFromString(payload.substr(1));
  return response;
}

// Loads data on every rank; if any rank fails, every rank returns an error
// (the first failing rank's message on rank 0).
absl::StatusOr<DatasetSplits> LoadOnAllRanks(Collectives& group,
                                             const v1::DataSpec& spec) {
  absl::StatusOr<DatasetSplits> data = LoadDatasets(spec);
  std::vector<double> failed = {data.ok() ? 0.0 : 1.0};
  group.AllreduceSum(absl::MakeSpan(failed));
  if (failed[0] == 0) return data;
  if (!data.ok()) return data.status();
  return absl::AbortedError("another rank could not load the data");
}

// --summary_json: one JSON object with this group's figures.
void WriteSummary(const v1::RegisterGroupResponse& registration, int ranks,
                  bool local, const TrainResult& result) {
  const std::string path = absl::GetFlag(FLAGS_summary_json);
  if (path.empty()) return;
  const double total = result.times.total();
  auto share = [&](double s) { return total > 0 ? s / total : 0.0; };
  const double epochs =
      std::max(1.0, static_cast<double>(registration.spec().epochs()));
  FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "mpilearn-worker: cannot write --summary_json %s\n",
                 path.c_str());
    return;
  }
  std::fprintf(out,
               "{\"mode\": \"%s\", \"ranks\": %d, \"job_id\": \"%s\", "
               "\"samples_per_s\": %.3f, \"samples_per_s_per_rank\": %.3f, "
               "\"epoch_s\": %.4f, \"train_s\": %.4f, \"validation_s\": %.4f, "
               "\"total_s\": %.4f, \"units\": %llu, "
               "\"samples\": %lld, \"stale_dropped\": %llu, "
               "\"share\": {\"data\": %.4f, \"compute\": %.4f, "
               "\"master\": %.4f, \"mpi\": %.4f}, \"test_accuracy\": %.4f}\n",
               local ? "local" : registration.spec().algorithm().c_str(), ranks,
               registration.job_id().c_str(), result.samples_per_second,
               result.samples_per_second_per_rank, result.train_seconds / epochs,
               result.train_seconds, result.validation_seconds, result.seconds,
               static_cast<unsigned long long>(result.units),
               static_cast<long long>(result.samples),
               static_cast<unsigned long long>(result.stale_dropped),
               share(result.times.data), share(result.times.compute),
               share(result.times.master), share(result.times.mpi),
               result.test.accuracy);
  std::fclose(out);
}

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

// A training rank's trace pid: 1000 x the group's number ("g-12": 12) +
// rank, so the groups of one job can share a viewer.
int TracePid(const std::string& group_id, int rank) {
  int number = 0;
  const size_t dash = group_id.rfind('-');
  if (!absl::SimpleAtoi(dash == std::string::npos ? group_id : group_id.substr(dash + 1),
                        &number) ||
      number < 0 || number > 2000000) {
    number = 0;
  }
  return 1000 * number + rank;
}

// A validation pool rank's trace pid (apart from any group's).
int PoolTracePid(int rank) { return 1000000 + rank; }

// All ranks (a collective; they must still be together): gathers every
// rank's events on rank 0, which writes the --trace file. Does nothing
// without a recorder (no --trace). A file that cannot be written is
// reported, not fatal.
void WriteGroupTrace(Collectives& group, TraceRecorder* trace) {
  if (trace == nullptr) return;
  double counts[2] = {static_cast<double>(trace->recorded()),
                      static_cast<double>(trace->dropped())};
  group.AllreduceSum(absl::MakeSpan(counts, 2));
  const std::vector<std::string> chunks = group.GatherStrings(trace->TakeEvents(), 0);
  if (group.rank() != 0) return;
  const std::string path = absl::GetFlag(FLAGS_trace);
  const absl::Status written = WriteTraceFile(path, chunks);
  if (!written.ok()) {
    std::fprintf(stderr, "mpilearn-worker: the trace was not written: %s\n",
                 std::string(written.message()).c_str());
    return;
  }
  const auto events = static_cast<unsigned long long>(counts[0]);
  const auto dropped = static_cast<unsigned long long>(counts[1]);
  if (dropped > 0) {
    LOG(WARNING) << "trace written to " << path << " (" << events << " events; "
                 << dropped
                 << " later events dropped: a rank reached the in-memory "
                    "limit of 256 MiB of events)";
  } else {
    LOG(INFO) << "trace written to " << path << " (" << events << " events)";
  }
}

// Set by SIGTERM/SIGINT in a validation pool; the pool's leader polls it.
std::atomic<bool> stop_requested{false};

void RequestStop(int) { stop_requested = true; }

// The gRPC client of --master with the connection flags applied.
absl::StatusOr<std::unique_ptr<MasterClient>> ConnectFromFlags() {
  MasterClient::Options options;
  options.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  options.reconnect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_reconnect_timeout_s));
  return MasterClient::Connect(absl::GetFlag(FLAGS_master), options);
}

// True on every rank when every rank's `connected` is OK; a rank whose
// connection failed prints why.
bool EveryRankConnected(Collectives& group, const absl::Status& connected,
                        const std::string& tag) {
  std::vector<double> unreachable = {connected.ok() ? 0.0 : 1.0};
  group.AllreduceSum(absl::MakeSpan(unreachable));
  if (unreachable[0] == 0) return true;
  if (!connected.ok()) {
    std::fprintf(stderr, "%smpilearn-worker: %s\n", tag.c_str(),
                 std::string(connected.message()).c_str());
  }
  return false;
}

// --role validate: every rank runs the pool; the leader alone talks to the
// master. Returns the process's exit code.
int RunValidationPool(Collectives& group, const std::string& tag) {
  std::signal(SIGTERM, RequestStop);
  std::signal(SIGINT, RequestStop);
  std::unique_ptr<MasterClient> master;
  absl::Status connected = absl::OkStatus();
  if (group.rank() == 0) {
    auto client = ConnectFromFlags();
    if (client.ok()) {
      master = std::move(client).value();
    } else {
      connected = client.status();
    }
  }
  if (!EveryRankConnected(group, connected, tag)) return 1;

  std::unique_ptr<TraceRecorder> trace;
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    trace = TraceRecorder::InMemory(
        PoolTracePid(group.rank()),
        absl::StrCat("validation pool rank ", group.rank()));
    trace->NameThread("validation");
  }
  ValidationPoolOptions options;
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_jobs), ',', absl::SkipWhitespace())) {
    options.job_ids.emplace_back(id);
  }
  options.label = absl::GetFlag(FLAGS_pool_label);
  if (options.label.empty()) options.label = absl::StrCat(HostName(), ":", getpid());
  const double idle_s = absl::GetFlag(FLAGS_exit_when_idle_s);
  if (idle_s > 0) options.exit_when_idle = absl::Seconds(idle_s);
  options.stop_requested = &stop_requested;
  options.trace = trace.get();
  ValidationPool pool(group, master.get(), options);
  absl::StatusOr<ValidationPoolResult> result = pool.Run();
  // The pool's ranks end Run together, whatever the outcome.
  WriteGroupTrace(group, trace.get());
  if (!result.ok()) {
    if (group.rank() == 0 ||
        result.status().code() != absl::StatusCode::kAborted) {
      std::fprintf(stderr, "%smpilearn-worker: %s\n", tag.c_str(),
                   std::string(result.status().message()).c_str());
    }
    return 1;
  }
  if (group.rank() == 0) {
    std::printf("pool %s: validated %lld snapshot(s)%s\n", options.label.c_str(),
                static_cast<long long>(result->validated),
                result->failed > 0
                    ? absl::StrCat(", ", result->failed, " skipped or unreported")
                          .c_str()
                    : "");
    std::fflush(stdout);
  }
  return 0;
}

int Main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "worker/worker_main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "MPI Learn worker: one rank of a training group. Start it with mpirun:\n"
      "\n"
      "  mpirun -np 2 mpilearn-worker --master 127.0.0.1:7070 --job spec.json\n"
      "  mpirun -np 4 mpilearn-worker --master HOST:7070   # next queued job\n"
      "  mpilearn-worker --local --job spec.json   # one process, no master\n"
      "  mpirun -np 2 mpilearn-worker --master HOST:7070 --role validate\n"
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
  std::unique_ptr<MpiGroup> mpi;
  SingleProcessGroup single;
  if (!local) {
    absl::StatusOr<std::unique_ptr<MpiGroup>> started = MpiGroup::Init(&argc, &argv);
    if (!started.ok()) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(started.status().message()).c_str());
      return 2;
    }
    mpi = std::move(started).value();
  }
  Collectives& group = local ? static_cast<Collectives&>(single) : *mpi;
  const std::string tag = absl::StrCat("[rank ", group.rank(), "/",
                                       group.size(), "] ");

  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, local ? 1 : mpi->local_size()));
  }
  torch::set_num_threads(threads);
  SetBlasThreads(threads);
  if (role == "validate") return RunValidationPool(group, tag);

  // Every rank talks to the master (downpour pushes from each rank).
  std::unique_ptr<MasterConnection> master;
  absl::Status connected = absl::OkStatus();
  if (local) {
    server::EngineOptions engine;
    engine.threads = absl::GetFlag(FLAGS_optimizer_threads);
    auto created = LocalMaster::Create(absl::GetFlag(FLAGS_local_state_dir), engine);
    if (created.ok()) {
      master = std::move(created).value();
    } else {
      connected = created.status();
    }
  } else {
    auto client = ConnectFromFlags();
    if (client.ok()) {
      master = std::move(client).value();
    } else {
      connected = client.status();
    }
  }
  if (!EveryRankConnected(group, connected, tag)) return 1;

  absl::StatusOr<v1::RegisterGroupResponse> registration =
      ObtainJob(group, *master);
  if (!registration.ok()) {
    if (group.rank() == 0) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(registration.status().message()).c_str());
    }
    return 1;
  }
  const std::string job_id = registration->job_id();
  if (group.rank() == 0) {
    const v1::JobSpec& spec = registration->spec();
    std::string update_rule;
    if (spec.algorithm() == "easgd") {
      update_rule = absl::StrCat("local sgd lr ", spec.easgd().worker_optimizer().learning_rate(),
                                 ", alpha ", spec.easgd().alpha());
    } else if (spec.algorithm() == "gem") {
      update_rule = absl::StrCat("gem lr ", spec.gem().learning_rate(), ", kappa ",
                                 spec.gem().kappa());
    } else {
      update_rule = absl::StrCat("optimizer ", spec.optimizer().name());
    }
    std::printf("job %s: group %s with %d rank(s), %d thread(s) each; model %s, "
                "%s, %s, %d epochs, batch %d per rank\n",
                job_id.c_str(), registration->group_id().c_str(), group.size(),
                threads, spec.model().name().c_str(), spec.algorithm().c_str(),
                update_rule.c_str(), spec.epochs(), spec.batch_size());
    std::fflush(stdout);
  }

  // Kept for the process's life, also when the group registers again.
  std::unique_ptr<TraceRecorder> trace;
  if (!trace_path.empty()) {
    trace = TraceRecorder::InMemory(
        TracePid(registration->group_id(), group.rank()),
        absl::StrCat("group ", registration->group_id(), " rank ", group.rank()));
    trace->NameThread("training");
  }

  auto leave_with_error = [&](const absl::Status& error) {
    if (group.rank() == 0) {
      v1::LeaveRequest leave;
      leave.set_job_id(job_id);
      leave.set_group_id(registration->group_id());
      leave.set_error(std::string(error.message()));
      (void)master->Leave(leave);
    }
  };

  absl::StatusOr<DatasetSplits> data =
      LoadOnAllRanks(group, registration->spec().data());
  if (!data.ok()) {
    leave_with_error(data.status());
    if (data.status().code() != absl::StatusCode::kAborted) {
      std::fprintf(stderr, "%smpilearn-worker: %s\n", tag.c_str(),
                   std::string(data.status().message()).c_str());
    }
    WriteGroupTrace(group, trace.get());  // every rank failed together
    return 1;
  }

  TrainerOptions trainer_options;
  trainer_options.slowdown_ms_per_batch = absl::GetFlag(FLAGS_slowdown_ms_per_batch);
  trainer_options.progress.mode = *progress_mode;
  trainer_options.progress.interval = absl::Seconds(progress_interval_s);
  trainer_options.trace = trace.get();
  // A group the master stops knowing (it restarted from a checkpoint, or
  // declared the group lost during a long outage) registers again and goes
  // on from the master's weights; every rank sees the same status, so the
  // whole group does this together.
  const DatasetSplits splits = std::move(data).value();
  absl::StatusOr<TrainResult> result;
  // Whether a failure left every rank together (see Trainer::failed_together).
  bool together = true;
  for (int rejoins = 0;; ++rejoins) {
    Trainer trainer(group, *master, *registration, splits, trainer_options);
    result = trainer.Run();
    together = result.ok() || trainer.failed_together();
    if (result.ok() || !IsGroupUnknown(result.status()) || rejoins >= 100) break;
    if (group.rank() == 0) {
      std::printf("group %s: %s; registering again\n",
                  registration->group_id().c_str(),
                  std::string(result.status().message()).c_str());
      std::fflush(stdout);
    }
    absl::StatusOr<v1::RegisterGroupResponse> again =
        ObtainJob(group, *master, job_id);
    if (!again.ok()) {
      result = again.status();
      together = true;  // every rank got the leader's answer
      break;
    }
    registration = std::move(again);
    if (group.rank() == 0) {
      std::printf("job %s: rejoined as group %s\n", job_id.c_str(),
                  registration->group_id().c_str());
      std::fflush(stdout);
    }
  }
  if (!result.ok()) {
    if (together) WriteGroupTrace(group, trace.get());
    // Aborted: every rank stopped together on the leader's word. Anything
    // else happened on this rank alone, and the others may be waiting in a
    // collective for it, so the whole group is ended.
    if (result.status().code() == absl::StatusCode::kAborted) {
      if (group.rank() == 0) {
        std::fprintf(stderr, "mpilearn-worker: stopped: %s\n",
                     std::string(result.status().message()).c_str());
      }
      return 1;
    }
    std::fprintf(stderr, "%smpilearn-worker: %s\n", tag.c_str(),
                 std::string(result.status().message()).c_str());
    leave_with_error(result.status());
    if (group.size() > 1) group.Abort(1);
    return 1;
  }

  int exit_code = 0;
  if (group.rank() == 0) {
    // The group that finished the job's data reports the test result and
    // completes the job; any other group just leaves.
    v1::LeaveRequest leave;
    leave.set_job_id(job_id);
    leave.set_group_id(registration->group_id());
    leave.set_completed(result->finished_job);
    if (result->finished_job && result->test.samples > 0) {
      leave.set_test_loss(result->test.loss);
      leave.set_test_accuracy(result->test.accuracy);
    }
    absl::StatusOr<v1::JobState> state = master->Leave(leave);
    if (!state.ok()) {
      std::fprintf(stderr, "mpilearn-worker: could not report completion: %s\n",
                   std::string(state.status().message()).c_str());
    }
    std::printf("job %s: group %s trained %llu units (%lld samples) in %.1fs, "
                "%.0f samples/s (%.0f per rank)%s\n",
                job_id.c_str(), registration->group_id().c_str(),
                static_cast<unsigned long long>(result->units),
                static_cast<long long>(result->samples), result->seconds,
                result->samples_per_second, result->samples_per_second_per_rank,
                result->stale_dropped > 0
                    ? absl::StrCat(", ", result->stale_dropped,
                                   " stale updates dropped")
                          .c_str()
                    : "");
    if (result->finished_job && result->test.samples > 0) {
      std::printf("test_loss=%.4f\ntest_accuracy=%.4f\n", result->test.loss,
                  result->test.accuracy);
    }
    std::fflush(stdout);
    WriteSummary(*registration, group.size(), local, *result);
    if (!state.ok()) exit_code = 1;
  }
  WriteGroupTrace(group, trace.get());
  return exit_code;
}

}  // namespace
}  // namespace mpilearn::worker

int main(int argc, char** argv) { return mpilearn::worker::Main(argc, argv); }
