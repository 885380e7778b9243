// Fault injection on the master: SIGKILL it mid-training, restart it on the
// same --state_dir and port. It reloads the job from its last checkpoint,
// the training group (still running under mpirun) reconnects with backoff,
// registers again and finishes the job with the expected accuracy. A job
// with a learning-rate schedule goes on with the scheduled rate of the
// update count it resumed at, not from the schedule's start.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/client/master_client.h"
#include "common/schedule/lr_schedule.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

// SIGKILLs `master` and starts a master again on its state directory `dir`
// and port (the group's address stays valid); `client` then talks to it,
// reconnecting for up to 20 s.
void KillAndRestart(std::unique_ptr<MasterProcess>& master, const std::string& dir,
                    std::unique_ptr<MasterClient>& client) {
  const std::string address = master->address();
  ASSERT_EQ(kill(master->process().pid(), SIGKILL), 0);
  ASSERT_TRUE(master->process().Wait(absl::Seconds(10)).has_value());
  const std::string port = address.substr(address.rfind(':') + 1);
  auto restarted = MasterProcess::Start(dir, {"--listen=127.0.0.1:" + port});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  master = *std::move(restarted);
  MasterClient::Options patient;
  patient.reconnect_timeout = absl::Seconds(20);
  client = MasterClient::Connect(address, patient).value();
}

TEST(ResumeTest, KilledMasterRestartsFromCheckpointAndGroupFinishes) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("resume");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  auto client = MasterClient::Connect(address).value();

  constexpr int kEpochs = 3;
  v1::JobSpec spec = FashionMnistSubset("downpour", 12000, kEpochs);
  spec.mutable_checkpoint()->set_every_updates(25);
  const std::string job_id = client->SubmitJob(spec).value();
  auto group = StartWorkers(2, address,
                            {"--job_id=" + job_id, "--threads=1",
                             "--reconnect_timeout_s=60",
                             // At least 10 ms per batch: the ~470 batches
                             // per rank take over 4 s however fast the
                             // machine, so the kill below (after ~30 of
                             // them) lands mid-training.
                             "--slowdown_ms_per_batch=10"},
                            dir + "/group.log");
  ASSERT_TRUE(group.ok());

  // Mid-unit (both ranks pushing), with at least one checkpoint on disk.
  auto before = WaitForStatus(*client, job_id, absl::Seconds(120),
                              [](const v1::JobStatus& s) {
                                return s.checkpoint_version() > 0 &&
                                       s.updates_applied() >= 60;
                              });
  ASSERT_TRUE(before.ok()) << before.status() << (*group)->Log();
  ASSERT_LT(before->epochs_done(), kEpochs) << "too late to kill mid-training";
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(*master, dir, client));
  auto reloaded = client->GetJobStatus(job_id);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  // At most the updates since the last checkpoint are lost.
  EXPECT_GE(reloaded->version(), before->checkpoint_version());

  const std::optional<int> code = (*group)->Wait(absl::Seconds(240));
  ASSERT_EQ(code.value_or(-1), 0) << (*group)->Log();
  const v1::JobStatus done = client->GetJobStatus(job_id).value();
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.message();
  ASSERT_EQ(done.history_size(), kEpochs);
  EXPECT_GE(done.test_accuracy(), 0.75);
  EXPECT_NE((*group)->Log().find("registering again"), std::string::npos)
      << (*group)->Log();
}

TEST(ResumeTest, KilledMasterGoesOnWithTheScheduledRate) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("resume_schedule");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  auto client = MasterClient::Connect(address).value();

  v1::JobSpec spec = FashionMnistSubset("sync", 12000, 2);
  spec.mutable_checkpoint()->set_every_updates(25);
  v1::LrScheduleSpec* schedule = spec.mutable_optimizer()->mutable_schedule();
  schedule->set_name("cosine");
  schedule->set_warmup(20);
  schedule->set_t_max(300);
  schedule->set_min_lr(1e-5);
  const std::string job_id = client->SubmitJob(spec).value();
  const v1::JobSpec normalized = client->GetJobStatus(job_id).value().spec();
  const LrSchedule rates(normalized.optimizer().schedule(),
                         normalized.optimizer().learning_rate(), false);
  auto group = StartWorkers(2, address,
                            {"--job_id=" + job_id, "--threads=1", "--reconnect_timeout_s=60",
                             // As above: the kill lands mid-training.
                             "--slowdown_ms_per_batch=10"},
                            dir + "/group.log");
  ASSERT_TRUE(group.ok());
  auto before = WaitForStatus(*client, job_id, absl::Seconds(120), [](const v1::JobStatus& s) {
    return s.checkpoint_version() >= 50 && s.updates_applied() >= 60;
  });
  ASSERT_TRUE(before.ok()) << before.status() << (*group)->Log();
  ASSERT_NE(before->state(), v1::JOB_STATE_COMPLETED) << "too late to kill mid-training";
  // One sync group: the version counts the optimizer's steps, the
  // schedule's positions.
  EXPECT_DOUBLE_EQ(before->learning_rate(), rates.RateAt(before->version()));
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(*master, dir, client));
  const v1::JobStatus reloaded = client->GetJobStatus(job_id).value();
  // Resumed at a checkpoint's version, past the warm-up: the rate there,
  // not the warm-up's first.
  ASSERT_GE(reloaded.version(), 50u);
  EXPECT_DOUBLE_EQ(reloaded.learning_rate(), rates.RateAt(reloaded.version()));
  EXPECT_LT(reloaded.learning_rate(), normalized.optimizer().learning_rate());

  const std::optional<int> code = (*group)->Wait(absl::Seconds(240));
  ASSERT_EQ(code.value_or(-1), 0) << (*group)->Log();
  const v1::JobStatus done = client->GetJobStatus(job_id).value();
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.message();
  EXPECT_DOUBLE_EQ(done.learning_rate(), rates.RateAt(done.version()));
  EXPECT_GE(done.test_accuracy(), 0.75);
  std::printf("killed at version %llu (rate %.6g), resumed at %llu (rate %.6g), ended at %llu "
              "(rate %.6g), test_accuracy=%.4f\n",
              static_cast<unsigned long long>(before->version()), before->learning_rate(),
              static_cast<unsigned long long>(reloaded.version()), reloaded.learning_rate(),
              static_cast<unsigned long long>(done.version()), done.learning_rate(),
              done.test_accuracy());
}

}  // namespace
}  // namespace mpilearn::testing
