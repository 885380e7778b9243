// mpilearnctl: submit, list, inspect and wait for jobs on mpilearn-master.
//
//   JOB=$(mpilearnctl submit docs/examples/fashion_mnist.json)
//   mpilearnctl wait "$JOB" --timeout_s 3600
//
// main() only parses flags; Run() dispatches the subcommand and returns the
// exit code: 0 success, 1 the master (or the job) reported an error, 2 usage
// or local spec error, 3 `wait` timed out.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/job_spec.h"
#include "common/master_client.h"
#include "google/protobuf/util/json_util.h"
#include "proto/mpilearn.pb.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master. Default: $MPILEARN_MASTER if set, "
          "else 127.0.0.1:7070.");
ABSL_FLAG(double, connect_timeout_s, 10,
          "Seconds to wait for the master to answer before giving up.");
ABSL_FLAG(double, rpc_timeout_s, 30, "Deadline of each call to the master.");
ABSL_FLAG(bool, skip_file_check, false,
          "submit: don't check that the spec's data files are readable here "
          "(for a master and workers on other hosts).");
ABSL_FLAG(bool, json, false, "status: print the job status as JSON.");
ABSL_FLAG(double, timeout_s, 0,
          "wait: give up (exit 3) after this many seconds; 0 waits forever.");

namespace mpilearn::ctl {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;    // the master, the RPC or the job failed
constexpr int kExitUsage = 2;    // bad arguments or an invalid spec
constexpr int kExitTimeout = 3;  // wait ran out of time

constexpr char kDefaultMaster[] = "127.0.0.1:7070";
constexpr absl::Duration kPollInterval = absl::Seconds(1);

constexpr char kUsage[] =
    "MPI Learn control: submit, list, inspect and wait for training jobs.\n"
    "\n"
    "Usage: mpilearnctl [--master HOST:PORT] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "Commands:\n"
    "  submit SPEC.json   validate a job spec, check its data files, queue it;\n"
    "                     prints the job id alone on stdout\n"
    "  list               table of the master's jobs\n"
    "  status JOB_ID      state, progress, groups and per-epoch history\n"
    "                     (--json: the JobStatus message as JSON)\n"
    "  wait JOB_ID        poll until the job completes (exit 0) or fails\n"
    "                     (exit 1); --timeout_s N gives up with exit 3\n"
    "\n"
    "Examples:\n"
    "  JOB=$(mpilearnctl submit docs/examples/fashion_mnist.json)\n"
    "  mpilearnctl list\n"
    "  mpilearnctl status \"$JOB\" --json\n"
    "  mpilearnctl --master 10.0.0.5:7070 wait \"$JOB\" --timeout_s 3600\n"
    "\n"
    "Exit codes: 0 ok, 1 master/RPC error or job failed, 2 usage or spec\n"
    "error, 3 wait timed out. The master address defaults to\n"
    "$MPILEARN_MASTER, else 127.0.0.1:7070.";

// Settings of one invocation, read from the flags by main().
struct Options {
  std::string master;  // host:port
  MasterClient::Options client;
  bool skip_file_check = false;
  bool json = false;
  absl::Duration wait_timeout = absl::InfiniteDuration();
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

// "JOB_STATE_RUNNING" -> "RUNNING".
std::string StateName(v1::JobState state) {
  return std::string(
      absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

// Left-aligned text columns, each as wide as its widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }

  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void Print(absl::string_view indent = "") const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      widths.resize(std::max(widths.size(), row.size()), 0);
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    for (const auto& row : rows_) {
      std::string line(indent);
      for (size_t i = 0; i < row.size(); ++i) {
        absl::StrAppend(&line, row[i]);
        if (i + 1 < row.size()) {
          line.append(widths[i] - row[i].size() + 2, ' ');
        }
      }
      absl::PrintF("%s\n", line);
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Checks that every data file the spec names can be opened from here, so a
// typo fails now rather than when a worker group picks the job up.
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
    if (path->empty()) continue;
    std::string problem;
    struct stat info;
    if (stat(path->c_str(), &info) != 0) {
      problem = std::strerror(errno);
    } else if (S_ISDIR(info.st_mode)) {
      problem = "is a directory";
    } else if (access(path->c_str(), R_OK) != 0) {
      problem = std::strerror(errno);
    }
    if (!problem.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": cannot read '", *path, "' (", problem,
          "). Workers open data files by these paths; if they exist only on "
          "the workers' hosts, pass --skip_file_check."));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MasterClient>> ConnectToMaster(
    const Options& options) {
  return MasterClient::Connect(options.master, options.client);
}

int SubmitJob(const std::string& spec_path, const Options& options) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(spec_path);
  if (!spec.ok()) {
    absl::FPrintF(stderr, "mpilearnctl: %s\n", spec.status().message());
    return kExitUsage;
  }
  if (!options.skip_file_check) {
    absl::Status files = CheckDataFiles(spec->data());
    if (!files.ok()) {
      absl::FPrintF(stderr, "mpilearnctl: %s: %s\n", spec_path,
                    files.message());
      return kExitUsage;
    }
  }
  auto master = ConnectToMaster(options);
  if (!master.ok()) return Fail(master.status());
  absl::StatusOr<std::string> job_id = (*master)->SubmitJob(*spec);
  if (!job_id.ok()) return Fail(job_id.status());
  absl::PrintF("%s\n", *job_id);
  return kExitOk;
}

int ListJobs(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return Fail(master.status());
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = (*master)->ListJobs();
  if (!jobs.ok()) return Fail(jobs.status());
  Table table({"JOB", "STATE", "NAME", "MODEL", "ALGORITHM", "EPOCHS",
               "UPDATES", "TEST_ACC"});
  for (const v1::JobStatus& job : *jobs) {
    table.AddRow({
        job.job_id(),
        StateName(job.state()),
        job.spec().name().empty() ? "-" : job.spec().name(),
        job.spec().model().name(),
        job.spec().algorithm(),
        absl::StrCat(job.epochs_done(), "/", job.spec().epochs()),
        absl::StrCat(job.updates_applied()),
        job.has_test_accuracy() ? absl::StrFormat("%.4f", job.test_accuracy())
                                : "-",
    });
  }
  table.Print();
  return kExitOk;
}

void PrintStatus(const v1::JobStatus& job) {
  const v1::JobSpec& spec = job.spec();
  Table summary({"job", job.job_id()});
  if (!spec.name().empty()) summary.AddRow({"name", spec.name()});
  summary.AddRow({"state", StateName(job.state())});
  if (!job.message().empty()) summary.AddRow({"message", job.message()});
  summary.AddRow({"model", spec.model().name()});
  summary.AddRow(
      {"training", absl::StrFormat("%s, optimizer %s (lr %g), batch %d per "
                                   "rank, sync every %d",
                                   spec.algorithm(), spec.optimizer().name(),
                                   spec.optimizer().learning_rate(),
                                   spec.batch_size(), spec.sync_every())});
  summary.AddRow(
      {"epochs", absl::StrCat(job.epochs_done(), "/", spec.epochs())});
  summary.AddRow({"version", absl::StrCat(job.version())});
  summary.AddRow({"parameters", absl::StrCat(job.parameters())});
  summary.AddRow({"updates", absl::StrCat(job.updates_applied())});
  summary.AddRow({"samples", absl::StrCat(job.samples_trained())});
  if (job.has_test_loss()) {
    summary.AddRow({"test_loss", absl::StrFormat("%.4f", job.test_loss())});
  }
  if (job.has_test_accuracy()) {
    summary.AddRow(
        {"test_accuracy", absl::StrFormat("%.4f", job.test_accuracy())});
  }
  summary.Print();

  absl::PrintF("\ngroups:%s\n", job.groups().empty() ? " none" : "");
  if (!job.groups().empty()) {
    Table groups({"GROUP", "RANKS", "HOST", "ALIVE", "SECONDS_SINCE_SEEN"});
    for (const v1::GroupInfo& group : job.groups()) {
      groups.AddRow({group.group_id(), absl::StrCat(group.ranks()),
                     group.host(), group.alive() ? "yes" : "no",
                     absl::StrFormat("%.1f", group.seconds_since_seen())});
    }
    groups.Print("  ");
  }

  absl::PrintF("\nhistory:%s\n", job.history().empty() ? " none" : "");
  if (!job.history().empty()) {
    Table history({"EPOCH", "TRAIN_LOSS", "VAL_LOSS", "VAL_ACC", "SAMPLES/S",
                   "SECONDS"});
    for (const v1::EpochRecord& epoch : job.history()) {
      history.AddRow({absl::StrCat(epoch.epoch()),
                      absl::StrFormat("%.4f", epoch.train_loss()),
                      absl::StrFormat("%.4f", epoch.val_loss()),
                      absl::StrFormat("%.4f", epoch.val_accuracy()),
                      absl::StrFormat("%.0f", epoch.samples_per_second()),
                      absl::StrFormat("%.1f", epoch.wall_seconds())});
    }
    history.Print("  ");
  }
}

int ShowStatus(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return Fail(master.status());
  absl::StatusOr<v1::JobStatus> job = (*master)->GetJobStatus(job_id);
  if (!job.ok()) return Fail(job.status());
  if (options.json) {
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    print.add_whitespace = true;
    std::string json;
    const auto converted =
        google::protobuf::util::MessageToJsonString(*job, &json, print);
    if (!converted.ok()) {
      return Fail(absl::InternalError(absl::StrCat(
          "cannot print the status as JSON: ", converted.ToString())));
    }
    absl::PrintF("%s", json);
    if (!absl::EndsWith(json, "\n")) absl::PrintF("\n");
    return kExitOk;
  }
  PrintStatus(*job);
  return kExitOk;
}

int WaitForJob(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return Fail(master.status());
  const absl::Time deadline = absl::Now() + options.wait_timeout;
  while (true) {
    absl::StatusOr<v1::JobStatus> job = (*master)->GetJobStatus(job_id);
    if (!job.ok()) return Fail(job.status());
    if (job->state() == v1::JOB_STATE_COMPLETED) {
      if (job->has_test_accuracy()) {
        absl::PrintF("test_accuracy=%.4f\n", job->test_accuracy());
      }
      return kExitOk;
    }
    if (job->state() == v1::JOB_STATE_FAILED) {
      absl::FPrintF(stderr, "mpilearnctl: job %s failed: %s\n", job_id,
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

// Dispatches `args` (the positional arguments: command and its operands).
int Run(const std::vector<std::string>& args, const Options& options) {
  if (args.empty()) return UsageError("missing command");
  const std::string& command = args[0];
  struct Command {
    absl::string_view name;
    absl::string_view operand;  // empty: takes none
  };
  static constexpr Command kCommands[] = {
      {"submit", "SPEC.json"},
      {"list", ""},
      {"status", "JOB_ID"},
      {"wait", "JOB_ID"},
  };
  const Command* found = nullptr;
  for (const Command& c : kCommands) {
    if (c.name == command) found = &c;
  }
  if (found == nullptr) {
    return UsageError(absl::StrCat("unknown command '", command,
                                   "'; commands: submit, list, status, wait"));
  }
  const size_t operands = found->operand.empty() ? 0 : 1;
  if (args.size() < operands + 1) {
    return UsageError(absl::StrCat("missing argument: mpilearnctl ", command,
                                   " ", found->operand));
  }
  if (args.size() > operands + 1) {
    return UsageError(absl::StrCat("unexpected argument '", args[operands + 1],
                                   "' after '", command, "'"));
  }
  if (command == "submit") return SubmitJob(args[1], options);
  if (command == "list") return ListJobs(options);
  if (command == "status") return ShowStatus(args[1], options);
  return WaitForJob(args[1], options);
}


// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  options.master = absl::GetFlag(FLAGS_master);
  if (options.master.empty()) {
    const char* env = std::getenv("MPILEARN_MASTER");
    options.master = (env != nullptr && *env != '\0') ? env : kDefaultMaster;
  }
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
  options.skip_file_check = absl::GetFlag(FLAGS_skip_file_check);
  options.json = absl::GetFlag(FLAGS_json);
  if (wait_s > 0) options.wait_timeout = absl::Seconds(wait_s);
  return options;
}

}  // namespace
}  // namespace mpilearn::ctl

int main(int argc, char** argv) {
  namespace ctl = mpilearn::ctl;
  absl::SetProgramUsageMessage(ctl::kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "tools/mpilearnctl.cc");
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
