// convert_data: converts a data set's features and labels into one HDF5
// file with datasets `features` and `labels`, the layout a job's data file
// list takes (worker/data_file.h).
//
//   convert_data --features train-images-idx3-ubyte.gz
//       --labels train-labels-idx1-ubyte.gz --out train.h5 --gzip 4
//
// Sources:
//   IDX (gzip'd or plain; any name but the ones below), read with
//     worker/idx_reader.h: --features and --labels name the two files. Each
//     array keeps its IDX element type and shape, so Fashion-MNIST stays
//     uint8 [N, 28, 28] and reads back exactly as from IDX (scaled by 1/255,
//     a channel added). The IDX reader holds values as float: int32 values
//     beyond +-2^24 and float64 values arrive rounded to float32 already.
//   .npy / .npz, read with OpenDataFile: --features names the .npy features
//     (the labels are found beside it, see data_file.h) or the .npz archive;
//     --labels is not given. Each array is stored as what the worker reads
//     from it, in the source's type where that is exact: uint8 features
//     (unscaled back to their bytes), int8, int16 and float32 as stored,
//     integer class labels [N] in their integer type; int32 and int64
//     features or label rows, and float64, become float32.
//
// The output is written to OUT.tmp-PID and renamed to OUT once complete, so
// a failed run never leaves a partial file under OUT's name.
//
// Exit codes: 0 ok, 1 a file cannot be read or written, 2 usage error.
// main() only parses flags; Convert() does the work.
//
// Over ~500 lines because it is a whole tool (flags, usage, two sources and
// an HDF5 writer), each part small and private to it.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/cli_flags.h"
#include "common/status_macros.h"
#include "hdf5/serial/hdf5.h"
#include "worker/data_file.h"
#include "worker/idx_reader.h"

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

using ::mpilearn::worker::DataFile;
using ::mpilearn::worker::ElementType;
using ::mpilearn::worker::ElementTypeName;
using ::mpilearn::worker::IdxArray;
using ::mpilearn::worker::IdxType;

// Exit codes (common/cli_flags.h RunToolMain): 0 ok, 1 error, 2 usage.

// Rows converted per read and write, so a .npy source is streamed.
constexpr int64_t kRowsPerBlock = 4096;
// HDF5 refuses chunks of 4 GiB or more.
constexpr int64_t kMaxChunkBytes = (int64_t{4} << 30) - 1;

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

// One run, read from the flags by main().
struct Options {
  std::string features;
  std::string labels;  // empty for NumPy sources
  std::string out;
  int64_t limit = 0;          // 0: all rows
  int64_t chunk_rows = 1024;  // 0: contiguous
  int gzip = 0;
};

bool IsNumpyPath(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  return absl::EndsWith(lower, ".npy") || absl::EndsWith(lower, ".npz");
}

absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
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
  if (IsNumpyPath(options.features) && !options.labels.empty()) {
    return absl::InvalidArgumentError(
        "--labels is for IDX sources; a .npy or .npz source brings its own "
        "labels (see --help)");
  }
  if (!IsNumpyPath(options.features) && options.labels.empty()) {
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

// One array to write: its stored type and shape [rows, ...].
struct ArrayInfo {
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> dims;

  int64_t RowElements() const {
    int64_t n = 1;
    for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
    return n;
  }
};

// Where rows come from. Read returns rows [begin, end) of both arrays as
// contiguous float32 or int64 tensors holding the values to store (HDF5
// converts them to the stored type exactly).
class Source {
 public:
  virtual ~Source() = default;
  virtual absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) = 0;

  ArrayInfo features;
  ArrayInfo labels;
};

ElementType ElementTypeOfIdx(IdxType type) {
  switch (type) {
    case IdxType::kUnsignedByte:
      return ElementType::kUint8;
    case IdxType::kSignedByte:
      return ElementType::kInt8;
    case IdxType::kInt16:
      return ElementType::kInt16;
    case IdxType::kInt32:
      return ElementType::kInt32;
    case IdxType::kFloat32:
      return ElementType::kFloat32;
    case IdxType::kFloat64:
      return ElementType::kFloat64;
  }
  return ElementType::kFloat32;  // Unreachable.
}

// Two IDX files, read whole (the reader holds them as float).
class IdxSource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Open(const Options& options) {
    auto source = std::make_unique<IdxSource>();
    MPILEARN_ASSIGN_OR_RETURN(
        source->features_,
        worker::ReadIdxFile(options.features, options.limit));
    MPILEARN_ASSIGN_OR_RETURN(
        source->labels_, worker::ReadIdxFile(options.labels, options.limit));
    if (source->features_.dims[0] != source->labels_.dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", options.features, "' holds ", source->features_.dims[0],
          " items but '", options.labels, "' holds ", source->labels_.dims[0],
          "; features and labels must have the same count"));
    }
    source->features = {ElementTypeOfIdx(source->features_.type),
                        source->features_.dims};
    source->labels = {ElementTypeOfIdx(source->labels_.type),
                      source->labels_.dims};
    return source;
  }

  absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) override {
    return std::make_pair(Rows(features_, features, begin, end),
                          Rows(labels_, labels, begin, end));
  }

 private:
  static torch::Tensor Rows(IdxArray& array, const ArrayInfo& info,
                            int64_t begin, int64_t end) {
    const int64_t row = info.RowElements();
    return torch::from_blob(array.values.data() + begin * row,
                            {(end - begin) * row}, torch::kFloat32);
  }

  IdxArray features_;
  IdxArray labels_;
};

// A .npy pair or .npz archive, read by range through OpenDataFile.
class NumpySource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Open(const Options& options) {
    auto source = std::make_unique<NumpySource>();
    MPILEARN_ASSIGN_OR_RETURN(source->file_,
                              worker::OpenDataFile(options.features));
    const DataFile& file = *source->file_;
    const int64_t rows =
        options.limit > 0 ? std::min(options.limit, file.rows()) : file.rows();
    source->features.dims = {rows};
    source->features.dims.insert(source->features.dims.end(),
                                 file.feature_shape().begin(),
                                 file.feature_shape().end());
    source->labels.dims = {rows};
    source->labels.dims.insert(source->labels.dims.end(),
                               file.label_shape().begin(),
                               file.label_shape().end());
    source->features.type = StoredType(file.feature_type(), false);
    source->labels.type =
        StoredType(file.label_type(), file.label_shape().empty());
    return source;
  }

  absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Read(
      int64_t begin, int64_t end) override {
    MPILEARN_ASSIGN_OR_RETURN(worker::DataRows rows, file_->Read(begin, end));
    torch::Tensor features = rows.features.contiguous().view({-1});
    // The worker read uint8 features as x / 255: back to their bytes.
    if (file_->feature_type() == ElementType::kUint8) {
      features = features.mul(255.0).round_();
    }
    return std::make_pair(features, rows.labels.contiguous().view({-1}));
  }

 private:
  // The type an array is stored in: the source's where the worker's values
  // (float32 features and label rows, int64 class labels) hold it exactly,
  // float32 otherwise.
  static ElementType StoredType(ElementType source, bool class_labels) {
    if (class_labels && worker::IsIntegerElementType(source)) return source;
    switch (source) {
      case ElementType::kUint8:
      case ElementType::kInt8:
      case ElementType::kInt16:
      case ElementType::kFloat32:
        return source;
      default:
        return ElementType::kFloat32;
    }
  }

  std::unique_ptr<DataFile> file_;
};

hid_t FileTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
      return H5T_STD_U8LE;
    case ElementType::kInt8:
      return H5T_STD_I8LE;
    case ElementType::kInt16:
      return H5T_STD_I16LE;
    case ElementType::kInt32:
      return H5T_STD_I32LE;
    case ElementType::kInt64:
      return H5T_STD_I64LE;
    case ElementType::kFloat32:
      return H5T_IEEE_F32LE;
    case ElementType::kFloat64:
      return H5T_IEEE_F64LE;
  }
  return H5T_IEEE_F32LE;  // Unreachable.
}

int64_t BytesOf(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
    case ElementType::kInt8:
      return 1;
    case ElementType::kInt16:
      return 2;
    case ElementType::kInt32:
    case ElementType::kFloat32:
      return 4;
    default:
      return 8;
  }
}

// Owns one HDF5 identifier and closes it with the matching H5*close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; false when closing fails (e.g. the final flush).
  bool Close() {
    const bool ok = id_ < 0 || close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_;
  Closer close_;
};

// Creates dataset `name` for `info` in `file` with the options' layout.
absl::StatusOr<hid_t> CreateDataset(hid_t file, const std::string& name,
                                    const ArrayInfo& info,
                                    const Options& options) {
  const std::vector<hsize_t> dims(info.dims.begin(), info.dims.end());
  Hid space(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
      H5Sclose);
  Hid create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !create.valid()) {
    return absl::InternalError("cannot set up an HDF5 dataset");
  }
  if (options.chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = static_cast<hsize_t>(
        std::max<int64_t>(1, std::min(options.chunk_rows, info.dims[0])));
    int64_t chunk_bytes = BytesOf(info.type);
    for (hsize_t c : chunk) chunk_bytes *= std::max<hsize_t>(c, 1);
    if (chunk_bytes > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks of ", chunk[0], " rows of '", name, "' would be ",
          chunk_bytes, " bytes; HDF5 takes under 4 GiB: lower --chunk_rows"));
    }
    // A dimension of 0 needs a chunk of at least 1.
    for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);
    if (H5Pset_chunk(create.get(), static_cast<int>(chunk.size()),
                     chunk.data()) < 0 ||
        (options.gzip > 0 && H5Pset_deflate(create.get(), options.gzip) < 0)) {
      return absl::InternalError(
          absl::StrCat("cannot set the chunk layout of '", name, "'"));
    }
  }
  const hid_t dataset =
      H5Dcreate2(file, name.c_str(), FileTypeOf(info.type), space.get(),
                 H5P_DEFAULT, create.get(), H5P_DEFAULT);
  if (dataset < 0) {
    return absl::InternalError(absl::StrCat("cannot create dataset '", name,
                                            "' in '", options.out, "'"));
  }
  return dataset;
}

// Writes `values` (float32 or int64, the rows [begin, begin + n) of `info`)
// into `dataset`.
absl::Status WriteRows(hid_t dataset, const ArrayInfo& info, int64_t begin,
                       int64_t n, const torch::Tensor& values) {
  if (n == 0 || info.RowElements() == 0) return absl::OkStatus();
  std::vector<hsize_t> start(info.dims.size(), 0);
  std::vector<hsize_t> count(info.dims.begin(), info.dims.end());
  start[0] = static_cast<hsize_t>(begin);
  count[0] = static_cast<hsize_t>(n);
  Hid file_space(H5Dget_space(dataset), H5Sclose);
  Hid memory_space(
      H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
      H5Sclose);
  const hid_t memory_type = values.scalar_type() == torch::kInt64
                                ? H5T_NATIVE_INT64
                                : H5T_NATIVE_FLOAT;
  if (!file_space.valid() || !memory_space.valid() ||
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(),
                          nullptr, count.data(), nullptr) < 0 ||
      H5Dwrite(dataset, memory_type, memory_space.get(), file_space.get(),
               H5P_DEFAULT, values.data_ptr()) < 0) {
    return absl::InternalError(
        absl::StrCat("writing rows [", begin, ", ", begin + n, ") failed"));
  }
  return absl::OkStatus();
}

std::string Describe(const ArrayInfo& info) {
  return absl::StrCat(ElementTypeName(info.type), " [",
                      absl::StrJoin(info.dims, ", "), "]");
}

absl::Status WriteFile(Source& source, const Options& options,
                       const std::string& path) {
  Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
           H5Fclose);
  if (!file.valid()) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  }
  MPILEARN_ASSIGN_OR_RETURN(
      const hid_t features_id,
      CreateDataset(file.get(), "features", source.features, options));
  Hid features(features_id, H5Dclose);
  MPILEARN_ASSIGN_OR_RETURN(
      const hid_t labels_id,
      CreateDataset(file.get(), "labels", source.labels, options));
  Hid labels(labels_id, H5Dclose);
  const int64_t rows = source.features.dims[0];
  for (int64_t begin = 0; begin < rows; begin += kRowsPerBlock) {
    const int64_t end = std::min(rows, begin + kRowsPerBlock);
    MPILEARN_ASSIGN_OR_RETURN(auto block, source.Read(begin, end));
    const absl::Status written = WriteRows(features.get(), source.features,
                                           begin, end - begin, block.first);
    MPILEARN_RETURN_IF_ERROR(written.ok()
                                 ? WriteRows(labels.get(), source.labels, begin,
                                             end - begin, block.second)
                                 : written);
  }
  if (!features.Close() || !labels.Close() || !file.Close()) {
    return absl::InternalError(
        absl::StrCat("cannot finish writing '", path, "' (is the disk full?)"));
  }
  return absl::OkStatus();
}

absl::Status Convert(const Options& options) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // Errors become statuses.
  std::unique_ptr<Source> source;
  if (IsNumpyPath(options.features)) {
    MPILEARN_ASSIGN_OR_RETURN(source, NumpySource::Open(options));
  } else {
    MPILEARN_ASSIGN_OR_RETURN(source, IdxSource::Open(options));
  }
  const std::string temporary = absl::StrCat(options.out, ".tmp-", getpid());
  const absl::Status written = WriteFile(*source, options, temporary);
  if (!written.ok()) {
    std::remove(temporary.c_str());
    return written;
  }
  if (std::rename(temporary.c_str(), options.out.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename '", temporary, "' to '", options.out, "'"));
  }
  absl::PrintF(
      "wrote %s: features %s, labels %s, %s\n", options.out,
      Describe(source->features), Describe(source->labels),
      options.chunk_rows == 0
          ? std::string("contiguous")
          : absl::StrCat(
                "chunks of ", options.chunk_rows, " rows",
                options.gzip > 0 ? absl::StrCat(", gzip ", options.gzip) : ""));
  return absl::OkStatus();
}



}  // namespace
}  // namespace convert_data
}  // namespace mpilearn

int main(int argc, char** argv) {
  namespace cd = mpilearn::convert_data;
  absl::StatusOr<cd::Options> options;
  mpilearn::ToolMain tool;
  tool.name = "convert_data";
  tool.usage = cd::kUsage;
  tool.flags_source = "tools/convert_data.cc";
  tool.read_flags = [&] {
    options = cd::OptionsFromFlags();
    return options.status();
  };
  tool.run = [&] { return cd::Convert(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
