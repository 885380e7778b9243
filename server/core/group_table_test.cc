#include "server/core/group_table.h"

#include <string>
#include <vector>

#include "common/error_reason.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(GroupTableTest, TouchKeepsLivenessAndTelemetry) {
  GroupTable groups("job-1");
  groups.Add("g-1", 4, "node-a", kStart);
  v1::GroupTelemetry telemetry;
  telemetry.set_compute_seconds(42.0);
  ASSERT_TRUE(groups.Touch("g-1", kStart + absl::Seconds(5), &telemetry).ok());
  ASSERT_TRUE(groups.Touch("g-1", kStart + absl::Seconds(6)).ok());

  v1::JobStatus status;
  groups.FillStatus(kStart + absl::Seconds(9), &status);
  ASSERT_EQ(status.groups_size(), 1);
  const v1::GroupInfo& info = status.groups(0);
  EXPECT_EQ(info.group_id(), "g-1");
  EXPECT_EQ(info.ranks(), 4);
  EXPECT_EQ(info.host(), "node-a");
  EXPECT_TRUE(info.alive());
  EXPECT_DOUBLE_EQ(info.seconds_since_seen(), 3.0);
  EXPECT_DOUBLE_EQ(info.telemetry().compute_seconds(), 42.0);  // kept without one
}

TEST(GroupTableTest, UnknownAndLostGroupsAreGroupUnknown) {
  GroupTable groups("job-1");
  groups.Add("g-1", 1, "h", kStart);

  const absl::Status never = groups.Touch("g-9", kStart);
  EXPECT_EQ(never.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(never), v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_NE(never.message().find("job-1"), std::string::npos);
  EXPECT_EQ(ReasonOf(groups.Registered("g-9").status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_EQ(groups.Active("g-9").status().code(),
            absl::StatusCode::kFailedPrecondition);

  groups.Find("g-1")->alive = false;  // left
  const absl::Status gone = groups.Touch("g-1", kStart);
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(gone), v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_EQ(ReasonOf(groups.Active("g-1").status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_TRUE(groups.Registered("g-1").ok());
}

TEST(GroupTableTest, ReapDeclaresOnlySilentGroupsLost) {
  GroupTable groups("job-1");
  groups.Add("g-2", 1, "h", kStart);
  groups.Add("g-1", 1, "h", kStart);
  groups.Add("g-3", 1, "h", kStart);
  ASSERT_TRUE(groups.Touch("g-3", kStart + absl::Seconds(8)).ok());
  EXPECT_EQ(groups.Live(), 3);

  // Silent for exactly the timeout is not lost yet.
  EXPECT_TRUE(groups.ReapLost(kStart + absl::Seconds(10), absl::Seconds(10))
                  .empty());
  const std::vector<std::string> lost =
      groups.ReapLost(kStart + absl::Seconds(11), absl::Seconds(10));
  EXPECT_EQ(lost, (std::vector<std::string>{"g-1", "g-2"}));  // id order
  EXPECT_EQ(groups.Live(), 1);
  EXPECT_FALSE(groups.Find("g-1")->alive);
  // Lost once: not reported again.
  EXPECT_TRUE(groups.ReapLost(kStart + absl::Seconds(30), absl::Seconds(100))
                  .empty());
}

TEST(GroupTableTest, CountersAppearInStatus) {
  GroupTable groups("job-1");
  groups.Add("g-1", 2, "h", kStart);
  GroupTable::Group* group = groups.Active("g-1").value();
  EXPECT_EQ(group->held_unit, GroupTable::kNoUnit);
  EXPECT_EQ(group->reserved_unit, GroupTable::kNoUnit);
  group->units_completed = 3;
  group->samples_trained = 300;
  group->updates_applied = 12;
  v1::JobStatus status;
  groups.FillStatus(kStart, &status);
  EXPECT_EQ(status.groups(0).units_completed(), 3u);
  EXPECT_EQ(status.groups(0).samples_trained(), 300u);
  EXPECT_EQ(status.groups(0).updates_applied(), 12u);
  EXPECT_FALSE(status.groups(0).has_telemetry());
}

// A group gives back what it holds, the unit it trains before the one
// reserved for it, and then holds nothing.
TEST(GroupTableTest, ReleaseUnitsReturnsHeldThenReserved) {
  GroupTable groups("job-1");
  groups.Add("g-1", 1, "h", kStart);
  GroupTable::Group* group = groups.Active("g-1").value();
  EXPECT_TRUE(group->ReleaseUnits().empty());
  group->held_unit = 7;
  group->reserved_unit = 3;
  EXPECT_EQ(group->ReleaseUnits(), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(group->held_unit, GroupTable::kNoUnit);
  EXPECT_EQ(group->reserved_unit, GroupTable::kNoUnit);
  group->reserved_unit = 4;  // a reservation alone is still given back
  EXPECT_EQ(group->ReleaseUnits(), (std::vector<int64_t>{4}));
  EXPECT_TRUE(group->ReleaseUnits().empty());
}

}  // namespace
}  // namespace mpilearn::server
