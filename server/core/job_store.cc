#include "server/core/job_store.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_file.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn::server {
namespace {

namespace fs = std::filesystem;

absl::Status EnsureDir(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create directory '", path, "': ", ec.message(),
        "; pass a writable --state_dir"));
  }
  return absl::OkStatus();
}

constexpr char kJobPrefix[] = "job-";
// In the jobs directory: the highest job number ever removed (RemoveJob).
constexpr char kLastJobNumberFile[] = "last_job_number";
constexpr char kCheckpointPrefix[] = "ckpt-";
constexpr char kCheckpointSuffix[] = ".pb";
constexpr int kVersionDigits = 12;

// "ckpt-000000000812.pb" -> true.
bool IsCheckpointName(const std::string& name) {
  const size_t prefix = sizeof(kCheckpointPrefix) - 1;
  const size_t suffix = sizeof(kCheckpointSuffix) - 1;
  if (name.size() != prefix + kVersionDigits + suffix ||
      !absl::StartsWith(name, kCheckpointPrefix) ||
      !absl::EndsWith(name, kCheckpointSuffix)) {
    return false;
  }
  return std::all_of(name.begin() + prefix, name.end() - suffix,
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& state_dir) {
  if (state_dir.empty()) {
    return absl::InvalidArgumentError("--state_dir must not be empty");
  }
  const std::string jobs_dir = (fs::path(state_dir) / "jobs").string();
  MPILEARN_RETURN_IF_ERROR(EnsureDir(jobs_dir));
  if (::access(jobs_dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory '", jobs_dir, "' is not writable; pass a writable "
        "--state_dir"));
  }
  return std::unique_ptr<JobStore>(new JobStore(jobs_dir));
}

int64_t JobStore::LastJobNumber() const {
  int64_t last = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(jobs_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t number = 0;
    if (absl::StartsWith(name, kJobPrefix) &&
        absl::SimpleAtoi(name.substr(sizeof(kJobPrefix) - 1), &number)) {
      last = std::max(last, number);
    }
  }
  const absl::StatusOr<std::string> removed =
      ReadWholeFile((fs::path(jobs_dir_) / kLastJobNumberFile).string());
  int64_t number = 0;
  if (removed.ok() &&
      absl::SimpleAtoi(absl::StripAsciiWhitespace(*removed), &number)) {
    last = std::max(last, number);
  }
  return last;
}

absl::Status JobStore::RemoveJob(const std::string& job_id) {
  int64_t number = 0;
  if (absl::StartsWith(job_id, kJobPrefix) &&
      absl::SimpleAtoi(job_id.substr(sizeof(kJobPrefix) - 1), &number) &&
      number >= LastJobNumber()) {
    MPILEARN_RETURN_IF_ERROR(WriteFileAtomically(
        (fs::path(jobs_dir_) / kLastJobNumberFile).string(),
        absl::StrCat(number, "\n")));
  }
  std::error_code ec;
  fs::remove_all(JobDir(job_id), ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot remove '", JobDir(job_id),
                                            "': ", ec.message()));
  }
  return absl::OkStatus();
}

std::string JobStore::JobDir(const std::string& job_id) const {
  return (fs::path(jobs_dir_) / job_id).string();
}

absl::Status JobStore::WriteSpec(const std::string& job_id,
                                 const v1::JobSpec& spec) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  return WriteFileAtomically(JobDir(job_id) + "/spec.json", JobSpecToJson(spec));
}

absl::Status JobStore::WriteHistory(const std::string& job_id,
                                    const v1::JobStatus& status) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(status, &json, options);
  return WriteFileAtomically(JobDir(job_id) + "/history.json", json);
}

absl::Status JobStore::WriteWeights(const std::string& job_id,
                                    const v1::TensorSet& weights) {
  return WriteTensorSet(job_id, "weights.pb", weights);
}

absl::Status JobStore::WriteOptimizerState(const std::string& job_id,
                                           const v1::TensorSet& state) {
  return WriteTensorSet(job_id, "optimizer.pb", state);
}

absl::Status JobStore::WriteTensorSet(const std::string& job_id,
                                      const std::string& file,
                                      const v1::TensorSet& set) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  std::string bytes;
  if (!set.SerializeToString(&bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        file, ": tensor set too large for a single TensorSet file (over 2 GiB)"));
  }
  return WriteFileAtomically(JobDir(job_id) + "/" + file, bytes);
}


std::string JobStore::CheckpointDir(const std::string& job_id) const {
  return (fs::path(JobDir(job_id)) / "checkpoints").string();
}

absl::Status JobStore::WriteCheckpoint(const std::string& job_id,
                                       const v1::JobCheckpointFile& checkpoint,
                                       int keep) {
  const std::string dir = CheckpointDir(job_id);
  MPILEARN_RETURN_IF_ERROR(EnsureDir(dir));
  MPILEARN_ASSIGN_OR_RETURN(std::string bytes, EncodeCheckpoint(checkpoint));
  const std::string name =
      absl::StrFormat("%s%0*d%s", kCheckpointPrefix, kVersionDigits,
                      checkpoint.weights().header().version(), kCheckpointSuffix);
  MPILEARN_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + name, bytes));
  const std::vector<std::string> paths = CheckpointPaths(job_id);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < paths.size();
       ++i) {
    std::error_code ec;
    fs::remove(paths[i], ec);
    if (ec) {
      LOG(WARNING) << "job " << job_id << ": cannot delete old checkpoint '"
                   << paths[i] << "': " << ec.message();
    }
  }
  return absl::OkStatus();
}

absl::Status JobStore::WriteBestCheckpoint(
    const std::string& job_id, const v1::JobCheckpointFile& checkpoint) {
  const std::string dir = CheckpointDir(job_id);
  MPILEARN_RETURN_IF_ERROR(EnsureDir(dir));
  MPILEARN_ASSIGN_OR_RETURN(std::string bytes, EncodeCheckpoint(checkpoint));
  return WriteFileAtomically(dir + "/best.pb", bytes);
}

std::vector<std::string> JobStore::CheckpointPaths(
    const std::string& job_id) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(CheckpointDir(job_id), ec)) {
    const std::string name = entry.path().filename().string();
    if (IsCheckpointName(name)) names.push_back(name);
  }
  // Zero-padded versions: name order is version order.
  std::sort(names.rbegin(), names.rend());
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    paths.push_back(CheckpointDir(job_id) + "/" + name);
  }
  return paths;
}

absl::StatusOr<v1::JobCheckpointFile> JobStore::ReadCheckpoint(
    const std::string& path) {
  return ReadCheckpointFile(path);
}

absl::Status JobStore::QuarantineCheckpoint(const std::string& path) {
  std::error_code ec;
  fs::rename(path, path + ".corrupt", ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename '", path,
                                            "' to .corrupt: ", ec.message()));
  }
  return absl::OkStatus();
}

void JobStore::RemoveTempFiles(const std::string& job_id) {
  for (const std::string& dir : {JobDir(job_id), CheckpointDir(job_id)}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (absl::StrContains(entry.path().filename().string(),
                            kAtomicWriteTempInfix)) {
        std::error_code removed;
        fs::remove(entry.path(), removed);
      }
    }
  }
}

std::vector<std::string> JobStore::JobIds() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(jobs_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t number = 0;
    if (entry.is_directory(ec) && absl::StartsWith(name, kJobPrefix) &&
        absl::SimpleAtoi(name.substr(sizeof(kJobPrefix) - 1), &number)) {
      found.emplace_back(number, name);
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> ids;
  for (auto& entry : found) ids.push_back(std::move(entry.second));
  return ids;
}

absl::StatusOr<v1::JobSpec> JobStore::ReadSpec(const std::string& job_id) const {
  return ReadJobSpecFile(JobDir(job_id) + "/spec.json");
}

absl::StatusOr<v1::JobStatus> JobStore::ReadHistory(
    const std::string& job_id) const {
  const std::string path = JobDir(job_id) + "/history.json";
  MPILEARN_ASSIGN_OR_RETURN(std::string json, ReadWholeFile(path));
  v1::JobStatus status;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(json, &status, options);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a JobStatus: ",
                                            std::string(parsed.message())));
  }
  return status;
}

}  // namespace mpilearn::server
