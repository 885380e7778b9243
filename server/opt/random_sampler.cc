// The random sampler: Optuna's RandomSampler, one independent uniform draw
// per dimension (see SampleUniform), from a generator seeded by (seed,
// trial number) rather than one generator advanced across trials.
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "server/opt/parzen_estimator.h"
#include "server/opt/sampler.h"

namespace mpilearn::opt {
namespace {

// Threading: see Sampler (not thread-safe; immutable anyway).
class RandomSampler final : public Sampler {
 public:
  RandomSampler(std::vector<Dimension> dimensions, uint64_t seed)
      : dimensions_(std::move(dimensions)), seed_(seed) {}

  absl::StatusOr<Point> Suggest(
      int number, absl::Span<const Observation> /*history*/) override {
    std::mt19937_64 rng = SuggestGenerator(seed_, number, kRandomStream);
    Point point;
    point.reserve(dimensions_.size());
    for (const Dimension& d : dimensions_) {
      point.push_back(SampleUniform(d, rng));
    }
    // Conditional parameters exist only where their condition holds.
    MaskInactive(dimensions_, point);
    return point;
  }

 private:
  const std::vector<Dimension> dimensions_;
  const uint64_t seed_;
};

}  // namespace

std::unique_ptr<Sampler> NewRandomSampler(std::vector<Dimension> dimensions,
                                          uint64_t seed) {
  return std::make_unique<RandomSampler>(std::move(dimensions), seed);
}

}  // namespace mpilearn::opt
