// The exact ROC AUC of a binary classifier's validation: ExactRocAuc
// against a brute-force count of every (positive, negative) pair in double
// precision, ties counting one half; and EvaluateShare over a group of three
// ranks reports the AUC of the whole set, the same on every rank.
#include "worker/evaluation.h"

#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "common/spec/job_config.h"
#include "gtest/gtest.h"
#include "worker/fake_collectives.h"

namespace mpilearn::worker {
namespace {

// The probability that a positive scores above a negative, ties one half.
double PairCount(const std::vector<float>& scores, const std::vector<uint8_t>& positive) {
  double wins = 0;
  double pairs = 0;
  for (size_t p = 0; p < scores.size(); ++p) {
    if (!positive[p]) continue;
    for (size_t n = 0; n < scores.size(); ++n) {
      if (positive[n]) continue;
      pairs += 1;
      wins += scores[p] > scores[n] ? 1.0 : scores[p] == scores[n] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

// A small mlp of 4 inputs and `outputs` outputs, in eval mode.
Model SmallMlp(int64_t outputs) {
  v1::ModelSpec spec;
  spec.set_name("mlp");
  spec.add_hidden(8);
  absl::StatusOr<Model> built = Model::Build(spec, std::vector<int64_t>{4}, outputs);
  EXPECT_TRUE(built.ok()) << built.status();
  if (!built.ok()) std::abort();
  built->SetTraining(false);
  return *std::move(built);
}

// Each rank of a group of shares.size() evaluates rows [first, second) of
// the set with its own copy of the model's weights (Forward is per
// thread); every rank's result.
std::vector<Evaluation> EvaluateInShares(const Model& model, const Loss& loss,
                                         const torch::Tensor& features,
                                         const torch::Tensor& labels,
                                         const std::vector<std::pair<int64_t, int64_t>>& shares) {
  const int ranks = static_cast<int>(shares.size());
  std::vector<Evaluation> results(ranks);
  FakeGroup group(ranks);
  std::vector<Model> models(ranks, model);
  group.Run([&](Collectives& rank) {
    const int r = rank.rank();
    Dataset share;
    share.features = features.slice(0, shares[r].first, shares[r].second);
    share.labels = labels.slice(0, shares[r].first, shares[r].second);
    results[r] = EvaluateShard(rank, models[r], loss, share, /*batch_size=*/16);
  });
  return results;
}

TEST(EvaluationTest, ExactRocAucEqualsThePairCount) {
  std::mt19937 rng(7);
  for (const int levels : {0, 5}) {  // continuous scores, then heavy ties
    std::normal_distribution<float> noise;
    std::vector<float> scores;
    std::vector<uint8_t> positive;
    for (int i = 0; i < 800; ++i) {
      const bool signal = i % 3 == 0;
      float score = noise(rng) + (signal ? 0.8f : 0.0f);
      if (levels > 0) score = static_cast<float>(static_cast<int>(score * levels)) / levels;
      scores.push_back(score);
      positive.push_back(signal ? 1 : 0);
    }
    const std::optional<double> auc = ExactRocAuc(scores, positive);
    ASSERT_TRUE(auc.has_value());
    EXPECT_NEAR(*auc, PairCount(scores, positive), 1e-12) << "levels " << levels;
    EXPECT_GT(*auc, 0.6);  // the signal scores higher
  }
  // Perfect, reversed, and undefined.
  EXPECT_DOUBLE_EQ(*ExactRocAuc(std::vector<float>{0.1f, 0.9f}, std::vector<uint8_t>{0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(*ExactRocAuc(std::vector<float>{0.9f, 0.1f}, std::vector<uint8_t>{0, 1}), 0.0);
  EXPECT_FALSE(ExactRocAuc(std::vector<float>{0.1f, 0.9f}, std::vector<uint8_t>{1, 1}).has_value());
}

TEST(EvaluationTest, AGroupReportsTheWholeSetsAuc) {
  torch::manual_seed(3);
  Model model = SmallMlp(1);
  absl::StatusOr<Loss> loss = Loss::Create(LossKind::kBinaryCrossentropy, 1.0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  // 90 samples whose label follows the first feature, split 40 / 30 / 20.
  const torch::Tensor features = torch::randn({90, 4});
  const torch::Tensor labels = features.select(1, 0).gt(0).to(torch::kFloat).unsqueeze(1);
  const torch::Tensor scores = model.Forward(features).reshape({-1}).contiguous();
  std::vector<float> all(scores.data_ptr<float>(), scores.data_ptr<float>() + 90);
  std::vector<uint8_t> positive;
  for (int64_t i = 0; i < 90; ++i) positive.push_back(labels[i][0].item<float>() > 0.5f);
  const double want = PairCount(all, positive);

  const std::vector<Evaluation> results =
      EvaluateInShares(model, *loss, features, labels, {{0, 40}, {40, 70}, {70, 90}});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(results[r].metrics.count("val_auc"), 1u) << "rank " << r;
    EXPECT_NEAR(results[r].metrics.at("val_auc"), want, 1e-12) << "rank " << r;
    EXPECT_EQ(results[r].samples, 90);
  }
  EXPECT_NE(FormatMetrics(results[0]).find("val_auc="), std::string::npos);
}

// A model of two outputs (a 3-class kind, a binary flag) over three ranks:
// each output's metrics equal one rank's over the whole set, and the flag's
// AUC is the pair count of its own score column.
TEST(EvaluationTest, AGroupReportsEachOutputsMetricsAndAuc) {
  torch::manual_seed(5);
  Model model = SmallMlp(4);
  absl::StatusOr<JobConfig> config = JobConfig::FromJson(R"({
    "data": {"train_files": ["t.h5"], "labels_datasets": ["kind", "flag"]},
    "outputs": [{"name": "kind"}, {"name": "flag", "loss": "binary_crossentropy"}]})");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Loss> loss = Loss::FromConfig(*config);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(loss->BindLabels({{0, 1, true, 3}, {1, 1, true, 2}}).ok());
  const torch::Tensor features = torch::randn({90, 4});
  const torch::Tensor labels = torch::stack(
      {features.select(1, 1).gt(0).to(torch::kFloat) + features.select(1, 2).gt(0.5).to(torch::kFloat),
       features.select(1, 0).gt(0).to(torch::kFloat)},
      1);
  const torch::Tensor flag_scores = model.Forward(features).select(1, 3).contiguous();
  std::vector<float> all(flag_scores.data_ptr<float>(), flag_scores.data_ptr<float>() + 90);
  std::vector<uint8_t> positive;
  for (int64_t i = 0; i < 90; ++i) positive.push_back(labels[i][1].item<float>() > 0.5f);

  const Evaluation whole = EvaluateInShares(model, *loss, features, labels, {{0, 90}})[0];
  const std::vector<Evaluation> split =
      EvaluateInShares(model, *loss, features, labels, {{0, 40}, {40, 70}, {70, 90}});
  for (const char* name : {"val_loss", "val_kind_loss", "val_kind_accuracy", "val_flag_loss",
                           "val_flag_accuracy", "val_flag_auc"}) {
    ASSERT_EQ(whole.metrics.count(name), 1u) << name;
    for (const Evaluation& rank : split) {
      ASSERT_EQ(rank.metrics.count(name), 1u) << name;
      // Losses are float32 sums per batch, and the batches differ.
      EXPECT_NEAR(rank.metrics.at(name), whole.metrics.at(name), 1e-6) << name;
    }
  }
  EXPECT_NEAR(whole.metrics.at("val_flag_auc"), PairCount(all, positive), 1e-12);
  EXPECT_EQ(whole.metrics.count("val_accuracy"), 0u);  // no single accuracy
  const std::string line = FormatMetrics(split[0], "test");
  EXPECT_NE(line.find("test_flag_auc="), std::string::npos) << line;
  EXPECT_NE(line.find("test_kind_accuracy="), std::string::npos) << line;
}

}  // namespace
}  // namespace mpilearn::worker
