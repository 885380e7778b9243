#include "worker/model/job_model.h"

#include <cmath>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::worker {

namespace {

// warm_start.torchscript: the file's parameters and float buffers, checked
// against the model's `layout`, become the model's state.
absl::Status WarmStartFromTorchScript(const std::string& path, const v1::TensorSetHeader& layout,
                                      Model& model) {
  MPILEARN_ASSIGN_OR_RETURN(Model source, Model::Load(path, "warm_start.torchscript"));
  std::vector<std::vector<int64_t>> shapes;
  for (const torch::Tensor& t : source.state()) shapes.push_back(t.sizes().vec());
  MPILEARN_RETURN_IF_ERROR(
      CheckWarmStartLayout(MakeFloat32Header(0, source.state_names(), shapes), layout,
                           absl::StrCat("TorchScript file '", path, "'")));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < source.state().size(); ++i) {
    model.state()[i].copy_(source.state()[i]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobModel> BuildJobModel(const JobConfig& config,
                                       const DatasetSplits& data) {
  const v1::JobSpec& spec = config.spec();
  MPILEARN_ASSIGN_OR_RETURN(Loss loss, Loss::FromConfig(config));
  if (loss.multi()) {
    std::vector<LabelSet> sets;
    for (const DataHeads::Labels& labels : data.heads.labels) {
      sets.push_back({labels.column, labels.columns, labels.class_indices, labels.num_classes});
    }
    if (sets.empty()) {  // one labels dataset, as read
      sets.push_back({0, data.float_labels ? data.num_classes : 1, !data.float_labels,
                      data.num_classes});
    }
    MPILEARN_RETURN_IF_ERROR(loss.BindLabels(sets));
  }
  MPILEARN_ASSIGN_OR_RETURN(const int64_t outputs,
                            loss.OutputsFor(data.train.labels, data.num_classes));
  // Building allocates the weights: a model too large for this host (a
  // huge `hidden`) throws from LibTorch. The error goes back to the caller,
  // which leaves the job with it, instead of ending the process.
  std::optional<Model> built;
  try {
    MPILEARN_ASSIGN_OR_RETURN(
        built, Model::FromSpec(spec.model(), data.input_shape, outputs, data.heads.inputs));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate the model's weights on this worker (", e.what(),
        "): make the model smaller (model.hidden, model.channels)"));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot build the model on this worker: ", ShortExceptionMessage(e),
        " (is the model too large? make it smaller: model.hidden, "
        "model.channels)"));
  }
  Model model = *std::move(built);
  std::vector<std::vector<int64_t>> shapes;
  for (const torch::Tensor& t : model.state()) {
    shapes.emplace_back(t.sizes().begin(), t.sizes().end());
  }
  v1::TensorSetHeader layout = MakeFloat32Header(0, model.state_names(), shapes);
  for (size_t i = model.num_parameters(); i < model.state().size(); ++i) {
    layout.mutable_tensors(static_cast<int>(i))->set_buffer(true);
  }
  for (int64_t d : data.input_shape) layout.add_input_shape(d);
  layout.set_outputs(outputs);
  for (const std::vector<int64_t>& input : data.heads.inputs) {
    layout.add_inputs()->mutable_dims()->Add(input.begin(), input.end());
  }
  if (!spec.warm_start().torchscript().empty()) {
    MPILEARN_RETURN_IF_ERROR(WarmStartFromTorchScript(spec.warm_start().torchscript(), layout, model));
  }
  return JobModel{std::move(model), std::move(loss), std::move(layout),
                  data.num_classes};
}

namespace {

// After a forward: a model returning a tuple returns one tensor per output
// of the job, each as wide as that output needs (a model returning one
// tensor is checked as a whole by Loss::CheckOutput).
absl::Status CheckOutputCount(const JobModel& job) {
  const std::vector<int64_t>& widths = job.model.output_widths();
  if (widths.empty()) return absl::OkStatus();
  const std::vector<Loss::Head>& heads = job.loss.heads();
  if (!job.loss.multi()) {
    if (widths.size() == 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the model returns ", widths.size(),
        " outputs but the job has one loss: give the job one entry in outputs per output (and "
        "data.labels_datasets one labels dataset per output)"));
  }
  std::vector<std::string> want;
  bool same = widths.size() == heads.size();
  for (size_t j = 0; j < heads.size(); ++j) {
    want.push_back(absl::StrCat(heads[j].name, " ", heads[j].output_width));
    same = same && widths[j] == heads[j].output_width;
  }
  if (same) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the model returns ", widths.size(), " outputs of widths [", absl::StrJoin(widths, ", "),
      "] per sample but the job's outputs need ", heads.size(), ": [", absl::StrJoin(want, ", "),
      "] (in the order of outputs and data.labels_datasets)"));
}

}  // namespace

absl::Status Preflight(JobModel& job, const Dataset& train, int64_t batch) {
  if (train.size() == 0) return absl::OkStatus();
  const int64_t n = std::min(train.size(), std::max<int64_t>(1, batch));
  const torch::Tensor x = train.features.slice(0, 0, n);
  const torch::Tensor y = train.labels.slice(0, 0, n);
  // A forward in training mode moves BatchNorm's running statistics: keep
  // the state to put it back.
  std::vector<torch::Tensor> saved;
  for (const torch::Tensor& t : job.model.state()) saved.push_back(t.clone());
  absl::Status status = absl::OkStatus();
  try {
    job.model.SetTraining(true);
    const torch::Tensor output = job.model.Forward(x);
    const torch::Tensor labels = y.to(output.device());
    status = CheckOutputCount(job);
    if (status.ok()) status = job.loss.CheckOutput(output, labels, job.num_classes);
    if (status.ok()) {
      const torch::Tensor loss = job.loss.Summed(output, labels);
      const double value = loss.item<double>();
      if (!std::isfinite(value)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "the loss of the first batch is ", value,
            ": check the data's scale (normalize the features) and the "
            "labels for the loss '", job.loss.name(), "'"));
      } else {
        loss.backward();
      }
    }
  } catch (const std::exception& e) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "the model's first forward/backward pass on samples of shape [",
        absl::StrJoin(x.sizes(), ", "), "] failed: ", ShortExceptionMessage(e)));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < saved.size(); ++i) job.model.state()[i].copy_(saved[i]);
  for (const torch::Tensor& p : job.model.parameters()) {
    if (p.grad().defined()) p.grad().zero_();
  }
  return status;
}

}  // namespace mpilearn::worker
