// The loss and metrics of a model over a data set split across a group's
// ranks: what the training group's epoch-end validation and test, and the
// validation pool, all compute.
#ifndef MPILEARN_WORKER_EVALUATION_H_
#define MPILEARN_WORKER_EVALUATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/types/span.h"

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/model/loss.h"
#include "worker/model/model.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

// A data set's loss and metrics, reduced over the group. A single-output
// binary_crossentropy also reports val_auc, the set's exact ROC AUC (every
// rank's scores gathered on rank 0; absent when the set holds one class).
struct Evaluation {
  double loss = 0.0;      // metrics["val_loss"]
  double accuracy = 0.0;  // metrics["val_accuracy"]; 0 for regression losses
  // Every metric the loss reports, by name, val_loss included
  // (Loss::Metrics): what EpochRecord.metrics and ValidationRecord.metrics
  // carry.
  std::map<std::string, double> metrics;
  int64_t samples = 0;
};

// Every rank evaluates `shard` (its own share) in batches of `batch_size`
// without gradients; the sums are reduced over `group` with one
// AllreduceSum, so every rank gets the whole set's mean loss and metrics.
// The caller sets the model's mode (SetTraining(false) for dropout and
// BatchNorm) and has checked the model's output against the labels
// (Loss::CheckOutput). A collective: every rank must call it, an empty shard
// included.
Evaluation EvaluateShard(Collectives& group, Model& model, const Loss& loss,
                         const Dataset& shard, int64_t batch_size);

// Reads rows [begin, end) of a rank's share (0 <= begin < end <= the
// share's rows) as a Dataset: from memory, or from files
// (worker/data/data_stream.h).
using ShareReader =
    std::function<absl::StatusOr<Dataset>(int64_t begin, int64_t end)>;

// As EvaluateShard, for a share of `rows` rows that `read` fetches batch by
// batch, so only one batch is in memory at a time. A rank whose read fails
// stops reading; the failure travels with the reduction, so every rank
// returns an error (the failing rank its own, the others Aborted naming
// the first failing rank) and the group stays together.
absl::StatusOr<Evaluation> EvaluateShare(Collectives& group, Model& model,
                                         const Loss& loss, int64_t rows,
                                         const ShareReader& read,
                                         int64_t batch_size);

// The area under the ROC curve of `scores` (higher: more likely positive)
// for `positive` labels, exactly: the probability that a positive scores
// above a negative, ties counting one half (the Mann-Whitney statistic, as
// scikit-learn's roc_auc_score computes it). None without both a positive
// and a negative. Precondition: equal lengths.
std::optional<double> ExactRocAuc(absl::Span<const float> scores,
                                  absl::Span<const uint8_t> positive);

// The metrics as printed: "val_loss=0.4123  val_acc=0.8512" for
// classification, "val_loss=0.0102  val_mae=0.0801  val_mse=0.0102" for
// regression; with `prefix` "test" the names start "test_" instead, and
// `separator` goes between the pairs.
std::string FormatMetrics(const Evaluation& evaluation,
                          const std::string& prefix = "val",
                          const std::string& separator = "  ");

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_EVALUATION_H_
