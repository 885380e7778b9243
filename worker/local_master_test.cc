// The local mode's master ticks like mpilearn-master: with no call made,
// the job's time-based checkpoint is written (MasterCore::Tick, run by
// server::Master's ticker), and destroying it shuts the master down.
#include "worker/local_master.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

std::string StateDir() {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

bool HasFile(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

TEST(LocalMasterTest, TicksTimeBasedCheckpoints) {
  const std::string dir = StateDir();
  auto master = LocalMaster::Create(dir, server::EngineOptions());
  ASSERT_TRUE(master.ok()) << master.status();

  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_model()->set_torchscript("model.pt");
  // Due at the first tick after the weights exist (no checkpoint yet).
  spec.mutable_checkpoint()->set_every_seconds(30);
  const std::string job_id = (*master)->SubmitJob(spec).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  const std::string group_id =
      (*master)->RegisterGroup(request).value().group_id();
  const std::vector<float> values(8, 0.5f);
  const std::vector<absl::Span<const float>> tensors = {values};
  ASSERT_TRUE((*master)
                  ->InitWeights(job_id, group_id,
                                MakeFloat32Header(0, {"w"}, {{8}}), tensors)
                  .value());

  // No further call: only the ticker (about once a second) can write it.
  const std::string checkpoint =
      dir + "/jobs/" + job_id + "/checkpoints/ckpt-000000000000.pb";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!HasFile(checkpoint) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(HasFile(checkpoint)) << checkpoint;
  master->reset();  // stops the ticker and checkpoints; must not hang
}

}  // namespace
}  // namespace mpilearn::worker
