// End to end: the real master on a loopback port and `mpirun -np 2
// mpilearn-worker` train a Fashion-MNIST subset in each algorithm.
//
// Accuracy threshold: 0.75 on held-out data. Chance is 0.10 (10 balanced
// classes); the default MLP reaches about 0.82 after 2 epochs on 10,000
// samples, so 0.75 leaves room for run-to-run variation while any broken
// piece (gradients not applied, weights not returned, ranks training on the
// same shard, a wrong average) stays far below it.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "common/client/master_client.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

constexpr double kMinAccuracy = 0.75;
constexpr int64_t kTrainLimit = 12000;  // 10,000 train + 2,000 validation
constexpr int kEpochs = 2;
constexpr int kBatch = 32;

// Steps each of two ranks trains per epoch of `train` samples: the master
// hands out units of data_unit_size (default 2048) samples, and each rank
// trains its half of a unit in ceil(half / batch) steps.
int64_t StepsPerRank(int64_t train) {
  int64_t steps = 0;
  for (int64_t begin = 0; begin < train; begin += 2048) {
    const int64_t unit = std::min<int64_t>(2048, train - begin);
    steps += ((unit + 1) / 2 + kBatch - 1) / kBatch;
  }
  return steps;
}

class TrainingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainingTest, TwoRanksTrainWellAboveChance) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string algorithm = GetParam();
  const std::string dir = NewTempDir("training_" + algorithm);
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  auto job_id = (*client)->SubmitJob(
      FashionMnistSubset(algorithm, kTrainLimit, kEpochs));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(2, (*master)->address(),
                              {"--job_id=" + *job_id, "--threads=1"},
                              dir + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();
  const std::optional<int> exit_code = (*workers)->Wait(absl::Seconds(300));
  ASSERT_TRUE(exit_code.has_value()) << "workers did not finish in 300 s:\n"
                                     << (*workers)->Log();
  ASSERT_EQ(*exit_code, 0) << (*workers)->Log();

  auto status = (*client)->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
  ASSERT_EQ(status->history_size(), kEpochs);
  const v1::EpochRecord& last = status->history(kEpochs - 1);
  EXPECT_GE(last.val_accuracy(), kMinAccuracy);
  EXPECT_LT(last.val_loss(), status->history(0).train_loss());
  ASSERT_TRUE(status->has_test_accuracy());
  EXPECT_GE(status->test_accuracy(), kMinAccuracy);

  // Every training sample is used exactly once per epoch across the ranks.
  const int64_t train = kTrainLimit - 2000;
  EXPECT_EQ(status->samples_trained(), static_cast<uint64_t>(train * kEpochs));
  // Downpour: each rank pushes each of its batches; sync: the leader pushes
  // one averaged gradient per step.
  const int64_t steps_per_rank = StepsPerRank(train);
  const int64_t expected_updates =
      (algorithm == "downpour" ? 2 : 1) * steps_per_rank * kEpochs;
  EXPECT_EQ(status->updates_applied(), static_cast<uint64_t>(expected_updates));

  // The leader prints the machine-readable result line, and the master wrote
  // the history and final weights.
  EXPECT_NE((*workers)->Log().find("test_accuracy="), std::string::npos);
  const std::string history =
      ReadFileOrDie(dir + "/jobs/" + *job_id + "/history.json");
  EXPECT_NE(history.find("JOB_STATE_COMPLETED"), std::string::npos);
  EXPECT_FALSE(ReadFileOrDie(dir + "/jobs/" + *job_id + "/weights.pb").empty());
}

// The exchange's other paths end to end: the group reaches the master over
// its Unix socket (--listen_unix, --master unix:PATH) and pushes and pulls in
// bf16 with error feedback. It must train as well as the fp32 runs above,
// and every push must be applied exactly once (numbered pushes: none lost,
// none applied twice).
TEST(TrainingWireTest, Bf16OverUnixSocketTrainsWell) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("training_bf16_unix");
  // A socket path must fit sun_path (108 bytes); the test's temporary
  // directory may not.
  const std::string socket =
      absl::StrCat("/tmp/mpilearn-test-", getpid(), ".sock");
  auto master = MasterProcess::Start(dir, {"--listen_unix=" + socket});
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect("unix:" + socket);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::JobSpec spec = FashionMnistSubset("downpour", kTrainLimit, kEpochs);
  spec.mutable_exchange()->set_update_dtype(v1::DTYPE_BFLOAT16);
  spec.mutable_exchange()->set_weights_dtype(v1::DTYPE_BFLOAT16);
  auto job_id = (*client)->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(2, "unix:" + socket,
                              {"--job_id=" + *job_id, "--threads=1"},
                              dir + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();
  const std::optional<int> exit_code = (*workers)->Wait(absl::Seconds(300));
  ASSERT_TRUE(exit_code.has_value()) << "workers did not finish in 300 s:\n"
                                     << (*workers)->Log();
  ASSERT_EQ(*exit_code, 0) << (*workers)->Log();
  auto status = (*client)->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
  EXPECT_EQ(status->spec().exchange().update_dtype(), v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(status->has_test_accuracy());
  EXPECT_GE(status->test_accuracy(), kMinAccuracy);
  const int64_t train = kTrainLimit - 2000;
  const int64_t steps_per_rank = StepsPerRank(train);
  EXPECT_EQ(status->updates_applied(),
            static_cast<uint64_t>(2 * steps_per_rank * kEpochs));
  (*master)->process().Stop();
  std::remove(socket.c_str());
}

// Two updates in flight, bf16 with error feedback: a downpour rank's (a
// sync leader's) pushes run concurrently (numbered and encoded under the
// client's lock) and may reach the master out of order. Every push is
// applied exactly once, and with one epoch more (its updates are staler)
// the job trains as well as the runs above.
class InFlightTrainingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InFlightTrainingTest, EveryPushAppliedOnceAndTrainsWell) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string algorithm = GetParam();
  const std::string dir = NewTempDir("training_in_flight_" + algorithm);
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kEpochsInFlight = kEpochs + 1;
  v1::JobSpec spec = FashionMnistSubset(algorithm, kTrainLimit, kEpochsInFlight);
  spec.mutable_exchange()->set_updates_in_flight(2);
  spec.mutable_exchange()->set_update_dtype(v1::DTYPE_BFLOAT16);
  absl::StatusOr<JobRun> run = RunJobToEnd(**client, (*master)->address(), spec, 2, dir);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->log;
  const v1::JobStatus& status = run->status;
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  EXPECT_EQ(status.spec().exchange().updates_in_flight(), 2);
  ASSERT_TRUE(status.has_test_accuracy());
  std::cout << algorithm << ", 2 updates in flight: test_accuracy=" << status.test_accuracy()
            << "\n";
  EXPECT_GE(status.test_accuracy(), kMinAccuracy);
  const int64_t train = kTrainLimit - 2000;
  // Downpour: each rank pushes each batch; sync: the leader, once a step.
  const int pushers = algorithm == "downpour" ? 2 : 1;
  EXPECT_EQ(status.updates_applied(),
            static_cast<uint64_t>(pushers * StepsPerRank(train) * kEpochsInFlight));
  EXPECT_EQ(status.samples_trained(), static_cast<uint64_t>(train * kEpochsInFlight));
}

INSTANTIATE_TEST_SUITE_P(DownpourAndSync, InFlightTrainingTest,
                         ::testing::Values("downpour", "sync"),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Algorithms, TrainingTest,
                         ::testing::Values("downpour", "sync"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mpilearn::testing
