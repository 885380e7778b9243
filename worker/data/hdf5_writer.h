// Writes a data file in the HDF5 layout the reader takes (data_file.h): two
// datasets `features` and `labels` of the same row count, each of any shape
// [rows, ...] and element type, contiguous or chunked by rows (optionally
// gzip'd).
//
//   MPILEARN_ASSIGN_OR_RETURN(auto writer, Hdf5DataWriter::Create(
//       "train.h5", {ElementType::kUint8, {n, 28, 28}},
//       {ElementType::kUint8, {n}}, {.chunk_rows = 1024, .gzip = 4}));
//   MPILEARN_RETURN_IF_ERROR(writer->WriteRows(0, n, features, labels));
//   MPILEARN_RETURN_IF_ERROR(writer->Finish());
//
// Values are handed over as float32 or int64 tensors and HDF5 converts them
// to the stored type (exactly, for values the stored type holds). Errors:
// InvalidArgument for chunks HDF5 refuses (4 GiB or more), Internal when
// HDF5 cannot create or write the file. Not thread-safe: one thread uses a
// writer; a file that failed to write is left for the caller to remove.
#ifndef MPILEARN_WORKER_DATA_HDF5_WRITER_H_
#define MPILEARN_WORKER_DATA_HDF5_WRITER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/data_file.h"
#include "worker/data/hdf5_handle.h"

namespace mpilearn::worker {

// One array as the file stores it: its element type and shape [rows, ...].
struct StoredArray {
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> dims;

  // Elements per row: the product of dims[1..].
  int64_t RowElements() const;
};

// "uint8 [60000, 28, 28]"
std::string DescribeStoredArray(const StoredArray& array);

// How the writer lays out both datasets.
struct Hdf5Layout {
  int64_t chunk_rows = 1024;  // rows per chunk; 0 stores them contiguously
  int gzip = 0;               // chunk compression 1-9; 0 none; needs chunks
};

// A whole array to write as one dataset: its name, the stored type and the
// values (a float32 or int64 tensor of shape [rows, ...]).
struct NamedArray {
  std::string name;
  ElementType type = ElementType::kFloat32;
  torch::Tensor values;
};

// Writes `arrays` as the datasets of a new file `path` (created or
// truncated; contiguous), for files of several features or labels datasets
// (data.features_datasets). Errors as Hdf5DataWriter's.
absl::Status WriteHdf5Arrays(const std::string& path, const std::vector<NamedArray>& arrays);

class Hdf5DataWriter {
 public:
  // Creates (or truncates) `path` with datasets `features` and `labels`
  // shaped and typed as given (the same rows: dims[0]).
  static absl::StatusOr<std::unique_ptr<Hdf5DataWriter>> Create(
      const std::string& path, const StoredArray& features,
      const StoredArray& labels, const Hdf5Layout& layout);

  // Writes rows [begin, begin + n) of both datasets from contiguous float32
  // or int64 tensors of n * RowElements() values each.
  absl::Status WriteRows(int64_t begin, int64_t n,
                         const torch::Tensor& features,
                         const torch::Tensor& labels);

  // Closes the datasets and the file; Internal when the final flush fails
  // (a full disk). Call once, after the last WriteRows.
  absl::Status Finish();

 private:
  Hdf5DataWriter() = default;

  std::string path_;
  StoredArray features_info_;
  StoredArray labels_info_;
  // Declared file first, so the datasets are closed before it.
  Hid file_;
  Hid features_;
  Hid labels_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_HDF5_WRITER_H_
