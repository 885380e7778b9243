// The worker's training loop: what every rank of a group runs once the group
// has a job.
//
//   Trainer trainer(group, master, registration, std::move(data), options);
//   MPILEARN_ASSIGN_OR_RETURN(TrainResult result, trainer.Run());
//
// Data comes from the master's queue in units (NextDataUnit): the leader
// asks for the next unit, broadcasts it, and every rank trains on its
// contiguous share of the unit. A faster group simply asks more often, so
// it trains more units. In memory (IDX), a unit is a range of the epoch's
// shuffled order (a permutation every worker draws identically from the
// job's seed and the epoch). Streamed (file lists,
// worker/data/training_data.h), a unit is a range of rows in one file: the
// group asks the master to reserve the next unit too (read_ahead), and each
// rank's UnitPrefetcher reads its share of that unit while it trains the
// current one, and shuffles the rows within the share there too
// (data.shuffle_within_unit), so each batch is a slice. A read that fails
// on any rank fails the group together, with that rank's message (the
// file, dataset and rows).
//
// How updates reach the master depends on the job's algorithm: every
// `sync_every` batches the rank's Exchange (worker/exchange.h: downpour,
// sync, easgd or gem, chosen once from the spec) sends the window's update
// and installs the weights it brings back.
//
// When the master says a unit finished an epoch, the group agrees on the
// master's newest weights, splits the validation set over its ranks, reduces
// the metrics and the leader reports them. When the master says the job's
// data is done, the group that finished it evaluates the test set.
//
// Observability:
//   telemetry: the leader sends the group's cumulative figures (StepTimes,
//             CPU time and resident memory summed over the ranks, its own
//             wall time) with every NextDataUnit request. Other ranks' values
//             ride on the allreduce that already ends every unit, so they
//             cost no extra collective; they are as of the group's last unit.
//   progress: the leader feeds the master's JobProgress from every answer
//             to a ProgressReporter (progress.h), per TrainerOptions.
//   trace:    with TrainerOptions::trace set, every rank records spans:
//             data_load (for streamed data: waiting for the unit's read),
//             forward_backward, local_step (easgd), push, pull,
//             next_unit (leader), wait (WAIT answers; non-leaders waiting for
//             the leader's unit), allreduce, broadcast, validation, test.
//             Without it a span costs one null-pointer branch.
//
// Threading: one thread per rank (the MPI thread). Errors from the master or
// the data come back as a Status; the caller decides how to end the group.
// An error the leader broadcasts reaches every rank with the leader's code
// and reason (BroadcastStatus), so IsGroupUnknown (worker/master_errors.h)
// answers the same on every rank.
#ifndef MPILEARN_WORKER_TRAINER_H_
#define MPILEARN_WORKER_TRAINER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/master_connection.h"
#include "common/spec/job_config.h"
#include "common/trace.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/dataset.h"
#include "worker/evaluation.h"
#include "worker/exchange.h"
#include "worker/model/job_model.h"
#include "worker/master_errors.h"
#include "worker/mpi_group.h"
#include "worker/progress.h"
#include "worker/data/training_data.h"

namespace mpilearn::worker {

struct TrainerOptions {
  // Samples per forward pass when evaluating (validation, test).
  int64_t eval_batch_size = 1000;
  // Print the per-epoch line on the leader's stdout.
  bool print_epochs = true;
  // Test aid: sleep this long after every batch, to make a slow group.
  int64_t slowdown_ms_per_batch = 0;
  // Test aid: the first N reads of streamed units fail with DataLoss, as a
  // file that cannot be read would (counted over the rank's life).
  int fail_unit_reads = 0;
  // The leader's progress line (stdout); off unless asked for.
  ProgressOptions progress{ProgressMode::kOff};
  // Where the rank trains (worker/model/device.h). Off the CPU the exchange
  // works on host copies of the model's state (ExchangeContext::mirrored).
  torch::Device device = torch::kCPU;
  // This rank's trace recorder (not owned); null: no tracing.
  TraceRecorder* trace = nullptr;
};

struct TrainResult {
  int epochs_reported = 0;   // epochs this group validated
  uint64_t units = 0;        // data units this group trained
  int64_t samples = 0;       // training samples this group trained
  uint64_t stale_dropped = 0;  // updates the master rejected as stale
  Evaluation validation;     // the last validation this group ran
  // Set when this group finished the job (`finished_job`): the test set.
  bool finished_job = false;
  Evaluation test;
  double seconds = 0.0;
  double train_seconds = 0.0;  // training units only (no validation, waits)
  double validation_seconds = 0.0;  // epoch-end (in-band) validation
  StepTimes times;
  double samples_per_second = 0.0;  // this group, training only
  double samples_per_second_per_rank = 0.0;
};

class Trainer {
 public:
  Trainer(Collectives& group, MasterConnection& master,
          v1::RegisterGroupResponse registration, JobConfig config,
          TrainingData data, TrainerOptions options);

  absl::StatusOr<TrainResult> Run();

  // After Run failed: true when every rank of the group failed at the same
  // point on the leader's word (the leader's error was broadcast), so the
  // ranks are still together for collectives; false when this rank failed
  // on its own and the others may be stuck in a collective.
  bool failed_together() const { return context_.failed_together; }

 private:
  absl::StatusOr<TrainResult> RunLoop();
  // Broadcasts the leader's outcome: every rank returns the leader's status
  // (code and reason kept); notes a failure as failed_together.
  absl::Status AgreeOnLeaderStatus(const absl::Status& status) {
    return worker::AgreeOnLeaderStatus(context_, status);
  }
  // This rank's cumulative figures, in the order the unit-end allreduce
  // carries them: data, compute, master, mpi seconds, CPU seconds, RSS.
  std::array<double, 6> OwnTelemetry() const;
  void SetTelemetry(const double* figures);
  // Every rank builds the model and loss and runs a first pass (Preflight);
  // all fail together, with the first failing rank's cause, or none does.
  // Then the leader offers the initial weights and every rank takes the
  // master's.
  absl::Status BuildModelAndInitWeights();
  // Leader asks the master for the next unit (reporting `completed`); every
  // rank receives the answer or the leader's error.
  absl::StatusOr<v1::NextDataUnitResponse> NextUnit(
      const std::vector<v1::CompletedUnit>& completed);
  // Trains this rank's share of `unit` (streamed data: `next`, when set, is
  // read ahead meanwhile); returns {loss sum, samples} summed over the
  // group.
  absl::StatusOr<v1::CompletedUnit> TrainUnit(const v1::DataUnit& unit,
                                              const v1::DataUnit* next);
  // This rank's part of `unit`: rows [begin, end) of its file (streamed) or
  // of the epoch's order (in memory), and the shuffle seed of its rows.
  RowRange RankRows(const v1::DataUnit& unit) const;
  // Leader pulls the master's newest weights; all ranks receive them.
  absl::Status SyncToMasterWeights();
  // Validates after `epoch` (0-based) finished and the leader reports it.
  absl::Status ValidateEpoch(int epoch);
  enum class Split { kValidation, kTest };
  // The group's evaluation of a split (a collective); for streamed data
  // every rank reads its share batch by batch.
  absl::StatusOr<Evaluation> Evaluate(Split split);
  const torch::Tensor& EpochOrder(int epoch);

  bool leader() const { return group_.rank() == 0; }

  Collectives& group_;
  MasterConnection& master_;
  const v1::RegisterGroupResponse registration_;
  const JobConfig config_;   // registration_.spec(), read once
  const v1::JobSpec& spec_;  // config_.spec()
  TrainingData data_;
  const TrainerOptions options_;
  // Streamed data only: the training rows read ahead, and the readers of
  // this rank's validation and test shares.
  std::unique_ptr<UnitPrefetcher> prefetch_;
  std::unique_ptr<FileReader> validation_reader_;
  std::unique_ptr<FileReader> test_reader_;
  int unit_reads_failed_ = 0;  // by fail_unit_reads

  // The job's model and loss; set by BuildModelAndInitWeights.
  std::optional<JobModel> job_;
  // The parameters, weight version, step times and stale drops this rank
  // shares with its exchange.
  ExchangeContext context_;
  std::unique_ptr<Exchange> exchange_;  // set with the model
  std::map<int, torch::Tensor> orders_;  // epoch -> shuffled order
  absl::Time run_start_;
  double validation_seconds_ = 0.0;
  // The group's figures summed over its ranks as of the last unit's end
  // (the leader's own before the first); the leader sends them.
  v1::GroupTelemetry telemetry_;
  bool have_group_telemetry_ = false;
  TraceRecorder* const trace_;
  std::unique_ptr<ProgressReporter> progress_;  // leader only
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_TRAINER_H_
