// mpilearnctl: submit, list, inspect, wait for, cancel and delete jobs on
// mpilearn-master; show its queue and check its version.
//
//   JOB=$(mpilearnctl submit docs/examples/fashion_mnist.json)
//   mpilearnctl wait "$JOB" --timeout_s 3600
//
// main() only parses flags; Run() dispatches the subcommand and returns the
// exit code: 0 success, 1 the master (or the job) reported an error, 2 usage
// or local spec error, 3 `wait` timed out. The tables and sections it prints
// are tools/cli/ctl_format.h's.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/client/client_security.h"
#include "common/client/client_security_flags.h"
#include "common/client/health_check.h"
#include "common/client/master_client.h"
#include "common/bounded_text.h"
#include "common/file_list.h"
#include "common/spec/job_config.h"
#include "common/spec/job_spec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/mpilearn.pb.h"
#include "tools/cli/ctl_format.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master. Default: $MPILEARN_MASTER if set, "
          "else 127.0.0.1:7070.");
ABSL_FLAG(double, connect_timeout_s, 10,
          "Seconds to wait for the master to answer before giving up.");
ABSL_FLAG(double, rpc_timeout_s, 30, "Deadline of each call to the master.");
ABSL_FLAG(bool, skip_file_check, false,
          "submit: don't check that the spec's data files (and the files its "
          "file lists name) are readable here (for a master and workers on "
          "other hosts).");
ABSL_FLAG(bool, json, false,
          "status, queue: print the job status (without a job id, every "
          "job's status; queue: the queued jobs' in queue order) as JSON "
          "instead of tables.");
ABSL_FLAG(double, timeout_s, 0,
          "wait: give up (exit 3) after this many seconds; 0 waits forever.");
ABSL_FLAG(std::string, reason, "",
          "cancel: why, for the job's message and the master's log.");
ABSL_FLAG(std::string, state, "",
          "list, status: only jobs in these states (comma-separated: queued, "
          "running, completed, failed, cancelled).");

namespace mpilearn::ctl {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;    // the master, the RPC or the job failed
constexpr int kExitUsage = 2;    // bad arguments or an invalid spec
constexpr int kExitTimeout = 3;  // wait ran out of time

constexpr char kDefaultMaster[] = "127.0.0.1:7070";
constexpr absl::Duration kPollInterval = absl::Seconds(1);

constexpr char kUsage[] =
    "MPI Learn control: submit, list, inspect and wait for training jobs;\n"
    "see the queue and check the master's version (docs/cli.md).\n"
    "\n"
    "Usage: mpilearnctl [--master HOST:PORT] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "Commands:\n"
    "  submit SPEC.json   validate a job spec as the master does, check its data\n"
    "                     files (those its file lists name too), queue it;\n"
    "                     prints the job id alone on stdout\n"
    "  list               table of the master's jobs and their owners\n"
    "  status             one row per job: state, epoch, progress, samples/s,\n"
    "                     loss, accuracies, groups (--json: ListJobs as JSON)\n"
    "  status JOB_ID      summary, groups with their step-time breakdown,\n"
    "                     per-epoch history and the last validations\n"
    "                     (--json: the JobStatus message as JSON)\n"
    "  wait JOB_ID        poll until the job completes (exit 0) or fails\n"
    "                     or is cancelled (exit 1); --timeout_s N gives up\n"
    "                     with exit 3\n"
    "  cancel JOB_ID      end a queued or running job as CANCELLED (its\n"
    "                     groups leave; its weights are checkpointed);\n"
    "                     --reason TEXT is kept in its message\n"
    "  delete JOB_ID      remove an ended job from the master and its files\n"
    "                     from the state directory\n"
    "  queue              the queued jobs in the order groups will take them:\n"
    "                     position, owner, priority, study, and why a limit\n"
    "                     holds a job back (--json: the JobStatus messages)\n"
    "  version            this mpilearnctl's release, the master's, and who\n"
    "                     the token is (name and role); exit 1 when the two\n"
    "                     releases differ in major.minor\n"
    "  health [SERVICE]   the master's gRPC health status (grpc.health.v1;\n"
    "                     SERVICE mpilearn.v1.Master or mpilearn.v1.Studies):\n"
    "                     prints SERVING (exit 0) or NOT_SERVING (exit 1);\n"
    "                     needs no token, for probes and scripts\n"
    "\n"
    "list and status follow the master's pages; --state STATE[,STATE] lists\n"
    "only jobs in those states.\n"
    "\n"
    "Examples:\n"
    "  JOB=$(mpilearnctl submit docs/examples/fashion_mnist.json)\n"
    "  mpilearnctl list\n"
    "  mpilearnctl status\n"
    "  mpilearnctl status \"$JOB\"\n"
    "  mpilearnctl status \"$JOB\" --json\n"
    "  mpilearnctl --master 10.0.0.5:7070 wait \"$JOB\" --timeout_s 3600\n"
    "  mpilearnctl list --state running,queued\n"
    "  mpilearnctl queue\n"
    "  mpilearnctl version\n"
    "  mpilearnctl cancel \"$JOB\" --reason 'wrong learning rate'\n"
    "  mpilearnctl delete \"$JOB\"\n"
    "\n"
    "Exit codes: 0 ok, 1 master/RPC error, job failed or versions differ,\n"
    "2 usage or spec error, 3 wait timed out. The master address defaults to\n"
    "$MPILEARN_MASTER, else 127.0.0.1:7070.\n"
    "\n"
    "A master with TLS and tokens (docs/security.md) takes --tls_ca FILE\n"
    "(and --tls_cert/--tls_key for mutual TLS) and --token_file FILE or\n"
    "$MPILEARN_TOKEN.";

// Settings of one invocation, read from the flags by main().
struct Options {
  std::string master;         // host:port
  std::string master_source;  // where `master` came from, for messages
  MasterClient::Options client;
  bool skip_file_check = false;
  bool json = false;
  absl::Duration wait_timeout = absl::InfiniteDuration();
  std::string reason;                 // cancel --reason
  std::vector<v1::JobState> states;   // list/status --state; empty: all
};

int UsageError(absl::string_view message) {
  absl::FPrintF(stderr, "mpilearnctl: %s\nTry 'mpilearnctl --help'.\n",
                message);
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  absl::FPrintF(stderr, "mpilearnctl: %s\n", status.message());
  return kExitError;
}

// Fail for errors of the master or of reaching it. When the master cannot
// be reached, also says where its address came from and how to start one
// there (NOT_FOUND and other errors carry the master's own message).
int FailRpc(const absl::Status& status, const Options& options) {
  PrintMasterError("mpilearnctl", status, {options.master, options.master_source});
  return kExitError;
}

constexpr absl::string_view kOnlyOnWorkers =
    "Workers open data files by these paths; if they exist only on the "
    "workers' hosts, pass --skip_file_check.";

// FailedPrecondition naming `field` when `path` is not a readable file.
absl::Status CheckReadable(absl::string_view field, const std::string& path) {
  std::string problem;
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    problem = std::strerror(errno);
  } else if (S_ISDIR(info.st_mode)) {
    problem = "is a directory";
  } else if (access(path.c_str(), R_OK) != 0) {
    problem = std::strerror(errno);
  }
  if (problem.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": cannot read '", path, "' (", problem, "). ", kOnlyOnWorkers));
}

// Checks that every data file the spec names can be opened from here, the
// files of its file lists included (a list file is read as the workers read
// it), so a typo fails now rather than when a worker group picks the job up.
absl::Status CheckDataFiles(const v1::DataSpec& data) {
  const std::pair<absl::string_view, const std::string*> files[] = {
      {"data.train_images", &data.train_images()},
      {"data.train_labels", &data.train_labels()},
      {"data.validation_images", &data.validation_images()},
      {"data.validation_labels", &data.validation_labels()},
      {"data.test_images", &data.test_images()},
      {"data.test_labels", &data.test_labels()},
  };
  for (const auto& [field, path] : files) {
    if (!path->empty()) MPILEARN_RETURN_IF_ERROR(CheckReadable(field, *path));
  }
  const std::pair<absl::string_view,
                  const google::protobuf::RepeatedPtrField<std::string>*>
      lists[] = {{"train_files", &data.train_files()},
                 {"validation_files", &data.validation_files()},
                 {"test_files", &data.test_files()}};
  for (const auto& [field, entries] : lists) {
    absl::StatusOr<std::vector<std::string>> paths =
        ExpandFileList(field, {entries->begin(), entries->end()});
    if (!paths.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(paths.status().message(), ". ", kOnlyOnWorkers));
    }
    for (size_t i = 0; i < paths->size(); ++i) {
      MPILEARN_RETURN_IF_ERROR(CheckReadable(
          absl::StrCat("data.", field, " (file ", i + 1, " of ", paths->size(),
                       ")"),
          (*paths)[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MasterClient>> ConnectToMaster(
    const Options& options) {
  return MasterClient::Connect(options.master, options.client);
}

int SubmitJob(const std::string& spec_path, const Options& options) {
  // The master's checks, here first: the spec normalized as the master
  // normalizes it, and its strings free of control bytes. The byte limits
  // (mpilearn-master --max_string_bytes, --max_model_mib) are the master's
  // settings, so the master alone applies them.
  absl::StatusOr<JobConfig> config = JobConfig::FromFile(spec_path);
  absl::Status checked = config.status();
  if (checked.ok()) {
    checked = CheckStringFields(config->spec(), "spec",
                                std::numeric_limits<size_t>::max());
  }
  if (!checked.ok()) {
    absl::FPrintF(stderr, "mpilearnctl: %s\n", checked.message());
    return kExitUsage;
  }
  const v1::JobSpec& spec = config->spec();
  if (!options.skip_file_check) {
    absl::Status files = CheckDataFiles(spec.data());
    if (!files.ok()) {
      absl::FPrintF(stderr, "mpilearnctl: %s: %s\n", spec_path,
                    files.message());
      return kExitUsage;
    }
  }
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::string> job_id = (*master)->SubmitJob(spec);
  if (!job_id.ok()) return FailRpc(job_id.status(), options);
  absl::PrintF("%s\n", *job_id);
  return kExitOk;
}

// Says on stderr how many jobs the master left out of its list (each too
// large for a reply on its own).
void NoteLeftOut(uint32_t left_out) {
  if (left_out == 0) return;
  absl::FPrintF(stderr,
                "mpilearnctl: %d job(s) too large to list; `mpilearnctl "
                "status JOB_ID` shows each\n",
                left_out);
}

// Every job in `states` (all when empty), following the master's pages;
// says on stderr how many it left out.
absl::StatusOr<std::vector<v1::JobStatus>> ListAllJobs(
    MasterClient& master, const std::vector<v1::JobState>& states) {
  uint32_t left_out = 0;
  absl::StatusOr<std::vector<v1::JobStatus>> jobs =
      master.ListJobs(states, &left_out);
  if (jobs.ok()) NoteLeftOut(left_out);
  return jobs;
}

int ListJobs(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs =
      ListAllJobs(**master, options.states);
  if (!jobs.ok()) return FailRpc(jobs.status(), options);
  absl::PrintF("%s", FormatJobList(*jobs));
  return kExitOk;
}

int CancelJob(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<v1::JobStatus> job =
      (*master)->CancelJob(job_id, options.reason);
  if (!job.ok()) return FailRpc(job.status(), options);
  absl::PrintF("%s %s\n", job->job_id(), StateName(job->state()));
  return kExitOk;
}

int DeleteJob(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  const absl::Status deleted = (*master)->DeleteJob(job_id);
  if (!deleted.ok()) return FailRpc(deleted, options);
  absl::PrintF("%s deleted\n", job_id);
  return kExitOk;
}

// --- status ----------------------------------------------------------------

// Prints `message` as JSON (field names as in the .proto).
int PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  std::string json;
  const auto converted =
      google::protobuf::util::MessageToJsonString(message, &json, print);
  if (!converted.ok()) {
    return Fail(absl::InternalError(absl::StrCat(
        "cannot print the status as JSON: ", converted.ToString())));
  }
  absl::PrintF("%s", json);
  if (!absl::EndsWith(json, "\n")) absl::PrintF("\n");
  return kExitOk;
}

// Prints `jobs` as a ListJobsResponse in JSON ({"jobs": [...]}).
int PrintJobsJson(std::vector<v1::JobStatus> jobs) {
  v1::ListJobsResponse response;
  for (v1::JobStatus& job : jobs) *response.add_jobs() = std::move(job);
  return PrintJson(response);
}

// Whether a listed job (ListJobs leaves out history and validations) may
// have history or validations worth a GetJobStatus call.
bool MayHaveHistory(const v1::JobStatus& job) {
  return job.epochs_done() > 0 || job.updates_applied() > 0 ||
         job.samples_trained() > 0;
}

int ShowAllJobs(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs =
      ListAllJobs(**master, options.states);
  if (!jobs.ok()) return FailRpc(jobs.status(), options);
  if (options.json) return PrintJobsJson(*std::move(jobs));
  if (jobs->empty()) {
    absl::PrintF("no jobs on the master at %s\n", options.master);
    return kExitOk;
  }
  // The latest samples/s, loss and accuracy come from the history and the
  // validations, which only GetJobStatus returns.
  for (v1::JobStatus& job : *jobs) {
    if (!MayHaveHistory(job)) continue;
    absl::StatusOr<v1::JobStatus> detailed =
        (*master)->GetJobStatus(job.job_id());
    if (detailed.ok()) {
      job = *std::move(detailed);
    } else if (!absl::IsNotFound(detailed.status())) {
      return FailRpc(detailed.status(), options);
    }
  }
  absl::PrintF("%s", FormatJobsTable(*jobs));
  return kExitOk;
}

int ShowStatus(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<v1::JobStatus> job = (*master)->GetJobStatus(job_id);
  if (!job.ok()) return FailRpc(job.status(), options);
  if (options.json) return PrintJson(*job);
  absl::PrintF("%s", FormatJobStatus(*job));
  return kExitOk;
}

int WaitForJob(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  const absl::Time deadline = absl::Now() + options.wait_timeout;
  while (true) {
    absl::StatusOr<v1::JobStatus> job = (*master)->GetJobStatus(job_id);
    if (!job.ok()) return FailRpc(job.status(), options);
    if (job->state() == v1::JOB_STATE_COMPLETED) {
      if (job->has_test_accuracy()) {
        absl::PrintF("test_accuracy=%.4f\n", job->test_accuracy());
      }
      // Regression losses: test_mae and test_mse.
      for (const char* name : {"test_mae", "test_mse"}) {
        auto it = job->test_metrics().find(name);
        if (it != job->test_metrics().end()) {
          absl::PrintF("%s=%.4f\n", name, it->second);
        }
      }
      return kExitOk;
    }
    if (job->state() == v1::JOB_STATE_FAILED ||
        job->state() == v1::JOB_STATE_CANCELLED) {
      absl::FPrintF(stderr, "mpilearnctl: job %s %s: %s\n", job_id,
                    job->state() == v1::JOB_STATE_FAILED ? "failed"
                                                         : "was cancelled",
                    job->message().empty() ? "(no message)" : job->message());
      return kExitError;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      absl::FPrintF(stderr,
                    "mpilearnctl: job %s still %s after %s (epoch %d/%d)\n",
                    job_id, StateName(job->state()),
                    absl::FormatDuration(options.wait_timeout),
                    job->epochs_done(), job->spec().epochs());
      return kExitTimeout;
    }
    absl::SleepFor(std::min(kPollInterval, deadline - now));
  }
}

// The QUEUED jobs in the order groups will take them.
int ShowQueue(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs =
      ListAllJobs(**master, {v1::JOB_STATE_QUEUED});
  if (!jobs.ok()) return FailRpc(jobs.status(), options);
  std::vector<v1::JobStatus> queued = QueuedInOrder(*jobs);
  if (options.json) return PrintJobsJson(std::move(queued));
  if (queued.empty()) {
    absl::PrintF("no queued jobs on the master at %s\n", options.master);
    return kExitOk;
  }
  absl::PrintF("%s", FormatQueue(queued));
  return kExitOk;
}

// This mpilearnctl's release, the master's (GetServerInfo) and who the
// token is; exit 1 when the releases differ in major.minor, or the master
// predates GetServerInfo.
int ShowVersion(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.client.rpc_timeout));
  v1::ServerInfo info;
  const grpc::Status status = (*master)->stub().GetServerInfo(
      &context, v1::GetServerInfoRequest(), &info);
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return Fail(absl::FailedPreconditionError(
        VersionMismatchMessage(kMpiLearnVersion, "", options.master)));
  }
  if (!status.ok()) return FailRpc(FromGrpcStatus(status), options);
  absl::PrintF("%s", FormatVersions(kMpiLearnVersion, info, options.master));
  if (!SameMajorMinor(kMpiLearnVersion, info.version())) {
    return Fail(absl::FailedPreconditionError(VersionMismatchMessage(
        kMpiLearnVersion, info.version(), options.master)));
  }
  return kExitOk;
}

// The master's health (grpc.health.v1.Health/Check) on stdout; exit 0 only
// for SERVING. A master that does not answer is an RPC error (exit 1).
int ShowHealth(const std::string& service, const Options& options) {
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateMasterChannel(options.master, options.client.security, args);
  if (!channel.ok()) return UsageError(channel.status().message());
  absl::StatusOr<ServingStatus> serving =
      CheckHealth(*channel, service, options.client.rpc_timeout);
  if (serving.status().code() == absl::StatusCode::kNotFound) {
    return Fail(absl::NotFoundError(absl::StrCat(
        "the master has no health status for service '", service,
        "'; it reports the whole master (no SERVICE), mpilearn.v1.Master and "
        "mpilearn.v1.Studies")));
  }
  if (!serving.ok()) return FailRpc(serving.status(), options);
  absl::PrintF("%s\n", ServingStatusName(*serving));
  return *serving == ServingStatus::kServing ? kExitOk : kExitError;
}

// Dispatches `args` (the positional arguments: command and its operands).
int Run(const std::vector<std::string>& args, const Options& options) {
  if (args.empty()) return UsageError("missing command");
  const std::string& command = args[0];
  struct Command {
    absl::string_view name;
    absl::string_view operand;  // empty: takes none
    bool optional;              // the operand may be left out
  };
  static constexpr Command kCommands[] = {
      {"submit", "SPEC.json", false},
      {"list", "", false},
      {"status", "JOB_ID", true},
      {"wait", "JOB_ID", false},
      {"cancel", "JOB_ID", false},
      {"delete", "JOB_ID", false},
      {"queue", "", false},
      {"version", "", false},
      {"health", "SERVICE", true},
  };
  const Command* found = nullptr;
  for (const Command& c : kCommands) {
    if (c.name == command) found = &c;
  }
  if (found == nullptr) {
    return UsageError(absl::StrCat("unknown command '", command,
                                   "'; commands: submit, list, status, wait, "
                                   "cancel, delete, queue, version, health"));
  }
  const size_t operands = found->operand.empty() ? 0 : 1;
  const size_t required = found->optional ? 0 : operands;
  if (args.size() < required + 1) {
    return UsageError(absl::StrCat("missing argument: mpilearnctl ", command,
                                   " ", found->operand));
  }
  if (args.size() > operands + 1) {
    return UsageError(absl::StrCat("unexpected argument '", args[operands + 1],
                                   "' after '", command, "'"));
  }
  if (command == "submit") return SubmitJob(args[1], options);
  if (command == "list") return ListJobs(options);
  if (command == "queue") return ShowQueue(options);
  if (command == "version") return ShowVersion(options);
  if (command == "cancel") return CancelJob(args[1], options);
  if (command == "delete") return DeleteJob(args[1], options);
  if (command == "health") return ShowHealth(args.size() == 1 ? "" : args[1], options);
  if (command == "status") {
    return args.size() == 1 ? ShowAllJobs(options)
                            : ShowStatus(args[1], options);
  }
  return WaitForJob(args[1], options);
}


// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  const MasterAddress master =
      ResolveMasterAddress(absl::GetFlag(FLAGS_master), kDefaultMaster);
  options.master = master.address;
  options.master_source = master.source;
  const double connect_s = absl::GetFlag(FLAGS_connect_timeout_s);
  const double rpc_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  const double wait_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(connect_s > 0)) {
    return absl::InvalidArgumentError("--connect_timeout_s must be > 0");
  }
  if (!(rpc_s > 0)) {
    return absl::InvalidArgumentError("--rpc_timeout_s must be > 0");
  }
  if (!(wait_s >= 0)) {
    return absl::InvalidArgumentError("--timeout_s must be >= 0");
  }
  options.client.connect_timeout = absl::Seconds(connect_s);
  options.client.rpc_timeout = absl::Seconds(rpc_s);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromFlags();
  if (!security.ok()) return security.status();
  options.client.security = *std::move(security);
  options.skip_file_check = absl::GetFlag(FLAGS_skip_file_check);
  options.json = absl::GetFlag(FLAGS_json);
  if (wait_s > 0) options.wait_timeout = absl::Seconds(wait_s);
  options.reason = absl::GetFlag(FLAGS_reason);
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_state), ',', absl::SkipEmpty())) {
    v1::JobState state;
    if (!v1::JobState_Parse(
            absl::StrCat("JOB_STATE_",
                         absl::AsciiStrToUpper(absl::StripAsciiWhitespace(name))),
            &state) ||
        state == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--state: unknown state '", name,
          "'; states are queued, running, completed, failed, cancelled"));
    }
    options.states.push_back(state);
  }
  return options;
}

}  // namespace
}  // namespace mpilearn::ctl

int main(int argc, char** argv) {
  namespace ctl = mpilearn::ctl;
  absl::SetProgramUsageMessage(ctl::kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "tools/cli/mpilearnctl.cc") ||
           absl::EndsWith(path, mpilearn::kClientSecurityFlagsSource);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  const std::string undefined = mpilearn::FindUndefinedFlag(argc, argv);
  if (!undefined.empty()) {
    return ctl::UsageError(absl::StrCat("unknown flag '", undefined, "'"));
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::StatusOr<ctl::Options> options = ctl::OptionsFromFlags();
  if (!options.ok()) return ctl::UsageError(options.status().message());
  return ctl::Run(
      std::vector<std::string>(positional.begin() + 1, positional.end()),
      *options);
}
