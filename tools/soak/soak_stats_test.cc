#include "tools/soak/soak_stats.h"

#include <cmath>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace soak {
namespace {

TEST(RssSeriesTest, SlopeOfAnExactLineIsItsSlope) {
  // y = 40 + 3 MiB per minute, sampled every second for two minutes.
  RssSeries series;
  for (int s = 0; s <= 120; ++s) series.Add(s, 40.0 + 3.0 * s / 60.0);
  const RssSummary all = series.Summarize(0, 1e9);
  EXPECT_EQ(all.samples, 121);
  ASSERT_TRUE(all.slope_mib_per_min.has_value());
  EXPECT_NEAR(*all.slope_mib_per_min, 3.0, 1e-9);
  EXPECT_DOUBLE_EQ(all.first_mib, 40.0);
  EXPECT_DOUBLE_EQ(all.last_mib, 46.0);
  EXPECT_DOUBLE_EQ(all.min_mib, 40.0);
  EXPECT_DOUBLE_EQ(all.max_mib, 46.0);
}

TEST(RssSeriesTest, SlopeMatchesTheLeastSquaresFormula) {
  // Points (minutes, MiB): (0, 1), (1, 3), (2, 2), (3, 6). By hand:
  // mean t = 1.5, mean y = 3; sum dt*dy = (-1.5)(-2) + (-0.5)(0) +
  // (0.5)(-1) + (1.5)(3) = 7; sum dt^2 = 5; slope = 1.4.
  RssSeries series;
  series.Add(0, 1);
  series.Add(60, 3);
  series.Add(120, 2);
  series.Add(180, 6);
  const RssSummary all = series.Summarize(0, 180);
  ASSERT_TRUE(all.slope_mib_per_min.has_value());
  EXPECT_NEAR(*all.slope_mib_per_min, 1.4, 1e-12);
}

TEST(RssSeriesTest, WindowKeepsOnlyItsSamples) {
  RssSeries series;
  series.Add(0, 10);    // warm-up: left out
  series.Add(10, 100);  // warm-up: left out
  series.Add(30, 20);
  series.Add(40, 20);
  series.Add(50, 20);
  const RssSummary after = series.Summarize(30, 1e9);
  EXPECT_EQ(after.samples, 3);
  EXPECT_DOUBLE_EQ(after.first_mib, 20);
  EXPECT_DOUBLE_EQ(after.max_mib, 20);
  ASSERT_TRUE(after.slope_mib_per_min.has_value());
  EXPECT_NEAR(*after.slope_mib_per_min, 0.0, 1e-12);
}

TEST(RssSeriesTest, NoSlopeWithoutTwoTimes) {
  RssSeries series;
  EXPECT_EQ(series.Summarize(0, 1e9).samples, 0);
  series.Add(5, 30);
  EXPECT_FALSE(series.Summarize(0, 1e9).slope_mib_per_min.has_value());
  series.Add(5, 31);  // same time: no spread to fit a slope on
  EXPECT_FALSE(series.Summarize(0, 1e9).slope_mib_per_min.has_value());
}

TEST(RpcStatsTest, CountsCallsAndErrorsByCodeAndExpectation) {
  RpcStats stats;
  stats.Record(Rpc::kPushGradient, absl::OkStatus());
  stats.Record(Rpc::kPushGradient, absl::AbortedError("stale"),
               /*expected=*/true);
  stats.Record(Rpc::kPullWeights, absl::InternalError("boom"));
  stats.Record(Rpc::kLeave, absl::InternalError("bang"));
  EXPECT_EQ(stats.Total(), 4u);
  EXPECT_EQ(stats.Calls(Rpc::kPushGradient), 2u);
  EXPECT_EQ(stats.ErrorCount(), 3u);
  EXPECT_EQ(stats.UnexpectedCount(), 2u);
  const auto errors = stats.Errors();
  EXPECT_EQ(errors.at("ABORTED"), 1u);
  EXPECT_EQ(errors.at("INTERNAL"), 2u);
  const auto unexpected = stats.UnexpectedErrors();
  EXPECT_EQ(unexpected.count("ABORTED"), 0u);
  EXPECT_EQ(unexpected.at("INTERNAL"), 2u);
  stats.CheckFailed("job-1: wrong");
  EXPECT_EQ(stats.CheckFailures(), 1u);
  const auto messages = stats.Messages();
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0], "PullWeights: INTERNAL: boom");
  EXPECT_EQ(messages[2], "check failed: job-1: wrong");
}

TEST(RpcStatsTest, KeepsOnlyTheFirstMessages) {
  RpcStats stats;
  for (int i = 0; i < 3 * RpcStats::kKeptMessages; ++i) {
    stats.Record(Rpc::kHeartbeat, absl::UnavailableError("down"));
  }
  EXPECT_EQ(stats.UnexpectedCount(), 3u * RpcStats::kKeptMessages);
  EXPECT_EQ(stats.Messages().size(),
            static_cast<size_t>(RpcStats::kKeptMessages));
}

}  // namespace
}  // namespace soak
}  // namespace mpilearn
