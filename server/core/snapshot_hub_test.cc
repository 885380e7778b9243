#include "server/core/snapshot_hub.h"

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

std::shared_ptr<const WeightsSnapshot> Weights(uint64_t version) {
  auto weights = std::make_shared<WeightsSnapshot>();
  weights->header = MakeFloat32Header(version, {"w"}, {{2}});
  weights->values = {{static_cast<float>(version), 1.0f}};
  return weights;
}

v1::JobSpec Spec(int64_t every_updates, std::optional<bool> at_epoch_end) {
  v1::JobSpec spec;
  spec.set_name("test");
  spec.mutable_snapshots()->set_every_updates(every_updates);
  if (at_epoch_end.has_value()) {
    spec.mutable_snapshots()->set_at_epoch_end(*at_epoch_end);
  }
  return spec;
}

// Tells the hub that update number `updates_applied` made `weights`.
void Applied(SnapshotHub& hub, const std::string& job, const v1::JobSpec& spec,
             std::shared_ptr<const WeightsSnapshot> weights,
             uint64_t updates_applied, int epoch) {
  AppliedUpdate update;
  update.applied = true;
  update.weights = std::move(weights);
  update.updates_applied = updates_applied;
  update.epochs_done = epoch;
  hub.OnUpdateApplied(job, spec, update);
}

// Publishes version v of `job` through OnUpdateApplied as update number v.
void Update(SnapshotHub& hub, const std::string& job, const v1::JobSpec& spec,
            uint64_t v, int epoch = 0) {
  Applied(hub, job, spec, Weights(v), v, epoch);
}

TEST(SnapshotHubTest, PublishesEveryNUpdatesAndAtEpochEnd) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(3, std::nullopt);
  for (uint64_t v = 1; v <= 7; ++v) {
    Update(hub, "j", spec, v);
    if (v % 3 == 0) {
      auto d = sub->Next(absl::ZeroDuration());
      ASSERT_TRUE(d.has_value()) << "update " << v;
      EXPECT_EQ(d->weights->header.version(), v);
    }
    EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value()) << "update " << v;
  }
  // at_epoch_end absent means true.
  hub.OnEpochEnd("j", spec, Weights(8), 1);
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->weights->header.version(), 8u);
  EXPECT_EQ(d->epoch, 1);
  EXPECT_EQ(d->job_id, "j");
  EXPECT_EQ(d->spec->name(), "test");
  EXPECT_EQ(hub.Counters("j").published, 3u);
  EXPECT_EQ(hub.Counters("j").skipped, 0u);
}

TEST(SnapshotHubTest, OffWhenEveryUpdatesZeroAndAtEpochEndFalse) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(0, false);
  for (uint64_t v = 1; v <= 10; ++v) Update(hub, "j", spec, v);
  hub.OnEpochEnd("j", spec, Weights(11), 1);
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  EXPECT_EQ(hub.Counters("j").published, 0u);
}

TEST(SnapshotHubTest, SharesTheSnapshotWithoutCopying) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  auto weights = Weights(5);
  hub.OnEpochEnd("j", Spec(0, std::nullopt), weights, 1);
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->weights.get(), weights.get());
}

TEST(SnapshotHubTest, SlowSubscriberGetsTheNewestAndCountsSkips) {
  SnapshotHub hub;
  auto slow = hub.Subscribe({"j"}, "slow");  // never asks until the end
  auto fast = hub.Subscribe({"j"}, "fast");
  const v1::JobSpec spec = Spec(1, false);
  constexpr int kUpdates = 10000;
  const absl::Time start = absl::Now();
  for (uint64_t v = 1; v <= kUpdates; ++v) {
    Update(hub, "j", spec, v);
    if (v % 100 == 0) {
      auto d = fast->Next(absl::ZeroDuration());
      ASSERT_TRUE(d.has_value());
      EXPECT_EQ(d->weights->header.version(), v);
      EXPECT_EQ(d->skipped, 99u);
    }
  }
  // Publishing never waited for the slow subscriber: 10,000 publications
  // take milliseconds (the bound is generous for loaded machines).
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const SnapshotHub::JobCounters counters = hub.Counters("j");
  EXPECT_EQ(counters.published, static_cast<uint64_t>(kUpdates));
  // slow: every publication but the last replaced; fast: 99 per 100.
  EXPECT_EQ(counters.skipped, (kUpdates - 1) + 99u * (kUpdates / 100));

  auto d = slow->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->weights->header.version(), static_cast<uint64_t>(kUpdates));
  EXPECT_EQ(d->skipped, static_cast<uint64_t>(kUpdates - 1));
  EXPECT_FALSE(slow->Next(absl::ZeroDuration()).has_value());
}

TEST(SnapshotHubTest, OldestPublicationFirstAcrossJobs) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(1, false);
  Update(hub, "b", spec, 1);
  Update(hub, "a", spec, 1);
  Update(hub, "b", spec, 2);  // replaces b's v1; now a's v1 is the oldest
  auto first = sub->Next(absl::ZeroDuration());
  auto second = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(first->job_id, "a");
  EXPECT_EQ(second->job_id, "b");
  EXPECT_EQ(second->weights->header.version(), 2u);
  EXPECT_EQ(second->skipped, 1u);
}

TEST(SnapshotHubTest, EmptyListFollowsEveryJobAndNamedListFilters) {
  SnapshotHub hub;
  auto all = hub.Subscribe({}, "all");
  auto only_a = hub.Subscribe({"a"}, "a");
  const v1::JobSpec spec = Spec(1, false);
  Update(hub, "a", spec, 1);
  Update(hub, "later", spec, 1);
  auto d = only_a->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->job_id, "a");
  EXPECT_FALSE(only_a->Next(absl::ZeroDuration()).has_value());
  EXPECT_EQ(all->Next(absl::ZeroDuration())->job_id, "a");
  EXPECT_EQ(all->Next(absl::ZeroDuration())->job_id, "later");
}

TEST(SnapshotHubTest, SnapshotsBeforeSubscribingAreNotDelivered) {
  SnapshotHub hub;
  const v1::JobSpec spec = Spec(1, false);
  Update(hub, "j", spec, 1);
  auto sub = hub.Subscribe({}, "test");
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  Update(hub, "j", spec, 2);
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->skipped, 0u);
}

TEST(SnapshotHubTest, EndedJobDeliversItsLastSnapshotThenNothing) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  auto idle = hub.Subscribe({}, "idle");
  const v1::JobSpec spec = Spec(1, std::nullopt);
  Update(hub, "j", spec, 1);
  ASSERT_TRUE(idle->Next(absl::ZeroDuration()).has_value());
  hub.OnEpochEnd("j", spec, Weights(2), 1);
  ASSERT_TRUE(idle->Next(absl::ZeroDuration()).has_value());
  hub.OnJobEnded("j");
  // The final snapshot still reaches the subscriber that had not taken it.
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->weights->header.version(), 2u);
  EXPECT_EQ(d->epoch, 1);
  // Nothing is published after the end.
  Update(hub, "j", spec, 3);
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  EXPECT_FALSE(idle->Next(absl::ZeroDuration()).has_value());
  EXPECT_EQ(hub.Counters("j").published, 2u);
}

// A deleted job leaves nothing behind: its counters and any snapshot a
// subscriber had not taken yet go.
TEST(SnapshotHubTest, DeletedJobIsForgotten) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(1, std::nullopt);
  Update(hub, "j", spec, 1);
  Update(hub, "k", spec, 1);
  hub.OnJobEnded("j");
  EXPECT_EQ(hub.Counters("j").published, 1u);
  hub.OnJobDeleted("j");
  EXPECT_EQ(hub.Counters("j").published, 0u);
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->job_id, "k");  // j's pending snapshot went with it
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  EXPECT_EQ(hub.Counters("k").published, 1u);
}

TEST(SnapshotHubTest, SameVersionIsPublishedOnceWithTheNewerEpoch) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(4, std::nullopt);
  auto weights = Weights(4);
  Applied(hub, "j", spec, weights, 4, 0);   // update 4 ...
  hub.OnEpochEnd("j", spec, weights, 1);    // ... also ended epoch 1
  auto d = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->epoch, 1);
  EXPECT_EQ(d->skipped, 0u);
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  EXPECT_EQ(hub.Counters("j").published, 1u);
}

TEST(SnapshotHubTest, NextWaitsForAPublication) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(50));
    Update(hub, "j", Spec(1, false), 1);
  });
  auto d = sub->Next(absl::Seconds(30));
  publisher.join();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->weights->header.version(), 1u);
  // And times out when nothing comes.
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sub->Next(absl::Milliseconds(50)).has_value());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

// Next returns nullopt promptly when `wake` runs on another thread.
void ExpectWokenBy(SnapshotHub::Subscription& sub, const std::function<void()>& wake) {
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    wake();
  });
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sub.Next(absl::Seconds(30)).has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(sub.closed());
  closer.join();
}

TEST(SnapshotHubTest, UnsubscribeWakesAWaitingNext) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  ExpectWokenBy(*sub, [&] { hub.Unsubscribe(*sub); });
  Update(hub, "j", Spec(1, false), 1);
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
}

TEST(SnapshotHubTest, CloseWakesAWaitingNextAndRefusesNewSubscribers) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  ExpectWokenBy(*sub, [&] { hub.Close(); });
  auto late = hub.Subscribe({}, "late");
  EXPECT_TRUE(late->closed());
  Update(hub, "j", Spec(1, false), 1);
  EXPECT_FALSE(late->Next(absl::Seconds(1)).has_value());
}

TEST(SnapshotHubTest, ConcurrentPublishersAndASubscriberAccountForEverySnapshot) {
  SnapshotHub hub;
  auto sub = hub.Subscribe({}, "test");
  const v1::JobSpec spec = Spec(1, false);
  constexpr int kJobs = 4;
  constexpr uint64_t kUpdates = 2000;
  std::atomic<int> running{kJobs};
  std::vector<std::thread> publishers;
  for (int j = 0; j < kJobs; ++j) {
    publishers.emplace_back([&, j] {
      for (uint64_t v = 1; v <= kUpdates; ++v) {
        Update(hub, "job-" + std::to_string(j), spec, v);
      }
      --running;
    });
  }
  std::map<std::string, uint64_t> accounted, last_version;
  uint64_t delivered_skips = 0;
  while (true) {
    const bool done = running == 0;
    auto d = sub->Next(absl::Milliseconds(10));
    if (!d.has_value()) {
      if (done) break;
      continue;
    }
    accounted[d->job_id] += 1 + d->skipped;
    delivered_skips += d->skipped;
    EXPECT_GT(d->weights->header.version(), last_version[d->job_id]);
    last_version[d->job_id] = d->weights->header.version();
  }
  for (auto& t : publishers) t.join();
  uint64_t counted_skips = 0;
  for (int j = 0; j < kJobs; ++j) {
    const std::string job = "job-" + std::to_string(j);
    // Each publication was delivered or reported as skipped, exactly once.
    EXPECT_EQ(accounted[job], kUpdates) << job;
    EXPECT_EQ(last_version[job], kUpdates) << job;
    EXPECT_EQ(hub.Counters(job).published, kUpdates);
    counted_skips += hub.Counters(job).skipped;
  }
  EXPECT_EQ(counted_skips, delivered_skips);
}

}  // namespace
}  // namespace mpilearn::server
