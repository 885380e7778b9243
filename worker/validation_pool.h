// The validation pool: the ranks of one
// `mpirun -np M mpilearn-worker --master HOST:PORT --role validate` run, which
// validate the weight snapshots the master publishes (SnapshotSpec) so that
// training groups need not stop for it.
//
//   ValidationPoolOptions options;
//   options.label = "v-1";
//   ValidationPool pool(group, leader ? client.get() : nullptr, options);
//   MPILEARN_RETURN_IF_ERROR(pool.Run());   // until Stop() or idle
//
// The leader (rank 0) subscribes to the snapshots and, for each one,
// broadcasts its header and then its weights to every rank. Every rank
// loads the job's validation data once (cached per job), builds the job's
// model, takes the weights and evaluates its shard of the validation set
// (summed cross-entropy and argmax accuracy, as a training group does); the
// sums are reduced over the group and the leader reports them
// (ReportValidation, source "pool <label>") and prints a line.
//
// A job whose data cannot be loaded or whose snapshot does not fit the model
// its spec builds is skipped (the leader logs why), without ending the pool.
// The pool ends cleanly on Stop() (the leader cancels its stream, then
// broadcasts a stop so all ranks leave MPI together) or after
// `exit_when_idle` without a snapshot. When the stream ends or fails
// without being asked to (the master shut down or restarted), the leader
// subscribes again, every second for up to `resubscribe_for`, and the pool
// goes on with the new stream; it fails only when that time runs out.
//
// With options.trace set, every rank records `wait` (the leader waiting for
// and receiving the next snapshot; the others waiting for the leader),
// `validation` per snapshot and, inside it, `broadcast` (the weights).
//
// Threading: Run on each rank's MPI thread; Stop from any thread (a signal
// watcher), on the leader. The leader runs one helper thread that cancels
// the stream when asked to stop or idle.
#ifndef MPILEARN_WORKER_VALIDATION_POOL_H_
#define MPILEARN_WORKER_VALIDATION_POOL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "common/trace.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/dataset.h"
#include "worker/evaluation.h"
#include "worker/model/job_model.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

struct ValidationPoolOptions {
  // Jobs to validate; empty: every job, including later ones.
  std::vector<std::string> job_ids;
  // Names the pool in records ("pool <label>") and the master's logs.
  std::string label = "pool";
  // Stop after this long without a snapshot (infinite: never).
  absl::Duration exit_when_idle = absl::InfiniteDuration();
  // Samples per forward pass.
  int64_t eval_batch_size = 1000;
  // Jobs whose data and model are kept loaded (least recently used go).
  int max_cached_jobs = 4;
  // Print a line per validation on the leader's stdout.
  bool print = true;
  // Polled by the leader (every 100 ms): true asks the pool to stop, like
  // Stop(). For signal handlers, which cannot call Stop().
  const std::atomic<bool>* stop_requested = nullptr;
  // This rank's trace recorder (not owned); null: no tracing.
  TraceRecorder* trace = nullptr;
  // How long the leader tries to subscribe again after losing its stream
  // (a master restart); zero: the pool fails at once.
  absl::Duration resubscribe_for = absl::Minutes(5);
};

// What the pool did, on the leader (other ranks: zeros).
struct ValidationPoolResult {
  int64_t validated = 0;  // snapshots validated and reported
  int64_t failed = 0;     // snapshots skipped (data, model or report error)
};

class ValidationPool {
 public:
  // `master` is the leader's connection (rank 0); null on other ranks.
  ValidationPool(Collectives& group, MasterClient* master,
                 ValidationPoolOptions options);
  ~ValidationPool();

  // Validates snapshots until stopped or idle; every rank returns together.
  absl::StatusOr<ValidationPoolResult> Run();

  // Asks the pool to finish (leader; thread-safe, idempotent). Run returns
  // once the snapshot in hand, if any, is done.
  void Stop();

 private:
  // One job's model and this rank's shard of its validation set.
  struct JobState {
    absl::Status error;  // why the job cannot be validated; OK if it can
    std::optional<JobModel> model;  // set unless error
    Dataset shard;
    int64_t last_used = 0;
  };

  // Leader: the next snapshot as a message for every rank ("V" + header,
  // "S" to stop, "E" + error); weights into `weights`.
  std::string NextMessage(std::vector<std::vector<float>>* weights);
  // All ranks: the job's cached state, loading it on first use (with the
  // group agreeing on success).
  JobState& PrepareJob(const v1::SnapshotHeader& header);
  JobState LoadJob(const v1::JobSpec& spec);
  // All ranks: weights into the model (broadcast from the leader), then the
  // group's metrics.
  Evaluation Validate(JobState& job, const std::vector<std::vector<float>>& weights);
  // Leader: ReportValidation and the printed line.
  bool Report(const v1::SnapshotHeader& header, const Evaluation& metrics);
  // Leader's helper thread: cancels the stream on Stop() or when idle.
  void WatchForStop();
  // Leader: a new subscription to the pool's jobs.
  absl::StatusOr<std::unique_ptr<SnapshotStream>> Subscribe();
  // Leader, after its stream ended (`why`) without a stop: subscribes again
  // (see the class comment). "" when it did, else the message for every
  // rank ("S" when asked to stop meanwhile, "E..." when it gave up).
  std::string Resubscribe(const std::string& why);

  bool leader() const { return group_.rank() == 0; }

  Collectives& group_;
  MasterClient* const master_;
  const ValidationPoolOptions options_;
  const std::string tag_;  // "[pool LABEL rank R/N] " for log lines

  std::map<std::string, JobState> jobs_;  // by job id; MPI thread only
  int64_t uses_ = 0;

  absl::Mutex mu_;
  // The leader's subscription; replaced when it resubscribes. The MPI
  // thread reads from a copy of the pointer outside mu_; the helper thread
  // cancels the current one under mu_ (SnapshotStream allows Cancel from
  // another thread).
  std::shared_ptr<SnapshotStream> stream_ ABSL_GUARDED_BY(mu_);
  absl::CondVar wake_;  // the helper thread: stop_, finished_, waiting_since_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Run is returning
  // When the leader began waiting for the next snapshot; InfiniteFuture
  // while it works on one.
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_VALIDATION_POOL_H_
