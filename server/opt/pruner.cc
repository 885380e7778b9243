// Pruners after Optuna 3.1: SuccessiveHalvingPruner (optuna/pruners/
// _successive_halving.py) and MedianPruner (_median.py over _percentile.py),
// with Optuna's step being our epoch and the study direction minimize.
// //server/opt:pruner_test replays scenarios through Optuna itself
// (optuna_pruner_reference.py) and asserts the same decisions.

#include "server/opt/pruner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mpilearn::opt {
namespace {

// The PrunerSpec defaults (proto/study.proto), used where a field is unset.
constexpr int kDefaultMinResource = 1;
constexpr int kDefaultReductionFactor = 4;
constexpr int kDefaultMinEarlyStoppingRate = 0;
constexpr int kDefaultStartupTrials = 5;
constexpr int kDefaultWarmupEpochs = 0;

class NoPruner final : public Pruner {
 public:
  bool ShouldPrune(TrialCurve*, absl::Span<const TrialCurve>) override {
    return false;
  }
};

// Optuna's SuccessiveHalvingPruner with an explicit min_resource and
// bootstrap_count 0. Rung k is judged at the first report at or past epoch
// min_resource * reduction_factor^(min_early_stopping_rate + k); the trial
// records its latest value there (Optuna's "completed_rung_k" system
// attribute) and goes on when that value is among the best
// max(1, n / reduction_factor) of the n values recorded at rung k, its own
// included. One report may pass several rungs (a trial that reports rarely).
class SuccessiveHalvingPruner final : public Pruner {
 public:
  SuccessiveHalvingPruner(int min_resource, int reduction_factor,
                          int min_early_stopping_rate)
      : min_resource_(min_resource),
        reduction_factor_(reduction_factor),
        min_early_stopping_rate_(min_early_stopping_rate) {}

  bool ShouldPrune(TrialCurve* trial,
                   absl::Span<const TrialCurve> all) override {
    if (trial->values.empty()) return false;
    const auto& [step, value] = *trial->values.rbegin();
    // The first rung not yet recorded (Optuna's _get_current_rung).
    int rung = 0;
    while (trial->rungs.count(rung) > 0) ++rung;
    while (true) {
      if (step < PromotionStep(rung)) return false;
      if (std::isnan(value)) return true;
      trial->rungs[rung] = value;
      if (!Promotable(trial->number, rung, value, all)) return true;
      ++rung;
    }
  }

 private:
  // min_resource * reduction_factor^(min_early_stopping_rate + rung), or
  // int64 max once that passes any epoch.
  int64_t PromotionStep(int rung) const {
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    int64_t step = min_resource_;
    for (int i = 0; i < min_early_stopping_rate_ + rung; ++i) {
      if (step > std::numeric_limits<int>::max()) return kNever;
      step *= reduction_factor_;
    }
    return step;
  }

  // Optuna's _get_competing_values and _is_trial_promotable_to_next_rung:
  // the values the other trials recorded at `rung`, plus `value`; promotable
  // when `value` is at most the (n / reduction_factor)-th smallest (the
  // smallest while fewer than reduction_factor values compete). Optuna reads
  // the other trials once per call, before recording, so the trial's own
  // value counts once: `all` is read without the trial's own entry.
  bool Promotable(int number, int rung, double value,
                  absl::Span<const TrialCurve> all) const {
    std::vector<double> competing;
    for (const TrialCurve& other : all) {
      if (other.number == number) continue;
      auto it = other.rungs.find(rung);
      if (it != other.rungs.end()) competing.push_back(it->second);
    }
    competing.push_back(value);
    size_t index = competing.size() / reduction_factor_;
    index = index == 0 ? 0 : index - 1;
    std::nth_element(competing.begin(), competing.begin() + index,
                     competing.end());
    return value <= competing[index];
  }

  const int min_resource_;
  const int reduction_factor_;
  const int min_early_stopping_rate_;
};

// numpy 1.24's nanpercentile(values, 50) with the default "linear" method:
// NaNs dropped, NaN when none is left, and the two middle values blended by
// numpy's _lerp (the same arithmetic, so ties come out as numpy's do).
double NanMedian(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(),
                              [](double v) { return std::isnan(v); }),
               values.end());
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  // Virtual index (n - 1) * 0.5: below it `previous`, above it `next`
  // (the last value when the index is the last one).
  const double virtual_index = static_cast<double>(n - 1) * 0.5;
  size_t previous = static_cast<size_t>(std::floor(virtual_index));
  size_t next = previous + 1;
  if (virtual_index >= static_cast<double>(n - 1)) previous = next = n - 1;
  const double gamma = virtual_index - static_cast<double>(previous);
  const double a = values[previous];
  const double b = values[next];
  const double diff = b - a;
  return gamma >= 0.5 ? b - diff * (1 - gamma) : a + diff * gamma;
}

// Optuna's MedianPruner (PercentilePruner at 50) with interval_steps 1 and
// n_min_trials 1. In Optuna's order: no pruning until startup_trials trials
// completed (and never with none completed), nor before epoch
// warmup_epochs; then a trial whose values are all NaN is pruned, and
// otherwise one whose best value is above the NaN-ignoring median of the
// completed trials' values at its last epoch (no pruning when no completed
// trial has a value there).
class MedianPruner final : public Pruner {
 public:
  MedianPruner(int startup_trials, int warmup_epochs)
      : startup_trials_(startup_trials), warmup_epochs_(warmup_epochs) {}

  bool ShouldPrune(TrialCurve* trial,
                   absl::Span<const TrialCurve> all) override {
    // The trial itself is never among the completed ones: Optuna asks
    // while it runs, and the study may mark it complete before asking.
    int completed = 0;
    for (const TrialCurve& other : all) {
      if (other.complete && other.number != trial->number) ++completed;
    }
    if (completed == 0 || completed < startup_trials_) return false;
    if (trial->values.empty()) return false;
    const int step = trial->values.rbegin()->first;
    if (step < warmup_epochs_) return false;
    // interval_steps 1: every epoch is the first of its interval.

    // np.nanmin over the trial's values.
    double best = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [epoch, value] : trial->values) {
      if (!std::isnan(value) && (std::isnan(best) || value < best)) {
        best = value;
      }
    }
    if (std::isnan(best)) return true;

    std::vector<double> at_step;
    for (const TrialCurve& other : all) {
      if (!other.complete || other.number == trial->number) continue;
      auto it = other.values.find(step);
      if (it != other.values.end()) at_step.push_back(it->second);
    }
    if (at_step.empty()) return false;  // n_min_trials 1
    const double median = NanMedian(std::move(at_step));
    if (std::isnan(median)) return false;
    return best > median;
  }

 private:
  const int startup_trials_;
  const int warmup_epochs_;
};

// `field` (a PrunerSpec setting, `value` with its default applied) is at
// least `least`.
absl::Status CheckAtLeast(const char* field, int value, int least) {
  if (value >= least) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("pruner.", field, ": ", value, "; must be >= ", least));
}

}  // namespace

void FillPrunerDefaults(v1::PrunerSpec* spec) {
  if (spec->name().empty()) spec->set_name("none");
  if (spec->name() == "asha") {
    if (!spec->has_min_resource()) spec->set_min_resource(kDefaultMinResource);
    if (!spec->has_reduction_factor()) {
      spec->set_reduction_factor(kDefaultReductionFactor);
    }
    if (!spec->has_min_early_stopping_rate()) {
      spec->set_min_early_stopping_rate(kDefaultMinEarlyStoppingRate);
    }
  } else if (spec->name() == "median") {
    if (!spec->has_startup_trials()) spec->set_startup_trials(kDefaultStartupTrials);
    if (!spec->has_warmup_epochs()) spec->set_warmup_epochs(kDefaultWarmupEpochs);
  }
}

absl::StatusOr<std::unique_ptr<Pruner>> NewPruner(const v1::PrunerSpec& spec) {
  const std::string& name = spec.name();
  if (!name.empty() && name != "none" && name != "asha" && name != "median") {
    return absl::InvalidArgumentError(
        absl::StrCat("pruner.name: \"", absl::CHexEscape(name.substr(0, 64)),
                     "\"; use none, asha or median"));
  }
  // Every setting is checked, whichever pruner uses it, so a spec that is
  // accepted stays valid when only its name changes.
  const int min_resource =
      spec.has_min_resource() ? spec.min_resource() : kDefaultMinResource;
  const int reduction_factor = spec.has_reduction_factor()
                                   ? spec.reduction_factor()
                                   : kDefaultReductionFactor;
  const int min_early_stopping_rate = spec.has_min_early_stopping_rate()
                                          ? spec.min_early_stopping_rate()
                                          : kDefaultMinEarlyStoppingRate;
  const int startup_trials =
      spec.has_startup_trials() ? spec.startup_trials() : kDefaultStartupTrials;
  const int warmup_epochs =
      spec.has_warmup_epochs() ? spec.warmup_epochs() : kDefaultWarmupEpochs;
  MPILEARN_RETURN_IF_ERROR(CheckAtLeast("min_resource", min_resource, 1));
  MPILEARN_RETURN_IF_ERROR(
      CheckAtLeast("reduction_factor", reduction_factor, 2));
  MPILEARN_RETURN_IF_ERROR(
      CheckAtLeast("min_early_stopping_rate", min_early_stopping_rate, 0));
  MPILEARN_RETURN_IF_ERROR(CheckAtLeast("startup_trials", startup_trials, 0));
  MPILEARN_RETURN_IF_ERROR(CheckAtLeast("warmup_epochs", warmup_epochs, 0));

  if (name == "asha") {
    return std::make_unique<SuccessiveHalvingPruner>(
        min_resource, reduction_factor, min_early_stopping_rate);
  }
  if (name == "median") {
    return std::make_unique<MedianPruner>(startup_trials, warmup_epochs);
  }
  return std::make_unique<NoPruner>();
}

}  // namespace mpilearn::opt
