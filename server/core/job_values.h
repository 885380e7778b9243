// Plain values the master's core hands between its parts and to its sinks:
// weights at a version, an incoming update, what an update / validation /
// leave did, a job's metrics view. No behaviour, no locks: a sink or a
// transport includes this header, not job.h.
#ifndef MPILEARN_SERVER_CORE_JOB_VALUES_H_
#define MPILEARN_SERVER_CORE_JOB_VALUES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

// Weights at one version. Immutable once published, so replies can encode it
// without holding the job's lock.
struct WeightsSnapshot {
  v1::TensorSetHeader header;  // header.version is the weight version
  std::vector<std::vector<float>> values;
};

// An update assembled from a PushGradient stream (or built in process).
struct GradientUpdate {
  std::string group_id;
  int rank = 0;
  // What `values` holds; must match the job's algorithm (see Job).
  v1::UpdateKind kind = v1::UPDATE_KIND_GRADIENT;
  uint64_t base_version = 0;  // weight version the update was computed on
  // Per (group, rank), increasing; 0: not tracked. A number applied already
  // is not applied again (a retried push; AppliedSequences).
  uint64_t sequence = 0;
  // Informational: samples are counted from completed data units
  // (NextDataUnit), not from pushes.
  uint64_t samples = 0;
  double train_loss = 0.0;
  // The whole update's norm when `values` are a slice of it
  // (PushGradientRequest.Header.update_norm); 0: none given.
  double update_norm = 0.0;
  std::vector<std::vector<float>> values;  // laid out as the job's weights
};

// A job's weights and optimizer state as the state directory stores them.
// optimizer_state lists, for each state buffer B of the optimizer and each
// weight tensor W, a tensor named "B/W" shaped like W; its header's version
// is the optimizer's step count. Jobs without a master optimizer (easgd, gem)
// store an optimizer_state with no tensors whose version is the number of
// updates applied.
struct JobCheckpoint {
  v1::TensorSet weights;
  v1::TensorSet optimizer_state;
};

// What ApplyGradient did, for the registry (snapshot publication,
// checkpoints, metrics, traces).
struct AppliedUpdate {
  // False when the job was stopped by a rule and the update was dropped
  // (the reply then carries the final weights).
  bool applied = false;
  // The weights after the update (for easgd not the reply, which is the
  // centre before the move).
  std::shared_ptr<const WeightsSnapshot> weights;
  uint64_t updates_applied = 0;  // the job's total
  int epochs_done = 0;
  // checkpoint.every_updates updates were applied since the last checkpoint.
  bool checkpoint_due = false;
  // Staleness of the update (master version minus base version).
  uint64_t staleness = 0;
  // When the update itself (optimizer step, elastic move or delta add) ran,
  // without the wait for the job's lock or the checks (the trace's "apply"
  // event), and its wall time (the apply histogram).
  absl::Time apply_start;
  absl::Time apply_end;
  double apply_seconds() const {
    return absl::ToDoubleSeconds(apply_end - apply_start);
  }
  // Labels for the apply histogram: the job's engine device ("cpu",
  // "cuda:0") and UpdateRuleName(spec).
  std::string device;
  std::string optimizer;
};

// What the metrics exporter reads of a job at each scrape: cheap to take
// (no history, at most one validation).
struct JobMetricsView {
  // Status(/*with_history=*/false), with the latest validation, if any, as
  // the only entry of status.validations.
  v1::JobStatus status;
  // Validations recorded so far.
  uint64_t validations = 0;
};

// What RecordValidation did.
struct ValidationEffect {
  // Best so far by checkpoint.best_metric (best.pb is due).
  bool best_improved = false;
  // A stop rule ended the job with this validation.
  bool stopped = false;
};

// What Leave did.
struct LeaveEffect {
  // This call ended the job (COMPLETED or FAILED).
  bool ended = false;
  // This call stored the test result of a job a stop rule had ended.
  bool test_result_recorded = false;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_VALUES_H_
