// soak: a load generator that drives one mpilearn-master with simulated
// worker groups for minutes and checks that it makes no errors and that its
// memory stays flat. No LibTorch: the groups speak the protocol through
// MasterClient with random weights and updates
// (tools/soak/soak_load.h says what each phase does and which errors it
// expects).
//
//   bazel build -c opt //tools:soak //server:mpilearn-master
//   bazel-out/k8-opt/bin/tools/soak/soak [--phase both] [--groups 64]
//       [--seconds 120] [--jobs 1000] [--json]
//
// By default it starts mpilearn-master itself (from the Bazel runfiles, or
// --master_bin) on a free loopback port with a temporary --state_dir, and
// stops exactly that process and removes that directory at the end.
// --master HOST:PORT drives an existing master instead (its memory is then
// read only with --master_pid, on this machine).
//
// The master's resident memory (VmRSS in /proc/PID/status) is sampled every
// second. Pass criteria, each stated in --help:
//   - no unexpected RPC error and no failed check (a job's status against
//     what its groups did; a deleted job gone);
//   - groups: after the warm-up (the first 25 % of --seconds), not both
//     max RSS > 1.5 x the first post-warm-up sample and a least-squares
//     slope > 32 MiB/min (gross growth only: figures are noisy on a busy
//     machine; the slope and range are reported for people to judge);
//   - churn: RSS at the end (2 s after the last job was deleted) at most
//     128 MiB above the start. Each churn job holds 76,810 fp32 weights
//     (0.29 MiB) plus Adam's two moments on the master, about 0.9 MiB;
//     1000 jobs that each left their weights alone behind would add
//     ~290 MiB, all their tensors ~880 MiB. Freed memory does not all go
//     back to the kernel: glibc keeps it in per-thread arenas, and 1000
//     churn jobs raised a fresh master's RSS by 44 to 56 MiB on the 2-core
//     development machine (33 MiB after 4000 jobs with MALLOC_ARENA_MAX=1),
//     so the bound is twice that; the growth after the first quarter of
//     the jobs is reported too, to tell allocator warm-up from a trend;
//   - the master is still running at the end;
//   - no job directory left in a started master's state_dir/jobs (every
//     job was deleted).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/client/client_security_flags.h"
#include "common/status_macros.h"
#include "tools/soak/child_process.h"
#include "tools/soak/soak_load.h"
#include "tools/soak/soak_master.h"
#include "tools/soak/soak_report.h"
#include "tools/soak/soak_stats.h"

ABSL_FLAG(std::string, phase, "both", "groups, churn or both.");
ABSL_FLAG(int, groups, 64, "Simulated groups in the groups phase.");
ABSL_FLAG(int, groups_per_job, 2, "Groups serving each job together.");
ABSL_FLAG(int, seconds, 120, "Length of the groups phase in seconds.");
ABSL_FLAG(int, jobs, 1000, "Jobs the churn phase submits and deletes.");
ABSL_FLAG(int, churn_concurrency, 8, "Churn jobs in flight at once.");
ABSL_FLAG(int, churn_timeout_s, 900, "Bound on the churn phase in seconds.");
ABSL_FLAG(int, rpc_timeout_s, 30, "Deadline of each RPC in seconds.");
ABSL_FLAG(bool, keep_ended, false,
          "Groups phase: keep completed jobs on the master (default: delete "
          "each once checked).");
ABSL_FLAG(std::string, master, "",
          "host:port of an existing master (default: start one).");
ABSL_FLAG(int, master_pid, 0,
          "With --master: the master's pid on this machine, to sample its "
          "memory (0: memory not sampled).");
ABSL_FLAG(std::string, master_bin, "",
          "The mpilearn-master binary (default: from the Bazel runfiles).");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of the report.");

namespace mpilearn {
namespace soak {
namespace {

constexpr char kUsage[] =
    "soak: drives one mpilearn-master with simulated worker groups (no\n"
    "LibTorch) and checks it makes no errors and keeps its memory flat.\n"
    "\n"
    "Usage: soak [--phase groups|churn|both] [--groups 64]\n"
    "            [--groups_per_job 2] [--seconds 120] [--jobs 1000]\n"
    "            [--churn_concurrency 8] [--json] [--master HOST:PORT]\n"
    "\n"
    "Without --master it starts mpilearn-master (runfiles or --master_bin)\n"
    "on a free loopback port with a temporary --state_dir; both go at exit.\n"
    "\n"
    "Phases:\n"
    "  groups  --groups groups in teams of --groups_per_job, each team\n"
    "          serving one small job at a time (MLP 64-32-10, 2 epochs of\n"
    "          2048 samples in units of 128; downpour with max_staleness 1,\n"
    "          sync, easgd, gem in turn): per unit NextDataUnit, 2 x\n"
    "          PushGradient, PullWeights, Heartbeat; ReportEpoch per epoch;\n"
    "          Leave; the job's status checked, then DeleteJob; for\n"
    "          --seconds.\n"
    "  churn   --jobs jobs (MLP 64-1024-10, 0.9 MiB each on the master with\n"
    "          Adam), --churn_concurrency at once: submit, register, init,\n"
    "          2 units, then cancel while running / leave then cancel /\n"
    "          complete (by job index), DeleteJob, GetJobStatus NOT_FOUND.\n"
    "\n"
    "Expected errors (counted, not failures): PushGradient ABORTED\n"
    "STALE_UPDATE on downpour jobs; in churn, GetJobStatus NOT_FOUND\n"
    "after DeleteJob. Anything else fails the run, as does a push right\n"
    "after a cancel that is applied (it must get the last weights back).\n"
    "\n"
    "Pass: no unexpected error or failed check; groups: after the warm-up\n"
    "(first 25 % of --seconds) not both max RSS > 1.5 x the first sample\n"
    "and slope > 32 MiB/min; churn: end RSS <= start + 128 MiB; the master\n"
    "still running; no job directory left. Progress lines (every 10 s) go\n"
    "to stderr.\n"
    "\n"
    "Flags:\n"
    "  --phase             groups, churn or both (default both).\n"
    "  --groups            simulated groups, 1..1024 (default 64).\n"
    "  --groups_per_job    groups per job, 1..16 (default 2).\n"
    "  --seconds           groups phase length, 4..86400 (default 120).\n"
    "  --jobs              churn jobs, 1..100000 (default 1000).\n"
    "  --churn_concurrency churn jobs at once, 1..64 (default 8).\n"
    "  --churn_timeout_s   bound on the churn phase, 10..86400 (default 900).\n"
    "  --rpc_timeout_s     deadline of each RPC, 1..600 (default 30).\n"
    "  --keep_ended        keep completed jobs of the groups phase.\n"
    "  --master            an existing master's host:port.\n"
    "  --master_pid        its pid, to sample its memory (local only).\n"
    "  --master_bin        the mpilearn-master binary to start.\n"
    "  --json              one JSON object on stdout instead of the report.\n"
    "\n"
    "Exit codes: 0 pass, 1 fail or error, 2 usage error.";

constexpr double kWarmupShare = 0.25;
constexpr double kGrowthRatio = 1.5;
constexpr double kSlopeBoundMibPerMin = 32;
constexpr double kChurnGrowthBoundMib = 128;

struct Options {
  bool groups_phase = true;
  bool churn_phase = true;
  LoadOptions load;
  int seconds = 120;
  int churn_timeout_s = 900;
  std::string master;
  int master_pid = 0;
  std::string master_bin;
  bool json = false;
};

absl::Status CheckRange(const char* flag, int value, int lo, int hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " must be in [", lo, ", ", hi, "], got ", value));
}

absl::StatusOr<Options> OptionsFromFlags(const char* argv0) {
  Options options;
  const std::string phase = absl::GetFlag(FLAGS_phase);
  if (phase != "groups" && phase != "churn" && phase != "both") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--phase: expected groups, churn or both, got '", phase, "'"));
  }
  options.groups_phase = phase != "churn";
  options.churn_phase = phase != "groups";
  options.load.groups = absl::GetFlag(FLAGS_groups);
  MPILEARN_RETURN_IF_ERROR(CheckRange("groups", options.load.groups, 1, 1024));
  options.load.groups_per_job = absl::GetFlag(FLAGS_groups_per_job);
  MPILEARN_RETURN_IF_ERROR(
      CheckRange("groups_per_job", options.load.groups_per_job, 1, 16));
  options.seconds = absl::GetFlag(FLAGS_seconds);
  MPILEARN_RETURN_IF_ERROR(CheckRange("seconds", options.seconds, 4, 86400));
  options.load.jobs = absl::GetFlag(FLAGS_jobs);
  MPILEARN_RETURN_IF_ERROR(CheckRange("jobs", options.load.jobs, 1, 100000));
  options.load.concurrency = absl::GetFlag(FLAGS_churn_concurrency);
  MPILEARN_RETURN_IF_ERROR(
      CheckRange("churn_concurrency", options.load.concurrency, 1, 64));
  options.churn_timeout_s = absl::GetFlag(FLAGS_churn_timeout_s);
  MPILEARN_RETURN_IF_ERROR(
      CheckRange("churn_timeout_s", options.churn_timeout_s, 10, 86400));
  const int rpc_timeout_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  MPILEARN_RETURN_IF_ERROR(CheckRange("rpc_timeout_s", rpc_timeout_s, 1, 600));
  options.load.rpc_timeout = absl::Seconds(rpc_timeout_s);
  options.load.keep_ended = absl::GetFlag(FLAGS_keep_ended);
  MPILEARN_ASSIGN_OR_RETURN(options.load.security, ClientSecurityFromFlags());
  options.json = absl::GetFlag(FLAGS_json);
  options.master = absl::GetFlag(FLAGS_master);
  options.master_pid = absl::GetFlag(FLAGS_master_pid);
  if (options.master_pid < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_pid must be >= 0, got ", options.master_pid));
  }
  if (options.master_pid > 0 && options.master.empty()) {
    return absl::InvalidArgumentError(
        "--master_pid needs --master (a started master's pid is known)");
  }
  if (options.master_pid > 0 && !ResidentMiB(options.master_pid).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master_pid ", options.master_pid, ": no such process here"));
  }
  options.master_bin = absl::GetFlag(FLAGS_master_bin);
  if (options.master.empty()) {
    if (options.master_bin.empty()) {
      MPILEARN_ASSIGN_OR_RETURN(options.master_bin,
                                tools::RunfilesMaster(argv0));
    }
    if (access(options.master_bin.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no executable mpilearn-master at '", options.master_bin,
          "'; build //server:mpilearn-master or pass --master_bin"));
    }
  } else if (!options.master_bin.empty()) {
    return absl::InvalidArgumentError(
        "give --master or --master_bin, not both");
  }
  return options;
}

volatile sig_atomic_t interrupted = 0;
void OnSignal(int) { interrupted = 1; }

// Samples the master's RSS; nullopt when not measured. `dead` is set when
// the master we started is gone.
class RssProbe {
 public:
  RssProbe(SoakMaster* started, pid_t pid) : started_(started), pid_(pid) {}
  std::optional<double> Sample() {
    if (started_ != nullptr && !started_->Running()) dead_ = true;
    if (pid_ <= 0 || dead_) return std::nullopt;
    absl::StatusOr<double> mib = ResidentMiB(pid_);
    if (!mib.ok()) {
      dead_ = true;
      return std::nullopt;
    }
    return *mib;
  }
  // The master's CPU seconds so far; nullopt when not measured.
  std::optional<double> Cpu() const {
    if (pid_ <= 0 || dead_) return std::nullopt;
    absl::StatusOr<double> seconds = CpuSeconds(pid_);
    if (!seconds.ok()) return std::nullopt;
    return *seconds;
  }
  bool dead() const { return dead_; }
  bool measured() const { return pid_ > 0; }

 private:
  SoakMaster* started_;
  pid_t pid_;
  bool dead_ = false;
};

double Since(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

void RunGroups(const Options& options, RpcStats& stats, RssProbe& probe,
               Report& report) {
  report.groups_ran = true;
  report.groups = options.load.groups;
  report.groups_per_job = options.load.groups_per_job;
  report.rss_start = probe.Sample();
  absl::StatusOr<std::unique_ptr<GroupsLoad>> load =
      GroupsLoad::Start(options.load, stats);
  if (!load.ok()) {
    report.failures.push_back(
        absl::StrCat("groups: ", load.status().ToString()));
    return;
  }
  const absl::Time start = absl::Now();
  const std::optional<double> cpu_start = probe.Cpu();
  std::optional<double> last_cpu = cpu_start;
  RssSeries series;
  uint64_t last_total = 0;
  for (int tick = 1; tick <= options.seconds && !interrupted && !probe.dead();
       ++tick) {
    absl::SleepFor(start + absl::Seconds(tick) - absl::Now());
    std::optional<double> mib = probe.Sample();
    if (mib.has_value()) series.Add(Since(start), *mib);
    if (tick % 10 == 0) {
      const uint64_t total = stats.Total();
      const std::optional<double> cpu = probe.Cpu();
      std::optional<double> cpu_percent, us_per_rpc;
      if (cpu.has_value() && last_cpu.has_value()) {
        cpu_percent = (*cpu - *last_cpu) * 10.0;  // of 10 s, in %
        if (total > last_total)
          us_per_rpc = (*cpu - *last_cpu) * 1e6 / (total - last_total);
      }
      last_cpu = cpu;
      std::fprintf(stderr,
                   "soak: groups %4d s: %.0f RPC/s, %llu RPCs, errors %llu "
                   "(unexpected %llu), jobs completed %llu, master RSS %s MiB, "
                   "master CPU %s%% (%s us/RPC)\n",
                   tick, (total - last_total) / 10.0,
                   static_cast<unsigned long long>(total),
                   static_cast<unsigned long long>(stats.ErrorCount()),
                   static_cast<unsigned long long>(stats.UnexpectedCount()),
                   static_cast<unsigned long long>((*load)->jobs_completed()),
                   Num(mib).c_str(), Num(cpu_percent, 0).c_str(),
                   Num(us_per_rpc, 0).c_str());
      last_total = total;
    }
  }
  report.groups_seconds = Since(start);
  report.rpcs_total = stats.Total();
  report.rpcs_per_second = report.rpcs_total / report.groups_seconds;
  const std::optional<double> cpu_end = probe.Cpu();
  if (cpu_start.has_value() && cpu_end.has_value()) {
    report.master_cpu_seconds = *cpu_end - *cpu_start;
    if (report.rpcs_total > 0) {
      report.master_cpu_us_per_rpc =
          *report.master_cpu_seconds * 1e6 / report.rpcs_total;
    }
  }
  (*load)->Stop();
  // The calls the groups made while leaving count in the totals by call.
  for (int i = 0; i < static_cast<int>(Rpc::kCount); ++i) {
    report.rpcs[static_cast<Rpc>(i)] = stats.Calls(static_cast<Rpc>(i));
  }
  report.jobs_completed = (*load)->jobs_completed();
  const RssSummary after =
      series.Summarize(kWarmupShare * options.seconds, 1e18);
  if (after.samples > 0) {
    report.rss_warm = after.first_mib;
    report.rss_end = after.last_mib;
    report.rss_max = after.max_mib;
    report.rss_min = after.min_mib;
    report.rss_samples = after.samples;
    report.slope = after.slope_mib_per_min;
    if (after.max_mib > kGrowthRatio * after.first_mib &&
        after.slope_mib_per_min &&
        *after.slope_mib_per_min > kSlopeBoundMibPerMin) {
      report.failures.push_back(absl::StrFormat(
          "groups: master RSS grew from %.1f to %.1f MiB after the warm-up "
          "(> %.1fx) at %.1f MiB/min (> %.0f)",
          after.first_mib, after.max_mib, kGrowthRatio,
          *after.slope_mib_per_min, kSlopeBoundMibPerMin));
    }
  }
}

void RunChurn(const Options& options, RpcStats& stats, RssProbe& probe,
              Report& report) {
  report.churn_ran = true;
  report.churn_start = probe.Sample();
  report.churn_peak = report.churn_start;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ChurnLoad>> load =
      ChurnLoad::Start(options.load, stats);
  if (!load.ok()) {
    report.failures.push_back(
        absl::StrCat("churn: ", load.status().ToString()));
    return;
  }
  uint64_t last_total = stats.Total();
  for (int tick = 1; !(*load)->Done(); ++tick) {
    if (interrupted || probe.dead() || tick > options.churn_timeout_s) {
      if (tick > options.churn_timeout_s) {
        report.failures.push_back(
            absl::StrCat("churn: not done within --churn_timeout_s ",
                         options.churn_timeout_s));
      }
      (*load)->Stop();
      break;
    }
    absl::SleepFor(
        std::min(start + absl::Seconds(tick) - absl::Now(), absl::Seconds(1)));
    std::optional<double> mib = probe.Sample();
    if (mib.has_value()) report.churn_peak = std::max(*report.churn_peak, *mib);
    if (!report.churn_warm.has_value() &&
        (*load)->jobs_done() * 4 >= static_cast<uint64_t>(options.load.jobs)) {
      report.churn_warm = mib;
    }
    if (tick % 10 == 0) {
      const uint64_t total = stats.Total();
      std::fprintf(
          stderr,
          "soak: churn %4d s: %llu of %d jobs, %.0f RPC/s, errors %llu "
          "(unexpected %llu), master RSS %s MiB\n",
          tick, static_cast<unsigned long long>((*load)->jobs_done()),
          options.load.jobs, (total - last_total) / 10.0,
          static_cast<unsigned long long>(stats.ErrorCount()),
          static_cast<unsigned long long>(stats.UnexpectedCount()),
          Num(mib).c_str());
      last_total = total;
    }
  }
  (*load)->Join();
  report.churn_seconds = Since(start);
  report.churn_jobs = (*load)->jobs_done();
  absl::SleepFor(absl::Seconds(2));  // let the master finish releasing
  report.churn_end = probe.Sample();
  if (report.churn_end.has_value()) {
    report.churn_peak = std::max(*report.churn_peak, *report.churn_end);
    if (*report.churn_end - *report.churn_start > kChurnGrowthBoundMib) {
      report.failures.push_back(absl::StrFormat(
          "churn: master RSS ended %.1f MiB above its start (%.1f -> %.1f; "
          "bound %.0f MiB)",
          *report.churn_end - *report.churn_start, *report.churn_start,
          *report.churn_end, kChurnGrowthBoundMib));
    }
  }
}

absl::Status Run(const Options& options) {
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::unique_ptr<SoakMaster> started;
  Options run = options;
  pid_t pid = options.master_pid;
  if (options.master.empty()) {
    MPILEARN_ASSIGN_OR_RETURN(started, SoakMaster::Start(options.master_bin));
    run.load.address = started->address();
    pid = started->pid();
    std::fprintf(stderr,
                 "soak: started mpilearn-master at %s (pid %d, state in %s)\n",
                 started->address().c_str(), static_cast<int>(pid),
                 started->dir().c_str());
  } else {
    run.load.address = options.master;
  }
  RssProbe probe(started.get(), pid);
  RpcStats stats;
  Report report;
  if (run.groups_phase) RunGroups(run, stats, probe, report);
  const uint64_t before_churn = stats.Total();
  if (run.churn_phase && !interrupted && !probe.dead()) {
    RunChurn(run, stats, probe, report);
    report.churn_rpcs = stats.Total() - before_churn;
  }
  if (started != nullptr && !options.load.keep_ended) {
    // Every job was deleted (or cancelled, then deleted): DeleteJob must
    // have removed its directory.
    std::error_code error;
    int left = 0;
    std::vector<std::string> named;  // the first few, with their files
    for (auto it = std::filesystem::directory_iterator(
             started->dir() + "/state/jobs", error);
         !error && it != std::filesystem::directory_iterator();
         it.increment(error)) {
      // Only directories are jobs (the master also keeps a
      // last_job_number file there).
      std::error_code kind;
      if (!it->is_directory(kind) || ++left > 3) continue;
      std::vector<std::string> files;
      std::error_code ignored;
      for (auto file = std::filesystem::recursive_directory_iterator(it->path(),
                                                                     ignored);
           !ignored && file != std::filesystem::recursive_directory_iterator();
           file.increment(ignored)) {
        files.push_back(
            std::filesystem::relative(file->path(), it->path()).string());
      }
      named.push_back(absl::StrCat(it->path().filename().string(), " [",
                                   absl::StrJoin(files, ", "), "]"));
    }
    report.state_jobs_left = left;
    if (left > 0) {
      report.failures.push_back(absl::StrCat(
          left,
          " job directories left under the master's state_dir/jobs "
          "after every job was deleted: ",
          absl::StrJoin(named, "; ")));
    }
  }
  if (!probe.measured()) {
    std::fprintf(stderr, "soak: memory not sampled (give --master_pid)\n");
  }
  if (started != nullptr && !started->Running()) probe.Sample();
  if (probe.dead()) {
    report.failures.push_back("the master exited during the run");
  }
  if (interrupted) report.failures.push_back("interrupted");
  if (stats.UnexpectedCount() > 0) {
    report.failures.push_back(
        absl::StrCat(stats.UnexpectedCount(), " unexpected RPC errors"));
  }
  if (stats.CheckFailures() > 0) {
    report.failures.push_back(
        absl::StrCat(stats.CheckFailures(), " failed checks"));
  }
  if (options.json) {
    PrintJson(report, stats);
  } else {
    PrintHuman(report, stats);
  }
  std::fflush(stdout);
  if (report.pass()) return absl::OkStatus();
  std::string message = absl::StrJoin(report.failures, "; ");
  if (started != nullptr) {
    absl::StrAppend(&message, "\nmpilearn-master's log ends:\n",
                    started->LogTail(2048));
  }
  return absl::InternalError(message);
}

}  // namespace
}  // namespace soak
}  // namespace mpilearn

int main(int argc, char** argv) {
  namespace soak = mpilearn::soak;
  absl::StatusOr<soak::Options> options;
  mpilearn::ToolMain tool;
  tool.name = "soak";
  tool.usage =
      absl::StrCat(soak::kUsage, "\n\n", mpilearn::kClientSecurityUsage);
  tool.flags_source = "tools/soak/soak.cc";
  tool.read_flags = [&] {
    options = soak::OptionsFromFlags(argv[0]);
    return options.status();
  };
  tool.run = [&] { return soak::Run(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
