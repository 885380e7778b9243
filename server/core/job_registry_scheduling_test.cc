// JobRegistry's scheduling between jobs (job_registry_queue.cc): which
// queued job a group without a job id takes (priority, fair share by owner
// and by study, recent use), the tokens' scope, group limits, the queue
// order shown to users, and jobs ended by their wall-time limit (also after
// a restart). The order's own rules are tested in
// server/sched/queue_order_test.cc; here the registry feeds it real jobs.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/job_registry.h"

namespace mpilearn::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class RegistrySchedulingTest : public ::testing::Test {
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
    options.group_timeout = absl::Seconds(1000);
    options.clock = [this] { return now_; };
    options.scheduling = policy_;
    return JobRegistry::Create(std::move(options)).value();
  }

  std::string Submit(const std::string& owner, const std::string& study = "",
                     int priority = 0, double max_wall_seconds = 0) {
    v1::JobSpec spec;
    spec.mutable_data()->set_train_images("images.gz");
    spec.mutable_data()->set_train_labels("labels.gz");
    spec.set_owner(owner);
    spec.set_study(study);
    spec.set_priority(priority);
    spec.set_max_wall_seconds(max_wall_seconds);
    return registry_->Submit(JobConfig::Create(spec).value()).value();
  }

  absl::StatusOr<v1::RegisterGroupResponse> Take(
      const std::string& job_id = "", const JobRegistry::OwnerFilter& may_train = nullptr) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(1);
    request.set_host("test");
    return registry_->RegisterGroup(request, may_train);
  }

  std::string TakenJob(const JobRegistry::OwnerFilter& may_train = nullptr) {
    absl::StatusOr<v1::RegisterGroupResponse> group = Take("", may_train);
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? group->job_id() : "";
  }

  void Leave(const v1::RegisterGroupResponse& group) {
    v1::LeaveRequest leave;
    leave.set_job_id(group.job_id());
    leave.set_group_id(group.group_id());
    ASSERT_TRUE(registry_->Leave(leave).ok());
  }

  std::string state_dir_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
  SchedulingPolicy policy_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(RegistrySchedulingTest, GroupsTakeTurnsBetweenOwnersNotTheOldestFirst) {
  const std::string a1 = Submit("alice");
  const std::string a2 = Submit("alice");
  const std::string b1 = Submit("bob");
  // Each new group sees the groups the earlier ones took.
  EXPECT_EQ(TakenJob(), a1);
  EXPECT_EQ(TakenJob(), b1);
  EXPECT_EQ(TakenJob(), a2);
}

TEST_F(RegistrySchedulingTest, TheQueueOrderIsTheOrderGroupsTake) {
  const std::string t0 = Submit("alice", "s-1");
  const std::string t1 = Submit("alice", "s-1");
  const std::string t2 = Submit("alice", "s-1");
  const std::string b1 = Submit("bob");
  const std::string urgent = Submit("carol", "", /*priority=*/10);
  const auto order = registry_->QueueOrder();
  std::vector<std::string> listed(order.size());
  for (const auto& [id, slot] : order) {
    ASSERT_GE(slot.position, 1);
    listed[slot.position - 1] = id;
    EXPECT_EQ(slot.note, "");
  }
  EXPECT_EQ(listed, (std::vector<std::string>{urgent, t0, b1, t1, t2}));
  for (const std::string& expected : listed) EXPECT_EQ(TakenJob(), expected);
  EXPECT_TRUE(registry_->QueueOrder().empty());
}

TEST_F(RegistrySchedulingTest, RecentUseComesBeforeSubmissionOrder) {
  const std::string a1 = Submit("alice");
  const std::string b1 = Submit("bob");
  // Alice's job holds the only group for ten minutes, then the group goes
  // (her job is queued again); the next group goes to Bob's job although
  // Alice's is older.
  absl::StatusOr<v1::RegisterGroupResponse> group = Take();
  ASSERT_TRUE(group.ok());
  ASSERT_EQ(group->job_id(), a1);
  for (int minute = 1; minute <= 10; ++minute) {
    now_ += absl::Minutes(1);
    registry_->Tick();
  }
  Leave(*group);
  ASSERT_EQ(registry_->FindJob(a1).value()->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(TakenJob(), b1);
  const auto loads = registry_->OwnerLoads();
  EXPECT_GT(loads.at("alice").recent_groups, 0.0);
  EXPECT_EQ(loads.at("alice").groups, 0);
  EXPECT_EQ(loads.at("alice").queued_jobs, 1);
  EXPECT_EQ(loads.at("bob").groups, 1);
}

TEST_F(RegistrySchedulingTest, AGroupTakesOnlyTheOwnersItsTokenTrains) {
  const std::string a1 = Submit("alice");
  const std::string b1 = Submit("bob");
  EXPECT_EQ(TakenJob([](const std::string& owner) { return owner == "bob"; }), b1);
  absl::StatusOr<v1::RegisterGroupResponse> none =
      Take("", [](const std::string& owner) { return owner == "carol"; });
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(ReasonOf(none.status()), v1::ERROR_REASON_NO_QUEUED_JOB);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("none of an owner this group's token trains"));
  EXPECT_EQ(TakenJob(), a1);
}

TEST_F(RegistrySchedulingTest, LimitsHoldGroupsBackAndSaySo) {
  policy_.owners["alice"].max_groups = 1;
  policy_.max_groups_per_study = 1;
  registry_ = MakeRegistry();
  const std::string a1 = Submit("alice");
  const std::string a2 = Submit("alice");
  const std::string t0 = Submit("bob", "s-2");
  const std::string t1 = Submit("bob", "s-2");
  EXPECT_EQ(TakenJob(), a1);
  EXPECT_EQ(TakenJob(), t0);
  // Alice holds her one group and study s-2 its one: nothing to take.
  absl::StatusOr<v1::RegisterGroupResponse> waiting = Take();
  ASSERT_FALSE(waiting.ok());
  EXPECT_EQ(ReasonOf(waiting.status()), v1::ERROR_REASON_NO_QUEUED_JOB);
  EXPECT_THAT(std::string(waiting.status().message()), HasSubstr("may hold 1 group(s)"));
  // Named, a job over its owner's limit is refused with the limit.
  absl::StatusOr<v1::RegisterGroupResponse> named = Take(a2);
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(named.status()), v1::ERROR_REASON_LIMIT);
  EXPECT_THAT(std::string(named.status().message()),
              HasSubstr("owner 'alice' may hold 1 group(s) at once (max_groups=1"));
  absl::StatusOr<v1::RegisterGroupResponse> second = Take(t1);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("study s-2 may hold 1 group(s) at once (mpilearn-master "
                        "--max_groups_per_study)"));
  // The queue shows both held back, each with its note.
  const auto order = registry_->QueueOrder();
  EXPECT_THAT(order.at(a2).note, HasSubstr("max_groups=1"));
  EXPECT_THAT(order.at(t1).note, HasSubstr("--max_groups_per_study"));
}

TEST_F(RegistrySchedulingTest, AJobEndsAtItsWallTimeLimitAndStaysEnded) {
  const std::string job = Submit("alice", "", 0, /*max_wall_seconds=*/30);
  const std::string unlimited = Submit("alice");
  const absl::Time start = now_;
  ASSERT_EQ(TakenJob(), job);
  ASSERT_EQ(TakenJob(), unlimited);
  now_ = start + absl::Seconds(29);
  registry_->Tick();
  EXPECT_EQ(registry_->FindJob(job).value()->state(), v1::JOB_STATE_RUNNING);
  now_ = start + absl::Seconds(31);
  registry_->Tick();
  v1::JobStatus status = registry_->Status(job).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.stop_reason(), StartsWith(kWallTimeStop));
  EXPECT_THAT(status.message(), HasSubstr("wall-time limit of 30 s (max_wall_seconds)"));
  EXPECT_EQ(status.started_unix_seconds(), absl::ToUnixSeconds(start));
  EXPECT_EQ(registry_->FindJob(unlimited).value()->state(), v1::JOB_STATE_RUNNING);

  // A restarted master has the same end and start.
  registry_->CheckpointAll();
  registry_ = MakeRegistry();
  status = registry_->Status(job).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.message(), HasSubstr("max_wall_seconds"));
  EXPECT_EQ(status.started_unix_seconds(), absl::ToUnixSeconds(start));
}

}  // namespace
}  // namespace mpilearn::server
