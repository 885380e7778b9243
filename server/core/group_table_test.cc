#include "server/core/group_table.h"

#include <cmath>
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

// A group that promised heartbeats is lost after 3 missed periods; one that
// promised none only after the master's group timeout.
TEST(GroupTableTest, HeartbeatGroupsAreLostAfterThreeMissedPeriods) {
  const absl::Duration group_timeout = absl::Seconds(60);
  const GroupTable::Liveness beating =
      GroupTable::CheckHeartbeat(1.0, group_timeout).value();
  EXPECT_EQ(beating.heartbeat, absl::Seconds(1));
  EXPECT_EQ(beating.lost_after, absl::Seconds(3));
  const GroupTable::Liveness silent =
      GroupTable::CheckHeartbeat(0.0, group_timeout).value();
  EXPECT_EQ(silent.heartbeat, absl::ZeroDuration());
  EXPECT_EQ(silent.lost_after, group_timeout);

  GroupTable groups("job-1");
  groups.Add("g-1", 2, "h", kStart, beating);
  groups.Add("g-2", 2, "h", kStart, silent);
  groups.Add("g-3", 2, "h", kStart);  // no limit of its own: the timeout
  // Contact at 2 s restarts g-1's clock.
  ASSERT_TRUE(groups.Touch("g-1", kStart + absl::Seconds(2)).ok());
  EXPECT_TRUE(groups.ReapLost(kStart + absl::Seconds(5), group_timeout).empty());
  EXPECT_EQ(groups.ReapLost(kStart + absl::Seconds(5.5), group_timeout),
            (std::vector<std::string>{"g-1"}));
  EXPECT_EQ(GroupTable::LostAfterText(*groups.Find("g-1"), group_timeout),
            "after 3 missed heartbeats (3s without contact)");
  // The others last until the group timeout.
  EXPECT_TRUE(groups.ReapLost(kStart + absl::Seconds(60), group_timeout).empty());
  EXPECT_EQ(groups.ReapLost(kStart + absl::Seconds(61), group_timeout),
            (std::vector<std::string>{"g-2", "g-3"}));
  EXPECT_EQ(GroupTable::LostAfterText(*groups.Find("g-2"), group_timeout),
            "after 1m without contact");
  EXPECT_EQ(GroupTable::LostAfterText(*groups.Find("g-3"), group_timeout),
            "after 1m without contact");

  v1::JobStatus status;
  groups.FillStatus(kStart + absl::Seconds(61), &status);
  ASSERT_EQ(status.groups_size(), 3);
  EXPECT_DOUBLE_EQ(status.groups(0).heartbeat_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(status.groups(0).lost_after_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(status.groups(1).heartbeat_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(status.groups(1).lost_after_seconds(), 60.0);
}

TEST(GroupTableTest, HeartbeatOutOfRangeIsInvalidRequest) {
  const absl::Duration group_timeout = absl::Seconds(6);
  // The bounds themselves are allowed.
  EXPECT_EQ(GroupTable::CheckHeartbeat(0.1, group_timeout)->lost_after,
            absl::Milliseconds(300));
  EXPECT_EQ(GroupTable::CheckHeartbeat(2.0, group_timeout)->lost_after,
            absl::Seconds(6));
  for (const double bad : {0.05, 2.01, -1.0, std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    const absl::Status refused =
        GroupTable::CheckHeartbeat(bad, group_timeout).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_INVALID_REQUEST) << bad;
    // It says what to do.
    EXPECT_NE(refused.message().find("--heartbeat_s"), std::string::npos)
        << refused.message();
    EXPECT_NE(refused.message().find("2s"), std::string::npos)
        << refused.message();
  }
}

}  // namespace
}  // namespace mpilearn::server
