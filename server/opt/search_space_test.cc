// SearchSpace (and job_spec_path.h through it). Over 500 lines: one case
// for each refusal search_space.h lists, each checked for its message.
#include "server/opt/search_space.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/opt/space_fixtures.h"

namespace mpilearn::opt {
namespace {

using fixtures::Base;
using fixtures::Params;
using google::protobuf::RepeatedPtrField;
using google::protobuf::Value;

Value Number(double x) {
  Value value;
  value.set_number_value(x);
  return value;
}

Value String(const std::string& s) {
  Value value;
  value.set_string_value(s);
  return value;
}

Value List(const std::vector<double>& xs) {
  Value value;
  for (double x : xs) *value.mutable_list_value()->add_values() = Number(x);
  return value;
}

// Create refuses `parameters` over `base` with INVALID_ARGUMENT and a
// message holding each of `parts`.
void ExpectRefused(const v1::JobSpec& base,
                   const RepeatedPtrField<v1::ParameterSpec>& parameters,
                   const std::vector<std::string>& parts) {
  const auto space = SearchSpace::Create(base, parameters);
  ASSERT_FALSE(space.ok()) << parts[0];
  EXPECT_EQ(space.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& part : parts) {
    EXPECT_NE(space.status().message().find(part), std::string::npos)
        << "missing '" << part << "' in: " << space.status().message();
  }
}

// One bad parameter (after a good one, so the index shows) is refused with
// a message naming "parameters[1] (PATH)" and holding `part`.
void ExpectParamRefused(const std::string& json, const std::string& path,
                        const std::string& part) {
  SCOPED_TRACE(json);
  ExpectRefused(
      Base(),
      Params({R"({"path": "epochs", "int": {"low": 1, "high": 3}})", json}),
      {absl::StrCat("parameters[1] (", path, "): "), part});
}

TEST(SearchSpaceTest, PathsByProtoAndJsonNamesWithDimensions) {
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          R"({"path": "optimizer.learningRate",
              "real": {"low": 1e-4, "high": 1e-1, "log": true}})",
          R"({"path": "batch_size", "int": {"low": 16, "high": 40, "step": 16}})",
          R"({"path": "easgd.workerOptimizer.momentum",
              "real": {"low": 0, "high": 0.9, "step": 0.3}})",
          R"({"path": "model.hidden",
              "categorical": {"choices": [[64], [128, 64], []]}})",
          R"({"path": "dataUnitSize", "int": {"low": 1, "high": 4096, "log": true}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  const std::vector<Dimension>& d = space->dimensions();
  ASSERT_EQ(d.size(), 5u);
  EXPECT_EQ(d[0].path, "optimizer.learningRate");
  EXPECT_EQ(d[0].kind, Dimension::Kind::kReal);
  EXPECT_DOUBLE_EQ(d[0].low, 1e-4);
  EXPECT_DOUBLE_EQ(d[0].high, 1e-1);
  EXPECT_TRUE(d[0].log);
  EXPECT_FALSE(d[0].step.has_value());
  EXPECT_EQ(d[1].kind, Dimension::Kind::kInt);
  EXPECT_EQ(d[1].step, 16.0);
  EXPECT_EQ(d[2].step, 0.3);
  EXPECT_EQ(d[3].kind, Dimension::Kind::kCategorical);
  EXPECT_EQ(d[3].choices, 3);
  EXPECT_EQ(d[3].low, 0);
  EXPECT_EQ(d[3].high, 2);
  EXPECT_TRUE(d[4].log);
  EXPECT_EQ(d[4].step, 1.0);  // a log int's values are every integer
}

TEST(SearchSpaceTest, ApplySetsEachKindAndCreatesNestedMessages) {
  v1::JobSpec base = Base();
  base.mutable_model()->add_hidden(10);
  base.mutable_model()->add_hidden(20);
  base.mutable_model()->add_hidden(30);
  const auto space = SearchSpace::Create(
      base,
      Params({
          R"({"path": "optimizer.learning_rate",
              "real": {"low": 1e-4, "high": 1e-1, "log": true}})",
          R"({"path": "batchSize", "int": {"low": 16, "high": 64, "step": 16}})",
          R"({"path": "algorithm", "categorical": {"choices": ["downpour", "sync"]}})",
          R"({"path": "model.hidden",
              "categorical": {"choices": [[64], [128, 64]]}})",
          R"({"path": "easgd.worker_optimizer.momentum",
              "real": {"low": 0, "high": 0.3, "step": 0.1}})",
          R"({"path": "data_unit_size", "int": {"low": 1, "high": 1000, "log": true}})",
          R"({"path": "inband_validation", "categorical": {"choices": [true, false]}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();

  // batch_size 37 rounds to 16 + 1 * 16; momentum 0.97 clamps to the last
  // grid value 0.3 (0 + 3 * 0.1 is 0.30000000000000004, cut to high);
  // data_unit_size 10.4 rounds to 10.
  const auto job = space->Apply({0.003, 37, 1, 1, 0.97, 10.4, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_DOUBLE_EQ(job->optimizer().learning_rate(), 0.003);
  EXPECT_TRUE(job->optimizer().has_learning_rate());
  EXPECT_EQ(job->batch_size(), 32);
  EXPECT_EQ(job->algorithm(), "sync");
  ASSERT_EQ(job->model().hidden_size(), 2);  // replaced, not appended
  EXPECT_EQ(job->model().hidden(0), 128);
  EXPECT_EQ(job->model().hidden(1), 64);
  ASSERT_TRUE(job->has_easgd());
  EXPECT_EQ(job->easgd().worker_optimizer().momentum(), 0.3);
  EXPECT_EQ(job->data_unit_size(), 10);
  EXPECT_TRUE(job->has_inband_validation());
  EXPECT_FALSE(job->inband_validation());
  // Not normalized: fields no parameter sets keep their (unset) presence.
  EXPECT_FALSE(job->has_epochs());
  EXPECT_EQ(job->data().train_images(), "train-images.gz");

  // Out-of-range coordinates clamp to the range.
  const auto low = space->Apply({1e-9, -100, -0.2, 0, -5, 0, 0});
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_DOUBLE_EQ(low->optimizer().learning_rate(), 1e-4);
  EXPECT_EQ(low->batch_size(), 16);
  EXPECT_EQ(low->algorithm(), "downpour");
  ASSERT_EQ(low->model().hidden_size(), 1);
  EXPECT_EQ(low->model().hidden(0), 64);
  EXPECT_EQ(low->easgd().worker_optimizer().momentum(), 0.0);
  EXPECT_TRUE(low->easgd().worker_optimizer().has_momentum());
  EXPECT_EQ(low->data_unit_size(), 1);
  EXPECT_TRUE(low->inband_validation());
}

// A learning-rate schedule's fields are spec fields like any other.
TEST(SearchSpaceTest, ScheduleFieldsAreSearchable) {
  v1::JobSpec base = Base();
  base.mutable_optimizer()->mutable_schedule()->set_name("cosine");
  base.mutable_optimizer()->mutable_schedule()->set_t_max(1000);  // the base is a job too
  const auto space = SearchSpace::Create(
      base, Params({
                R"({"path": "optimizer.schedule.warmup", "int": {"low": 0, "high": 500}})",
                R"({"path": "optimizer.schedule.tMax", "int": {"low": 100, "high": 2000}})",
                R"({"path": "optimizer.schedule.min_lr",
                    "real": {"low": 1e-6, "high": 1e-3, "log": true}})",
            }));
  ASSERT_TRUE(space.ok()) << space.status();
  const auto job = space->Apply({120, 900, 1e-5});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().schedule().name(), "cosine");
  EXPECT_EQ(job->optimizer().schedule().warmup(), 120);
  EXPECT_EQ(job->optimizer().schedule().t_max(), 900);
  EXPECT_DOUBLE_EQ(job->optimizer().schedule().min_lr(), 1e-5);
}

TEST(SearchSpaceTest, ValuesAreWhatUsersRead) {
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          R"({"path": "optimizer.learningRate", "real": {"low": 0.01, "high": 0.1}})",
          R"({"path": "batch_size", "int": {"low": 16, "high": 64, "step": 16}})",
          R"({"path": "algorithm", "categorical": {"choices": ["downpour", "sync"]}})",
          R"({"path": "model.hidden", "categorical": {"choices": [[64], [128, 64]]}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  const ParamValues values = space->Values({0.05, 41, 0, 1});
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(values.at("optimizer.learningRate").number_value(), 0.05);
  EXPECT_EQ(values.at("batch_size").number_value(), 48);  // 16 + 2 * 16
  EXPECT_EQ(values.at("algorithm").string_value(), "downpour");
  const Value& hidden = values.at("model.hidden");
  ASSERT_EQ(hidden.kind_case(), Value::kListValue);
  ASSERT_EQ(hidden.list_value().values_size(), 2);
  EXPECT_EQ(hidden.list_value().values(0).number_value(), 128);
  EXPECT_EQ(hidden.list_value().values(1).number_value(), 64);
}

TEST(SearchSpaceTest, ApplyRefusesACombinationTheJobSpecRefuses) {
  // easgd.alpha 0.5 .. 1.5 passes alone (the base runs downpour, which
  // ignores easgd), but with algorithm easgd an alpha >= 1 fails.
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          R"({"path": "algorithm", "categorical": {"choices": ["downpour", "easgd"]}})",
          R"({"path": "easgd.alpha", "real": {"low": 0.5, "high": 1.5}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  EXPECT_TRUE(space->Apply({1, 0.7}).ok());
  EXPECT_TRUE(space->Apply({0, 1.2}).ok());
  const auto refused = space->Apply({1, 1.2});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("easgd.alpha = 1.2"), std::string::npos) << message;
  EXPECT_NE(message.find("algorithm = \"easgd\""), std::string::npos)
      << message;
  EXPECT_NE(message.find("easgd.alpha must be in (0, 1)"), std::string::npos)
      << message;

  for (const Point& bad : {Point{1}, Point{1, 0.7, 0}, Point{1, NAN}}) {
    const auto wrong = space->Apply(bad);
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_NE(std::string(space->Apply({1, NAN}).status().message())
                .find("parameters[1] (easgd.alpha)"),
            std::string::npos);
}

TEST(SearchSpaceTest, GridEnumeratesEveryPointFirstDimensionSlowest) {
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          // 16, 32 (48 > 40)
          R"({"path": "batch_size", "int": {"low": 16, "high": 40, "step": 16}})",
          R"({"path": "algorithm", "categorical": {"choices": ["downpour", "sync"]}})",
          // 0.1, 0.2, 0.3: (0.3 - 0.1) / 0.1 is 1.9999999999999998 in doubles
          R"({"path": "optimizer.learning_rate",
              "real": {"low": 0.1, "high": 0.3, "step": 0.1}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  const auto size = space->GridSize();
  ASSERT_TRUE(size.ok()) << size.status();
  ASSERT_EQ(*size, 12u);
  // The learning rates as Apply sets them: low + k * step, the last cut to
  // high.
  const double lr[] = {0.1, 0.1 + 0.1, 0.3};
  std::vector<std::vector<double>> expected;
  for (double batch : {16.0, 32.0}) {
    for (double algorithm : {0.0, 1.0}) {
      for (double rate : lr) expected.push_back({batch, algorithm, rate});
    }
  }
  for (uint64_t i = 0; i < *size; ++i) {
    EXPECT_EQ(space->GridPoint(i), expected[i]) << i;
  }
  const auto last = space->Apply(space->GridPoint(11));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->batch_size(), 32);
  EXPECT_EQ(last->algorithm(), "sync");
  EXPECT_EQ(last->optimizer().learning_rate(), 0.3);
}

TEST(SearchSpaceTest, GridSizeOfLogIntsAndRefusals) {
  const auto logs = SearchSpace::Create(
      Base(),
      Params(
          {R"({"path": "epochs", "int": {"low": 1, "high": 5, "log": true}})",
           R"({"path": "sync_every", "int": {"low": 2, "high": 11, "step": 3}})"}));
  ASSERT_TRUE(logs.ok()) << logs.status();
  ASSERT_EQ(logs->GridSize().value_or(0), 5u * 4u);  // 1..5 by 2, 5, 8, 11
  EXPECT_EQ(logs->GridPoint(19), (Point{5, 11}));
  EXPECT_EQ(logs->GridPoint(5), (Point{2, 5}));

  const auto no_step = SearchSpace::Create(
      Base(),
      Params({R"({"path": "epochs", "int": {"low": 1, "high": 5}})",
              R"({"path": "gem.kappa", "real": {"low": 1, "high": 2}})"}));
  ASSERT_TRUE(no_step.ok()) << no_step.status();
  const auto refused = no_step->GridSize();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("parameters[1] (gem.kappa)"),
            std::string::npos)
      << refused.status().message();

  // 2^21 + 1 values each: over 2^40 points by the second dimension, with
  // no overflow on the way.
  const auto huge = SearchSpace::Create(
      Base(),
      Params(
          {R"({"path": "data_unit_size", "int": {"low": 1, "high": 2097153}})",
           R"({"path": "data.train_limit", "int": {"low": 0, "high": 2097152}})",
           R"({"path": "checkpoint.every_updates", "int": {"low": 0, "high": 2097152}})"}));
  ASSERT_TRUE(huge.ok()) << huge.status();
  const auto too_big = huge->GridSize();
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("2^40"), std::string::npos);
}

TEST(SearchSpaceTest, FromValuesInvertsValues) {
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          R"({"path": "batch_size", "int": {"low": 16, "high": 40, "step": 16}})",
          R"({"path": "model.hidden", "categorical": {"choices": [[64], [128, 64]]}})",
          R"({"path": "optimizer.learningRate",
              "real": {"low": 0.1, "high": 0.3, "step": 0.1}})",
          R"({"path": "algorithm", "categorical": {"choices": ["downpour", "sync"]}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  const uint64_t size = space->GridSize().value_or(0);
  ASSERT_EQ(size, 24u);
  for (uint64_t i = 0; i < size; ++i) {
    const Point point = space->GridPoint(i);
    const auto back = space->FromValues(space->Values(point));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, point) << i;
  }
  // A real without a step takes any value in range as it is.
  const auto free = SearchSpace::Create(
      Base(),
      Params({R"({"path": "gem.kappa", "real": {"low": 1, "high": 2}})"}));
  ASSERT_TRUE(free.ok()) << free.status();
  ParamValues kappa;
  kappa["gem.kappa"] = Number(1.2345);
  EXPECT_EQ(free->FromValues(kappa).value_or(Point{}), (Point{1.2345}));
}

TEST(SearchSpaceTest, FromValuesRefusals) {
  const auto space = SearchSpace::Create(
      Base(),
      Params({
          R"({"path": "batch_size", "int": {"low": 16, "high": 40, "step": 16}})",
          R"({"path": "model.hidden", "categorical": {"choices": [[64], [128, 64]]}})",
          R"({"path": "optimizer.learningRate",
              "real": {"low": 0.1, "high": 0.3, "step": 0.1}})",
      }));
  ASSERT_TRUE(space.ok()) << space.status();
  ParamValues good;
  good["batch_size"] = Number(32);
  good["model.hidden"] = List({128, 64});
  good["optimizer.learningRate"] = Number(0.2);
  EXPECT_EQ(space->FromValues(good).value_or(Point{}), (Point{32, 1, 0.2}));

  struct Case {
    std::string path;
    Value value;  // replaces good[path]; null removes it
    std::string part;
  };
  const std::vector<Case> cases = {
      {"batch_size", Value(), "parameters[0] (batch_size): missing"},
      {"batch_size", String("32"),
       "parameters[0] (batch_size): expected a finite number"},
      {"batch_size", Number(32.5),
       "parameters[0] (batch_size): expected a whole number"},
      {"batch_size", Number(48),
       "parameters[0] (batch_size): 48 is out of range"},
      {"batch_size", Number(24),
       "parameters[0] (batch_size): 24 is off the step"},
      {"model.hidden", List({64, 128}),
       "parameters[1] (model.hidden): [64, 128] is not one of"},
      {"model.hidden", Number(64),
       "parameters[1] (model.hidden): 64 is not one of"},
      {"optimizer.learningRate", Number(0.25),
       "parameters[2] (optimizer.learningRate): 0.25 is off the step"},
      {"optimizer.learningRate", Number(0.05),
       "parameters[2] (optimizer.learningRate): 0.05 is out of range"},
      {"optimizer.learning_rate", Number(0.2),
       "unknown path 'optimizer.learning_rate'"},
  };
  for (const Case& c : cases) {
    ParamValues values = good;
    if (c.value.kind_case() == Value::KIND_NOT_SET) {
      values.erase(c.path);
    } else {
      values[c.path] = c.value;
    }
    const auto refused = space->FromValues(values);
    ASSERT_FALSE(refused.ok()) << c.part;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(c.part), std::string::npos)
        << refused.status().message();
  }
}

TEST(SearchSpaceTest, RefusesBadPaths) {
  ExpectParamRefused(R"({"path": "", "int": {"low": 1, "high": 2}})", "",
                     "empty path");
  const std::string long_path(300, 'a');
  ExpectRefused(Base(),
                Params({absl::StrCat(R"({"path": ")", long_path,
                                     R"(", "int": {"low": 1, "high": 2}})")}),
                {"parameters[0] (", "path of 300 bytes; at most 256"});
  ExpectParamRefused(R"({"path": "epochs", "int": {"low": 1, "high": 2}})",
                     "epochs",
                     "duplicate: parameters[0] already searches epochs");
  ExpectRefused(
      Base(),
      Params({R"({"path": "batchSize", "int": {"low": 1, "high": 2}})",
              R"({"path": "batch_size", "int": {"low": 1, "high": 2}})"}),
      {"parameters[1] (batch_size): duplicate: parameters[0]"});
  ExpectParamRefused(
      R"({"path": "optimizer.lr", "real": {"low": 1, "high": 2}})",
      "optimizer.lr", "no field 'lr' in optimizer");
  ExpectParamRefused(
      R"({"path": "optimizer..momentum", "real": {"low": 0, "high": 0.5}})",
      "optimizer..momentum", "empty segment");
  ExpectParamRefused(
      R"({"path": "batch_size.x", "int": {"low": 1, "high": 2}})",
      "batch_size.x", "batch_size is a int32 field, not a message");
  ExpectParamRefused(
      R"({"path": "model.hidden.x", "int": {"low": 1, "high": 2}})",
      "model.hidden.x", "not a message");
  ExpectParamRefused(R"({"path": "optimizer", "real": {"low": 1, "high": 2}})",
                     "optimizer", "optimizer is a message");
  ExpectParamRefused(
      R"({"path": "easgd.worker_optimizer", "real": {"low": 1, "high": 2}})",
      "easgd.worker_optimizer", "name one of its fields");
}

TEST(SearchSpaceTest, RefusesBadRanges) {
  ExpectParamRefused(R"({"path": "batch_size"})", "batch_size",
                     "no range; give real, int or categorical");
  // Kinds the field cannot take.
  ExpectParamRefused(R"({"path": "batch_size", "real": {"low": 1, "high": 2}})",
                     "batch_size", "a real range cannot set the int32 field");
  ExpectParamRefused(R"({"path": "algorithm", "int": {"low": 1, "high": 2}})",
                     "algorithm", "an int range cannot set the string field");
  ExpectParamRefused(
      R"({"path": "model.hidden", "int": {"low": 1, "high": 2}})",
      "model.hidden", "repeated int32");
  ExpectParamRefused(
      R"({"path": "optimizer.nesterov", "real": {"low": 0, "high": 1}})",
      "optimizer.nesterov", "real range cannot set the bool field");
  ExpectParamRefused(
      R"({"path": "batch_size", "int": {"low": 1, "high": 3000000000}})",
      "batch_size", "goes outside");
  // Bounds.
  ExpectParamRefused(
      R"({"path": "optimizer.learning_rate", "real": {"low": 0.1, "high": 0.01}})",
      "optimizer.learning_rate",
      "real range low 0.1 > high 0.01; give low <= high");
  ExpectParamRefused(
      R"({"path": "batch_size", "int": {"low": 64, "high": 16}})", "batch_size",
      "int range low 64 > high 16");
  ExpectParamRefused(
      R"({"path": "optimizer.learning_rate", "real": {"low": 0.1, "high": "Infinity"}})",
      "optimizer.learning_rate", "must be finite");
  ExpectParamRefused(
      R"({"path": "optimizer.learning_rate", "real": {"low": "NaN", "high": 1}})",
      "optimizer.learning_rate", "must be finite");
  // log and step.
  ExpectParamRefused(
      R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9, "log": true}})",
      "optimizer.momentum", "log real range needs low > 0");
  ExpectParamRefused(
      R"({"path": "max_staleness", "int": {"low": 0, "high": 9, "log": true}})",
      "max_staleness", "log int range needs low > 0");
  ExpectParamRefused(
      R"({"path": "optimizer.learning_rate",
          "real": {"low": 0.01, "high": 0.1, "log": true, "step": 0.01}})",
      "optimizer.learning_rate", "log real range cannot have a step");
  ExpectParamRefused(
      R"({"path": "batch_size", "int": {"low": 1, "high": 64, "log": true, "step": 2}})",
      "batch_size", "log int range cannot have a step");
  ExpectParamRefused(
      R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.9, "step": 0}})",
      "optimizer.momentum", "step 0 must be > 0 and at most high - low");
  ExpectParamRefused(
      R"({"path": "optimizer.momentum", "real": {"low": 0, "high": 0.5, "step": 0.6}})",
      "optimizer.momentum", "step 0.6 must be > 0 and at most high - low");
  ExpectParamRefused(
      R"({"path": "batch_size", "int": {"low": 1, "high": 64, "step": -2}})",
      "batch_size", "int range step -2 must be in [1, 2^53]");
  ExpectParamRefused(
      R"({"path": "data_unit_size",
          "int": {"low": 1, "high": 10, "step": "9223372036854775807"}})",
      "data_unit_size", "must be in [1, 2^53]");
}

TEST(SearchSpaceTest, RefusesBadChoices) {
  ExpectParamRefused(
      R"({"path": "algorithm", "categorical": {"choices": ["sync"]}})",
      "algorithm", "give at least two");
  std::string many;
  for (int i = 0; i < 1025; ++i)
    absl::StrAppend(&many, i == 0 ? "" : ", ", i + 1);
  ExpectParamRefused(
      absl::StrCat(R"({"path": "batch_size", "categorical": {"choices": [)",
                   many, "]}}"),
      "batch_size", "1025 categorical choices; at most 1024");
  ExpectParamRefused(
      R"({"path": "batch_size", "categorical": {"choices": [32, "64"]}})",
      "batch_size", "choice 1: expected a whole number");
  ExpectParamRefused(
      R"({"path": "batch_size", "categorical": {"choices": [32, 64.5]}})",
      "batch_size", "choice 1: expected a whole number");
  ExpectParamRefused(
      R"({"path": "algorithm", "categorical": {"choices": ["sync", 1]}})",
      "algorithm", "choice 1: expected a string");
  ExpectParamRefused(
      R"({"path": "optimizer.momentum", "categorical": {"choices": [0.5, true]}})",
      "optimizer.momentum", "choice 1: expected a finite number");
  ExpectParamRefused(
      R"({"path": "optimizer.nesterov", "categorical": {"choices": [true, 0]}})",
      "optimizer.nesterov", "choice 1: expected true or false");
  ExpectParamRefused(
      R"({"path": "model.hidden", "categorical": {"choices": [[64], 128]}})",
      "model.hidden", "choice 1: expected a list");
  ExpectParamRefused(
      R"({"path": "model.hidden", "categorical": {"choices": [[64], [128, "a"]]}})",
      "model.hidden", "choice 1: element 1: expected a whole number");
}

TEST(SearchSpaceTest, RefusesValuesTheJobSpecRefuses) {
  v1::JobSpec no_data;
  ExpectRefused(no_data,
                Params({R"({"path": "epochs", "int": {"low": 1, "high": 3}})"}),
                {"base: data.train_images and data.train_labels are required"});
  ExpectParamRefused(
      R"({"path": "batch_size", "categorical": {"choices": [32, 0]}})",
      "batch_size",
      "choice 1 (0) fails the job spec's validation: batch_size must "
      "be in [1, 1048576], got 0");
  ExpectParamRefused(
      R"({"path": "algorithm", "categorical": {"choices": ["sync", "nope"]}})",
      "algorithm",
      "choice 1 (\"nope\") fails the job spec's validation: algorithm: "
      "unknown algorithm 'nope'");
  ExpectParamRefused(R"({"path": "batchSize", "int": {"low": 0, "high": 64}})",
                     "batchSize", "low 0 fails the job spec's validation");
  ExpectParamRefused(
      R"({"path": "optimizer.learning_rate", "real": {"low": 0, "high": 1}})",
      "optimizer.learning_rate",
      "low 0 fails the job spec's validation: optimizer.learning_rate must be "
      "a "
      "finite number > 0");
  ExpectParamRefused(
      R"({"path": "sync_every", "int": {"low": 1, "high": 2000000}})",
      "sync_every",
      "high 2000000 fails the job spec's validation: sync_every "
      "must be in [1, 1048576]");
  ExpectParamRefused(
      R"({"path": "model.hidden", "categorical": {"choices": [[64], [0]]}})",
      "model.hidden", "model.hidden[0] must be in");
  // A step that stops short of high checks its largest value instead: 100001
  // is out of range, but the values are 1, 100000.
  const auto short_step = SearchSpace::Create(
      Base(),
      Params(
          {R"({"path": "epochs", "int": {"low": 1, "high": 100001, "step": 99999}})"}));
  EXPECT_TRUE(short_step.ok()) << short_step.status();
}

TEST(SearchSpaceTest, RefusesTooManyOrNoParameters) {
  ExpectRefused(Base(), {}, {"parameters: none given"});
  std::vector<std::string> many;
  for (int i = 0; i < 65; ++i) {
    many.push_back(R"({"path": "epochs", "int": {"low": 1, "high": 2}})");
  }
  ExpectRefused(Base(), Params(many), {"65 given", "at most 64"});
}

}  // namespace
}  // namespace mpilearn::opt
