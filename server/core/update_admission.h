// Update admission: whether a job takes a pushed update, and with what
// staleness and scale, decided by pure functions that change nothing.
//
//   // Before the job's lock: the one costly pass over the values.
//   const UpdateScan scan = ScanUpdate(update.values, ClipsGradients(config));
//   // Under it, after the job's own checks (its state, the group's):
//   if (AlreadyApplied(update, group.applied_sequences)) ...  // a retried push
//   MPILEARN_ASSIGN_OR_RETURN(const Admission admission,
//                             AdmitUpdate(update, scan, config, id, weights));
//   ... rule->ApplyGuarded(..., update.values, admission.scale,
//                          admission.max_update);
//
// AdmitUpdate refuses, in this order: a kind other than the algorithm's,
// tensors that do not match the weights in count or size, NaN/Inf
// (INVALID_ARGUMENT, ERROR_REASON_INVALID_REQUEST), then an update more
// than max_staleness versions behind (ABORTED, ERROR_REASON_STALE_UPDATE:
// IsStaleRefusal). Whether the applied result stays finite is the update
// rule's guard (UpdateRule::ApplyGuarded), not admission's.
//
// Threading: plain functions of their arguments; the caller keeps the
// weights it passes from changing during the call.
#ifndef MPILEARN_SERVER_CORE_UPDATE_ADMISSION_H_
#define MPILEARN_SERVER_CORE_UPDATE_ADMISSION_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"
#include "server/core/update/finite_bound.h"
#include "server/core/group_table.h"
#include "server/core/job_values.h"

namespace mpilearn::server {

// One pass over an update's values, made before the job's lock is taken:
// what admission, the guard and clipping need.
struct UpdateScan {
  // FirstNonFinite of the values.
  int non_finite = -1;
  // The largest |value| (meaningful when non_finite < 0).
  double max_abs = 0.0;
  // Per tensor, the sum of squares in double; only with `squares`.
  std::vector<double> sum_squares;
};
// Scans `values` (the sums of squares too when `squares`: clipping). The
// non-finite test and the maximum are one vectorised pass (MaxAbsBits).
UpdateScan ScanUpdate(const std::vector<std::vector<float>>& values,
                      bool squares);

// Whether the job clips gradients: optimizer.clip_grad_norm > 0 and the
// algorithm is downpour or sync.
bool ClipsGradients(const JobConfig& config);

// The factor optimizer.clip_grad_norm scales a gradient by, as PyTorch's
// clip_grad_norm_ computes it: with N the L2 norm over every trainable
// tensor of the update (buffers excluded, `layout` says which),
// min(1, clip / (N + 1e-6)); 1 when !ClipsGradients(config). `scan` must
// hold the sums of squares when clipping. `whole_norm`, when larger, stands
// for N: the norm of the whole update of which these values are a slice
// (a parameter shard's).
double ClipScale(const JobConfig& config, const UpdateScan& scan,
                 const v1::TensorSetHeader& layout, double whole_norm = 0.0);

// The factor an update computed `staleness` versions behind is scaled by:
// 1 / max(1, staleness) with staleness_scaling "inverse", else 1.
float StalenessScale(const JobConfig& config, uint64_t staleness);

// INVALID_ARGUMENT (ERROR_REASON_INVALID_REQUEST) naming tensor `name`, which
// holds NaN or Inf; `what` names the tensors ("gradient", "update",
// "initial weight").
absl::Status NonFiniteError(absl::string_view what, absl::string_view name);

// Checks an update to the job `job_id` of `config` (named in messages) whose
// weights are `weights`: the kind its algorithm takes, as many tensors as
// the weights, each as long, no NaN/Inf. `non_finite` is FirstNonFinite of
// update.values, scanned beforehand. INVALID_ARGUMENT
// (ERROR_REASON_INVALID_REQUEST) otherwise.
absl::Status CheckUpdate(const GradientUpdate& update, int non_finite,
                         const JobConfig& config, const std::string& job_id,
                         const WeightsSnapshot& weights);

// The staleness of an update computed on `base_version` while the master is
// at `version` (0 if not behind). ABORTED (ERROR_REASON_STALE_UPDATE)
// beyond the spec's max_staleness, when that is > 0.
absl::StatusOr<uint64_t> StalenessOf(const JobConfig& config,
                                     uint64_t base_version, uint64_t version);

// Whether a refusal of AdmitUpdate (or StalenessOf) is for staleness: the
// job counts those (JobStatus.stale_rejected).
bool IsStaleRefusal(const absl::Status& status);

// Whether the group applied this push of `update.rank` already:
// `applied` (rank -> its applied sequences) contains its sequence.
bool AlreadyApplied(const GradientUpdate& update,
                    const std::map<int, AppliedSequences>& applied);

// An admitted update: how to apply it.
struct Admission {
  // Master version minus the update's base version (0 if not behind).
  uint64_t staleness = 0;
  // StalenessScale times ClipScale: what the gradient, alpha or delta is
  // multiplied by.
  float scale = 1.0f;
  // The update's largest |value|: the guard's input.
  double max_update = 0.0;
};

// CheckUpdate, then StalenessOf against weights.header.version(), then the
// scale (see the file comment). `scan` is ScanUpdate(update.values,
// ClipsGradients(config)).
absl::StatusOr<Admission> AdmitUpdate(const GradientUpdate& update,
                                      const UpdateScan& scan,
                                      const JobConfig& config,
                                      const std::string& job_id,
                                      const WeightsSnapshot& weights);

// Checks initial weights: at least one tensor, `values` laid out as
// `header` says (fp32, one vector per tensor, each as long), no NaN/Inf.
// Returns the tensors' sizes (elements); INVALID_ARGUMENT
// (ERROR_REASON_INVALID_REQUEST) otherwise.
absl::StatusOr<std::vector<size_t>> CheckInitialWeights(
    const v1::TensorSetHeader& header,
    const std::vector<std::vector<float>>& values);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_ADMISSION_H_
