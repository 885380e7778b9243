// A loss of several outputs (JobSpec.outputs; worker/model/loss.h, Head)
// against references computed here in double precision with plain loops:
// the training loss is the weighted sum of each output's summed loss, and
// each output reports its own metrics under val_<name>_...
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/loss.h"

namespace mpilearn::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// kind: categorical over 4 classes (weight 1); energy: mse (weight 0.5);
// flag: binary with pos_weight 2 over 0/1 class indices (weight 2).
JobConfig ThreeOutputs() {
  absl::StatusOr<JobConfig> config = JobConfig::FromJson(R"({
    "data": {"train_files": ["t.h5"], "labels_datasets": ["kind", "energy", "flag"]},
    "outputs": [{"name": "kind"},
                {"name": "energy", "loss": "mse", "weight": 0.5},
                {"name": "flag", "loss": "binary_crossentropy", "weight": 2,
                 "loss_options": {"pos_weight": [2]}}]})");
  EXPECT_TRUE(config.ok()) << config.status();
  return *std::move(config);
}

Loss Bound() {
  absl::StatusOr<Loss> loss = Loss::FromConfig(ThreeOutputs());
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(loss->multi());
  EXPECT_TRUE(loss->BindLabels({{0, 1, true, 4}, {1, 1, false, 1}, {2, 1, true, 2}}).ok());
  return *std::move(loss);
}

struct Batch {
  torch::Tensor output;  // [B, 6]: kind 4, energy 1, flag 1
  torch::Tensor labels;  // [B, 3]: kind, energy, flag
};

// Multiples of 1/8, exact in float32.
Batch MakeBatch() {
  const std::vector<std::vector<double>> out = {
      {0.5, -0.25, 1.0, 0.125, 0.75, -1.5},
      {-0.5, 2.0, 0.25, 0.0, -0.25, 0.5},
      {1.25, 0.375, -0.75, 0.5, 1.5, 2.0},
  };
  const std::vector<std::vector<double>> labels = {{2, 0.5, 1}, {1, 0.0, 0}, {3, 1.25, 1}};
  Batch batch{torch::zeros({3, 6}), torch::zeros({3, 3})};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 6; ++j) batch.output[i][j] = out[i][j];
    for (int j = 0; j < 3; ++j) batch.labels[i][j] = labels[i][j];
  }
  return batch;
}

struct Reference {
  double kind = 0, energy = 0, flag = 0;  // summed over the batch
  double kind_correct = 0, flag_correct = 0, energy_abs = 0;
};

Reference Compute(const Batch& batch) {
  Reference r;
  for (int i = 0; i < 3; ++i) {
    double z[6];
    for (int j = 0; j < 6; ++j) z[j] = batch.output[i][j].item<double>();
    const int kind = static_cast<int>(batch.labels[i][0].item<double>());
    const double energy = batch.labels[i][1].item<double>();
    const double flag = batch.labels[i][2].item<double>();
    double denominator = 0;
    int best = 0;
    for (int c = 0; c < 4; ++c) {
      denominator += std::exp(z[c]);
      if (z[c] > z[best]) best = c;
    }
    r.kind += std::log(denominator) - z[kind];
    r.kind_correct += best == kind;
    r.energy += (z[4] - energy) * (z[4] - energy);
    r.energy_abs += std::abs(z[4] - energy);
    // PyTorch's BCE with logits and pos_weight p:
    // -(p y log s(x) + (1 - y) log(1 - s(x))).
    const double s = 1 / (1 + std::exp(-z[5]));
    r.flag += -(2 * flag * std::log(s) + (1 - flag) * std::log(1 - s));
    r.flag_correct += (z[5] > 0) == (flag > 0.5);
  }
  return r;
}

TEST(LossHeadsTest, SummedIsTheWeightedSumOfTheOutputsLosses) {
  const Loss loss = Bound();
  const Batch batch = MakeBatch();
  absl::StatusOr<int64_t> outputs = loss.OutputsFor(batch.labels, 0);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(*outputs, 6);
  ASSERT_TRUE(loss.CheckOutput(batch.output, batch.labels).ok());
  const Reference r = Compute(batch);
  EXPECT_NEAR(loss.Summed(batch.output, batch.labels).item<double>(),
              r.kind + 0.5 * r.energy + 2 * r.flag, 1e-5);
  // A removed or reweighted term would move the sum by far more.
  EXPECT_GT(r.kind, 0.1);
  EXPECT_GT(r.flag, 0.1);
  EXPECT_GT(r.energy, 0.1);
}

TEST(LossHeadsTest, EachOutputReportsItsOwnMetrics) {
  const Loss loss = Bound();
  const Batch batch = MakeBatch();
  MetricSums sums;
  loss.Accumulate(batch.output, batch.labels, &sums);
  // Through the vector a group reduces, as evaluation does.
  sums = MetricSums::FromVector(sums.ToVector(), loss.heads().size());
  const std::map<std::string, double> metrics = loss.Metrics(sums);
  const Reference r = Compute(batch);
  EXPECT_NEAR(metrics.at("val_loss"), (r.kind + 0.5 * r.energy + 2 * r.flag) / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_kind_loss"), r.kind / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_kind_accuracy"), r.kind_correct / 3, 1e-9);
  EXPECT_NEAR(metrics.at("val_energy_loss"), r.energy / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_energy_mse"), r.energy / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_energy_mae"), r.energy_abs / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_flag_loss"), r.flag / 3, 1e-5);
  EXPECT_NEAR(metrics.at("val_flag_accuracy"), r.flag_correct / 3, 1e-9);
  std::vector<std::string> names;
  for (const auto& [name, value] : metrics) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("val_energy_loss", "val_energy_mae", "val_energy_mse",
                                 "val_flag_accuracy", "val_flag_loss", "val_kind_accuracy",
                                 "val_kind_loss", "val_loss"));
  EXPECT_THAT(loss.MetricNames(),
              ElementsAre("val_kind_loss", "val_kind_accuracy", "val_energy_loss",
                          "val_energy_mae", "val_energy_mse", "val_flag_loss",
                          "val_flag_accuracy"));
}

TEST(LossHeadsTest, MismatchesNameTheOutput) {
  absl::StatusOr<Loss> loss = Loss::FromConfig(ThreeOutputs());
  ASSERT_TRUE(loss.ok());
  EXPECT_THAT(std::string(loss->BindLabels({{0, 1, true, 4}}).message()),
              HasSubstr("the job has 3 outputs but the data 1 labels datasets"));
  // Class indices cannot be mse's targets.
  EXPECT_THAT(
      std::string(loss->BindLabels({{0, 1, true, 4}, {1, 1, true, 3}, {2, 1, true, 2}}).message()),
      HasSubstr("output 'energy': its labels are class indices"));
  const Loss bound = Bound();
  const Batch batch = MakeBatch();
  EXPECT_THAT(std::string(bound.CheckOutput(batch.output.narrow(1, 0, 5), batch.labels).message()),
              HasSubstr("the model outputs [3, 5] per batch (its outputs side by side) but the "
                        "job's outputs need [3, 6] (kind 4, energy 1, flag 1)"));
}

}  // namespace
}  // namespace mpilearn::worker
