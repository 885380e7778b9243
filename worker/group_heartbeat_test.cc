#include "worker/group_heartbeat.h"

#include <atomic>
#include <csignal>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/fake_master.h"

namespace mpilearn::worker {
namespace {

GroupHeartbeat::Options Fast() {
  GroupHeartbeat::Options options;
  options.period = absl::Milliseconds(5);
  options.poll = absl::Milliseconds(5);
  return options;
}

// It beats for the group it was given, follows a rejoin to the new group,
// and is silent once stopped.
TEST(GroupHeartbeatTest, BeatsForTheCurrentGroupUntilStopped) {
  FakeMaster master({});
  GroupHeartbeat heartbeat(master, Fast());
  heartbeat.SetGroup("job-1", "g-1");
  master.AwaitHeartbeats(3);
  for (const v1::HeartbeatRequest& request : master.heartbeats()) {
    EXPECT_EQ(request.job_id(), "job-1");
    EXPECT_EQ(request.group_id(), "g-1");
  }

  heartbeat.SetGroup("job-1", "g-2");  // registered again
  const size_t before = master.heartbeats().size();
  // One heartbeat of g-1 may have been in flight; the later ones are g-2's.
  master.AwaitHeartbeats(before + 3);
  EXPECT_EQ(master.heartbeats().back().group_id(), "g-2");

  heartbeat.Stop();
  const size_t stopped = master.heartbeats().size();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(master.heartbeats().size(), stopped);
  heartbeat.Stop();  // idempotent
  EXPECT_TRUE(master.leaves().empty());
}

// Before SetGroup there is nothing to beat for.
TEST(GroupHeartbeatTest, NoGroupNoHeartbeat) {
  FakeMaster master({});
  GroupHeartbeat heartbeat(master, Fast());
  absl::SleepFor(absl::Milliseconds(30));
  heartbeat.Stop();
  EXPECT_TRUE(master.heartbeats().empty());
}

// Failing heartbeats are not fatal: the thread keeps beating, and beats
// reach the master again once it answers.
TEST(GroupHeartbeatTest, FailuresAreNotFatal) {
  FakeMaster master({});
  master.FailHeartbeats(absl::UnavailableError("master at x: down"));
  GroupHeartbeat heartbeat(master, Fast());
  heartbeat.SetGroup("job-1", "g-1");
  master.AwaitHeartbeats(5);
  master.FailHeartbeats(absl::OkStatus());
  master.AwaitHeartbeats(master.heartbeats().size() + 2);
  heartbeat.Stop();
  EXPECT_TRUE(master.leaves().empty());
}

// A termination signal makes the thread leave the group (without an error,
// so the job is not failed) and end the process, also with heartbeats off.
TEST(GroupHeartbeatTest, SignalLeavesTheGroupAndEnds) {
  for (const absl::Duration period : {absl::Milliseconds(5), absl::ZeroDuration()}) {
    FakeMaster master({});
    std::atomic<int> terminate_signal{0};
    absl::Notification ended;
    int ended_with = 0;
    GroupHeartbeat::Options options = Fast();
    options.period = period;
    options.terminate_signal = &terminate_signal;
    options.on_terminated = [&](int signal) {
      ended_with = signal;
      ended.Notify();
    };
    GroupHeartbeat heartbeat(master, options);
    heartbeat.SetGroup("job-7", "g-3");
    terminate_signal = SIGTERM;
    ended.WaitForNotification();
    EXPECT_EQ(ended_with, SIGTERM);
    const std::vector<v1::LeaveRequest> leaves = master.leaves();
    ASSERT_EQ(leaves.size(), 1u);
    EXPECT_EQ(leaves[0].job_id(), "job-7");
    EXPECT_EQ(leaves[0].group_id(), "g-3");
    EXPECT_TRUE(leaves[0].error().empty());
    EXPECT_EQ(leaves[0].abandoned(), GroupHeartbeat::TerminationText(SIGTERM));
    EXPECT_FALSE(leaves[0].completed());
    if (period == absl::ZeroDuration()) {
      EXPECT_TRUE(master.heartbeats().empty());
    }
    heartbeat.Stop();  // the thread has returned already
  }
  EXPECT_EQ(GroupHeartbeat::TerminationText(15),
            "rank terminated: signal 15 (another rank of the group probably "
            "died)");
}

// A signal caught while the group is being stopped still ends it: Stop
// does not swallow it.
TEST(GroupHeartbeatTest, SignalBeforeStopStillLeaves) {
  FakeMaster master({});
  std::atomic<int> terminate_signal{SIGINT};
  int ended_with = 0;
  GroupHeartbeat::Options options = Fast();
  options.terminate_signal = &terminate_signal;
  options.on_terminated = [&](int signal) { ended_with = signal; };
  {
    GroupHeartbeat heartbeat(master, options);
    heartbeat.SetGroup("job-1", "g-1");
    heartbeat.Stop();
  }
  // Either the thread saw the signal before SetGroup (nothing to leave) or
  // after it (one Leave); in both it ended on it.
  EXPECT_EQ(ended_with, SIGINT);
  EXPECT_LE(master.leaves().size(), 1u);
}

}  // namespace
}  // namespace mpilearn::worker
