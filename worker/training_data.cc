#include "worker/training_data.h"

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

int64_t TrainingData::test_samples() const {
  return streamed() ? files->test.total_rows() : splits.test.size();
}

absl::StatusOr<TrainingData> LoadTrainingData(const v1::DataSpec& spec,
                                              int64_t sample_rows) {
  TrainingData data;
  if (spec.train_files().empty()) {
    MPILEARN_ASSIGN_OR_RETURN(data.splits, LoadDatasets(spec));
    return data;
  }
  MPILEARN_ASSIGN_OR_RETURN(FileSplits files, ScanDataFiles(spec));
  data.splits.input_shape = files.input_shape;
  data.splits.num_classes = files.num_classes;
  data.splits.float_labels = files.float_labels;
  // The same rows training would give: with bad_values "skip" the sample
  // leaves out rows holding a NaN or infinity too.
  FileReader reader(files.train, files.names, spec.bad_values() == "skip");
  const int64_t rows =
      std::min(std::max<int64_t>(sample_rows, 1), files.train.total_rows());
  MPILEARN_ASSIGN_OR_RETURN(DataRows first, reader.ReadRange(0, rows));
  data.splits.train.features = std::move(first.features);
  data.splits.train.labels = std::move(first.labels);
  data.files = std::make_shared<const FileSplits>(std::move(files));
  return data;
}

}  // namespace mpilearn::worker
