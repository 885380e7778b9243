// A sharded parameter service across hosts (docs/sharding.md): network
// namespaces as hosts (NetnsCluster), a lead mpilearn-master on host 0, two
// mpilearn-master --shard_of processes on hosts 1 and 2, and a real
// `mpirun` group whose ranks are on hosts 3 and 4; TLS and tokens
// everywhere, the shards reaching the lead with an admin token.
//
// The same sync job (MLP, Fashion-MNIST subset, fixed seed) trains on one
// master and on the lead with two shards: the same accuracy. Then a shard's
// host loses every process mid-training and the shard is started again from
// its state directory: the job completes within a point of the undisturbed
// sharded run.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "tests/test_process.h"
#include "tools/cluster/netns_cluster.h"

namespace mpilearn::testing {
namespace {

using tools::NetnsCluster;

constexpr int64_t kTrainLimit = 12000;  // 10,000 train + 2,000 validation
constexpr int kEpochs = 2;
constexpr double kMinAccuracy = 0.75;
constexpr int kShards = 2;
constexpr char kAdminToken[] = "shards-admin-token-0123456789";
constexpr char kWorkerToken[] = "shards-worker-token-0123456789";

// Host 0: the master or lead; hosts 1 and 2: the shards; hosts 3 and 4: the
// group's two ranks.
class ShardClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    absl::StatusOr<std::unique_ptr<NetnsCluster>> cluster = NetnsCluster::Create(5);
    if (!cluster.ok()) {
      GTEST_SKIP() << "no network namespaces on this machine: " << cluster.status();
    }
    cluster_ = *std::move(cluster);
    dir_ = NewTempDir("shard_cluster");
    // One certificate for the lead's and the shards' addresses.
    const absl::Status made = MakeCertificates(
        dir_, absl::StrCat("IP:", cluster_->address(0), ",IP:", cluster_->address(1), ",IP:",
                           cluster_->address(2)));
    ASSERT_TRUE(made.ok()) << made;
    WriteFileOrDie(dir_ + "/tokens.txt", absl::StrCat("admin  test  ", kAdminToken,
                                                      "\nworker hosts ", kWorkerToken, "\n"));
    WriteFileOrDie(dir_ + "/admin.token", absl::StrCat(kAdminToken, "\n"));
    WriteFileOrDie(dir_ + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
  }

  std::vector<std::string> ServerFlags() const {
    return {"--group_timeout_s=10", "--tls_cert=" + dir_ + "/server.pem",
            "--tls_key=" + dir_ + "/server.key", "--tokens_file=" + dir_ + "/tokens.txt"};
  }

  // The master on host 0 (`extra`: a lead's flags), and an admin client.
  void StartMaster(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = ServerFlags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto master = MasterProcess::StartOn(cluster_->address(0), cluster_->InHost(0, {}),
                                         dir_ + "/" + name, flags);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    MasterClient::Options options;
    options.security.tls_ca = dir_ + "/ca.pem";
    options.security.token = kAdminToken;
    auto client = MasterClient::Connect(master_->address(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Shard `k` (1 or 2) on host k, syncing with the master on host 0; on
  // `port` when given (a restart keeps its address: the lead placed the
  // job there).
  absl::StatusOr<std::unique_ptr<MasterProcess>> StartShard(int k, int port = 0) {
    std::vector<std::string> flags = ServerFlags();
    flags.insert(flags.end(), {"--shard_of=" + master_->address(),
                               "--lead_tls_ca=" + dir_ + "/ca.pem",
                               "--lead_token_file=" + dir_ + "/admin.token"});
    if (port != 0) flags.push_back(absl::StrCat("--listen=", cluster_->address(k), ":", port));
    return MasterProcess::StartOn(cluster_->address(k), cluster_->InHost(k, {}),
                                  absl::StrCat(dir_, "/shard", k), flags);
  }

  // Submits `spec` and trains it with a group on hosts 3 and 4.
  std::unique_ptr<ChildProcess> StartJob(const std::string& name, const v1::JobSpec& spec) {
    auto job_id = client_->SubmitJob(spec);
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return nullptr;
    job_id_ = *job_id;
    auto workers = StartWorkers(2, master_->address(),
                                {"--threads=1", "--tls_ca=" + dir_ + "/ca.pem",
                                 "--token_file=" + dir_ + "/worker.token",
                                 "--job_id=" + job_id_},
                                absl::StrCat(dir_, "/", name, ".log"), cluster_->MpirunArgs({3, 4}));
    EXPECT_TRUE(workers.ok()) << workers.status();
    return workers.ok() ? *std::move(workers) : nullptr;
  }

  v1::JobStatus ExpectCompleted(ChildProcess& workers) {
    const std::optional<int> exit_code = workers.Wait(absl::Seconds(300));
    EXPECT_TRUE(exit_code.has_value()) << "workers did not finish in 300 s:\n" << workers.Log();
    EXPECT_EQ(exit_code.value_or(-1), 0) << workers.Log();
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job_id_);
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return {};
    EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
    EXPECT_GE(status->test_accuracy(), kMinAccuracy) << workers.Log();
    EXPECT_EQ(status->samples_trained(), static_cast<uint64_t>((kTrainLimit - 2000) * kEpochs));
    return *status;
  }

  // The lead and both shards, the lead waiting for them before it places a
  // job.
  void StartLeadAndShards() {
    StartMaster("lead", {absl::StrCat("--min_shards=", kShards)});
    for (int k = 1; k <= kShards; ++k) {
      absl::StatusOr<std::unique_ptr<MasterProcess>> shard = StartShard(k);
      ASSERT_TRUE(shard.ok()) << shard.status();
      shards_.push_back(*std::move(shard));
    }
  }

  // Each shard holds a slice of the job: its status lists both, on hosts 1
  // and 2, their parameters summing to the job's.
  void ExpectOnShards(const v1::JobStatus& status) {
    ASSERT_EQ(status.shards_size(), kShards) << status.ShortDebugString();
    uint64_t parameters = 0;
    for (int k = 0; k < kShards; ++k) {
      EXPECT_EQ(status.shards(k).address(), shards_[k]->address());
      EXPECT_GT(status.shards(k).parameters(), 0u);
      parameters += status.shards(k).parameters();
    }
    EXPECT_EQ(parameters, status.parameters());
  }

  std::unique_ptr<NetnsCluster> cluster_;  // torn down last
  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::vector<std::unique_ptr<MasterProcess>> shards_;
  std::unique_ptr<MasterClient> client_;
  std::string job_id_;
};

// One master, then a lead with two shards: the same job reaches the same
// accuracy, and the same test loss.
TEST_F(ShardClusterTest, ShardedJobTrainsAsOneMasterDoes) {
  const v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  StartMaster("single");
  std::unique_ptr<ChildProcess> workers = StartJob("single", spec);
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus single = ExpectCompleted(*workers);
  EXPECT_EQ(single.shards_size(), 0);
  client_.reset();
  master_.reset();

  StartLeadAndShards();
  workers = StartJob("sharded", spec);
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus sharded = ExpectCompleted(*workers);
  ExpectOnShards(sharded);
  EXPECT_NEAR(sharded.test_accuracy(), single.test_accuracy(), 0.01);
  // More: one group of one thread per rank trains deterministically, and
  // each shard applies Adam to its slice as one master applies it to the
  // whole, so the sharded run ends on the same weights, bit for bit.
  EXPECT_DOUBLE_EQ(sharded.test_loss(), single.test_loss());
  std::printf("one master: test_accuracy=%.4f test_loss=%.6f; lead + %d shards: "
              "test_accuracy=%.4f test_loss=%.6f\n",
              single.test_accuracy(), single.test_loss(), kShards, sharded.test_accuracy(),
              sharded.test_loss());
}

// A shard's host loses every process mid-training; the shard is started
// again on the same address from its state directory (its slice's last
// checkpoint). The group's pushes wait and retry, the group registers
// again, and the job completes within a point of the undisturbed run.
TEST_F(ShardClusterTest, ShardKilledAndRestartedTheJobCompletes) {
  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  // Each slice checkpoints often, so a restarted shard loses few updates.
  spec.mutable_checkpoint()->set_every_updates(5);
  StartLeadAndShards();
  std::unique_ptr<ChildProcess> workers = StartJob("undisturbed", spec);
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus undisturbed = ExpectCompleted(*workers);
  ExpectOnShards(undisturbed);

  workers = StartJob("shard_killed", spec);
  ASSERT_NE(workers, nullptr);
  absl::StatusOr<v1::JobStatus> training = WaitForStatus(
      *client_, job_id_, absl::Seconds(120), [](const v1::JobStatus& s) {
        return s.updates_applied() >= 40 || s.state() == v1::JOB_STATE_COMPLETED;
      });
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_NE(training->state(), v1::JOB_STATE_COMPLETED) << "the job ended before the fault";
  const int port = std::stoi(shards_[1]->address().substr(shards_[1]->address().rfind(':') + 1));
  ASSERT_TRUE(cluster_->KillHostProcesses(2).ok());
  const std::optional<int> killed = shards_[1]->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(killed.has_value()) << "shard 2 outlived SIGKILL by 30 s";
  absl::SleepFor(absl::Seconds(2));
  absl::StatusOr<std::unique_ptr<MasterProcess>> restarted = StartShard(2, port);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  shards_[1] = *std::move(restarted);
  const v1::JobStatus recovered = ExpectCompleted(*workers);
  ExpectOnShards(recovered);
  EXPECT_NEAR(recovered.test_accuracy(), undisturbed.test_accuracy(), 0.01);
  EXPECT_NE(workers->Log().find("registering again"), std::string::npos) << workers->Log();
  std::printf("shard on host 2 killed after %llu updates and restarted: test_accuracy=%.4f "
              "(undisturbed %.4f)\n",
              static_cast<unsigned long long>(training->updates_applied()),
              recovered.test_accuracy(), undisturbed.test_accuracy());
}

// The lead's host loses every process mid-training and the lead is started
// again on its address and state directory: it rebuilds the job's
// placement from its shards' reports (it places nothing before both are
// live, --min_shards), the group registers again, and the job completes
// on the same two shards. The lead keeps no weights of a sharded job, so
// its data queue starts again; the weights on the shards are kept.
TEST_F(ShardClusterTest, LeadRestartedFindsItsShardsAgain) {
  StartLeadAndShards();
  std::unique_ptr<ChildProcess> workers =
      StartJob("lead_killed", FashionMnistSubset("sync", kTrainLimit, kEpochs));
  ASSERT_NE(workers, nullptr);
  absl::StatusOr<v1::JobStatus> training = WaitForStatus(
      *client_, job_id_, absl::Seconds(120), [](const v1::JobStatus& s) {
        return s.updates_applied() >= 40 || s.state() == v1::JOB_STATE_COMPLETED;
      });
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_NE(training->state(), v1::JOB_STATE_COMPLETED) << "the job ended before the fault";
  const std::string address = master_->address();
  ASSERT_TRUE(cluster_->KillHostProcesses(0).ok());
  ASSERT_TRUE(master_->process().Wait(absl::Seconds(30)).has_value())
      << "the lead outlived SIGKILL by 30 s";
  client_.reset();
  StartMaster("lead", {absl::StrCat("--min_shards=", kShards),
                       absl::StrCat("--listen=", address)});
  ASSERT_EQ(master_->address(), address);
  const v1::JobStatus done = ExpectCompleted(*workers);
  ExpectOnShards(done);
  // From the shards' reports, not placed anew.
  EXPECT_NE(master_->process().Log().find("job " + job_id_ + ": placement on 2 shard(s) rebuilt"),
            std::string::npos)
      << master_->process().Log();
  // The shards' versions went on from where they were: nothing started
  // from fresh weights.
  EXPECT_GT(done.shards(0).version(), training->shards(0).version());
  std::printf("lead killed after %llu updates and restarted: the job completed on the same %d "
              "shards, test_accuracy=%.4f\n",
              static_cast<unsigned long long>(training->updates_applied()), kShards,
              done.test_accuracy());
}

}  // namespace
}  // namespace mpilearn::testing
