#include "server/shard/shard_table.h"

#include <string>
#include <thread>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);

auto Always(bool answer) {
  return [answer](const std::string&) { return answer; };
}

v1::ShardSyncRequest Report(const std::string& address) {
  v1::ShardSyncRequest request;
  request.set_address(address);
  return request;
}

void AddSlice(v1::ShardSyncRequest& request, const std::string& job_id, int shard, int shards) {
  v1::ShardSliceStatus* slice = request.add_slices();
  slice->set_job_id(job_id);
  slice->set_shard(shard);
  slice->set_shards(shards);
  slice->set_state(v1::JOB_STATE_RUNNING);
}

std::vector<std::string> Addresses(const v1::ShardPlacement& placement) {
  return {placement.addresses().begin(), placement.addresses().end()};
}

TEST(ShardTableTest, WithoutShardsAJobStaysOnTheLeadForGood) {
  ShardTable table({});
  absl::StatusOr<v1::ShardPlacement> placed = table.Place("job-1", 0, kStart);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->addresses_size(), 0);
  // A shard that comes later does not move a job already training here.
  table.Sync(Report("s1:1"), kStart, absl::ZeroDuration(), Always(true));
  placed = table.Place("job-1", 0, kStart);
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->addresses_size(), 0);
  // A new job goes to it.
  placed = table.Place("job-2", 0, kStart);
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(Addresses(*placed), std::vector<std::string>{"s1:1"});
}

TEST(ShardTableTest, PlacesOnTheLeastLoadedLiveShardsWithinTheLimits) {
  ShardTable table({.lost_after = absl::Seconds(10), .shards_per_job = 2});
  for (const char* address : {"c:1", "a:1", "b:1"}) {
    table.Sync(Report(address), kStart, absl::ZeroDuration(), Always(true));
  }
  EXPECT_EQ(table.LiveShards(kStart), 3);
  // Ties go to the lowest address; --shards_per_job caps the count.
  EXPECT_EQ(Addresses(*table.Place("job-1", 0, kStart)), (std::vector<std::string>{"a:1", "b:1"}));
  // The least loaded first: c holds nothing yet.
  EXPECT_EQ(Addresses(*table.Place("job-2", 0, kStart)), (std::vector<std::string>{"c:1", "a:1"}));
  // The spec's max_shards caps it further.
  EXPECT_EQ(Addresses(*table.Place("job-3", 1, kStart)), std::vector<std::string>{"b:1"});
  // A placement is kept.
  EXPECT_EQ(Addresses(*table.Place("job-1", 0, kStart)), (std::vector<std::string>{"a:1", "b:1"}));
  // A shard silent past lost_after gets no new job.
  const absl::Time later = kStart + absl::Seconds(30);
  table.Sync(Report("a:1"), later, absl::ZeroDuration(), Always(true));
  EXPECT_EQ(table.LiveShards(later), 1);
  EXPECT_EQ(Addresses(*table.Place("job-4", 0, later)), std::vector<std::string>{"a:1"});
}

TEST(ShardTableTest, WithMinShardsAJobWaitsForThem) {
  ShardTable table({.min_shards = 2});
  table.Sync(Report("a:1"), kStart, absl::ZeroDuration(), Always(true));
  const absl::StatusOr<v1::ShardPlacement> early = table.Place("job-1", 0, kStart);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("1 of the 2"), std::string::npos) << early.status();
  table.Sync(Report("b:1"), kStart, absl::ZeroDuration(), Always(true));
  EXPECT_EQ(table.Place("job-1", 0, kStart)->addresses_size(), 2);
}

TEST(ShardTableTest, OrdersTheSlicesPlacedAndStopsTheOthers) {
  ShardTable table({});
  table.Sync(Report("a:1"), kStart, absl::ZeroDuration(), Always(true));
  table.Sync(Report("b:1"), kStart, absl::ZeroDuration(), Always(true));
  ASSERT_EQ(table.Place("job-1", 0, kStart)->addresses_size(), 2);
  // The shard not reporting the slice yet is told to hold it, with its index.
  ShardTable::Orders orders = table.Sync(Report("b:1"), kStart, absl::ZeroDuration(), Always(true));
  ASSERT_EQ(orders.hold.size(), 1u);
  EXPECT_EQ(orders.hold[0].first, "job-1");
  EXPECT_EQ(orders.hold[0].second.shard(), 1);
  EXPECT_EQ(orders.hold[0].second.shards(), 2);
  EXPECT_TRUE(orders.unplaced.empty());
  // A slice not placed on the reporting shard (the same index claimed
  // from elsewhere, or a forgotten job) is to stop.
  v1::ShardSyncRequest stray = Report("c:1");
  AddSlice(stray, "job-1", 1, 2);
  orders = table.Sync(stray, kStart, absl::ZeroDuration(), Always(true));
  EXPECT_EQ(orders.unplaced, std::vector<std::string>{"job-1"});
  v1::ShardSyncRequest held = Report("a:1");
  AddSlice(held, "job-1", 0, 2);
  table.Forget("job-1");
  orders = table.Sync(held, kStart, absl::ZeroDuration(), Always(false));
  EXPECT_TRUE(orders.hold.empty());
  EXPECT_EQ(orders.unplaced, std::vector<std::string>{"job-1"});
}

TEST(ShardTableTest, ALongPollAnswersWhenAPlacementGivesTheShardASlice) {
  ShardTable table({});
  table.Sync(Report("a:1"), kStart, absl::ZeroDuration(), Always(true));
  ShardTable::Orders orders;
  // Waits (up to a bound far beyond any machine's delay) until Place.
  std::thread poll([&] {
    orders = table.Sync(Report("a:1"), kStart, absl::Seconds(120), Always(true));
  });
  ASSERT_EQ(table.Place("job-1", 0, kStart)->addresses_size(), 1);
  poll.join();
  ASSERT_EQ(orders.hold.size(), 1u);
  EXPECT_EQ(orders.hold[0].first, "job-1");
}

TEST(ShardTableTest, AwaitSlicesNamesTheShardsThatDidNotTakeThem) {
  ShardTable table({});
  table.Sync(Report("a:1"), kStart, absl::ZeroDuration(), Always(true));
  table.Sync(Report("b:1"), kStart, absl::ZeroDuration(), Always(true));
  EXPECT_EQ(table.AwaitSlices("job-1", absl::ZeroDuration()).code(),
            absl::StatusCode::kNotFound);
  ASSERT_EQ(table.Place("job-1", 0, kStart)->addresses_size(), 2);
  v1::ShardSyncRequest a = Report("a:1");
  AddSlice(a, "job-1", 0, 2);
  table.Sync(a, kStart, absl::ZeroDuration(), Always(true));
  const absl::Status missing = table.AwaitSlices("job-1", absl::ZeroDuration());
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(missing.message().find("1 (b:1)"), std::string::npos) << missing;
  EXPECT_EQ(missing.message().find("a:1"), std::string::npos) << missing;
  v1::ShardSyncRequest b = Report("b:1");
  AddSlice(b, "job-1", 1, 2);
  table.Sync(b, kStart, absl::ZeroDuration(), Always(true));
  EXPECT_TRUE(table.AwaitSlices("job-1", absl::ZeroDuration()).ok());
  const std::vector<v1::ShardSliceStatus> slices = table.SlicesOf("job-1", kStart);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[1].address(), "b:1");
  EXPECT_EQ(slices[1].shard(), 1);
}

TEST(ShardTableTest, ARestartedLeadRebuildsAPlacementFromTheShardsReports) {
  ShardTable table({});
  v1::ShardSyncRequest second = Report("b:1");
  AddSlice(second, "job-1", 1, 2);
  table.Sync(second, kStart, absl::ZeroDuration(), Always(true));
  // Half known: neither shown as placed nor placed anew.
  EXPECT_FALSE(table.PlacementOf("job-1").has_value());
  const absl::StatusOr<v1::ShardPlacement> early = table.Place("job-1", 0, kStart);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("0 (unknown)"), std::string::npos) << early.status();
  v1::ShardSyncRequest first = Report("a:1");
  AddSlice(first, "job-1", 0, 2);
  table.Sync(first, kStart, absl::ZeroDuration(), Always(true));
  ASSERT_TRUE(table.PlacementOf("job-1").has_value());
  EXPECT_EQ(Addresses(*table.Place("job-1", 0, kStart)),
            (std::vector<std::string>{"a:1", "b:1"}));
  // A slice of a job that does not go on is not adopted.
  v1::ShardSyncRequest ended = Report("a:1");
  AddSlice(ended, "job-1", 0, 2);
  AddSlice(ended, "job-9", 0, 1);
  const ShardTable::Orders orders =
      table.Sync(ended, kStart, absl::ZeroDuration(),
                 [](const std::string& job_id) { return job_id != "job-9"; });
  EXPECT_FALSE(table.PlacementOf("job-9").has_value());
  EXPECT_EQ(orders.unplaced, std::vector<std::string>{"job-9"});
}

TEST(ShardTableTest, AWantedSliceIsAskedOfEachShardOnceAndWakesItsPoll) {
  ShardTable table({});
  EXPECT_EQ(table.WantSlices("job-1", 1).code(), absl::StatusCode::kNotFound);
  for (const char* address : {"a:1", "b:1"}) {
    table.Sync(Report(address), kStart, absl::ZeroDuration(), Always(true));
  }
  ASSERT_EQ(table.Place("job-1", 0, kStart)->addresses_size(), 2);
  // Both take their slices.
  for (int s = 0; s < 2; ++s) {
    v1::ShardSyncRequest report = Report(s == 0 ? "a:1" : "b:1");
    AddSlice(report, "job-1", s, 2);
    EXPECT_TRUE(table.Sync(report, kStart, absl::ZeroDuration(), Always(true)).send.empty());
  }
  // A shard long-polling hears of a wanted slice at once (a bound, not a
  // schedule: unwoken, the poll would outlast the test's timeout), and once.
  v1::ShardSyncRequest report = Report("a:1");
  AddSlice(report, "job-1", 0, 2);
  ShardTable::Orders polled;
  std::thread poll([&] { polled = table.Sync(report, kStart, absl::Minutes(10), Always(true)); });
  ASSERT_TRUE(table.WantSlices("job-1", 7).ok());
  poll.join();
  ASSERT_EQ(polled.send.size(), 1u);
  EXPECT_EQ(polled.send[0], (std::pair<std::string, uint64_t>{"job-1", 7}));
  EXPECT_TRUE(table.Sync(report, kStart, absl::ZeroDuration(), Always(true)).send.empty());
  // The other shard is asked at its next sync; an older request is not
  // asked again after a newer one.
  v1::ShardSyncRequest other = Report("b:1");
  AddSlice(other, "job-1", 1, 2);
  ASSERT_TRUE(table.WantSlices("job-1", 6).ok());
  const ShardTable::Orders orders = table.Sync(other, kStart, absl::ZeroDuration(), Always(true));
  ASSERT_EQ(orders.send.size(), 1u);
  EXPECT_EQ(orders.send[0].second, 7u);
}

// The restore set and the roll-back after a shard's restart: the newest
// version both shards hold; a new token is a restart (not the first report
// a lead gets); orders go to the shards ordered until each reports a new
// token at that version; a job that ended rolls nothing back.
TEST(ShardTableTest, AShardsRestartRollsTheOthersBackToTheSet) {
  ShardTable table({});
  auto report = [&](const std::string& address, int shard, std::vector<uint64_t> versions,
                    uint64_t restored, uint64_t token, bool going_on = true) {
    v1::ShardSyncRequest request = Report(address);
    AddSlice(request, "job-1", shard, 2);
    v1::ShardSliceStatus* slice = request.mutable_slices(0);
    for (uint64_t v : versions) slice->add_checkpoint_versions(v);
    slice->set_restored_version(restored);
    slice->set_restore_token(token);
    return table.Sync(request, kStart, absl::ZeroDuration(), Always(going_on));
  };
  report("a:1", 0, {}, 0, 0);
  report("b:1", 1, {}, 0, 0);
  ASSERT_EQ(Addresses(*table.Place("job-1", 0, kStart)),
            (std::vector<std::string>{"a:1", "b:1"}));
  report("a:1", 0, {30, 20, 10}, 0, 0);
  report("b:1", 1, {20, 10}, 0, 0);
  EXPECT_EQ(table.SetVersion("job-1"), 20u);
  // b restarts from 20: a is ordered back to 20, until it reports having
  // loaded it (a new token), and not again after.
  EXPECT_TRUE(report("b:1", 1, {20, 10}, 20, 7).restore.empty());
  ShardTable::Orders orders = report("a:1", 0, {30, 20, 10}, 0, 0);
  ASSERT_EQ(orders.restore.size(), 1u);
  EXPECT_EQ(orders.restore[0], (std::pair<std::string, uint64_t>{"job-1", 20}));
  EXPECT_EQ(report("a:1", 0, {30, 20, 10}, 0, 0).restore.size(), 1u);  // not done yet
  EXPECT_TRUE(report("a:1", 0, {20, 10}, 20, 9).restore.empty());
  EXPECT_TRUE(report("a:1", 0, {20, 10}, 20, 9).restore.empty());
  // b restarts from 40 (a new token): a, past 40 meanwhile, goes back to it.
  report("a:1", 0, {40, 30, 20}, 20, 9);
  report("b:1", 1, {40, 20}, 40, 11);
  orders = report("a:1", 0, {40, 30, 20}, 20, 9);
  ASSERT_EQ(orders.restore.size(), 1u);
  EXPECT_EQ(orders.restore[0].second, 40u);
  EXPECT_TRUE(report("a:1", 0, {40, 30, 20}, 40, 13).restore.empty());
  // The set is below the restarted shard's version when another lacks it:
  // then both go back to it.
  report("a:1", 0, {30, 20}, 40, 13);
  EXPECT_EQ(report("b:1", 1, {40, 20}, 40, 12).restore.size(), 1u);
  orders = report("a:1", 0, {30, 20}, 40, 13);
  ASSERT_EQ(orders.restore.size(), 1u);
  EXPECT_EQ(orders.restore[0].second, 20u);
  orders = report("b:1", 1, {40, 20}, 40, 12);
  ASSERT_EQ(orders.restore.size(), 1u);
  EXPECT_EQ(orders.restore[0].second, 20u);
  // The job ended on the lead meanwhile: nothing more is ordered.
  EXPECT_TRUE(report("a:1", 0, {30, 20}, 20, 9, /*going_on=*/false).restore.empty());
  EXPECT_TRUE(report("a:1", 0, {30, 20}, 20, 9).restore.empty());
}

TEST(ShardTableTest, ALeadTakesItsFirstReportOfATokenAsItIs) {
  ShardTable table({});
  auto report = [&](const std::string& address, int shard, uint64_t token) {
    v1::ShardSyncRequest request = Report(address);
    AddSlice(request, "job-1", shard, 2);
    request.mutable_slices(0)->add_checkpoint_versions(10);
    request.mutable_slices(0)->set_restored_version(10);
    request.mutable_slices(0)->set_restore_token(token);
    return table.Sync(request, kStart, absl::ZeroDuration(), Always(true));
  };
  // A restarted lead rebuilds the placement from reports of slices that
  // were loaded before: no roll-back.
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(report("a:1", 0, 5).restore.empty());
    EXPECT_TRUE(report("b:1", 1, 6).restore.empty());
  }
  EXPECT_EQ(table.SetVersion("job-1"), 10u);
}

}  // namespace
}  // namespace mpilearn::server
