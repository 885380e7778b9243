#include "worker/evaluation.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/spec/job_spec.h"

namespace mpilearn::worker {
namespace {

// The most samples whose scores rank 0 gathers for an exact ROC AUC.
constexpr double kMaxAucSamples = 50e6;

// Scores and labels of a single-output binary classifier, as ranks gather
// them: per sample a float score and a one-byte label.
struct Scored {
  std::vector<float> scores;
  std::vector<uint8_t> positive;

  void Add(const torch::Tensor& output, const torch::Tensor& labels) {
    const torch::Tensor out = output.reshape({-1}).to(torch::kFloat).cpu().contiguous();
    const torch::Tensor is_positive =
        labels.reshape({-1}).to(torch::kFloat).gt(0.5).to(torch::kUInt8).cpu().contiguous();
    scores.insert(scores.end(), out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
    positive.insert(positive.end(), is_positive.data_ptr<uint8_t>(),
                    is_positive.data_ptr<uint8_t>() + is_positive.numel());
  }

  std::string Serialize() const {
    std::string bytes(scores.size() * (sizeof(float) + 1), '\0');
    std::memcpy(bytes.data(), scores.data(), scores.size() * sizeof(float));
    std::memcpy(bytes.data() + scores.size() * sizeof(float), positive.data(), positive.size());
    return bytes;
  }

  void Append(const std::string& bytes) {
    const size_t n = bytes.size() / (sizeof(float) + 1);
    const size_t at = scores.size();
    scores.resize(at + n);
    positive.resize(at + n);
    std::memcpy(scores.data() + at, bytes.data(), n * sizeof(float));
    std::memcpy(positive.data() + at, bytes.data() + n * sizeof(float), n);
  }
};

// The whole set's ROC AUC from every rank's scores, on every rank; none
// when it is undefined.
std::optional<double> GroupRocAuc(Collectives& group, const Scored& own) {
  const std::vector<std::string> gathered = group.GatherStrings(own.Serialize(), 0);
  std::string result;
  if (group.rank() == 0) {
    Scored all;
    for (const std::string& bytes : gathered) all.Append(bytes);
    const std::optional<double> auc = ExactRocAuc(all.scores, all.positive);
    if (auc.has_value()) result.assign(reinterpret_cast<const char*>(&*auc), sizeof(double));
  }
  group.Broadcast(&result, 0);
  if (result.size() != sizeof(double)) return std::nullopt;
  double auc = 0;
  std::memcpy(&auc, result.data(), sizeof(double));
  return auc;
}

}  // namespace

std::optional<double> ExactRocAuc(absl::Span<const float> scores,
                                  absl::Span<const uint8_t> positive) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks (1-based), ties given their mean rank.
  double positive_ranks = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k) {
      if (positive[order[k]] != 0) {
        positive_ranks += mean_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return std::nullopt;
  return (positive_ranks - positives * (positives + 1) / 2) / (positives * negatives);
}

absl::StatusOr<Evaluation> EvaluateShare(Collectives& group, Model& model,
                                         const Loss& loss, int64_t rows,
                                         const ShareReader& read,
                                         int64_t batch_size) {
  torch::NoGradGuard no_grad;
  MetricSums sums;
  sums.heads.resize(loss.heads().size());
  // A single-output binary classifier's scores, for the exact ROC AUC.
  const bool auc = !loss.multi() && loss.kind() == LossKind::kBinaryCrossentropy;
  Scored scored;
  // Several outputs: each binary_crossentropy output of one score per
  // sample has its own AUC (val_<name>_auc); the widths are bound, so
  // every rank scores the same outputs.
  std::vector<std::pair<size_t, Scored>> head_scores;
  for (size_t j = 0; j < loss.heads().size(); ++j) {
    const Loss::Head& head = loss.heads()[j];
    if (head.loss->kind() == LossKind::kBinaryCrossentropy && head.output_width == 1 &&
        head.labels.columns == 1) {
      head_scores.emplace_back(j, Scored{});
    }
  }
  absl::Status failed = absl::OkStatus();
  for (int64_t begin = 0; begin < rows; begin += batch_size) {
    const int64_t end = std::min(rows, begin + batch_size);
    absl::StatusOr<Dataset> batch = read(begin, end);
    if (!batch.ok()) {
      failed = batch.status();
      break;
    }
    const torch::Tensor output = model.Forward(batch->features);
    const torch::Tensor labels = batch->labels.to(output.device());
    loss.Accumulate(output, labels, &sums);
    if (auc && output.numel() == output.size(0)) scored.Add(output, batch->labels);
    for (auto& [head, head_scored] : head_scores) {
      head_scored.Add(loss.HeadOutput(output, head), loss.HeadLabels(labels, head));
    }
  }
  // The sums, then one slot per rank, 1 where that rank's read failed (the
  // first failing rank is the first nonzero slot), then one counting the
  // ranks that could not score one output per sample (no AUC then).
  const std::vector<double> own = sums.ToVector();
  const size_t unscored_slot = own.size() + static_cast<size_t>(group.size());
  std::vector<double> values(unscored_slot + 1, 0.0);
  std::copy(own.begin(), own.end(), values.begin());
  if (!failed.ok()) values[own.size() + group.rank()] = 1.0;
  if (auc && static_cast<double>(scored.scores.size()) != sums.samples) {
    values[unscored_slot] = 1.0;
  }
  group.AllreduceSum(absl::MakeSpan(values));
  if (!failed.ok()) return failed;
  for (int r = 0; r < group.size(); ++r) {
    if (values[own.size() + r] != 0.0) {
      return absl::AbortedError(
          absl::StrCat("rank ", r, " could not read its share of the data"));
    }
  }
  sums = MetricSums::FromVector(absl::MakeConstSpan(values).subspan(0, own.size()),
                                loss.heads().size());

  Evaluation result;
  result.samples = static_cast<int64_t>(sums.samples);
  result.metrics = loss.Metrics(sums);
  // Every rank scored one output per sample (a multi-output model scores
  // none): then the AUC, a collective of its own, which every rank decides
  // alike from the reduced values. Bounded: 5 bytes per sample on rank 0.
  if (auc && values[unscored_slot] == 0.0 && sums.samples > 0 &&
      sums.samples <= kMaxAucSamples) {
    const std::optional<double> area = GroupRocAuc(group, scored);
    if (area.has_value()) result.metrics["val_auc"] = *area;
  }
  if (sums.samples > 0 && sums.samples <= kMaxAucSamples) {
    for (const auto& [head, head_scored] : head_scores) {
      const std::optional<double> area = GroupRocAuc(group, head_scored);
      if (area.has_value()) {
        result.metrics[absl::StrCat("val_", loss.heads()[head].name, "_auc")] = *area;
      }
    }
  }
  result.loss = result.metrics["val_loss"];
  auto accuracy = result.metrics.find("val_accuracy");
  if (accuracy != result.metrics.end()) result.accuracy = accuracy->second;
  return result;
}

Evaluation EvaluateShard(Collectives& group, Model& model, const Loss& loss,
                         const Dataset& shard, int64_t batch_size) {
  // Slices of memory cannot fail.
  return *EvaluateShare(
      group, model, loss, shard.size(),
      [&shard](int64_t begin, int64_t end) -> absl::StatusOr<Dataset> {
        Dataset batch;
        batch.features = shard.features.slice(0, begin, end);
        batch.labels = shard.labels.slice(0, begin, end);
        return batch;
      },
      batch_size);
}

std::string FormatMetrics(const Evaluation& evaluation, const std::string& prefix,
                          const std::string& separator) {
  std::string line = absl::StrFormat("%s_loss=%.4f", prefix, evaluation.loss);
  if (evaluation.metrics.count("val_accuracy") == 0 && evaluation.metrics.count("val_mae") == 0) {
    // Several outputs: each one's metrics by name (val_<name>_...).
    for (const auto& [name, value] : evaluation.metrics) {
      if (name == "val_loss" || name.size() <= 4) continue;
      absl::StrAppend(&line, separator,
                      absl::StrFormat("%s_%s=%.4f", prefix, name.substr(4), value));
    }
    return line;
  }
  // "acc" for accuracy, as the lines always said.
  for (const auto& [metric, short_name] :
       {std::pair<const char*, const char*>{"val_accuracy",
                                            prefix == "val" ? "acc" : "accuracy"},
        {"val_auc", "auc"},
        {"val_mae", "mae"},
        {"val_mse", "mse"}}) {
    auto it = evaluation.metrics.find(metric);
    if (it == evaluation.metrics.end()) continue;
    absl::StrAppend(&line, separator,
                    absl::StrFormat("%s_%s=%.4f", prefix, short_name, it->second));
    // val_top<K>_accuracy: "topK_acc", after the accuracy.
    if (std::string(metric) != "val_accuracy") continue;
    for (const auto& [name, value] : evaluation.metrics) {
      if (const std::optional<int> k = TopKOfMetric(name); k.has_value()) {
        absl::StrAppend(&line, separator, absl::StrFormat("%s_top%d_acc=%.4f", prefix, *k, value));
      }
    }
  }
  return line;
}

}  // namespace mpilearn::worker
