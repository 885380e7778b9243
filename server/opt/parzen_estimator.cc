#include "server/opt/parzen_estimator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mpilearn::opt {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// log(sqrt(2 pi)).
const double kLogSqrt2Pi = 0.5 * std::log(2 * M_PI);
// Slack for the last step of a real range: (high - low) / step computed in
// floating point can fall just short of a whole number.
constexpr double kStepSlack = 1e-9;

// SplitMix64's increment and finalizer (Steele, Lea, Flood 2014).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double StepOf(const Dimension& d) {
  if (d.kind == Dimension::Kind::kInt) return d.step.value_or(1.0);
  return d.step.value_or(0.0);
}

// log(exp(p) + exp(q)).
double LogAddExp(double p, double q) {
  if (p == -kInf) return q;
  if (q == -kInf) return p;
  const double m = std::max(p, q);
  return m + std::log1p(std::exp(-std::abs(p - q)));
}

// log(exp(p) - exp(q)) for p >= q.
double LogDiff(double p, double q) {
  if (q == -kInf) return p;
  return p + std::log1p(-std::exp(q - p));
}

// The x with LogNdtr(x) == y, by bisection (LogNdtr is increasing).
double NdtriExp(double y) {
  double lo = -100;
  double hi = 100;
  double mid = 0;
  for (int i = 0; i < 200; ++i) {
    mid = 0.5 * (lo + hi);
    if (mid == lo || mid == hi) break;
    if (LogNdtr(mid) < y) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return mid;
}

}  // namespace

std::mt19937_64 SuggestGenerator(uint64_t seed, int number, uint64_t stream) {
  uint64_t h = Mix(seed);
  h = Mix(h ^ static_cast<uint64_t>(static_cast<int64_t>(number)));
  h = Mix(h ^ stream);
  return std::mt19937_64(h);
}

double Uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

double SnapToDimension(const Dimension& d, double x) {
  if (std::isnan(x)) x = d.low;
  if (d.kind == Dimension::Kind::kCategorical) {
    return std::clamp(std::nearbyint(x), 0.0,
                      static_cast<double>(std::max(d.choices - 1, 0)));
  }
  const double step = StepOf(d);
  if (step <= 0) return std::clamp(x, d.low, d.high);
  const double last = std::floor((d.high - d.low) / step + kStepSlack);
  const double k = std::clamp(std::nearbyint((x - d.low) / step), 0.0, last);
  return d.low + k * step;
}

double SampleUniform(const Dimension& d, std::mt19937_64& rng) {
  const double u = Uniform01(rng);
  if (d.kind == Dimension::Kind::kCategorical) {
    return std::min(std::floor(u * d.choices),
                    static_cast<double>(d.choices - 1));
  }
  const double step = StepOf(d);
  if (d.log) {
    // Optuna widens a log int's range by a half on each side and rounds.
    const double widen = d.kind == Dimension::Kind::kInt ? 0.5 : 0.0;
    const double lo = std::log(d.low - widen);
    const double hi = std::log(d.high + widen);
    const double x = std::exp(lo + u * (hi - lo));
    return SnapToDimension(
        d, d.kind == Dimension::Kind::kInt ? std::nearbyint(x) : x);
  }
  if (step > 0) {
    return SnapToDimension(d, d.low - 0.5 * step + u * (d.high - d.low + step));
  }
  return std::min(d.low + u * (d.high - d.low), d.high);
}

double Ndtr(double a) { return 0.5 * std::erfc(-a / M_SQRT2); }

double LogNdtr(double a) {
  if (a > 0) return std::log1p(-Ndtr(-a));
  if (a > -20) return std::log(Ndtr(a));
  // Phi(a) = phi(a) / -a * (1 - 1/a^2 + 3/a^4 - 15/a^6 + ...) for a -> -inf;
  // at a <= -20 the terms shrink by at least 200x each until they turn.
  const double log_lead = -0.5 * a * a - std::log(-a) - kLogSqrt2Pi;
  const double inv_a2 = 1 / (a * a);
  double sum = 1;
  double term = 1;
  for (int i = 1; i < 50; ++i) {
    const double next = -term * (2 * i - 1) * inv_a2;
    if (std::abs(next) >= std::abs(term)) break;  // asymptotic: stop early
    term = next;
    const double before = sum;
    sum += term;
    if (sum == before) break;
  }
  return log_lead + std::log(sum);
}

double LogGaussMass(double a, double b) {
  if (b <= 0) return LogDiff(LogNdtr(b), LogNdtr(a));
  if (a > 0) return LogDiff(LogNdtr(-a), LogNdtr(-b));
  // Around the centre both tails are small: 1 - Phi(a) - Phi(-b) without
  // cancellation.
  return std::log1p(-Ndtr(a) - Ndtr(-b));
}

double TruncNormPpf(double u, double a, double b) {
  if (u <= 0) return a;
  if (u >= 1) return b;
  double x;
  if (a < 0) {
    // Phi(x) = Phi(a) + u * (Phi(b) - Phi(a)), in logs.
    x = NdtriExp(LogAddExp(LogNdtr(a), std::log(u) + LogGaussMass(a, b)));
  } else {
    // The mirror image, in the left tail where log Phi is accurate.
    x = -NdtriExp(LogAddExp(LogNdtr(-b), std::log1p(-u) + LogGaussMass(a, b)));
  }
  return std::clamp(x, a, b);
}

int DefaultGamma(int n) {
  // The same double expression as numpy's, so the rounding agrees.
  return std::min(static_cast<int>(std::ceil(0.1 * n)), 25);
}

std::vector<double> DefaultWeights(int n) {
  if (n <= 0) return {};
  if (n < 25) return std::vector<double>(n, 1.0);
  // numpy.linspace(1 / n, 1, n - 25) followed by 25 ones.
  const int ramp = n - 25;
  std::vector<double> w(n, 1.0);
  const double start = 1.0 / n;
  if (ramp == 1) {
    w[0] = start;
  } else if (ramp > 1) {
    const double delta = (1.0 - start) / (ramp - 1);
    for (int i = 0; i < ramp - 1; ++i) w[i] = start + i * delta;
    w[ramp - 1] = 1.0;
  }
  return w;
}

ParzenEstimator::ParzenEstimator(const Dimension& dimension,
                                 absl::Span<const double> observations,
                                 double prior_weight)
    : dimension_(dimension) {
  const int n = static_cast<int>(observations.size());
  // Weights: DefaultWeights for the observations, then the prior
  // (consider_prior=True).
  weights_ = DefaultWeights(n);
  weights_.push_back(prior_weight);
  const double total = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  for (double& w : weights_) w /= total;

  if (dimension_.kind == Dimension::Kind::kCategorical) {
    const int k = dimension_.choices;
    choice_probabilities_.assign(k, 0.0);
    const double base = prior_weight / (n + 1);
    const double row_total = k * base + 1;
    for (int i = 0; i < n; ++i) {
      const int c =
          static_cast<int>(SnapToDimension(dimension_, observations[i]));
      for (int j = 0; j < k; ++j) {
        choice_probabilities_[j] += weights_[i] * base / row_total;
      }
      choice_probabilities_[c] += weights_[i] / row_total;
    }
    for (int j = 0; j < k; ++j) choice_probabilities_[j] += weights_[n] / k;
    return;
  }

  // Bounds in transformed coordinates (Optuna's _calculate_parzen_bounds).
  const double step = StepOf(dimension_);
  if (dimension_.log) {
    const double widen = dimension_.kind == Dimension::Kind::kInt ? 0.5 : 0.0;
    low_ = std::log(dimension_.low - widen);
    high_ = std::log(dimension_.high + widen);
  } else if (step > 0) {
    step_ = step;
    low_ = dimension_.low - 0.5 * step;
    high_ = dimension_.high + 0.5 * step;
  } else {
    low_ = dimension_.low;
    high_ = dimension_.high;
  }
  const double range = high_ - low_;

  // Means: the observations, then the prior's at the centre.
  const int m = n + 1;
  mus_.resize(m);
  for (int i = 0; i < n; ++i) {
    mus_[i] = Transform(SnapToDimension(dimension_, observations[i]));
  }
  mus_[n] = 0.5 * (low_ + high_);

  // Sigmas: the larger gap to a neighbour in sorted order, the bounds at
  // the ends; with consider_endpoints=False the first and last take their
  // inner gap (when there are at least two components). The prior takes
  // part in the sorting, as in Optuna 3.1.
  std::vector<int> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return mus_[x] < mus_[y]; });
  std::vector<double> s(m + 2);
  s[0] = low_;
  for (int j = 0; j < m; ++j) s[j + 1] = mus_[order[j]];
  s[m + 1] = high_;
  std::vector<double> sorted_sigmas(m);
  for (int j = 0; j < m; ++j) {
    sorted_sigmas[j] = std::max(s[j + 1] - s[j], s[j + 2] - s[j + 1]);
  }
  if (m >= 2) {
    sorted_sigmas[0] = s[2] - s[1];
    sorted_sigmas[m - 1] = s[m] - s[m - 1];
  }
  // consider_magic_clip=True.
  const double min_sigma = range / std::min(100.0, 1.0 + m);
  const double max_sigma = range;
  sigmas_.resize(m);
  for (int j = 0; j < m; ++j) {
    sigmas_[order[j]] = std::clamp(sorted_sigmas[j], min_sigma, max_sigma);
  }
  sigmas_[n] = range;  // the prior

  log_accept_.resize(m);
  for (int i = 0; i < m; ++i) {
    log_accept_[i] = LogGaussMass((low_ - mus_[i]) / sigmas_[i],
                                  (high_ - mus_[i]) / sigmas_[i]);
  }
}

double ParzenEstimator::Transform(double x) const {
  return dimension_.log ? std::log(x) : x;
}

double ParzenEstimator::Untransform(double t) const {
  if (dimension_.log) {
    const double x = std::exp(t);
    return SnapToDimension(dimension_, dimension_.kind == Dimension::Kind::kInt
                                           ? std::nearbyint(x)
                                           : x);
  }
  return SnapToDimension(dimension_, t);
}

double ParzenEstimator::Sample(std::mt19937_64& rng) const {
  if (dimension_.kind == Dimension::Kind::kCategorical) {
    // The mixture's choice probabilities directly: the same distribution as
    // Optuna's component-then-choice draw, with one uniform instead of two.
    const double u = Uniform01(rng);
    double cumulative = 0;
    int c = 0;
    for (; c + 1 < dimension_.choices; ++c) {
      cumulative += choice_probabilities_[c];
      if (cumulative > u) break;
    }
    return c;
  }
  // A component by weight, then a truncated normal draw by inverse CDF.
  const double u = Uniform01(rng);
  double cumulative = 0;
  size_t i = 0;
  for (; i + 1 < weights_.size(); ++i) {
    cumulative += weights_[i];
    if (cumulative > u) break;
  }
  const double a = (low_ - mus_[i]) / sigmas_[i];
  const double b = (high_ - mus_[i]) / sigmas_[i];
  const double z = TruncNormPpf(Uniform01(rng), a, b);
  return Untransform(mus_[i] + sigmas_[i] * z);
}

double ParzenEstimator::LogPdf(double x) const {
  if (dimension_.kind == Dimension::Kind::kCategorical) {
    const double c = std::nearbyint(x);
    if (!(c >= 0 && c < dimension_.choices)) return -kInf;
    return std::log(choice_probabilities_[static_cast<int>(c)]);
  }
  const double t = Transform(x);
  if (!(t >= low_ && t <= high_)) return -kInf;
  double result = -kInf;
  for (size_t i = 0; i < mus_.size(); ++i) {
    if (weights_[i] <= 0) continue;
    double log_pdf;
    if (step_ > 0) {
      // The mass of the step's interval around x, within the bounds.
      const double lower = std::max(t - 0.5 * step_, low_);
      const double upper = std::min(t + 0.5 * step_, high_);
      log_pdf = LogGaussMass((lower - mus_[i]) / sigmas_[i],
                             (upper - mus_[i]) / sigmas_[i]) -
                log_accept_[i];
    } else {
      // The truncated normal's density as Optuna 3.1 computes it: without
      // the -log(sigma) (its _truncnorm.logpdf ignores `scale`; optuna
      // issue #5109, changed in Optuna 3.5 by PR #5110), so each component
      // counts sigma times its weight. Kept on purpose: with it our TPE
      // matches Optuna 3.1's results (sampler_test); with the normalized
      // density it did about 1.5x worse on the test's xy objective.
      const double z = (t - mus_[i]) / sigmas_[i];
      log_pdf = -0.5 * z * z - kLogSqrt2Pi - log_accept_[i];
    }
    result = LogAddExp(result, log_pdf + std::log(weights_[i]));
  }
  return result;
}

}  // namespace mpilearn::opt
