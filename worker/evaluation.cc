#include "worker/evaluation.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace mpilearn::worker {

Evaluation EvaluateShard(Collectives& group, Model& model, const Loss& loss,
                         const Dataset& shard, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  MetricSums sums;
  for (int64_t begin = 0; begin < shard.size(); begin += batch_size) {
    const int64_t end = std::min(shard.size(), begin + batch_size);
    const torch::Tensor output =
        model.Forward(shard.features.slice(0, begin, end));
    loss.Accumulate(output, shard.labels.slice(0, begin, end).to(output.device()),
                    &sums);
  }
  std::array<double, MetricSums::kSize> values = sums.ToArray();
  group.AllreduceSum(absl::MakeSpan(values));
  sums = MetricSums::FromArray(values);

  Evaluation result;
  result.samples = static_cast<int64_t>(sums.samples);
  result.metrics = loss.Metrics(sums);
  result.loss = result.metrics["val_loss"];
  auto accuracy = result.metrics.find("val_accuracy");
  if (accuracy != result.metrics.end()) result.accuracy = accuracy->second;
  return result;
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
