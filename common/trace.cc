#include "common/trace.h"

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mpilearn {
namespace {

// JSON string body for names we generate (event names, labels): escapes
// quotes, backslashes and control characters.
std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string MetadataEvent(absl::string_view kind, int pid, int tid,
                          absl::string_view name) {
  return absl::StrFormat(
      R"({"name":"%s","ph":"M","pid":%d,"tid":%d,"args":{"name":"%s"}})", kind,
      pid, tid, JsonEscape(name));
}

constexpr size_t kFileBufferBytes = size_t{1} << 20;

}  // namespace

int CurrentTraceThreadId() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1);
  return id;
}

TraceRecorder::TraceRecorder(int pid, size_t max_bytes, std::FILE* file)
    : pid_(pid), max_bytes_(max_bytes), file_(file) {}

std::unique_ptr<TraceRecorder> TraceRecorder::InMemory(
    int pid, absl::string_view process_name, size_t max_bytes) {
  auto recorder = std::unique_ptr<TraceRecorder>(
      new TraceRecorder(pid, max_bytes, nullptr));
  absl::MutexLock lock(&recorder->mu_);
  recorder->AppendLocked(MetadataEvent("process_name", pid, 0, process_name));
  return recorder;
}

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::ToFile(
    const std::string& path, int pid, absl::string_view process_name) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the trace file '", path,
                     "': ", std::strerror(errno),
                     "; give --trace a path in a writable directory"));
  }
  auto recorder = std::unique_ptr<TraceRecorder>(
      new TraceRecorder(pid, /*max_bytes=*/0, file));
  absl::MutexLock lock(&recorder->mu_);
  recorder->buffer_ = "[\n";
  recorder->AppendLocked(MetadataEvent("process_name", pid, 0, process_name));
  absl::Status flushed = recorder->FlushLocked();
  if (!flushed.ok()) return flushed;
  return recorder;
}

TraceRecorder::~TraceRecorder() { Close().IgnoreError(); }

void TraceRecorder::AppendLocked(const std::string& event) {
  if (file_ == nullptr && max_bytes_ > 0 &&
      buffer_.size() + event.size() > max_bytes_) {
    ++dropped_;
    return;
  }
  if (!first_in_file_) buffer_ += ",\n";
  first_in_file_ = false;
  buffer_ += event;
  ++recorded_;
  if (file_ != nullptr && buffer_.size() >= kFileBufferBytes) {
    FlushLocked().IgnoreError();
  }
}

void TraceRecorder::Complete(absl::string_view name, absl::string_view category,
                             absl::Time start, absl::Time end, Args args) {
  const int64_t ts = absl::ToUnixMicros(start);
  const int64_t dur = std::max<int64_t>(0, absl::ToInt64Microseconds(end - start));
  std::string event = absl::StrFormat(
      R"({"name":"%s","cat":"%s","ph":"X","ts":%d,"dur":%d,"pid":%d,"tid":%d)",
      JsonEscape(name), JsonEscape(category), ts, dur, pid_,
      CurrentTraceThreadId());
  if (!args.empty()) {
    event += R"(,"args":{)";
    for (size_t i = 0; i < args.size(); ++i) {
      absl::StrAppend(&event, i > 0 ? "," : "", "\"", JsonEscape(args[i].first),
                      "\":", args[i].second);
    }
    event += "}";
  }
  event += "}";
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr && max_bytes_ == 0) return;  // closed file recorder
  AppendLocked(event);
}

void TraceRecorder::NameThread(absl::string_view name) {
  std::string event =
      MetadataEvent("thread_name", pid_, CurrentTraceThreadId(), name);
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr && max_bytes_ == 0) return;
  AppendLocked(event);
}

std::string TraceRecorder::TakeEvents() {
  absl::MutexLock lock(&mu_);
  std::string events;
  events.swap(buffer_);
  first_in_file_ = true;
  return events;
}

absl::Status TraceRecorder::FlushLocked() {
  if (file_ == nullptr) return absl::OkStatus();
  if (!buffer_.empty()) {
    const size_t written = std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    buffer_.clear();
    if (written == 0) {
      return absl::DataLossError("could not write the trace file");
    }
  }
  if (std::fflush(file_) != 0) {
    return absl::DataLossError(
        absl::StrCat("could not write the trace file: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TraceRecorder::Flush() {
  absl::MutexLock lock(&mu_);
  return FlushLocked();
}

absl::Status TraceRecorder::Close() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::OkStatus();
  buffer_ += "\n]\n";
  absl::Status flushed = FlushLocked();
  std::fclose(file_);
  file_ = nullptr;
  return flushed;
}

uint64_t TraceRecorder::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

uint64_t TraceRecorder::recorded() const {
  absl::MutexLock lock(&mu_);
  return recorded_;
}

void TraceSpan::End() {
  if (recorder_ == nullptr) return;
  recorder_->Complete(name_, category_, start_, absl::Now(),
                      TraceRecorder::Args(args_, num_args_));
  recorder_ = nullptr;
}

absl::Status WriteTraceFile(const std::string& path,
                            const std::vector<std::string>& event_chunks) {
  const std::string tmp = path + ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the trace file '", path,
                     "': ", std::strerror(errno),
                     "; give --trace a path in a writable directory"));
  }
  bool ok = std::fputs("[\n", file) >= 0;
  bool first = true;
  for (const std::string& chunk : event_chunks) {
    if (chunk.empty()) continue;
    if (!first) ok = ok && std::fputs(",\n", file) >= 0;
    first = false;
    ok = ok && std::fwrite(chunk.data(), 1, chunk.size(), file) == chunk.size();
  }
  ok = ok && std::fputs("\n]\n", file) >= 0;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat("could not write the trace file '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn
