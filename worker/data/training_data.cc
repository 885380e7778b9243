#include "worker/data/training_data.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mpilearn::worker {

int64_t TrainingData::train_samples() const {
  return streamed() ? files->train.total_rows() : splits.train.size();
}

int64_t TrainingData::validation_samples() const {
  return streamed() ? files->validation.total_rows() : splits.validation.size();
}

FeatureTransform FeatureTransform::Scale(double scale, double offset) {
  FeatureTransform transform;
  transform.kind_ = Kind::kScale;
  transform.scale_ = scale;
  transform.offset_ = offset;
  return transform;
}

FeatureTransform FeatureTransform::Standardize(torch::Tensor mean,
                                               torch::Tensor std) {
  FeatureTransform transform;
  transform.kind_ = Kind::kStandardize;
  transform.mean_ = std::move(mean);
  transform.std_ = std::move(std);
  return transform;
}

void FeatureTransform::Apply(torch::Tensor* features) const {
  if (!features->defined() || features->numel() == 0) return;
  switch (kind_) {
    case Kind::kIdentity:
      return;
    case Kind::kScale:
      features->mul_(scale_).add_(offset_);
      return;
    case Kind::kStandardize:
      features->sub_(mean_).div_(std_);
      return;
  }
}

void FeatureMoments::Add(const torch::Tensor& features) {
  const int64_t n = features.size(0);
  if (n == 0) return;
  const torch::Tensor x = features.to(torch::kFloat64);
  const torch::Tensor mean = x.mean(0);
  const torch::Tensor m2 = (x - mean).square().sum(0);
  if (rows_ == 0) {
    mean_ = mean;
    m2_ = m2;
  } else {
    const double a = static_cast<double>(rows_);
    const double b = static_cast<double>(n);
    const torch::Tensor delta = mean - mean_;
    mean_ = mean_ + delta * (b / (a + b));
    m2_ = m2_ + m2 + delta.square() * (a * b / (a + b));
  }
  rows_ += n;
}

FeatureTransform FeatureMoments::Standardize() const {
  torch::Tensor std = (m2_ / static_cast<double>(rows_)).sqrt();
  std = torch::where(std > 0, std, torch::ones_like(std));
  return FeatureTransform::Standardize(mean_.to(torch::kFloat32),
                                       std.to(torch::kFloat32));
}

namespace {

// Builds data->transform from `config` (for standardize, from the first
// sample_rows training rows: in memory, or read in chunks) and applies it
// to the in-memory splits.
absl::Status PrepareTransform(const JobConfig& config, TrainingData* data) {
  const v1::Normalization& norm = config.spec().data().normalization();
  if (config.normalization() == NormalizationMode::kScale) {
    data->transform = FeatureTransform::Scale(norm.scale(), norm.offset());
  } else if (config.normalization() == NormalizationMode::kStandardize) {
    const int64_t rows = std::min(std::max<int64_t>(norm.sample_rows(), 1),
                                  data->train_samples());
    FeatureMoments moments;
    if (!data->streamed()) {
      moments.Add(data->splits.train.features.narrow(0, 0, rows));
    } else {
      FileReader reader(data->files->train, data->files->names,
                        config.skips_bad_values());
      constexpr int64_t kChunk = 4096;
      for (int64_t begin = 0; begin < rows; begin += kChunk) {
        MPILEARN_ASSIGN_OR_RETURN(
            DataRows chunk,
            reader.ReadRange(begin, std::min(rows, begin + kChunk)));
        moments.Add(chunk.features);
      }
    }
    if (moments.rows() == 0) {
      return absl::InvalidArgumentError(
          "data.normalization: standardize has no training rows to compute "
          "the mean and std from");
    }
    data->transform = moments.Standardize();
  }
  for (Dataset* split : {&data->splits.train, &data->splits.validation,
                         &data->splits.test}) {
    data->transform.Apply(&split->features);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(const JobConfig& config,
                                              int64_t sample_rows) {
  const v1::DataSpec& spec = config.spec().data();
  TrainingData data;
  if (spec.train_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(data.splits, LoadDatasets(spec));
    MPILEARN_RETURN_IF_ERROR(PrepareTransform(config, &data));
    return data;
  }
  MPILEARN_ASSIGN_OR_RETURN(FileSplits files, ScanDataFiles(spec));
  data.splits.input_shape = files.input_shape;
  data.splits.num_classes = files.num_classes;
  data.splits.float_labels = files.float_labels;
  data.splits.heads = files.heads;
  // The same rows training would give: with bad_values "skip" the sample
  // leaves out rows holding a NaN or infinity too.
  FileReader reader(files.train, files.names, config.skips_bad_values());
  const int64_t rows =
      std::min(std::max<int64_t>(sample_rows, 1), files.train.total_rows());
  MPILEARN_ASSIGN_OR_RETURN(DataRows first, reader.ReadRange(0, rows));
  data.splits.train.features = std::move(first.features);
  data.splits.train.labels = std::move(first.labels);
  data.files = std::make_shared<const FileSplits>(std::move(files));
  MPILEARN_RETURN_IF_ERROR(PrepareTransform(config, &data));
  return data;
}

}  // namespace mpilearn::worker
