// How a job's pushes change its weights, one rule per algorithm behind one
// interface (the job's spec picks it through v1::Algorithm / UpdateKindOf):
//
//   downpour, sync  UPDATE_KIND_GRADIENT: one step of the job's Optimizer.
//   easgd           UPDATE_KIND_ELASTIC: the rank's weights x; the centre c
//                   moves by alpha * (x - c). The reply is c before the move
//                   (replies_with_previous()).
//   gem             UPDATE_KIND_DELTA: c += delta.
//
// Each Apply is guarded: one that would leave the weights or the rule's
// state NaN or Inf is undone by the rule itself. Admission comes first
// (update_admission.h: the checks, the staleness and the scale):
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<UpdateRule> rule,
//                             UpdateRule::Create(spec, sizes, engine));
//   MPILEARN_ASSIGN_OR_RETURN(const Admission admission,
//                             AdmitUpdate(update, scan, spec, id, weights));
//   MPILEARN_ASSIGN_OR_RETURN(
//       const UpdateRule::Outcome outcome,
//       rule->ApplyGuarded(writable, update.values, admission.scale,
//                          admission.max_update));
//
// Threading: not thread-safe; a Job calls it under its own mutex.
#ifndef MPILEARN_SERVER_CORE_UPDATE_UPDATE_RULE_H_
#define MPILEARN_SERVER_CORE_UPDATE_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/optimizer.h"

namespace mpilearn::server {

// What the master's metrics call a job's update rule (the apply histogram's
// `optimizer` label, job_info's): the optimizer's name for downpour and sync,
// "easgd" or "gem" for those algorithms (they apply their own rule).
std::string UpdateRuleName(const v1::JobSpec& spec);

class UpdateRule {
 public:
  // The rule for `spec`'s algorithm over weight tensors of `sizes`
  // elements; a gradient rule gets a fresh optimizer built on `engine`.
  // The optimizer's errors carry ERROR_REASON_INTERNAL.
  static absl::StatusOr<std::unique_ptr<UpdateRule>> Create(
      const v1::JobSpec& spec, const std::vector<size_t>& sizes,
      const EngineOptions& engine);

  // The rule for `spec`'s algorithm with `optimizer` (a restored one): a
  // gradient rule needs one; the others take none (INVALID_ARGUMENT if
  // given or missing).
  static absl::StatusOr<std::unique_ptr<UpdateRule>> WithOptimizer(
      const v1::JobSpec& spec, std::unique_ptr<Optimizer> optimizer);

  virtual ~UpdateRule() = default;

  // What pushes to this rule carry.
  virtual v1::UpdateKind kind() const = 0;

  // True when the reply to an update is the weights before it (easgd).
  virtual bool replies_with_previous() const { return false; }

  // The job's optimizer (gradient rules), else null: its state is part of
  // the job's checkpoint.
  virtual const Optimizer* optimizer() const { return nullptr; }
  // The learning rate of the optimizer's steps from now on (a schedule's);
  // rules without an optimizer ignore it.
  virtual void SetLearningRate(double /*rate*/) {}

  // The weights an ApplyGuarded changes: `values` in place, with the
  // weights as they were in `original` (kept by the caller until
  // ApplyGuarded returns) or null when `values` are the only copy.
  struct Writable {
    std::vector<std::vector<float>>* values = nullptr;
    const std::vector<std::vector<float>>* original = nullptr;
  };
  // How a guarded Apply ended.
  enum class Outcome {
    // Applied: the weights and the rule's state are finite.
    kApplied,
    // It would have made the weights or the state NaN or Inf: both are
    // back as they were, bit for bit (the CUDA optimizer's device state
    // excepted: see cuda_engine.h).
    kUndone,
    // As kUndone, except that the rule's state could not be put back
    // (undo_error says why): the job cannot go on.
    kStateLost,
    // Non-finite, and applied in place on the rule's own bound, which did
    // not hold: nothing to go back to (an internal error).
    kNotUndone,
  };
  struct Result {
    Outcome outcome = Outcome::kApplied;
    absl::Status undo_error;  // kStateLost only
  };

  // Applies `update` scaled by `scale` (<= 1) to the weights, guarded.
  // `max_update` is the update's largest |value| (Admission::max_update).
  // The rule first bounds the Apply from what it knows of the magnitudes
  // (carried forward from earlier Applys); when the bound holds, the Apply
  // runs as fast as ever, in place, and `writable(false)` may hand the
  // weights without an original. Otherwise it asks `writable(true)`, which
  // must return an original, tracks the magnitudes it writes in its own
  // pass (which re-anchors the bound), keeps what it needs to undo its
  // state, and undoes an Apply whose result is not finite. `writable` is
  // called once, right before the Apply. Precondition: the update passed
  // AdmitUpdate against these weights. Only an optimizer on a device can
  // fail (ERROR_REASON_INTERNAL); the weights are then unspecified.
  virtual absl::StatusOr<Result> ApplyGuarded(
      absl::FunctionRef<Writable(bool undoable)> writable,
      const std::vector<std::vector<float>>& update, float scale,
      double max_update) = 0;

  // ApplyGuarded to `weights` that the caller holds alone (no snapshot to
  // copy on write, as a Job has): keeps the copy an undoable Apply needs
  // itself and measures `max_update` from `update`.
  absl::StatusOr<Result> Apply(std::vector<std::vector<float>>& weights,
                               const std::vector<std::vector<float>>& update,
                               float scale);

 protected:
  // Copies `original` back into `values` (the same sizes).
  static void PutBack(const Writable& weights);
};

// What a job's updates did, for JobStatus and checkpoints.
struct UpdateStats {
  uint64_t applied = 0;
  // Refused by max_staleness.
  uint64_t stale_rejected = 0;
  // Refused because they would have made the weights or the optimizer
  // state non-finite (JobStatus.updates_rejected).
  uint64_t rejected = 0;
  // Staleness of the applied updates.
  uint64_t max_staleness = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_count = 0;

  // Counts an applied update of `staleness`.
  void Applied(uint64_t staleness);
  // updates_applied, stale_rejected, updates_rejected, max_staleness_seen,
  // mean_staleness.
  void FillStatus(v1::JobStatus* status) const;
  // The counters `status` shows (staleness_sum and _count, which it does
  // not, are left alone).
  void Resume(const v1::JobStatus& status);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_UPDATE_RULE_H_
