#include "tools/cli/opt_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/spec/job_spec.h"
#include "google/protobuf/util/json_util.h"
#include "tools/cli/ctl_format.h"
#include "tools/cli/json_text.h"

namespace mpilearn::opt {
namespace {

constexpr char kNone[] = "-";

// Widths of the trial table's columns before PARAMS, the last and unpadded
// one: TRIAL, STATE (the longest state is 9), EPOCHS, VALUE (%.4g of a
// negative number with an exponent is 10) and BEST.
constexpr int kTrialColumnWidths[] = {5, 9, 6, 10, 4};

// Values this large print in exponent form rather than as integers.
constexpr double kLargestIntegerShown = 1e15;

bool IsIntegral(double value) {
  return std::isfinite(value) && value == std::trunc(value) &&
         std::fabs(value) < kLargestIntegerShown;
}

std::string NonFinite(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

// 64, 0.0031, 1e-05.
std::string CompactNumber(double value) {
  if (IsIntegral(value)) return absl::StrFormat("%.0f", value);
  if (!std::isfinite(value)) return NonFinite(value);
  return absl::StrFormat("%.4g", value);
}

// The shortest of %.15g, %.16g and %.17g that reads back as `value`.
std::string ExactNumber(double value) {
  if (IsIntegral(value)) return absl::StrFormat("%.0f", value);
  if (!std::isfinite(value)) return NonFinite(value);
  std::string text;
  for (int digits = 15; digits <= 17; ++digits) {
    text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) break;
  }
  return text;
}

using tools::JsonQuoted;

// A Value as text; `exact` picks ExactNumber over CompactNumber and quotes
// strings nested in lists and structs.
std::string ValueText(const google::protobuf::Value& value, bool exact,
                      bool nested) {
  switch (value.kind_case()) {
    case google::protobuf::Value::kNumberValue:
      return exact ? ExactNumber(value.number_value())
                   : CompactNumber(value.number_value());
    case google::protobuf::Value::kStringValue:
      return exact && nested ? JsonQuoted(value.string_value())
                             : value.string_value();
    case google::protobuf::Value::kBoolValue:
      return value.bool_value() ? "true" : "false";
    case google::protobuf::Value::kNullValue:
      return "null";
    case google::protobuf::Value::kListValue: {
      std::vector<std::string> items;
      for (const google::protobuf::Value& item : value.list_value().values()) {
        items.push_back(ValueText(item, exact, /*nested=*/true));
      }
      return absl::StrCat("[", absl::StrJoin(items, ","), "]");
    }
    case google::protobuf::Value::kStructValue: {
      // Sorted by key: a map's order is unspecified.
      std::map<std::string, const google::protobuf::Value*> fields;
      for (const auto& [key, field] : value.struct_value().fields()) {
        fields[key] = &field;
      }
      std::vector<std::string> items;
      for (const auto& [key, field] : fields) {
        items.push_back(absl::StrCat(exact ? JsonQuoted(key) : key, ":",
                                     ValueText(*field, exact, true)));
      }
      return absl::StrCat("{", absl::StrJoin(items, ","), "}");
    }
    case google::protobuf::Value::KIND_NOT_SET:
      break;
  }
  return exact ? "" : kNone;
}

// The label of each path in FormatTrialParams: the last part of the path,
// or the whole path where two paths share the last part.
std::map<std::string, std::string> ParamLabels(
    const std::vector<std::string>& paths) {
  std::map<std::string, int> uses;
  auto last_part = [](const std::string& path) {
    const size_t dot = path.rfind('.');
    return dot == std::string::npos ? path : path.substr(dot + 1);
  };
  for (const std::string& path : paths) ++uses[last_part(path)];
  std::map<std::string, std::string> labels;
  for (const std::string& path : paths) {
    const std::string last = last_part(path);
    labels[path] = uses[last] > 1 ? path : last;
  }
  return labels;
}

std::string TrialValue(const v1::Trial& trial) {
  return trial.has_value() ? CompactNumber(trial.value()) : kNone;
}

bool IsInFlight(v1::TrialState state) {
  return state == v1::TRIAL_STATE_QUEUED || state == v1::TRIAL_STATE_RUNNING;
}

bool IsEnded(v1::TrialState state) {
  return state == v1::TRIAL_STATE_COMPLETED ||
         state == v1::TRIAL_STATE_PRUNED || state == v1::TRIAL_STATE_FAILED ||
         state == v1::TRIAL_STATE_CANCELLED;
}

// A row of the trial table: each cell but the last padded to its column's
// width, two blanks between cells, no trailing blanks.
std::string FixedWidthRow(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i + 1 < cells.size()) {
      const int width = kTrialColumnWidths[i];
      absl::StrAppendFormat(&line, "%-*s  ", width, cells[i]);
    } else {
      line += cells[i];
    }
  }
  absl::StripTrailingAsciiWhitespace(&line);
  return line + "\n";
}

// A k-fold trial's jobs, fold by fold ("-" for one not yet submitted).
std::string FoldJobs(const v1::Trial& trial) {
  std::vector<std::string> jobs;
  for (const v1::TrialFold& fold : trial.folds()) {
    jobs.push_back(fold.job_id().empty() ? kNone : fold.job_id());
  }
  return absl::StrJoin(jobs, ",");
}

// FormatTrialLine with the best marker given: the study's best trial, or
// the one an event names.
std::string TrialLine(const v1::Trial& trial, const v1::StudyStatus& study,
                      bool best) {
  std::string line = absl::StrCat("trial ", trial.number(), " ",
                                  TrialStateName(trial.state()));
  // A k-fold trial's value is the folds' mean; their spread follows it.
  const std::string value =
      trial.has_value()
          ? absl::StrCat(" value=", CompactNumber(trial.value()),
                         trial.has_value_spread()
                             ? absl::StrCat(" spread=", CompactNumber(trial.value_spread()))
                             : "",
                         best ? " [best]" : "")
          : "";
  if (IsEnded(trial.state())) {
    absl::StrAppend(&line, " at epoch ", trial.epochs_done(), value);
  } else {
    if (trial.folds_size() > 0) {
      absl::StrAppend(&line, " jobs ", FoldJobs(trial));
    } else if (!trial.job_id().empty()) {
      absl::StrAppend(&line, " job ", trial.job_id());
    }
    if (trial.retries() > 0)
      absl::StrAppend(&line, " (retry ", trial.retries(), ")");
    if (trial.epochs_done() > 0) {
      absl::StrAppend(&line, " epoch ", trial.epochs_done());
    }
    line += value;
  }
  const std::string params = FormatTrialParams(trial, study);
  if (!params.empty()) absl::StrAppend(&line, " (", params, ")");
  if (IsEnded(trial.state()) && !trial.message().empty()) {
    absl::StrAppend(&line, ": ", trial.message());
  }
  return line;
}

}  // namespace

std::string TrialStateName(v1::TrialState state) {
  const std::string& full = v1::TrialState_Name(state);
  absl::string_view name = full;
  absl::ConsumePrefix(&name, "TRIAL_STATE_");
  return name.empty() ? absl::StrCat(static_cast<int>(state))
                      : std::string(name);
}

std::string StudyStateName(v1::StudyState state) {
  const std::string& full = v1::StudyState_Name(state);
  absl::string_view name = full;
  absl::ConsumePrefix(&name, "STUDY_STATE_");
  return name.empty() ? absl::StrCat(static_cast<int>(state))
                      : std::string(name);
}

std::string FormatParamValue(const google::protobuf::Value& value) {
  return ValueText(value, /*exact=*/false, /*nested=*/false);
}

std::string ExactParamValue(const google::protobuf::Value& value) {
  return ValueText(value, /*exact=*/true, /*nested=*/false);
}

std::vector<std::string> ParameterPaths(const v1::StudyStatus& study) {
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const v1::ParameterSpec& parameter : study.spec().parameters()) {
    if (seen.insert(parameter.path()).second) paths.push_back(parameter.path());
  }
  std::set<std::string> others;
  for (const v1::Trial& trial : study.trials()) {
    for (const auto& [path, value] : trial.params()) {
      if (seen.count(path) == 0) others.insert(path);
    }
  }
  paths.insert(paths.end(), others.begin(), others.end());
  return paths;
}

std::string FormatTrialParams(const v1::Trial& trial,
                              const v1::StudyStatus& study) {
  const std::vector<std::string> paths = ParameterPaths(study);
  // Paths of this trial missing from the study (a bare study passed in).
  std::vector<std::string> all = paths;
  std::set<std::string> extra;
  for (const auto& [path, value] : trial.params()) {
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      extra.insert(path);
    }
  }
  all.insert(all.end(), extra.begin(), extra.end());
  const std::map<std::string, std::string> labels = ParamLabels(all);
  std::vector<std::string> parts;
  for (const std::string& path : all) {
    auto it = trial.params().find(path);
    if (it == trial.params().end()) continue;
    parts.push_back(
        absl::StrCat(labels.at(path), "=", FormatParamValue(it->second)));
  }
  return absl::StrJoin(parts, " ");
}

std::string ObjectiveText(const v1::StudySpec& spec) {
  const std::string metric = spec.objective().metric().empty()
                                 ? "val_accuracy"
                                 : spec.objective().metric();
  std::string direction = spec.objective().direction();
  if (direction.empty()) {
    direction = HigherIsBetter(metric) ? "maximize" : "minimize";
  }
  return absl::StrCat(metric, " (", direction, ")");
}

std::string FormatTrialTable(const v1::StudyStatus& study, int max_rows) {
  const int count = study.trials_size();
  std::vector<bool> shown(count, true);
  int hidden = 0;
  if (max_rows > 0 && count > max_rows) {
    std::fill(shown.begin(), shown.end(), false);
    int picked = 0;
    auto pick = [&](int i) {
      if (picked < max_rows && !shown[i]) {
        shown[i] = true;
        ++picked;
      }
    };
    for (int i = 0; i < count; ++i) {
      if (study.has_best_trial() &&
          study.trials(i).number() == study.best_trial()) {
        pick(i);
      }
    }
    for (int i = count - 1; i >= 0; --i) {
      if (IsInFlight(study.trials(i).state())) pick(i);
    }
    for (int i = count - 1; i >= 0; --i) pick(i);
    hidden = count - picked;
  }
  std::string out =
      FixedWidthRow({"TRIAL", "STATE", "EPOCHS", "VALUE", "BEST", "PARAMS"});
  for (int i = 0; i < count; ++i) {
    if (!shown[i]) continue;
    const v1::Trial& trial = study.trials(i);
    const bool best =
        study.has_best_trial() && trial.number() == study.best_trial();
    out += FixedWidthRow({absl::StrCat(trial.number()),
                          TrialStateName(trial.state()),
                          absl::StrCat(trial.epochs_done()), TrialValue(trial),
                          best ? "*" : "", FormatTrialParams(trial, study)});
  }
  if (hidden > 0) {
    absl::StrAppend(&out, "(", hidden, " more trial", hidden == 1 ? "" : "s",
                    " not shown)\n");
  }
  return out;
}

std::string FormatStudySummary(const v1::StudyStatus& study) {
  const v1::StudySpec& spec = study.spec();
  ctl::TextTable table({"study", study.study_id()});
  if (!spec.name().empty()) table.AddRow({"name", spec.name()});
  table.AddRow({"state", StudyStateName(study.state())});
  if (!study.message().empty()) table.AddRow({"message", study.message()});
  table.AddRow({"objective", ObjectiveText(spec)});
  table.AddRow({"sampler", spec.sampler().empty() ? "tpe" : spec.sampler()});
  table.AddRow(
      {"pruner", spec.pruner().name().empty() ? "none" : spec.pruner().name()});
  std::map<v1::TrialState, int> by_state;
  for (const v1::Trial& trial : study.trials()) ++by_state[trial.state()];
  std::vector<std::string> counts;
  for (v1::TrialState state :
       {v1::TRIAL_STATE_COMPLETED, v1::TRIAL_STATE_PRUNED,
        v1::TRIAL_STATE_FAILED, v1::TRIAL_STATE_CANCELLED,
        v1::TRIAL_STATE_RUNNING, v1::TRIAL_STATE_QUEUED}) {
    if (by_state[state] > 0) {
      counts.push_back(absl::StrCat(
          by_state[state], " ", absl::AsciiStrToLower(TrialStateName(state))));
    }
  }
  std::string trials = absl::StrCat(study.trials_size());
  if (spec.has_trials()) absl::StrAppend(&trials, " of ", spec.trials());
  if (!counts.empty())
    absl::StrAppend(&trials, ": ", absl::StrJoin(counts, ", "));
  table.AddRow({"trials", trials});
  if (spec.folds() > 0) {
    table.AddRow({"folds", absl::StrCat(spec.folds(), " (one job per fold, scored by the mean)")});
  }
  if (study.seeded_size() > 0 || spec.enqueue_size() > 0) {
    std::vector<std::string> warm;
    if (spec.enqueue_size() > 0) warm.push_back(absl::StrCat(spec.enqueue_size(), " enqueued"));
    if (study.seeded_size() > 0) {
      warm.push_back(absl::StrCat(study.seeded_size(), " seeded from ", spec.warm_start_from()));
    }
    table.AddRow({"warm start", absl::StrJoin(warm, ", ")});
  }
  table.AddRow({"epochs", absl::StrCat(study.epochs_trained(), " trained")});
  table.AddRow(
      {"best", study.has_best_trial()
                   ? absl::StrCat("trial ", study.best_trial(), ", value ",
                                  study.has_best_value()
                                      ? CompactNumber(study.best_value())
                                      : kNone)
                   : kNone});
  return table.Format();
}

std::string FormatStudyHeadline(const v1::StudyStatus& study) {
  std::string line = absl::StrCat("study ", study.study_id());
  if (!study.spec().name().empty()) {
    absl::StrAppend(&line, " (", study.spec().name(), ")");
  }
  absl::StrAppend(&line, " ", StudyStateName(study.state()), "  trials ",
                  study.trials_size());
  if (study.spec().has_trials())
    absl::StrAppend(&line, "/", study.spec().trials());
  absl::StrAppend(&line, ", ", study.trials_running(), " running  best ");
  if (study.has_best_trial()) {
    absl::StrAppend(
        &line, "trial ", study.best_trial(), " value=",
        study.has_best_value() ? CompactNumber(study.best_value()) : kNone);
  } else {
    line += kNone;
  }
  return line;
}

std::string FormatStudyList(absl::Span<const v1::StudyStatus> studies) {
  ctl::TextTable table({"STUDY", "NAME", "STATE", "SAMPLER", "BUDGET",
                        "RUNNING", "BEST_TRIAL", "BEST_VALUE", "EPOCHS"});
  for (const v1::StudyStatus& study : studies) {
    const v1::StudySpec& spec = study.spec();
    table.AddRow(
        {study.study_id(), spec.name().empty() ? kNone : spec.name(),
         StudyStateName(study.state()),
         spec.sampler().empty() ? "tpe" : spec.sampler(),
         spec.has_trials() ? absl::StrCat(spec.trials()) : kNone,
         absl::StrCat(study.trials_running()),
         study.has_best_trial() ? absl::StrCat(study.best_trial()) : kNone,
         study.has_best_value() ? CompactNumber(study.best_value()) : kNone,
         absl::StrCat(study.epochs_trained())});
  }
  return table.Format();
}

std::string FormatTrialLine(const v1::Trial& trial,
                            const v1::StudyStatus& study) {
  return TrialLine(
      trial, study,
      study.has_best_trial() && study.best_trial() == trial.number());
}

std::string FormatStudyEvent(const v1::StudyEvent& event,
                             const v1::StudyStatus& study) {
  if (event.kind() == v1::StudyEvent::KIND_STUDY_ENDED) {
    std::string line = absl::StrCat("study ", study.study_id(), " ",
                                    StudyStateName(event.study_state()));
    if (!event.message().empty()) absl::StrAppend(&line, ": ", event.message());
    if (event.has_best_trial()) {
      absl::StrAppend(
          &line, "; best trial ", event.best_trial(), " value=",
          event.has_best_value() ? CompactNumber(event.best_value()) : kNone);
    }
    return line;
  }
  const v1::Trial& trial = event.trial();
  const bool best =
      event.has_best_trial() && event.best_trial() == trial.number();
  if (event.kind() == v1::StudyEvent::KIND_REPORTED) {
    std::string line = absl::StrCat("trial ", trial.number());
    if (!trial.intermediate().empty()) {
      const v1::IntermediateValue& latest =
          trial.intermediate(trial.intermediate_size() - 1);
      absl::StrAppend(&line, " epoch ", latest.epoch(),
                      " value=", CompactNumber(latest.value()));
    } else {
      absl::StrAppend(&line, " epoch ", trial.epochs_done(),
                      " value=", TrialValue(trial));
    }
    if (best) line += " [best]";
    return line;
  }
  return TrialLine(trial, study, best);
}

void ApplyStudyEvent(const v1::StudyEvent& event, v1::StudyStatus* study) {
  if (event.kind() != v1::StudyEvent::KIND_STUDY_ENDED && event.has_trial()) {
    auto* trials = study->mutable_trials();
    bool replaced = false;
    for (v1::Trial& trial : *trials) {
      if (trial.number() == event.trial().number()) {
        trial = event.trial();
        replaced = true;
        break;
      }
    }
    if (!replaced) {
      *trials->Add() = event.trial();
      for (int i = trials->size() - 1;
           i > 0 && trials->Get(i - 1).number() > trials->Get(i).number();
           --i) {
        trials->SwapElements(i - 1, i);
      }
    }
  }
  if (event.study_state() != v1::STUDY_STATE_UNSPECIFIED) {
    study->set_state(event.study_state());
  }
  if (event.has_best_trial()) study->set_best_trial(event.best_trial());
  if (event.has_best_value()) study->set_best_value(event.best_value());
  if (event.kind() == v1::StudyEvent::KIND_STUDY_ENDED) {
    study->set_message(event.message());
    study->set_ended_unix_seconds(event.unix_seconds());
  }
  int running = 0;
  int64_t epochs = 0;
  for (const v1::Trial& trial : study->trials()) {
    if (IsInFlight(trial.state())) ++running;
    epochs += trial.epochs_trained();
  }
  study->set_trials_running(running);
  study->set_epochs_trained(static_cast<int32_t>(epochs));
}

const v1::Trial* FindBestTrial(const v1::StudyStatus& study) {
  if (!study.has_best_trial()) return nullptr;
  for (const v1::Trial& trial : study.trials()) {
    if (trial.number() == study.best_trial()) return &trial;
  }
  return nullptr;
}

std::string FormatParetoFront(const v1::StudyStatus& study) {
  if (study.pareto_front().empty()) {
    return absl::StrCat("study ", study.study_id(), ": no completed trial yet, so no front\n");
  }
  std::vector<std::string> header = {"TRIAL"};
  for (const v1::Objective& objective : study.spec().objectives()) {
    header.push_back(absl::StrCat(
        absl::AsciiStrToUpper(objective.metric()), " (",
        objective.direction() == "maximize" ? "max" : "min", ")"));
  }
  header.push_back("JOB");
  header.push_back("PARAMS");
  ctl::TextTable table(header);
  for (int number : study.pareto_front()) {
    if (number < 0 || number >= study.trials_size()) continue;
    const v1::Trial& trial = study.trials(number);
    std::vector<std::string> row = {absl::StrCat(number)};
    for (double value : trial.values()) row.push_back(CompactNumber(value));
    row.push_back(trial.job_id().empty() ? kNone : trial.job_id());
    std::vector<std::string> params;
    for (const std::string& path : ParameterPaths(study)) {
      auto it = trial.params().find(path);
      if (it != trial.params().end()) {
        params.push_back(absl::StrCat(path, "=", ExactParamValue(it->second)));
      }
    }
    row.push_back(params.empty() ? kNone : absl::StrJoin(params, " "));
    table.AddRow(row);
  }
  return table.Format();
}

std::string FormatBestTrial(const v1::StudyStatus& study) {
  const v1::Trial* best = FindBestTrial(study);
  if (best == nullptr) {
    return absl::StrCat("study ", study.study_id(),
                        ": no trial has a value yet\n");
  }
  ctl::TextTable table({"study", study.study_id()});
  table.AddRow(
      {"trial",
       absl::StrCat(best->number(), " (", TrialStateName(best->state()), ", ",
                    best->epochs_done(), " epoch",
                    best->epochs_done() == 1 ? "" : "s", ")")});
  table.AddRow(
      {"value", best->has_value() ? ExactNumber(best->value()) : kNone});
  table.AddRow({"objective", ObjectiveText(study.spec())});
  if (best->folds_size() > 0) {
    // The mean's parts: each fold's value and job.
    std::vector<std::string> values;
    for (const v1::TrialFold& fold : best->folds()) {
      values.push_back(fold.has_value() ? ExactNumber(fold.value()) : kNone);
    }
    table.AddRow({"folds", absl::StrCat(
                               "mean of ", best->folds_size(), ": ", absl::StrJoin(values, " "),
                               best->has_value_spread()
                                   ? absl::StrCat(" (spread ", ExactNumber(best->value_spread()), ")")
                                   : "")});
    table.AddRow({"jobs", FoldJobs(*best)});
  } else {
    table.AddRow({"job", best->job_id().empty() ? kNone : best->job_id()});
  }
  std::vector<std::string> params;
  for (const std::string& path : ParameterPaths(study)) {
    auto it = best->params().find(path);
    if (it == best->params().end()) continue;
    params.push_back(absl::StrCat(path, "=", ExactParamValue(it->second)));
  }
  table.AddRow({"params", params.empty() ? kNone : absl::StrJoin(params, " ")});
  return table.Format();
}

std::string CsvField(absl::string_view text) {
  if (text.find_first_of(",\"\r\n") == absl::string_view::npos) {
    return std::string(text);
  }
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string FormatStudyCsv(const v1::StudyStatus& study) {
  const std::vector<std::string> paths = ParameterPaths(study);
  std::set<int> epochs;
  for (const v1::Trial& trial : study.trials()) {
    for (const v1::IntermediateValue& value : trial.intermediate()) {
      epochs.insert(value.epoch());
    }
  }
  std::vector<std::string> header = {"number",         "state",   "value",
                                     "epochs_trained", "retries", "job_id"};
  // k-fold studies: the folds' spread, and every fold's job.
  const bool folds = study.spec().folds() > 0;
  if (folds) header.insert(header.begin() + 3, "value_spread");
  header.insert(header.end(), paths.begin(), paths.end());
  for (int epoch : epochs) header.push_back(absl::StrCat("epoch_", epoch));
  auto line = [](const std::vector<std::string>& fields) {
    std::vector<std::string> quoted;
    quoted.reserve(fields.size());
    for (const std::string& field : fields) quoted.push_back(CsvField(field));
    return absl::StrCat(absl::StrJoin(quoted, ","), "\n");
  };
  std::string out = line(header);
  for (const v1::Trial& trial : study.trials()) {
    std::vector<std::string> row = {
        absl::StrCat(trial.number()),
        TrialStateName(trial.state()),
        trial.has_value() ? ExactNumber(trial.value()) : "",
        absl::StrCat(trial.epochs_trained()),
        absl::StrCat(trial.retries()),
        folds ? FoldJobs(trial) : trial.job_id()};
    if (folds) {
      row.insert(row.begin() + 3,
                 trial.has_value_spread() ? ExactNumber(trial.value_spread()) : "");
    }
    for (const std::string& path : paths) {
      auto it = trial.params().find(path);
      row.push_back(it == trial.params().end() ? ""
                                               : ExactParamValue(it->second));
    }
    // The latest value at each epoch.
    std::map<int, double> by_epoch;
    for (const v1::IntermediateValue& value : trial.intermediate()) {
      by_epoch[value.epoch()] = value.value();
    }
    for (int epoch : epochs) {
      auto it = by_epoch.find(epoch);
      row.push_back(it == by_epoch.end() ? "" : ExactNumber(it->second));
    }
    out += line(row);
  }
  return out;
}

absl::StatusOr<std::string> MessageToJson(
    const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  std::string json;
  const auto converted =
      google::protobuf::util::MessageToJsonString(message, &json, print);
  if (!converted.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(),
                     " as JSON: ", converted.ToString()));
  }
  if (!absl::EndsWith(json, "\n")) json += "\n";
  return json;
}

}  // namespace mpilearn::opt
