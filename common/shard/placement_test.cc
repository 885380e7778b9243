#include "common/shard/placement.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mpilearn::shard {
namespace {

int64_t LargestRange(const Placement& placement) {
  int64_t largest = 0;
  for (const auto& shard : placement.shards) {
    for (const TensorRange& r : shard) largest = std::max(largest, r.size());
  }
  return largest;
}

// Every element of every tensor is on exactly one shard, each shard's load
// is the sum of its ranges, and no shard holds more than the mean plus the
// largest range (the bound of largest-first greedy placement).
void ExpectSound(const Placement& placement, const std::vector<int64_t>& sizes) {
  ASSERT_TRUE(CheckCovers(placement, sizes).ok()) << CheckCovers(placement, sizes);
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  ASSERT_EQ(placement.total(), total);
  for (size_t s = 0; s < placement.shards.size(); ++s) {
    int64_t load = 0;
    for (const TensorRange& r : placement.shards[s]) load += r.size();
    EXPECT_EQ(load, placement.load[s]) << "shard " << s;
  }
  const double mean = static_cast<double>(total) / placement.shards.size();
  const int64_t most = *std::max_element(placement.load.begin(), placement.load.end());
  EXPECT_LE(most, mean + LargestRange(placement));
}

TEST(PlacementTest, EveryElementOnceAndBalancedForManyLayouts) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> sizes(1 + random() % 12);
    for (int64_t& n : sizes) n = static_cast<int64_t>(random() % 200000);
    sizes[0] += 1;  // never all empty
    for (const int shards : {1, 2, 3, 4, 7, 16}) {
      absl::StatusOr<Placement> placement = PlaceTensors(sizes, shards);
      ASSERT_TRUE(placement.ok()) << placement.status();
      ASSERT_EQ(placement->shards.size(), static_cast<size_t>(shards));
      ExpectSound(*placement, sizes);
    }
  }
}

// The built-in MLP of the quick start (784-256-128-10): its first weight
// holds 85 % of the parameters; split, two shards get nearly equal halves.
TEST(PlacementTest, ALargeTensorIsSplitSoShardsStayBalanced) {
  const std::vector<int64_t> mlp = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
  for (const int shards : {2, 4, 8}) {
    absl::StatusOr<Placement> placement = PlaceTensors(mlp, shards);
    ASSERT_TRUE(placement.ok()) << placement.status();
    ExpectSound(*placement, mlp);
    // The default bound (total / 4K) keeps every shard within 1.25x of the
    // mean.
    EXPECT_LE(placement->imbalance(), 1.25) << shards << " shards";
  }
  // Without splitting (a bound above every tensor) one shard would hold
  // the first weight whole.
  absl::StatusOr<Placement> whole = PlaceTensors(mlp, 2, 1 << 30);
  ASSERT_TRUE(whole.ok());
  EXPECT_GT(whole->imbalance(), 1.6);
}

TEST(PlacementTest, SplitRangesAreNearlyEqual) {
  absl::StatusOr<Placement> placement = PlaceTensors({1000003}, 3, 100000);
  ASSERT_TRUE(placement.ok());
  std::vector<int64_t> pieces;
  for (const auto& shard : placement->shards) {
    for (const TensorRange& r : shard) pieces.push_back(r.size());
  }
  ASSERT_EQ(pieces.size(), 11u);  // ceil(1000003 / 100000)
  const auto [lo, hi] = std::minmax_element(pieces.begin(), pieces.end());
  EXPECT_LE(*hi - *lo, 1);
  EXPECT_LE(*hi, 100000);
}

TEST(PlacementTest, SameInputsGiveTheSamePlacement) {
  const std::vector<int64_t> sizes = {5000, 5000, 5000, 70000, 12, 0, 5000};
  absl::StatusOr<Placement> a = PlaceTensors(sizes, 3);
  absl::StatusOr<Placement> b = PlaceTensors(sizes, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->shards, b->shards);
  EXPECT_EQ(a->load, b->load);
  // Ties go to the lowest shard: three equal tensors on three shards land
  // in order.
  absl::StatusOr<Placement> ties = PlaceTensors({10, 10, 10}, 3, 100);
  ASSERT_TRUE(ties.ok());
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(ties->shards[s].size(), 1u);
    EXPECT_EQ(ties->shards[s][0].tensor, s);
  }
}

TEST(PlacementTest, ALostShardsRangesMoveAndTheRestStay) {
  const std::vector<int64_t> sizes = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
  absl::StatusOr<Placement> four = PlaceTensors(sizes, 4);
  ASSERT_TRUE(four.ok());
  absl::StatusOr<Placement> three = WithoutShard(*four, 1);
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->shards.size(), 3u);
  ExpectSound(*three, sizes);
  // Survivors 0, 2, 3 are now 0, 1, 2 and keep every range they had.
  const std::vector<int> survivor = {0, 2, 3};
  for (int s = 0; s < 3; ++s) {
    for (const TensorRange& kept : four->shards[survivor[s]]) {
      EXPECT_NE(std::find(three->shards[s].begin(), three->shards[s].end(), kept),
                three->shards[s].end())
          << "shard " << survivor[s] << " lost range of tensor " << kept.tensor;
    }
  }
  absl::StatusOr<Placement> one = WithoutShard(*WithoutShard(*three, 0), 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->load[0], one->total());
  EXPECT_FALSE(WithoutShard(*one, 0).ok());  // the only shard
  EXPECT_FALSE(WithoutShard(*three, 3).ok());
  EXPECT_FALSE(WithoutShard(*three, -1).ok());
}

TEST(PlacementTest, BadArgumentsAreRefused) {
  EXPECT_EQ(PlaceTensors({10}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceTensors({10}, kMaxShards + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceTensors({10, -1}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceTensors({0, 0}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceTensors({10}, 2, -5).status().code(), absl::StatusCode::kInvalidArgument);
  // More shards than ranges: some hold nothing, which is still a placement.
  absl::StatusOr<Placement> sparse = PlaceTensors({10}, 4);
  ASSERT_TRUE(sparse.ok());
  ExpectSound(*sparse, {10});
}

// The views alias the tensors' memory: writing each shard's index through
// its views marks every element exactly once.
TEST(PlacementTest, SliceViewsCoverTheTensorsMemory) {
  std::vector<std::vector<float>> tensors = {std::vector<float>(5000, -1.0f),
                                             std::vector<float>(3, -1.0f),
                                             std::vector<float>(12000, -1.0f)};
  std::vector<absl::Span<float>> spans;
  std::vector<int64_t> sizes;
  for (auto& t : tensors) {
    spans.push_back(absl::MakeSpan(t));
    sizes.push_back(static_cast<int64_t>(t.size()));
  }
  absl::StatusOr<Placement> placement = PlaceTensors(sizes, 3, 2000);
  ASSERT_TRUE(placement.ok());
  auto views = SliceViews(*placement, spans);
  ASSERT_TRUE(views.ok()) << views.status();
  std::vector<int64_t> written(3, 0);
  for (size_t s = 0; s < views->size(); ++s) {
    for (absl::Span<float> view : (*views)[s]) {
      for (float& v : view) {
        EXPECT_EQ(v, -1.0f) << "an element seen twice";
        v = static_cast<float>(s);
        ++written[s];
      }
    }
  }
  for (int s = 0; s < 3; ++s) EXPECT_EQ(written[s], placement->load[s]);
  for (const auto& t : tensors) {
    EXPECT_EQ(std::count(t.begin(), t.end(), -1.0f), 0);
  }
  // Tensors of another layout do not fit.
  spans.pop_back();
  EXPECT_EQ(SliceViews(*placement, spans).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mpilearn::shard
