// The data a training group (or a validation pool) works on, whichever way
// the job's spec gives it: IDX files loaded whole into memory (dataset.h),
// or file lists (HDF5, NumPy) streamed unit by unit (data_stream.h), of
// which a rank holds only the metadata up front.
//
//   MPILEARN_ASSIGN_OR_RETURN(TrainingData data,
//                             LoadTrainingData(spec.data(), spec.batch_size()));
//   data.train_samples();   // for NextDataUnitRequest.train_samples
//   if (data.streamed()) { data.files->train.rows ... }
//   data.transform.Apply(&batch.features);  // streamed rows, as read
//
// data.normalization is applied by LoadTrainingData to every in-memory
// split (and to the streamed training sample); streamed rows get it from
// whoever reads them (trainer, evaluation, validation pool) through
// `transform`.
//
// Thread safety: immutable once loaded; copies share the files' metadata.
#ifndef MPILEARN_WORKER_DATA_TRAINING_DATA_H_
#define MPILEARN_WORKER_DATA_TRAINING_DATA_H_

#include <cstdint>
#include <memory>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/spec/job_config.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/data_stream.h"
#include "worker/data/dataset.h"

namespace mpilearn::worker {

// The spec's data.normalization, ready to apply to features.
class FeatureTransform {
 public:
  // The identity ("none").
  FeatureTransform() = default;
  // x * scale + offset.
  static FeatureTransform Scale(double scale, double offset);
  // (x - mean) / std per feature; `mean` and `std` have one row's shape
  // (std > 0).
  static FeatureTransform Standardize(torch::Tensor mean, torch::Tensor std);

  bool identity() const { return kind_ == Kind::kIdentity; }
  // Transforms float32 features [n, ...] in place.
  void Apply(torch::Tensor* features) const;

  const torch::Tensor& mean() const { return mean_; }
  const torch::Tensor& std() const { return std_; }

 private:
  enum class Kind { kIdentity, kScale, kStandardize };
  Kind kind_ = Kind::kIdentity;
  double scale_ = 1.0;
  double offset_ = 0.0;
  torch::Tensor mean_;
  torch::Tensor std_;
};

// Per-feature mean and standard deviation (population, in double, then
// float32) of features [n, ...] given chunk by chunk: Chan et al.'s
// pairwise combination, so chunk sizes do not change the result beyond
// rounding.
class FeatureMoments {
 public:
  void Add(const torch::Tensor& features);
  int64_t rows() const { return rows_; }
  // The transform of these moments; a feature with std 0 gets std 1 (only
  // centred). Requires rows() > 0.
  FeatureTransform Standardize() const;

 private:
  int64_t rows_ = 0;
  torch::Tensor mean_;  // float64, one row's shape
  torch::Tensor m2_;    // sum of squared deviations, float64
};

struct TrainingData {
  // Shapes and label kind (input_shape, num_classes, float_labels) always.
  // In memory: every split. Streamed: `train` holds only the first training
  // rows (for BuildJobModel and Preflight); validation and test are empty.
  DatasetSplits splits;
  // Set when the data is streamed from file lists.
  std::shared_ptr<const FileSplits> files;
  // data.normalization (already applied to `splits`).
  FeatureTransform transform;

  bool streamed() const { return files != nullptr; }
  // Training rows of one epoch over every group.
  int64_t train_samples() const;
  int64_t validation_samples() const;
};

// Loads the job's data: IDX whole (LoadDatasets); file lists by their
// metadata (ScanDataFiles) plus their first `sample_rows` training rows.
// For NormalizationMode::kStandardize the statistics come from the first
// normalization.sample_rows training rows (read in chunks when streamed).
// Errors as those functions give them.
absl::StatusOr<TrainingData> LoadTrainingData(const JobConfig& config,
                                              int64_t sample_rows);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_TRAINING_DATA_H_
