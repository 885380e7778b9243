// The pieces the samplers share, exposed for their tests: the per-trial
// random generator, uniform draws over a Dimension, the truncated normal
// distribution, and the one-dimensional Parzen estimator of Optuna 3.1's
// univariate TPE (optuna/samplers/_tpe/parzen_estimator.py). Only the
// sampler .cc files and sampler_test use this header; studies use
// sampler.h.
//
//   std::mt19937_64 rng = SuggestGenerator(seed, number, kTpeStream);
//   ParzenEstimator below(dimension, best_values, /*prior_weight=*/1.0);
//   double x = below.Sample(rng);
//   double score = below.LogPdf(x) - above.LogPdf(x);
//
// Everything is in double precision. Threading: the functions are pure; a
// ParzenEstimator is immutable after construction (Sample takes the caller's
// generator), so it may be shared.
#ifndef MPILEARN_SERVER_OPT_PARZEN_ESTIMATOR_H_
#define MPILEARN_SERVER_OPT_PARZEN_ESTIMATOR_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "server/opt/search_space.h"

namespace mpilearn::opt {

// Streams of SuggestGenerator, so that samplers with one seed draw
// independent numbers.
inline constexpr uint64_t kRandomStream = 1;
inline constexpr uint64_t kTpeStream = 2;

// The generator for trial `number` of a sampler seeded with `seed`: seeded
// by SplitMix64 over (seed, number, stream), so a suggestion depends on
// nothing but these and the history.
std::mt19937_64 SuggestGenerator(uint64_t seed, int number, uint64_t stream);

// A uniform double in [0, 1) from the generator's top 53 bits (the same on
// every standard library, unlike std::uniform_real_distribution).
double Uniform01(std::mt19937_64& rng);

// Dimension `d`'s coordinate x moved onto its grid: an int (or a real with a
// step) to the nearest low + k * step within [low, high], a categorical to
// the nearest index, a real without step clamped to [low, high].
double SnapToDimension(const Dimension& d, double x);

// A draw like Optuna's RandomSampler: uniform on [low, high] (log-uniform
// for log dimensions); ints and stepped reals uniform on
// [low - step/2, high + step/2] and then snapped (log ints: log-uniform on
// [low - 0.5, high + 0.5], rounded); categoricals uniform over the choices.
double SampleUniform(const Dimension& d, std::mt19937_64& rng);

// The standard normal distribution function Phi(a) and log Phi(a), accurate
// in both tails (log Phi by an asymptotic series below -20).
double Ndtr(double a);
double LogNdtr(double a);
// log(Phi(b) - Phi(a)) for a <= b, computed in whichever tail keeps it
// accurate (-inf when a == b).
double LogGaussMass(double a, double b);
// The quantile u in [0, 1] of the standard normal truncated to [a, b]
// (a < b), by bisection on log Phi like Optuna's _truncnorm.ppf; the result
// lies in [a, b].
double TruncNormPpf(double u, double a, double b);

// Optuna's default_gamma: how many of n trials form the "below" (good)
// group, min(ceil(0.1 n), 25).
int DefaultGamma(int n);
// Optuna's default_weights for n observations in chronological order: 1
// for the newest 25, a linear ramp from 1/n (oldest) below them.
std::vector<double> DefaultWeights(int n);

// A Parzen estimator over one dimension: a mixture with one component per
// observation plus the prior, weighted by DefaultWeights and prior_weight.
// Numeric dimensions are modelled in "transformed" coordinates: log(x) for
// log dimensions, x otherwise; the bounds are [low, high], widened to
// [low - step/2, high + step/2] for ints and stepped reals (log ints:
// [log(low - 0.5), log(high + 0.5)]). Each component is a normal truncated
// to the bounds, centred on its observation (the prior at the centre of the
// bounds with sigma = high - low); sigma is the larger gap to a sorted
// neighbour (the bounds at the ends; consider_endpoints=False uses the inner
// gap for the first and last), clipped to [(high - low) / min(100, 1 + m),
// high - low] for m components (consider_magic_clip=True). Categoricals:
// each observation's row is prior_weight / (n + 1) per choice plus 1 on its
// choice, normalized; the prior's row is uniform.
class ParzenEstimator {
 public:
  // `observations` in internal coordinates (see search_space.h), oldest
  // first; they are snapped onto the dimension first.
  ParzenEstimator(const Dimension& dimension,
                  absl::Span<const double> observations, double prior_weight);

  // A draw in internal coordinates (snapped like SearchSpace points).
  double Sample(std::mt19937_64& rng) const;
  // The log density (log probability for ints, stepped reals and
  // categoricals) of internal coordinate x; -inf outside the bounds. Like
  // Optuna 3.1, a continuous component's density lacks its 1 / sigma (see
  // LogPdf in the .cc), so the mixture integrates to sum(weight * sigma),
  // not 1; TPE only compares l and g at the same points.
  double LogPdf(double x) const;

  // The mixture, for tests: normalized weights (the prior last), and for
  // numeric dimensions the components' means and sigmas in transformed
  // coordinates and the transformed bounds.
  const std::vector<double>& weights() const { return weights_; }
  const std::vector<double>& mus() const { return mus_; }
  const std::vector<double>& sigmas() const { return sigmas_; }
  double low() const { return low_; }
  double high() const { return high_; }

 private:
  // x in transformed coordinates, and back (snapped).
  double Transform(double x) const;
  double Untransform(double t) const;

  Dimension dimension_;
  std::vector<double> weights_;
  // Numeric: transformed bounds; step_ > 0 for ints and stepped reals
  // (probabilities of the step's interval), 0 for continuous densities.
  double low_ = 0;
  double high_ = 0;
  double step_ = 0;
  std::vector<double> mus_;
  std::vector<double> sigmas_;
  // log of each component's mass inside [low_, high_].
  std::vector<double> log_accept_;
  // Categorical: the mixture's probability of each choice.
  std::vector<double> choice_probabilities_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_PARZEN_ESTIMATOR_H_
