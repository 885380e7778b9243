// Several mpirun groups serve one job through the master's data queue:
// every epoch covers the training set exactly once across the groups, each
// group's figures add up, and a group killed mid-epoch has its unit handed
// to another group so the epoch still completes. How the units split
// between a fast and a slow group depends on machine speed and scheduling,
// so no split is asserted (the split is printed as test properties).
#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {


const v1::GroupInfo* FindGroup(const v1::JobStatus& status, const std::string& id) {
  for (const v1::GroupInfo& g : status.groups()) {
    if (g.group_id() == id) return &g;
  }
  return nullptr;
}

TEST(MultiGroupTest, TwoGroupsShareEpochsThroughTheQueue) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("two_groups");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address()).value();

  constexpr int kEpochs = 2;
  constexpr int64_t kTrain = 10000;
  v1::JobSpec spec = FashionMnistSubset("sync", kTrain + 2000, kEpochs);
  spec.set_data_unit_size(500);  // 20 units per epoch
  const std::string job_id = client->SubmitJob(spec).value();

  auto fast = StartWorkers(1, (*master)->address(),
                           {"--job_id=" + job_id, "--threads=1"}, dir + "/fast.log");
  auto slow = StartWorkers(1, (*master)->address(),
                           {"--job_id=" + job_id, "--threads=1",
                            "--slowdown_ms_per_batch=25"},
                           dir + "/slow.log");
  ASSERT_TRUE(fast.ok() && slow.ok());
  ASSERT_EQ((*fast)->Wait(absl::Seconds(240)).value_or(-1), 0) << (*fast)->Log();
  ASSERT_EQ((*slow)->Wait(absl::Seconds(240)).value_or(-1), 0) << (*slow)->Log();

  const v1::JobStatus status = client->GetJobStatus(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  ASSERT_EQ(status.history_size(), kEpochs);
  for (const v1::EpochRecord& epoch : status.history()) {
    // No unit lost or doubled: each epoch trained every sample once.
    EXPECT_EQ(epoch.samples(), static_cast<uint64_t>(kTrain))
        << "epoch " << epoch.epoch();
    EXPECT_GT(epoch.val_accuracy(), 0.6);
  }
  ASSERT_EQ(status.groups_size(), 2);
  uint64_t units = 0;
  for (const v1::GroupInfo& g : status.groups()) units += g.units_completed();
  EXPECT_EQ(units, 2u * 20u);
  // Which group id went to which process is decided by registration order;
  // the logs say which one each process was.
  const std::string slow_log = (*slow)->Log();
  const v1::GroupInfo* slow_group = nullptr;
  const v1::GroupInfo* fast_group = nullptr;
  for (const v1::GroupInfo& g : status.groups()) {
    (absl::StrContains(slow_log, "group " + g.group_id() + " ") ? slow_group
                                                                 : fast_group) = &g;
  }
  ASSERT_NE(slow_group, nullptr);
  ASSERT_NE(fast_group, nullptr);
  // Each group trained exactly the samples of the units it completed.
  for (const v1::GroupInfo* g : {slow_group, fast_group}) {
    EXPECT_EQ(g->samples_trained(), g->units_completed() * 500u)
        << g->group_id();
  }
  // The slow group usually ends with far fewer units than the fast one, but
  // nothing guarantees it: recorded for the reader, not asserted.
  RecordProperty("units_slow", static_cast<int>(slow_group->units_completed()));
  RecordProperty("units_fast", static_cast<int>(fast_group->units_completed()));
}

TEST(MultiGroupTest, KilledGroupsUnitIsRequeuedAndTheEpochCompletes) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("killed_group");
  auto master = MasterProcess::Start(dir, {"--group_timeout_s=2"});
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address()).value();

  constexpr int64_t kTrain = 4000;
  v1::JobSpec spec = FashionMnistSubset("downpour", kTrain + 2000, 2);
  spec.set_data_unit_size(400);  // 10 units per epoch
  const std::string job_id = client->SubmitJob(spec).value();

  auto victim = StartWorkers(1, (*master)->address(),
                             {"--job_id=" + job_id, "--threads=1",
                              "--slowdown_ms_per_batch=40"},
                             dir + "/victim.log");
  ASSERT_TRUE(victim.ok());
  // Once the victim has finished a unit it holds the next one: kill it then.
  auto holding = WaitForStatus(*client, job_id, absl::Seconds(120),
                               [](const v1::JobStatus& s) {
                                 return s.groups_size() == 1 &&
                                        s.groups(0).units_completed() >= 1;
                               });
  ASSERT_TRUE(holding.ok()) << holding.status() << (*victim)->Log();
  const std::string victim_group = holding->groups(0).group_id();
  auto survivor = StartWorkers(1, (*master)->address(),
                               {"--job_id=" + job_id, "--threads=1",
                                "--slowdown_ms_per_batch=5"},
                               dir + "/survivor.log");
  ASSERT_TRUE(survivor.ok());
  pid_t rank = 0;
  for (pid_t pid : (*victim)->Descendants()) {
    if (absl::StrContains(CommandLine(pid), "mpilearn-worker")) rank = pid;
  }
  ASSERT_NE(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  EXPECT_NE((*victim)->Wait(absl::Seconds(60)).value_or(0), 0);

  ASSERT_EQ((*survivor)->Wait(absl::Seconds(240)).value_or(-1), 0)
      << (*survivor)->Log();
  const v1::JobStatus status = client->GetJobStatus(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  EXPECT_GE(status.units_requeued(), 1u);
  const v1::GroupInfo* lost = FindGroup(status, victim_group);
  ASSERT_NE(lost, nullptr);
  EXPECT_FALSE(lost->alive());
  ASSERT_EQ(status.history_size(), 2);
  for (const v1::EpochRecord& epoch : status.history()) {
    EXPECT_EQ(epoch.samples(), static_cast<uint64_t>(kTrain))
        << "epoch " << epoch.epoch();
  }
}

}  // namespace
}  // namespace mpilearn::testing
