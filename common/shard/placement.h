// Where a sharded job's parameters live: each tensor of the job's layout,
// or each range of a tensor larger than a bound, placed on one of K
// parameter shards, balanced by elements. The lead master computes a
// placement when a job's weights arrive and sends it to the groups, which
// push and pull each shard's slice over its own connection
// (docs/sharding.md).
//
//   absl::StatusOr<Placement> placement = PlaceTensors({784 * 256, 256, ...}, 2);
//   for (const TensorRange& range : placement->shards[0]) { ... }
//   std::vector<std::vector<absl::Span<float>>> slices =
//       SliceViews(*placement, weights);  // per shard, per range
//
// The placement depends only on the tensor sizes, the shard count and the
// split bound, never on the order of calls or the machine: every process
// that computes it gets the same one.
#ifndef MPILEARN_COMMON_SHARD_PLACEMENT_H_
#define MPILEARN_COMMON_SHARD_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mpilearn::shard {

// Elements [begin, end) of tensor `tensor` (its index in the job's layout).
struct TensorRange {
  int tensor = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const TensorRange& a, const TensorRange& b) {
    return a.tensor == b.tensor && a.begin == b.begin && a.end == b.end;
  }
};

struct Placement {
  // shards[s]: the ranges shard s holds, ordered by (tensor, begin).
  std::vector<std::vector<TensorRange>> shards;
  // Elements each shard holds.
  std::vector<int64_t> load;

  int64_t total() const;
  // Largest load over the mean load (1 when perfectly balanced).
  double imbalance() const;
};

// The most shards a job may be spread over.
inline constexpr int kMaxShards = 64;

// Places tensors of `sizes` elements on `shards` shards (1 to kMaxShards).
// A tensor larger than `split_elements` is cut into the fewest nearly equal
// ranges of at most that many elements; the ranges (and whole tensors) go,
// largest first, to the least loaded shard (the lowest index on ties), so
// no shard holds more than the mean plus one range. `split_elements` 0
// picks max(total / (4 * shards), 1024): then a shard holds at most about
// 1.25 times the mean. Errors: INVALID_ARGUMENT for a shard count out of
// range, a negative size or split bound, or no elements at all.
absl::StatusOr<Placement> PlaceTensors(absl::Span<const int64_t> sizes, int shards,
                                       int64_t split_elements = 0);

// The placement once shard `lost` is gone: its ranges move, largest first,
// to the least loaded survivors, and every other range stays where it was
// (a surviving shard keeps its slice and its optimizer state). Shards after
// `lost` move down one index. INVALID_ARGUMENT when `lost` is not a shard
// or it is the only one.
absl::StatusOr<Placement> WithoutShard(const Placement& placement, int lost);

// Each shard's ranges as views into `tensors` (one span per tensor of the
// layout the placement was made for): result[s][r] views
// placement.shards[s][r]. INVALID_ARGUMENT when the tensors do not match
// the placement (count or sizes).
template <typename T>
absl::StatusOr<std::vector<std::vector<absl::Span<T>>>> SliceViews(
    const Placement& placement, const std::vector<absl::Span<T>>& tensors);

// Checks that `placement` covers every element of `sizes` exactly once;
// INVALID_ARGUMENT naming the first gap or overlap otherwise.
absl::Status CheckCovers(const Placement& placement, absl::Span<const int64_t> sizes);

}  // namespace mpilearn::shard

#endif  // MPILEARN_COMMON_SHARD_PLACEMENT_H_
