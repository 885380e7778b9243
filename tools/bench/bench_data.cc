// bench_data: read throughput of the data file readers
// (worker/data/data_file.h) against a plain pread() of the same bytes, in one
// run.
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
// samples/s and each reader's ratio to the plain read.
//
// Then the data's share of training step time: the worker's own local
// baseline (`mpilearn-worker --local`, the master's core in its process,
// 1 compute thread, the default MLP, batch 64, 1 epoch, 5000 rows held out)
// trains on the same set three times: from IDX files loaded whole into
// memory (the baseline), and streamed from the contiguous and the gzip'd
// HDF5 file (units of 2048 rows read ahead on the prefetch thread). The
// figures are the run summary's (--summary_json): share.data (the time a
// rank spends getting batches: waiting for a unit's read, and in memory
// gathering each batch from the epoch's order) and samples/s, with each HDF5 run's ratio to the IDX run.
// --json prints one JSON object with all the figures. A benchmark, never a
// test.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
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
#include "google/protobuf/util/json_util.h"
#include "hdf5/serial/hdf5.h"
#include "proto/worker_summary.pb.h"
#include "worker/data/data_file.h"

ABSL_FLAG(bool, json, false, "Print one JSON object of the figures.");
ABSL_FLAG(int64_t, rows, 60000, "Rows (samples) in the generated set.");
ABSL_FLAG(bool, training, true,
          "Also measure the data share of training step time with "
          "mpilearn-worker --local (IDX vs streamed HDF5).");
ABSL_FLAG(std::string, worker, "",
          "The mpilearn-worker binary (default: from the Bazel runfiles).");

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

// Writes `set` as plain (not gzip'd) IDX files: float32 features [N, 784]
// and unsigned byte labels [N] (IDX stores values big-endian).
absl::Status WriteIdx(const std::string& features_path,
                      const std::string& labels_path, const DataSet& set) {
  auto be32 = [](uint32_t v, std::string* out) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out->push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  std::string features;
  features.reserve(16 + set.features.size() * 4);
  be32(0x00000D02, &features);  // float, 2 dimensions
  be32(static_cast<uint32_t>(set.rows), &features);
  be32(static_cast<uint32_t>(kFeatures), &features);
  for (float value : set.features) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    be32(bits, &features);
  }
  MPILEARN_RETURN_IF_ERROR(
      WriteRaw(features_path, features.data(), features.size()));
  std::string labels;
  be32(0x00000801, &labels);  // unsigned byte, 1 dimension
  be32(static_cast<uint32_t>(set.rows), &labels);
  labels.append(set.labels.begin(), set.labels.end());
  return WriteRaw(labels_path, labels.data(), labels.size());
}

// The worker binary: --worker, else next to this one in the runfiles.
std::string WorkerBinary(const char* argv0) {
  if (!absl::GetFlag(FLAGS_worker).empty()) return absl::GetFlag(FLAGS_worker);
  const char* runfiles = std::getenv("RUNFILES_DIR");
  const std::string dir = runfiles != nullptr
                              ? std::string(runfiles)
                              : absl::StrCat(argv0, ".runfiles");
  return dir + "/mpilearn/worker/mpilearn-worker";
}

// One local training run's figures.
struct TrainingRun {
  std::string name;
  double data_share = 0.0;
  double samples_per_s = 0.0;
};

// Trains `data_json` (the spec's "data" object) with the local baseline
// and reads its run summary.
absl::StatusOr<TrainingRun> TrainLocally(const std::string& worker,
                                         const std::string& dir,
                                         const std::string& name,
                                         const std::string& data_json) {
  const std::string spec_path = absl::StrCat(dir, "/", name, ".json");
  const std::string spec = absl::StrCat(
      "{\"name\": \"bench-data-", name, "\", \"model\": {\"name\": \"mlp\"}, ",
      "\"data\": ", data_json, ", \"epochs\": 1, \"batch_size\": 64, ",
      "\"seed\": 1}");
  MPILEARN_RETURN_IF_ERROR(WriteRaw(spec_path, spec.data(), spec.size()));
  const std::string summary = absl::StrCat(dir, "/", name, ".summary.json");
  const std::string log = absl::StrCat(dir, "/", name, ".log");
  const std::string command = absl::StrCat(
      worker, " --local --job ", spec_path, " --threads 1 --progress off",
      " --local_state_dir ", dir, "/state-", name, " --summary_json ", summary,
      " >", log, " 2>&1");
  const int status = std::system(command.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    FILE* file = std::fopen(log.c_str(), "rb");
    std::string text(4096, '\0');
    text.resize(file != nullptr ? std::fread(text.data(), 1, text.size(), file) : 0);
    if (file != nullptr) std::fclose(file);
    return absl::InternalError(
        absl::StrCat("training ", name, " failed (", command, "): ", text));
  }
  FILE* file = std::fopen(summary.c_str(), "rb");
  if (file == nullptr) return absl::InternalError("no summary " + summary);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), file));
  std::fclose(file);
  v1::RunSummary parsed;
  if (!google::protobuf::util::JsonStringToMessage(text, &parsed).ok()) {
    return absl::InternalError("cannot parse " + summary);
  }
  return TrainingRun{name, parsed.share().data(), parsed.samples_per_s()};
}

absl::Status Run(int64_t rows, bool json, const std::string& worker) {
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
  const std::string idx_features = dir + "/features.idx";
  const std::string idx_labels = dir + "/labels.idx";

  const DataSet set = Generate(rows);
  std::vector<TrainingRun> training;
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
    if (worker.empty()) return absl::OkStatus();
    MPILEARN_RETURN_IF_ERROR(WriteIdx(idx_features, idx_labels, set));
    const std::string held_out = "\"validation_count\": 5000";
    for (const auto& [name, data] : std::vector<std::pair<std::string, std::string>>{
             {"idx", absl::StrCat("{\"train_images\": \"", idx_features,
                                  "\", \"train_labels\": \"", idx_labels, "\", ",
                                  held_out, "}")},
             {"hdf5", absl::StrCat("{\"train_files\": [\"", contiguous, "\"], ",
                                   held_out, "}")},
             {"hdf5_gzip", absl::StrCat("{\"train_files\": [\"", gzip, "\"], ",
                                        held_out, "}")}}) {
      MPILEARN_ASSIGN_OR_RETURN(TrainingRun run,
                                TrainLocally(worker, dir, name, data));
      training.push_back(run);
    }
    return absl::OkStatus();
  }();
  std::filesystem::remove_all(dir);
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
    for (const TrainingRun& run : training) {
      fields.push_back(absl::StrFormat("\"train_%s_data_share\": %.4f", run.name,
                                       run.data_share));
      fields.push_back(absl::StrFormat("\"train_%s_samples_s\": %.0f", run.name,
                                       run.samples_per_s));
      if (run.name != "idx") {
        fields.push_back(absl::StrFormat("\"train_%s_vs_idx\": %.3f", run.name,
                                         run.samples_per_s / training[0].samples_per_s));
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
  if (!training.empty()) {
    std::printf(
        "\ntraining (mpilearn-worker --local, default MLP, batch 64, 1 thread, "
        "1 epoch)\n%-16s %12s %10s %10s\n",
        "data", "data share", "samples/s", "vs idx");
    for (const TrainingRun& run : training) {
      std::printf("%-16s %11.2f%% %10.0f %10.3f\n", run.name.c_str(),
                  100.0 * run.data_share, run.samples_per_s,
                  run.samples_per_s / training[0].samples_per_s);
    }
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
      absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_json),
      absl::GetFlag(FLAGS_training) ? mpilearn::bench_data::WorkerBinary(argv[0])
                                    : std::string());
  if (!status.ok()) {
    std::fprintf(stderr, "bench_data: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
