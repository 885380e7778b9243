// OpenHdf5File: HDF5 data files (data_file.h), through the HDF5 C API (the
// thread-safe build serializes its own calls; its C++ wrapper is not
// thread-safe, so it is not used).
//
// Each read selects rows [begin, end) of a dataset as a hyperslab and
// has H5Dread convert them to the native form of the stored type (so
// big-endian files read the same), then hands the elements to the shared
// FeaturesFromRaw / LabelsFromRaw. Chunked (e.g. gzip'd) datasets get a
// chunk cache that holds at least two chunk rows' worth of chunks, so
// consecutive batches inside one chunk row inflate it once.
//
// Stored types: signed integers of 1, 2, 4 and 8 bytes, uint8, float32 and
// float64 as themselves; uint16 is read as int32 and uint32 as int64 (every
// value fits, HDF5 converts); uint64, half floats and every non-numeric
// class (strings, compounds, enums, ...) are refused as unsupported.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "hdf5/serial/hdf5.h"
#include "worker/data/data_file.h"
#include "worker/data/hdf5_handle.h"

namespace mpilearn::worker {
namespace {

// Bounds a dataset's element count, so byte counts never overflow int64.
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Bounds the elements one Read allocates.
constexpr int64_t kMaxReadElements = int64_t{1} << 34;
// The chunk cache of a chunked dataset: at least this, or two chunk rows'
// worth of chunks when that is more, up to kMaxChunkCacheBytes.
constexpr size_t kMinChunkCacheBytes = size_t{64} << 20;
constexpr size_t kMaxChunkCacheBytes = size_t{1} << 30;
// A prime, about 100 times the chunks a 64 MiB cache of 64 KiB chunks holds
// (HDF5's advice for few hash collisions).
constexpr size_t kChunkCacheSlots = 12421;
// Root names listed when a dataset is missing.
constexpr size_t kMaxListedNames = 20;

// The most specific messages of the calling thread's HDF5 error stack,
// e.g. "; HDF5: address of object past end of allocation", and clears it.
std::string Hdf5ErrorDetail() {
  std::vector<std::string> messages;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned, const H5E_error2_t* error, void* data) -> herr_t {
        auto* out = static_cast<std::vector<std::string>*>(data);
        if (error->desc != nullptr && error->desc[0] != '\0') {
          out->push_back(error->desc);
        }
        return out->size() >= 2 ? 1 : 0;  // Stop after the innermost two.
      },
      &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "";
  return absl::StrCat("; HDF5: ", absl::StrJoin(messages, "; "));
}

// The names of the links in the file's root group, at most kMaxListedNames
// of them, as "'a', 'b' and 3 more" (or "none").
std::string RootNames(hid_t file) {
  std::vector<std::string> names;
  hsize_t index = 0;
  H5Literate(
      file, H5_INDEX_NAME, H5_ITER_INC, &index,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  H5Eclear2(H5E_DEFAULT);
  if (names.empty()) return "none";
  std::vector<std::string> quoted;
  for (size_t i = 0; i < names.size() && i < kMaxListedNames; ++i) {
    quoted.push_back(absl::StrCat("'", names[i], "'"));
  }
  std::string listed = absl::StrJoin(quoted, ", ");
  if (names.size() > kMaxListedNames) {
    absl::StrAppend(&listed, " and ", names.size() - kMaxListedNames, " more");
  }
  return listed;
}

// The HDF5 class's name, for the unsupported-type message.
const char* ClassName(H5T_class_t type_class) {
  switch (type_class) {
    case H5T_INTEGER:
      return "integer";
    case H5T_FLOAT:
      return "float";
    case H5T_TIME:
      return "time";
    case H5T_STRING:
      return "string";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_COMPOUND:
      return "compound";
    case H5T_REFERENCE:
      return "reference";
    case H5T_ENUM:
      return "enum";
    case H5T_VLEN:
      return "variable-length";
    case H5T_ARRAY:
      return "array";
    default:
      return "unknown";
  }
}

// The ElementType a dataset of HDF5 type `type` is read as, or a
// description of the type for the error when it is unsupported.
absl::StatusOr<ElementType> ElementTypeOf(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (type_class == H5T_INTEGER) {
    const H5T_sign_t sign = H5Tget_sign(type);
    if (sign == H5T_SGN_2) {
      switch (size) {
        case 1:
          return ElementType::kInt8;
        case 2:
          return ElementType::kInt16;
        case 4:
          return ElementType::kInt32;
        case 8:
          return ElementType::kInt64;
      }
    } else if (sign == H5T_SGN_NONE) {
      switch (size) {
        case 1:
          return ElementType::kUint8;
        case 2:
          return ElementType::kInt32;  // uint16: every value fits.
        case 4:
          return ElementType::kInt64;  // uint32: every value fits.
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(sign == H5T_SGN_NONE ? "unsigned" : "signed",
                     " integer of ", size, " bytes"));
  }
  if (type_class == H5T_FLOAT && (size == 4 || size == 8)) {
    return size == 4 ? ElementType::kFloat32 : ElementType::kFloat64;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ClassName(type_class), " of ", size, " bytes"));
}

// The in-memory HDF5 type H5Dread converts an ElementType's data to.
hid_t NativeTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kUint8:
      return H5T_NATIVE_UINT8;
    case ElementType::kInt8:
      return H5T_NATIVE_INT8;
    case ElementType::kInt16:
      return H5T_NATIVE_INT16;
    case ElementType::kInt32:
      return H5T_NATIVE_INT32;
    case ElementType::kInt64:
      return H5T_NATIVE_INT64;
    case ElementType::kFloat32:
      return H5T_NATIVE_FLOAT;
    case ElementType::kFloat64:
      return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_FLOAT;  // Unreachable: every enumerator is handled.
}

// The current dimensions of `dataset`'s extent; empty for a scalar or
// null dataspace, or when the query fails.
std::vector<hsize_t> CurrentDims(hid_t dataset) {
  Hid space(H5Dget_space(dataset), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE) {
    return {};
  }
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank <= 0) return {};
  std::vector<hsize_t> dims(rank);
  if (H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) != rank) {
    return {};
  }
  return dims;
}

// One open dataset of the file (features or labels).
struct Hdf5Array {
  std::string name;
  // "dataset 'features' of '/data/x.h5'", for messages.
  std::string what;
  Hid dataset;
  // The shape at open: [rows, row dims...], rank >= 1.
  std::vector<hsize_t> dims;
  ElementType type = ElementType::kFloat32;
  int64_t row_elements = 1;
};

// Bytes of a chunk cache for `dataset`: at least two chunk rows (all the
// chunks along every other dimension for one chunk's span of rows).
size_t ChunkCacheBytes(hid_t dataset, const std::vector<hsize_t>& dims,
                       int64_t element_bytes) {
  Hid create(H5Dget_create_plist(dataset), H5Pclose);
  if (!create.valid() || H5Pget_layout(create.get()) != H5D_CHUNKED) {
    return kMinChunkCacheBytes;
  }
  std::vector<hsize_t> chunk(dims.size());
  if (H5Pget_chunk(create.get(), static_cast<int>(chunk.size()),
                   chunk.data()) != static_cast<int>(dims.size())) {
    return kMinChunkCacheBytes;
  }
  // Every other dimension rounded up to whole chunks.
  double span = static_cast<double>(chunk[0]) * element_bytes;
  for (size_t i = 1; i < dims.size(); ++i) {
    const hsize_t c = std::max<hsize_t>(chunk[i], 1);
    span *= static_cast<double>((dims[i] + c - 1) / c * c);
  }
  const double want = 2 * span;
  if (want <= kMinChunkCacheBytes) return kMinChunkCacheBytes;
  if (want >= kMaxChunkCacheBytes) return kMaxChunkCacheBytes;
  return static_cast<size_t>(want);
}

// Opens dataset `name` of `file` and reads its shape and type.
absl::StatusOr<Hdf5Array> OpenArray(hid_t file, const std::string& path,
                                    const std::string& name, const char* role) {
  Hdf5Array array;
  array.name = name;
  array.what = absl::StrCat("dataset '", name, "' of '", path, "'");
  if (name.empty() || H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' has no dataset '", name, "' (the ", role,
                     "); its root holds: ", RootNames(file)));
  }
  // Opened once to learn its layout, then again with a chunk cache sized
  // for it (the cache is fixed when the dataset is opened).
  Hid probe(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!probe.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' in '", path, "' is not a dataset (the ",
                     role, ")", Hdf5ErrorDetail()));
  }
  {
    Hid type(H5Dget_type(probe.get()), H5Tclose);
    if (!type.valid()) {
      return absl::DataLossError(absl::StrCat("cannot read the type of ",
                                              array.what, Hdf5ErrorDetail()));
    }
    absl::StatusOr<ElementType> element = ElementTypeOf(type.get());
    if (!element.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          array.what, " (the ", role, ") holds an unsupported type, ",
          element.status().message(),
          "; supported: signed integers of 1 to 8 bytes, unsigned of 1 to 4 "
          "bytes, float32 and float64"));
    }
    array.type = *element;
  }
  {
    Hid space(H5Dget_space(probe.get()), H5Sclose);
    if (!space.valid()) {
      return absl::DataLossError(absl::StrCat("cannot read the shape of ",
                                              array.what, Hdf5ErrorDetail()));
    }
    const int rank = H5Sget_simple_extent_type(space.get()) == H5S_SIMPLE
                         ? H5Sget_simple_extent_ndims(space.get())
                         : 0;
    if (rank <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          array.what, " (the ", role,
          ") is a scalar; it needs a first dimension, one entry per row"));
    }
    array.dims.resize(rank);
    H5Sget_simple_extent_dims(space.get(), array.dims.data(), nullptr);
  }
  int64_t elements = 1;
  for (size_t i = 0; i < array.dims.size(); ++i) {
    const hsize_t dim = array.dims[i];
    if (dim > static_cast<hsize_t>(kMaxElements) ||
        (dim > 0 && elements > kMaxElements / static_cast<int64_t>(dim))) {
      return absl::InvalidArgumentError(absl::StrCat(
          array.what, " has shape (", absl::StrJoin(array.dims, ", "),
          "), more than ", kMaxElements, " elements"));
    }
    elements *= static_cast<int64_t>(dim);
    if (i > 0) array.row_elements *= static_cast<int64_t>(dim);
  }

  const size_t cache_bytes =
      ChunkCacheBytes(probe.get(), array.dims, ElementTypeBytes(array.type));
  // Closed before the dataset is opened again: while it is open, HDF5 hands
  // back the same dataset with its default 1 MiB cache and ignores the
  // access list, and gzip'd chunks are re-inflated batch after batch.
  probe.Reset();
  Hid access(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  if (!access.valid() ||
      H5Pset_chunk_cache(access.get(), kChunkCacheSlots, cache_bytes, 1.0) < 0) {
    return absl::InternalError(absl::StrCat("cannot set up a chunk cache for ",
                                            array.what, Hdf5ErrorDetail()));
  }
  array.dataset = Hid(H5Dopen2(file, name.c_str(), access.get()), H5Dclose);
  if (!array.dataset.valid()) {
    return absl::DataLossError(
        absl::StrCat("cannot open ", array.what, Hdf5ErrorDetail()));
  }
  return array;
}

// An open HDF5 file and its two datasets.
class Hdf5File final : public DataFile {
 public:
  Hdf5File(std::string path, Hid file, Hdf5Array features, Hdf5Array labels)
      : file_(std::move(file)),
        features_(std::move(features)),
        labels_(std::move(labels)) {
    path_ = std::move(path);
    rows_ = static_cast<int64_t>(features_.dims[0]);
    feature_shape_.assign(features_.dims.begin() + 1, features_.dims.end());
    label_shape_.assign(labels_.dims.begin() + 1, labels_.dims.end());
    feature_type_ = features_.type;
    label_type_ = labels_.type;
    opened_ = StatOpenFile(&stat_at_open_);
  }

  absl::StatusOr<torch::Tensor> ReadFeatures(int64_t begin,
                                             int64_t end) override {
    MPILEARN_ASSIGN_OR_RETURN(torch::Tensor raw,
                              ReadChecked(features_, begin, end));
    return FeaturesFromRaw(raw.data_ptr(), features_.type,
                           ShapeOf(features_, end - begin));
  }

  absl::StatusOr<torch::Tensor> ReadLabels(int64_t begin,
                                           int64_t end) override {
    MPILEARN_ASSIGN_OR_RETURN(torch::Tensor raw,
                              ReadChecked(labels_, begin, end));
    return LabelsFromRaw(raw.data_ptr(), labels_.type,
                         ShapeOf(labels_, end - begin));
  }

 private:
  static std::vector<int64_t> ShapeOf(const Hdf5Array& array, int64_t rows) {
    std::vector<int64_t> shape(array.dims.begin(), array.dims.end());
    shape[0] = rows;
    return shape;
  }

  // Stats the file HDF5 holds open (the POSIX driver's descriptor, so the
  // very file opened even if the path now names another); false when the
  // driver is another one.
  bool StatOpenFile(struct stat* st) const {
    void* handle = nullptr;
    if (H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle) < 0 ||
        handle == nullptr) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    return fstat(*static_cast<int*>(handle), st) == 0;
  }

  // DataLoss when the file was changed in place since it was opened
  // (shorter, or modified): HDF5 would read zeros past its end, or rows of
  // a different layout.
  absl::Status CheckUnchanged(int64_t begin, int64_t end) const {
    if (!opened_) return absl::OkStatus();  // Nothing to compare with.
    struct stat now;
    if (!StatOpenFile(&now)) {
      return absl::DataLossError(
          absl::StrCat("reading rows [", begin, ", ", end, ") of '", path_,
                       "': cannot stat the open file: ", strerror(errno)));
    }
    if (now.st_size < stat_at_open_.st_size) {
      return absl::DataLossError(absl::StrCat(
          "reading rows [", begin, ", ", end, ") of '", path_,
          "': the file is ", now.st_size, " bytes now, ", stat_at_open_.st_size,
          " when opened (did it change while the job ran?)"));
    }
    if (now.st_mtim.tv_sec != stat_at_open_.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != stat_at_open_.st_mtim.tv_nsec) {
      return absl::DataLossError(absl::StrCat(
          "reading rows [", begin, ", ", end, ") of '", path_,
          "': the file was modified after it was opened (did it change "
          "while the job ran?)"));
    }
    return absl::OkStatus();
  }

  // ReadRows after checking the range and that the file is unchanged.
  absl::StatusOr<torch::Tensor> ReadChecked(const Hdf5Array& array,
                                            int64_t begin, int64_t end) const {
    MPILEARN_RETURN_IF_ERROR(CheckRange(begin, end));
    SilenceHdf5Errors();
    MPILEARN_RETURN_IF_ERROR(CheckUnchanged(begin, end));
    return ReadRows(array, begin, end);
  }

  // Rows [begin, end) of `array` in its native element type, in a uint8
  // tensor (aligned for every element type).
  absl::StatusOr<torch::Tensor> ReadRows(const Hdf5Array& array, int64_t begin,
                                         int64_t end) const {
    const int64_t n = end - begin;
    if (array.row_elements > 0 && n > kMaxReadElements / array.row_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows [", begin, ", ", end, ") of ", array.what, " are ",
          n * array.row_elements, " elements, more than one read takes (",
          kMaxReadElements, "); read fewer rows at a time"));
    }
    const int64_t elements = n * array.row_elements;
    torch::Tensor raw =
        NewHostTensor({elements * ElementTypeBytes(array.type)}, torch::kUInt8);
    if (elements == 0) return raw;

    const std::vector<hsize_t> now = CurrentDims(array.dataset.get());
    if (now.size() != array.dims.size() || now[0] < array.dims[0]) {
      H5Eclear2(H5E_DEFAULT);
      return absl::DataLossError(
          absl::StrCat("file '", path_, "' dataset '", array.name, "' has ",
                       now.empty() ? 0 : now[0], " rows now, ", array.dims[0],
                       " when opened (did it change while the job ran?)"));
    }
    std::vector<hsize_t> start(array.dims.size(), 0);
    std::vector<hsize_t> count = array.dims;
    start[0] = static_cast<hsize_t>(begin);
    count[0] = static_cast<hsize_t>(n);
    Hid file_space(H5Dget_space(array.dataset.get()), H5Sclose);
    Hid memory_space(
        H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
        H5Sclose);
    if (!file_space.valid() || !memory_space.valid() ||
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(),
                            nullptr, count.data(), nullptr) < 0 ||
        H5Dread(array.dataset.get(), NativeTypeOf(array.type),
                memory_space.get(), file_space.get(), H5P_DEFAULT,
                raw.data_ptr()) < 0) {
      return absl::DataLossError(absl::StrCat("reading rows [", begin, ", ",
                                              end, ") of ", array.what,
                                              " failed", Hdf5ErrorDetail()));
    }
    return raw;
  }

  Hid file_;
  // The open file's size and modification time when opened; `opened_` is
  // false when they could not be learned (a driver other than POSIX).
  bool opened_ = false;
  struct stat stat_at_open_ = {};
  Hdf5Array features_;
  Hdf5Array labels_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataFile>> OpenHdf5File(
    const std::string& path, const DataFileNames& names) {
  SilenceHdf5Errors();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a regular file"));
  }
  if (access(path.c_str(), R_OK) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not an HDF5 file (it has no HDF5 signature)"));
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' cannot be opened as an HDF5 file", Hdf5ErrorDetail()));
  }

  MPILEARN_ASSIGN_OR_RETURN(
      Hdf5Array features,
      OpenArray(file.get(), path, names.features, "features"));
  MPILEARN_ASSIGN_OR_RETURN(
      Hdf5Array labels, OpenArray(file.get(), path, names.labels, "labels"));
  if (features.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        features.what, " holds ", features.dims[0], " rows of features but ",
        labels.what, " holds ", labels.dims[0],
        " rows of labels; both must have the same first dimension"));
  }
  return std::make_unique<Hdf5File>(path, std::move(file), std::move(features),
                                    std::move(labels));
}

}  // namespace mpilearn::worker
