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
#include <cstdint>
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
ABSL_FLAG(bool, json, false,
          "status: print the job status (or, without a job id, every job's "
          "status) as JSON instead of tables.");
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
    "  status             one row per job: state, epoch, progress, samples/s,\n"
    "                     loss, accuracies, groups (--json: ListJobs as JSON)\n"
    "  status JOB_ID      summary, groups with their step-time breakdown,\n"
    "                     per-epoch history and the last validations\n"
    "                     (--json: the JobStatus message as JSON)\n"
    "  wait JOB_ID        poll until the job completes (exit 0) or fails\n"
    "                     (exit 1); --timeout_s N gives up with exit 3\n"
    "\n"
    "Examples:\n"
    "  JOB=$(mpilearnctl submit docs/examples/fashion_mnist.json)\n"
    "  mpilearnctl list\n"
    "  mpilearnctl status\n"
    "  mpilearnctl status \"$JOB\"\n"
    "  mpilearnctl status \"$JOB\" --json\n"
    "  mpilearnctl --master 10.0.0.5:7070 wait \"$JOB\" --timeout_s 3600\n"
    "\n"
    "Exit codes: 0 ok, 1 master/RPC error or job failed, 2 usage or spec\n"
    "error, 3 wait timed out. The master address defaults to\n"
    "$MPILEARN_MASTER, else 127.0.0.1:7070.";

// Settings of one invocation, read from the flags by main().
struct Options {
  std::string master;         // host:port
  std::string master_source;  // where `master` came from, for messages
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

// Fail for errors of the master or of reaching it. When the master cannot
// be reached, also says where its address came from and how to start one
// there (NOT_FOUND and other errors carry the master's own message).
int FailRpc(const absl::Status& status, const Options& options) {
  Fail(status);
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    absl::FPrintF(stderr,
                  "mpilearnctl: address %s taken from %s; start a master "
                  "there with `mpilearn-master --listen %s --state_dir DIR` "
                  "(under systemd: deploy/README.md)\n",
                  options.master, options.master_source, options.master);
  }
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
      // An empty last cell would leave the padding of the one before it.
      line.erase(line.find_last_not_of(' ') + 1);
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
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::string> job_id = (*master)->SubmitJob(*spec);
  if (!job_id.ok()) return FailRpc(job_id.status(), options);
  absl::PrintF("%s\n", *job_id);
  return kExitOk;
}

int ListJobs(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = (*master)->ListJobs();
  if (!jobs.ok()) return FailRpc(jobs.status(), options);
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

// --- status ----------------------------------------------------------------

constexpr char kNone[] = "-";
constexpr int kValidationsShown = 5;

std::string Fixed(double value, int digits) {
  return absl::StrFormat("%.*f", digits, value);
}

// "40.0%" of all the job's epochs, or "-" while the master does not know the
// samples per epoch yet (no group has asked for data).
std::string ProgressPercent(const v1::JobStatus& job) {
  const double total = static_cast<double>(job.samples_per_epoch()) *
                       static_cast<double>(job.spec().epochs());
  if (!(total > 0)) return kNone;
  const double percent =
      std::clamp(100.0 * static_cast<double>(job.samples_trained()) / total,
                 0.0, 100.0);
  return absl::StrFormat("%.1f%%", percent);
}

// Whether a history record carries a validation (groups report one per
// epoch unless the job validates in a pool only).
bool HasValidation(const v1::EpochRecord& epoch) {
  return epoch.val_loss() != 0 || epoch.val_accuracy() != 0;
}

// The live training loss, else the last epoch's mean.
std::string LatestTrainLoss(const v1::JobStatus& job) {
  if (job.has_train_loss()) return Fixed(job.train_loss(), 4);
  if (!job.history().empty()) {
    return Fixed(job.history(job.history_size() - 1).train_loss(), 4);
  }
  return kNone;
}

// The latest validation (group or pool), else the last epoch's.
std::string LatestValAccuracy(const v1::JobStatus& job) {
  if (!job.validations().empty()) {
    return Fixed(job.validations(job.validations_size() - 1).val_accuracy(),
                 4);
  }
  if (!job.history().empty()) {
    const v1::EpochRecord& last = job.history(job.history_size() - 1);
    if (HasValidation(last)) return Fixed(last.val_accuracy(), 4);
  }
  return kNone;
}

std::string LatestSamplesPerSecond(const v1::JobStatus& job) {
  if (job.history().empty()) return kNone;
  return Fixed(job.history(job.history_size() - 1).samples_per_second(), 0);
}

// "2 (4 ranks)": the alive groups serving the job and their ranks.
std::string AliveGroups(const v1::JobStatus& job) {
  int groups = 0;
  int64_t ranks = 0;
  for (const v1::GroupInfo& group : job.groups()) {
    if (!group.alive()) continue;
    ++groups;
    ranks += group.ranks();
  }
  if (groups == 0) return "0";
  return absl::StrFormat("%d (%d rank%s)", groups, ranks,
                         ranks == 1 ? "" : "s");
}

std::string TestAccuracy(const v1::JobStatus& job) {
  return job.has_test_accuracy() ? Fixed(job.test_accuracy(), 4) : kNone;
}

// The master's optimizer, or the rule easgd and gem apply instead.
std::string OptimizerText(const v1::JobSpec& spec) {
  if (spec.algorithm() == "easgd") {
    const v1::OptimizerSpec& local = spec.easgd().worker_optimizer();
    return absl::StrFormat("elastic averaging (alpha %g); ranks step with %s "
                           "(lr %g, momentum %g)",
                           spec.easgd().alpha(), local.name(),
                           local.learning_rate(), local.momentum());
  }
  if (spec.algorithm() == "gem") {
    return absl::StrFormat(
        "gradient energy matching (lr %g, momentum %g, kappa %g)",
        spec.gem().learning_rate(), spec.gem().momentum(), spec.gem().kappa());
  }
  return absl::StrFormat("%s (lr %g)", spec.optimizer().name(),
                         spec.optimizer().learning_rate());
}

std::string ModelText(const v1::ModelSpec& model) {
  if (model.name() == "mlp" && !model.hidden().empty()) {
    return absl::StrCat(model.name(), " (hidden ",
                        absl::StrJoin(model.hidden(), ","), ")");
  }
  if (model.name() == "cnn" && !model.channels().empty()) {
    return absl::StrCat(model.name(), " (channels ",
                        absl::StrJoin(model.channels(), ","), ", dense ",
                        model.dense(), ")");
  }
  return model.name();
}

// One row per job: `mpilearnctl status` without a job id.
void PrintJobsTable(const std::vector<v1::JobStatus>& jobs) {
  Table table({"JOB", "NAME", "STATE", "EPOCH", "PROGRESS", "SAMPLES/S",
               "LOSS", "VAL_ACC", "TEST_ACC", "GROUPS"});
  for (const v1::JobStatus& job : jobs) {
    table.AddRow({
        job.job_id(),
        job.spec().name().empty() ? kNone : job.spec().name(),
        StateName(job.state()),
        absl::StrCat(job.epochs_done(), "/", job.spec().epochs()),
        ProgressPercent(job),
        LatestSamplesPerSecond(job),
        LatestTrainLoss(job),
        LatestValAccuracy(job),
        TestAccuracy(job),
        AliveGroups(job),
    });
  }
  table.Print();
}

// The step-time shares of a group's telemetry, in the order DATA% COMPUTE%
// MASTER% MPI%; "-" for each when the group reported none.
std::vector<std::string> StepShares(const v1::GroupInfo& group) {
  const v1::GroupTelemetry& t = group.telemetry();
  const double parts[] = {t.data_seconds(), t.compute_seconds(),
                          t.master_seconds(), t.mpi_seconds()};
  double sum = 0;
  for (double part : parts) sum += std::max(part, 0.0);
  std::vector<std::string> shares;
  for (double part : parts) {
    shares.push_back(group.has_telemetry() && sum > 0
                         ? absl::StrFormat("%.1f", 100.0 *
                                                       std::max(part, 0.0) /
                                                       sum)
                         : kNone);
  }
  return shares;
}

// The detailed view: `mpilearnctl status JOB_ID`.
void PrintStatus(const v1::JobStatus& job) {
  const v1::JobSpec& spec = job.spec();
  Table summary({"job", job.job_id()});
  if (!spec.name().empty()) summary.AddRow({"name", spec.name()});
  summary.AddRow({"state", StateName(job.state())});
  if (!job.stop_reason().empty()) {
    summary.AddRow({"stop_reason", job.stop_reason()});
  }
  if (!job.message().empty()) summary.AddRow({"message", job.message()});
  summary.AddRow({"algorithm", spec.algorithm()});
  summary.AddRow({"model", ModelText(spec.model())});
  summary.AddRow({"optimizer", OptimizerText(spec)});
  summary.AddRow(
      {"batch", absl::StrFormat("%d per rank, sync every %d batch%s",
                                spec.batch_size(), spec.sync_every(),
                                spec.sync_every() == 1 ? "" : "es")});
  summary.AddRow(
      {"epochs", absl::StrCat(job.epochs_done(), "/", spec.epochs())});
  if (job.samples_per_epoch() > 0) {
    summary.AddRow(
        {"progress",
         absl::StrFormat("%s (%d of %d samples)", ProgressPercent(job),
                         job.samples_trained(),
                         job.samples_per_epoch() *
                             static_cast<uint64_t>(spec.epochs()))});
  } else {
    summary.AddRow({"progress",
                    absl::StrFormat("%d samples trained (samples per epoch "
                                    "not known until a group asks for data)",
                                    job.samples_trained())});
  }
  summary.AddRow({"train_loss", LatestTrainLoss(job)});
  summary.AddRow({"version", absl::StrCat(job.version())});
  summary.AddRow(
      {"updates", absl::StrFormat("%d applied, %d units requeued",
                                  job.updates_applied(),
                                  job.units_requeued())});
  summary.AddRow({"parameters", absl::StrCat(job.parameters())});
  std::string staleness = absl::StrFormat(
      "mean %.2f, max %d, rejected %d", job.mean_staleness(),
      job.max_staleness_seen(), job.stale_rejected());
  if (spec.max_staleness() > 0) {
    absl::StrAppend(&staleness, " (max_staleness ", spec.max_staleness(), ")");
  }
  summary.AddRow({"staleness", staleness});
  summary.AddRow({"snapshots",
                  absl::StrFormat("%d published, %d skipped",
                                  job.snapshots_published(),
                                  job.snapshots_skipped())});
  summary.AddRow({"checkpoint", job.checkpoint_version() > 0
                                    ? absl::StrCat("version ",
                                                   job.checkpoint_version())
                                    : "none yet"});
  if (job.has_best_metric_value()) {
    summary.AddRow({"best", absl::StrCat(spec.checkpoint().best_metric(), " ",
                                         Fixed(job.best_metric_value(), 4))});
  }
  if (job.has_test_loss()) {
    summary.AddRow({"test_loss", Fixed(job.test_loss(), 4)});
  }
  if (job.has_test_accuracy()) {
    summary.AddRow({"test_accuracy", Fixed(job.test_accuracy(), 4)});
  }
  summary.Print();

  absl::PrintF("\nGROUPS\n");
  if (job.groups().empty()) {
    absl::PrintF("  none\n");
  } else {
    Table groups({"GROUP", "RANKS", "HOST", "ALIVE", "SEEN", "UNITS",
                  "SAMPLES", "UPDATES", "DATA%", "COMPUTE%", "MASTER%",
                  "MPI%"});
    for (const v1::GroupInfo& group : job.groups()) {
      std::vector<std::string> row = {
          group.group_id(),
          absl::StrCat(group.ranks()),
          group.host().empty() ? kNone : group.host(),
          group.alive() ? "yes" : "no",
          absl::StrFormat("%.1fs", group.seconds_since_seen()),
          absl::StrCat(group.units_completed()),
          absl::StrCat(group.samples_trained()),
          absl::StrCat(group.updates_applied()),
      };
      for (std::string& share : StepShares(group)) {
        row.push_back(std::move(share));
      }
      groups.AddRow(std::move(row));
    }
    groups.Print("  ");
  }

  absl::PrintF("\nEPOCHS\n");
  if (job.history().empty()) {
    absl::PrintF("  none completed yet\n");
  } else {
    Table history({"EPOCH", "TRAIN_LOSS", "VAL_LOSS", "VAL_ACC", "SAMPLES/S",
                   "SECONDS"});
    for (const v1::EpochRecord& epoch : job.history()) {
      const bool validated = HasValidation(epoch);
      history.AddRow({absl::StrCat(epoch.epoch()),
                      Fixed(epoch.train_loss(), 4),
                      validated ? Fixed(epoch.val_loss(), 4) : kNone,
                      validated ? Fixed(epoch.val_accuracy(), 4) : kNone,
                      Fixed(epoch.samples_per_second(), 0),
                      Fixed(epoch.wall_seconds(), 1)});
    }
    history.Print("  ");
  }

  const int shown = std::min(job.validations_size(), kValidationsShown);
  if (shown < job.validations_size()) {
    absl::PrintF("\nVALIDATIONS (last %d of %d)\n", shown,
                 job.validations_size());
  } else {
    absl::PrintF("\nVALIDATIONS\n");
  }
  if (shown == 0) {
    absl::PrintF("  none yet\n");
  } else {
    Table validations({"VERSION", "EPOCH", "VAL_LOSS", "VAL_ACC", "SOURCE"});
    for (int i = job.validations_size() - shown; i < job.validations_size();
         ++i) {
      const v1::ValidationRecord& record = job.validations(i);
      validations.AddRow(
          {absl::StrCat(record.version()), absl::StrCat(record.epoch()),
           Fixed(record.val_loss(), 4), Fixed(record.val_accuracy(), 4),
           record.source().empty() ? kNone : record.source()});
    }
    validations.Print("  ");
  }
}

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

// Whether a listed job (ListJobs leaves out history and validations) may
// have history or validations worth a GetJobStatus call.
bool MayHaveHistory(const v1::JobStatus& job) {
  return job.epochs_done() > 0 || job.updates_applied() > 0 ||
         job.samples_trained() > 0;
}

int ShowAllJobs(const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = (*master)->ListJobs();
  if (!jobs.ok()) return FailRpc(jobs.status(), options);
  if (options.json) {
    v1::ListJobsResponse response;
    for (v1::JobStatus& job : *jobs) *response.add_jobs() = std::move(job);
    return PrintJson(response);
  }
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
  PrintJobsTable(*jobs);
  return kExitOk;
}

int ShowStatus(const std::string& job_id, const Options& options) {
  auto master = ConnectToMaster(options);
  if (!master.ok()) return FailRpc(master.status(), options);
  absl::StatusOr<v1::JobStatus> job = (*master)->GetJobStatus(job_id);
  if (!job.ok()) return FailRpc(job.status(), options);
  if (options.json) return PrintJson(*job);
  PrintStatus(*job);
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
    bool optional;              // the operand may be left out
  };
  static constexpr Command kCommands[] = {
      {"submit", "SPEC.json", false},
      {"list", "", false},
      {"status", "JOB_ID", true},
      {"wait", "JOB_ID", false},
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
  if (command == "status") {
    return args.size() == 1 ? ShowAllJobs(options)
                            : ShowStatus(args[1], options);
  }
  return WaitForJob(args[1], options);
}


// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  options.master = absl::GetFlag(FLAGS_master);
  options.master_source = "--master";
  if (options.master.empty()) {
    const char* env = std::getenv("MPILEARN_MASTER");
    if (env != nullptr && *env != '\0') {
      options.master = env;
      options.master_source = "$MPILEARN_MASTER";
    } else {
      options.master = kDefaultMaster;
      options.master_source = "the default (no --master, no $MPILEARN_MASTER)";
    }
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
