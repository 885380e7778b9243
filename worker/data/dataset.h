// In-memory training data sets (features and labels), loaded from IDX files
// as a job's DataSpec describes them.
//
//   MPILEARN_ASSIGN_OR_RETURN(DatasetSplits splits,
//                             LoadDatasets(job.data()));
//   Dataset mine = Shard(splits.train, rank, world_size);
//   // Fashion-MNIST: mine.features float32 [n, 1, 28, 28] in [0, 1],
//   // mine.labels int64 [n]; splits.input_shape {1, 28, 28}.
//
// What the IDX element types become:
//   features (>= 2 dims [N, ...]): unsigned byte [N, H, W] -> float32
//     [N, 1, H, W] scaled by 1/255 (a single-channel image); unsigned byte of
//     any other rank -> float32 [N, ...] scaled by 1/255; every other type ->
//     float32 [N, ...] as stored.
//   labels: integer [N] -> int64 [N] class indices (>= 0); float [N] ->
//     float32 [N, 1]; float [N, K] -> float32 [N, K] (regression targets);
//     integer [N, C] -> float32 [N, C] (one-hot or multi-label rows).
//
// Thread safety: LoadDatasets and Shard have no shared state. A Dataset's
// tensors may share storage with the Dataset they were cut from (see Shard),
// so treat them as read-only.
#ifndef MPILEARN_WORKER_DATA_DATASET_H_
#define MPILEARN_WORKER_DATA_DATASET_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {
namespace worker {

// A set of samples and their labels.
struct Dataset {
  // float32 [N, ...] (see the file comment for the shape each IDX type
  // gives). Undefined (default constructed) for an empty Dataset.
  torch::Tensor features;
  // int64 [N] class indices, or float32 [N, K] targets or one-hot rows.
  // Undefined for an empty Dataset.
  torch::Tensor labels;

  // Number of samples N; 0 for an empty Dataset.
  int64_t size() const;
};

// The inputs and label sets of data with several (DataSpec.features_datasets,
// labels_datasets; worker/data/data_file.h's PackedLayout says how they are
// packed into Dataset's two tensors).
struct DataHeads {
  // Each input's row shape, in order, when there are several (the features
  // hold them flattened side by side); empty for one input.
  std::vector<std::vector<int64_t>> inputs;
  // One labels dataset among several: its columns in the packed labels and
  // what they hold.
  struct Labels {
    int64_t column = 0;   // the first
    int64_t columns = 1;  // 1 for class indices
    bool class_indices = false;
    // Class indices: 1 + the largest in any split; float rows: `columns`.
    int64_t num_classes = 0;
  };
  // Empty for one labels dataset.
  std::vector<Labels> labels;
};

struct DatasetSplits {
  Dataset train;
  // Held out from the training files (HeldOutRows: the last
  // validation_count rows, or a cross-validation fold), or loaded from
  // separate validation files. Empty only when data.validation_count is 0
  // and there are no folds.
  Dataset validation;
  // Empty when the spec names no test files.
  Dataset test;
  // The shape of one sample's features, without N: features.sizes()[1:] of
  // every non-empty split, e.g. {1, 28, 28} or {20, 6}.
  std::vector<int64_t> input_shape;
  // The width of the model's output: for class-index labels (float_labels
  // false) 1 + the largest label in any split; for float labels the row
  // width K (or C) shared by every split.
  int64_t num_classes = 0;
  // True when labels are float32 [N, K] rows (regression targets, one-hot or
  // multi-label rows); false when they are int64 [N] class indices.
  bool float_labels = false;
  // Several inputs or labels sets (then input_shape is the packed [F], and
  // with several labels sets float_labels is true and num_classes the
  // packed width).
  DataHeads heads;
};

// Class indices must be below this (2^20): it bounds the model's output
// layer and keeps every index exact in the float the IDX reader gives.
inline constexpr int64_t kMaxClasses = int64_t{1} << 20;

// Loads the data sets `spec` names (field semantics and defaults: see
// DataSpec in proto/mpilearn.proto). Every split must give the training
// split's per-sample feature shape, scale (unsigned byte or not) and kind of
// labels (class indices, or float rows of the same width).
//
// Errors name the offending spec field, e.g.
//   "data.train_images: cannot open 'x.gz': No such file or directory".
//   NotFound etc.     a file cannot be opened;
//   InvalidArgument   a required field is missing, a count is negative or
//                     too large, a file does not hold what it should (wrong
//                     rank, no samples, a negative or too large class index,
//                     a NaN or infinite value), or the splits disagree;
//   DataLoss          a file is truncated or corrupt.
absl::StatusOr<DatasetSplits> LoadDatasets(const mpilearn::v1::DataSpec& spec);

// Checks the counts and the cross-validation fields before any file is
// read: train_limit, test_limit and validation_count not negative; folds 0
// (off) or 2 to 100, fold in [0, folds); folds neither with validation
// files nor with a validation_count above 0. InvalidArgument naming the
// field.
absl::Status CheckDataCounts(const mpilearn::v1::DataSpec& spec);

// Rows [begin, end) of a list of rows.
struct RowBlock {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
};

// The rows held out for validation when `spec` gives no validation files,
// of its `rows` training rows (after train_limit, in list order): with
// data.folds, block data.fold, rows [fold * rows / folds,
// (fold + 1) * rows / folds); else the last validation_count rows (5000
// when unset). InvalidArgument for what CheckDataCounts refuses, for a
// validation_count that leaves no rows to train on, and for fewer rows than
// folds (each fold needs one). The messages describe the rows with `what`
// ("the training set has") and name `alternative`, the fields that give
// separate validation data.
absl::StatusOr<RowBlock> HeldOutRows(const mpilearn::v1::DataSpec& spec,
                                     int64_t rows, absl::string_view what,
                                     absl::string_view alternative);

// Rank `rank`'s share among `world` of `rows` rows, rows [begin, end): the
// shares' sizes differ by at most one, the first ones larger, and ranks in
// order cover every row. Requires 0 <= rank < world (checked).
struct ShareRange {
  int64_t begin = 0;
  int64_t end = 0;
};
ShareRange ShareOf(int64_t rows, int rank, int world);

// Rank `rank`'s share of `data` among `world` ranks: a contiguous slice, the
// sizes of any two shards differing by at most one, ranks in order covering
// `data` exactly. The slice is a view sharing `data`'s storage (no copy).
// Requires 0 <= rank < world (checked; a violation is a programming error).
Dataset Shard(const Dataset& data, int rank, int world);

}  // namespace worker
}  // namespace mpilearn

#endif  // MPILEARN_WORKER_DATA_DATASET_H_
