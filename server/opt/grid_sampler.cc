// The grid sampler: every point of SearchSpace's grid once, in an order
// shuffled by the seed. Optuna's GridSampler shuffles a list of the whole
// grid; grids here may hold up to 2^40 points, so the order is a keyed
// permutation of the grid indices instead (a Feistel network over the
// smallest even power of two >= the grid size, cycle-walked back into
// range), computed one index at a time.
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/opt/sampler.h"

namespace mpilearn::opt {
namespace {

constexpr int kFeistelRounds = 6;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A bijection of [0, size) chosen by the seed.
class GridOrder {
 public:
  GridOrder(uint64_t size, uint64_t seed) : size_(size) {
    int bits = 2;
    while (bits < 64 && (uint64_t{1} << bits) < size) bits += 2;
    half_bits_ = bits / 2;
    uint64_t key = Mix(seed ^ 0x6772696400000000ULL);  // "grid"
    for (uint64_t& k : keys_) {
      key = Mix(key);
      k = key;
    }
  }

  // The index at position `position` (< size) of the shuffled order.
  uint64_t At(uint64_t position) const {
    uint64_t x = Encrypt(position);
    // Cycle walking: a permutation of [0, 4^half_bits) restricted to
    // [0, size) by following each cycle until it re-enters the range; the
    // domain is under 4 * size, so this takes a few steps on average.
    while (x >= size_) x = Encrypt(x);
    return x;
  }

 private:
  uint64_t Encrypt(uint64_t x) const {
    const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask;
    for (uint64_t k : keys_) {
      const uint64_t next = left ^ (Mix(k ^ right) & mask);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  const uint64_t size_;
  int half_bits_ = 1;
  uint64_t keys_[kFeistelRounds] = {};
};

// Threading: see Sampler (not thread-safe; immutable anyway).
class GridSampler final : public Sampler {
 public:
  GridSampler(const SearchSpace& space, uint64_t size, uint64_t seed)
      : space_(space), size_(size), order_(size, seed) {}

  absl::StatusOr<Point> Suggest(
      int /*number*/, absl::Span<const Observation> history) override {
    // Every trial's point counts as visited, failed and running ones too.
    absl::flat_hash_set<std::vector<int64_t>> visited;
    for (const Observation& o : history) {
      if (o.point.size() == space_.dimensions().size()) {
        visited.insert(GridKey(o.point));
      }
    }
    // Distinct grid points have distinct keys, so at most |visited| + 1
    // positions are looked at.
    for (uint64_t position = 0; position < size_; ++position) {
      Point point = space_.GridPoint(order_.At(position));
      if (!visited.contains(GridKey(point))) return point;
    }
    return absl::OutOfRangeError(
        absl::StrCat("the grid's ", size_, " points have all been tried"));
  }

 private:
  // The point's step counts from each dimension's low (choice indices for
  // categoricals), so points that differ only by rounding compare equal.
  std::vector<int64_t> GridKey(const Point& point) const {
    const std::vector<Dimension>& dims = space_.dimensions();
    std::vector<int64_t> key(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      const Dimension& d = dims[i];
      const double step =
          d.kind == Dimension::Kind::kCategorical ? 1.0 : d.step.value_or(1.0);
      const double low = d.kind == Dimension::Kind::kCategorical ? 0.0 : d.low;
      // A dimension that does not exist at the point (NaN) has its own key.
      key[i] = std::isnan(point[i]) ? -1 : std::llround((point[i] - low) / step);
    }
    return key;
  }

  const SearchSpace space_;
  const uint64_t size_;
  const GridOrder order_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Sampler>> NewGridSampler(
    const SearchSpace& space, uint64_t seed) {
  MPILEARN_ASSIGN_OR_RETURN(uint64_t size, space.GridSize());
  return std::unique_ptr<Sampler>(
      std::make_unique<GridSampler>(space, size, seed));
}

}  // namespace mpilearn::opt
