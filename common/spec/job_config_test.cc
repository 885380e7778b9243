#include "common/spec/job_config.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_kinds.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

constexpr char kData[] =
    R"("data": {"train_images": "train-images.gz", "train_labels": "labels.gz")";

// A spec with `fields` (JSON members, may be empty) and IDX data.
absl::StatusOr<JobConfig> ConfigOf(const std::string& fields,
                                   const std::string& data_fields = "") {
  return JobConfig::FromJson(absl::StrCat("{", kData, data_fields, "}",
                                          fields.empty() ? "" : ", ", fields,
                                          "}"));
}

TEST(JobConfigTest, DefaultsReadAsTheirEnums) {
  absl::StatusOr<JobConfig> config = ConfigOf("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->algorithm(), v1::ALGORITHM_DOWNPOUR);
  EXPECT_EQ(config->update_kind(), v1::UPDATE_KIND_GRADIENT);
  EXPECT_EQ(config->model(), ModelKind::kMlp);
  EXPECT_EQ(config->loss(), LossKind::kCategoricalCrossentropy);
  EXPECT_TRUE(config->classification());
  EXPECT_EQ(config->normalization(), NormalizationMode::kNone);
  EXPECT_EQ(config->bad_values(), BadValues::kFail);
  EXPECT_FALSE(config->skips_bad_values());
  EXPECT_EQ(config->staleness_scaling(), StalenessScaling::kNone);
  // The spec itself is normalized: every name explicit.
  EXPECT_EQ(config->spec().loss(), "categorical_crossentropy");
  EXPECT_EQ(config->spec().data().normalization().mode(), "none");
}

// Every name of every table is accepted by normalization and reads back as
// the kind the table gives it; the names are distinct.
TEST(JobConfigTest, EveryTableNameNormalizesToItsKind) {
  std::set<std::string> names;
  for (const ModelKindInfo& info : ModelKinds()) {
    if (info.kind == ModelKind::kTorchScript) continue;
    EXPECT_TRUE(names.insert(std::string(info.name)).second) << info.name;
    absl::StatusOr<JobConfig> config =
        ConfigOf(absl::StrCat(R"("model": {"name": ")", info.name, R"("})"));
    ASSERT_TRUE(config.ok()) << info.name << ": " << config.status();
    EXPECT_EQ(config->model(), info.kind) << info.name;
    EXPECT_EQ(&InfoOf(info.kind), &info);
    EXPECT_EQ(BuiltInModelFromName(info.name), info.kind);
    // MinModelParameters reads the same table: every built-in model has
    // at least its output layer.
    EXPECT_GT(MinModelParameters(config->spec().model()), 0u) << info.name;
  }
  names.clear();
  for (const LossKindInfo& info : LossKinds()) {
    EXPECT_TRUE(names.insert(std::string(info.name)).second) << info.name;
    absl::StatusOr<JobConfig> config =
        ConfigOf(absl::StrCat(R"("loss": ")", info.name, R"(")"));
    ASSERT_TRUE(config.ok()) << info.name << ": " << config.status();
    EXPECT_EQ(config->loss(), info.kind);
    EXPECT_EQ(config->classification(), info.classification);
  }
  for (const auto mode : {NormalizationMode::kNone, NormalizationMode::kScale,
                          NormalizationMode::kStandardize}) {
    absl::StatusOr<JobConfig> config = ConfigOf(
        "", absl::StrCat(R"(, "normalization": {"mode": ")", NameOf(mode),
                         R"("})"));
    ASSERT_TRUE(config.ok()) << NameOf(mode) << ": " << config.status();
    EXPECT_EQ(config->normalization(), mode);
  }
  for (const auto policy : {BadValues::kFail, BadValues::kSkip}) {
    absl::StatusOr<JobConfig> config = ConfigOf(
        "", absl::StrCat(R"(, "bad_values": ")", NameOf(policy), R"(")"));
    ASSERT_TRUE(config.ok()) << NameOf(policy) << ": " << config.status();
    EXPECT_EQ(config->bad_values(), policy);
  }
  for (const auto scaling : {StalenessScaling::kNone, StalenessScaling::kInverse}) {
    absl::StatusOr<JobConfig> config = ConfigOf(absl::StrCat(
        R"("staleness_scaling": ")", NameOf(scaling), R"(")"));
    ASSERT_TRUE(config.ok()) << NameOf(scaling) << ": " << config.status();
    EXPECT_EQ(config->staleness_scaling(), scaling);
  }
  const std::pair<v1::Algorithm, v1::UpdateKind> algorithms[] = {
      {v1::ALGORITHM_DOWNPOUR, v1::UPDATE_KIND_GRADIENT},
      {v1::ALGORITHM_SYNC, v1::UPDATE_KIND_GRADIENT},
      {v1::ALGORITHM_EASGD, v1::UPDATE_KIND_ELASTIC},
      {v1::ALGORITHM_GEM, v1::UPDATE_KIND_DELTA}};
  for (const auto& [algorithm, kind] : algorithms) {
    absl::StatusOr<JobConfig> config = ConfigOf(
        absl::StrCat(R"("algorithm": ")", NameOf(algorithm), R"(")"));
    ASSERT_TRUE(config.ok()) << NameOf(algorithm) << ": " << config.status();
    EXPECT_EQ(config->algorithm(), algorithm);
    EXPECT_EQ(config->update_kind(), kind);
  }
}

// A name outside a table is refused, and the message lists the table.
TEST(JobConfigTest, UnknownNamesAreRefusedWithTheTable) {
  const std::pair<absl::StatusOr<JobConfig>, std::string> refused[] = {
      {ConfigOf(R"("model": {"name": "resnet"})"),
       "model.name: unknown model 'resnet'; built-in models are 'mlp', 'cnn', "
       "'cnn1d', 'gru', 'lstm'"},
      {ConfigOf(R"("loss": "hinge")"),
       "loss: unknown loss 'hinge'; available: 'categorical_crossentropy', "
       "'binary_crossentropy', 'mse', 'mae', 'huber'"},
      {ConfigOf("", R"(, "normalization": {"mode": "whiten"})"),
       "data.normalization.mode: unknown mode 'whiten'; available: 'none', "
       "'scale', 'standardize'"},
      {ConfigOf("", R"(, "bad_values": "drop")"),
       "data.bad_values: unknown policy 'drop'; available: 'fail', 'skip'"},
      {ConfigOf(R"("staleness_scaling": "sqrt")"),
       "staleness_scaling: unknown scaling 'sqrt'; available: 'none', "
       "'inverse'"},
      {ConfigOf(R"("algorithm": "hogwild")"),
       "algorithm: unknown algorithm 'hogwild'; available: 'downpour', 'sync', "
       "'easgd', 'gem'"},
  };
  for (const auto& [config, message] : refused) {
    ASSERT_FALSE(config.ok()) << message;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(message), std::string::npos)
        << config.status().message();
  }
}

TEST(JobConfigTest, TorchScriptModelIsItsOwnKind) {
  absl::StatusOr<JobConfig> config =
      ConfigOf(R"("model": {"torchscript": "/models/net.pt"})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model(), ModelKind::kTorchScript);
  EXPECT_EQ(config->spec().model().name(), "torchscript");
  EXPECT_FALSE(BuiltInModelFromName("torchscript").has_value());
  EXPECT_EQ(MinModelParameters(config->spec().model()), 0u);
}

// FromNormalized reads a partial spec's empty names as normalization's
// defaults, so it agrees with Create on what a left-out name means.
TEST(JobConfigTest, FromNormalizedReadsEmptyNamesAsDefaults) {
  v1::JobSpec partial;
  partial.set_algorithm("sync");
  partial.mutable_data()->set_bad_values("skip");
  const JobConfig read = JobConfig::FromNormalized(partial);
  partial.mutable_data()->set_train_images("a.gz");
  partial.mutable_data()->set_train_labels("b.gz");
  absl::StatusOr<JobConfig> created = JobConfig::Create(partial);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(read.algorithm(), created->algorithm());
  EXPECT_EQ(read.model(), created->model());
  EXPECT_EQ(read.loss(), created->loss());
  EXPECT_EQ(read.normalization(), created->normalization());
  EXPECT_EQ(read.bad_values(), BadValues::kSkip);
  EXPECT_EQ(read.staleness_scaling(), created->staleness_scaling());
}

}  // namespace
}  // namespace mpilearn
