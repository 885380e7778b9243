// The conversions every data file format shares, and OpenDataFile's
// dispatch by extension. The formats themselves live in hdf5_file.cc and
// numpy_file.cc.
#include "worker/data/data_file.h"

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mpilearn::worker {
namespace {

// The LibTorch dtype that holds `type` as stored.
torch::Dtype TorchDtypeOf(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
      return torch::kUInt8;
    case ElementType::kInt8:
      return torch::kInt8;
    case ElementType::kInt16:
      return torch::kInt16;
    case ElementType::kInt32:
      return torch::kInt32;
    case ElementType::kInt64:
      return torch::kInt64;
    case ElementType::kFloat32:
      return torch::kFloat32;
    case ElementType::kFloat64:
      return torch::kFloat64;
  }
  return torch::kFloat32;  // Unreachable: every enumerator is handled.
}

// A new tensor of `dtype` and `sizes` holding the raw elements at `data`
// (of `type`, `shape` as stored) converted; never aliases `data`.
torch::Tensor ConvertedCopy(const void* data, ElementType type,
                            const std::vector<int64_t>& shape,
                            torch::Dtype dtype,
                            const std::vector<int64_t>& sizes) {
  // Counted from `sizes`, which hold the same elements as `shape` (only a
  // rank-0 `shape` differs, and is taken as no rows).
  const int64_t count = std::accumulate(sizes.begin(), sizes.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  if (count == 0 || shape.empty())
    return torch::zeros(sizes, torch::dtype(dtype));
  // from_blob wants a mutable pointer; the view is only read, by the copy.
  const torch::Tensor raw = torch::from_blob(const_cast<void*>(data), shape,
                                             torch::dtype(TorchDtypeOf(type)));
  torch::Tensor converted = NewHostTensor(sizes, dtype);
  converted.copy_(raw.reshape(sizes));
  return converted;
}

// True when `path` names a data file OpenDataFile reads (by extension).
}  // namespace

std::string ShapeText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

torch::Tensor NewHostTensor(const std::vector<int64_t>& sizes,
                            torch::Dtype dtype) {
  const int64_t count = std::accumulate(sizes.begin(), sizes.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  const size_t bytes =
      static_cast<size_t>(std::max<int64_t>(count, 1)) *
      c10::elementSize(dtype);
  void* memory = std::malloc(bytes);
  if (memory == nullptr) throw std::bad_alloc();
  return torch::from_blob(memory, sizes, [](void* p) { std::free(p); },
                          torch::dtype(dtype));
}

absl::Status DataFile::CheckRange(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", begin, ", ", end, ") are outside '", path_,
                     "', which holds ", rows_, " rows"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DataRows> DataFile::Read(int64_t begin, int64_t end) {
  MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
  DataRows rows;
  MPILEARN_ASSIGN_OR_RETURN(rows.features, ReadFeatures(begin, end));
  MPILEARN_ASSIGN_OR_RETURN(rows.labels, ReadLabels(begin, end));
  return rows;
}

const char* ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
      return "uint8";
    case ElementType::kInt8:
      return "int8";
    case ElementType::kInt16:
      return "int16";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kInt64:
      return "int64";
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool IsIntegerElementType(ElementType type) {
  return type != ElementType::kFloat32 && type != ElementType::kFloat64;
}

int64_t ElementTypeBytes(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
    case ElementType::kInt8:
      return 1;
    case ElementType::kInt16:
      return 2;
    case ElementType::kInt32:
    case ElementType::kFloat32:
      return 4;
    case ElementType::kInt64:
    case ElementType::kFloat64:
      return 8;
  }
  return 8;  // Unreachable.
}

torch::Tensor FeaturesFromRaw(const void* data, ElementType type,
                              const std::vector<int64_t>& shape) {
  std::vector<int64_t> sizes = shape;
  const bool scaled = type == ElementType::kUint8;
  if (sizes.size() == 1) {
    // One value per row: [N] -> [N, 1].
    sizes.push_back(1);
  } else if (scaled && sizes.size() == 3) {
    // A single-channel image [N, H, W] -> [N, 1, H, W], as for IDX.
    sizes.insert(sizes.begin() + 1, 1);
  }
  torch::Tensor features =
      ConvertedCopy(data, type, shape, torch::kFloat32, sizes);
  // Convert, then divide in float32: the same arithmetic as the IDX path, so
  // the same bytes give the same features from every format.
  if (scaled) features.div_(255.0);
  return features;
}

torch::Tensor LabelsFromRaw(const void* data, ElementType type,
                            const std::vector<int64_t>& shape) {
  if (shape.size() == 1 && IsIntegerElementType(type)) {
    // Class indices.
    return ConvertedCopy(data, type, shape, torch::kInt64, shape);
  }
  // Rows of targets: [N] -> [N, 1]; [N, K] as is; [N, A, B, ...] flattened
  // to [N, A * B * ...].
  const int64_t n = shape.empty() ? 0 : shape[0];
  const int64_t width =
      shape.size() <= 1
          ? 1
          : std::accumulate(shape.begin() + 1, shape.end(), int64_t{1},
                            std::multiplies<int64_t>());
  return ConvertedCopy(data, type, shape, torch::kFloat32, {n, width});
}

DataFileNames DataFileNames::FromSpec(const v1::DataSpec& spec) {
  DataFileNames names;
  names.all_features.assign(spec.features_datasets().begin(), spec.features_datasets().end());
  names.all_labels.assign(spec.labels_datasets().begin(), spec.labels_datasets().end());
  if (!names.all_features.empty()) {
    names.features = names.all_features[0];
  } else if (!spec.features_dataset().empty()) {
    names.features = spec.features_dataset();
  }
  if (!names.all_labels.empty()) {
    names.labels = names.all_labels[0];
  } else if (!spec.labels_dataset().empty()) {
    names.labels = spec.labels_dataset();
  }
  return names;
}

absl::StatusOr<std::unique_ptr<DataFile>> OpenDataFile(
    const std::string& path, const DataFileNames& names) {
  if (names.several()) return OpenPackedFile(path, names);
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".h5") || absl::EndsWith(lower, ".hdf5")) {
    return OpenHdf5File(path, names);
  }
  if (absl::EndsWith(lower, ".npy") || absl::EndsWith(lower, ".npz")) {
    return OpenNumpyFile(path, names);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path,
      "' is not a data file this worker reads: the name must end in .h5 or "
      ".hdf5 (HDF5), .npz (a NumPy archive) or .npy (NumPy features, with "
      "the labels in a second .npy file)"));
}

}  // namespace mpilearn::worker
