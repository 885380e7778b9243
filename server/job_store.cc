#include "server/job_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn::server {
namespace {

namespace fs = std::filesystem;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

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

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  // Unique per process and call: two threads may write the same file.
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", getpid(), ".", sequence.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n =
        ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status status = ErrnoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    absl::Status status = ErrnoError("cannot flush", tmp);
    ::unlink(tmp.c_str());
    return status;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoError("cannot rename into", path);
    ::unlink(tmp.c_str());
    return status;
  }
  return absl::OkStatus();
}

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
  return last;
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

}  // namespace mpilearn::server
