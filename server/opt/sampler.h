// Samplers: how a study proposes the next trial's parameters from the
// trials so far. Random, grid, and TPE with Optuna 3.1's defaults (see
// tpe_sampler.cc for what follows Optuna and where it differs).
//
//   auto sampler = NewTpeSampler(space.dimensions(), TpeOptions{}, seed);
//   std::vector<Observation> history = ...;  // every trial but this one
//   MPILEARN_ASSIGN_OR_RETURN(Point p, (*sampler)->Suggest(number, history));
//
// Reproducible: a suggestion depends only on the seed, the trial number and
// the history given (each call seeds its own generator from seed and
// number), so a restarted master proposes the same points for the same
// history.
//
// Values are in minimize form: a study that maximizes passes -value.
//
// Threading: a Sampler is not thread-safe; the study calls it under its own
// lock.
#ifndef MPILEARN_SERVER_OPT_SAMPLER_H_
#define MPILEARN_SERVER_OPT_SAMPLER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/opt/search_space.h"

namespace mpilearn::opt {

// One earlier trial as a sampler sees it.
struct Observation {
  enum class State {
    kComplete,  // finished; `value` is its objective
    kPruned,    // stopped early; `intermediate` has what it reached
    kRunning,   // in flight (the constant liar counts it as the worst)
    kFailed,    // ignored by every sampler
  };
  int number = 0;
  Point point;
  State state = State::kComplete;
  // kComplete: the objective, minimize form.
  double value = 0;
  // Intermediate values by epoch, minimize form (kPruned uses the last).
  std::map<int, double> intermediate;
  // A study of several objectives: kComplete's values, minimize form, and
  // the NSGA-II generation the trial was created in (-1: none).
  std::vector<double> values;
  int generation = -1;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The point for trial `number`. `history` holds the other trials in any
  // order. INTERNAL only on a broken invariant; a grid sampler whose grid
  // is spent answers OUT_OF_RANGE.
  virtual absl::StatusOr<Point> Suggest(
      int number, absl::Span<const Observation> history) = 0;
  // The generation a trial suggested now belongs to (NSGA-II), recorded
  // with it; none for samplers without generations.
  virtual std::optional<int> Generation(absl::Span<const Observation> /*history*/) const {
    return std::nullopt;
  }
};

// Uniform over each dimension (log-uniform for log ones; ints and steps
// rounded to the grid of low + k * step; categoricals uniform).
std::unique_ptr<Sampler> NewRandomSampler(std::vector<Dimension> dimensions,
                                          uint64_t seed);

// Every grid point once, in an order shuffled by the seed (like Optuna's
// GridSampler): trial n gets the first point of the shuffled order that no
// trial in `history` has (failed trials' points are not run again).
// INVALID_ARGUMENT (from SearchSpace::GridSize) when a real dimension has
// no step.
absl::StatusOr<std::unique_ptr<Sampler>> NewGridSampler(
    const SearchSpace& space, uint64_t seed);

struct TpeOptions {
  int startup_trials = 10;
  int ei_candidates = 24;
  double prior_weight = 1.0;
  bool constant_liar = true;
};

// Optuna 3.1's univariate TPESampler: random for the first startup_trials
// trials (counting complete and pruned ones), then per dimension a Parzen
// estimator l(x) over the best gamma(n) = min(ceil(0.1 n), 25) trials and
// g(x) over the rest, ei_candidates samples from l, the one maximizing
// log l(x) - log g(x).
std::unique_ptr<Sampler> NewTpeSampler(std::vector<Dimension> dimensions,
                                       TpeOptions options, uint64_t seed);

struct Nsga2Options {
  int population_size = 50;
  double crossover_prob = 0.9;
  double swapping_prob = 0.5;
  // Default: 1 / the number of parameters.
  std::optional<double> mutation_prob;
};

// Optuna 3.1's NSGAIISampler with uniform crossover, for several objectives
// (Observation::values): see nsga2_sampler.cc.
std::unique_ptr<Sampler> NewNsga2Sampler(std::vector<Dimension> dimensions, Nsga2Options options,
                                         uint64_t seed);

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_SAMPLER_H_
