// The rules a job's validations drive, applied to its validations in the
// order they arrive (ValidationRecord, from training groups at epoch ends
// and from validation pools):
//
//   - early stopping (JobSpec.early_stopping, on when present): the metric,
//     averaged over the last `smoothing` validations, has not improved by
//     more than `min_delta` on the best average so far for `patience`
//     validations in a row. The first validation always improves.
//   - target (JobSpec.target, on when target.value is set): one validation's
//     val_accuracy > value, or another metric (val_loss, val_mae, val_mse)
//     < value.
//   - best validation (JobSpec.checkpoint.best_metric unless "none"): the
//     lowest val_loss/val_mae/val_mse or highest val_accuracy seen, for
//     best.pb.
//
// Metrics are read from the record by name: val_loss and val_accuracy from
// their own fields, any other name from record.metrics(). A record without
// the rule's metric does not count for that rule (it neither improves nor
// uses up patience). val_accuracy improves upwards, every other metric
// downwards. A NaN or infinite value never improves anything and never
// reaches a target.
//
//   StopRules rules(spec);
//   StopRules::Outcome outcome = rules.Add(record);
//   if (!outcome.stop_reason.empty()) { ... the job stops ... }
//
// Threading: not thread-safe; a Job calls it under its own mutex.
#ifndef MPILEARN_SERVER_CORE_STOP_RULES_H_
#define MPILEARN_SERVER_CORE_STOP_RULES_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

class StopRules {
 public:
  // Reads the rules from `spec`; fields left out take NormalizeJobSpec's
  // defaults, so an unnormalized spec behaves as its normalized form.
  explicit StopRules(const v1::JobSpec& spec);

  struct Outcome {
    // The record is the best so far by checkpoint.best_metric.
    bool best_improved = false;
    // Non-empty when a rule fires, e.g. "target reached: val_accuracy
    // 0.9012 > 0.9" or "early stopping: val_loss did not improve by more
    // than 0 for 4 validations (best 0.3123 at version 812)" (with
    // smoothing > 1: "val_loss averaged over 3 validations did not ...",
    // best being the best average). The target is checked first. A rule
    // keeps firing on later records.
    std::string stop_reason;
  };

  Outcome Add(const v1::ValidationRecord& record);

  // Best value of checkpoint.best_metric so far; none before the first
  // finite one, or with best_metric "none".
  std::optional<double> best_value() const { return best_; }
  uint64_t best_version() const { return best_version_; }

  // A validation metric by name (empty: `fallback`), and a record's value
  // of it (none when the record lacks it): also what a plateau schedule
  // observes.
  struct Metric {
    std::string name;  // "val_loss", "val_accuracy", "val_mae", ...
    bool lower_is_better = true;
  };
  static Metric MetricNamed(const std::string& name, const char* fallback);
  static std::optional<double> ValueOf(const Metric& metric,
                                       const v1::ValidationRecord& record);

 private:

  // Early stopping.
  bool early_stopping_ = false;
  Metric stopping_metric_;
  int patience_ = 4;
  double min_delta_ = 0.0;
  int smoothing_ = 1;
  std::deque<double> window_;  // the last `smoothing_` values
  std::optional<double> stopping_best_;  // best moving average
  uint64_t stopping_best_version_ = 0;
  int since_improvement_ = 0;  // validations since the best average

  // Target.
  bool target_ = false;
  Metric target_metric_;
  double target_value_ = 0.0;

  // Best validation.
  bool track_best_ = false;
  Metric best_metric_;
  std::optional<double> best_;
  uint64_t best_version_ = 0;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_STOP_RULES_H_
