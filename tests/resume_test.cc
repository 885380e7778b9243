// Fault injection on the master: SIGKILL it mid-training, restart it on the
// same --state_dir and port. It reloads the job from its last checkpoint,
// the training group (still running under mpirun) reconnects with backoff,
// registers again and finishes the job with the expected accuracy.
#include <signal.h>

#include <string>

#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

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
  ASSERT_EQ(kill((*master)->process().pid(), SIGKILL), 0);
  ASSERT_TRUE((*master)->process().Wait(absl::Seconds(10)).has_value());

  // Same state dir, same port: the group's address stays valid.
  const std::string port = address.substr(address.rfind(':') + 1);
  auto restarted = MasterProcess::Start(dir, {"--listen=127.0.0.1:" + port});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  MasterClient::Options patient;
  patient.reconnect_timeout = absl::Seconds(20);
  client = MasterClient::Connect(address, patient).value();
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

}  // namespace
}  // namespace mpilearn::testing
