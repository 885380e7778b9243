// NSGA-II (nsga2_sampler.cc) against Optuna 3.1's NSGAIISampler itself
// (optuna_nsga2_reference.py, run with Debian's /usr/bin/python3; skipped
// without it): the same two-objective function, population, trial count
// and number of seeds; the mean hypervolume of the fronts must match
// Optuna's within the seed noise and beat random search's. Plus the
// sampler's own rules: generations, the first one random, children made of
// their parents' values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/opt/pareto.h"
#include "server/opt/sampler.h"

namespace mpilearn::opt {
namespace {

constexpr int kVariables = 6;
constexpr int kSeeds = 8;
constexpr int kTrials = 200;
constexpr int kPopulation = 20;
constexpr double kReference[2] = {1.0, 10.0};

// ZDT1 of kVariables variables in [0, 1].
std::vector<double> Zdt1(const Point& x) {
  double sum = 0;
  for (int i = 1; i < kVariables; ++i) sum += x[i];
  const double g = 1 + 9 * sum / (kVariables - 1);
  return {x[0], g * (1 - std::sqrt(x[0] / g))};
}

// The area the front of `points` dominates up to kReference.
double Hypervolume(const std::vector<std::vector<double>>& points) {
  std::vector<std::vector<double>> front;
  for (size_t i : ParetoFront(points)) {
    if (points[i][0] < kReference[0] && points[i][1] < kReference[1]) front.push_back(points[i]);
  }
  std::sort(front.begin(), front.end());
  double area = 0;
  double ceiling = kReference[1];
  for (const std::vector<double>& p : front) {
    if (p[1] < ceiling) {
      area += (kReference[0] - p[0]) * (ceiling - p[1]);
      ceiling = p[1];
    }
  }
  return area;
}

std::vector<Dimension> Space() {
  std::vector<Dimension> dims(kVariables);
  for (int i = 0; i < kVariables; ++i) {
    dims[i].path = absl::StrCat("x", i);
    dims[i].low = 0;
    dims[i].high = 1;
  }
  return dims;
}

// One sequential study of kTrials; its hypervolume. `generations`, when
// given, receives each trial's generation.
double RunStudy(Sampler& sampler, std::vector<int>* generations = nullptr) {
  std::vector<Observation> history;
  std::vector<std::vector<double>> points;
  for (int n = 0; n < kTrials; ++n) {
    Observation o;
    o.number = n;
    o.generation = sampler.Generation(history).value_or(-1);
    o.point = sampler.Suggest(n, history).value();
    o.values = Zdt1(o.point);
    if (generations != nullptr) generations->push_back(o.generation);
    points.push_back(o.values);
    history.push_back(o);
  }
  return Hypervolume(points);
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double StandardDeviation(const std::vector<double>& v) {
  const double mean = Mean(v);
  double sum = 0;
  for (double x : v) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(v.size() - 1));
}

TEST(Nsga2Test, GenerationsTheFirstRandomThenChildrenOfParents) {
  Nsga2Options options;
  options.population_size = 4;
  options.mutation_prob = 0.0;
  auto sampler = NewNsga2Sampler(Space(), options, 3);
  std::vector<int> generations;
  std::vector<Observation> history;
  for (int n = 0; n < 12; ++n) {
    Observation o;
    o.number = n;
    o.generation = sampler->Generation(history).value();
    o.point = sampler->Suggest(n, history).value();
    o.values = Zdt1(o.point);
    generations.push_back(o.generation);
    if (n >= 4) {
      // Without mutation every value of a child is one of the first
      // generation's values for that parameter (generations descend from it).
      for (int d = 0; d < kVariables; ++d) {
        bool inherited = false;
        for (int p = 0; p < 4; ++p) inherited = inherited || history[p].point[d] == o.point[d];
        EXPECT_TRUE(inherited) << "trial " << n << " x" << d;
      }
    }
    history.push_back(o);
  }
  EXPECT_EQ(generations, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
}

bool OptunaAvailable() {
  return std::system("/usr/bin/python3 -c 'import optuna' >/dev/null 2>&1") == 0;
}

// optuna_nsga2_reference.py's per-seed hypervolumes under `key`
// ("nsga2", "random"); empty when it fails.
std::vector<double> OptunaHypervolumes(const std::string& out, const std::string& key) {
  const std::string marker = absl::StrCat("\"", key, "\": [");
  const size_t at = out.find(marker);
  if (at == std::string::npos) return {};
  std::vector<double> values;
  const char* p = out.c_str() + at + marker.size();
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    values.push_back(std::strtod(p, &end));
    if (end == p) return {};
    p = end;
    while (*p == ',' || *p == ' ') ++p;
  }
  return values;
}

TEST(Nsga2Test, MatchesOptunasHypervolumeAndBeatsRandom) {
  if (!OptunaAvailable()) GTEST_SKIP() << "/usr/bin/python3 cannot import optuna (the reference)";
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string command = absl::StrCat(
      "/usr/bin/python3 ", srcdir ? srcdir : ".", "/", workspace ? workspace : "",
      "/server/opt/optuna_nsga2_reference.py --seeds=", kSeeds, " --trials=", kTrials,
      " --population=", kPopulation);
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const std::vector<double> optuna = OptunaHypervolumes(out, "nsga2");
  const std::vector<double> optuna_random = OptunaHypervolumes(out, "random");
  ASSERT_EQ(optuna.size(), static_cast<size_t>(kSeeds)) << out;

  std::vector<double> ours;
  std::vector<double> ours_random;
  Nsga2Options options;
  options.population_size = kPopulation;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    ours.push_back(RunStudy(*NewNsga2Sampler(Space(), options, seed)));
    ours_random.push_back(RunStudy(*NewRandomSampler(Space(), seed)));
  }
  const double difference = Mean(ours) - Mean(optuna);
  // The standard error of a difference of two means of kSeeds studies each.
  const double error = std::sqrt((StandardDeviation(ours) * StandardDeviation(ours) +
                                  StandardDeviation(optuna) * StandardDeviation(optuna)) /
                                 kSeeds);
  std::printf("ZDT1 hypervolume, mean of %d seeds x %d trials: ours NSGA-II %.4f (sd %.4f), "
              "Optuna NSGA-II %.4f (sd %.4f), ours random %.4f, Optuna random %.4f\n",
              kSeeds, kTrials, Mean(ours), StandardDeviation(ours), Mean(optuna),
              StandardDeviation(optuna), Mean(ours_random), Mean(optuna_random));
  // Within 3 standard errors of Optuna's, and clearly above random search.
  EXPECT_LT(std::abs(difference), 3 * error);
  EXPECT_GT(Mean(ours), Mean(ours_random) + 3 * StandardDeviation(ours_random) / std::sqrt(kSeeds));
}

}  // namespace
}  // namespace mpilearn::opt
