// The loss options of worker/model/loss.h (class weights, label smoothing,
// pos_weight, top-k, a TorchScript loss) against references computed here in
// double precision with plain loops, following PyTorch's documented
// formulas for `weight`, `label_smoothing` and `pos_weight` with
// reduction "sum". Inputs are multiples of 1/8, exact in float32.
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/loss.h"

namespace mpilearn::worker {
namespace {

using ::testing::HasSubstr;
using Rows = std::vector<std::vector<double>>;

torch::Tensor Matrix(const Rows& rows) {
  torch::Tensor tensor = torch::zeros(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) tensor[i][j] = rows[i][j];
  }
  return tensor;
}

Loss WithOptions(LossKind kind, const v1::LossOptions& options) {
  absl::StatusOr<Loss> loss = Loss::Create(kind, 1.0);
  EXPECT_TRUE(loss.ok()) << loss.status();
  absl::StatusOr<Loss> with = Loss::WithOptions(*std::move(loss), options);
  EXPECT_TRUE(with.ok()) << with.status();
  return *std::move(with);
}

void ExpectNear(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-5 * std::max(1.0, std::fabs(expected)));
}

// log softmax of one row.
std::vector<double> LogSoftmax(const std::vector<double>& x) {
  const double largest = *std::max_element(x.begin(), x.end());
  double total = 0.0;
  for (double v : x) total += std::exp(v - largest);
  std::vector<double> out;
  for (double v : x) out.push_back(v - largest - std::log(total));
  return out;
}

const Rows kLogits = {{1.0, -0.5, 2.25, 0.125},
                      {-1.5, 0.75, 0.0, 3.0},
                      {0.5, 0.5, -2.0, 1.0},
                      {0.25, -0.75, 1.5, -1.0}};
const std::vector<int64_t> kClasses = {2, 1, 3, 0};

// PyTorch's cross entropy with class weights w and label smoothing e, for a
// sample of class y: (1 - e) w_y (-log p_y) + e / C sum_c w_c (-log p_c).
double WeightedSmoothed(const std::vector<double>& x, int64_t y, const std::vector<double>& w,
                        double e) {
  const std::vector<double> logp = LogSoftmax(x);
  const double classes = static_cast<double>(x.size());
  double smooth = 0.0;
  for (size_t c = 0; c < x.size(); ++c) smooth -= w[c] * logp[c];
  return (1.0 - e) * w[static_cast<size_t>(y)] * -logp[static_cast<size_t>(y)] +
         e / classes * smooth;
}

TEST(LossOptionsTest, ClassWeightsAndLabelSmoothingMatchTheReference) {
  const std::vector<double> weights = {0.5, 2.0, 1.25, 0.0};
  for (double smoothing : {0.0, 0.1, 0.375}) {
    v1::LossOptions options;
    for (double w : weights) options.add_class_weights(w);
    options.set_label_smoothing(smoothing);
    const Loss loss = WithOptions(LossKind::kCategoricalCrossentropy, options);
    double expected = 0.0;
    for (size_t i = 0; i < kLogits.size(); ++i) {
      expected += WeightedSmoothed(kLogits[i], kClasses[i], weights, smoothing);
    }
    const torch::Tensor labels = torch::tensor(kClasses, torch::kLong);
    ExpectNear(loss.Summed(Matrix(kLogits), labels).item<double>(), expected);
    // One-hot rows are the same targets as the indices.
    Rows one_hot(kLogits.size(), std::vector<double>(4, 0.0));
    for (size_t i = 0; i < kClasses.size(); ++i) one_hot[i][kClasses[i]] = 1.0;
    ExpectNear(loss.Summed(Matrix(kLogits), Matrix(one_hot)).item<double>(), expected);
    // val_loss is the same sum per sample.
    MetricSums sums;
    loss.Accumulate(Matrix(kLogits), labels, &sums);
    ExpectNear(loss.Metrics(sums).at("val_loss"), expected / 4.0);
  }
}

// PyTorch's binary cross entropy on logits with pos_weight p:
// -(p t log s(x) + (1 - t) log(1 - s(x))).
double PosWeighted(double x, double t, double p) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return -(p * t * std::log(s) + (1.0 - t) * std::log(1.0 - s));
}

TEST(LossOptionsTest, PosWeightPerOutputAndForAllMatchTheReference) {
  const Rows logits = {{0.5, -1.25}, {-2.0, 0.75}, {1.5, 0.0}};
  const Rows targets = {{1.0, 0.0}, {0.0, 1.0}, {1.0, 0.25}};
  for (const std::vector<double>& pos : {std::vector<double>{3.0},
                                         std::vector<double>{0.5, 4.0}}) {
    v1::LossOptions options;
    for (double p : pos) options.add_pos_weight(p);
    const Loss loss = WithOptions(LossKind::kBinaryCrossentropy, options);
    ASSERT_TRUE(loss.CheckOutput(Matrix(logits), Matrix(targets)).ok());
    double expected = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      for (size_t k = 0; k < 2; ++k) {
        expected += PosWeighted(logits[i][k], targets[i][k], pos[pos.size() == 1 ? 0 : k]);
      }
    }
    ExpectNear(loss.Summed(Matrix(logits), Matrix(targets)).item<double>(), expected);
  }
}

TEST(LossOptionsTest, WeightCountsMustFitTheModelsOutputs) {
  v1::LossOptions options;
  for (int c = 0; c < 3; ++c) options.add_class_weights(1.0);
  const Loss weighted = WithOptions(LossKind::kCategoricalCrossentropy, options);
  const absl::Status classes =
      weighted.CheckOutput(Matrix(kLogits), torch::tensor(kClasses, torch::kLong), 4);
  EXPECT_EQ(classes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(classes.message()),
              HasSubstr("class_weights has 3 values but the model scores 4 classes"));
  v1::LossOptions pos;
  for (int k = 0; k < 3; ++k) pos.add_pos_weight(2.0);
  const Loss binary = WithOptions(LossKind::kBinaryCrossentropy, pos);
  const absl::Status outputs =
      binary.CheckOutput(Matrix({{0.5, 1.0}, {0.0, 1.0}}), Matrix({{1.0, 0.0}, {0.0, 1.0}}));
  EXPECT_THAT(std::string(outputs.message()),
              HasSubstr("pos_weight has 3 values but the model has 2 outputs"));
}

// top_k 3 over 12 classes: a sample counts when fewer than 3 outputs exceed
// its class's (counted element by element); the metric is named for k.
TEST(LossOptionsTest, TopKCountsTheClassAmongTheKHighest) {
  v1::LossOptions options;
  options.set_top_k(3);
  const Loss loss = WithOptions(LossKind::kCategoricalCrossentropy, options);
  EXPECT_EQ(loss.top_k(), 3);
  torch::manual_seed(9);
  const torch::Tensor output = torch::randn({150, 12});
  const torch::Tensor labels = torch::randint(0, 12, {150}, torch::kLong);
  double want = 0;
  for (int64_t i = 0; i < 150; ++i) {
    const float mine = output[i][labels[i].item<int64_t>()].item<float>();
    int above = 0;
    for (int64_t c = 0; c < 12; ++c) above += output[i][c].item<float>() > mine ? 1 : 0;
    want += above < 3 ? 1 : 0;
  }
  MetricSums sums;
  loss.Accumulate(output, labels, &sums);
  const std::map<std::string, double> metrics = loss.Metrics(sums);
  EXPECT_DOUBLE_EQ(metrics.at("val_top3_accuracy"), want / 150);
  EXPECT_EQ(metrics.count("val_top5_accuracy"), 0u);
}

// A TorchScript loss written here (Module::define compiles TorchScript
// source, as torch.jit.script would) and saved as a user's file.
std::string SaveScript(const std::string& name, const std::string& forward) {
  torch::jit::Module module("UserLoss");
  module.define(forward);
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".pt");
  module.save(path);
  return path;
}

Loss Scripted(LossKind kind, const std::string& path) {
  v1::LossOptions options;
  options.set_torchscript(path);
  return WithOptions(kind, options);
}

TEST(LossOptionsTest, AScriptedLossIsTheScriptsMeanTimesTheBatch) {
  // Mean cross entropy, scripted: the built-in's sum over the batch.
  const std::string path = SaveScript("mean_ce", R"(
def forward(self, output: Tensor, labels: Tensor) -> Tensor:
    return -torch.log_softmax(output, 1).gather(1, labels.unsqueeze(1)).mean()
)");
  const Loss scripted = Scripted(LossKind::kCategoricalCrossentropy, path);
  const Loss builtin = *Loss::Create(LossKind::kCategoricalCrossentropy, 1.0);
  const torch::Tensor labels = torch::tensor(kClasses, torch::kLong);
  ASSERT_TRUE(scripted.CheckOutput(Matrix(kLogits), labels, 4).ok());
  ExpectNear(scripted.Summed(Matrix(kLogits), labels).item<double>(),
             builtin.Summed(Matrix(kLogits), labels).item<double>());
  // Its graph reaches the model's output.
  torch::Tensor output = Matrix(kLogits).requires_grad_(true);
  scripted.Summed(output, labels).backward();
  ASSERT_TRUE(output.grad().defined());
  EXPECT_GT(output.grad().abs().sum().item<double>(), 0.0);
  // The metrics are still the loss kind's.
  MetricSums sums;
  scripted.Accumulate(Matrix(kLogits), labels, &sums);
  EXPECT_EQ(scripted.Metrics(sums).count("val_accuracy"), 1u);
}

TEST(LossOptionsTest, BadScriptsAreRefusedNamingTheFileAndTheCause) {
  const torch::Tensor labels = torch::tensor(kClasses, torch::kLong);
  const std::string per_sample = SaveScript("per_sample", R"(
def forward(self, output: Tensor, labels: Tensor) -> Tensor:
    return -torch.log_softmax(output, 1).gather(1, labels.unsqueeze(1)).squeeze(1)
)");
  absl::Status status =
      Scripted(LossKind::kCategoricalCrossentropy, per_sample).CheckOutput(Matrix(kLogits), labels);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr(per_sample));
  EXPECT_THAT(std::string(status.message()), HasSubstr("returned [4] Float"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("the batch's mean loss"));

  const std::string throws = SaveScript("throws", R"(
def forward(self, output: Tensor, labels: Tensor) -> Tensor:
    return (output - labels).mean()
)");
  // float [4, 4] minus int64 [4] broadcasts; a [3] float target does not.
  status = Scripted(LossKind::kMse, throws)
               .CheckOutput(Matrix({{1.0, 2.0}, {3.0, 4.0}}), Matrix({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  const std::string not_a_scalar_type = SaveScript("int_result", R"(
def forward(self, output: Tensor, labels: Tensor) -> Tensor:
    return labels.sum()
)");
  status = Scripted(LossKind::kCategoricalCrossentropy, not_a_scalar_type)
               .CheckOutput(Matrix(kLogits), labels);
  EXPECT_THAT(std::string(status.message()), HasSubstr("returned [] Long"));

  v1::LossOptions missing;
  missing.set_torchscript("/nonexistent/loss.pt");
  absl::StatusOr<Loss> loaded =
      Loss::WithOptions(*Loss::Create(LossKind::kMse, 1.0), missing);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("/nonexistent/loss.pt"));

  const std::string junk = absl::StrCat(std::getenv("TEST_TMPDIR"), "/junk.pt");
  FILE* file = std::fopen(junk.c_str(), "w");
  ASSERT_NE(file, nullptr);
  std::fputs("not a zip archive", file);
  std::fclose(file);
  v1::LossOptions bad;
  bad.set_torchscript(junk);
  loaded = Loss::WithOptions(*Loss::Create(LossKind::kMse, 1.0), bad);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("not a TorchScript file"));
}

}  // namespace
}  // namespace mpilearn::worker
