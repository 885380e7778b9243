// Loss and accuracy of a model over a data set split across a group's
// ranks: what the training group's epoch-end validation and test, and the
// validation pool, all compute.
#ifndef MPILEARN_WORKER_EVALUATION_H_
#define MPILEARN_WORKER_EVALUATION_H_

#include <cstdint>

#include <torch/torch.h>

#include "worker/dataset.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

// Loss and accuracy over a data set, reduced over the group.
struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t samples = 0;
};

// Cross-entropy summed (not averaged) over the batch.
torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& y);

// Every rank evaluates `shard` (its own share) in batches of `batch_size`
// without gradients; the sums are reduced over `group`, so every rank gets
// the whole set's mean loss and accuracy. The caller sets the model's mode
// (eval() for dropout). A collective: every rank must call it.
Evaluation EvaluateShard(Collectives& group, torch::nn::Sequential& model,
                         const Dataset& shard, int64_t batch_size);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_EVALUATION_H_
