// Converts a data set's features and labels into one HDF5 data file
// (hdf5_writer.h), the layout a job's data file list takes: what the
// convert_data tool runs.
//
// Sources:
//   IDX (gzip'd or plain): `features` and `labels` name the two files. Each
//     array keeps its IDX element type and shape (Fashion-MNIST stays uint8
//     [N, 28, 28] and reads back exactly as from IDX). The IDX reader holds
//     values as float: int32 values beyond +-2^24 and float64 values arrive
//     rounded to float32 already.
//   .npy / .npz (IsNumpyPath), read with OpenDataFile: `features` names the
//     .npy features (the labels are found beside it, see data_file.h) or the
//     .npz archive; `labels` is empty. Each array is stored as what the
//     worker reads from it, in the source's type where that is exact: uint8
//     features (unscaled back to their bytes), int8, int16 and float32 as
//     stored, integer class labels [N] in their integer type; int32 and
//     int64 features or label rows, and float64, become float32.
//
// The output is written to OUT.tmp-PID and renamed to OUT once complete, so
// a failure never leaves a partial file under OUT's name. Errors are those
// of the readers and of Hdf5DataWriter. Not thread-safe (one conversion
// per thread).
#ifndef MPILEARN_WORKER_DATA_CONVERT_TO_HDF5_H_
#define MPILEARN_WORKER_DATA_CONVERT_TO_HDF5_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mpilearn::worker {

// One conversion. The caller checks the fields (convert_data's flags):
// limit >= 0, chunk_rows >= 0, gzip 0-9 and only with chunk_rows > 0,
// labels given exactly for IDX features.
struct ConvertOptions {
  std::string features;
  std::string labels;  // empty for NumPy sources
  std::string out;
  int64_t limit = 0;          // 0: all rows
  int64_t chunk_rows = 1024;  // 0: contiguous
  int gzip = 0;
};

// Whether `path` names a NumPy source (.npy or .npz, any case).
bool IsNumpyPath(const std::string& path);

// Writes options.out and returns the line that reports it, e.g.
// "wrote train.h5: features uint8 [60000, 28, 28], labels uint8 [60000],
// chunks of 1024 rows, gzip 4".
absl::StatusOr<std::string> ConvertToHdf5(const ConvertOptions& options);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_CONVERT_TO_HDF5_H_
