#include "worker/evaluation.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace mpilearn::worker {

absl::StatusOr<Evaluation> EvaluateShare(Collectives& group, Model& model,
                                         const Loss& loss, int64_t rows,
                                         const ShareReader& read,
                                         int64_t batch_size) {
  torch::NoGradGuard no_grad;
  MetricSums sums;
  absl::Status failed = absl::OkStatus();
  for (int64_t begin = 0; begin < rows; begin += batch_size) {
    const int64_t end = std::min(rows, begin + batch_size);
    absl::StatusOr<Dataset> batch = read(begin, end);
    if (!batch.ok()) {
      failed = batch.status();
      break;
    }
    const torch::Tensor output = model.Forward(batch->features);
    loss.Accumulate(output, batch->labels.to(output.device()), &sums);
  }
  // The sums, then one slot per rank, 1 where that rank's read failed (the
  // first failing rank is the first nonzero slot).
  std::vector<double> values(MetricSums::kSize + group.size(), 0.0);
  const std::array<double, MetricSums::kSize> own = sums.ToArray();
  std::copy(own.begin(), own.end(), values.begin());
  if (!failed.ok()) values[MetricSums::kSize + group.rank()] = 1.0;
  group.AllreduceSum(absl::MakeSpan(values));
  if (!failed.ok()) return failed;
  for (int r = 0; r < group.size(); ++r) {
    if (values[MetricSums::kSize + r] != 0.0) {
      return absl::AbortedError(
          absl::StrCat("rank ", r, " could not read its share of the data"));
    }
  }
  std::array<double, MetricSums::kSize> reduced;
  std::copy(values.begin(), values.begin() + MetricSums::kSize, reduced.begin());
  sums = MetricSums::FromArray(reduced);

  Evaluation result;
  result.samples = static_cast<int64_t>(sums.samples);
  result.metrics = loss.Metrics(sums);
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
  // "acc" for accuracy, as the lines always said.
  for (const auto& [metric, short_name] :
       {std::pair<const char*, const char*>{"val_accuracy",
                                            prefix == "val" ? "acc" : "accuracy"},
        {"val_mae", "mae"},
        {"val_mse", "mse"}}) {
    auto it = evaluation.metrics.find(metric);
    if (it == evaluation.metrics.end()) continue;
    absl::StrAppend(&line, separator,
                    absl::StrFormat("%s_%s=%.4f", prefix, short_name, it->second));
  }
  return line;
}

}  // namespace mpilearn::worker
