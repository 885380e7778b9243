// Fault injection: a worker rank is SIGKILLed mid-epoch. The master keeps
// serving, declares the group lost after --group_timeout_s, re-queues the
// job with its weights and progress, and a new group finishes it.
#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/master_client.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

// Polls the job's status until `done` holds or `timeout` passes.

TEST(WorkerFailureTest, KilledRankIsDetectedAndJobResumesOnNewGroup) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("worker_failure");
  auto master = MasterProcess::Start(dir, {"--group_timeout_s=3"});
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  constexpr int kEpochs = 3;
  const std::string job_id =
      (*client)->SubmitJob(FashionMnistSubset("downpour", 12000, kEpochs)).value();
  // A second job on the same master, to show the others keep being served.
  const std::string other_id =
      (*client)->SubmitJob(FashionMnistSubset("sync", 4000, 1)).value();

  // 10 ms per batch: an epoch (156 batches per rank) lasts over 1.5 s
  // however fast the machine, so the kill after 50 updates (~25 batches per
  // rank) lands in the first epoch.
  auto group = StartWorkers(2, (*master)->address(),
                            {"--job_id=" + job_id, "--threads=1",
                             "--slowdown_ms_per_batch=10"},
                            dir + "/group1.log");
  ASSERT_TRUE(group.ok());
  auto training = WaitForStatus(**client, job_id, absl::Seconds(120),
                                [](const v1::JobStatus& s) {
                                  return s.updates_applied() >= 50;
                                });
  ASSERT_TRUE(training.ok()) << training.status() << (*group)->Log();
  ASSERT_EQ(training->epochs_done(), 0) << "killed too late to be mid-epoch";

  // SIGKILL one rank: no goodbye reaches the master.
  pid_t victim = 0;
  for (pid_t pid : (*group)->Descendants()) {
    if (absl::StrContains(CommandLine(pid), "mpilearn-worker")) victim = pid;
  }
  ASSERT_NE(victim, 0) << "no worker rank found under mpirun";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const std::optional<int> group_exit = (*group)->Wait(absl::Seconds(60));
  ASSERT_TRUE(group_exit.has_value()) << "mpirun did not end after a rank died";
  EXPECT_NE(*group_exit, 0);

  // The master notices the silence, and re-queues the job as it was.
  auto lost = WaitForStatus(**client, job_id, absl::Seconds(30),
                            [](const v1::JobStatus& s) {
                              return s.state() == v1::JOB_STATE_QUEUED;
                            });
  ASSERT_TRUE(lost.ok()) << lost.status();
  ASSERT_EQ(lost->groups_size(), 1);
  EXPECT_FALSE(lost->groups(0).alive());
  EXPECT_NE(lost->message().find("lost"), std::string::npos) << lost->message();
  EXPECT_GE(lost->updates_applied(), training->updates_applied());
  EXPECT_FALSE((*master)->process().Wait(absl::ZeroDuration()).has_value());

  // The other job is unaffected: a group trains it to completion.
  auto other = StartWorkers(1, (*master)->address(),
                            {"--job_id=" + other_id, "--threads=1"},
                            dir + "/other.log");
  ASSERT_TRUE(other.ok());
  ASSERT_EQ((*other)->Wait(absl::Seconds(120)).value_or(-1), 0) << (*other)->Log();
  EXPECT_EQ((*client)->GetJobStatus(other_id)->state(), v1::JOB_STATE_COMPLETED);

  // A new group takes the re-queued job from the queue and finishes it,
  // starting from the master's weights rather than from scratch.
  auto resumed = StartWorkers(2, (*master)->address(), {"--threads=1"},
                              dir + "/group2.log");
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ((*resumed)->Wait(absl::Seconds(240)).value_or(-1), 0)
      << (*resumed)->Log();
  auto done = (*client)->GetJobStatus(job_id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done->history_size(), kEpochs);
  EXPECT_GT(done->updates_applied(), lost->updates_applied());
  EXPECT_GE(done->history(kEpochs - 1).val_accuracy(), 0.75);
  EXPECT_NE((*resumed)->Log().find("job " + job_id), std::string::npos);
}

}  // namespace
}  // namespace mpilearn::testing
