// The TPE sampler: Optuna 3.1's univariate TPESampler
// (optuna/samplers/_tpe/sampler.py) with its defaults, over Dimension and
// Point instead of distributions and trials.
//
// Followed from Optuna 3.1:
// - Which trials count (_get_observation_pairs): complete ones score
//   (-inf, value); pruned ones (-last epoch, last intermediate value), NaN
//   read as +inf, or (1, 0) with no intermediate values; running ones
//   (+inf, +inf) when constant_liar is on, else they are left out; failed
//   ones are left out.
// - Startup: random (Optuna's RandomSampler's distributions) while the
//   complete and pruned trials number fewer than startup_trials; running
//   trials do not count.
// - The split (_split_observation_pairs): a stable sort by (step, value) in
//   trial-number order; the first gamma(n) = min(ceil(0.1 n), 25) form
//   "below", the rest (running trials always among them when n > 0)
//   "above"; both keep trial-number order, which the weights depend on.
// - Per dimension, independently: Parzen estimators l (below) and g (above)
//   as in parzen_estimator.h (prior_weight, consider_prior,
//   consider_magic_clip, not consider_endpoints, default_weights),
//   ei_candidates draws from l, and the draw maximizing log l - log g (the
//   first on ties).
// - Even Optuna 3.1's unnormalized continuous densities (the truncated
//   normal's log-pdf without -log(sigma), optuna issue #5109, changed in
//   Optuna 3.5): measured against Optuna 3.1 they match its results, the
//   normalized ones did worse (see ParzenEstimator::LogPdf).
//
// Where we deliberately differ:
// - Random numbers: each Suggest seeds its own generator from (seed, trial
//   number) (SuggestGenerator) instead of advancing numpy's RandomState
//   across calls, so a restarted master makes the same suggestion for the
//   same history. Suggestions therefore match Optuna's in distribution,
//   not bit for bit.
// - A categorical draw from l takes the mixture's choice probabilities in
//   one step (same distribution as Optuna's component-then-choice draw).
// - A complete trial whose value is NaN is ignored (Optuna would have
//   recorded it as failed). Observations are snapped onto their dimension
//   first (a stray point outside the range cannot break the log transform).
// - constant_liar defaults to true in TpeOptions (Optuna: false), since
//   the study runs trials in parallel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/opt/parzen_estimator.h"
#include "server/opt/sampler.h"

namespace mpilearn::opt {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One counted trial: its rank key (Optuna's (step, value) score) and point.
struct Scored {
  double step;
  double value;
  const Point* point;
};

// Threading: see Sampler (not thread-safe; immutable anyway).
class TpeSampler final : public Sampler {
 public:
  TpeSampler(std::vector<Dimension> dimensions, TpeOptions options,
             uint64_t seed)
      : dimensions_(std::move(dimensions)),
        options_(options),
        seed_(seed),
        startup_sampler_(NewRandomSampler(dimensions_, seed)) {}

  absl::StatusOr<Point> Suggest(
      int number, absl::Span<const Observation> history) override {
    // Trial-number order, as Optuna's study.get_trials gives them.
    std::vector<const Observation*> trials;
    trials.reserve(history.size());
    for (const Observation& o : history) trials.push_back(&o);
    std::stable_sort(trials.begin(), trials.end(),
                     [](const Observation* a, const Observation* b) {
                       return a->number < b->number;
                     });

    std::vector<Scored> scored;
    scored.reserve(trials.size());
    int n = 0;  // complete and pruned trials
    for (const Observation* o : trials) {
      // An empty point is a trial without parameters yet: it takes part in
      // the split but in no estimator (Optuna masks such trials out).
      if (!o->point.empty() && o->point.size() != dimensions_.size()) {
        return absl::InternalError(absl::StrCat(
            "trial ", o->number, " has a point of ", o->point.size(),
            " values for ", dimensions_.size(), " dimensions"));
      }
      switch (o->state) {
        case Observation::State::kComplete:
          if (std::isnan(o->value)) continue;
          scored.push_back({-kInf, o->value, &o->point});
          ++n;
          break;
        case Observation::State::kPruned:
          if (o->intermediate.empty()) {
            scored.push_back({1, 0, &o->point});
          } else {
            const auto& [epoch, value] = *o->intermediate.rbegin();
            scored.push_back({-static_cast<double>(epoch),
                              std::isnan(value) ? kInf : value, &o->point});
          }
          ++n;
          break;
        case Observation::State::kRunning:
          if (options_.constant_liar) scored.push_back({kInf, kInf, &o->point});
          break;
        case Observation::State::kFailed:
          break;
      }
    }
    if (n < options_.startup_trials) {
      return startup_sampler_->Suggest(number, history);
    }

    // The best gamma(n) by (step, value), ties in trial order.
    std::vector<size_t> order(scored.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (scored[a].step != scored[b].step) {
        return scored[a].step < scored[b].step;
      }
      return scored[a].value < scored[b].value;
    });
    const size_t below_count = std::min<size_t>(DefaultGamma(n), order.size());
    std::vector<bool> is_below(scored.size(), false);
    for (size_t i = 0; i < below_count; ++i) is_below[order[i]] = true;

    std::mt19937_64 rng = SuggestGenerator(seed_, number, kTpeStream);
    const int candidates = std::max(options_.ei_candidates, 1);
    Point point(dimensions_.size());
    std::vector<double> below;
    std::vector<double> above;
    for (size_t d = 0; d < dimensions_.size(); ++d) {
      if (dimensions_[d].low == dimensions_[d].high) {
        // One value only (Optuna's trial returns it without the sampler).
        point[d] = dimensions_[d].low;
        continue;
      }
      // A conditional parameter, as Optuna's univariate TPE treats one:
      // only the trials in which it exists count, split among themselves,
      // and it is drawn at random until startup_trials of them finished.
      const std::vector<bool>* split = &is_below;
      std::vector<bool> own_split;
      if (dimensions_[d].parent >= 0) {
        auto has = [&](size_t i) {
          return !scored[i].point->empty() && !std::isnan((*scored[i].point)[d]);
        };
        int n_d = 0;
        for (size_t i = 0; i < scored.size(); ++i) n_d += has(i) && scored[i].step != kInf;
        if (n_d < options_.startup_trials) {
          point[d] = SampleUniform(dimensions_[d], rng);
          continue;
        }
        own_split.assign(scored.size(), false);
        size_t taken = 0;
        const size_t wanted = DefaultGamma(n_d);
        for (size_t k = 0; k < order.size() && taken < wanted; ++k) {
          if (!has(order[k])) continue;
          own_split[order[k]] = true;
          ++taken;
        }
        split = &own_split;
      }
      below.clear();
      above.clear();
      for (size_t i = 0; i < scored.size(); ++i) {  // trial-number order
        if (scored[i].point->empty() || std::isnan((*scored[i].point)[d])) continue;
        ((*split)[i] ? below : above).push_back((*scored[i].point)[d]);
      }
      const ParzenEstimator l(dimensions_[d], below, options_.prior_weight);
      const ParzenEstimator g(dimensions_[d], above, options_.prior_weight);
      double best = 0;
      double best_score = -kInf;
      for (int c = 0; c < candidates; ++c) {
        const double x = l.Sample(rng);
        const double score = l.LogPdf(x) - g.LogPdf(x);
        if (c == 0 || score > best_score) {
          best = x;
          best_score = score;
        }
      }
      point[d] = best;
    }
    MaskInactive(dimensions_, point);
    return point;
  }

 private:
  const std::vector<Dimension> dimensions_;
  const TpeOptions options_;
  const uint64_t seed_;
  // Startup trials: Optuna's TPESampler delegates to a RandomSampler too.
  const std::unique_ptr<Sampler> startup_sampler_;
};

}  // namespace

std::unique_ptr<Sampler> NewTpeSampler(std::vector<Dimension> dimensions,
                                       TpeOptions options, uint64_t seed) {
  return std::make_unique<TpeSampler>(std::move(dimensions), options, seed);
}

}  // namespace mpilearn::opt
