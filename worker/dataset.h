// In-memory image classification data sets, loaded from IDX files as a job's
// DataSpec describes them.
//
//   MPILEARN_ASSIGN_OR_RETURN(DatasetSplits splits,
//                             LoadDatasets(job.data()));
//   Dataset mine = Shard(splits.train, rank, world_size);
//   // mine.images: float32 [n, 1, 28, 28] in [0, 1]; mine.labels: int64 [n]
//
// Thread safety: LoadDatasets and Shard have no shared state. A Dataset's
// tensors may share storage with the Dataset they were cut from (see Shard),
// so treat them as read-only.
#ifndef MPILEARN_WORKER_DATASET_H_
#define MPILEARN_WORKER_DATASET_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {
namespace worker {

// A set of labelled single-channel images.
struct Dataset {
  // float32 [N, 1, H, W], pixel values scaled to [0, 1]. Undefined (default
  // constructed) for an empty Dataset.
  torch::Tensor images;
  // int64 [N], class indices in [0, 255]. Undefined for an empty Dataset.
  torch::Tensor labels;

  // Number of samples N; 0 for an empty Dataset.
  int64_t size() const;
};

struct DatasetSplits {
  Dataset train;
  // Held out from the end of the training files, or loaded from separate
  // validation files. Empty only when data.validation_count is 0.
  Dataset validation;
  // Empty when the spec names no test files.
  Dataset test;
  // 1 + the largest label in any split: the width of the model's output.
  int64_t num_classes = 0;
};

// Loads the data sets `spec` names (field semantics and defaults: see
// DataSpec in proto/mpilearn.proto). Images must be 3-dim IDX arrays
// [N, H, W] of unsigned bytes and labels 1-dim [N]; every split must have the
// training images' H and W.
//
// Errors name the offending spec field, e.g.
//   "data.train_images: cannot open 'x.gz': No such file or directory".
//   NotFound etc.     a file cannot be opened;
//   InvalidArgument   a required field is missing, a count is negative or
//                     too large, or a file does not hold what it should;
//   DataLoss          a file is truncated or corrupt.
absl::StatusOr<DatasetSplits> LoadDatasets(const mpilearn::v1::DataSpec& spec);

// Rank `rank`'s share of `data` among `world` ranks: a contiguous slice, the
// sizes of any two shards differing by at most one, ranks in order covering
// `data` exactly. The slice is a view sharing `data`'s storage (no copy).
// Requires 0 <= rank < world (checked; a violation is a programming error).
Dataset Shard(const Dataset& data, int rank, int world);

}  // namespace worker
}  // namespace mpilearn

#endif  // MPILEARN_WORKER_DATASET_H_
