// The training loss a job names (JobSpec.loss) and the validation metrics
// that go with it.
//
//   MPILEARN_ASSIGN_OR_RETURN(Loss loss, Loss::FromSpec(job));
//   MPILEARN_ASSIGN_OR_RETURN(int64_t outputs,
//                             loss.OutputsFor(train.labels, num_classes));
//   ... build the model with `outputs` outputs per sample ...
//   MPILEARN_RETURN_IF_ERROR(loss.CheckOutput(model.Forward(x), y));
//   torch::Tensor batch_loss = loss.Summed(model.Forward(x), y) / x.size(0);
//
//   MetricSums sums;
//   for (each batch) loss.Accumulate(output, y, &sums);
//   std::map<std::string, double> metrics = loss.Metrics(sums);
//   // {"val_loss": ..., "val_accuracy": ...} or
//   // {"val_loss": ..., "val_mae": ..., "val_mse": ...}
//
// Labels (worker/data/dataset.h) come in two kinds: int64 [N] class
// indices, or float32 [N, K] targets (one-hot rows for classification,
// regression targets otherwise; a float [N] is taken as [N, 1]). The model's
// output is [B, outputs] ([B] is taken as [B, 1]).
//
// The losses (categorical_crossentropy, binary_crossentropy, mse, mae,
// huber), their options (class weights, label smoothing, pos_weight, a
// TorchScript loss of the user's) and the metrics each reports:
// docs/protocol.md (`loss`, `loss_options`).
//
// Reduction: Summed and the loss in MetricSums add over every element of
// the batch, samples and outputs alike, so val_loss (the sum over samples)
// is per sample: the loss summed over a sample's outputs, averaged over
// samples. Accuracy, MAE and MSE average over every prediction (each output
// of each sample; per sample for categorical_crossentropy).
//
// Thread safety: a Loss is an immutable value; its methods are const and
// may be called from any thread.
#ifndef MPILEARN_WORKER_MODEL_LOSS_H_
#define MPILEARN_WORKER_MODEL_LOSS_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

// Per-batch sums from which the validation metrics follow; plain doubles so
// a group can add its ranks' sums with one AllreduceSum over ToVector().
struct MetricSums {
  // The doubles of one set of sums (without `heads`).
  static constexpr size_t kSize = 8;

  double loss = 0;       // Loss::Summed over every batch
  double correct = 0;    // correct predictions (classification)
  double abs_error = 0;  // sum of |output - target| (regression)
  double sq_error = 0;   // sum of (output - target)^2 (regression)
  double samples = 0;
  double elements = 0;  // predictions: what accuracy, MAE, MSE divide by
  // categorical_crossentropy over more than K classes (K the job's
  // loss_options.top_k, default 5): samples whose class is among the K
  // highest outputs, and the samples counted.
  double topk_correct = 0;
  double topk_samples = 0;
  // A model of several outputs: each output's own sums (`loss` above is
  // then the weighted total). Empty until the first Accumulate.
  std::vector<MetricSums> heads;

  // kSize values, then kSize per head.
  std::vector<double> ToVector() const;
  // The inverse of ToVector for sums of `heads` heads (values.size() must be
  // kSize * (1 + heads)).
  static MetricSums FromVector(absl::Span<const double> values, size_t heads);
};

// One labels set of data with several (worker/data/dataset.h's
// DataHeads::Labels): its columns in the packed float labels.
struct LabelSet {
  int64_t column = 0;
  int64_t columns = 1;
  bool class_indices = false;
  int64_t num_classes = 0;  // class indices: the classes; else `columns`
};

class Loss {
 public:
  // The loss `kind`, with `huber_delta` for huber. InvalidArgument for a
  // huber delta that is not a finite number > 0.
  static absl::StatusOr<Loss> Create(LossKind kind, double huber_delta);
  // The job's loss, with spec.huber_delta() (default 1.0) for huber and
  // its loss_options (a normalized spec's): class weights, label smoothing,
  // pos_weight, top_k, and a TorchScript loss loaded from its file
  // (NotFound, PermissionDenied or InvalidArgument naming the file when it
  // cannot be).
  static absl::StatusOr<Loss> FromConfig(const JobConfig& config);
  // `loss` with `options` (as FromConfig takes them from a spec).
  static absl::StatusOr<Loss> WithOptions(Loss loss, const v1::LossOptions& options);

  LossKind kind() const { return kind_; }
  // As specs write it: "categorical_crossentropy", ..., "huber".
  const std::string& name() const { return name_; }

  // True for the two cross entropies: labels are classes and the metric is
  // accuracy; false for the regression losses.
  bool classification() const { return InfoOf(kind_).classification; }

  // The outputs per sample a model needs for `labels` (a whole data set or
  // a batch): categorical_crossentropy: `num_classes` for int64 labels
  // (which must be >= 1), C for one-hot [N, C]; binary_crossentropy: K for
  // float [N, K], 1 for int64 labels (which must all be 0 or 1); mse, mae,
  // huber: K for float [N, K]. InvalidArgument for labels that do not fit
  // the loss (int64 labels for a regression loss, a label tensor of another
  // type or rank, an empty width).
  absl::StatusOr<int64_t> OutputsFor(const torch::Tensor& labels,
                                     int64_t num_classes) const;

  // OK when the model's `output` for a batch can go with the batch's
  // `labels`; else InvalidArgument naming both shapes and the loss, e.g.
  // "the model outputs [64, 5] per batch but categorical_crossentropy with
  // 10 classes needs [64, 10]". For int64 class labels pass the data's
  // `num_classes` to check the width exactly; with 0 the width must only
  // exceed the batch's largest label. With class weights, their count must
  // be the classes'; with pos_weight, 1 or the outputs'. A TorchScript loss
  // is run on (output, labels) and must return a finite-typed scalar.
  absl::Status CheckOutput(const torch::Tensor& output,
                           const torch::Tensor& labels,
                           int64_t num_classes = 0) const;

  // The loss summed over every element of the batch (see "Reduction"
  // above): a scalar tensor with `output`'s dtype that keeps its graph, for
  // backward. Requires CheckOutput(output, labels) to hold; LibTorch errors
  // otherwise surface as c10::Error.
  torch::Tensor Summed(const torch::Tensor& output,
                       const torch::Tensor& labels) const;

  // The metrics this loss reports besides val_loss: {"val_accuracy"} for
  // classification (and val_top<K>_accuracy for categorical_crossentropy
  // over more than K classes, val_auc for a single-output
  // binary_crossentropy: worker/evaluation.h), {"val_mae", "val_mse"} for
  // regression.
  std::vector<std::string> MetricNames() const;

  // Adds one batch's loss, sample count and metric sums to `sums` (no
  // gradients are needed; the caller may hold a NoGradGuard).
  void Accumulate(const torch::Tensor& output, const torch::Tensor& labels,
                  MetricSums* sums) const;

  // {"val_loss": loss / samples} plus every name in MetricNames(); all 0
  // when `sums` holds no samples.
  std::map<std::string, double> Metrics(const MetricSums& sums) const;

  // The k of the top-k accuracy (loss_options.top_k, default 5).
  int top_k() const { return top_k_; }

  // A model of several outputs (JobSpec.outputs): each output's loss, its
  // weight and, once BindLabels has run, its labels' and output's columns.
  // The labels are the packed float [B, L] (DataHeads), the output the
  // model's outputs side by side [B, W]; Summed is the weighted sum of the
  // outputs' losses, and Metrics reports val_loss (that sum per sample) and
  // each output's metrics as val_<name>_loss, val_<name>_accuracy, ...
  struct Head {
    std::string name;
    double weight = 1.0;
    std::shared_ptr<const Loss> loss;
    LabelSet labels;
    int64_t output_column = 0;
    int64_t output_width = 0;
  };
  bool multi() const { return !heads_.empty(); }
  const std::vector<Head>& heads() const { return heads_; }
  // Gives each head its labels set (one per head, in order) and its output
  // width (as OutputsFor: the classes for categorical_crossentropy over
  // class indices, 1 for binary_crossentropy over 0/1 indices, else the
  // set's columns). InvalidArgument naming the output for a count that
  // differs or labels its loss cannot take (class indices for a regression
  // loss).
  absl::Status BindLabels(const std::vector<LabelSet>& sets);
  // Head `head`'s part of a batch's packed labels: int64 [B] class indices
  // or float [B, K]; and of the model's output, [B, width].
  torch::Tensor HeadLabels(const torch::Tensor& labels, size_t head) const;
  torch::Tensor HeadOutput(const torch::Tensor& output, size_t head) const;

 private:
  Loss(LossKind kind, double huber_delta)
      : kind_(kind), name_(InfoOf(kind).name), huber_delta_(huber_delta) {}

  // `values` as a float tensor on `like`'s device and of its dtype.
  static torch::Tensor OnDeviceOf(const std::vector<float>& values, const torch::Tensor& like);

  // `labels` as float targets [B, K] for the binary and regression losses.
  static torch::Tensor Targets(const torch::Tensor& labels,
                               const torch::Tensor& output);
  // `output` as [B, n] ([B] -> [B, 1]).
  static torch::Tensor AsMatrix(const torch::Tensor& output);

  LossKind kind_;
  std::string name_;
  double huber_delta_;  // huber only
  // loss_options: empty weights when not given.
  std::vector<float> class_weights_;
  double label_smoothing_ = 0.0;
  std::vector<float> pos_weight_;
  int top_k_ = 5;
  // A TorchScript loss (loss_options.torchscript) and its path, for
  // messages; running it does not change the module, so the shared
  // pointer keeps a Loss a value.
  std::shared_ptr<torch::jit::Module> script_;
  std::string script_path_;
  // Several outputs: kind_ is then the first output's, name_ the outputs'
  // losses joined by " + ".
  std::vector<Head> heads_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MODEL_LOSS_H_
