// GroupSession (session.h). Over 500 lines because it holds the whole life
// of a worker process in each role (start-up, one job, serving queued jobs,
// the validation pool), which share the MPI group, the master connection
// and the trace; the work itself lives in Trainer and ValidationPool.
#include "worker/session.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <thread>
#include <utility>

#include <torch/torch.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/spec/job_config.h"
#include "common/spec/job_spec.h"
#include "common/shard/connect_shards.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"
#include "worker/model/device.h"
#include "worker/group_heartbeat.h"
#include "worker/model/model.h"
#include "worker/local_master.h"
#include "worker/run_summary.h"
#include "worker/data/training_data.h"
#include "worker/trainer.h"
#include "worker/validation_pool.h"

namespace mpilearn::worker {
namespace {

// Every pool of compute threads a rank's LibTorch may start, sized to
// `threads`, so the ranks of a node never oversubscribe its cores: ATen's
// intra-op threads (OpenMP, which oneDNN's convolutions use too), the
// inter-op pool (TorchScript fork, at::launch; one per core by default,
// and settable only once per process, before any inter-op work), and
// OpenBLAS (Debian's LibTorch does its matrix products there; the pthread
// build starts one thread per core unless told otherwise).
void SetComputeThreads(int threads) {
  torch::set_num_threads(threads);
  try {
    at::set_num_interop_threads(threads);
  } catch (const c10::Error&) {
    // Already set (or started) in this process: keep what it has.
  }
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

// Loads data on every rank; if any rank fails, every rank returns an error
// (the first failing rank's message on rank 0).
absl::StatusOr<TrainingData> LoadOnAllRanks(Collectives& group,
                                            const JobConfig& config) {
  absl::StatusOr<TrainingData> data =
      LoadTrainingData(config, config.spec().batch_size());
  std::vector<double> failed = {data.ok() ? 0.0 : 1.0};
  group.AllreduceSum(absl::MakeSpan(failed));
  if (failed[0] == 0) return data;
  if (!data.ok()) return data.status();
  return absl::AbortedError("another rank could not load the data");
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

// Set by SIGTERM/SIGINT in a validation pool; the pool's leader polls it.
std::atomic<bool> stop_requested{false};

void RequestStop(int) { stop_requested = true; }

// Set to the signal's number by SIGTERM/SIGINT while the leader trains one
// job (not serving); its heartbeat thread polls it (GroupHeartbeat).
std::atomic<int> terminate_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "stored from a signal handler");

// The training leader's handler: the heartbeat thread leaves the group and
// ends the process; the default action comes back, so a second signal ends
// it at once.
void RequestTermination(int signal_number) {
  terminate_signal = signal_number;
  std::signal(signal_number, SIG_DFL);
}

// A serving group's handler: the first signal asks the group to stop after
// its current job; the default action comes back, so a second one ends the
// process at once (signal() is async-signal-safe).
void RequestStopAfterJob(int signal_number) {
  stop_requested = true;
  std::signal(signal_number, SIG_DFL);
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

}  // namespace

GroupSession::GroupSession(Options options)
    : options_(std::move(options)), heartbeat_(options_.heartbeat) {}

GroupSession::~GroupSession() = default;

int GroupSession::Run(int* argc, char*** argv) {
  if (!options_.local) {
    absl::StatusOr<std::unique_ptr<MpiGroup>> started = MpiGroup::Init(argc, argv);
    if (!started.ok()) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(started.status().message()).c_str());
      return 2;
    }
    mpi_ = std::move(started).value();
    group_ = mpi_.get();
  } else {
    group_ = &single_;
  }
  tag_ = absl::StrCat("[rank ", group_->rank(), "/", group_->size(), "] ");

  threads_ = options_.threads;
  if (threads_ <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads_ = std::max(1, cores / std::max(1, mpi_ ? mpi_->local_size() : 1));
  }
  SetComputeThreads(threads_);
  // TorchScript without the profiling executor's slow first iterations.
  UseSimpleGraphExecutor();

  absl::StatusOr<DeviceChoice> device = ResolveDevice(
      options_.device, mpi_ ? mpi_->local_rank() : 0, CudaDeviceCount());
  if (!device.ok()) {
    if (group_->rank() == 0) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(device.status().message()).c_str());
    }
    return 1;
  }
  if (!device->note.empty() && group_->rank() == 0) LOG(INFO) << device->note;
  device_ = device->device;
  return options_.role == Role::kValidate ? RunValidationPool() : RunTraining();
}

absl::StatusOr<v1::RegisterGroupResponse> GroupSession::ObtainJob(
    MasterConnection& master, const std::string& rejoin_job) {
  Collectives& group = *group_;
  // "E<reason> <message>" or "R<serialized response>"; the reason lets every
  // rank tell "no queued job" (serving waits) from a real failure.
  std::string payload;
  if (group.rank() == 0) {
    auto obtain = [&]() -> absl::StatusOr<v1::RegisterGroupResponse> {
      v1::RegisterGroupRequest request;
      request.set_job_id(rejoin_job.empty() ? options_.job_id : rejoin_job);
      request.set_ranks(group.size());
      request.set_host(HostName());
      request.set_heartbeat_seconds(absl::ToDoubleSeconds(heartbeat_));
      if (rejoin_job.empty() && !options_.job_spec_path.empty()) {
        MPILEARN_ASSIGN_OR_RETURN(v1::JobSpec spec,
                                  ReadJobSpecFile(options_.job_spec_path));
        MPILEARN_ASSIGN_OR_RETURN(std::string job_id, master.SubmitJob(spec));
        LOG(INFO) << "[rank 0] submitted job " << job_id;
        request.set_job_id(job_id);
      }
      absl::StatusOr<v1::RegisterGroupResponse> registered =
          master.RegisterGroup(request);
      if (!registered.ok() && request.heartbeat_seconds() > 0 &&
          ReasonOf(registered.status()) == v1::ERROR_REASON_INVALID_REQUEST) {
        // Most likely a heartbeat this master cannot honour (its
        // --group_timeout_s is under 3 periods); a request bad for another
        // reason is refused again below.
        LOG(WARNING) << "[rank 0] the master refused the registration with "
                        "--heartbeat_s "
                     << request.heartbeat_seconds() << ": "
                     << registered.status().message()
                     << "; registering without a heartbeat (the master then "
                        "notices a dead group only after its "
                        "--group_timeout_s)";
        heartbeat_ = absl::ZeroDuration();
        request.set_heartbeat_seconds(0);
        registered = master.RegisterGroup(request);
      }
      return registered;
    };
    absl::StatusOr<v1::RegisterGroupResponse> registered = obtain();
    payload = registered.ok()
                  ? "R" + registered->SerializeAsString()
                  : absl::StrCat("E", static_cast<int>(ReasonOf(registered.status())),
                                 " ", registered.status().ToString());
  }
  group.Broadcast(&payload, 0);
  if (payload.empty() || payload[0] == 'E') {
    int reason = v1::ERROR_REASON_UNSPECIFIED;
    const size_t space = payload.find(' ');
    if (space == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(payload).substr(1, space - 1), &reason) ||
        !v1::ErrorReason_IsValid(reason)) {
      return absl::InternalError("could not decode the leader's registration");
    }
    return WithReason(absl::FailedPreconditionError(payload.substr(space + 1)),
                      static_cast<v1::ErrorReason>(reason));
  }
  v1::RegisterGroupResponse response;
  response.ParseFromString(payload.substr(1));
  return response;
}

void GroupSession::PrintJobLine(const v1::RegisterGroupResponse& registration) const {
  const v1::JobSpec& spec = registration.spec();
  std::string update_rule;
  switch (AlgorithmOf(spec)) {
    case v1::ALGORITHM_EASGD:
      update_rule = absl::StrCat("local ", spec.easgd().worker_optimizer().name(), " lr ",
                                 spec.easgd().worker_optimizer().learning_rate(),
                                 ", alpha ", spec.easgd().alpha());
      break;
    case v1::ALGORITHM_GEM:
      update_rule = spec.gem().has_worker_optimizer()
                        ? absl::StrCat("gem with local ", spec.gem().worker_optimizer().name(),
                                       " lr ", spec.gem().worker_optimizer().learning_rate(),
                                       ", kappa ", spec.gem().kappa())
                        : absl::StrCat("gem lr ", spec.gem().learning_rate(), ", kappa ",
                                       spec.gem().kappa());
      break;
    default:
      update_rule = absl::StrCat("optimizer ", spec.optimizer().name());
      break;
  }
  const std::string model =
      spec.model().torchscript().empty()
          ? spec.model().name()
          : absl::StrCat("torchscript ", spec.model().torchscript());
  std::printf("job %s: group %s with %d rank(s), %d thread(s) each; model %s, "
              "%s, %s, %d epochs, batch %d per rank\n",
              registration.job_id().c_str(), registration.group_id().c_str(),
              group_->size(), threads_, model.c_str(),
              spec.algorithm().c_str(), update_rule.c_str(), spec.epochs(),
              spec.batch_size());
  std::fflush(stdout);
}

void GroupSession::WriteGroupTrace(TraceRecorder* trace) {
  if (trace == nullptr) return;
  Collectives& group = *group_;
  double counts[2] = {static_cast<double>(trace->recorded()),
                      static_cast<double>(trace->dropped())};
  group.AllreduceSum(absl::MakeSpan(counts, 2));
  const std::vector<std::string> chunks = group.GatherStrings(trace->TakeEvents(), 0);
  if (group.rank() != 0) return;
  const std::string& path = options_.trace_path;
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

int GroupSession::RunValidationPool() {
  Collectives& group = *group_;
  std::signal(SIGTERM, RequestStop);
  std::signal(SIGINT, RequestStop);
  std::unique_ptr<MasterClient> master;
  absl::Status connected = absl::OkStatus();
  if (group.rank() == 0) {
    auto client = MasterClient::Connect(options_.master, options_.connection);
    if (client.ok()) {
      master = std::move(client).value();
    } else {
      connected = client.status();
    }
  }
  if (!EveryRankConnected(group, connected, tag_)) return 1;

  std::unique_ptr<TraceRecorder> trace;
  if (!options_.trace_path.empty()) {
    trace = TraceRecorder::InMemory(
        PoolTracePid(group.rank()),
        absl::StrCat("validation pool rank ", group.rank()));
    trace->NameThread("validation");
  }
  ValidationPoolOptions pool_options;
  pool_options.job_ids = options_.validate_job_ids;
  pool_options.label = options_.pool_label;
  if (pool_options.label.empty()) {
    pool_options.label = absl::StrCat(HostName(), ":", getpid());
  }
  pool_options.exit_when_idle = options_.exit_when_idle;
  pool_options.stop_requested = &stop_requested;
  pool_options.trace = trace.get();
  // A master restart: the pool subscribes again for as long as any client
  // retries an unreachable master.
  pool_options.resubscribe_for = options_.connection.reconnect_timeout;
  ValidationPool pool(group, master.get(), pool_options);
  absl::StatusOr<ValidationPoolResult> result = pool.Run();
  // The pool's ranks end Run together, whatever the outcome.
  WriteGroupTrace(trace.get());
  if (!result.ok()) {
    // The pool fails only on the leader's word (BroadcastStatus), so every
    // rank holds the same error: the leader prints it.
    if (group.rank() == 0) {
      std::fprintf(stderr, "%smpilearn-worker: %s\n", tag_.c_str(),
                   std::string(result.status().message()).c_str());
    }
    return 1;
  }
  if (group.rank() == 0) {
    std::printf("pool %s: validated %lld snapshot(s)%s\n",
                pool_options.label.c_str(),
                static_cast<long long>(result->validated),
                result->failed > 0
                    ? absl::StrCat(", ", result->failed, " skipped or unreported")
                          .c_str()
                    : "");
    std::fflush(stdout);
  }
  return 0;
}

int GroupSession::RunTraining() {
  Collectives& group = *group_;
  // Every rank talks to the master (downpour pushes from each rank).
  std::unique_ptr<MasterConnection> master;
  absl::Status connected = absl::OkStatus();
  if (options_.local) {
    server::EngineOptions engine;
    engine.threads = options_.optimizer_threads;
    auto created = LocalMaster::Create(options_.local_state_dir, engine);
    if (created.ok()) {
      master = std::move(created).value();
    } else {
      connected = created.status();
    }
  } else {
    auto client = MasterClient::Connect(options_.master, options_.connection);
    if (client.ok()) {
      master = std::move(client).value();
    } else {
      connected = client.status();
    }
  }
  if (!EveryRankConnected(group, connected, tag_)) return 1;
  if (options_.serve) return ServeJobs(*master);

  absl::StatusOr<v1::RegisterGroupResponse> registration =
      ObtainJob(*master, /*rejoin_job=*/"");
  if (!registration.ok()) {
    if (group.rank() == 0) {
      std::fprintf(stderr, "mpilearn-worker: %s\n",
                   std::string(registration.status().message()).c_str());
    }
    return 1;
  }
  if (group.rank() == 0) PrintJobLine(*registration);
  // TrainJob wrote the trace (one job: it ends with the process).
  return TrainJob(*master, std::move(registration).value()).exit_code;
}

int GroupSession::ServeJobs(MasterConnection& master) {
  Collectives& group = *group_;
  std::signal(SIGTERM, RequestStopAfterJob);
  std::signal(SIGINT, RequestStopAfterJob);
  int jobs = 0;
  int failed = 0;
  int exit_code = 0;
  absl::Time idle_since = absl::Now();
  for (;;) {
    // The leader decides whether to go on; every rank follows its word.
    std::string stop;  // empty: go on; else why the group stops
    if (group.rank() == 0) {
      if (stop_requested) {
        stop = "stop requested";
      } else if (absl::Now() - idle_since >= options_.exit_when_idle) {
        stop = absl::StrCat("no queued job for ",
                            absl::FormatDuration(options_.exit_when_idle));
      }
    }
    group.Broadcast(&stop, 0);
    if (!stop.empty()) {
      if (group.rank() == 0) {
        std::printf("serving: %s; ending after %d job(s), %d failed\n",
                    stop.c_str(), jobs, failed);
        std::fflush(stdout);
      }
      break;
    }
    absl::StatusOr<v1::RegisterGroupResponse> registration =
        ObtainJob(master, /*rejoin_job=*/"");
    if (!registration.ok()) {
      if (ReasonOf(registration.status()) == v1::ERROR_REASON_NO_QUEUED_JOB) {
        // Every rank sleeps, so none spins in a collective while idle.
        absl::SleepFor(options_.serve_poll);
        continue;
      }
      // The master cannot be asked (or refuses this group): nothing more
      // to serve.
      if (group.rank() == 0) {
        std::fprintf(stderr, "mpilearn-worker: %s\n",
                     std::string(registration.status().message()).c_str());
      }
      exit_code = 1;
      break;
    }
    if (group.rank() == 0) PrintJobLine(*registration);
    const JobEnd end = TrainJob(master, std::move(registration).value());
    ++jobs;
    if (end.exit_code != 0) ++failed;
    // This rank failed alone (a group of one: TrainJob aborted any larger
    // group): its state is not to be trusted for another job.
    if (!end.together) return 1;
    idle_since = absl::Now();
  }
  WriteGroupTrace(trace_.get());
  return exit_code;
}

GroupSession::JobEnd GroupSession::TrainJob(
    MasterConnection& lead, v1::RegisterGroupResponse registration) {
  Collectives& group = *group_;
  const std::string job_id = registration.job_id();
  // A sharded job (docs/sharding.md): every rank reaches every shard; the
  // weight calls go to them, the rest to the lead.
  std::unique_ptr<shard::ShardedConnection> sharded;
  if (registration.shards().addresses_size() > 0 && !options_.local) {
    shard::ShardedConnection::GroupInfo info;
    info.ranks = group.size();
    info.host = HostName();
    info.heartbeat_seconds = absl::ToDoubleSeconds(heartbeat_);
    absl::StatusOr<std::unique_ptr<shard::ShardedConnection>> made =
        shard::ConnectShards(lead, registration.shards(), options_.connection, info);
    if (!EveryRankConnected(group, made.status(), tag_)) {
      if (group.rank() == 0) {
        v1::LeaveRequest leave;
        leave.set_job_id(job_id);
        leave.set_group_id(registration.group_id());
        leave.set_error(made.ok() ? "another rank could not reach the job's shards"
                                  : std::string(made.status().message()));
        (void)lead.Leave(leave);
      }
      return {1, true};
    }
    sharded = *std::move(made);
    if (group.rank() == 0) {
      LOG(INFO) << "job " << job_id << ": weights on " << registration.shards().addresses_size()
                << " parameter shards";
    }
  }
  MasterConnection& master = sharded != nullptr ? *sharded : lead;
  if (!options_.trace_path.empty() && trace_ == nullptr) {
    trace_ = TraceRecorder::InMemory(
        TracePid(registration.group_id(), group.rank()),
        absl::StrCat("group ", registration.group_id(), " rank ", group.rank()));
    trace_->NameThread("training");
  }
  TraceRecorder* const trace = trace_.get();
  // One job: the trace is written when it ends (every rank, together);
  // serving: once, when the group stops serving (ServeJobs).
  auto write_trace_if_last = [&] {
    if (!options_.serve) WriteGroupTrace(trace);
  };

  // The leader's heartbeat, for as long as the group is registered to this
  // job (rejoins included); stopped before any Leave. Training one job, the
  // leader also ends the group on SIGTERM/SIGINT through it (the file
  // comment of group_heartbeat.h); serving keeps its stop-after-the-job
  // handler.
  std::unique_ptr<GroupHeartbeat> heartbeat;
  auto stop_heartbeat = [&] {
    if (heartbeat == nullptr) return;
    heartbeat->Stop();
    heartbeat.reset();
    if (!options_.serve) {
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGINT, SIG_DFL);
    }
  };
  const absl::Cleanup stop_heartbeat_at_return = stop_heartbeat;
  if (group.rank() == 0) {
    GroupHeartbeat::Options heartbeat_options;
    heartbeat_options.period = heartbeat_;
    if (!options_.serve) {
      heartbeat_options.terminate_signal = &terminate_signal;
      std::signal(SIGTERM, RequestTermination);
      std::signal(SIGINT, RequestTermination);
    }
    heartbeat = std::make_unique<GroupHeartbeat>(master, heartbeat_options);
    heartbeat->SetGroup(job_id, registration.group_id());
  }

  auto leave_with_error = [&](const absl::Status& error) {
    stop_heartbeat();
    if (group.rank() == 0) {
      v1::LeaveRequest leave;
      leave.set_job_id(job_id);
      leave.set_group_id(registration.group_id());
      leave.set_error(std::string(error.message()));
      leave.set_data_error(ReasonOf(error) == v1::ERROR_REASON_DATA);
      (void)master.Leave(leave);
    }
  };

  // The master's normalized spec, read once (every rank gets the same
  // spec, so every rank agrees on whether it reads).
  const absl::StatusOr<JobConfig> config = JobConfig::Create(registration.spec());
  if (!config.ok()) {
    leave_with_error(config.status());
    std::fprintf(stderr, "%smpilearn-worker: the master's spec for job %s: %s\n",
                 tag_.c_str(), job_id.c_str(),
                 std::string(config.status().message()).c_str());
    write_trace_if_last();
    return {1, true};
  }
  absl::StatusOr<TrainingData> data = LoadOnAllRanks(group, *config);
  if (!data.ok()) {
    leave_with_error(data.status());
    if (data.status().code() != absl::StatusCode::kAborted) {
      std::fprintf(stderr, "%smpilearn-worker: %s\n", tag_.c_str(),
                   std::string(data.status().message()).c_str());
    }
    write_trace_if_last();  // every rank failed together
    return {1, true};
  }

  TrainerOptions trainer_options;
  trainer_options.slowdown_ms_per_batch = options_.slowdown_ms_per_batch;
  trainer_options.fail_unit_reads = options_.fail_unit_reads;
  trainer_options.progress = options_.progress;
  trainer_options.device = device_;
  trainer_options.trace = trace;
  // A group the master stops knowing (it restarted from a checkpoint, or
  // declared the group lost during a long outage) registers again and goes
  // on from the master's weights; every rank sees the same status, so the
  // whole group does this together.
  const TrainingData splits = std::move(data).value();
  // The job's wire precision for pushes and pulls (JobSpec.exchange).
  master.UseWireFormat(registration.spec().exchange());
  absl::StatusOr<TrainResult> result;
  // Whether a failure left every rank together (see Trainer::failed_together).
  bool together = true;
  for (int rejoins = 0;; ++rejoins) {
    Trainer trainer(group, master, registration, *config, splits,
                    trainer_options);
    result = trainer.Run();
    together = result.ok() || trainer.failed_together();
    if (result.ok() || !IsGroupUnknown(result.status()) || rejoins >= 100) break;
    if (group.rank() == 0) {
      std::printf("group %s: %s; registering again\n",
                  registration.group_id().c_str(),
                  std::string(result.status().message()).c_str());
      std::fflush(stdout);
    }
    absl::StatusOr<v1::RegisterGroupResponse> again = ObtainJob(master, job_id);
    if (!again.ok()) {
      result = again.status();
      together = true;  // every rank got the leader's answer
      break;
    }
    registration = *std::move(again);
    if (heartbeat != nullptr) heartbeat->SetGroup(job_id, registration.group_id());
    if (group.rank() == 0) {
      std::printf("job %s: rejoined as group %s\n", job_id.c_str(),
                  registration.group_id().c_str());
      std::fflush(stdout);
    }
  }
  if (!result.ok()) {
    // Together: every rank stopped on the leader's word (BroadcastStatus
    // gave them the leader's code and reason); the leader reports it and
    // leaves. Anything else happened on this rank alone, and the others may
    // be waiting in a collective for it, so the whole group is ended. A
    // serving group that failed together goes on to the next job; one job
    // ends the group as it always did.
    if (together) write_trace_if_last();
    if (together && group.rank() != 0) return {1, true};
    std::fprintf(stderr, "%smpilearn-worker: %s\n", tag_.c_str(),
                 std::string(result.status().message()).c_str());
    leave_with_error(result.status());
    if (group.size() > 1 && !(together && options_.serve)) group.Abort(1);
    return {1, together};
  }

  int exit_code = 0;
  stop_heartbeat();
  if (group.rank() == 0) {
    // The group that finished the job's data reports the test result and
    // completes the job; any other group just leaves.
    v1::LeaveRequest leave;
    leave.set_job_id(job_id);
    leave.set_group_id(registration.group_id());
    leave.set_completed(result->finished_job);
    if (result->finished_job && result->test.samples > 0) {
      leave.set_test_loss(result->test.loss);
      for (const auto& [name, value] : result->test.metrics) {
        // "val_mae" -> "test_mae": the same metrics, on the test set.
        (*leave.mutable_test_metrics())["test" + name.substr(name.find('_'))] = value;
      }
      if (result->test.metrics.count("val_accuracy") > 0) {
        leave.set_test_accuracy(result->test.accuracy);
      }
    }
    absl::StatusOr<v1::JobState> state = master.Leave(leave);
    if (!state.ok()) {
      std::fprintf(stderr, "mpilearn-worker: could not report completion: %s\n",
                   std::string(state.status().message()).c_str());
    }
    std::printf("job %s: group %s trained %llu units (%lld samples) in %.1fs, "
                "%.0f samples/s (%.0f per rank)%s\n",
                job_id.c_str(), registration.group_id().c_str(),
                static_cast<unsigned long long>(result->units),
                static_cast<long long>(result->samples), result->seconds,
                result->samples_per_second, result->samples_per_second_per_rank,
                result->stale_dropped > 0
                    ? absl::StrCat(", ", result->stale_dropped,
                                   " stale updates dropped")
                          .c_str()
                    : "");
    if (result->finished_job && result->test.samples > 0) {
      // One `name=value` per line: test_loss and test_accuracy, or
      // test_mae and test_mse for regression.
      std::printf("%s\n", FormatMetrics(result->test, "test", "\n").c_str());
    }
    std::fflush(stdout);
    if (!options_.summary_json.empty()) {
      const absl::Status written = WriteRunSummary(
          options_.summary_json,
          BuildRunSummary(registration, group.size(), options_.local, *result));
      if (!written.ok()) {
        std::fprintf(stderr, "mpilearn-worker: cannot write --summary_json %s\n",
                     options_.summary_json.c_str());
      }
    }
    if (!state.ok()) exit_code = 1;
  }
  write_trace_if_last();
  return {exit_code, true};
}

}  // namespace mpilearn::worker
