// The worker's training loop: what every rank of a group runs once the group
// has a job.
//
//   Trainer trainer(group, master, registration, std::move(data), options);
//   MPILEARN_ASSIGN_OR_RETURN(TrainResult result, trainer.Run());
//
// Per epoch, every rank draws the same permutation of the training set (from
// the job's seed and the epoch number) and trains on its contiguous share of
// it. How gradients reach the master depends on the job's algorithm:
//   downpour: each rank pushes its own gradient every `sync_every` batches
//             and continues from the weights the master returns, without
//             waiting for the other ranks;
//   sync:     the ranks average their gradients with MPI_Allreduce, the
//             leader (rank 0) pushes the average, and broadcasts the returned
//             weights with MPI_Bcast, so all ranks stay identical.
// At each epoch end the ranks agree on the master's newest weights, split the
// validation set, reduce the metrics, and the leader reports them. After the
// last epoch the test set is evaluated the same way and the leader tells the
// master the job is complete.
//
// Threading: one thread per rank (the MPI thread). Errors from the master or
// the data come back as a Status; the caller decides how to end the group.
#ifndef MPILEARN_WORKER_TRAINER_H_
#define MPILEARN_WORKER_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/master_client.h"
#include "proto/mpilearn.pb.h"
#include "worker/dataset.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

struct TrainerOptions {
  // Samples per forward pass when evaluating (validation, test).
  int64_t eval_batch_size = 1000;
  // Print the per-epoch line on the leader's stdout.
  bool print_epochs = true;
};

// Loss and accuracy over a data set, reduced over the group.
struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t samples = 0;
};

struct TrainResult {
  int epochs_trained = 0;
  Evaluation validation;  // after the last epoch
  Evaluation test;        // samples == 0 when the job has no test set
  double seconds = 0.0;
  double samples_per_second = 0.0;           // whole group, training only
  double samples_per_second_per_rank = 0.0;
};

class Trainer {
 public:
  Trainer(Collectives& group, MasterClient& master,
          v1::RegisterGroupResponse registration, DatasetSplits data,
          TrainerOptions options);

  absl::StatusOr<TrainResult> Run();

 private:
  // Seconds spent in each part of a training step, summed over an epoch.
  struct StepTimes {
    double data = 0, compute = 0, master = 0, mpi = 0;
  };

  absl::Status BuildModelAndInitWeights();
  // Sends the accumulated gradient (sum over `samples` samples) to the
  // master per the algorithm and installs the weights that come back.
  absl::Status Exchange(double samples, StepTimes& times);
  // Leader pulls the master's newest weights; all ranks receive them.
  absl::Status SyncToMasterWeights();
  Evaluation Evaluate(const Dataset& data);
  // Copies every parameter's gradient into grad_ and zeroes the gradients.
  void TakeGradients();

  bool leader() const { return group_.rank() == 0; }

  Collectives& group_;
  MasterClient& master_;
  const v1::RegisterGroupResponse registration_;
  const v1::JobSpec& spec_;  // registration_.spec()
  DatasetSplits data_;
  const TrainerOptions options_;

  torch::nn::Sequential model_{nullptr};
  std::vector<torch::Tensor> params_;
  v1::TensorSetHeader layout_;
  // Views of the parameters' storage, for receiving weights in place.
  std::vector<absl::Span<float>> param_views_;
  // The flat gradient buffer and its per-tensor views.
  std::vector<float> grad_;
  std::vector<absl::Span<const float>> grad_views_;
  uint64_t version_ = 0;  // weight version the parameters hold
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_TRAINER_H_
