// Throughput across hosts when the links are the limit: G groups of R ranks
// (downpour or sync; one rank each by default), each rank on its own host,
// train one job against a master on another host whose link (or every
// host's, --all_links) is rate-limited (tbf), per wire dtype and number of
// updates in flight. Reports
// samples/s, updates/s and the master's sent bytes/s against the bound the
// link sets: a master that answers every update with the model's weights
// sends M wire bytes per update, so updates/s <= B / M for link bandwidth B.
// With --shards, each count K > 0 runs the job's weights on K parameter
// shards (docs/sharding.md), each on a host of its own whose link has the
// same limit, behind a lead on host 0; K = 0 is one master as above. Each
// shard carries M / K of every update, so the bound is about K B / M, and
// speedup_vs_1_shard compares samples/s with the 1-shard run of the same
// row (vs_unsharded: with the 0 run).
//
//   bazel build -c opt //tools:bench_cluster
//   bazel-bin/tools/bench/bench_cluster [--groups 1,2,4] [--link_mbit 100,0]
//       [--dtypes float32,bfloat16] [--in_flight 1,2] [--algorithm downpour|sync]
//       [--ranks R] [--all_links] [--shards 0,1,2,4] [--train 16000] [--json]
//
// Rates are taken in the steady part of each run (between 20 % and 90 % of
// the samples the job ends with), from the job's counters and the
// byte counter of the master's link, polled every 250 ms. Needs root
// (network namespaces) and Debian's Fashion-MNIST.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "common/status_macros.h"
#include "proto/mpilearn.pb.h"
#include "tools/cluster/netns_cluster.h"
#include "tools/soak/child_process.h"

ABSL_FLAG(std::string, groups, "1,2,4", "Group counts to run (--ranks ranks each).");
ABSL_FLAG(std::string, link_mbit, "100,0",
          "Rates of the master's link in Mbit/s; 0 leaves it unlimited.");
ABSL_FLAG(std::string, dtypes, "float32,bfloat16", "Wire dtypes: float32, bfloat16.");
ABSL_FLAG(std::string, in_flight, "1,2",
          "Values of the job's exchange.updates_in_flight (1 to 4): 1 pushes and waits "
          "for the weights (the baseline), 2 keeps a second push out meanwhile.");
ABSL_FLAG(int64_t, train, 16000, "Training samples of the job (one epoch).");
ABSL_FLAG(int64_t, data_unit_size, 512,
          "Samples per data unit: the job counts samples as units complete, so small units "
          "keep samples/s smooth over short runs.");
ABSL_FLAG(std::string, algorithm, "downpour", "downpour or sync.");
ABSL_FLAG(int, ranks, 1, "Ranks per group, each on a host of its own (groups x ranks <= 7).");
ABSL_FLAG(bool, all_links, false,
          "Limit every host's link to --link_mbit, not only the master's.");
ABSL_FLAG(std::string, shards, "0",
          "Parameter shard counts to run: 0 is one master holding the weights; K > 0 a lead "
          "with K shards, each on its own host with the same link limit.");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of the table.");
ABSL_FLAG(std::string, master_bin, "", "mpilearn-master (default: the runfiles').");
ABSL_FLAG(std::string, worker_bin, "", "mpilearn-worker (default: the runfiles').");

namespace mpilearn::tools {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist/";

struct Config {
  int groups = 1;
  int link_mbit = 0;
  std::string dtype;
  int in_flight = 1;
  int shards = 0;  // 0: one master
};

// Hosts: 0 the master (or lead), 1 to kMaxShards the shards, then the
// groups' ranks.
int FirstGroupHost(int most_shards) { return 1 + most_shards; }

struct Result {
  Config config;
  double samples_per_s = 0;
  double updates_per_s = 0;
  double master_tx_bytes_per_s = 0;
  double bound_updates_per_s = 0;  // 0: unlimited link
  uint64_t parameters = 0;
  double test_accuracy = 0;
  double speedup_vs_1_shard = 0;  // 0: no 1-shard run to compare with
  double vs_unsharded = 0;        // 0: no unsharded run to compare with
};

absl::StatusOr<std::vector<int>> IntList(const std::string& flag, const std::string& text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 0 || value > 100000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": expected integers, got '", text, "'"));
    }
    values.push_back(value);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return values;
}

v1::DType DTypeOf(const std::string& name) {
  return name == "bfloat16" ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
}

// Bytes the servers (hosts 0 to `shards`) have sent: what the bridge side
// of their links received.
uint64_t MasterTxBytes(const NetnsCluster& cluster, int shards) {
  uint64_t total = 0;
  for (int host = 0; host <= shards; ++host) {
    std::ifstream in("/sys/class/net/" + cluster.root_link(host) + "/statistics/rx_bytes");
    uint64_t bytes = 0;
    in >> bytes;
    total += bytes;
  }
  return total;
}

struct Sample {
  absl::Time time;
  uint64_t updates = 0;
  uint64_t samples = 0;
  uint64_t tx = 0;
};

absl::StatusOr<Result> RunOne(NetnsCluster& cluster, const Config& config,
                              const std::string& master_bin,
                              const std::string& worker_bin, int64_t train, int most_shards) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<TempDir> dir, TempDir::Create("cluster"));
  const std::string port_file = dir->path() + "/port";
  MPILEARN_ASSIGN_OR_RETURN(
      std::unique_ptr<MasterChild> master,
      MasterChild::Start("/usr/sbin/ip",
                         cluster.InHost(0, {master_bin, "--listen=" + cluster.address(0) + ":0",
                                            "--insecure", "--state_dir=" + dir->path() + "/state",
                                            "--port_file=" + port_file,
                                            "--shards_per_job=" + std::to_string(config.shards),
                                            "--metrics_listen=127.0.0.1:0"}),
                         port_file, dir->path() + "/master.log"));
  const std::string address = absl::StrCat(cluster.address(0), ":", master->port());
  // The shards: each syncs with the lead as soon as it serves.
  std::vector<std::unique_ptr<MasterChild>> shards;
  for (int k = 1; k <= config.shards; ++k) {
    const std::string shard_dir = absl::StrCat(dir->path(), "/shard", k);
    MPILEARN_ASSIGN_OR_RETURN(
        std::unique_ptr<MasterChild> shard,
        MasterChild::Start("/usr/sbin/ip",
                           cluster.InHost(k, {master_bin, "--listen=" + cluster.address(k) + ":0",
                                              "--insecure", "--state_dir=" + shard_dir,
                                              "--port_file=" + shard_dir + ".port",
                                              "--shard_of=" + address,
                                              "--metrics_listen=127.0.0.1:0"}),
                           shard_dir + ".port", shard_dir + ".log"));
    shards.push_back(std::move(shard));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<MasterClient> client,
                            MasterClient::Connect(address));
  v1::JobSpec spec;
  spec.set_name(absl::StrCat("cluster-", config.groups, "g-", config.link_mbit, "mbit"));
  spec.mutable_model()->set_name("mlp");
  v1::DataSpec* data = spec.mutable_data();
  data->set_train_images(absl::StrCat(kData, "train-images-idx3-ubyte.gz"));
  data->set_train_labels(absl::StrCat(kData, "train-labels-idx1-ubyte.gz"));
  data->set_test_images(absl::StrCat(kData, "t10k-images-idx3-ubyte.gz"));
  data->set_test_labels(absl::StrCat(kData, "t10k-labels-idx1-ubyte.gz"));
  data->set_train_limit(train + 2000);
  data->set_validation_count(2000);
  data->set_test_limit(2000);
  spec.set_algorithm(absl::GetFlag(FLAGS_algorithm));
  spec.set_epochs(1);
  spec.set_batch_size(64);
  spec.set_data_unit_size(absl::GetFlag(FLAGS_data_unit_size));
  spec.mutable_exchange()->set_update_dtype(DTypeOf(config.dtype));
  spec.mutable_exchange()->set_weights_dtype(DTypeOf(config.dtype));
  spec.mutable_exchange()->set_updates_in_flight(config.in_flight);
  MPILEARN_ASSIGN_OR_RETURN(const std::string job_id, client->SubmitJob(spec));

  std::vector<pid_t> groups;
  const int ranks = absl::GetFlag(FLAGS_ranks);
  for (int g = 1; g <= config.groups; ++g) {
    std::vector<std::string> argv = {"mpirun", "--allow-run-as-root"};
    std::vector<int> hosts;  // the group's ranks on hosts of their own
    for (int r = 0; r < ranks; ++r) {
      hosts.push_back(FirstGroupHost(most_shards) + (g - 1) * ranks + r);
    }
    for (const std::string& arg : cluster.MpirunArgs(hosts)) argv.push_back(arg);
    argv.insert(argv.end(), {"-np", std::to_string(ranks), worker_bin, "--master=" + address,
                             "--job_id=" + job_id, "--threads=1", "--progress=off"});
    MPILEARN_ASSIGN_OR_RETURN(
        pid_t pid, SpawnWithLog("/usr/bin/mpirun", argv,
                                absl::StrCat(dir->path(), "/group", g, ".log")));
    groups.push_back(pid);
  }
  std::vector<Sample> samples;
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  v1::JobStatus status;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::JobStatus> now = client->GetJobStatus(job_id);
    if (now.ok()) {
      status = *now;
      samples.push_back({absl::Now(), status.updates_applied(), status.samples_trained(),
                         MasterTxBytes(cluster, config.shards)});
      if (status.state() != v1::JOB_STATE_RUNNING && status.state() != v1::JOB_STATE_QUEUED) {
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  for (pid_t pid : groups) {
    int ignored;
    if (waitpid(pid, &ignored, WNOHANG) == 0) {
      kill(pid, SIGTERM);
      waitpid(pid, &ignored, 0);
    }
  }
  if (status.state() != v1::JOB_STATE_COMPLETED) {
    return absl::InternalError(absl::StrCat("job ", job_id, " ended ",
                                            v1::JobState_Name(status.state()), ": ",
                                            status.message(), "\n", master->LogTail()));
  }
  if (status.shards_size() != config.shards) {
    return absl::InternalError(absl::StrCat("job ", job_id, " ran on ", status.shards_size(),
                                            " shards, not ", config.shards, "\n",
                                            master->LogTail()));
  }
  // The steady window: from the first sample at 20 % of the samples the
  // job trained to the first at 90 % (the lead counts samples as one
  // master does; a sharded job's update count comes from the shards' last
  // reports, up to a second late).
  const uint64_t total = status.samples_trained();
  auto at = [&](double share) {
    return std::find_if(samples.begin(), samples.end(), [&](const Sample& s) {
      return s.samples >= static_cast<uint64_t>(share * total);
    });
  };
  const auto begin = at(0.2);
  const auto end = at(0.9);
  if (begin == samples.end() || end == samples.end() || end->time <= begin->time) {
    return absl::InternalError("the run was too short to measure; raise --train");
  }
  const double seconds = absl::ToDoubleSeconds(end->time - begin->time);
  Result result;
  result.config = config;
  result.updates_per_s = (end->updates - begin->updates) / seconds;
  result.samples_per_s = (end->samples - begin->samples) / seconds;
  result.master_tx_bytes_per_s = (end->tx - begin->tx) / seconds;
  result.parameters = status.parameters();
  const double wire_bytes =
      static_cast<double>(status.parameters()) * (config.dtype == "bfloat16" ? 2 : 4);
  if (config.link_mbit > 0) {
    result.bound_updates_per_s =
        std::max(config.shards, 1) * config.link_mbit * 1e6 / 8 / wire_bytes;
  }
  result.test_accuracy = status.test_accuracy();
  return result;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "bench_cluster: groups whose ranks have hosts of their own against a master whose "
      "link is rate-limited; updates/s against the link's bound B / M.\n"
      "  bench_cluster [--groups 1,2,4] [--link_mbit 100,0] "
      "[--dtypes float32,bfloat16] [--in_flight 1,2] [--algorithm downpour|sync] "
      "[--ranks R] [--all_links] [--train N] [--json]");
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    std::fprintf(stderr, "bench_cluster: unexpected argument '%s' (see --help)\n", args[1]);
    return 2;
  }
  absl::StatusOr<std::vector<int>> group_counts = IntList("groups", absl::GetFlag(FLAGS_groups));
  absl::StatusOr<std::vector<int>> rates = IntList("link_mbit", absl::GetFlag(FLAGS_link_mbit));
  absl::StatusOr<std::vector<int>> in_flight = IntList("in_flight", absl::GetFlag(FLAGS_in_flight));
  absl::StatusOr<std::vector<int>> shard_counts = IntList("shards", absl::GetFlag(FLAGS_shards));
  const std::vector<std::string> dtypes =
      absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty());
  for (const absl::Status& status :
       {group_counts.status(), rates.status(), in_flight.status(), shard_counts.status()}) {
    if (!status.ok()) {
      std::fprintf(stderr, "bench_cluster: %s\n", std::string(status.message()).c_str());
      return 2;
    }
  }
  for (const std::string& dtype : dtypes) {
    if (dtype != "float32" && dtype != "bfloat16") {
      std::fprintf(stderr, "bench_cluster: --dtypes takes float32 and bfloat16, got '%s'\n",
                   dtype.c_str());
      return 2;
    }
  }
  for (const int n : *in_flight) {
    if (n < 1 || n > 4) {
      std::fprintf(stderr, "bench_cluster: --in_flight values must be 1 to 4, got %d\n", n);
      return 2;
    }
  }
  const int most = *std::max_element(group_counts->begin(), group_counts->end());
  const int most_shards = *std::max_element(shard_counts->begin(), shard_counts->end());
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (most_shards > 8) {
    std::fprintf(stderr, "bench_cluster: --shards values must be 0 to 8\n");
    return 2;
  }
  if (ranks < 1 || most < 1 || FirstGroupHost(most_shards) + most * ranks > 16) {
    std::fprintf(stderr,
                 "bench_cluster: 1 + the most --shards + --groups x --ranks must be at most "
                 "16 (one host each)\n");
    return 2;
  }
  const std::string algorithm = absl::GetFlag(FLAGS_algorithm);
  if (algorithm != "downpour" && algorithm != "sync") {
    std::fprintf(stderr, "bench_cluster: --algorithm takes downpour or sync, got '%s'\n",
                 algorithm.c_str());
    return 2;
  }
  std::string master_bin = absl::GetFlag(FLAGS_master_bin);
  if (master_bin.empty()) {
    absl::StatusOr<std::string> found = RunfilesMaster(argv[0]);
    if (!found.ok()) {
      std::fprintf(stderr, "bench_cluster: %s\n", std::string(found.status().message()).c_str());
      return 2;
    }
    master_bin = *found;
  }
  std::string worker_bin = absl::GetFlag(FLAGS_worker_bin);
  if (worker_bin.empty()) {
    worker_bin = master_bin.substr(0, master_bin.rfind("/server/")) + "/worker/mpilearn-worker";
  }
  if (access(worker_bin.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bench_cluster: no executable mpilearn-worker at '%s' (--worker_bin)\n",
                 worker_bin.c_str());
    return 2;
  }
  if (access((std::string(kData) + "train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    std::fprintf(stderr, "bench_cluster: needs Debian's dataset-fashion-mnist in %s\n", kData);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<NetnsCluster>> cluster =
      NetnsCluster::Create(FirstGroupHost(most_shards) + most * ranks);
  if (!cluster.ok()) {
    std::fprintf(stderr, "bench_cluster: %s\n", std::string(cluster.status().message()).c_str());
    return 2;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  std::vector<Result> results;
  for (const int rate : *rates) {
    // The servers' links (master or lead, and the shards), or every link.
    const int limited_hosts =
        absl::GetFlag(FLAGS_all_links) ? (*cluster)->hosts() : 1 + most_shards;
    for (int host = 0; host < limited_hosts; ++host) {
      const absl::Status limited = (*cluster)->SetRateMbit(host, rate);
      if (!limited.ok()) {
        std::fprintf(stderr, "bench_cluster: %s\n", std::string(limited.message()).c_str());
        return 1;
      }
    }
    for (const std::string& dtype : dtypes) {
      for (const int groups : *group_counts) {
        for (const int flight : *in_flight) {
          const size_t row_start = results.size();
          for (const int shards : *shard_counts) {
            const Config config{groups, rate, dtype, flight, shards};
            if (!json) {
              std::fprintf(stderr, "  measuring %d group(s), link %s, %s, %d in flight, %s\n",
                           groups, rate > 0 ? absl::StrCat(rate, " Mbit/s").c_str() : "unlimited",
                           dtype.c_str(), flight,
                           shards > 0 ? absl::StrCat(shards, " shard(s)").c_str() : "one master");
            }
            absl::StatusOr<Result> result = RunOne(**cluster, config, master_bin, worker_bin,
                                                   absl::GetFlag(FLAGS_train), most_shards);
            if (!result.ok()) {
              std::fprintf(stderr, "bench_cluster: %s\n",
                           std::string(result.status().message()).c_str());
              return 1;
            }
            results.push_back(*result);
          }
          // Ratios within the row: against its 1-shard and unsharded runs.
          double one_shard = 0, unsharded = 0;
          for (size_t i = row_start; i < results.size(); ++i) {
            if (results[i].config.shards == 1) one_shard = results[i].samples_per_s;
            if (results[i].config.shards == 0) unsharded = results[i].samples_per_s;
          }
          for (size_t i = row_start; i < results.size(); ++i) {
            if (one_shard > 0) results[i].speedup_vs_1_shard = results[i].samples_per_s / one_shard;
            if (unsharded > 0) results[i].vs_unsharded = results[i].samples_per_s / unsharded;
          }
        }
      }
    }
  }
  if (json) {
    std::vector<std::string> rows;
    for (const Result& r : results) {
      rows.push_back(absl::StrFormat(
          "{\"shards\": %d, \"groups\": %d, \"link_mbit\": %d, \"wire_dtype\": \"%s\", "
          "\"updates_in_flight\": %d, "
          "\"samples_per_s\": %.1f, \"master_tx_bytes_per_s\": %.0f, "
          "\"updates_per_s\": %.2f, \"bound_updates_per_s\": %s, "
          "\"of_bound\": %s, \"parameters\": %d, \"test_accuracy\": %.4f, "
          "\"speedup_vs_1_shard\": %s, \"vs_unsharded\": %s}",
          r.config.shards, r.config.groups, r.config.link_mbit, r.config.dtype,
          r.config.in_flight,
          r.samples_per_s,
          r.master_tx_bytes_per_s, r.updates_per_s,
          r.bound_updates_per_s > 0 ? absl::StrFormat("%.2f", r.bound_updates_per_s) : "null",
          r.bound_updates_per_s > 0
              ? absl::StrFormat("%.3f", r.updates_per_s / r.bound_updates_per_s)
              : "null",
          r.parameters, r.test_accuracy,
          r.speedup_vs_1_shard > 0 ? absl::StrFormat("%.3f", r.speedup_vs_1_shard) : "null",
          r.vs_unsharded > 0 ? absl::StrFormat("%.3f", r.vs_unsharded) : "null"));
    }
    std::printf("{\"model\": \"mlp\", \"algorithm\": \"%s\", \"ranks_per_group\": %d, "
                "\"all_links\": %s, \"train\": %d, \"results\": [\n  %s\n]}\n",
                algorithm.c_str(), ranks, absl::GetFlag(FLAGS_all_links) ? "true" : "false",
                static_cast<int>(absl::GetFlag(FLAGS_train)), absl::StrJoin(rows, ",\n  ").c_str());
    return 0;
  }
  std::printf("%-6s %-7s %-10s %-9s %-9s %10s %10s %12s %10s %8s %6s %8s\n", "shards", "groups",
              "link", "dtype", "in flight", "samples/s", "updates/s", "server MB/s", "bound u/s",
              "of bound", "test", "vs 1");
  for (const Result& r : results) {
    std::printf("%-6d %-7d %-10s %-9s %-9d %10.0f %10.2f %12.2f %10s %8s %6.3f %8s\n",
                r.config.shards, r.config.groups,
                r.config.link_mbit > 0 ? absl::StrCat(r.config.link_mbit, "mbit").c_str()
                                       : "unlimited",
                r.config.dtype.c_str(), r.config.in_flight, r.samples_per_s, r.updates_per_s,
                r.master_tx_bytes_per_s / 1e6,
                r.bound_updates_per_s > 0 ? absl::StrFormat("%.2f", r.bound_updates_per_s).c_str()
                                          : "-",
                r.bound_updates_per_s > 0
                    ? absl::StrFormat("%.2f", r.updates_per_s / r.bound_updates_per_s).c_str()
                    : "-",
                r.test_accuracy,
                r.speedup_vs_1_shard > 0 ? absl::StrFormat("%.2fx", r.speedup_vs_1_shard).c_str()
                                         : "-");
  }
  return 0;
}

}  // namespace
}  // namespace mpilearn::tools

int main(int argc, char** argv) { return mpilearn::tools::Main(argc, argv); }
