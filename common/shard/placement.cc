#include "common/shard/placement.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mpilearn::shard {
namespace {

// Largest first; among equals the earlier tensor and range first, so the
// order (and the placement) never depends on anything but the sizes.
bool LargerFirst(const TensorRange& a, const TensorRange& b) {
  return std::make_tuple(-a.size(), a.tensor, a.begin) <
         std::make_tuple(-b.size(), b.tensor, b.begin);
}

bool ByPosition(const TensorRange& a, const TensorRange& b) {
  return std::tie(a.tensor, a.begin) < std::tie(b.tensor, b.begin);
}

// Each range of `ranges` (largest first) to the least loaded of the
// placement's shards (lowest index on ties).
void Assign(std::vector<TensorRange> ranges, Placement& placement) {
  std::sort(ranges.begin(), ranges.end(), LargerFirst);
  for (const TensorRange& range : ranges) {
    size_t best = 0;
    for (size_t s = 1; s < placement.shards.size(); ++s) {
      if (placement.load[s] < placement.load[best]) best = s;
    }
    placement.shards[best].push_back(range);
    placement.load[best] += range.size();
  }
  for (std::vector<TensorRange>& shard : placement.shards) {
    std::sort(shard.begin(), shard.end(), ByPosition);
  }
}

}  // namespace

int64_t Placement::total() const {
  return std::accumulate(load.begin(), load.end(), int64_t{0});
}

double Placement::imbalance() const {
  if (load.empty() || total() == 0) return 1.0;
  const double mean = static_cast<double>(total()) / static_cast<double>(load.size());
  return static_cast<double>(*std::max_element(load.begin(), load.end())) / mean;
}

absl::StatusOr<Placement> PlaceTensors(absl::Span<const int64_t> sizes, int shards,
                                       int64_t split_elements) {
  if (shards < 1 || shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard count must be in [1, ", kMaxShards, "], got ", shards));
  }
  if (split_elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split bound must be >= 0 elements, got ", split_elements));
  }
  int64_t total = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t, " has a negative size (", sizes[t], ")"));
    }
    total += sizes[t];
  }
  if (total == 0) return absl::InvalidArgumentError("no elements to place");
  if (split_elements == 0) {
    split_elements = std::max<int64_t>(total / (4 * static_cast<int64_t>(shards)), 1024);
  }
  std::vector<TensorRange> ranges;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    if (n == 0) continue;
    const int64_t pieces = (n + split_elements - 1) / split_elements;
    for (int64_t p = 0; p < pieces; ++p) {
      // Nearly equal pieces: sizes differ by at most one element.
      ranges.push_back({static_cast<int>(t), n * p / pieces, n * (p + 1) / pieces});
    }
  }
  Placement placement;
  placement.shards.resize(shards);
  placement.load.assign(shards, 0);
  Assign(std::move(ranges), placement);
  return placement;
}

absl::StatusOr<Placement> WithoutShard(const Placement& placement, int lost) {
  const int shards = static_cast<int>(placement.shards.size());
  if (lost < 0 || lost >= shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", lost, " is not one of the ", shards, " shards"));
  }
  if (shards == 1) {
    return absl::InvalidArgumentError("the only shard cannot be removed");
  }
  Placement kept = placement;
  std::vector<TensorRange> moved = std::move(kept.shards[lost]);
  kept.shards.erase(kept.shards.begin() + lost);
  kept.load.erase(kept.load.begin() + lost);
  Assign(std::move(moved), kept);
  return kept;
}

absl::Status CheckCovers(const Placement& placement, absl::Span<const int64_t> sizes) {
  std::vector<TensorRange> all;
  for (const std::vector<TensorRange>& shard : placement.shards) {
    all.insert(all.end(), shard.begin(), shard.end());
  }
  std::sort(all.begin(), all.end(), ByPosition);
  size_t next = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    int64_t covered = 0;
    while (next < all.size() && all[next].tensor == static_cast<int>(t)) {
      const TensorRange& r = all[next++];
      if (r.begin != covered || r.end <= r.begin || r.end > sizes[t]) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t, ": range [", r.begin, ", ", r.end, ") where [",
                         covered, ", ...) of ", sizes[t], " elements was expected"));
      }
      covered = r.end;
    }
    if (covered != sizes[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t, ": elements [", covered, ", ", sizes[t],
                       ") are on no shard"));
    }
  }
  if (next != all.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a range names tensor ", all[next].tensor, " of a layout of ", sizes.size()));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<std::vector<absl::Span<T>>>> SliceViews(
    const Placement& placement, const std::vector<absl::Span<T>>& tensors) {
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const absl::Span<T>& tensor : tensors) sizes.push_back(static_cast<int64_t>(tensor.size()));
  if (absl::Status covers = CheckCovers(placement, sizes); !covers.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensors do not fit the placement: ", covers.message()));
  }
  std::vector<std::vector<absl::Span<T>>> views(placement.shards.size());
  for (size_t s = 0; s < placement.shards.size(); ++s) {
    for (const TensorRange& r : placement.shards[s]) {
      views[s].push_back(tensors[r.tensor].subspan(r.begin, r.size()));
    }
  }
  return views;
}

template absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> SliceViews(
    const Placement&, const std::vector<absl::Span<float>>&);
template absl::StatusOr<std::vector<std::vector<absl::Span<const float>>>> SliceViews(
    const Placement&, const std::vector<absl::Span<const float>>&);

}  // namespace mpilearn::shard
