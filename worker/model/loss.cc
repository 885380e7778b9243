#include "worker/model/loss.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec.h"
#include "worker/model/torchscript_file.h"

namespace mpilearn::worker {
namespace {

namespace F = torch::nn::functional;

// "[64, 10]".
std::string ShapeString(const torch::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.sizes(), ", "), "]");
}

// What a label tensor holds.
struct LabelKind {
  bool indices = false;  // int64 [N] class indices
  int64_t width = 0;     // K of float [N, K] targets (1 for float [N])
};

absl::StatusOr<LabelKind> KindOf(const torch::Tensor& labels) {
  if (!labels.defined()) {
    return absl::InvalidArgumentError("the labels are empty (no samples)");
  }
  LabelKind kind;
  if (labels.scalar_type() == torch::kLong && labels.dim() == 1) {
    kind.indices = true;
    return kind;
  }
  if (labels.is_floating_point() && (labels.dim() == 1 || labels.dim() == 2)) {
    kind.width = labels.dim() == 1 ? 1 : labels.size(1);
    if (kind.width < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the targets ", ShapeString(labels), " have no values per sample"));
    }
    return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "labels must be int64 [N] class indices or float32 [N, K] targets, got ",
      c10::toString(labels.scalar_type()), " ", ShapeString(labels)));
}

double Ratio(double sum, double count) { return count > 0 ? sum / count : 0.0; }

constexpr char kScriptHowTo[] =
    "script a torch.nn.Module whose forward(output, labels) returns the batch's mean loss "
    "(torch.jit.script, then .save; docs/torchscript.md)";

}  // namespace

std::vector<double> MetricSums::ToVector() const {
  std::vector<double> values = {loss,     correct,  abs_error,    sq_error,
                                samples,  elements, topk_correct, topk_samples};
  for (const MetricSums& head : heads) {
    const std::vector<double> more = head.ToVector();
    values.insert(values.end(), more.begin(), more.end());
  }
  return values;
}

MetricSums MetricSums::FromVector(absl::Span<const double> values, size_t heads) {
  MetricSums sums;
  sums.loss = values[0];
  sums.correct = values[1];
  sums.abs_error = values[2];
  sums.sq_error = values[3];
  sums.samples = values[4];
  sums.elements = values[5];
  sums.topk_correct = values[6];
  sums.topk_samples = values[7];
  for (size_t j = 0; j < heads; ++j) {
    sums.heads.push_back(FromVector(values.subspan(kSize * (j + 1), kSize), 0));
  }
  return sums;
}

absl::StatusOr<Loss> Loss::Create(LossKind kind, double huber_delta) {
  if (kind == LossKind::kHuber &&
      !(std::isfinite(huber_delta) && huber_delta > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "huber_delta must be a finite number > 0, got ", huber_delta));
  }
  return Loss(kind, huber_delta);
}

absl::StatusOr<Loss> Loss::FromConfig(const JobConfig& config) {
  const v1::JobSpec& spec = config.spec();
  if (spec.outputs_size() > 0) {
    std::vector<Head> heads;
    std::vector<std::string> names;
    for (int i = 0; i < spec.outputs_size(); ++i) {
      const v1::OutputSpec& output = spec.outputs(i);
      const std::optional<LossKind> kind =
          LossKindFromName(output.loss().empty() ? "categorical_crossentropy" : output.loss());
      if (!kind) {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs[", i, "].loss: unknown loss '", output.loss(), "'"));
      }
      absl::StatusOr<Loss> loss =
          Create(*kind, output.has_huber_delta() ? output.huber_delta() : 1.0);
      if (loss.ok()) loss = WithOptions(*std::move(loss), output.loss_options());
      if (!loss.ok()) {
        return absl::Status(loss.status().code(), absl::StrCat("outputs[", i, "] ('",
                                                               output.name(), "'): ",
                                                               loss.status().message()));
      }
      Head head;
      head.name = output.name().empty() ? absl::StrCat("out", i) : output.name();
      head.weight = output.has_weight() ? output.weight() : 1.0;
      head.loss = std::make_shared<const Loss>(*std::move(loss));
      names.push_back(head.loss->name());
      heads.push_back(std::move(head));
    }
    Loss loss(heads[0].loss->kind(), 1.0);
    loss.name_ = absl::StrJoin(names, " + ");
    loss.heads_ = std::move(heads);
    return loss;
  }
  absl::StatusOr<Loss> loss =
      Create(config.loss(), spec.has_huber_delta() ? spec.huber_delta() : 1.0);
  if (!loss.ok()) return loss.status();
  return WithOptions(*std::move(loss), spec.loss_options());
}

absl::StatusOr<Loss> Loss::WithOptions(Loss loss, const v1::LossOptions& options) {
  loss.class_weights_.assign(options.class_weights().begin(), options.class_weights().end());
  loss.label_smoothing_ = options.label_smoothing();
  loss.pos_weight_.assign(options.pos_weight().begin(), options.pos_weight().end());
  if (options.has_top_k()) loss.top_k_ = options.top_k();
  if (!options.torchscript().empty()) {
    absl::StatusOr<torch::jit::Module> script =
        LoadTorchScriptFile(options.torchscript(), "loss_options.torchscript", kScriptHowTo);
    if (!script.ok()) return script.status();
    script->eval();
    loss.script_ = std::make_shared<torch::jit::Module>(*std::move(script));
    loss.script_path_ = options.torchscript();
  }
  return loss;
}

torch::Tensor Loss::OnDeviceOf(const std::vector<float>& values, const torch::Tensor& like) {
  return torch::tensor(values, torch::kFloat32).to(like.device(), like.scalar_type());
}

absl::Status Loss::BindLabels(const std::vector<LabelSet>& sets) {
  if (sets.size() != heads_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job has ", heads_.size(), " outputs but the data ", sets.size(),
        " labels datasets (data.labels_datasets); give one output per labels dataset"));
  }
  int64_t column = 0;
  for (size_t j = 0; j < heads_.size(); ++j) {
    Head& head = heads_[j];
    const LossKind kind = head.loss->kind();
    head.labels = sets[j];
    head.output_column = column;
    if (sets[j].class_indices) {
      if (!head.loss->classification()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output '", head.name, "': its labels are class indices (an integer dataset) but ",
            head.loss->name(), " needs float targets; store them as floats or use a "
            "classification loss"));
      }
      head.output_width =
          kind == LossKind::kCategoricalCrossentropy ? std::max<int64_t>(sets[j].num_classes, 1) : 1;
    } else {
      head.output_width = sets[j].columns;
    }
    column += head.output_width;
  }
  return absl::OkStatus();
}

torch::Tensor Loss::HeadLabels(const torch::Tensor& labels, size_t head) const {
  const LabelSet& set = heads_[head].labels;
  // One labels set is not packed: int64 [B] or float [B, K] as read.
  if (set.class_indices) {
    return labels.dim() == 1 ? labels : labels.select(1, set.column).to(torch::kLong);
  }
  return labels.narrow(1, set.column, set.columns);
}

torch::Tensor Loss::HeadOutput(const torch::Tensor& output, size_t head) const {
  return AsMatrix(output).narrow(1, heads_[head].output_column, heads_[head].output_width);
}

absl::StatusOr<int64_t> Loss::OutputsFor(const torch::Tensor& labels,
                                         int64_t num_classes) const {
  if (multi()) {
    if (heads_.back().output_width == 0) {
      return absl::InternalError("a loss of several outputs needs BindLabels first");
    }
    return heads_.back().output_column + heads_.back().output_width;
  }
  absl::StatusOr<LabelKind> kind = KindOf(labels);
  if (!kind.ok()) return kind.status();
  if (!kind->indices) return kind->width;
  switch (kind_) {
    case LossKind::kCategoricalCrossentropy:
      if (num_classes < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "categorical_crossentropy needs at least 1 class, got ",
            num_classes));
      }
      return num_classes;
    case LossKind::kBinaryCrossentropy:
      if (labels.numel() > 0 && (labels.min().item<int64_t>() < 0 ||
                                 labels.max().item<int64_t>() > 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "binary_crossentropy needs labels 0 or 1, got labels from ",
            labels.min().item<int64_t>(), " to ", labels.max().item<int64_t>(),
            "; use categorical_crossentropy for more classes"));
      }
      return 1;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          name_,
          " is a regression loss and needs float targets (e.g. IDX float32 "
          "labels [N, K]), but the labels are int64 class indices; use "
          "categorical_crossentropy or binary_crossentropy for classes"));
  }
}

absl::Status Loss::CheckOutput(const torch::Tensor& output,
                               const torch::Tensor& labels,
                               int64_t num_classes) const {
  if (multi()) {
    const int64_t width = heads_.back().output_column + heads_.back().output_width;
    const int64_t batch = labels.size(0);
    if (!output.defined() || !output.is_floating_point() || output.dim() != 2 ||
        output.size(0) != batch || output.size(1) != width) {
      std::vector<std::string> wants;
      for (const Head& head : heads_) {
        wants.push_back(absl::StrCat(head.name, " ", head.output_width));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "the model outputs ", output.defined() ? ShapeString(output) : "nothing",
          " per batch (its outputs side by side) but the job's outputs need [", batch, ", ",
          width, "] (", absl::StrJoin(wants, ", "), ")"));
    }
    for (size_t j = 0; j < heads_.size(); ++j) {
      const Head& head = heads_[j];
      const absl::Status status = head.loss->CheckOutput(
          HeadOutput(output, j), HeadLabels(labels, j),
          head.labels.class_indices ? head.labels.num_classes : 0);
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("output '", head.name, "': ", status.message()));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<LabelKind> kind = KindOf(labels);
  if (!kind.ok()) return kind.status();
  const int64_t batch = labels.size(0);
  int64_t needed = kind->width;
  bool at_least = false;  // the output may be wider than `needed`
  std::string what;       // "categorical_crossentropy with 10 classes"
  if (kind->indices && kind_ == LossKind::kCategoricalCrossentropy) {
    if (num_classes > 0) {
      needed = num_classes;
      what = absl::StrCat(name_, " with ", num_classes, " classes");
    } else {
      const int64_t largest =
          labels.numel() > 0 ? labels.max().item<int64_t>() : 0;
      needed = largest + 1;
      at_least = true;
      what = absl::StrCat(name_, " with labels up to ", largest);
    }
  } else if (kind->indices && kind_ == LossKind::kBinaryCrossentropy) {
    needed = 1;
    what = absl::StrCat(name_, " with 0/1 labels");
  } else if (kind->indices) {
    return OutputsFor(labels, num_classes).status();  // regression: refused
  } else {
    what = absl::StrCat(
        name_, " with ",
        kind_ == LossKind::kCategoricalCrossentropy ? "one-hot targets " : "targets ",
        ShapeString(labels));
  }
  if (!output.defined() || !output.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model outputs ",
        output.defined() ? c10::toString(output.scalar_type()) : "nothing",
        " but ", name_, " needs floating-point outputs"));
  }
  const bool fits =
      (output.dim() == 2 && output.size(0) == batch &&
       (at_least ? output.size(1) >= needed : output.size(1) == needed)) ||
      (needed == 1 && output.dim() == 1 && output.size(0) == batch);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model outputs ", ShapeString(output), " per batch but ", what,
        " needs [", batch, ", ", at_least ? ">= " : "", needed, "]",
        needed == 1 ? absl::StrCat(" (or [", batch, "])") : ""));
  }
  const int64_t width = AsMatrix(output).size(1);
  if (!class_weights_.empty() && kind_ == LossKind::kCategoricalCrossentropy &&
      static_cast<int64_t>(class_weights_.size()) != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_options.class_weights has ", class_weights_.size(), " values but the model scores ",
        width, " classes; give one weight per class"));
  }
  if (!pos_weight_.empty() && kind_ == LossKind::kBinaryCrossentropy &&
      pos_weight_.size() != 1 && static_cast<int64_t>(pos_weight_.size()) != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_options.pos_weight has ", pos_weight_.size(), " values but the model has ", width,
        " outputs; give one value, or one per output"));
  }
  if (script_ == nullptr) return absl::OkStatus();
  const std::string on = absl::StrCat("output ", ShapeString(output), " ",
                                      c10::toString(output.scalar_type()), " and labels ",
                                      ShapeString(labels), " ",
                                      c10::toString(labels.scalar_type()));
  try {
    const c10::IValue result = script_->forward({output, labels});
    if (!result.isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss_options.torchscript: '", script_path_, "' returned ", result.tagKind(),
          " for ", on, "; ", kScriptHowTo));
    }
    const torch::Tensor value = result.toTensor();
    if (value.numel() != 1 || !value.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss_options.torchscript: '", script_path_, "' returned ", ShapeString(value), " ",
          c10::toString(value.scalar_type()), " for ", on,
          "; it must return one floating-point value, the batch's mean loss"));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("loss_options.torchscript: '", script_path_,
                                                   "' failed on ", on, ": ", ShortExceptionMessage(e)));
  }
  return absl::OkStatus();
}

torch::Tensor Loss::AsMatrix(const torch::Tensor& output) {
  return output.dim() == 1 ? output.unsqueeze(1) : output;
}

torch::Tensor Loss::Targets(const torch::Tensor& labels,
                            const torch::Tensor& output) {
  const int64_t width =
      labels.dim() == 1 || labels.scalar_type() == torch::kLong
          ? 1
          : labels.size(1);
  return labels.to(output.scalar_type()).reshape({labels.size(0), width});
}

torch::Tensor Loss::Summed(const torch::Tensor& output,
                           const torch::Tensor& labels) const {
  if (multi()) {
    torch::Tensor total;
    for (size_t j = 0; j < heads_.size(); ++j) {
      const torch::Tensor part =
          heads_[j].loss->Summed(HeadOutput(output, j), HeadLabels(labels, j)) * heads_[j].weight;
      total = total.defined() ? total + part : part;
    }
    return total;
  }
  if (script_ != nullptr) {
    // The script's mean over the batch, as a sum.
    return script_->forward({output, labels}).toTensor().reshape({}) *
           static_cast<double>(labels.size(0));
  }
  const torch::Tensor out = AsMatrix(output);
  switch (kind_) {
    case LossKind::kCategoricalCrossentropy: {
      // Float targets are class probabilities (LibTorch's soft-target cross
      // entropy); int64 ones class indices.
      F::CrossEntropyFuncOptions options =
          F::CrossEntropyFuncOptions().reduction(torch::kSum).label_smoothing(label_smoothing_);
      if (!class_weights_.empty()) options.weight(OnDeviceOf(class_weights_, out));
      return F::cross_entropy(
          out, labels.scalar_type() == torch::kLong ? labels : Targets(labels, out), options);
    }
    case LossKind::kBinaryCrossentropy: {
      F::BinaryCrossEntropyWithLogitsFuncOptions options =
          F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum);
      if (!pos_weight_.empty()) options.pos_weight(OnDeviceOf(pos_weight_, out));
      return F::binary_cross_entropy_with_logits(out, Targets(labels, out), options);
    }
    case LossKind::kMse:
      return F::mse_loss(out, Targets(labels, out),
                         F::MSELossFuncOptions().reduction(torch::kSum));
    case LossKind::kMae:
      return F::l1_loss(out, Targets(labels, out),
                        F::L1LossFuncOptions().reduction(torch::kSum));
    case LossKind::kHuber:
      return F::huber_loss(
          out, Targets(labels, out),
          F::HuberLossFuncOptions().reduction(torch::kSum).delta(huber_delta_));
  }
  return {};  // unreachable: every kind is handled above
}

std::vector<std::string> Loss::MetricNames() const {
  if (multi()) {
    std::vector<std::string> names;
    for (const Head& head : heads_) {
      names.push_back(absl::StrCat("val_", head.name, "_loss"));
      for (const std::string& name : head.loss->MetricNames()) {
        names.push_back(absl::StrCat("val_", head.name, "_", name.substr(4)));
      }
    }
    return names;
  }
  if (classification()) return {"val_accuracy"};
  return {"val_mae", "val_mse"};
}

void Loss::Accumulate(const torch::Tensor& output, const torch::Tensor& labels,
                      MetricSums* sums) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor out = AsMatrix(output);
  if (multi()) {
    sums->heads.resize(heads_.size());
    double total = 0;
    for (size_t j = 0; j < heads_.size(); ++j) {
      MetricSums& head = sums->heads[j];
      const double before = head.loss;
      heads_[j].loss->Accumulate(HeadOutput(output, j), HeadLabels(labels, j), &head);
      total += heads_[j].weight * (head.loss - before);
    }
    sums->loss += total;
    sums->samples += static_cast<double>(out.size(0));
    return;
  }
  sums->loss += Summed(output, labels).item<double>();
  sums->samples += static_cast<double>(out.size(0));
  if (kind_ == LossKind::kCategoricalCrossentropy) {
    const torch::Tensor classes =
        labels.scalar_type() == torch::kLong ? labels : labels.argmax(1);
    sums->correct += out.argmax(1).eq(classes).sum().item<double>();
    sums->elements += static_cast<double>(out.size(0));
    if (out.size(1) > top_k_) {
      const torch::Tensor top = std::get<1>(out.topk(top_k_, /*dim=*/1));
      sums->topk_correct += top.eq(classes.unsqueeze(1)).any(1).sum().item<double>();
      sums->topk_samples += static_cast<double>(out.size(0));
    }
  } else if (kind_ == LossKind::kBinaryCrossentropy) {
    const torch::Tensor targets = Targets(labels, out);
    sums->correct += out.gt(0).eq(targets.gt(0.5)).sum().item<double>();
    sums->elements += static_cast<double>(targets.numel());
  } else {
    const torch::Tensor error =
        out.to(torch::kDouble) - Targets(labels, out).to(torch::kDouble);
    sums->abs_error += error.abs().sum().item<double>();
    sums->sq_error += error.square().sum().item<double>();
    sums->elements += static_cast<double>(error.numel());
  }
}

std::map<std::string, double> Loss::Metrics(const MetricSums& sums) const {
  std::map<std::string, double> metrics;
  metrics["val_loss"] = Ratio(sums.loss, sums.samples);
  if (multi()) {
    for (size_t j = 0; j < heads_.size(); ++j) {
      const MetricSums none;
      const MetricSums& head = j < sums.heads.size() ? sums.heads[j] : none;
      for (const auto& [name, value] : heads_[j].loss->Metrics(head)) {
        // "val_accuracy" -> "val_<name>_accuracy".
        metrics[absl::StrCat("val_", heads_[j].name, "_", name.substr(4))] = value;
      }
    }
    return metrics;
  }
  if (classification()) {
    metrics["val_accuracy"] = Ratio(sums.correct, sums.elements);
    if (sums.topk_samples > 0) {
      metrics[TopKMetricName(top_k_)] = Ratio(sums.topk_correct, sums.topk_samples);
    }
  } else {
    metrics["val_mae"] = Ratio(sums.abs_error, sums.elements);
    metrics["val_mse"] = Ratio(sums.sq_error, sums.elements);
  }
  return metrics;
}

}  // namespace mpilearn::worker
