#include "server/sched/queue_order.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

QueueEntry Queued(const std::string& id, int64_t number, const std::string& owner,
                  const std::string& study = "", int priority = 0) {
  QueueEntry job;
  job.job_id = id;
  job.number = number;
  job.owner = owner;
  job.study = study;
  job.priority = priority;
  job.queued = true;
  return job;
}

QueueEntry Running(const std::string& id, int64_t number, const std::string& owner,
                   int groups, const std::string& study = "") {
  QueueEntry job = Queued(id, number, owner, study);
  job.queued = false;
  job.groups = groups;
  return job;
}

// The ids in the order OrderQueue gives, a held-back one as "id!".
std::vector<std::string> Ids(const std::vector<QueueEntry>& jobs,
                             const OwnerUsage& usage = {},
                             const SchedulingPolicy& policy = {}) {
  std::vector<std::string> ids;
  for (const QueuePlace& place : OrderQueue(jobs, usage, policy)) {
    ids.push_back(jobs[place.index].job_id + (place.note.empty() ? "" : "!"));
  }
  return ids;
}

using Order = std::vector<std::string>;

TEST(QueueOrderTest, WithoutOwnersItIsSubmissionOrder) {
  EXPECT_EQ(Ids({Queued("j1", 1, ""), Queued("j2", 2, ""), Queued("j3", 3, "")}),
            (Order{"j1", "j2", "j3"}));
}

TEST(QueueOrderTest, HigherPriorityFirstWhateverTheShares) {
  std::vector<QueueEntry> jobs = {Queued("a1", 1, "alice"), Queued("a2", 2, "alice"),
                                  Queued("b1", 3, "bob", "", /*priority=*/5),
                                  Queued("c1", 4, "carol", "", /*priority=*/-1)};
  EXPECT_EQ(Ids(jobs), (Order{"b1", "a1", "a2", "c1"}));
}

TEST(QueueOrderTest, OwnersTakeTurnsInsteadOfTheOldestFirst) {
  // Alice's three jobs came first; Bob's one gets the second group, not
  // the fourth.
  std::vector<QueueEntry> jobs = {Queued("a1", 1, "alice"), Queued("a2", 2, "alice"),
                                  Queued("a3", 3, "alice"), Queued("b1", 4, "bob")};
  EXPECT_EQ(Ids(jobs), (Order{"a1", "b1", "a2", "a3"}));
  // Alice already holds two groups on a running job: Bob goes first.
  jobs.push_back(Running("a0", 0, "alice", 2));
  EXPECT_EQ(Ids(jobs), (Order{"b1", "a1", "a2", "a3"}));
}

TEST(QueueOrderTest, SharesWeighTheTurns) {
  std::vector<QueueEntry> jobs;
  for (int i = 1; i <= 6; ++i) jobs.push_back(Queued("a" + std::to_string(i), i, "alice"));
  for (int i = 1; i <= 6; ++i) jobs.push_back(Queued("b" + std::to_string(i), 6 + i, "bob"));
  SchedulingPolicy policy;
  policy.owners["alice"].share = 2.0;
  const Order order = Ids(jobs, {}, policy);
  // Of the first six groups, alice's jobs take four and bob's two.
  int alice = 0;
  for (int i = 0; i < 6; ++i) alice += order[i][0] == 'a';
  EXPECT_EQ(alice, 4);
  EXPECT_EQ(order[0], "a1");
  EXPECT_EQ(order[1], "b1");
}

TEST(QueueOrderTest, AStudyTakesTurnsWithItsOwnersOtherJobs) {
  // A study's trials queued first, then a lone job of the same owner.
  std::vector<QueueEntry> jobs = {Queued("t0", 1, "alice", "s-1"), Queued("t1", 2, "alice", "s-1"),
                                  Queued("t2", 3, "alice", "s-1"), Queued("j", 4, "alice")};
  EXPECT_EQ(Ids(jobs), (Order{"t0", "j", "t1", "t2"}));
  // The study already trains one trial: the lone job first.
  jobs.push_back(Running("tr", 0, "alice", 1, "s-1"));
  EXPECT_EQ(Ids(jobs)[0], "j");
}

TEST(QueueOrderTest, RecentUseComesBeforeSubmissionOrder) {
  // One group at a time (it leaves before the next asks): alice's trial ran
  // for a minute, so bob's job goes before alice's next, older trial.
  OwnerUsage usage;
  const absl::Time start = absl::FromUnixSeconds(1000);
  usage.Advance({}, start, absl::Hours(1));
  usage.Advance({Running("t0", 1, "alice", 1, "s-1")}, start + absl::Minutes(1), absl::Hours(1));
  EXPECT_GT(usage.Owner("alice"), 0.0);
  EXPECT_EQ(usage.Owner("bob"), 0.0);
  std::vector<QueueEntry> jobs = {Queued("t1", 2, "alice", "s-1"), Queued("b", 3, "bob")};
  EXPECT_EQ(Ids(jobs, usage), (Order{"b", "t1"}));
}

TEST(QueueOrderTest, AGroupsPickIsTheOrdersFirst) {
  std::vector<QueueEntry> jobs;
  for (int i = 0; i < 40; ++i) {
    jobs.push_back(Queued("j" + std::to_string(i), i, i % 3 == 0 ? "alice" : "bob",
                          i % 5 == 0 ? "s-1" : "", i % 7 == 0 ? 1 : 0));
  }
  jobs.push_back(Running("r", 99, "bob", 3));
  SchedulingPolicy policy;
  policy.owners["bob"].share = 3;
  const std::vector<QueuePlace> all = OrderQueue(jobs, {}, policy);
  const std::vector<QueuePlace> first = OrderQueue(jobs, {}, policy, 1);
  ASSERT_EQ(all.size(), 40u);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].index, all[0].index);
  const std::vector<QueuePlace> three = OrderQueue(jobs, {}, policy, 3);
  ASSERT_EQ(three.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(three[i].index, all[i].index);
  // Nothing may be taken: the held-back jobs, each with its note.
  policy.max_groups_per_owner = 3;
  jobs.push_back(Running("r2", 100, "alice", 3));
  const std::vector<QueuePlace> held = OrderQueue(jobs, {}, policy, 1);
  ASSERT_EQ(held.size(), 40u);
  EXPECT_FALSE(held[0].note.empty());
}

TEST(QueueOrderTest, OwnersOfEqualUseTakeTurns) {
  // Jobs too short to show in the average: the owner served last waits.
  OwnerUsage usage;
  usage.Served(Running("t0", 1, "alice", 0, "s-1"));
  std::vector<QueueEntry> jobs = {Queued("t1", 2, "alice", "s-1"), Queued("t2", 3, "alice", "s-1"),
                                  Queued("b", 4, "bob")};
  EXPECT_EQ(Ids(jobs, usage), (Order{"b", "t1", "t2"}));
  usage.Served(jobs[2]);
  EXPECT_EQ(Ids(jobs, usage)[0], "t1");
  // Within an owner, a lone job goes before the study served last.
  std::vector<QueueEntry> own = {Queued("t1", 2, "alice", "s-1"), Queued("j", 3, "alice")};
  EXPECT_EQ(Ids(own, usage), (Order{"j", "t1"}));
}

TEST(QueueOrderTest, UsageIsAnExponentialAverageOfGroupsHeld) {
  OwnerUsage usage;
  const absl::Time start = absl::FromUnixSeconds(1000);
  const absl::Duration half = absl::Minutes(10);
  usage.Advance({}, start, half);
  // Two groups for one half-life: half of the way from 0 to 2.
  usage.Advance({Running("j", 1, "alice", 2)}, start + half, half);
  EXPECT_NEAR(usage.Owner("alice"), 1.0, 1e-12);
  EXPECT_NEAR(usage.Unit("job j"), 1.0, 1e-12);
  // None for another: half of what it was. Small steps give the same.
  for (int i = 1; i <= 100; ++i) usage.Advance({}, start + half + half * i / 100, half);
  EXPECT_NEAR(usage.Owner("alice"), 0.5, 1e-9);
}

TEST(QueueOrderTest, LimitsHoldJobsBackWithANote) {
  std::vector<QueueEntry> jobs = {Running("a0", 1, "alice", 1), Queued("a1", 2, "alice"),
                                  Queued("b1", 3, "bob"), Queued("b2", 4, "bob")};
  SchedulingPolicy policy;
  policy.owners["alice"].max_groups = 1;
  EXPECT_EQ(Ids(jobs, {}, policy), (Order{"b1", "b2", "a1!"}));
  const std::vector<QueuePlace> order = OrderQueue(jobs, {}, policy);
  EXPECT_EQ(order.back().note,
            "owner 'alice' may hold 1 group(s) at once (max_groups=1 in the tokens file)");
  EXPECT_EQ(LimitNote(jobs[1], jobs, policy), order.back().note);
  EXPECT_EQ(LimitNote(jobs[2], jobs, policy), "");

  // The master's flag for every owner: bob's second job waits for his first.
  policy.owners.clear();
  policy.max_groups_per_owner = 1;
  EXPECT_EQ(Ids(jobs, {}, policy), (Order{"b1", "a1!", "b2!"}));
  EXPECT_NE(OrderQueue(jobs, {}, policy)[2].note.find("--max_groups_per_owner"),
            std::string::npos);
}

TEST(QueueOrderTest, AStudysGroupLimit) {
  std::vector<QueueEntry> jobs = {Running("t0", 1, "alice", 2, "s-1"),
                                  Queued("t1", 2, "alice", "s-1"), Queued("j", 3, "alice")};
  SchedulingPolicy policy;
  policy.max_groups_per_study = 2;
  EXPECT_EQ(Ids(jobs, {}, policy), (Order{"j", "t1!"}));
  EXPECT_EQ(LimitNote(jobs[1], jobs, policy),
            "study s-1 may hold 2 group(s) at once (mpilearn-master --max_groups_per_study)");
}

}  // namespace
}  // namespace mpilearn::server
