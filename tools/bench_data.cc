// bench_data: read throughput of the data file readers (worker/data_file.h)
// against a plain pread() of the same bytes, in one run.
//
//   bazel run -c opt //tools:bench_data -- [--json] [--rows N]
//
// Generates a seeded Fashion-MNIST-like set (float32 features [N, 784]:
// about half the values 0, the rest a random byte / 255, so gzip has
// something to compress; uint8 class labels [N]) and writes it into a
// temporary directory under $TMPDIR (or /tmp), removed at the end, as
//   hdf5_contiguous  HDF5, both datasets contiguous;
//   hdf5_gzip        HDF5, chunks of 1024 rows, gzip level 4;
//   npz              numpy.savez (stored members), written by
//                    /usr/bin/python3 from the raw bytes (skipped, figures
//                    null, when it cannot import numpy);
//   plain            the raw float32 feature bytes alone.
// Then reads the whole set sequentially in batches of 128 rows: DataFile::
// Read for the three files, pread() into a freshly allocated tensor of the
// same byte range for the plain file (the floor: what any reader must do at
// least). Page cache warm: each is read once first (and checked against the
// generated values), then timed over 3 passes; the median pass counts.
// Prints MB/s (1e6 bytes of float32 features delivered per second),
// samples/s and each reader's ratio to the plain read; --json prints one
// JSON object with the same figures. A benchmark, never a test.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "hdf5/serial/hdf5.h"
#include "worker/data_file.h"

ABSL_FLAG(bool, json, false, "Print one JSON object of the figures.");
ABSL_FLAG(int64_t, rows, 60000, "Rows (samples) in the generated set.");

namespace mpilearn {
namespace bench_data {
namespace {

using ::mpilearn::worker::DataFile;
using ::mpilearn::worker::DataRows;

constexpr int64_t kFeatures = 784;
constexpr int64_t kBatchRows = 128;
constexpr int64_t kChunkRows = 1024;
constexpr int kGzipLevel = 4;
constexpr int kTimedPasses = 3;
constexpr uint32_t kSeed = 12;

// The generated set, held in memory to write every format and to check
// what each reader returns.
struct DataSet {
  int64_t rows = 0;
  std::vector<float> features;  // [rows, kFeatures]
  std::vector<uint8_t> labels;  // [rows]
};

DataSet Generate(int64_t rows) {
  DataSet set;
  set.rows = rows;
  set.features.resize(static_cast<size_t>(rows * kFeatures));
  set.labels.resize(static_cast<size_t>(rows));
  std::mt19937 random(kSeed);
  std::uniform_int_distribution<int> byte(0, 255);
  for (float& value : set.features) {
    const int b = byte(random);
    value = b < 128 ? 0.0f : static_cast<float>(byte(random)) / 255.0f;
  }
  for (uint8_t& label : set.labels) {
    label = static_cast<uint8_t>(byte(random) % 10);
  }
  return set;
}

absl::Status WriteRaw(const std::string& path, const void* data,
                      size_t bytes) {
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return absl::InternalError("cannot create " + path);
  const bool ok = std::fwrite(data, 1, bytes, file) == bytes;
  if (std::fclose(file) != 0 || !ok) {
    return absl::InternalError("cannot write " + path);
  }
  return absl::OkStatus();
}

// Writes one dataset; chunk_rows 0 stores it contiguously.
absl::Status WriteDataset(hid_t file, const char* name, hid_t file_type,
                          hid_t memory_type, std::vector<hsize_t> dims,
                          int64_t chunk_rows, const void* data) {
  const hid_t space =
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
  bool ok = space >= 0 && create >= 0;
  if (ok && chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min<hsize_t>(dims[0], static_cast<hsize_t>(chunk_rows));
    ok = H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data()) >=
             0 &&
         H5Pset_deflate(create, kGzipLevel) >= 0;
  }
  hid_t dataset = H5I_INVALID_HID;
  if (ok) {
    dataset = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, create,
                         H5P_DEFAULT);
    ok = dataset >= 0 &&
         H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >=
             0;
  }
  if (dataset >= 0) H5Dclose(dataset);
  if (create >= 0) H5Pclose(create);
  if (space >= 0) H5Sclose(space);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", name));
  return absl::OkStatus();
}

absl::Status WriteHdf5(const std::string& path, const DataSet& set,
                       int64_t chunk_rows) {
  const hid_t file =
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return absl::InternalError("cannot create " + path);
  const hsize_t rows = static_cast<hsize_t>(set.rows);
  absl::Status status =
      WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                   {rows, static_cast<hsize_t>(kFeatures)}, chunk_rows,
                   set.features.data());
  if (status.ok()) {
    status = WriteDataset(file, "labels", H5T_STD_U8LE, H5T_NATIVE_UINT8,
                          {rows}, chunk_rows, set.labels.data());
  }
  if (H5Fclose(file) < 0 && status.ok()) {
    status = absl::InternalError("cannot close " + path);
  }
  return status;
}

// Writes `path` with numpy.savez from the raw files; false when
// /usr/bin/python3 cannot import numpy.
bool WriteNpz(const std::string& path, const std::string& raw_features,
              const std::string& raw_labels, int64_t rows) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    return false;
  }
  const std::string command = absl::StrFormat(
      "/usr/bin/python3 -c \"import numpy as np; np.savez('%s', "
      "features=np.fromfile('%s', '<f4').reshape(%d, %d), "
      "labels=np.fromfile('%s', 'u1'))\"",
      path, raw_features, rows, kFeatures, raw_labels);
  return std::system(command.c_str()) == 0;
}

// Reads rows [begin, end) into a tensor of the features' shape.
using ReadBatch = std::function<absl::StatusOr<torch::Tensor>(int64_t begin,
                                                              int64_t end)>;

// One sequential pass over the set in batches; returns seconds. With
// `check`, compares every batch with the generated features.
absl::StatusOr<double> Pass(const DataSet& set, const ReadBatch& read,
                            bool check) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t begin = 0; begin < set.rows; begin += kBatchRows) {
    const int64_t end = std::min(set.rows, begin + kBatchRows);
    MPILEARN_ASSIGN_OR_RETURN(torch::Tensor batch, read(begin, end));
    if (check) {
      const size_t bytes = static_cast<size_t>((end - begin) * kFeatures) *
                           sizeof(float);
      if (batch.scalar_type() != torch::kFloat32 || !batch.is_contiguous() ||
          static_cast<size_t>(batch.nbytes()) != bytes ||
          std::memcmp(batch.data_ptr(), &set.features[begin * kFeatures],
                      bytes) != 0) {
        return absl::DataLossError(
            absl::StrCat("rows ", begin, "-", end, " differ"));
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start)
      .count();
}

// The median of kTimedPasses passes after a checked warm-up pass.
absl::StatusOr<double> MedianSeconds(const DataSet& set,
                                     const ReadBatch& read) {
  MPILEARN_RETURN_IF_ERROR(Pass(set, read, /*check=*/true).status());
  std::vector<double> seconds;
  for (int i = 0; i < kTimedPasses; ++i) {
    MPILEARN_ASSIGN_OR_RETURN(double s, Pass(set, read, /*check=*/false));
    seconds.push_back(s);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

absl::StatusOr<double> TimeDataFile(const DataSet& set,
                                    const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<DataFile> file,
                            worker::OpenDataFile(path));
  if (file->rows() != set.rows) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", file->rows(), " rows, wrote ", set.rows));
  }
  DataFile* reader = file.get();
  return MedianSeconds(
      set, [reader](int64_t begin,
                    int64_t end) -> absl::StatusOr<torch::Tensor> {
        MPILEARN_ASSIGN_OR_RETURN(DataRows rows, reader->Read(begin, end));
        return rows.features;
      });
}

absl::StatusOr<double> TimePlain(const DataSet& set, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::InternalError("cannot open " + path);
  absl::StatusOr<double> seconds = MedianSeconds(
      set, [fd](int64_t begin, int64_t end) -> absl::StatusOr<torch::Tensor> {
        torch::Tensor batch = torch::empty({end - begin, kFeatures});
        char* out = static_cast<char*>(batch.data_ptr());
        const size_t bytes = static_cast<size_t>(batch.nbytes());
        const off_t offset =
            static_cast<off_t>(begin * kFeatures * sizeof(float));
        size_t done = 0;
        while (done < bytes) {
          const ssize_t n = pread(fd, out + done, bytes - done,
                                  offset + static_cast<off_t>(done));
          if (n <= 0) return absl::DataLossError("short read");
          done += static_cast<size_t>(n);
        }
        return batch;
      });
  close(fd);
  return seconds;
}

// One format's figures; nullopt seconds when it was not measured.
struct Result {
  std::string name;
  std::optional<double> seconds;
  int64_t file_bytes = 0;
};

int64_t FileBytes(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return 0;
  std::fseek(file, 0, SEEK_END);
  const long size = std::ftell(file);
  std::fclose(file);
  return size;
}

absl::Status Run(int64_t rows, bool json) {
  if (rows < 1) return absl::InvalidArgumentError("--rows must be >= 1");
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = absl::StrCat(
      tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/bench_data.XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError("cannot create a directory in " + dir_template);
  }
  const std::string dir = dir_template;
  const std::string raw = dir + "/features.raw";
  const std::string raw_labels = dir + "/labels.raw";
  const std::string contiguous = dir + "/contiguous.h5";
  const std::string gzip = dir + "/gzip.h5";
  const std::string npz = dir + "/stored.npz";

  const DataSet set = Generate(rows);
  std::vector<Result> results = {{"hdf5_contiguous", {}, 0},
                                 {"hdf5_gzip", {}, 0},
                                 {"npz", {}, 0},
                                 {"plain_read", {}, 0}};
  absl::Status status = [&]() -> absl::Status {
    MPILEARN_RETURN_IF_ERROR(WriteRaw(raw, set.features.data(),
                                      set.features.size() * sizeof(float)));
    MPILEARN_RETURN_IF_ERROR(
        WriteRaw(raw_labels, set.labels.data(), set.labels.size()));
    MPILEARN_RETURN_IF_ERROR(WriteHdf5(contiguous, set, 0));
    MPILEARN_RETURN_IF_ERROR(WriteHdf5(gzip, set, kChunkRows));
    const bool have_npz = WriteNpz(npz, raw, raw_labels, rows);
    const std::string paths[] = {contiguous, gzip, npz, raw};
    for (size_t i = 0; i < results.size(); ++i) {
      if (i == 2 && !have_npz) continue;
      results[i].file_bytes = FileBytes(paths[i]);
      absl::StatusOr<double> seconds = i == 3 ? TimePlain(set, paths[i])
                                              : TimeDataFile(set, paths[i]);
      if (!seconds.ok()) {
        return absl::Status(seconds.status().code(),
                            absl::StrCat(results[i].name, ": ",
                                         seconds.status().message()));
      }
      results[i].seconds = *seconds;
    }
    return absl::OkStatus();
  }();
  for (const std::string& path : {raw, raw_labels, contiguous, gzip, npz}) {
    unlink(path.c_str());
  }
  rmdir(dir.c_str());
  MPILEARN_RETURN_IF_ERROR(status);

  const double mb = static_cast<double>(rows * kFeatures) * sizeof(float) / 1e6;
  const double plain = *results[3].seconds;
  auto mb_s = [&](const Result& r) { return mb / *r.seconds; };
  if (json) {
    std::vector<std::string> fields = {
        absl::StrCat("\"rows\": ", rows),
        absl::StrCat("\"batch_rows\": ", kBatchRows),
        absl::StrFormat("\"features_mb\": %.1f", mb)};
    for (const Result& r : results) {
      if (!r.seconds.has_value()) {
        fields.push_back(absl::StrCat("\"", r.name, "_mb_s\": null"));
        fields.push_back(absl::StrCat("\"", r.name, "_samples_s\": null"));
        fields.push_back(absl::StrCat("\"", r.name, "_vs_plain\": null"));
        continue;
      }
      fields.push_back(absl::StrFormat("\"%s_mb_s\": %.1f", r.name, mb_s(r)));
      fields.push_back(absl::StrFormat("\"%s_samples_s\": %.0f", r.name,
                                       rows / *r.seconds));
      fields.push_back(absl::StrFormat("\"%s_file_bytes\": %d", r.name,
                                       r.file_bytes));
      if (r.name != "plain_read") {
        fields.push_back(absl::StrFormat("\"%s_vs_plain\": %.3f", r.name,
                                         plain / *r.seconds));
      }
    }
    std::printf("{%s}\n", absl::StrJoin(fields, ", ").c_str());
    return absl::OkStatus();
  }
  std::printf(
      "%lld rows x %lld float32 features (%.1f MB), batches of %lld rows, "
      "median of %d warm passes\n",
      static_cast<long long>(rows), static_cast<long long>(kFeatures), mb,
      static_cast<long long>(kBatchRows), kTimedPasses);
  std::printf("%-16s %12s %10s %12s %10s\n", "format", "file MB", "MB/s",
              "samples/s", "vs plain");
  for (const Result& r : results) {
    if (!r.seconds.has_value()) {
      std::printf("%-16s %12s\n", r.name.c_str(), "(no numpy)");
      continue;
    }
    std::printf("%-16s %12.1f %10.1f %12.0f %10.3f\n", r.name.c_str(),
                r.file_bytes / 1e6, mb_s(r), rows / *r.seconds,
                plain / *r.seconds);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench_data
}  // namespace mpilearn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // Errors become statuses.
  const absl::Status status = mpilearn::bench_data::Run(
      absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_json));
  if (!status.ok()) {
    std::fprintf(stderr, "bench_data: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
