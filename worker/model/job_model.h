// A job's model and loss as every rank builds them from the job's spec and
// its data: the training group's ranks (worker/trainer.h) and a validation
// pool's (worker/validation_pool.h) alike, so both hold the same layout.
//
//   torch::manual_seed(spec.seed());  // the same initial weights everywhere
//   MPILEARN_ASSIGN_OR_RETURN(JobModel job, BuildJobModel(spec, splits));
//   MPILEARN_RETURN_IF_ERROR(Preflight(job, splits.train, spec.batch_size()));
//
// Thread safety: a JobModel belongs to one thread (its Model does).
#ifndef MPILEARN_WORKER_MODEL_JOB_MODEL_H_
#define MPILEARN_WORKER_MODEL_JOB_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/loss.h"
#include "worker/model/model.h"

namespace mpilearn::worker {

struct JobModel {
  Model model;
  Loss loss;
  // The job's weights as the master holds them: the model's state names and
  // shapes (buffers marked), with the data's input shape and the model's
  // outputs (TensorSetHeader.input_shape, outputs). Version 0.
  v1::TensorSetHeader layout;
  // The data's classes (DatasetSplits::num_classes), for Loss::CheckOutput.
  int64_t num_classes = 0;
};

// The loss `spec` names, and the model (built-in or TorchScript) for the
// data's sample shape with as many outputs as the loss needs for the
// training labels. Errors name the spec field or file and say what to
// change (Loss::FromSpec, Loss::OutputsFor, Model::FromSpec).
absl::StatusOr<JobModel> BuildJobModel(const JobConfig& config,
                                       const DatasetSplits& data);

// One forward and backward pass in training mode on the first `batch`
// samples of `train`, so that a model that does not fit its data fails
// before training starts, with the cause: an output shape the loss cannot
// take (InvalidArgument naming both shapes), a LibTorch error in forward or
// backward (InvalidArgument with LibTorch's message, shortened), a loss
// that is NaN or infinite (InvalidArgument). Leaves the model's state and
// gradients as they were. OK for an empty `train`.
absl::Status Preflight(JobModel& job, const Dataset& train, int64_t batch);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MODEL_JOB_MODEL_H_
