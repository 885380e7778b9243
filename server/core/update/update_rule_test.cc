#include "server/core/update/update_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/update/optimizer_config.h"
#include "server/core/update/optimizer_reference.h"

namespace mpilearn::server {
namespace {

using Floats = std::vector<std::vector<float>>;
using Doubles = std::vector<std::vector<double>>;

v1::JobSpec Spec(const std::string& algorithm) {
  v1::JobSpec spec;
  spec.set_algorithm(algorithm);
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.mutable_easgd()->set_alpha(0.3);
  return spec;
}

// Deterministic values spread over [-2, 2].
Floats Values(int seed) {
  Floats out = {std::vector<float>(7), std::vector<float>(3)};
  int k = seed;
  for (auto& tensor : out) {
    for (float& x : tensor) {
      k = (k * 37 + 11) % 101;
      x = static_cast<float>(k - 50) / 25.0f;
    }
  }
  return out;
}

Doubles ToDoubles(const Floats& values) {
  Doubles out;
  for (const auto& v : values) out.emplace_back(v.begin(), v.end());
  return out;
}

std::vector<size_t> Sizes(const Floats& values) {
  std::vector<size_t> sizes;
  for (const auto& v : values) sizes.push_back(v.size());
  return sizes;
}

void ExpectNear(const Floats& got, const Doubles& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    ASSERT_EQ(got[t].size(), want[t].size());
    for (size_t i = 0; i < got[t].size(); ++i) {
      EXPECT_NEAR(got[t][i], want[t][i], tolerance * (1.0 + std::fabs(want[t][i])))
          << "tensor " << t << " element " << i;
    }
  }
}

// One guarded Apply to `weights`: whether it was applied.
bool AppliedTo(UpdateRule& rule, Floats& weights, const Floats& update,
               float scale) {
  const absl::StatusOr<UpdateRule::Result> result =
      rule.Apply(weights, update, scale);
  return result.ok() && result->outcome == UpdateRule::Outcome::kApplied;
}

// downpour and sync: the job's optimizer steps on the gradient times the
// staleness scale, checked against the double-precision reference Adam fed
// the scaled gradient.
TEST(UpdateRuleTest, GradientIsOneOptimizerStepOnTheScaledGradient) {
  for (const char* algorithm : {"downpour", "sync", ""}) {
    const v1::JobSpec spec = Spec(algorithm);
    Floats weights = Values(1);
    auto rule = UpdateRule::Create(spec, Sizes(weights), EngineOptions());
    ASSERT_TRUE(rule.ok()) << rule.status();
    EXPECT_EQ((*rule)->kind(), v1::UPDATE_KIND_GRADIENT);
    EXPECT_FALSE((*rule)->replies_with_previous());
    ASSERT_NE((*rule)->optimizer(), nullptr);

    ReferenceOptimizer reference(ResolveOptimizerConfig(spec.optimizer()).value(),
                                 Sizes(weights));
    Doubles expected = ToDoubles(weights);
    const float scales[] = {1.0f, 0.5f, 0.25f};
    for (int step = 0; step < 3; ++step) {
      const Floats grad = Values(10 + step);
      Doubles scaled = ToDoubles(grad);
      for (auto& v : scaled) {
        for (double& x : v) x *= scales[step];
      }
      reference.Step(expected, scaled);
      ASSERT_TRUE(AppliedTo(**rule, weights, grad, scales[step]));
    }
    ExpectNear(weights, expected, 1e-5);
    EXPECT_EQ((*rule)->optimizer()->steps(), 3);
  }
}

// easgd: c += alpha * scale * (x - c), and the reply is the centre before
// the move.
TEST(UpdateRuleTest, ElasticMovesTheCentreTowardsTheRank) {
  const v1::JobSpec spec = Spec("easgd");
  Floats centre = Values(2);
  auto rule = UpdateRule::Create(spec, Sizes(centre), EngineOptions());
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ((*rule)->kind(), v1::UPDATE_KIND_ELASTIC);
  EXPECT_TRUE((*rule)->replies_with_previous());
  EXPECT_EQ((*rule)->optimizer(), nullptr);

  Doubles expected = ToDoubles(centre);
  for (float scale : {1.0f, 1.0f / 3.0f}) {
    const Floats x = Values(20);
    for (size_t t = 0; t < x.size(); ++t) {
      for (size_t i = 0; i < x[t].size(); ++i) {
        expected[t][i] += 0.3 * scale * (x[t][i] - expected[t][i]);
      }
    }
    ASSERT_TRUE(AppliedTo(**rule, centre, x, scale));
  }
  ExpectNear(centre, expected, 1e-6);
}

// gem: c += scale * delta.
TEST(UpdateRuleTest, DeltaIsAddedScaled) {
  const v1::JobSpec spec = Spec("gem");
  Floats centre = Values(3);
  auto rule = UpdateRule::Create(spec, Sizes(centre), EngineOptions());
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ((*rule)->kind(), v1::UPDATE_KIND_DELTA);
  EXPECT_FALSE((*rule)->replies_with_previous());
  EXPECT_EQ((*rule)->optimizer(), nullptr);

  Doubles expected = ToDoubles(centre);
  const Floats delta = Values(30);
  for (size_t t = 0; t < delta.size(); ++t) {
    for (size_t i = 0; i < delta[t].size(); ++i) {
      expected[t][i] += 0.25 * delta[t][i];
    }
  }
  ASSERT_TRUE(AppliedTo(**rule, centre, delta, 0.25f));
  ExpectNear(centre, expected, 1e-6);
}

// The guard inside each rule: an Apply that would make the weights (gem,
// easgd) or the optimizer state (adam's v) NaN or Inf is undone by the rule,
// leaving both bit for bit as they were, and the next Apply gives what it
// gives without the refused one.
TEST(UpdateRuleTest, NonFiniteApplyIsUndoneByTheRule) {
  for (const char* algorithm : {"downpour", "gem", "easgd"}) {
    SCOPED_TRACE(algorithm);
    const v1::JobSpec spec = Spec(algorithm);
    Floats weights = Values(1);
    Floats twin_weights = weights;
    auto rule = UpdateRule::Create(spec, Sizes(weights), EngineOptions());
    auto twin = UpdateRule::Create(spec, Sizes(weights), EngineOptions());
    ASSERT_TRUE(rule.ok() && twin.ok());
    ASSERT_TRUE(AppliedTo(**rule, weights, Values(2), 1.0f));
    ASSERT_TRUE(AppliedTo(**twin, twin_weights, Values(2), 1.0f));
    // Pushes the centre towards the fp32 limit first where one push alone
    // stays finite.
    const float big = 3e38f;
    if (std::string(algorithm) != "downpour") {
      const Floats near = {std::vector<float>(7, big), std::vector<float>(3, big)};
      ASSERT_TRUE(AppliedTo(**rule, weights, near, 1.0f));
      ASSERT_TRUE(AppliedTo(**twin, twin_weights, near, 1.0f));
    }
    const float bad = std::string(algorithm) == "easgd" ? -big : big;
    const Floats overflow = {std::vector<float>(7, bad), std::vector<float>(3, bad)};
    const Floats before = weights;
    // The optimizer's step count and state, as bytes.
    const auto state_bits = [&] {
      std::string bits;
      if ((*rule)->optimizer() == nullptr) return bits;
      const OptimizerState state = (*rule)->optimizer()->SaveState().value();
      bits = absl::StrCat(state.steps);
      for (const auto& buffer : state.buffers) {
        for (const auto& t : buffer) {
          bits.append(reinterpret_cast<const char*>(t.data()),
                      t.size() * sizeof(float));
        }
      }
      return bits;
    };
    const std::string state_before = state_bits();
    const absl::StatusOr<UpdateRule::Result> result =
        (*rule)->Apply(weights, overflow, 1.0f);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->outcome, UpdateRule::Outcome::kUndone);
    EXPECT_EQ(std::memcmp(weights[0].data(), before[0].data(), 7 * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(weights[1].data(), before[1].data(), 3 * sizeof(float)), 0);
    EXPECT_EQ(state_bits(), state_before);
    ASSERT_TRUE(AppliedTo(**rule, weights, Values(3), 0.5f));
    ASSERT_TRUE(AppliedTo(**twin, twin_weights, Values(3), 0.5f));
    EXPECT_EQ(weights, twin_weights);
  }
}

TEST(UpdateRuleTest, NameIsOptimizerOrAlgorithm) {
  EXPECT_EQ(UpdateRuleName(Spec("downpour")), "adam");
  EXPECT_EQ(UpdateRuleName(Spec("sync")), "adam");
  EXPECT_EQ(UpdateRuleName(Spec("easgd")), "easgd");
  EXPECT_EQ(UpdateRuleName(Spec("gem")), "gem");
}

TEST(UpdateRuleTest, OptimizerGoesWithGradientRulesOnly) {
  auto missing = UpdateRule::WithOptimizer(Spec("sync"), nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(missing.status()), v1::ERROR_REASON_INTERNAL);
  auto optimizer = CreateOptimizer(Spec("gem").optimizer(), {3});
  ASSERT_TRUE(optimizer.ok());
  auto extra = UpdateRule::WithOptimizer(Spec("gem"), *std::move(optimizer));
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UpdateRuleTest, StatsMeanStaleness) {
  UpdateStats stats;
  for (uint64_t s : {0, 3, 1, 4}) stats.Applied(s);
  ++stats.stale_rejected;
  v1::JobStatus status;
  stats.FillStatus(&status);
  EXPECT_EQ(status.updates_applied(), 4u);
  EXPECT_EQ(status.stale_rejected(), 1u);
  EXPECT_EQ(status.max_staleness_seen(), 4u);
  EXPECT_DOUBLE_EQ(status.mean_staleness(), 2.0);
}

}  // namespace
}  // namespace mpilearn::server
