// Pruners: whether a trial that just reported an intermediate value should
// stop. ASHA (Optuna 3.1's SuccessiveHalvingPruner) and the median rule
// (Optuna's MedianPruner), both fed the epochs' validations of every trial.
//
//   auto pruner = NewPruner(spec.pruner());            // normalized spec
//   TrialCurve& me = curves[i];                        // just got a value
//   if ((*pruner)->ShouldPrune(me, curves)) StopJob(...);
//
// Values are in minimize form: a study that maximizes passes -value.
//
// ASHA is stateful like Optuna's: when a trial reaches a rung it records its
// current value there (TrialCurve::rungs, saved with the trial), and later
// trials compete against every value recorded at that rung, whether those
// trials still run or not.
//
// Threading: not thread-safe; the study calls it under its own lock.
#ifndef MPILEARN_SERVER_OPT_PRUNER_H_
#define MPILEARN_SERVER_OPT_PRUNER_H_

#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

// One trial's curve.
struct TrialCurve {
  int number = 0;
  // The trial finished (COMPLETED); the median rule compares only with
  // those.
  bool complete = false;
  // Intermediate values by epoch (>= 1), minimize form.
  std::map<int, double> values;
  // ASHA: the value recorded at each rung the trial reached.
  std::map<int, double> rungs;
};

class Pruner {
 public:
  virtual ~Pruner() = default;
  // Whether `trial` (its last epoch is values.rbegin()) should stop now.
  // `all` holds every trial of the study, `trial` included (matched by
  // number, not by address). ASHA records the rungs `trial` reaches in
  // trial->rungs. A trial with no values is never pruned; a NaN value is
  // where Optuna judges it (ASHA: at a rung; median: past startup and
  // warmup, when every value of the trial is NaN).
  virtual bool ShouldPrune(TrialCurve* trial,
                           absl::Span<const TrialCurve> all) = 0;
};

// Fills a spec's defaults as a study stores them: an empty name becomes
// "none"; asha's settings for "asha", median's for "median" (the values
// NewPruner assumes for unset fields).
void FillPrunerDefaults(v1::PrunerSpec* spec);

// The pruner of a normalized PrunerSpec: "none" (never prunes), "asha",
// "median". INVALID_ARGUMENT naming the field for another name or an
// out-of-range setting (min_resource < 1, reduction_factor < 2,
// min_early_stopping_rate < 0, startup_trials < 0, warmup_epochs < 0).
absl::StatusOr<std::unique_ptr<Pruner>> NewPruner(const v1::PrunerSpec& spec);

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_PRUNER_H_
