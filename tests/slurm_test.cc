// The deploy/ Slurm scripts under a real Slurm: slurmctld, one slurmd per
// host of a NetnsCluster (network namespaces as nodes n1, n2, n3) and
// munge, all from Debian's packages (SlurmCluster).
//
// - deploy/slurm_train.sbatch: the master as one job step on the first
//   node, a two-rank group as another (srun --mpi=pmix over two nodes);
//   the job trains to completion and the script stops the master. With
//   MPILEARN_SHARDS=1, a parameter shard as a step of its own.
// - deploy/slurm_group.sbatch: a group (mpirun inside a two-node allocation)
//   serving a job of a master outside Slurm, with TLS and tokens.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "tests/slurm_cluster.h"
#include "tests/test_process.h"
#include "tools/cluster/netns_cluster.h"

namespace mpilearn::testing {
namespace {

using tools::NetnsCluster;

constexpr double kMinAccuracy = 0.70;
constexpr char kAdminToken[] = "slurm-admin-token-0123456789";
constexpr char kWorkerToken[] = "slurm-worker-token-0123456789";

// The last "test_accuracy=V" line of `output`, or -1.
double TestAccuracy(const std::string& output) {
  const size_t at = output.rfind("test_accuracy=");
  if (at == std::string::npos) return -1;
  const size_t start = at + std::string("test_accuracy=").size();
  double value = -1;
  if (!absl::SimpleAtod(output.substr(start, output.find('\n', start) - start), &value)) {
    return -1;
  }
  return value;
}

bool Launched(const std::string& node_log, const std::string& step) {
  return node_log.find("launch task StepId=" + step + " ") != std::string::npos;
}

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    absl::StatusOr<std::unique_ptr<NetnsCluster>> hosts = NetnsCluster::Create(3);
    if (!hosts.ok()) {
      GTEST_SKIP() << "no network namespaces on this machine: " << hosts.status();
    }
    hosts_ = *std::move(hosts);
    absl::StatusOr<std::unique_ptr<SlurmCluster>> slurm = SlurmCluster::Start(*hosts_);
    if (absl::IsFailedPrecondition(slurm.status())) GTEST_SKIP() << slurm.status();
    ASSERT_TRUE(slurm.ok()) << slurm.status();
    slurm_ = *std::move(slurm);
    dir_ = NewTempDir("slurm");
  }

  // What every batch script needs here: Open MPI as root, the binaries'
  // paths on the nodes.
  std::vector<std::string> Env() const {
    return {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
            "MPILEARN_MASTER_BIN=" + Runfile("server/mpilearn-master"),
            "MPILEARN_WORKER=" + Runfile("worker/mpilearn-worker"),
            "MPILEARN_CTL=" + Runfile("tools/cli/mpilearnctl")};
  }

  // Runs deploy/slurm_train.sbatch on the quick Fashion-MNIST spec over the
  // three nodes with `env` added; the job must complete. Returns its output
  // (empty after a failed assertion) and the Slurm job id in `job_id`.
  std::string RunTrainScript(const std::vector<std::string>& more_env, std::string* job_id) {
    std::vector<std::string> env = Env();
    env.push_back("MPILEARN_STATE_DIR=" + dir_ + "/state");
    env.insert(env.end(), more_env.begin(), more_env.end());
    absl::StatusOr<std::string> job =
        slurm_->Submit({"--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10",
                        Runfile("deploy/slurm_train.sbatch"),
                        Runfile("docs/examples/fashion_mnist_quick.json")},
                       env);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    *job_id = *job;
    absl::StatusOr<std::string> state = slurm_->WaitForEnd(*job, absl::Minutes(5));
    EXPECT_TRUE(state.ok()) << state.status();
    const std::string output = slurm_->Output(*job);
    EXPECT_EQ(state.value_or(""), "COMPLETED")
        << output << ReadFileOrDie(dir_ + "/state/master.log");
    std::cout << "slurm_train.sbatch's output:\n" << output;
    return state.ok() && *state == "COMPLETED" ? output : "";
  }

  std::unique_ptr<NetnsCluster> hosts_;  // outlives slurm_
  std::unique_ptr<SlurmCluster> slurm_;
  std::string dir_;
};

TEST_F(SlurmTest, TrainScriptRunsMasterAndGroupAsStepsToCompletion) {
  std::string job;
  const std::string output = RunTrainScript({}, &job);
  ASSERT_FALSE(output.empty());

  EXPECT_NE(output.find("group 1/1: 2 rank(s) on n2 n3"), std::string::npos) << output;
  EXPECT_NE(output.find("with 2 rank(s)"), std::string::npos) << output;
  EXPECT_NE(output.find("completed; master stopped"), std::string::npos) << output;
  EXPECT_GE(TestAccuracy(output), kMinAccuracy) << output;
  // Step 0 (the master) ran on n1 only, step 1 (the group, one MPI world)
  // on n2 and n3 only.
  EXPECT_TRUE(Launched(slurm_->NodeLog(0), job + ".0")) << slurm_->NodeLog(0);
  EXPECT_FALSE(Launched(slurm_->NodeLog(0), job + ".1")) << slurm_->NodeLog(0);
  for (int host : {1, 2}) {
    EXPECT_TRUE(Launched(slurm_->NodeLog(host), job + ".1")) << slurm_->NodeLog(host);
    EXPECT_FALSE(Launched(slurm_->NodeLog(host), job + ".0")) << slurm_->NodeLog(host);
  }
  // The master ended on the script's SIGTERM, cleanly.
  const std::string master_log = ReadFileOrDie(dir_ + "/state/master.log");
  EXPECT_EQ(master_log.find("Check failed"), std::string::npos) << master_log;
}

// MPILEARN_SHARDS=1: a parameter shard as its own step on n2, syncing with
// the lead on n1; the one-rank group on n3 trains the job on the shard.
TEST_F(SlurmTest, TrainScriptRunsAShardAsAStepOfItsOwn) {
  std::string job;
  const std::string output = RunTrainScript({"MPILEARN_SHARDS=1"}, &job);
  ASSERT_FALSE(output.empty());
  EXPECT_NE(output.find("shard 1/1 step on n2"), std::string::npos) << output;
  EXPECT_NE(output.find("group 1/1: 1 rank(s) on n3"), std::string::npos) << output;
  // mpilearnctl status lists the shard that held the job's weights.
  EXPECT_NE(output.find("SHARDS"), std::string::npos) << output;
  EXPECT_GE(TestAccuracy(output), kMinAccuracy) << output;
  // Step 1 (the shard) ran on n2 only.
  EXPECT_TRUE(Launched(slurm_->NodeLog(1), job + ".1")) << slurm_->NodeLog(1);
  EXPECT_FALSE(Launched(slurm_->NodeLog(2), job + ".1")) << slurm_->NodeLog(2);
  const std::string shard_log = ReadFileOrDie(dir_ + "/state/shard-1.log");
  EXPECT_NE(shard_log.find("holding slice 0 of 1"), std::string::npos) << shard_log;
}

TEST_F(SlurmTest, GroupScriptServesAJobOfAMasterOutsideSlurm) {
  ASSERT_TRUE(MakeCertificates(dir_, "IP:" + hosts_->address(0)).ok());
  WriteFileOrDie(dir_ + "/tokens.txt", absl::StrCat("admin test ", kAdminToken,
                                                    "\nworker slurm ", kWorkerToken, "\n"));
  WriteFileOrDie(dir_ + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
  auto master = MasterProcess::StartOn(
      hosts_->address(0), hosts_->InHost(0, {}), dir_ + "/state",
      {"--tls_cert=" + dir_ + "/server.pem", "--tls_key=" + dir_ + "/server.key",
       "--tokens_file=" + dir_ + "/tokens.txt"});
  ASSERT_TRUE(master.ok()) << master.status();
  MasterClient::Options options;
  options.security.tls_ca = dir_ + "/ca.pem";
  options.security.token = kAdminToken;
  auto client = MasterClient::Connect((*master)->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::string> job_id =
      (*client)->SubmitJob(FashionMnistSubset("downpour", 12000, 2));
  ASSERT_TRUE(job_id.ok()) << job_id.status();

  std::vector<std::string> env = Env();
  env.insert(env.end(), {"JOB_ID=" + *job_id, "MPILEARN_TLS_CA=" + dir_ + "/ca.pem",
                         "MPILEARN_TOKEN_FILE=" + dir_ + "/worker.token"});
  absl::StatusOr<std::string> job = slurm_->Submit(
      {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10",
       "--nodelist=" + SlurmCluster::Node(1) + "," + SlurmCluster::Node(2),
       Runfile("deploy/slurm_group.sbatch"), (*master)->address()},
      env);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::string> state = slurm_->WaitForEnd(*job, absl::Minutes(5));
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string output = slurm_->Output(*job);
  ASSERT_EQ(*state, "COMPLETED") << output;
  std::cout << "slurm_group.sbatch's output:\n" << output;

  EXPECT_NE(output.find("2 ranks x 1 cores"), std::string::npos) << output;
  EXPECT_GE(TestAccuracy(output), kMinAccuracy) << output;
  // mpirun started its daemons on both nodes through Slurm (step 0).
  for (int host : {1, 2}) {
    EXPECT_TRUE(Launched(slurm_->NodeLog(host), *job + ".0")) << slurm_->NodeLog(host);
  }
  absl::StatusOr<v1::JobStatus> status = WaitForStatus(
      **client, *job_id, absl::Seconds(30),
      [](const v1::JobStatus& s) { return s.state() == v1::JOB_STATE_COMPLETED; });
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->groups_size(), 1);
  EXPECT_EQ(status->groups(0).ranks(), 2);
}

// A group started by a plain srun (no MPI plugin) would be N singletons
// training as N groups of one; each worker refuses with what to use instead.
TEST_F(SlurmTest, PlainSrunIsRefusedWithWhatToUse) {
  absl::StatusOr<std::string> out = slurm_->Run(
      {"env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "srun",
       "--nodes=2", "--ntasks=2", "--time=2", Runfile("worker/mpilearn-worker"), "--master",
       hosts_->address(0) + ":7070"});
  ASSERT_FALSE(out.ok()) << *out;
  EXPECT_NE(out.status().message().find("srun --mpi=pmix"), std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace mpilearn::testing
