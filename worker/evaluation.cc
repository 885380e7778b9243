#include "worker/evaluation.h"

#include <algorithm>

#include "absl/types/span.h"

namespace mpilearn::worker {

torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(
      logits, y,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

Evaluation EvaluateShard(Collectives& group, torch::nn::Sequential& model,
                         const Dataset& shard, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  double sums[3] = {0, 0, 0};  // loss sum, correct, samples
  for (int64_t begin = 0; begin < shard.size(); begin += batch_size) {
    const int64_t end = std::min(shard.size(), begin + batch_size);
    torch::Tensor x = shard.images.slice(0, begin, end);
    torch::Tensor y = shard.labels.slice(0, begin, end);
    torch::Tensor logits = model->forward(x);
    sums[0] += SummedCrossEntropy(logits, y).item<double>();
    sums[1] += logits.argmax(1).eq(y).sum().item<double>();
    sums[2] += static_cast<double>(end - begin);
  }
  group.AllreduceSum(absl::MakeSpan(sums, 3));
  Evaluation result;
  result.samples = static_cast<int64_t>(sums[2]);
  if (sums[2] > 0) {
    result.loss = sums[0] / sums[2];
    result.accuracy = sums[1] / sums[2];
  }
  return result;
}

}  // namespace mpilearn::worker
