#include "server/core/stop_rules.h"

#include <cmath>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"

namespace mpilearn::server {
namespace {

// `value` improves on `best` by more than `min_delta`.
bool Improves(double value, double best, double min_delta,
              bool lower_is_better) {
  return lower_is_better ? value < best - min_delta : value > best + min_delta;
}

}  // namespace

StopRules::Metric StopRules::MetricNamed(const std::string& name,
                                         const char* fallback) {
  Metric metric;
  metric.name = name.empty() ? fallback : name;
  metric.lower_is_better = !HigherIsBetter(metric.name);
  return metric;
}

std::optional<double> StopRules::ValueOf(const Metric& metric,
                                         const v1::ValidationRecord& record) {
  if (metric.name == "val_loss") return record.val_loss();
  if (metric.name == "val_accuracy") return record.val_accuracy();
  auto it = record.metrics().find(metric.name);
  if (it == record.metrics().end()) return std::nullopt;
  return it->second;
}

StopRules::StopRules(const v1::JobSpec& spec) {
  if (spec.has_early_stopping()) {
    const v1::EarlyStoppingSpec& stopping = spec.early_stopping();
    early_stopping_ = true;
    stopping_metric_ = MetricNamed(stopping.metric(), "val_loss");
    patience_ = stopping.has_patience() ? stopping.patience() : 4;
    min_delta_ = stopping.has_min_delta() ? stopping.min_delta() : 0.0;
    smoothing_ = stopping.has_smoothing() ? stopping.smoothing() : 1;
  }
  if (spec.has_target() && spec.target().has_value()) {
    target_ = true;
    target_metric_ = MetricNamed(spec.target().metric(), "val_accuracy");
    target_value_ = spec.target().value();
  }
  const std::string& best = spec.checkpoint().best_metric();
  if (best != "none") {
    track_best_ = true;
    best_metric_ = MetricNamed(best, "val_loss");
  }
}

StopRules::Outcome StopRules::Add(const v1::ValidationRecord& record) {
  Outcome outcome;
  if (track_best_) {
    const std::optional<double> value = ValueOf(best_metric_, record);
    if (value.has_value() && std::isfinite(*value) &&
        (!best_.has_value() ||
         Improves(*value, *best_, 0.0, best_metric_.lower_is_better))) {
      best_ = *value;
      best_version_ = record.version();
      outcome.best_improved = true;
    }
  }
  const std::optional<double> target_value =
      target_ ? ValueOf(target_metric_, record) : std::nullopt;
  if (target_value.has_value()) {
    const double value = *target_value;
    const bool reached = target_metric_.lower_is_better
                             ? value < target_value_
                             : value > target_value_;
    if (reached) {
      outcome.stop_reason =
          absl::StrCat("target reached: ", target_metric_.name, " ", value,
                       target_metric_.lower_is_better ? " < " : " > ",
                       target_value_);
    }
  }
  const std::optional<double> stopping_value =
      early_stopping_ ? ValueOf(stopping_metric_, record) : std::nullopt;
  if (stopping_value.has_value()) {
    window_.push_back(*stopping_value);
    if (window_.size() > static_cast<size_t>(smoothing_)) window_.pop_front();
    const double average = std::accumulate(window_.begin(), window_.end(), 0.0) /
                           static_cast<double>(window_.size());
    if (std::isfinite(average) &&
        (!stopping_best_.has_value() ||
         Improves(average, *stopping_best_, min_delta_,
                  stopping_metric_.lower_is_better))) {
      stopping_best_ = average;
      stopping_best_version_ = record.version();
      since_improvement_ = 0;
    } else {
      ++since_improvement_;
    }
    if (since_improvement_ >= patience_ && outcome.stop_reason.empty()) {
      const std::string what =
          smoothing_ > 1 ? absl::StrCat(stopping_metric_.name, " averaged over ",
                                        smoothing_, " validations")
                         : stopping_metric_.name;
      outcome.stop_reason = absl::StrCat(
          "early stopping: ", what, " did not improve by more than ", min_delta_, " for ", patience_,
          " validations (best ",
          stopping_best_.has_value()
              ? absl::StrCat(*stopping_best_, " at version ",
                             stopping_best_version_)
              : std::string("none: every value was NaN or infinite"),
          ")");
    }
  }
  return outcome;
}

}  // namespace mpilearn::server
