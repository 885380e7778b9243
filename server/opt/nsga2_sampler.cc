// NSGA-II for studies of several objectives, after Optuna 3.1's
// NSGAIISampler (Deb et al. 2002): trials come in generations of
// population_size; the first is random; each later trial is a child of the
// parent population (the elite of the previous generation and its parents:
// the best non-dominated ranks, the last rank cut by crowding distance),
// two parents picked by binary tournament on dominance, uniform crossover
// with probability crossover_prob (else one parent's copy), then each
// parameter re-drawn at random with probability mutation_prob (default
// 1 / parameters). A trial's generation is recorded with it (Trial.
// generation), as Optuna keeps it in a system attribute.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "server/opt/pareto.h"
#include "server/opt/parzen_estimator.h"
#include "server/opt/sampler.h"

namespace mpilearn::opt {
namespace {

constexpr uint64_t kNsga2Stream = 3;
constexpr double kInf = std::numeric_limits<double>::infinity();

using Individual = const Observation*;

// Ranks of non-domination: rank 0 is the front, rank 1 the front without
// it, and so on.
std::vector<std::vector<Individual>> NonDominatedRanks(std::vector<Individual> population) {
  const size_t n = population.size();
  std::vector<int> dominated_by(n, 0);
  std::vector<std::vector<size_t>> dominates(n);
  for (size_t p = 0; p < n; ++p) {
    for (size_t q = p + 1; q < n; ++q) {
      if (Dominates(population[p]->values, population[q]->values)) {
        dominates[p].push_back(q);
        ++dominated_by[q];
      } else if (Dominates(population[q]->values, population[p]->values)) {
        dominates[q].push_back(p);
        ++dominated_by[p];
      }
    }
  }
  std::vector<std::vector<Individual>> ranks;
  std::vector<bool> placed(n, false);
  size_t left = n;
  while (left > 0) {
    std::vector<size_t> front;
    for (size_t i = 0; i < n; ++i) {
      if (!placed[i] && dominated_by[i] == 0) front.push_back(i);
    }
    std::vector<Individual>& rank = ranks.emplace_back();
    for (size_t i : front) {
      placed[i] = true;
      --left;
      rank.push_back(population[i]);
    }
    for (size_t i : front) {
      for (size_t j : dominates[i]) --dominated_by[j];
    }
  }
  return ranks;
}

// Sorts `rank` by crowding distance, largest first: per objective, the gap
// between a point's neighbours over the objective's finite range (the ends
// infinitely far), summed.
void SortByCrowding(std::vector<Individual>& rank) {
  if (rank.empty()) return;
  std::map<Individual, double> distance;
  for (size_t k = 0; k < rank.front()->values.size(); ++k) {
    std::stable_sort(rank.begin(), rank.end(), [k](Individual a, Individual b) {
      return a->values[k] < b->values[k];
    });
    if (rank.front()->values[k] == rank.back()->values[k]) continue;
    std::vector<double> v = {-kInf};
    for (Individual x : rank) v.push_back(x->values[k]);
    v.push_back(kInf);
    double low = v[1];
    double high = v[v.size() - 2];
    for (double x : v) {
      if (std::isfinite(x)) {
        low = std::min(low, x);
        high = std::max(high, x);
      }
    }
    double width = high - low;
    if (!(width > 0)) width = 1.0;
    for (size_t j = 0; j < rank.size(); ++j) {
      const double gap = v[j] == v[j + 2] ? 0.0 : v[j + 2] - v[j];
      distance[rank[j]] += gap / width;
    }
  }
  std::stable_sort(rank.begin(), rank.end(), [&distance](Individual a, Individual b) {
    return distance[a] > distance[b];
  });
}

class Nsga2Sampler final : public Sampler {
 public:
  Nsga2Sampler(std::vector<Dimension> dimensions, Nsga2Options options, uint64_t seed)
      : dimensions_(std::move(dimensions)), options_(options), seed_(seed) {}

  absl::StatusOr<Point> Suggest(int number, absl::Span<const Observation> history) override {
    std::mt19937_64 rng = SuggestGenerator(seed_, number, kNsga2Stream);
    const auto [generation, parents] = ParentPopulation(history);
    Point child(dimensions_.size(), std::numeric_limits<double>::quiet_NaN());
    if (generation >= 0 && !parents.empty()) {
      if (Uniform01(rng) < options_.crossover_prob && parents.size() >= 2) {
        const Individual first = Tournament(parents, nullptr, rng);
        const Individual second = Tournament(parents, first, rng);
        for (size_t d = 0; d < child.size(); ++d) {
          child[d] = Uniform01(rng) >= options_.swapping_prob ? second->point[d] : first->point[d];
        }
      } else {
        child = parents[std::min(parents.size() - 1,
                                 static_cast<size_t>(Uniform01(rng) * parents.size()))]
                    ->point;
      }
      const double mutation = options_.mutation_prob.value_or(
          1.0 / std::max<double>(1.0, static_cast<double>(dimensions_.size())));
      for (double& x : child) {
        if (Uniform01(rng) < mutation) x = std::numeric_limits<double>::quiet_NaN();
      }
    }
    // The first generation, mutated parameters, and a conditional one that
    // exists in the child but in neither parent: drawn at random.
    for (size_t d = 0; d < child.size(); ++d) {
      if (std::isnan(child[d]) && Active(dimensions_, child, d)) {
        child[d] = SampleUniform(dimensions_[d], rng);
      }
    }
    MaskInactive(dimensions_, child);
    return child;
  }

  std::optional<int> Generation(absl::Span<const Observation> history) const override {
    return ParentPopulation(history).first + 1;
  }

 private:
  // The newest generation that has population_size complete trials, and its
  // elite (-1 and none before the first is full).
  std::pair<int, std::vector<Individual>> ParentPopulation(
      absl::Span<const Observation> history) const {
    std::map<int, std::vector<Individual>> by_generation;
    for (const Observation& o : history) {
      if (o.state == Observation::State::kComplete && o.generation >= 0 && !o.values.empty() &&
          o.point.size() == dimensions_.size()) {
        by_generation[o.generation].push_back(&o);
      }
    }
    std::vector<Individual> parents;
    int generation = -1;
    for (;;) {
      std::vector<Individual> population = by_generation[generation + 1];
      if (static_cast<int>(population.size()) < options_.population_size) break;
      population.insert(population.end(), parents.begin(), parents.end());
      parents = Elite(std::move(population));
      ++generation;
    }
    return {generation, parents};
  }

  std::vector<Individual> Elite(std::vector<Individual> population) const {
    std::vector<Individual> elite;
    const size_t size = static_cast<size_t>(options_.population_size);
    for (std::vector<Individual>& rank : NonDominatedRanks(std::move(population))) {
      if (elite.size() + rank.size() < size) {
        elite.insert(elite.end(), rank.begin(), rank.end());
        continue;
      }
      SortByCrowding(rank);
      elite.insert(elite.end(), rank.begin(), rank.begin() + static_cast<long>(size - elite.size()));
      break;
    }
    return elite;
  }

  // Binary tournament among `population` less `taken`: two drawn at
  // random, the first if it dominates the second, else the second.
  static Individual Tournament(const std::vector<Individual>& population, Individual taken,
                               std::mt19937_64& rng) {
    std::vector<Individual> pool;
    for (Individual x : population) {
      if (x != taken) pool.push_back(x);
    }
    auto draw = [&]() {
      return pool[std::min(pool.size() - 1, static_cast<size_t>(Uniform01(rng) * pool.size()))];
    };
    const Individual a = draw();
    const Individual b = draw();
    return Dominates(a->values, b->values) ? a : b;
  }

  const std::vector<Dimension> dimensions_;
  const Nsga2Options options_;
  const uint64_t seed_;
};

}  // namespace

std::unique_ptr<Sampler> NewNsga2Sampler(std::vector<Dimension> dimensions, Nsga2Options options,
                                         uint64_t seed) {
  return std::make_unique<Nsga2Sampler>(std::move(dimensions), options, seed);
}

}  // namespace mpilearn::opt
