// The spec of a model with several outputs (JobSpec.outputs), and the
// validation metrics a job reports, which the stop rules, checkpoints and
// studies name.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_internal.h"
#include "common/spec/spec_kinds.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace spec_internal {
namespace {

constexpr int kMaxOutputs = 16;
constexpr size_t kMaxOutputName = 32;

// Lowercase letters, digits and '_', starting with a letter.
bool IsOutputName(const std::string& name) {
  if (name.empty() || name.size() > kMaxOutputName || !absl::ascii_islower(name[0])) return false;
  for (const char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

// The metrics besides the loss that a loss `loss` reports, as suffixes of
// "val_" or "val_<output>_": "accuracy", "auc", "top5_accuracy", "mae", ...
std::vector<std::string> MetricSuffixes(const std::string& loss, int top_k) {
  if (!IsClassificationLoss(loss)) return {"mae", "mse"};
  if (loss == "binary_crossentropy") return {"accuracy", "auc"};
  return {"accuracy", absl::StrCat("top", top_k, "_accuracy")};
}

int TopKOfOptions(const v1::LossOptions& options) {
  return options.has_top_k() ? options.top_k() : kDefaultTopK;
}

absl::Status NormalizeOutputs(v1::JobSpec* spec) {
  if (spec->outputs_size() > kMaxOutputs) {
    return absl::InvalidArgumentError(absl::StrCat("outputs: at most ", kMaxOutputs,
                                                   " outputs, got ", spec->outputs_size()));
  }
  if (!spec->loss().empty() || spec->has_huber_delta() || spec->has_loss_options()) {
    return absl::InvalidArgumentError(
        "outputs gives each output its loss: leave loss, huber_delta and loss_options out of "
        "the job and set them in outputs[i] (loss, huber_delta, loss_options)");
  }
  std::set<std::string> names;
  bool any_weight = false;
  for (int i = 0; i < spec->outputs_size(); ++i) {
    v1::OutputSpec& output = *spec->mutable_outputs(i);
    const std::string at = absl::StrCat("outputs[", i, "].");
    if (output.name().empty()) output.set_name(absl::StrCat("out", i));
    if (!IsOutputName(output.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, "name '", absl::CHexEscape(output.name().substr(0, 64)),
          "' must be 1 to 32 lowercase letters, digits and '_', starting with a letter (it "
          "names the output's metrics: val_<name>_loss, ...)"));
    }
    if (!names.insert(output.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "name '", output.name(), "' is also an earlier output's"));
    }
    if (output.loss().empty()) {
      output.set_loss(std::string(InfoOf(LossKind::kCategoricalCrossentropy).name));
    }
    const std::optional<LossKind> loss = LossKindFromName(output.loss());
    if (!loss) {
      return UnknownName(absl::StrCat(at, "loss"), "loss", output.loss(), LossNames());
    }
    if (*loss == LossKind::kHuber) {
      if (!output.has_huber_delta()) output.set_huber_delta(1.0);
      MPILEARN_RETURN_IF_ERROR(
          CheckPositiveFinite(absl::StrCat(at, "huber_delta"), output.huber_delta()));
    } else if (output.has_huber_delta()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "huber_delta applies to the huber loss only; this output's loss is '",
                       output.loss(), "'"));
    }
    if (!output.has_weight()) output.set_weight(1.0);
    MPILEARN_RETURN_IF_ERROR(CheckNonNegativeFinite(absl::StrCat(at, "weight"), output.weight()));
    any_weight = any_weight || output.weight() > 0;
    MPILEARN_RETURN_IF_ERROR(
        NormalizeLossOptions(*loss, output.loss(), output.loss_options(), "this output", at));
  }
  if (!any_weight) {
    return absl::InvalidArgumentError(
        "outputs: every weight is 0; at least one output must count in the training loss");
  }
  return absl::OkStatus();
}

absl::Status CheckOutputsMatchData(const v1::JobSpec& spec) {
  const v1::DataSpec& data = spec.data();
  const int labels = data.labels_datasets_size();
  if (spec.outputs_size() == 0) {
    if (labels > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.labels_datasets names ", labels,
          " datasets: give the job one entry in outputs per labels dataset (its name, loss and "
          "weight)"));
    }
    return absl::OkStatus();
  }
  if (data.train_files().empty()) {
    return absl::InvalidArgumentError(
        "outputs needs file-list data (data.train_files, with data.labels_datasets naming one "
        "labels dataset per output)");
  }
  const int datasets = labels == 0 ? 1 : labels;
  if (spec.outputs_size() != datasets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outputs has ", spec.outputs_size(), " entries but the data has ", datasets,
        " labels dataset", datasets == 1 ? "" : "s",
        " (data.labels_datasets); give one output per labels dataset, in the same order"));
  }
  return absl::OkStatus();
}

absl::Status CheckMetric(absl::string_view field, const std::string& metric,
                         const v1::JobSpec& spec, bool none_ok) {
  const std::vector<std::string> reported = ReportedMetrics(spec);
  if (none_ok && metric == "none") return absl::OkStatus();
  std::vector<std::string> quoted;
  for (const std::string& name : reported) {
    if (metric == name) return absl::OkStatus();
    const std::optional<int> k = TopKOfMetric(name);
    quoted.push_back(k.has_value() ? absl::StrCat("'", name, "' (over ", *k, "+ classes)")
                                   : absl::StrCat("'", name, "'"));
  }
  const bool single = spec.outputs_size() == 0;
  const std::string owner =
      single ? absl::StrCat("loss '", spec.loss(), "'") : std::string("this job's outputs");
  const std::string list = absl::StrJoin(quoted, ", ");
  if (single && metric == "val_accuracy") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": val_accuracy needs a classification loss "
               "(categorical_crossentropy or binary_crossentropy); ",
        owner, " reports ", list));
  }
  if (single && (metric == "val_mae" || metric == "val_mse")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", metric, " needs a regression loss (mse, mae or huber); ", owner,
        " reports ", list));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown metric '", metric, "'; available: ", list, " (the metrics ",
                   owner, single ? " reports)" : " report)", none_ok ? " or 'none'" : ""));
}

}  // namespace spec_internal

std::vector<std::string> ReportedMetrics(const v1::JobSpec& spec) {
  std::vector<std::string> metrics = {"val_loss"};
  if (spec.outputs_size() == 0) {
    for (const std::string& suffix :
         spec_internal::MetricSuffixes(spec.loss().empty() ? "categorical_crossentropy" : spec.loss(),
                        spec_internal::TopKOfOptions(spec.loss_options()))) {
      metrics.push_back(absl::StrCat("val_", suffix));
    }
    return metrics;
  }
  for (const v1::OutputSpec& output : spec.outputs()) {
    const std::string prefix = absl::StrCat("val_", output.name(), "_");
    metrics.push_back(absl::StrCat(prefix, "loss"));
    for (const std::string& suffix :
         spec_internal::MetricSuffixes(output.loss().empty() ? "categorical_crossentropy" : output.loss(),
                        spec_internal::TopKOfOptions(output.loss_options()))) {
      metrics.push_back(absl::StrCat(prefix, suffix));
    }
  }
  return metrics;
}

}  // namespace mpilearn
