#include "server/job_registry.h"

#include <filesystem>
#include <fstream>

#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

v1::JobSpec SgdSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.5);
  return spec;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = std::string(getenv("TEST_TMPDIR")) + "/" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(state_dir_);
    registry_ = MakeRegistry();
  }

  std::unique_ptr<JobRegistry> MakeRegistry() {
    JobRegistry::Options options;
    options.state_dir = state_dir_;
    options.group_timeout = absl::Seconds(10);
    options.clock = [this] { return now_; };
    auto registry = JobRegistry::Create(options);
    EXPECT_TRUE(registry.ok()) << registry.status();
    return std::move(registry).value();
  }

  v1::RegisterGroupResponse Register(const std::string& job_id) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(2);
    request.set_host("test");
    auto response = registry_->RegisterGroup(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  }

  // Weights w = [1, 2, 3] (shape {3}) and b = [10] (shape {1}).
  void InitWeights(const std::string& job_id, const std::string& group_id) {
    auto response = registry_->InitWeights(
        job_id, group_id, MakeFloat32Header(0, {"w", "b"}, {{3}, {1}}),
        {{1, 2, 3}, {10}});
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->accepted());
  }

  std::string state_dir_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobRegistryTest, GradientUpdatesWeightsAndVersion) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  const auto group = Register(job_id);
  EXPECT_FALSE(group.weights_initialized());
  EXPECT_EQ(group.spec().epochs(), 5);  // defaults filled in
  InitWeights(job_id, group.group_id());

  // A second group's offer is declined: the first one wins.
  const auto late = Register(job_id);
  EXPECT_TRUE(late.weights_initialized());
  auto declined = registry_->InitWeights(
      job_id, late.group_id(), MakeFloat32Header(0, {"w", "b"}, {{3}, {1}}),
      {{0, 0, 0}, {0}});
  ASSERT_TRUE(declined.ok());
  EXPECT_FALSE(declined->accepted());

  auto job = registry_->FindJob(job_id).value();
  GradientUpdate update;
  update.group_id = group.group_id();
  update.samples = 64;
  update.values = {{1, -1, 0.5f}, {2}};
  auto weights = registry_->ApplyGradient(*job, update);
  ASSERT_TRUE(weights.ok()) << weights.status();
  // Plain SGD: w - 0.5 * g.
  EXPECT_EQ((*weights)->values[0], (std::vector<float>{0.5f, 2.5f, 2.75f}));
  EXPECT_EQ((*weights)->values[1], (std::vector<float>{9}));
  EXPECT_EQ((*weights)->header.version(), 1u);

  // The snapshot handed out stays as it was after the next update.
  auto second = registry_->ApplyGradient(*job, update);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*weights)->values[1], (std::vector<float>{9}));
  EXPECT_EQ((*second)->values[1], (std::vector<float>{8}));

  auto status = registry_->Status(job_id).value();
  EXPECT_EQ(status.updates_applied(), 2u);
  EXPECT_EQ(status.samples_trained(), 128u);
  EXPECT_EQ(status.version(), 2u);
  EXPECT_EQ(status.parameters(), 4u);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobRegistryTest, UnknownJobAndEmptyQueueAreNotFound) {
  v1::RegisterGroupRequest request;
  request.set_ranks(1);
  auto none = registry_->RegisterGroup(request);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("mpilearnctl submit"), std::string::npos);

  request.set_job_id("job-999999");
  auto unknown = registry_->RegisterGroup(request);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Status("nope").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, InvalidSpecIsRejectedWithFieldName) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(-3);
  auto submitted = registry_->Submit(spec);
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(submitted.status().message().find("epochs"), std::string::npos);
  EXPECT_TRUE(registry_->List().empty());
}

TEST_F(JobRegistryTest, QueueHandsOutOldestQueuedJob) {
  const std::string first = registry_->Submit(SgdSpec()).value();
  const std::string second = registry_->Submit(SgdSpec()).value();
  EXPECT_EQ(Register("").job_id(), first);
  EXPECT_EQ(Register("").job_id(), second);
}

TEST_F(JobRegistryTest, LostGroupRequeuesJobKeepingWeights) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  const auto group = Register(job_id);
  InitWeights(job_id, group.group_id());
  now_ += absl::Seconds(5);
  EXPECT_EQ(registry_->ReapLostGroups(), 0);
  now_ += absl::Seconds(11);
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  EXPECT_EQ(registry_->Status(job_id)->state(), v1::JOB_STATE_QUEUED);

  // The lost group is told to restart; a new group continues the job.
  auto job = registry_->FindJob(job_id).value();
  GradientUpdate update;
  update.group_id = group.group_id();
  update.values = {{0, 0, 0}, {0}};
  EXPECT_EQ(registry_->ApplyGradient(*job, update).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto next = Register("");
  EXPECT_EQ(next.job_id(), job_id);
  EXPECT_TRUE(next.weights_initialized());
}

TEST_F(JobRegistryTest, CompletionWritesHistoryAndWeights) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  const auto group = Register(job_id);
  InitWeights(job_id, group.group_id());
  v1::EpochRecord record;
  record.set_epoch(1);
  record.set_val_accuracy(0.75);
  record.set_group_id(group.group_id());
  ASSERT_TRUE(registry_->ReportEpoch(job_id, record).ok());

  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group.group_id());
  leave.set_completed(true);
  leave.set_test_accuracy(0.8);
  leave.set_test_loss(0.5);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);

  const std::string dir = state_dir_ + "/jobs/" + job_id;
  EXPECT_TRUE(std::filesystem::exists(dir + "/spec.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/weights.pb"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer.pb"));
  std::ifstream history(dir + "/history.json");
  std::string text((std::istreambuf_iterator<char>(history)),
                   std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"val_accuracy\": 0.75"), std::string::npos) << text;
  EXPECT_NE(text.find("JOB_STATE_COMPLETED"), std::string::npos);

  // A finished job takes no new group.
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  EXPECT_EQ(registry_->RegisterGroup(request).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A restarted master does not reuse the id.
  registry_ = MakeRegistry();
  EXPECT_NE(registry_->Submit(SgdSpec()).value(), job_id);
}

TEST_F(JobRegistryTest, LostGroupCannotFailTheJobItWasRemovedFrom) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  const auto paused = Register(job_id);
  now_ += absl::Seconds(11);
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  const auto successor = Register("");
  ASSERT_EQ(successor.job_id(), job_id);

  // The paused group wakes up, finds itself lost and reports an error.
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(paused.group_id());
  leave.set_error("group was declared lost");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_RUNNING);

  // The successor completes it; a late error after that changes nothing.
  leave.set_group_id(successor.group_id());
  leave.clear_error();
  leave.set_completed(true);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  leave.set_completed(false);
  leave.set_error("late failure");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
}

TEST_F(JobRegistryTest, GroupErrorFailsJobWithMessage) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  const auto group = Register(job_id);
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group.group_id());
  leave.set_error("data.train_images: cannot open 'x'");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_FAILED);
  EXPECT_NE(registry_->Status(job_id)->message().find("cannot open"),
            std::string::npos);
}

}  // namespace
}  // namespace mpilearn::server
