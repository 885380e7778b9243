// How a job's pushes change its weights, one rule per algorithm behind one
// interface (the job's spec picks it through v1::Algorithm / UpdateKindOf):
//
//   downpour, sync  UPDATE_KIND_GRADIENT: one step of the job's Optimizer.
//   easgd           UPDATE_KIND_ELASTIC: the rank's weights x; the centre c
//                   moves by alpha * (x - c). The reply is c before the move
//                   (replies_with_previous()).
//   gem             UPDATE_KIND_DELTA: c += delta.
//
// `scale` is the staleness scale (StalenessScale): it multiplies the
// gradient, alpha or delta.
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<UpdateRule> rule,
//                             UpdateRule::Create(spec, sizes, engine));
//   MPILEARN_RETURN_IF_ERROR(CheckUpdate(update, -1, spec, id, weights));
//   MPILEARN_ASSIGN_OR_RETURN(uint64_t staleness,
//                             StalenessOf(spec, update.base_version, version));
//   MPILEARN_RETURN_IF_ERROR(rule->Apply(weights.values, update.values,
//                                        StalenessScale(spec, staleness)));
//
// Threading: not thread-safe; a Job calls it under its own mutex.
#ifndef MPILEARN_SERVER_CORE_UPDATE_RULE_H_
#define MPILEARN_SERVER_CORE_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"
#include "server/core/update/optimizer.h"

namespace mpilearn::server {

// What the master's metrics call a job's update rule (the apply histogram's
// `optimizer` label, job_info's): the optimizer's name for downpour and sync,
// "easgd" or "gem" for those algorithms (they apply their own rule).
std::string UpdateRuleName(const v1::JobSpec& spec);

// The factor an update computed `staleness` versions behind is scaled by:
// 1 / max(1, staleness) with staleness_scaling "inverse", else 1.
float StalenessScale(const v1::JobSpec& spec, uint64_t staleness);

// Index of the first tensor holding NaN or Inf, or -1. Costly on a large
// model: callers scan before taking their lock.
int FirstNonFinite(const std::vector<std::vector<float>>& values);

// One pass over an update's values, made before the job's lock is taken:
// what CheckUpdate, the guard and clipping need.
struct UpdateScan {
  // FirstNonFinite of the values.
  int non_finite = -1;
  // The largest |value| (meaningful when non_finite < 0).
  double max_abs = 0.0;
  // Per tensor, the sum of squares in double; only with `squares`.
  std::vector<double> sum_squares;
};
// Scans `values` (the sums of squares too when `squares`: clipping). The
// non-finite test and the maximum are one vectorised pass, as cheap as
// FirstNonFinite alone.
UpdateScan ScanUpdate(const std::vector<std::vector<float>>& values,
                      bool squares);

// The factor optimizer.clip_grad_norm scales a gradient by, as PyTorch's
// clip_grad_norm_ computes it: with N the L2 norm over every trainable
// tensor of the update (buffers excluded, `layout` says which),
// min(1, clip / (N + 1e-6)); 1 when clipping is off (absent or 0) or the
// algorithm is not downpour/sync. `scan` must hold the sums of squares
// when clipping is on (ClipsGradients).
bool ClipsGradients(const v1::JobSpec& spec);
double ClipScale(const v1::JobSpec& spec, const UpdateScan& scan,
                 const v1::TensorSetHeader& layout);

// INVALID_ARGUMENT (ERROR_REASON_INVALID_REQUEST) naming tensor `name`, which
// holds NaN or Inf; `what` names the tensors ("gradient", "update",
// "initial weight").
absl::Status NonFiniteError(absl::string_view what, absl::string_view name);

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

  // Applies `update` scaled by `scale` to `weights` in place. Precondition:
  // CheckUpdate(update, ..., weights, ...) passed. Only an optimizer on a
  // device can fail (ERROR_REASON_INTERNAL).
  virtual absl::Status Apply(std::vector<std::vector<float>>& weights,
                             const std::vector<std::vector<float>>& update,
                             float scale) = 0;

  // Guarded updates: an Apply that makes the weights or the rule's state
  // non-finite is undone (Job::ApplyGradient). A rule bounds each Apply
  // beforehand from what it knows of the magnitudes (carried forward from
  // earlier Applys); when the bound holds, the Apply runs as fast as ever,
  // in place. Otherwise it tracks the magnitudes it writes in its own pass
  // (which re-anchors the bound), and the caller keeps what it needs to
  // undo it:
  //
  //   if (!rule->PrepareApply(scan.max_abs)) {
  //     keep a copy of the weights; MPILEARN_RETURN_IF_ERROR(rule->BeginUndoable());
  //   }
  //   MPILEARN_RETURN_IF_ERROR(rule->Apply(weights, update, scale));
  //   if (!rule->Finite(weights)) { put the weights back; rule->Undo(); }
  //
  // Call right before each Apply with the update's largest |value|; true
  // when that Apply (any scale <= 1) is certain to leave the weights and
  // the state finite. False before the first Apply, after Undo, when the
  // bound nears the fp32 range, and always for an optimizer that tracks
  // nothing (CUDA).
  virtual bool PrepareApply(double max_update) = 0;
  // Copies the rule's state for Undo (only on the undoable path). The CUDA
  // optimizer's state is not copied (it lives on the GPU): its Undo puts
  // back the weights only.
  virtual absl::Status BeginUndoable() { return absl::OkStatus(); }
  // Whether the last Apply left `weights` and the rule's state finite: from
  // the tracked magnitudes, or a scan of `weights` for an optimizer that
  // tracks nothing.
  virtual bool Finite(const std::vector<std::vector<float>>& weights) const = 0;
  // After BeginUndoable and Apply: puts the state back as it was (the
  // caller puts the weights back first).
  virtual absl::Status Undo() { return absl::OkStatus(); }
};

// Checks an update to the job `job_id` of `spec` (named in messages) whose
// weights are `weights`: the kind its algorithm takes, as many tensors as
// the weights, each as long, no NaN/Inf. `non_finite` is FirstNonFinite of
// update.values, scanned beforehand. INVALID_ARGUMENT
// (ERROR_REASON_INVALID_REQUEST) otherwise.
absl::Status CheckUpdate(const GradientUpdate& update, int non_finite,
                         const v1::JobSpec& spec, const std::string& job_id,
                         const WeightsSnapshot& weights);

// The staleness of an update computed on `base_version` while the master is
// at `version` (0 if not behind). ABORTED (ERROR_REASON_STALE_UPDATE)
// beyond the spec's max_staleness, when that is > 0.
absl::StatusOr<uint64_t> StalenessOf(const v1::JobSpec& spec,
                                     uint64_t base_version, uint64_t version);

// Checks initial weights: at least one tensor, `values` laid out as
// `header` says (fp32, one vector per tensor, each as long), no NaN/Inf.
// Returns the tensors' sizes (elements); INVALID_ARGUMENT
// (ERROR_REASON_INVALID_REQUEST) otherwise.
absl::StatusOr<std::vector<size_t>> CheckInitialWeights(
    const v1::TensorSetHeader& header,
    const std::vector<std::vector<float>>& values);

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

#endif  // MPILEARN_SERVER_CORE_UPDATE_RULE_H_
