// One data file of a job's file lists (HDF5 or NumPy): its row count and
// shapes from the file's metadata, and any range of rows read straight into
// tensors, so a rank can read only the rows it trains (a data unit is a range
// of rows inside one file) and never needs the whole file in memory.
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<DataFile> file,
//                             OpenDataFile("/data/jets_0.h5", names));
//   file->rows();                        // e.g. 100000
//   MPILEARN_ASSIGN_OR_RETURN(DataRows batch, file->Read(2048, 4096));
//   // batch.features float32 [2048, ...], batch.labels int64 [2048] or
//   // float32 [2048, K]
//
// Element types become what they become from IDX (worker/data/dataset.h):
// features float32, labels int64 class indices or float32 rows.
//
// Formats, by the file name's extension:
//   .h5, .hdf5   HDF5: datasets `features` and `labels` (DataFileNames);
//                any shape [N, ...] and numeric type; read by hyperslab.
//   .npz         an archive of .npy members named `features`.npy and
//                `labels`.npy (numpy.savez or savez_compressed).
//   .npy         the features; the labels are the .npy file whose name is
//                this one's with the last `features` replaced by `labels`
//                (x_features.npy -> x_labels.npy).
//
// Errors name the file and the dataset or member, and say what exists:
// NotFound (missing file), InvalidArgument (not that format, dataset absent
// with the names that exist, features and labels with different row
// counts, an unsupported type or byte order, Fortran order), DataLoss (a
// read fails or the file changed size under the reader).
//
// Thread safety: a DataFile is used by one thread at a time (a rank's
// prefetch thread, or its training thread); different DataFiles may be read
// concurrently (the HDF5 library serializes its own calls).
#ifndef MPILEARN_WORKER_DATA_DATA_FILE_H_
#define MPILEARN_WORKER_DATA_DATA_FILE_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

// The element types a data file may hold.
enum class ElementType {
  kUint8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat32,
  kFloat64,
};

// "uint8", "float32", ...
const char* ElementTypeName(ElementType type);
bool IsIntegerElementType(ElementType type);
// Bytes per element: 1, 2, 4 or 8.
int64_t ElementTypeBytes(ElementType type);

// The dataset (HDF5) or member (NumPy) names of the features and labels.
struct DataFileNames {
  std::string features = "features";
  std::string labels = "labels";
  // Several inputs or outputs (DataSpec.features_datasets,
  // labels_datasets): every name, in order (`features` and `labels` are then
  // the first). Empty: `features` / `labels` alone.
  std::vector<std::string> all_features;
  std::vector<std::string> all_labels;

  // The names a (normalized or not) spec gives.
  static DataFileNames FromSpec(const v1::DataSpec& spec);
  // More than one features or labels dataset: OpenDataFile packs them
  // (PackedLayout).
  bool several() const { return all_features.size() > 1 || all_labels.size() > 1; }
};

// How a file of several features or labels datasets packs them into the one
// features and one labels tensor every reader passes on (so shuffling,
// sharding, streaming and normalization stay as they are): with more than
// one features dataset the features are float32 [n, sum of columns], each
// dataset's rows (as read: uint8 scaled, [N] -> [N, 1]) flattened side by
// side in order; with more than one labels dataset the labels are float32
// [n, sum of columns], a class-index dataset taking one column (the index as
// a float, exact below kMaxClasses) and a float [N, K] one K columns. One
// dataset of a kind stays as a plain file gives it.
struct PackedLayout {
  struct Part {
    std::string name;            // the dataset or member
    std::vector<int64_t> shape;  // one row as read: {1, 28, 28}; {} for class indices, {K}
    ElementType type = ElementType::kFloat32;  // as stored
    int64_t columns = 0;         // its columns in the packed tensor
  };
  std::vector<Part> features;
  std::vector<Part> labels;
};

// Rows read from a data file, converted as the file comment says.
struct DataRows {
  torch::Tensor features;  // float32 [n, ...]
  torch::Tensor labels;    // int64 [n], or float32 [n, K]
  // Rows left out for a NaN or infinite value (FileReader with
  // skip_bad_rows; data.bad_values "skip"); always 0 from a DataFile.
  int64_t skipped = 0;
};

class DataFile {
 public:
  virtual ~DataFile() = default;

  const std::string& path() const { return path_; }
  // Rows (samples) in the file: the first dimension of both arrays.
  int64_t rows() const { return rows_; }
  // One row's shape (without the first dimension) and the stored type.
  const std::vector<int64_t>& feature_shape() const { return feature_shape_; }
  const std::vector<int64_t>& label_shape() const { return label_shape_; }
  ElementType feature_type() const { return feature_type_; }
  ElementType label_type() const { return label_type_; }
  // A file opened with several features or labels datasets
  // (DataFileNames::several): how they are packed; null for a plain file.
  // Its feature_type() / label_type() are then float32 for a packed kind.
  virtual const PackedLayout* packed() const { return nullptr; }

  // Reads rows [begin, end), 0 <= begin <= end <= rows(). InvalidArgument
  // for a range outside the file; DataLoss when the read fails (the file
  // shrank or is corrupt), naming the file, dataset and rows. An empty
  // range gives tensors of 0 rows with the row shapes a read would give.
  absl::StatusOr<DataRows> Read(int64_t begin, int64_t end);

  // The features or the labels alone of rows [begin, end), as Read gives
  // them, with the same errors (so the labels can be scanned without
  // reading the features).
  virtual absl::StatusOr<torch::Tensor> ReadFeatures(int64_t begin,
                                                     int64_t end) = 0;
  virtual absl::StatusOr<torch::Tensor> ReadLabels(int64_t begin,
                                                   int64_t end) = 0;

 protected:
  DataFile() = default;

  // InvalidArgument unless 0 <= begin <= end <= rows(): every read checks
  // its range with this first.
  absl::Status CheckRange(int64_t begin, int64_t end) const;

  std::string path_;
  int64_t rows_ = 0;
  std::vector<int64_t> feature_shape_;
  std::vector<int64_t> label_shape_;
  ElementType feature_type_ = ElementType::kFloat32;
  ElementType label_type_ = ElementType::kInt64;
};

// Opens `path` by its extension (see the file comment). InvalidArgument for
// an extension that is none of those.
absl::StatusOr<std::unique_ptr<DataFile>> OpenDataFile(
    const std::string& path, const DataFileNames& names = {});

// The format-specific openers OpenDataFile dispatches to, and the file of
// several datasets (packed_file.cc), which opens the format's file once per
// dataset pair. Every dataset must hold the same rows (InvalidArgument
// naming two that differ).
absl::StatusOr<std::unique_ptr<DataFile>> OpenPackedFile(
    const std::string& path, const DataFileNames& names);
absl::StatusOr<std::unique_ptr<DataFile>> OpenHdf5File(
    const std::string& path, const DataFileNames& names);
absl::StatusOr<std::unique_ptr<DataFile>> OpenNumpyFile(
    const std::string& path, const DataFileNames& names);

// "[2048, 1, 28, 28]": a shape as messages about data show it.
std::string ShapeText(const std::vector<int64_t>& dims);

// A new, uninitialized CPU tensor whose memory comes from malloc, not
// LibTorch's allocator: a rank streaming data allocates and frees tensors of
// a unit's size all the time, and glibc does not reuse memory from the
// aligned allocations LibTorch makes (posix_memalign), so the process would
// grow by about every unit it reads (measured: 512 MiB read in 16 MiB units
// took RSS to 520 MiB with LibTorch's allocator, 34 MiB with malloc).
torch::Tensor NewHostTensor(const std::vector<int64_t>& sizes,
                            torch::Dtype dtype);

// Converts `count` raw elements of `type` at `data` (native byte order) to
// features (float32; unsigned bytes scaled by 1/255) or labels (see the file
// comment) of shape [rows, row_shape...]: the one conversion every format
// shares. Labels: integer [N] -> int64; anything else -> float32.
torch::Tensor FeaturesFromRaw(const void* data, ElementType type,
                              const std::vector<int64_t>& shape);
torch::Tensor LabelsFromRaw(const void* data, ElementType type,
                            const std::vector<int64_t>& shape);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_DATA_FILE_H_
