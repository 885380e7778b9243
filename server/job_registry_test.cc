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

  // Completes `completed` (a loss of 0.5 per sample) and asks for the next
  // data unit.
  absl::StatusOr<v1::NextDataUnitResponse> NextUnit(
      const std::string& job_id, const std::string& group_id,
      int64_t train_samples, const std::vector<v1::DataUnit>& completed) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_train_samples(train_samples);
    for (const v1::DataUnit& unit : completed) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(unit.unit_id());
      done->set_samples(static_cast<uint64_t>(unit.end() - unit.begin()));
      done->set_loss_sum(0.5 * static_cast<double>(done->samples()));
    }
    return registry_->NextDataUnit(request);
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
  // Samples are counted from completed data units, not from pushes.
  EXPECT_EQ(status.samples_trained(), 0u);
  ASSERT_EQ(status.groups_size(), 2);
  EXPECT_EQ(status.groups(0).group_id(), group.group_id());
  EXPECT_EQ(status.groups(0).updates_applied(), 2u);
  EXPECT_EQ(status.groups(1).updates_applied(), 0u);
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
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(spec).value();
  const auto group = Register(job_id);
  InitWeights(job_id, group.group_id());
  v1::EpochRecord record;
  record.set_epoch(1);
  record.set_val_accuracy(0.75);
  record.set_group_id(group.group_id());
  // The epoch is not finished before its data units are.
  EXPECT_EQ(registry_->ReportEpoch(job_id, record).status().code(),
            absl::StatusCode::kNotFound);
  auto unit = NextUnit(job_id, group.group_id(), 1000, {});
  ASSERT_TRUE(unit.ok()) << unit.status();
  ASSERT_EQ(unit->action(), v1::NextDataUnitResponse::TRAIN);
  auto done = NextUnit(job_id, group.group_id(), 1000, {unit->unit()});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(done->finish());
  EXPECT_EQ(done->finished_epochs_size(), 1);
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

// A group lost in the middle of an epoch: the unit it held goes back to the
// queue and to the group still training, and the epoch still covers every
// sample once.
TEST_F(JobRegistryTest, LostGroupsUnitGoesToTheOtherGroup) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  spec.set_data_unit_size(100);
  const std::string job_id = registry_->Submit(spec).value();
  const std::string a = Register(job_id).group_id();
  const std::string b = Register(job_id).group_id();
  constexpr int64_t kSamples = 450;  // 5 units, the last of 50

  auto held_a = NextUnit(job_id, a, kSamples, {}).value();
  auto held_b = NextUnit(job_id, b, kSamples, {}).value();
  ASSERT_EQ(held_b.action(), v1::NextDataUnitResponse::TRAIN);
  const int64_t lost_unit = held_b.unit().unit_id();
  EXPECT_EQ(lost_unit, 1);
  // a keeps working; b goes silent past the group timeout (10 s).
  for (int i = 0; i < 2; ++i) {
    now_ += absl::Seconds(6);
    held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  }
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.units_requeued(), 1u);

  // The lost group is refused; its unit is a's next.
  EXPECT_EQ(NextUnit(job_id, b, kSamples, {held_b.unit()}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  ASSERT_EQ(held_a.action(), v1::NextDataUnitResponse::TRAIN);
  EXPECT_EQ(held_a.unit().unit_id(), lost_unit);
  EXPECT_EQ(held_a.unit().begin(), 100);
  EXPECT_EQ(held_a.unit().end(), 200);
  held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  EXPECT_EQ(held_a.unit().end(), kSamples);
  auto last = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  EXPECT_EQ(last.action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(last.finish());
  ASSERT_EQ(last.finished_epochs_size(), 1);

  status = registry_->Status(job_id).value();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).samples(), static_cast<uint64_t>(kSamples));
  EXPECT_DOUBLE_EQ(status.history(0).train_loss(), 0.5);
  EXPECT_EQ(status.samples_trained(), static_cast<uint64_t>(kSamples));
  EXPECT_EQ(status.units_requeued(), 1u);
  EXPECT_EQ(status.epochs_done(), 1);
  for (const v1::GroupInfo& group : status.groups()) {
    EXPECT_EQ(group.units_completed(), group.group_id() == a ? 5u : 0u);
    EXPECT_EQ(group.samples_trained(),
              group.group_id() == a ? static_cast<uint64_t>(kSamples) : 0u);
  }
  // The finished epoch is already on disk.
  std::ifstream history(state_dir_ + "/jobs/" + job_id + "/history.json");
  std::string text((std::istreambuf_iterator<char>(history)),
                   std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"train_loss\": 0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("\"units_requeued\": \"1\""), std::string::npos) << text;
}

TEST_F(JobRegistryTest, NextDataUnitNeedsARegisteredGroup) {
  const std::string job_id = registry_->Submit(SgdSpec()).value();
  EXPECT_EQ(NextUnit(job_id, "g-99", 100, {}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(NextUnit("job-999999", "g-1", 100, {}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mpilearn::server
