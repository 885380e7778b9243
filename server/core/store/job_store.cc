// JobStore (job_store.h). About 550 lines: the job directory's layout,
// atomic writes, the records.jsonl appends and their merged, bounded read
// belong together (one file format).
#include "server/core/store/job_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_text.h"
#include "common/checkpoint_file.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn::server {
namespace {

namespace fs = std::filesystem;

absl::Status EnsureDir(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory '", path, "': ", ec.message(),
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

// "ckpt-000000000812.pb" for version 812.
std::string CheckpointFileName(uint64_t version) {
  return absl::StrFormat("%s%0*d%s", kCheckpointPrefix, kVersionDigits, version,
                         kCheckpointSuffix);
}

constexpr char kHistoryFile[] = "history.json";
constexpr char kRecordsFile[] = "records.jsonl";

absl::Status ErrnoError(const std::string& what, const std::string& path,
                        int error) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(error)));
}

// One record as a records.jsonl line ("{"KEY":JSON}\n").
std::string RecordLine(const char* key,
                       const google::protobuf::Message& record) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(record, &json, options);
  return absl::StrCat("{\"", key, "\":", json, "}\n");
}

void AppendLines(const JobStore::Records& records, std::string* out) {
  for (const v1::EpochRecord& epoch : records.epochs) {
    out->append(RecordLine("epoch", epoch));
  }
  for (const v1::ValidationRecord& validation : records.validations) {
    out->append(RecordLine("validation", validation));
  }
}

// Replays one records.jsonl line onto `status`; `epoch_index` maps epoch
// numbers to their place in status->history(). An error says what is wrong
// with the line (the caller names the file and line).
absl::Status ReplayLine(absl::string_view line, v1::JobStatus* status,
                        std::map<int32_t, int>* epoch_index) {
  google::protobuf::Struct object;
  google::protobuf::util::JsonParseOptions options;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(line),
                                                            &object, options);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("not a JSON object: ", std::string(parsed.message())));
  }
  if (object.fields_size() != 1) {
    return absl::DataLossError(
        absl::StrCat("expected one key (epoch, validation or reset), found ",
                     object.fields_size()));
  }
  const auto& [key, value] = *object.fields().begin();
  if (key == "reset") {
    status->clear_history();
    status->clear_validations();
    epoch_index->clear();
    return absl::OkStatus();
  }
  if (key != "epoch" && key != "validation") {
    LOG_FIRST_N(WARNING, 1) << "records.jsonl: skipping a record of unknown "
                               "kind '"
                            << EchoPrefix(key) << "'";
    return absl::OkStatus();
  }
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(value, &json);
  google::protobuf::util::JsonParseOptions record_options;
  record_options.ignore_unknown_fields = true;
  if (key == "epoch") {
    v1::EpochRecord record;
    parsed = google::protobuf::util::JsonStringToMessage(json, &record,
                                                         record_options);
    if (!parsed.ok()) {
      return absl::DataLossError(
          absl::StrCat("not an EpochRecord: ", std::string(parsed.message())));
    }
    auto [it, added] =
        epoch_index->emplace(record.epoch(), status->history_size());
    if (added) {
      *status->add_history() = std::move(record);
    } else {
      *status->mutable_history(it->second) = std::move(record);
    }
    return absl::OkStatus();
  }
  v1::ValidationRecord record;
  parsed = google::protobuf::util::JsonStringToMessage(json, &record,
                                                       record_options);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("not a ValidationRecord: ",
                                            std::string(parsed.message())));
  }
  *status->add_validations() = std::move(record);
  return absl::OkStatus();
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
    return absl::FailedPreconditionError(
        absl::StrCat("state directory '", jobs_dir,
                     "' is not writable; pass a writable "
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
    MPILEARN_RETURN_IF_ERROR(
        WriteFileAtomically((fs::path(jobs_dir_) / kLastJobNumberFile).string(),
                            absl::StrCat(number, "\n")));
  }
  std::error_code ec;
  fs::remove_all(JobDir(job_id), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot remove '", JobDir(job_id), "': ", ec.message()));
  }
  return absl::OkStatus();
}

std::string JobStore::JobDir(const std::string& job_id) const {
  return (fs::path(jobs_dir_) / job_id).string();
}

absl::Status JobStore::WriteSpec(const std::string& job_id,
                                 const v1::JobSpec& spec) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  return WriteFileAtomically(JobDir(job_id) + "/spec.json",
                             JobSpecToJson(spec));
}

std::string JobStore::HistoryPath(const std::string& job_id) const {
  return (fs::path(JobDir(job_id)) / kHistoryFile).string();
}

std::string JobStore::RecordsPath(const std::string& job_id) const {
  return (fs::path(JobDir(job_id)) / kRecordsFile).string();
}

absl::Status JobStore::WriteHistory(const std::string& job_id,
                                    const v1::JobStatus& status) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  // The lists live in records.jsonl; copy only when there are any to drop.
  v1::JobStatus stripped_copy;
  const v1::JobStatus* stripped = &status;
  if (status.history_size() > 0 || status.validations_size() > 0) {
    stripped_copy = status;
    stripped_copy.clear_history();
    stripped_copy.clear_validations();
    stripped = &stripped_copy;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(*stripped, &json, options);
  return WriteFileAtomically(HistoryPath(job_id), json);
}

absl::Status JobStore::WriteRecords(const std::string& job_id,
                                    const v1::JobStatus& status) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  std::string text = "{\"reset\":true}\n";
  for (const v1::EpochRecord& epoch : status.history()) {
    text.append(RecordLine("epoch", epoch));
  }
  for (const v1::ValidationRecord& validation : status.validations()) {
    text.append(RecordLine("validation", validation));
  }
  return WriteFileAtomically(RecordsPath(job_id), text);
}

absl::Status JobStore::AppendRecords(const std::string& job_id,
                                     const Records& records) {
  std::string text;
  AppendLines(records, &text);
  if (text.empty()) return absl::OkStatus();
  const std::string path = RecordsPath(job_id);
  // No O_CREAT of the directory: a deleted job's directory stays deleted.
  const int fd =
      ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, error);
  }
  const off_t size = info.st_size;
  if (size > 0) {
    char last = 0;
    if (::pread(fd, &last, 1, size - 1) != 1 || last != '\n') {
      ::close(fd);
      return absl::DataLossError(
          absl::StrCat("'", path,
                       "' ends in a cut line; it must be rewritten before "
                       "appending"));
    }
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      // Best effort: no cut line left behind for the next append. If even
      // this fails, the next append finds the cut line and the caller
      // rewrites the file.
      if (::ftruncate(fd, size) != 0) {
        LOG(WARNING) << "'" << path << "': cannot cut back a failed append";
      }
      ::close(fd);
      return ErrnoError("cannot append to", path, error);
    }
    written += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoError("cannot flush", path, error);
  }
  if (::close(fd) != 0) return ErrnoError("cannot close", path, errno);
  // A new file's directory entry must be durable too.
  if (size == 0) return FsyncDirectory(JobDir(job_id));
  return absl::OkStatus();
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
        file,
        ": tensor set too large for a single TensorSet file (over 2 GiB)"));
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
  MPILEARN_RETURN_IF_ERROR(WriteFileAtomically(
      CheckpointPath(job_id, checkpoint.weights().header().version()), bytes));
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

std::vector<uint64_t> JobStore::CheckpointVersions(const std::string& job_id,
                                                   size_t limit) const {
  std::vector<uint64_t> versions;
  const size_t prefix = sizeof(kCheckpointPrefix) - 1;
  for (const std::string& path : CheckpointPaths(job_id)) {
    if (versions.size() >= limit) break;
    const std::string name = fs::path(path).filename().string();
    uint64_t version = 0;
    if (absl::SimpleAtoi(name.substr(prefix, kVersionDigits), &version)) {
      versions.push_back(version);
    }
  }
  return versions;
}

std::string JobStore::CheckpointName(const std::string& job_id, uint64_t version) {
  return absl::StrCat("jobs/", job_id, "/checkpoints/", CheckpointFileName(version));
}

std::string JobStore::CheckpointPath(const std::string& job_id, uint64_t version) const {
  return absl::StrCat(CheckpointDir(job_id), "/", CheckpointFileName(version));
}

absl::Status JobStore::RemoveCheckpointsAfter(const std::string& job_id, uint64_t version) {
  const std::vector<uint64_t> versions = CheckpointVersions(job_id, SIZE_MAX);
  for (uint64_t newer : versions) {
    if (newer <= version) break;
    std::error_code ec;
    fs::remove(CheckpointPath(job_id, newer), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot delete checkpoint '",
                                              CheckpointPath(job_id, newer),
                                              "': ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status JobStore::WriteShardManifest(const std::string& job_id,
                                          const v1::ShardManifest& manifest) {
  MPILEARN_RETURN_IF_ERROR(EnsureDir(JobDir(job_id)));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(manifest, &json, options);
  return WriteFileAtomically(JobDir(job_id) + "/shard_manifest.json", json);
}

absl::StatusOr<v1::JobCheckpointFile> JobStore::ReadCheckpoint(
    const std::string& path) {
  return ReadCheckpointFile(path);
}

absl::Status JobStore::QuarantineCheckpoint(const std::string& path) {
  return Quarantine(path);
}

absl::Status JobStore::Quarantine(const std::string& path) {
  std::error_code ec;
  fs::rename(path, path + ".corrupt", ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename '", path, "' to .corrupt: ", ec.message()));
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

absl::StatusOr<JobConfig> JobStore::ReadSpec(
    const std::string& job_id) const {
  return JobConfig::FromFile(JobDir(job_id) + "/spec.json");
}

absl::StatusOr<v1::JobStatus> JobStore::ReadHistory(
    const std::string& job_id, HistoryFormat* format) const {
  MPILEARN_ASSIGN_OR_RETURN(v1::JobStatus status, ReadHistoryStatus(job_id));
  HistoryFormat found;
  found.lists_in_history =
      status.history_size() > 0 || status.validations_size() > 0;
  const std::string path = RecordsPath(job_id);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      if (format != nullptr) *format = found;
      return status;  // no record yet, or a history.json with its lists
    }
    return absl::InternalError(
        absl::StrCat("cannot stat '", path, "': ", ec.message()));
  }
  if (size > static_cast<uintmax_t>(kMaxRecordsBytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "'", path, "' is ", size, " bytes, over the ", kMaxRecordsBytes,
        " this master reads; move it away (the job then loads from its "
        "checkpoint) or cut it"));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  std::map<int32_t, int> epoch_index;
  for (int i = 0; i < status.history_size(); ++i) {
    epoch_index[status.history(i).epoch()] = i;
  }
  size_t begin = 0;
  int64_t line_number = 0;
  while (begin < text.size()) {
    ++line_number;
    const size_t newline = text.find('\n', begin);
    const bool complete = newline != std::string::npos;
    const size_t end = complete ? newline : text.size();
    const bool last = !complete || end + 1 == text.size();
    if (end - begin > static_cast<size_t>(kMaxRecordLineBytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "'", path, "' line ", line_number, " is ", end - begin,
          " bytes, over the ", kMaxRecordLineBytes, " this master reads"));
    }
    const absl::string_view line(text.data() + begin, end - begin);
    if (!complete) {
      // A crash cut the last append short.
      LOG(WARNING) << "'" << path << "' line " << line_number
                   << " is cut short (no newline); skipping it";
      found.torn_tail = true;
      break;
    }
    const absl::Status replayed = ReplayLine(line, &status, &epoch_index);
    if (!replayed.ok()) {
      if (last) {
        LOG(WARNING) << "'" << path << "' last line " << line_number
                     << " is damaged (" << EchoPrefix(replayed.message())
                     << "); skipping it";
        found.torn_tail = true;
        break;
      }
      return absl::DataLossError(absl::StrCat("'", path, "' line ", line_number,
                                              ": ",
                                              EchoPrefix(replayed.message())));
    }
    ++found.record_lines;
    begin = end + 1;
  }
  if (format != nullptr) *format = found;
  return status;
}

absl::Status JobStore::QuarantineRecords(const std::string& job_id) {
  return Quarantine(RecordsPath(job_id));
}

absl::Time JobStore::ModifiedTime(const std::string& path) const {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) return absl::InfinitePast();
  return absl::TimeFromTimespec(info.st_mtim);
}

absl::StatusOr<v1::JobStatus> JobStore::ReadHistoryStatus(
    const std::string& job_id) const {
  const std::string path = HistoryPath(job_id);
  MPILEARN_ASSIGN_OR_RETURN(std::string json, ReadWholeFile(path));
  v1::JobStatus status;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(json, &status, options);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is not a JobStatus: ", std::string(parsed.message())));
  }
  return status;
}

}  // namespace mpilearn::server
