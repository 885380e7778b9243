// Conditional parameters (ParameterSpec.when): a parameter exists only
// while an earlier one takes given values. Every sampler (random, TPE,
// grid) yields points whose trials never set an inactive parameter; the
// grid expands only valid combinations; FromValues refuses a value for an
// inactive parameter; Create refuses bad conditions.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/opt/space_fixtures.h"
#include "server/opt/sampler.h"
#include "server/opt/search_space.h"

namespace mpilearn::opt {
namespace {

using fixtures::Base;
using fixtures::Params;
using google::protobuf::RepeatedPtrField;
using google::protobuf::Value;

// The optimizer, momentum only for sgd and rmsprop; and a chain: the
// number of hidden layers, the second layer's... here epochs stands for
// "blocks" and batch_size for a width that exists only with 3 blocks.
SearchSpace OptimizerSpace(bool grid) {
  const std::string momentum =
      grid ? R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.5, "step": 0.5},
                 "when": {"path": "optimizer.name", "values": ["sgd", "rmsprop"]}})"
           : R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.99},
                 "when": {"path": "optimizer.name", "values": ["sgd", "rmsprop"]}})";
  auto space = SearchSpace::Create(
      Base(), Params({R"({"path": "optimizer.name",
                          "categorical": {"choices": ["sgd", "adam", "rmsprop"]}})",
                      momentum,
                      R"({"path": "epochs", "int": {"low": 1, "high": 3}})",
                      R"({"path": "batch_size", "int": {"low": 16, "high": 32, "step": 16},
                          "when": {"path": "epochs", "values": [3]}})"}));
  EXPECT_TRUE(space.ok()) << space.status();
  return *space;
}

// The trial a point makes never sets a parameter whose condition fails,
// and sets every one whose condition holds.
void ExpectOnlyActiveSet(const SearchSpace& space, const Point& point) {
  const ParamValues values = space.Values(point);
  const std::string name = values.at("optimizer.name").string_value();
  const bool momentum = name == "sgd" || name == "rmsprop";
  EXPECT_EQ(values.count("optimizer.momentum"), momentum ? 1u : 0u) << name;
  EXPECT_EQ(std::isnan(point[1]), !momentum);
  const bool width = values.at("epochs").number_value() == 3;
  EXPECT_EQ(values.count("batch_size"), width ? 1u : 0u);
  absl::StatusOr<v1::JobSpec> spec = space.Apply(point);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().has_momentum(), momentum);
  EXPECT_EQ(spec->has_batch_size(), width);
  // The trial's values read back to the same point.
  absl::StatusOr<Point> back = space.FromValues(values);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t i = 0; i < point.size(); ++i) {
    EXPECT_EQ(std::isnan((*back)[i]), std::isnan(point[i])) << i;
  }
}

TEST(ConditionalSpaceTest, RandomAndTpeNeverSetAnInactiveParameter) {
  const SearchSpace space = OptimizerSpace(/*grid=*/false);
  EXPECT_EQ(space.dimensions()[1].parent, 0);
  EXPECT_EQ(space.dimensions()[3].parent, 2);
  std::vector<Observation> history;
  auto tpe = NewTpeSampler(space.dimensions(), TpeOptions{.startup_trials = 5}, 3);
  std::set<std::string> seen;
  for (int n = 0; n < 60; ++n) {
    absl::StatusOr<Point> point = tpe->Suggest(n, history);
    ASSERT_TRUE(point.ok()) << point.status();
    ExpectOnlyActiveSet(space, *point);
    seen.insert(space.Values(*point).at("optimizer.name").string_value());
    Observation o;
    o.number = n;
    o.point = *point;
    // Smaller is better: sgd with momentum near 0.9.
    o.value = std::isnan((*point)[1]) ? 1.0 : std::abs((*point)[1] - 0.9);
    history.push_back(o);
  }
  EXPECT_EQ(seen.size(), 3u);
  auto random = NewRandomSampler(space.dimensions(), 9);
  for (int n = 0; n < 200; ++n) ExpectOnlyActiveSet(space, random->Suggest(n, {}).value());
}

TEST(ConditionalSpaceTest, TheGridExpandsOnlyValidCombinations) {
  const SearchSpace space = OptimizerSpace(/*grid=*/true);
  // optimizer: sgd and rmsprop x 2 momenta + adam = 5; epochs 1, 2, and
  // 3 x 2 widths = 4: 20 combinations (of 36 without conditions).
  ASSERT_EQ(space.GridSize().value(), 20u);
  auto grid = NewGridSampler(space, 5).value();
  std::vector<Observation> history;
  std::set<std::string> combinations;
  for (int n = 0; n < 20; ++n) {
    absl::StatusOr<Point> point = grid->Suggest(n, history);
    ASSERT_TRUE(point.ok()) << point.status();
    ExpectOnlyActiveSet(space, *point);
    std::string key;
    for (const auto& [path, value] : space.Values(*point)) {
      key += path + "=" + (value.has_string_value() ? value.string_value()
                                                    : std::to_string(value.number_value())) +
             ";";
    }
    combinations.insert(key);
    Observation o;
    o.number = n;
    o.point = *point;
    history.push_back(o);
  }
  EXPECT_EQ(combinations.size(), 20u);  // each once
  EXPECT_EQ(grid->Suggest(20, history).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ConditionalSpaceTest, ActivityFollowsTheParentsValueAsShown) {
  // epochs takes 1, 3, 5 (high 6 is off the step): a coordinate of 6.4
  // shows as 5, and the child that exists at 5 exists there.
  auto space = SearchSpace::Create(
      Base(), Params({R"({"path": "epochs", "int": {"low": 1, "high": 6, "step": 2}})",
                      R"({"path": "batch_size", "int": {"low": 16, "high": 32},
                          "when": {"path": "epochs", "values": [5]}})"}));
  ASSERT_TRUE(space.ok()) << space.status();
  const Point point = {6.4, 20};
  EXPECT_EQ(space->Values(point).at("epochs").number_value(), 5);
  EXPECT_TRUE(Active(space->dimensions(), point, 1));
  EXPECT_EQ(space->Values(point).count("batch_size"), 1u);
  EXPECT_FALSE(Active(space->dimensions(), {2.9, 20}, 1));  // shows as 3
}

TEST(ConditionalSpaceTest, FromValuesRefusesAnInactiveParameter) {
  const SearchSpace space = OptimizerSpace(/*grid=*/false);
  ParamValues values;
  values["optimizer.name"].set_string_value("adam");
  values["optimizer.momentum"].set_number_value(0.5);
  values["epochs"].set_number_value(1);
  absl::StatusOr<Point> refused = space.FromValues(values);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("does not exist unless optimizer.name"),
            std::string::npos)
      << refused.status();
  values.erase("optimizer.momentum");
  EXPECT_TRUE(space.FromValues(values).ok());
  values["optimizer.name"].set_string_value("sgd");
  refused = space.FromValues(values);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("missing"), std::string::npos);
}

TEST(ConditionalSpaceTest, BadConditionsAreRefused) {
  struct Case {
    std::vector<std::string> params;
    std::string part;
  };
  const std::string name =
      R"({"path": "optimizer.name", "categorical": {"choices": ["sgd", "adam"]}})";
  const std::string rate = R"({"path": "optimizer.learning_rate", "real": {"low": 0.1, "high": 1}})";
  const Case cases[] = {
      {{R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9},
            "when": {"path": "optimizer.name", "values": ["sgd"]}})",
        name},
       "is not an earlier parameter"},
      {{rate, R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9},
                  "when": {"path": "optimizer.learning_rate", "values": [0.5]}})"},
       "is a real range"},
      {{name, R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9},
                  "when": {"path": "optimizer.name", "values": ["adamw"]}})"},
       "\"adamw\" is not a value optimizer.name takes"},
      {{name, R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9},
                  "when": {"path": "optimizer.name"}})"},
       "when.values is empty"},
      {{R"({"path": "epochs", "int": {"low": 1, "high": 5, "step": 2}})",
        R"({"path": "batch_size", "int": {"low": 16, "high": 32},
            "when": {"path": "epochs", "values": [2]}})"},
       "2 is not a value epochs takes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SearchSpace> space = SearchSpace::Create(Base(), Params(c.params));
    ASSERT_FALSE(space.ok()) << c.part;
    EXPECT_NE(space.status().message().find(c.part), std::string::npos) << space.status();
  }
}

}  // namespace
}  // namespace mpilearn::opt
