// The data a training group (or a validation pool) works on, whichever way
// the job's spec gives it: IDX files loaded whole into memory (dataset.h),
// or file lists (HDF5, NumPy) streamed unit by unit (data_stream.h), of
// which a rank holds only the metadata up front.
//
//   MPILEARN_ASSIGN_OR_RETURN(TrainingData data,
//                             LoadTrainingData(spec.data(), spec.batch_size()));
//   data.train_samples();   // for NextDataUnitRequest.train_samples
//   if (data.streamed()) { data.files->train.rows ... }
//
// Thread safety: immutable once loaded; copies share the files' metadata.
#ifndef MPILEARN_WORKER_TRAINING_DATA_H_
#define MPILEARN_WORKER_TRAINING_DATA_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "worker/data_stream.h"
#include "worker/dataset.h"

namespace mpilearn::worker {

struct TrainingData {
  // Shapes and label kind (input_shape, num_classes, float_labels) always.
  // In memory: every split. Streamed: `train` holds only the first training
  // rows (for BuildJobModel and Preflight); validation and test are empty.
  DatasetSplits splits;
  // Set when the data is streamed from file lists.
  std::shared_ptr<const FileSplits> files;

  bool streamed() const { return files != nullptr; }
  // Training rows of one epoch over every group.
  int64_t train_samples() const;
  int64_t validation_samples() const;
  int64_t test_samples() const;
};

// Loads `spec`'s data: IDX whole (LoadDatasets); file lists by their
// metadata (ScanDataFiles) plus their first `sample_rows` training rows.
// Errors as those functions give them.
absl::StatusOr<TrainingData> LoadTrainingData(const v1::DataSpec& spec,
                                              int64_t sample_rows);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_TRAINING_DATA_H_
