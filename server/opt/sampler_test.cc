// The samplers (sampler.h) and their pieces (parzen_estimator.h): random
// draws by their distributions, the grid by coverage, the Parzen estimator
// against densities written out here from the normal distribution function,
// and TPE against Optuna 3.1 itself (optuna_tpe_reference.py, run with
// /usr/bin/python3; skipped where optuna cannot be imported). Over 500
// lines: one file for the three samplers and the estimator they share.
#include "server/opt/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/opt/parzen_estimator.h"
#include "server/opt/search_space.h"

namespace mpilearn::opt {
namespace {

using Kind = Dimension::Kind;
using State = Observation::State;

Dimension Real(double low, double high, bool log = false,
               std::optional<double> step = std::nullopt) {
  Dimension d;
  d.kind = Kind::kReal;
  d.low = low;
  d.high = high;
  d.log = log;
  d.step = step;
  return d;
}

Dimension Int(double low, double high, double step = 1, bool log = false) {
  Dimension d;
  d.kind = Kind::kInt;
  d.low = low;
  d.high = high;
  d.step = step;
  d.log = log;
  return d;
}

Dimension Categorical(int choices) {
  Dimension d;
  d.kind = Kind::kCategorical;
  d.low = 0;
  d.high = choices - 1;
  d.choices = choices;
  return d;
}

Observation Complete(int number, Point point, double value) {
  Observation o;
  o.number = number;
  o.point = std::move(point);
  o.state = State::kComplete;
  o.value = value;
  return o;
}

double Median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

// Phi(a) by the textbook formula, for the hand-computed references.
double Phi(double a) { return 0.5 * std::erfc(-a / std::sqrt(2.0)); }

// ---- Random ----------------------------------------------------------------

TEST(RandomSamplerTest, DrawsFollowEachDimension) {
  const std::vector<Dimension> dims = {Real(-2, 2),
                                       Real(1e-5, 1, /*log=*/true),
                                       Int(3, 17, 2),
                                       Int(1, 1000, 1, /*log=*/true),
                                       Real(0, 1, false, 0.25),
                                       Categorical(4)};
  auto sampler = NewRandomSampler(dims, 7);
  constexpr int kDraws = 4000;
  double sum_x = 0;
  int below_geometric_mid = 0;
  int log_int_at_most_31 = 0;
  std::set<double> ints;
  std::set<double> steps;
  std::vector<int> choice_counts(4, 0);
  for (int number = 0; number < kDraws; ++number) {
    const auto point = sampler->Suggest(number, {});
    ASSERT_TRUE(point.ok()) << point.status();
    const Point& p = *point;
    ASSERT_EQ(p.size(), dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      ASSERT_GE(p[i], dims[i].low) << i;
      ASSERT_LE(p[i], dims[i].high) << i;
    }
    sum_x += p[0];
    if (p[1] < std::pow(10.0, -2.5)) ++below_geometric_mid;
    ASSERT_EQ(p[2], std::round(p[2]));
    ASSERT_EQ(std::fmod(p[2] - 3, 2), 0) << p[2];
    ints.insert(p[2]);
    ASSERT_EQ(p[3], std::round(p[3]));
    if (p[3] <= 31) ++log_int_at_most_31;
    steps.insert(p[4]);
    ASSERT_EQ(p[5], std::round(p[5]));
    ++choice_counts[static_cast<int>(p[5])];
  }
  // Standard errors are about 0.018 for the mean and 0.008 for fractions;
  // the bounds below are 4 to 5 of them.
  EXPECT_NEAR(sum_x / kDraws, 0, 0.08);
  EXPECT_NEAR(below_geometric_mid / double{kDraws}, 0.5, 0.04);
  // Log ints: log-uniform on [0.5, 1000.5], rounded; <= 31 below 31.5.
  const double expected_31 =
      (std::log(31.5) - std::log(0.5)) / (std::log(1000.5) - std::log(0.5));
  EXPECT_NEAR(log_int_at_most_31 / double{kDraws}, expected_31, 0.04);
  EXPECT_EQ(ints, (std::set<double>{3, 5, 7, 9, 11, 13, 15, 17}));
  EXPECT_EQ(steps, (std::set<double>{0, 0.25, 0.5, 0.75, 1}));
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(choice_counts[c] / double{kDraws}, 0.25, 0.04) << c;
  }
}

TEST(RandomSamplerTest, SeedAndNumberFixThePoint) {
  const std::vector<Dimension> dims = {Real(0, 1), Int(0, 1000)};
  auto a = NewRandomSampler(dims, 3);
  auto b = NewRandomSampler(dims, 3);
  auto other_seed = NewRandomSampler(dims, 4);
  EXPECT_EQ(*a->Suggest(5, {}), *b->Suggest(5, {}));
  EXPECT_NE(*a->Suggest(5, {}), *a->Suggest(6, {}));
  EXPECT_NE(*a->Suggest(5, {}), *other_seed->Suggest(5, {}));
}

// ---- Grid ------------------------------------------------------------------

SearchSpace Space(const std::vector<std::string>& json) {
  v1::JobSpec base;
  base.mutable_data()->set_train_images("train-images.gz");
  base.mutable_data()->set_train_labels("train-labels.gz");
  google::protobuf::RepeatedPtrField<v1::ParameterSpec> parameters;
  for (const std::string& one : json) {
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(one, parameters.Add()).ok())
        << one;
  }
  auto space = SearchSpace::Create(base, parameters);
  EXPECT_TRUE(space.ok()) << space.status();
  return *std::move(space);
}

// 7 x 3 = 21 points: not a power of four, so the shuffle cycle-walks.
SearchSpace SmallGrid() {
  return Space({R"({"path": "epochs", "int": {"low": 1, "high": 7}})",
                R"({"path": "optimizer.learningRate",
                    "real": {"low": 0.1, "high": 0.3, "step": 0.1}})"});
}

TEST(GridSamplerTest, EveryPointOnceThenOutOfRange) {
  const SearchSpace space = SmallGrid();
  ASSERT_EQ(space.GridSize().value_or(0), 21u);
  std::set<Point> all;
  for (uint64_t i = 0; i < 21; ++i) all.insert(space.GridPoint(i));
  std::vector<Point> first_orders;
  for (uint64_t seed : {1, 2}) {
    auto sampler = NewGridSampler(space, seed);
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    std::vector<Observation> history;
    std::set<Point> seen;
    for (int number = 0; number < 21; ++number) {
      const auto point = (*sampler)->Suggest(number, history);
      ASSERT_TRUE(point.ok()) << point.status();
      EXPECT_TRUE(all.count(*point)) << number;
      EXPECT_TRUE(seen.insert(*point).second) << "repeated at " << number;
      history.push_back(Complete(number, *point, 0));
      if (number < 4) first_orders.push_back(*point);
    }
    const auto spent = (*sampler)->Suggest(21, history);
    EXPECT_EQ(spent.status().code(), absl::StatusCode::kOutOfRange);
  }
  // The seed shuffles: two seeds agree on the first four points with odds
  // of 1 in 21 * 20 * 19 * 18.
  EXPECT_NE(std::vector<Point>(first_orders.begin(), first_orders.begin() + 4),
            std::vector<Point>(first_orders.begin() + 4, first_orders.end()));
}

TEST(GridSamplerTest, SkipsPointsInHistoryWhateverTheirState) {
  const SearchSpace space = SmallGrid();
  auto sampler = NewGridSampler(space, 9);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  // Three points tried already (one failed, one running, one written with
  // rounding noise as a user's AskTrial might give it).
  std::vector<Observation> history = {Complete(0, space.GridPoint(4), 1),
                                      Complete(1, space.GridPoint(10), 1),
                                      Complete(2, space.GridPoint(20), 1)};
  history[0].state = State::kFailed;
  history[1].state = State::kRunning;
  history[2].point[1] += 1e-12;
  const std::set<Point> tried = {space.GridPoint(4), space.GridPoint(10),
                                 space.GridPoint(20)};
  std::set<Point> seen;
  for (int number = 3; number < 21; ++number) {
    const auto point = (*sampler)->Suggest(number, history);
    ASSERT_TRUE(point.ok()) << point.status();
    EXPECT_FALSE(tried.count(*point)) << number;
    EXPECT_TRUE(seen.insert(*point).second) << number;
    history.push_back(Complete(number, *point, 0));
  }
  EXPECT_EQ((*sampler)->Suggest(21, history).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(GridSamplerTest, HugeGridsNeedNoTableAndRefuseRealsWithoutStep) {
  // 2^20 * 2^19 points: the shuffle is computed per index.
  const SearchSpace huge = Space(
      {R"({"path": "data_unit_size", "int": {"low": 1, "high": 1048576}})",
       R"({"path": "data.train_limit", "int": {"low": 0, "high": 524287}})"});
  ASSERT_EQ(huge.GridSize().value_or(0), uint64_t{1} << 39);
  auto sampler = NewGridSampler(huge, 5);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  std::vector<Observation> history;
  std::set<Point> seen;
  for (int number = 0; number < 200; ++number) {
    const auto point = (*sampler)->Suggest(number, history);
    ASSERT_TRUE(point.ok()) << point.status();
    EXPECT_TRUE(seen.insert(*point).second);
    history.push_back(Complete(number, *point, 0));
  }
  const SearchSpace no_step =
      Space({R"({"path": "gem.kappa", "real": {"low": 1, "high": 2}})"});
  EXPECT_EQ(NewGridSampler(no_step, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Truncated normal and Parzen estimator ---------------------------------

TEST(TruncNormTest, TailsAgainstHighPrecisionValues) {
  // References computed with mpmath at 40 digits: log(ncdf(a)) and
  // log(ncdf(b) - ncdf(a)).
  EXPECT_NEAR(LogNdtr(1), -0.17275377902344988953, 1e-15);
  EXPECT_NEAR(LogNdtr(-5), -15.064998393988725736, 1e-12);
  EXPECT_NEAR(LogNdtr(-20.5), -214.06672896326380017, 1e-11);
  EXPECT_NEAR(LogNdtr(-30), -454.32124395634319711, 1e-10);
  EXPECT_NEAR(LogGaussMass(5, 6), -15.068446096529453352, 1e-12);
  EXPECT_NEAR(LogGaussMass(-40, -39), -765.08315656437754441, 1e-10);
  EXPECT_NEAR(LogGaussMass(-0.5, 1.5), std::log(Phi(1.5) - Phi(-0.5)), 1e-14);
  // Continuous where the series takes over.
  EXPECT_NEAR(LogNdtr(-20 - 1e-9), LogNdtr(-20 + 1e-9), 1e-7);
}

TEST(TruncNormTest, PpfInvertsTheTruncatedCdf) {
  struct Case {
    double a, b;
  };
  for (const Case c : {Case{-1, 2}, Case{-3, -1}, Case{0.5, 4}, Case{3, 8}}) {
    for (double u : {0.01, 0.3, 0.5, 0.9, 0.999}) {
      const double x = TruncNormPpf(u, c.a, c.b);
      ASSERT_GE(x, c.a);
      ASSERT_LE(x, c.b);
      // The truncated CDF from the upper tails (accurate right of 0).
      const double cdf = (Phi(-c.a) - Phi(-x)) / (Phi(-c.a) - Phi(-c.b));
      EXPECT_NEAR(cdf, u, 1e-10) << c.a << " " << c.b << " " << u;
    }
  }
  EXPECT_EQ(TruncNormPpf(0, -1, 2), -1);
  EXPECT_EQ(TruncNormPpf(1, -1, 2), 2);
}

TEST(ParzenEstimatorTest, GammaAndWeightsLikeOptuna) {
  EXPECT_EQ(DefaultGamma(1), 1);
  EXPECT_EQ(DefaultGamma(10), 1);
  EXPECT_EQ(DefaultGamma(11), 2);
  EXPECT_EQ(DefaultGamma(30), 3);
  EXPECT_EQ(DefaultGamma(300), 25);
  EXPECT_EQ(DefaultWeights(24), std::vector<double>(24, 1.0));
  // 30: numpy.linspace(1/30, 1, 5) then 25 ones.
  const std::vector<double> w = DefaultWeights(30);
  ASSERT_EQ(w.size(), 30u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(w[i], 1.0 / 30 + i * (1 - 1.0 / 30) / 4, 1e-15) << i;
  }
  for (int i = 5; i < 30; ++i) EXPECT_EQ(w[i], 1.0) << i;
}

TEST(ParzenEstimatorTest, ThreeObservationsWithMagicClip) {
  // Real [0, 10], observations 2, 3, 7 and the prior at 5. Sorted with the
  // bounds: 0 | 2 3 5 7 | 10. Larger neighbour gaps: 2: 1 (inner gap, no
  // endpoints), 3: 2, 5: 2, 7: 2 (inner gap). Magic clip: at least
  // 10 / min(100, 1 + 4) = 2, so 2's sigma 1 becomes 2; the prior's is 10.
  const ParzenEstimator pe(Real(0, 10), {2, 3, 7}, 1.0);
  EXPECT_EQ(pe.mus(), (std::vector<double>{2, 3, 7, 5}));
  EXPECT_EQ(pe.sigmas(), (std::vector<double>{2, 2, 2, 10}));
  EXPECT_EQ(pe.weights(), (std::vector<double>{0.25, 0.25, 0.25, 0.25}));
  const auto density = [](double x) {
    const double mus[] = {2, 3, 7, 5};
    const double sigmas[] = {2, 2, 2, 10};
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      const double z = (x - mus[i]) / sigmas[i];
      const double accept =
          Phi((10 - mus[i]) / sigmas[i]) - Phi((0 - mus[i]) / sigmas[i]);
      // Optuna 3.1's component density: no 1 / sigma (see LogPdf).
      sum += 0.25 * std::exp(-0.5 * z * z) / (std::sqrt(2 * M_PI) * accept);
    }
    return sum;
  };
  for (double x : {0.0, 1.5, 2.0, 5.0, 9.9, 10.0}) {
    EXPECT_NEAR(pe.LogPdf(x), std::log(density(x)), 1e-13) << x;
  }
  EXPECT_EQ(pe.LogPdf(-0.1), -INFINITY);
  EXPECT_EQ(pe.LogPdf(10.1), -INFINITY);
  // Without the 1 / sigma, each component integrates to its sigma: the
  // mixture to 0.25 * (2 + 2 + 2 + 10) = 4 (Simpson's rule, 2000
  // intervals).
  double integral = 0;
  for (int i = 0; i <= 2000; ++i) {
    const double weight = (i == 0 || i == 2000) ? 1 : (i % 2 ? 4 : 2);
    integral += weight * std::exp(pe.LogPdf(i * 10.0 / 2000));
  }
  EXPECT_NEAR(integral * (10.0 / 2000) / 3, 4, 1e-8);
  // The clip's floor with many close observations: range / 100.
  std::vector<double> close;
  for (int i = 0; i < 150; ++i) close.push_back(5 + i * 1e-4);
  const ParzenEstimator clipped(Real(0, 10), close, 1.0);
  for (int i = 0; i < 150; ++i) EXPECT_EQ(clipped.sigmas()[i], 0.1) << i;
}

TEST(ParzenEstimatorTest, SteppedIntsAreProbabilities) {
  // Int [0, 10] step 2, one observation at 4: bounds [-1, 11], mus {4, 5};
  // inner gaps 1, clipped up to 12 / 3 = 4; the prior's sigma 12.
  const ParzenEstimator pe(Int(0, 10, 2), {4}, 1.0);
  EXPECT_EQ(pe.low(), -1);
  EXPECT_EQ(pe.high(), 11);
  EXPECT_EQ(pe.mus(), (std::vector<double>{4, 5}));
  EXPECT_EQ(pe.sigmas(), (std::vector<double>{4, 12}));
  const auto mass = [](double lo, double hi, double mu, double sigma) {
    return Phi((hi - mu) / sigma) - Phi((lo - mu) / sigma);
  };
  double total = 0;
  for (double x = 0; x <= 10; x += 2) {
    const double p = 0.5 * mass(x - 1, x + 1, 4, 4) / mass(-1, 11, 4, 4) +
                     0.5 * mass(x - 1, x + 1, 5, 12) / mass(-1, 11, 5, 12);
    EXPECT_NEAR(pe.LogPdf(x), std::log(p), 1e-13) << x;
    total += std::exp(pe.LogPdf(x));
  }
  EXPECT_NEAR(total, 1, 1e-13);
  std::mt19937_64 rng = SuggestGenerator(1, 2, 3);
  for (int i = 0; i < 200; ++i) {
    const double x = pe.Sample(rng);
    ASSERT_TRUE(x >= 0 && x <= 10 && std::fmod(x, 2) == 0) << x;
  }
}

TEST(ParzenEstimatorTest, CategoricalCountsPlusPrior) {
  // Rows: prior_weight / 4 per choice plus 1 on the observed one, divided
  // by 1.75; each row weighs 1/4, the uniform prior row too.
  const ParzenEstimator pe(Categorical(3), {0, 0, 2}, 1.0);
  const double r0[] = {1.25 / 1.75, 0.25 / 1.75, 0.25 / 1.75};
  const double r2[] = {0.25 / 1.75, 0.25 / 1.75, 1.25 / 1.75};
  for (int c = 0; c < 3; ++c) {
    const double p = 0.25 * (2 * r0[c] + r2[c]) + 0.25 / 3;
    EXPECT_NEAR(pe.LogPdf(c), std::log(p), 1e-14) << c;
  }
  std::mt19937_64 rng = SuggestGenerator(4, 5, 6);
  std::vector<int> counts(3, 0);
  for (int i = 0; i < 6000; ++i) ++counts[static_cast<int>(pe.Sample(rng))];
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(counts[c] / 6000.0, std::exp(pe.LogPdf(c)), 0.025) << c;
  }
}

TEST(ParzenEstimatorTest, LogDimensionsInLogSpace) {
  const ParzenEstimator pe(Real(1e-3, 1, /*log=*/true), {0.01}, 1.0);
  EXPECT_NEAR(pe.low(), std::log(1e-3), 1e-15);
  EXPECT_NEAR(pe.high(), 0, 1e-15);
  EXPECT_NEAR(pe.mus()[0], std::log(0.01), 1e-15);
  EXPECT_NEAR(pe.mus()[1], 0.5 * std::log(1e-3), 1e-15);
}

// ---- TPE -------------------------------------------------------------------

using Objective = std::function<double(const Point&)>;

// The median over seeds 0 .. seeds - 1 of the best value after `trials`
// sequential trials.
double MedianBest(const std::function<std::unique_ptr<Sampler>(uint64_t)>& make,
                  const Objective& f, int seeds, int trials) {
  std::vector<double> bests;
  for (int seed = 0; seed < seeds; ++seed) {
    auto sampler = make(seed);
    std::vector<Observation> history;
    double best = INFINITY;
    for (int number = 0; number < trials; ++number) {
      const auto point = sampler->Suggest(number, history);
      EXPECT_TRUE(point.ok()) << point.status();
      const double value = f(*point);
      best = std::min(best, value);
      history.push_back(Complete(number, *point, value));
    }
    bests.push_back(best);
  }
  return Median(bests);
}

bool OptunaAvailable() {
  return std::system("/usr/bin/python3 -c 'import optuna' >/dev/null 2>&1") ==
         0;
}

// Runs optuna_tpe_reference.py; returns {tpe median best, random median
// best}, or an empty vector when it fails.
std::vector<double> RunOptuna(const std::string& objective, int seeds,
                              int trials) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string script =
      absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "",
                   "/server/opt/optuna_tpe_reference.py");
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", script, " --objective=", objective,
                   " --seeds=", seeds, " --trials=", trials);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {};
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    out.append(buffer, n);
  if (pclose(pipe) != 0) return {};
  std::vector<double> result;
  for (const char* key :
       {"\"tpe_median_best\": ", "\"random_median_best\": "}) {
    const size_t at = out.find(key);
    if (at == std::string::npos) return {};
    result.push_back(std::strtod(out.c_str() + at + std::strlen(key), nullptr));
  }
  return result;
}

constexpr int kSeeds = 16;
constexpr int kTrials = 60;

// x uniform in [-2, 2], y log-uniform in [1e-5, 1].
double XyObjective(const Point& p) {
  return (p[0] - 0.3) * (p[0] - 0.3) +
         (std::log10(p[1]) + 2.5) * (std::log10(p[1]) + 2.5);
}

// c of 5 choices, n int in [0, 60] step 2, x uniform in [-1, 1].
double CatIntObjective(const Point& p) {
  const double offsets[] = {0.8, 0.3, 0.0, 0.5, 1.2};
  const double n = (p[1] - 24) / 10;
  return offsets[static_cast<int>(p[0])] + n * n + p[2] * p[2];
}

struct Comparison {
  double ours_tpe, ours_random, optuna_tpe, optuna_random;
};

void CompareWithOptuna(const std::string& name,
                       const std::vector<Dimension>& dims, const Objective& f,
                       Comparison* out) {
  const std::vector<double> optuna = RunOptuna(name, kSeeds, kTrials);
  ASSERT_EQ(optuna.size(), 2u) << "optuna_tpe_reference.py failed";
  out->optuna_tpe = optuna[0];
  out->optuna_random = optuna[1];
  out->ours_tpe = MedianBest(
      [&](uint64_t seed) { return NewTpeSampler(dims, TpeOptions{}, seed); }, f,
      kSeeds, kTrials);
  out->ours_random =
      MedianBest([&](uint64_t seed) { return NewRandomSampler(dims, seed); }, f,
                 kSeeds, kTrials);
  std::printf(
      "%s median best over %d seeds of %d trials: ours TPE %.6g, "
      "Optuna TPE %.6g, ours random %.6g, Optuna random %.6g\n",
      name.c_str(), kSeeds, kTrials, out->ours_tpe, out->optuna_tpe,
      out->ours_random, out->optuna_random);
}

TEST(TpeSamplerTest, MatchesOptunaOnARealAndALogDimension) {
  if (!OptunaAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import optuna (the reference)";
  }
  Comparison c;
  CompareWithOptuna("xy", {Real(-2, 2), Real(1e-5, 1, /*log=*/true)},
                    XyObjective, &c);
  // Both sides are deterministic for these seeds. Measured (median best,
  // 16 seeds x 60 trials): ours 0.0032, Optuna 3.1 0.0048, our random
  // 0.058. Over six disjoint blocks of 16 seeds ours ranged 0.0029-0.0077
  // and Optuna's 0.0048-0.0072: at most 1.6x apart, so 3x leaves room for
  // seed noise while still failing a TPE that is merely random-like (12x).
  EXPECT_LE(c.ours_tpe, 3 * c.optuna_tpe);
  EXPECT_LE(c.ours_tpe, 0.3 * c.ours_random);
}

TEST(TpeSamplerTest, MatchesOptunaOnCategoricalIntAndReal) {
  if (!OptunaAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import optuna (the reference)";
  }
  Comparison c;
  CompareWithOptuna("catint", {Categorical(5), Int(0, 60, 2), Real(-1, 1)},
                    CatIntObjective, &c);
  // Measured: ours 0.0099, Optuna 3.1 0.055, our random 0.19. Medians of
  // this objective swing more with the seeds (six blocks of 16: ours
  // 0.0045-0.042, Optuna 0.0095-0.055); 3x still fails a random-like TPE.
  EXPECT_LE(c.ours_tpe, 3 * c.optuna_tpe);
  EXPECT_LE(c.ours_tpe, 0.5 * c.ours_random);
}

TEST(TpeSamplerTest, StartupIsRandomUntilEnoughFinishedTrials) {
  const std::vector<Dimension> dims = {Real(0, 1), Int(0, 9)};
  auto tpe = NewTpeSampler(dims, TpeOptions{}, 11);
  auto random = NewRandomSampler(dims, 11);
  std::vector<Observation> history;
  for (int i = 0; i < 9; ++i) history.push_back(Complete(i, {0.1 * i, 1}, i));
  // Nine finished and five running: still random (running ones do not
  // count), and the same draw as the random sampler's.
  for (int i = 9; i < 14; ++i) {
    history.push_back(Complete(i, {0.5, 5}, 0));
    history.back().state = State::kRunning;
  }
  EXPECT_EQ(*tpe->Suggest(14, history), *random->Suggest(14, {}));
  // A pruned trial counts: the tenth finished trial ends the startup.
  history.push_back(Complete(14, {0.9, 9}, 0));
  history.back().state = State::kPruned;
  EXPECT_NE(*tpe->Suggest(15, history), *random->Suggest(15, {}));
}

TEST(TpeSamplerTest, SingleValuedDimensionsKeepTheirValue) {
  const std::vector<Dimension> dims = {Real(0, 1), Real(2, 2), Int(5, 5)};
  auto tpe = NewTpeSampler(dims, TpeOptions{}, 1);
  std::vector<Observation> history;
  for (int i = 0; i < 12; ++i) {
    history.push_back(Complete(i, {0.08 * i, 2, 5}, i));
  }
  const auto point = tpe->Suggest(12, history);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ((*point)[1], 2);
  EXPECT_EQ((*point)[2], 5);
  // A point of the wrong size is a broken invariant.
  history.push_back(Complete(12, {0.5}, 0));
  EXPECT_EQ(tpe->Suggest(13, history).status().code(),
            absl::StatusCode::kInternal);
}

// The mean over seeds of TPE's suggestion for a 1-D real [0, 1] dimension.
double MeanSuggestion(const std::vector<Observation>& history,
                      TpeOptions options,
                      const std::function<double(double)>& stat) {
  double sum = 0;
  constexpr int kRuns = 200;
  for (int seed = 0; seed < kRuns; ++seed) {
    auto sampler = NewTpeSampler({Real(0, 1)}, options, seed);
    const auto point = sampler->Suggest(1000, history);
    EXPECT_TRUE(point.ok()) << point.status();
    sum += stat((*point)[0]);
  }
  return sum / kRuns;
}

TEST(TpeSamplerTest, PrunedTrialsRankByStepThenValue) {
  // Ten finished trials: gamma = 1, so "below" is the single best one.
  // Complete trials outrank pruned ones whatever their values: the best is
  // the complete one at 0.05, although the pruned one at 0.95 reported -100.
  std::vector<Observation> history;
  for (int i = 0; i < 9; ++i) {
    history.push_back(Complete(i, {0.05 + 0.1 * i}, 10 + i));
  }
  history.push_back(Complete(9, {0.95}, 0));
  history.back().state = State::kPruned;
  history.back().intermediate = {{1, 5.0}, {3, -100.0}};
  const auto identity = [](double x) { return x; };
  EXPECT_LT(MeanSuggestion(history, TpeOptions{}, identity), 0.3);

  // Only pruned trials: the one that got furthest (epoch 5 at 0.95) is the
  // best, ahead of better values reported at epoch 1.
  for (int i = 0; i < 9; ++i) {
    history[i].state = State::kPruned;
    history[i].intermediate = {{1, static_cast<double>(i)}};
  }
  history[9].intermediate = {{5, 50.0}};
  EXPECT_GT(MeanSuggestion(history, TpeOptions{}, identity), 0.7);
}

TEST(TpeSamplerTest, ConstantLiarMovesAwayFromRunningTrials) {
  // Twenty finished trials on (x - 0.5)^2 and six running at 0.5.
  std::vector<Observation> history;
  for (int i = 0; i < 20; ++i) {
    const double x = (i + 0.5) / 20;
    history.push_back(Complete(i, {x}, (x - 0.5) * (x - 0.5)));
  }
  for (int i = 20; i < 26; ++i) {
    history.push_back(Complete(i, {0.5}, 0));
    history.back().state = State::kRunning;
  }
  const auto distance = [](double x) { return std::abs(x - 0.5); };
  TpeOptions liar;
  liar.constant_liar = true;
  TpeOptions honest;
  honest.constant_liar = false;
  const double with_liar = MeanSuggestion(history, liar, distance);
  const double without = MeanSuggestion(history, honest, distance);
  std::printf("mean |x - 0.5|: constant liar %.4f, without %.4f\n", with_liar,
              without);
  // Measured: 0.104 with the liar, 0.012 without (below holds the two
  // trials beside 0.5; the liar puts six trials at 0.5 into above).
  EXPECT_GT(with_liar, 3 * without);
}

}  // namespace
}  // namespace mpilearn::opt
