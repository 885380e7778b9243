// A job's file lists (DataSpec.train_files, validation_files, test_files):
// which paths a list names. Shared by the workers, which open the files,
// and mpilearnctl, which checks at submit that they can be read.
#ifndef MPILEARN_COMMON_FILE_LIST_H_
#define MPILEARN_COMMON_FILE_LIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mpilearn {

// Whether `path` has the extension of a data file format the workers read
// (.h5, .hdf5, .npz, .npy, in any case).
bool IsDataFile(const std::string& path);

// The paths a job's file list names: its entries, or, for a single entry
// that is not a data file (IsDataFile), the lines of that text file (blank
// lines and lines starting with '#' skipped; relative paths are relative to
// the list's directory). `field` ("train_files") prefixes errors: NotFound
// for a list that cannot be read, InvalidArgument for one over 64 MiB or
// one that names no files. An empty `entries` gives no paths.
absl::StatusOr<std::vector<std::string>> ExpandFileList(
    absl::string_view field, const std::vector<std::string>& entries);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_FILE_LIST_H_
