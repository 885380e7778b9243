// Every loss and metric of worker/model/loss.h against references computed here
// in double precision with plain loops (no LibTorch functions). Inputs are
// multiples of 1/8, exact in float32, so the references see the same
// numbers as the model's float32 tensors.
#include "worker/model/loss.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

using ::testing::HasSubstr;
using Rows = std::vector<std::vector<double>>;

// float32 [rows, columns].
torch::Tensor Matrix(const Rows& rows) {
  torch::Tensor tensor = torch::zeros({static_cast<int64_t>(rows.size()),
                                       static_cast<int64_t>(rows[0].size())});
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) {
      tensor[i][j] = rows[i][j];
    }
  }
  return tensor;
}

torch::Tensor Indices(const std::vector<int64_t>& labels) {
  return torch::tensor(labels, torch::kLong);
}

Loss Named(const std::string& name, double huber_delta = 1.0) {
  // An empty name is the default, as normalization makes it.
  const std::optional<LossKind> kind =
      name.empty() ? LossKind::kCategoricalCrossentropy : LossKindFromName(name);
  EXPECT_TRUE(kind.has_value()) << name;
  absl::StatusOr<Loss> loss =
      Loss::Create(kind.value_or(LossKind::kMse), huber_delta);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return *loss;
}

// Relative tolerance for float32 sums of a few terms.
void ExpectNear(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-5 * std::max(1.0, std::fabs(expected)));
}

// -sum_c t_c log softmax(x)_c for one row.
double SoftCrossEntropy(const std::vector<double>& x,
                        const std::vector<double>& t) {
  double largest = x[0];
  for (double v : x) largest = std::max(largest, v);
  double total = 0.0;
  for (double v : x) total += std::exp(v - largest);
  const double log_sum = largest + std::log(total);
  double loss = 0.0;
  for (size_t c = 0; c < x.size(); ++c) loss -= t[c] * (x[c] - log_sum);
  return loss;
}

std::vector<double> OneHot(int64_t label, size_t classes) {
  std::vector<double> row(classes, 0.0);
  row[static_cast<size_t>(label)] = 1.0;
  return row;
}

size_t ArgMax(const std::vector<double>& x) {
  return static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

const Rows kLogits = {
    {1.0, -0.5, 2.25, 0.125}, {-1.5, 0.75, 0.0, 3.0}, {0.5, 0.5, -2.0, 1.0}};
const std::vector<int64_t> kClasses = {2, 1, 3};  // argmax rows: 2, 3, 3

TEST(LossTest, CategoricalCrossEntropyOnIndicesMatchesReference) {
  const Loss loss = Named("categorical_crossentropy");
  EXPECT_TRUE(loss.classification());
  EXPECT_EQ(loss.MetricNames(), std::vector<std::string>{"val_accuracy"});
  double expected = 0.0;
  double correct = 0.0;
  for (size_t i = 0; i < kLogits.size(); ++i) {
    expected += SoftCrossEntropy(kLogits[i], OneHot(kClasses[i], 4));
    correct += ArgMax(kLogits[i]) == static_cast<size_t>(kClasses[i]) ? 1 : 0;
  }
  ExpectNear(loss.Summed(Matrix(kLogits), Indices(kClasses)).item<double>(),
             expected);
  MetricSums sums;
  loss.Accumulate(Matrix(kLogits), Indices(kClasses), &sums);
  const auto metrics = loss.Metrics(sums);
  ASSERT_EQ(metrics.size(), 2u);
  ExpectNear(metrics.at("val_loss"), expected / 3.0);
  EXPECT_DOUBLE_EQ(metrics.at("val_accuracy"), correct / 3.0);
  EXPECT_DOUBLE_EQ(correct, 2.0);  // rows 0 and 2 right, row 1 wrong
}

TEST(LossTest, OneHotCrossEntropyEqualsIndexCrossEntropy) {
  const Loss loss = Named("");  // the default
  EXPECT_EQ(loss.name(), "categorical_crossentropy");
  Rows one_hot;
  for (int64_t label : kClasses) one_hot.push_back(OneHot(label, 4));
  ExpectNear(loss.Summed(Matrix(kLogits), Matrix(one_hot)).item<double>(),
             loss.Summed(Matrix(kLogits), Indices(kClasses)).item<double>());
  MetricSums by_index;
  MetricSums by_row;
  loss.Accumulate(Matrix(kLogits), Indices(kClasses), &by_index);
  loss.Accumulate(Matrix(kLogits), Matrix(one_hot), &by_row);
  EXPECT_DOUBLE_EQ(by_row.correct, by_index.correct);
  EXPECT_DOUBLE_EQ(by_row.elements, 3.0);
  // Soft targets: the probability-weighted cross entropy.
  const Rows soft = {
      {0.25, 0.25, 0.5, 0.0}, {0.0, 0.125, 0.0, 0.875}, {0.5, 0.0, 0.0, 0.5}};
  double expected = 0.0;
  for (size_t i = 0; i < soft.size(); ++i) {
    expected += SoftCrossEntropy(kLogits[i], soft[i]);
  }
  ExpectNear(loss.Summed(Matrix(kLogits), Matrix(soft)).item<double>(),
             expected);
}

// -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))).
double BinaryCrossEntropy(double x, double t) {
  const double p = 1.0 / (1.0 + std::exp(-x));
  return -(t * std::log(p) + (1.0 - t) * std::log(1.0 - p));
}

TEST(LossTest, BinaryCrossEntropyOnFloatTargetsMatchesReference) {
  const Loss loss = Named("binary_crossentropy");
  EXPECT_TRUE(loss.classification());
  const Rows logits = {{1.5, -0.25}, {-2.0, 0.5}, {0.125, -1.0}};
  const Rows targets = {{1.0, 0.0}, {0.25, 1.0}, {0.0, 0.75}};
  double expected = 0.0;
  double correct = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      expected += BinaryCrossEntropy(logits[i][k], targets[i][k]);
      correct += (logits[i][k] > 0) == (targets[i][k] > 0.5) ? 1 : 0;
    }
  }
  EXPECT_EQ(*loss.OutputsFor(Matrix(targets), 0), 2);
  EXPECT_TRUE(loss.CheckOutput(Matrix(logits), Matrix(targets)).ok());
  ExpectNear(loss.Summed(Matrix(logits), Matrix(targets)).item<double>(),
             expected);
  MetricSums sums;
  loss.Accumulate(Matrix(logits), Matrix(targets), &sums);
  const auto metrics = loss.Metrics(sums);
  ExpectNear(metrics.at("val_loss"), expected / 3.0);
  EXPECT_DOUBLE_EQ(metrics.at("val_accuracy"), correct / 6.0);
}

TEST(LossTest, BinaryCrossEntropyOnIntegerLabels) {
  const Loss loss = Named("binary_crossentropy");
  const std::vector<int64_t> labels = {0, 1, 1, 0};
  const std::vector<double> logits = {-0.5, 2.0, -0.75, 0.25};
  EXPECT_EQ(*loss.OutputsFor(Indices(labels), 10), 1);
  double expected = 0.0;
  double correct = 0.0;
  Rows column;
  for (size_t i = 0; i < labels.size(); ++i) {
    expected += BinaryCrossEntropy(logits[i], static_cast<double>(labels[i]));
    correct += (logits[i] > 0) == (labels[i] == 1) ? 1 : 0;
    column.push_back({logits[i]});
  }
  // The model may output [B, 1] or [B].
  const torch::Tensor flat = Matrix(column).reshape({4});
  EXPECT_TRUE(loss.CheckOutput(Matrix(column), Indices(labels)).ok());
  EXPECT_TRUE(loss.CheckOutput(flat, Indices(labels)).ok());
  ExpectNear(loss.Summed(Matrix(column), Indices(labels)).item<double>(),
             expected);
  ExpectNear(loss.Summed(flat, Indices(labels)).item<double>(), expected);
  MetricSums sums;
  loss.Accumulate(flat, Indices(labels), &sums);
  EXPECT_DOUBLE_EQ(loss.Metrics(sums).at("val_accuracy"), correct / 4.0);
  EXPECT_DOUBLE_EQ(correct, 2.0);

  const absl::StatusOr<int64_t> three = loss.OutputsFor(Indices({0, 2, 1}), 3);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(three.status().message(), HasSubstr("labels 0 or 1"));
}

const Rows kPredictions = {{0.5, -1.0}, {2.0, 0.25}, {-0.5, 3.0}};
const Rows kTargets = {{0.25, 1.0}, {0.0, 0.375}, {-0.5, 0.5}};

// Sums of the element-wise errors of kPredictions against kTargets.
struct ErrorSums {
  double abs = 0.0;
  double sq = 0.0;
};
ErrorSums Errors() {
  ErrorSums sums;
  for (size_t i = 0; i < kPredictions.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      const double d = kPredictions[i][k] - kTargets[i][k];
      sums.abs += std::fabs(d);
      sums.sq += d * d;
    }
  }
  return sums;
}

TEST(LossTest, RegressionLossesAndMetricsMatchReference) {
  const ErrorSums errors = Errors();
  for (const std::string name : {"mse", "mae"}) {
    SCOPED_TRACE(name);
    const Loss loss = Named(name);
    EXPECT_FALSE(loss.classification());
    EXPECT_EQ(loss.MetricNames(),
              (std::vector<std::string>{"val_mae", "val_mse"}));
    EXPECT_EQ(*loss.OutputsFor(Matrix(kTargets), 10), 2);
    const double expected = name == "mse" ? errors.sq : errors.abs;
    // Summed over every element, samples and outputs.
    ExpectNear(
        loss.Summed(Matrix(kPredictions), Matrix(kTargets)).item<double>(),
        expected);
    MetricSums sums;
    loss.Accumulate(Matrix(kPredictions), Matrix(kTargets), &sums);
    const auto metrics = loss.Metrics(sums);
    ASSERT_EQ(metrics.size(), 3u);
    ExpectNear(metrics.at("val_loss"), expected / 3.0);   // per sample
    ExpectNear(metrics.at("val_mae"), errors.abs / 6.0);  // per element
    ExpectNear(metrics.at("val_mse"), errors.sq / 6.0);
  }
}

TEST(LossTest, HuberIsQuadraticInsideDeltaAndLinearOutside) {
  const double delta = 0.5;
  const Loss loss = Named("huber", delta);
  double expected = 0.0;
  int inside = 0;
  int outside = 0;
  for (size_t i = 0; i < kPredictions.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      const double d = std::fabs(kPredictions[i][k] - kTargets[i][k]);
      if (d <= delta) {
        expected += 0.5 * d * d;
        ++inside;
      } else {
        expected += delta * (d - 0.5 * delta);
        ++outside;
      }
    }
  }
  EXPECT_GE(inside, 2);  // the data reaches both sides of delta
  EXPECT_GE(outside, 2);
  ExpectNear(loss.Summed(Matrix(kPredictions), Matrix(kTargets)).item<double>(),
             expected);
  // The default delta, 1.0, on a single error on each side.
  v1::JobSpec spec;
  spec.set_loss("huber");
  const Loss unit = *Loss::FromConfig(JobConfig::FromNormalized(spec));
  ExpectNear(unit.Summed(Matrix({{0.75}, {3.0}}), Matrix({{0.0}, {0.0}}))
                 .item<double>(),
             0.5 * 0.75 * 0.75 + (3.0 - 0.5));
}

TEST(LossTest, SummedKeepsTheGraphForBackward) {
  const Loss loss = Named("mse");
  torch::Tensor output = Matrix(kPredictions).requires_grad_(true);
  loss.Summed(output, Matrix(kTargets)).backward();
  for (size_t i = 0; i < kPredictions.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      ExpectNear(output.grad()[i][k].item<double>(),
                 2.0 * (kPredictions[i][k] - kTargets[i][k]));
    }
  }
}

TEST(LossTest, SumsAddUpOverBatchesAndRoundTripAsArray) {
  const Loss loss = Named("mae");
  MetricSums whole;
  loss.Accumulate(Matrix(kPredictions), Matrix(kTargets), &whole);
  MetricSums parts;
  loss.Accumulate(Matrix(kPredictions).slice(0, 0, 1),
                  Matrix(kTargets).slice(0, 0, 1), &parts);
  loss.Accumulate(Matrix(kPredictions).slice(0, 1, 3),
                  Matrix(kTargets).slice(0, 1, 3), &parts);
  ExpectNear(parts.loss, whole.loss);
  ExpectNear(parts.abs_error, whole.abs_error);
  EXPECT_DOUBLE_EQ(parts.samples, 3.0);
  EXPECT_DOUBLE_EQ(parts.elements, 6.0);
  const MetricSums copy = MetricSums::FromVector(whole.ToVector(), 0);
  EXPECT_EQ(copy.ToVector(), whole.ToVector());
  // No samples: every metric 0.
  const auto empty = loss.Metrics(MetricSums());
  EXPECT_EQ(empty.at("val_loss"), 0.0);
  EXPECT_EQ(empty.at("val_mae"), 0.0);
}

// Top-5 accuracy over more than 5 classes: a sample counts when fewer than
// 5 outputs exceed its class's output (counted here element by element).
TEST(LossTest, TopFiveAccuracyCountsTheClassAmongTheFiveHighest) {
  const Loss ce = Named("categorical_crossentropy");
  torch::manual_seed(5);
  const torch::Tensor output = torch::randn({200, 12});
  const torch::Tensor labels = torch::randint(0, 12, {200}, torch::kLong);
  double want = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const float mine = output[i][labels[i].item<int64_t>()].item<float>();
    int above = 0;
    for (int64_t c = 0; c < 12; ++c) above += output[i][c].item<float>() > mine ? 1 : 0;
    want += above < 5 ? 1 : 0;
  }
  MetricSums sums;
  ce.Accumulate(output.slice(0, 0, 120), labels.slice(0, 0, 120), &sums);
  ce.Accumulate(output.slice(0, 120, 200), labels.slice(0, 120, 200), &sums);
  const std::map<std::string, double> metrics = ce.Metrics(MetricSums::FromVector(sums.ToVector(), 0));
  EXPECT_DOUBLE_EQ(metrics.at("val_top5_accuracy"), want / 200);
  EXPECT_GT(metrics.at("val_top5_accuracy"), metrics.at("val_accuracy"));
  // Five classes or fewer: no top-5 metric.
  MetricSums few;
  ce.Accumulate(output.slice(1, 0, 5), torch::randint(0, 5, {200}, torch::kLong), &few);
  EXPECT_EQ(ce.Metrics(few).count("val_top5_accuracy"), 0u);
}

TEST(LossTest, OutputShapeErrorsNameBothShapesAndTheLoss) {
  const Loss ce = Named("categorical_crossentropy");
  const torch::Tensor labels = torch::zeros({64}, torch::kLong);
  const absl::Status narrow = ce.CheckOutput(torch::zeros({64, 5}), labels, 10);
  EXPECT_EQ(narrow.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(narrow.message(),
            "the model outputs [64, 5] per batch but categorical_crossentropy "
            "with 10 classes needs [64, 10]");
  EXPECT_TRUE(ce.CheckOutput(torch::zeros({64, 10}), labels, 10).ok());
  // Without num_classes only the batch's largest label bounds the width.
  EXPECT_TRUE(ce.CheckOutput(torch::zeros({3, 4}), Indices({0, 3, 1})).ok());
  EXPECT_EQ(ce.CheckOutput(torch::zeros({3, 3}), Indices({0, 3, 1})).message(),
            "the model outputs [3, 3] per batch but categorical_crossentropy "
            "with labels up to 3 needs [3, >= 4]");
  EXPECT_EQ(ce.CheckOutput(torch::zeros({32, 10}), labels, 10).message(),
            "the model outputs [32, 10] per batch but categorical_crossentropy "
            "with 10 classes needs [64, 10]");
  EXPECT_THAT(ce.CheckOutput(torch::zeros({64, 10}, torch::kLong), labels, 10)
                  .message(),
              HasSubstr("floating-point outputs"));

  const Loss mse = Named("mse");
  EXPECT_EQ(
      mse.CheckOutput(torch::zeros({4, 2}), torch::zeros({4, 3})).message(),
      "the model outputs [4, 2] per batch but mse with targets [4, 3] "
      "needs [4, 3]");
  EXPECT_EQ(
      mse.CheckOutput(torch::zeros({4, 2}), torch::zeros({4, 1})).message(),
      "the model outputs [4, 2] per batch but mse with targets [4, 1] "
      "needs [4, 1] (or [4])");
  EXPECT_TRUE(mse.CheckOutput(torch::zeros({4}), torch::zeros({4, 1})).ok());
  ExpectNear(
      mse.Summed(Matrix({{1.0}, {2.0}}).reshape({2}), Matrix({{0.5}, {0.0}}))
          .item<double>(),
      0.25 + 4.0);
}

TEST(LossTest, RegressionRefusesClassIndices) {
  for (const std::string name : {"mse", "mae", "huber"}) {
    const absl::StatusOr<int64_t> outputs =
        Named(name).OutputsFor(Indices({0, 1}), 2);
    EXPECT_EQ(outputs.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(outputs.status().message(),
                HasSubstr(name + " is a regression loss and needs float "
                                 "targets (e.g. IDX float32 labels"));
    EXPECT_EQ(
        Named(name).CheckOutput(torch::zeros({2, 1}), Indices({0, 1})).code(),
        absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(*Named("categorical_crossentropy").OutputsFor(Indices({0, 1}), 7),
            7);
  EXPECT_THAT(
      Named("mse").OutputsFor(torch::zeros({2, 2, 2}), 0).status().message(),
      HasSubstr("labels must be int64 [N] class indices or float32 "
                "[N, K] targets, got Float [2, 2, 2]"));
}

// Unknown names never get this far: JobConfig::Create refuses them
// (common/spec/job_config_test.cc).
TEST(LossTest, BadDeltaIsRefused) {
  for (const double delta : {0.0, -1.0, std::nan("")}) {
    const absl::Status refused = Loss::Create(LossKind::kHuber, delta).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(),
                HasSubstr("huber_delta must be a finite number > 0"));
  }
}

TEST(LossTest, FromConfigReadsTheLossAndItsDelta) {
  v1::JobSpec spec;
  spec.set_loss("huber");
  spec.set_huber_delta(2.5);
  const absl::StatusOr<Loss> loss =
      Loss::FromConfig(JobConfig::FromNormalized(spec));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->name(), "huber");
  EXPECT_FALSE(loss->classification());
  // Half of 1^2 inside the delta; 2.5 * (4 - 1.25) outside it.
  ExpectNear(loss->Summed(Matrix({{1.0}, {4.0}}), Matrix({{0.0}, {0.0}}))
                 .item<double>(),
             0.5 + 2.5 * (4.0 - 1.25));
}

}  // namespace
}  // namespace mpilearn::worker
