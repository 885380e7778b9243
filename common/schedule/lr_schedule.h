// Learning-rate schedules (OptimizerSpec.schedule): the rate the master's
// optimizer uses for each update of a job, as PyTorch's
// torch.optim.lr_scheduler computes it (docs/protocol.md, "Learning-rate
// schedules").
//
//   MPILEARN_RETURN_IF_ERROR(NormalizeLrSchedule(spec.mutable_optimizer()->mutable_schedule()));
//   LrSchedule schedule(spec.optimizer().schedule(), /*base=*/0.001, /*higher_is_better=*/false);
//   const double rate = schedule.RateAt(updates_applied);  // or epochs done
//   if (schedule.Observe(val_loss)) { ... }                // plateau
//
// Positions count updates applied before the step (unit "updates") or
// epochs finished (unit "epochs"); the rate for position k is what
// PyTorch's optimizer holds after k calls of scheduler.step(). A warm-up
// (LinearLR from warmup_start_factor to 1 over `warmup` positions) comes
// first; the schedule proper counts from its end (SequentialLR). Cosine
// stays at min_lr after t_max (PyTorch's would rise again).
//
// Threading: a value class; the job calls it under its own mutex.
#ifndef MPILEARN_COMMON_SCHEDULE_LR_SCHEDULE_H_
#define MPILEARN_COMMON_SCHEDULE_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// Fills in the defaults of `schedule` and checks every field for its
// schedule; INVALID_ARGUMENT naming the field ("optimizer.schedule.gamma
// must be in (0, 1], got 2"). The metric's name is the caller's to check
// against the job's loss (empty: "val_loss").
absl::Status NormalizeLrSchedule(v1::LrScheduleSpec* schedule);

class LrSchedule {
 public:
  // `schedule` normalized; `base` the optimizer's learning rate; for
  // plateau, whether the metric is better when higher (val_accuracy).
  LrSchedule(const v1::LrScheduleSpec& schedule, double base, bool higher_is_better);

  bool by_epochs() const { return spec_.unit() == "epochs"; }
  // True when every position has the base rate.
  bool constant() const;

  // The rate at position `at` (>= 0).
  double RateAt(int64_t at) const;

  // plateau: one validation of the schedule's metric (ReduceLROnPlateau.
  // step(value)). Returns whether the rate went down. Other schedules, and
  // non-finite values, are ignored (false).
  bool Observe(double value);

  // The plateau state, for checkpoints; Restore takes it back
  // (INVALID_ARGUMENT for a rate that is not in (0, base] or negative
  // counters).
  const v1::LrScheduleState& state() const { return state_; }
  absl::Status Restore(const v1::LrScheduleState& state);

 private:
  // The schedule proper at its own position k (after the warm-up).
  double MainRate(int64_t k) const;

  v1::LrScheduleSpec spec_;
  double base_ = 0;
  bool higher_is_better_ = false;
  v1::LrScheduleState state_;
};

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_SCHEDULE_LR_SCHEDULE_H_
