// convert_data: the command line of ConvertToHdf5
// (worker/data/convert_to_hdf5.h): converts IDX or NumPy features and labels
// into one HDF5 file for a job's data file list.
//
//   convert_data --features train-images-idx3-ubyte.gz
//       --labels train-labels-idx1-ubyte.gz --out train.h5 --gzip 4
//
// Exit codes: 0 ok, 1 a file cannot be read or written, 2 usage error.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli_flags.h"
#include "common/status_macros.h"
#include "worker/data/convert_to_hdf5.h"

ABSL_FLAG(std::string, features, "",
          "The features: an IDX file (gzip'd or plain), a .npy file or a .npz "
          "archive. Required.");
ABSL_FLAG(std::string, labels, "",
          "The labels' IDX file; required with IDX features, not given with "
          ".npy or .npz.");
ABSL_FLAG(std::string, out, "", "The HDF5 file to write. Required.");
ABSL_FLAG(int64_t, limit, 0, "Convert only the first N rows (0: all).");
ABSL_FLAG(int64_t, chunk_rows, 1024,
          "Rows per HDF5 chunk; 0 stores each dataset contiguously.");
ABSL_FLAG(int32_t, gzip, 0,
          "gzip level 1-9 for the chunks (0: uncompressed); needs "
          "--chunk_rows > 0.");

namespace mpilearn {
namespace convert_data {
namespace {

// Exit codes (common/cli_flags.h RunToolMain): 0 ok, 1 error, 2 usage.

constexpr char kUsage[] =
    "convert_data: write a data set's features and labels as one HDF5 file\n"
    "(datasets `features` and `labels`) for a job's data file list.\n"
    "\n"
    "Usage: convert_data --features FILE [--labels FILE] --out OUT.h5\n"
    "           [--limit N] [--chunk_rows N] [--gzip LEVEL]\n"
    "\n"
    "  IDX sources (gzip'd or plain): --features and --labels name both\n"
    "  files; each array keeps its IDX type and shape (Fashion-MNIST stays\n"
    "  uint8 [N, 28, 28]).\n"
    "  NumPy sources: --features names the .npy features (the labels are\n"
    "  the .npy beside it with `features` replaced by `labels` in its name)\n"
    "  or a .npz archive; no --labels.\n"
    "\n"
    "Flags:\n"
    "  --features    features file. Required.\n"
    "  --labels      labels file (IDX sources only).\n"
    "  --out         HDF5 file to write. Required.\n"
    "  --limit       convert only the first N rows (default 0: all).\n"
    "  --chunk_rows  rows per chunk (default 1024; 0: contiguous).\n"
    "  --gzip        chunk compression level 1-9 (default 0: none).\n"
    "\n"
    "Exit codes: 0 ok, 1 a file cannot be read or written, 2 usage error.";

absl::StatusOr<worker::ConvertOptions> OptionsFromFlags() {
  worker::ConvertOptions options;
  options.features = absl::GetFlag(FLAGS_features);
  options.labels = absl::GetFlag(FLAGS_labels);
  options.out = absl::GetFlag(FLAGS_out);
  options.limit = absl::GetFlag(FLAGS_limit);
  options.chunk_rows = absl::GetFlag(FLAGS_chunk_rows);
  options.gzip = absl::GetFlag(FLAGS_gzip);
  if (options.features.empty()) {
    return absl::InvalidArgumentError("--features is required");
  }
  if (options.out.empty())
    return absl::InvalidArgumentError("--out is required");
  if (worker::IsNumpyPath(options.features) && !options.labels.empty()) {
    return absl::InvalidArgumentError(
        "--labels is for IDX sources; a .npy or .npz source brings its own "
        "labels (see --help)");
  }
  if (!worker::IsNumpyPath(options.features) && options.labels.empty()) {
    return absl::InvalidArgumentError("--labels is required with IDX features");
  }
  if (options.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--limit must be >= 0, got ", options.limit));
  }
  if (options.chunk_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_rows must be >= 0, got ", options.chunk_rows));
  }
  if (options.gzip < 0 || options.gzip > 9) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gzip must be 0 to 9, got ", options.gzip));
  }
  if (options.gzip > 0 && options.chunk_rows == 0) {
    return absl::InvalidArgumentError(
        "--gzip needs chunks: give --chunk_rows > 0");
  }
  return options;
}

absl::Status Convert(const worker::ConvertOptions& options) {
  MPILEARN_ASSIGN_OR_RETURN(const std::string report,
                            worker::ConvertToHdf5(options));
  absl::PrintF("%s\n", report);
  return absl::OkStatus();
}

}  // namespace
}  // namespace convert_data
}  // namespace mpilearn

int main(int argc, char** argv) {
  namespace cd = mpilearn::convert_data;
  absl::StatusOr<mpilearn::worker::ConvertOptions> options;
  mpilearn::ToolMain tool;
  tool.name = "convert_data";
  tool.usage = cd::kUsage;
  tool.flags_source = "tools/data/convert_data.cc";
  tool.read_flags = [&] {
    options = cd::OptionsFromFlags();
    return options.status();
  };
  tool.run = [&] { return cd::Convert(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
