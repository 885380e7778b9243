#include "server/core/update/update_rule.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
      ASSERT_TRUE((*rule)->Apply(weights, grad, scales[step]).ok());
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
    ASSERT_TRUE((*rule)->Apply(centre, x, scale).ok());
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
  ASSERT_TRUE((*rule)->Apply(centre, delta, 0.25f).ok());
  ExpectNear(centre, expected, 1e-6);
}

TEST(UpdateRuleTest, StalenessScaleIsInverseOnlyWhenAsked) {
  v1::JobSpec spec = Spec("downpour");
  for (uint64_t s : {0, 1, 2, 7}) EXPECT_EQ(StalenessScale(spec, s), 1.0f);
  spec.set_staleness_scaling("inverse");
  EXPECT_EQ(StalenessScale(spec, 0), 1.0f);
  EXPECT_EQ(StalenessScale(spec, 1), 1.0f);
  EXPECT_EQ(StalenessScale(spec, 2), 0.5f);
  EXPECT_FLOAT_EQ(StalenessScale(spec, 7), static_cast<float>(1.0 / 7.0));
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

GradientUpdate UpdateOf(v1::UpdateKind kind, Floats values) {
  GradientUpdate update;
  update.kind = kind;
  update.values = std::move(values);
  return update;
}

TEST(UpdateRuleTest, BadUpdatesAreInvalidRequests) {
  WeightsSnapshot weights;
  weights.header = MakeFloat32Header(0, {"w", "b"}, {{7}, {3}});
  weights.values = Values(4);
  const v1::JobSpec gem = Spec("gem");
  EXPECT_TRUE(
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, Values(5)), -1, gem, "job-1",
                  weights)
          .ok());
  Floats short_tensor = Values(5);
  short_tensor[1].pop_back();
  const absl::Status checks[] = {
      // Not the kind gem takes.
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_GRADIENT, Values(5)), -1, gem,
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, {Values(5)[0]}), -1, gem,
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, short_tensor), -1, gem,
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, Values(5)), 1, gem, "job-1",
                  weights),
  };
  for (const absl::Status& status : checks) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_INVALID_REQUEST) << status;
  }
  EXPECT_NE(checks[3].message().find("'b'"), std::string::npos);
}

TEST(UpdateRuleTest, StalenessBeyondTheBoundIsAStaleUpdate) {
  v1::JobSpec spec = Spec("downpour");
  EXPECT_EQ(StalenessOf(spec, 3, 10).value(), 7u);  // no bound
  EXPECT_EQ(StalenessOf(spec, 12, 10).value(), 0u);
  spec.set_max_staleness(2);
  EXPECT_EQ(StalenessOf(spec, 8, 10).value(), 2u);
  const absl::Status stale = StalenessOf(spec, 7, 10).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(stale), v1::ERROR_REASON_STALE_UPDATE);
}

TEST(UpdateRuleTest, FirstNonFiniteFindsNanAndInf) {
  Floats values = Values(6);
  EXPECT_EQ(FirstNonFinite(values), -1);
  values[1][2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(values), 1);
  values[0][0] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(values), 0);
}

// Every position of a tensor (the scan's unrolled body and its tail), each
// kind of non-finite value, and the extreme finite ones, against
// std::isfinite.
TEST(UpdateRuleTest, FirstNonFiniteAtEveryPosition) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::nanf(""), -std::nanf("1")};
  const float finite[] = {std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -0.0f};
  for (size_t n : {size_t{1}, size_t{3}, size_t{64}, size_t{65}, size_t{130}}) {
    for (size_t at = 0; at < n; ++at) {
      for (float bad : specials) {
        Floats values = {std::vector<float>(n, 1.0f), std::vector<float>(n, 1.0f)};
        values[1][at] = bad;
        EXPECT_FALSE(std::isfinite(values[1][at]));
        EXPECT_EQ(FirstNonFinite(values), 1) << n << " " << at << " " << bad;
      }
      for (float good : finite) {
        Floats values = {std::vector<float>(n, 1.0f)};
        values[0][at] = good;
        EXPECT_EQ(FirstNonFinite(values), -1) << n << " " << at << " " << good;
      }
    }
  }
}

TEST(UpdateRuleTest, InitialWeightsAreChecked) {
  const v1::TensorSetHeader header =
      MakeFloat32Header(0, {"w", "b"}, {{7}, {3}});
  auto sizes = CheckInitialWeights(header, Values(7));
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<size_t>{7, 3}));
  Floats bad = Values(7);
  bad[0][3] = std::nanf("");
  EXPECT_EQ(ReasonOf(CheckInitialWeights(header, bad).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(CheckInitialWeights(header, {Values(7)[0]}).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(CheckInitialWeights(v1::TensorSetHeader(), {}).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
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
