#include "worker/model/loss.h"

#include <cmath>

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

std::array<double, MetricSums::kSize> MetricSums::ToArray() const {
  return {loss, correct, abs_error, sq_error, samples, elements, topk_correct, topk_samples};
}

MetricSums MetricSums::FromArray(const std::array<double, kSize>& values) {
  MetricSums sums;
  sums.loss = values[0];
  sums.correct = values[1];
  sums.abs_error = values[2];
  sums.sq_error = values[3];
  sums.samples = values[4];
  sums.elements = values[5];
  sums.topk_correct = values[6];
  sums.topk_samples = values[7];
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

absl::StatusOr<int64_t> Loss::OutputsFor(const torch::Tensor& labels,
                                         int64_t num_classes) const {
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
  if (classification()) return {"val_accuracy"};
  return {"val_mae", "val_mse"};
}

void Loss::Accumulate(const torch::Tensor& output, const torch::Tensor& labels,
                      MetricSums* sums) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor out = AsMatrix(output);
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
