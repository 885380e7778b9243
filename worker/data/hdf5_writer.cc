#include "worker/data/hdf5_writer.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
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

// HDF5 refuses chunks of 4 GiB or more.
constexpr int64_t kMaxChunkBytes = (int64_t{4} << 30) - 1;

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

// Creates dataset `name` for `info` in `file` (named `path`) with `layout`.
absl::StatusOr<Hid> CreateDataset(hid_t file, const std::string& path,
                                  const std::string& name,
                                  const StoredArray& info,
                                  const Hdf5Layout& layout) {
  const std::vector<hsize_t> dims(info.dims.begin(), info.dims.end());
  Hid space(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
      H5Sclose);
  Hid create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !create.valid()) {
    return absl::InternalError("cannot set up an HDF5 dataset");
  }
  if (layout.chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = static_cast<hsize_t>(
        std::max<int64_t>(1, std::min(layout.chunk_rows, info.dims[0])));
    int64_t chunk_bytes = ElementTypeBytes(info.type);
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
        (layout.gzip > 0 && H5Pset_deflate(create.get(), layout.gzip) < 0)) {
      return absl::InternalError(
          absl::StrCat("cannot set the chunk layout of '", name, "'"));
    }
  }
  Hid dataset(H5Dcreate2(file, name.c_str(), FileTypeOf(info.type),
                         space.get(), H5P_DEFAULT, create.get(), H5P_DEFAULT),
              H5Dclose);
  if (!dataset.valid()) {
    return absl::InternalError(
        absl::StrCat("cannot create dataset '", name, "' in '", path, "'"));
  }
  return dataset;
}

// Writes `values` (float32 or int64, the rows [begin, begin + n) of `info`)
// into `dataset`.
absl::Status WriteDatasetRows(hid_t dataset, const StoredArray& info,
                              int64_t begin, int64_t n,
                              const torch::Tensor& values) {
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

}  // namespace

int64_t StoredArray::RowElements() const {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

std::string DescribeStoredArray(const StoredArray& array) {
  return absl::StrCat(ElementTypeName(array.type), " [",
                      absl::StrJoin(array.dims, ", "), "]");
}

absl::Status WriteHdf5Arrays(const std::string& path, const std::vector<NamedArray>& arrays) {
  SilenceHdf5Errors();
  Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  for (const NamedArray& array : arrays) {
    const torch::Tensor values = array.values.contiguous();
    StoredArray info{array.type, values.sizes().vec()};
    MPILEARN_ASSIGN_OR_RETURN(
        Hid dataset, CreateDataset(file.get(), path, array.name, info, {.chunk_rows = 0}));
    MPILEARN_RETURN_IF_ERROR(
        WriteDatasetRows(dataset.get(), info, 0, info.dims.empty() ? 0 : info.dims[0], values));
    if (!dataset.Close()) {
      return absl::InternalError(absl::StrCat("cannot write dataset '", array.name, "'"));
    }
  }
  if (!file.Close()) {
    return absl::InternalError(
        absl::StrCat("cannot finish writing '", path, "' (is the disk full?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Hdf5DataWriter>> Hdf5DataWriter::Create(
    const std::string& path, const StoredArray& features,
    const StoredArray& labels, const Hdf5Layout& layout) {
  SilenceHdf5Errors();
  std::unique_ptr<Hdf5DataWriter> writer(new Hdf5DataWriter());
  writer->path_ = path;
  writer->features_info_ = features;
  writer->labels_info_ = labels;
  writer->file_ =
      Hid(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
          H5Fclose);
  if (!writer->file_.valid()) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  }
  MPILEARN_ASSIGN_OR_RETURN(
      writer->features_, CreateDataset(writer->file_.get(), path, "features",
                                       features, layout));
  MPILEARN_ASSIGN_OR_RETURN(
      writer->labels_,
      CreateDataset(writer->file_.get(), path, "labels", labels, layout));
  return writer;
}

absl::Status Hdf5DataWriter::WriteRows(int64_t begin, int64_t n,
                                       const torch::Tensor& features,
                                       const torch::Tensor& labels) {
  SilenceHdf5Errors();
  MPILEARN_RETURN_IF_ERROR(
      WriteDatasetRows(features_.get(), features_info_, begin, n, features));
  return WriteDatasetRows(labels_.get(), labels_info_, begin, n, labels);
}

absl::Status Hdf5DataWriter::Finish() {
  SilenceHdf5Errors();
  if (!features_.Close() || !labels_.Close() || !file_.Close()) {
    return absl::InternalError(absl::StrCat(
        "cannot finish writing '", path_, "' (is the disk full?)"));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::worker
