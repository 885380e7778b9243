// Chrome trace-event recording for `--trace FILE` (master and workers).
//
// The files are the trace-event "JSON array format": `[` then one event
// object per line. chrome://tracing and Perfetto (ui.perfetto.dev) load them,
// including a file cut short by a crash (the format allows the closing `]`
// to be missing). Every event is a complete event ("ph": "X") with
// timestamps in microseconds since the Unix epoch, so the master's file and
// the groups' files share one time axis and can be concatenated.
//
//   // The master: stream to a file as events happen.
//   auto trace = TraceRecorder::ToFile("master.trace.json", /*pid=*/0,
//                                      "mpilearn-master");
//   { TraceSpan span((*trace).get(), "apply", "master"); ... }
//   (*trace)->Close();
//
//   // A worker rank: keep events in memory; rank 0 gathers every rank's
//   // TakeEvents() and writes one file per group with WriteTraceFile.
//   auto trace = TraceRecorder::InMemory(/*pid=*/rank, "group g-1 rank 0");
//
// A null recorder turns every TraceSpan into a no-op (tracing off costs one
// branch per span).
//
// Threading: thread-safe; each thread gets a small integer thread id
// (CurrentTraceThreadId) used as the event's "tid".
#ifndef MPILEARN_COMMON_TRACE_H_
#define MPILEARN_COMMON_TRACE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace mpilearn {

// A small, stable integer for the calling thread (1, 2, ... in order of first
// use), for trace events' "tid".
int CurrentTraceThreadId();

class TraceRecorder {
 public:
  using Arg = std::pair<absl::string_view, int64_t>;
  using Args = absl::Span<const Arg>;

  // Keeps events in memory, at most `max_bytes` of event text; later events
  // are dropped and counted (dropped()).
  static std::unique_ptr<TraceRecorder> InMemory(
      int pid, absl::string_view process_name,
      size_t max_bytes = size_t{256} << 20);

  // Streams events to `path` (created or truncated), buffering up to 1 MiB;
  // an error names the path when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> ToFile(
      const std::string& path, int pid, absl::string_view process_name);

  ~TraceRecorder();  // Close()
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // A complete event on the calling thread. `args` become the event's
  // "args" object (shown when the event is selected).
  void Complete(absl::string_view name, absl::string_view category,
                absl::Time start, absl::Time end, Args args = {});

  // Names the calling thread in the viewer ("thread_name" metadata).
  void NameThread(absl::string_view name);

  // In memory: the events recorded so far as event objects separated by
  // ",\n" (empty if none), and forgets them. Used to gather ranks' events.
  std::string TakeEvents();

  // To a file: writes buffered events out. Close also ends the JSON array.
  absl::Status Flush();
  absl::Status Close();

  int pid() const { return pid_; }
  uint64_t dropped() const;
  uint64_t recorded() const;

 private:
  TraceRecorder(int pid, size_t max_bytes, std::FILE* file);
  void AppendLocked(const std::string& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int pid_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);  // null in memory or once closed
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  bool first_in_file_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records one complete event from construction to destruction; nothing when
// the recorder is null.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* recorder, absl::string_view name,
            absl::string_view category)
      : recorder_(recorder), name_(name), category_(category),
        start_(recorder != nullptr ? absl::Now() : absl::InfinitePast()) {}
  ~TraceSpan() { End(); }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // Adds an integer argument shown with the event (at most 4).
  void Arg(absl::string_view key, int64_t value) {
    if (recorder_ != nullptr && num_args_ < 4) args_[num_args_++] = {key, value};
  }
  // Records the event now (once).
  void End();

 private:
  TraceRecorder* recorder_;
  absl::string_view name_;
  absl::string_view category_;
  absl::Time start_;
  std::pair<absl::string_view, int64_t> args_[4];
  int num_args_ = 0;
};

// Writes a complete trace file: `[`, the event chunks (each as TakeEvents
// returns them), `]`. Written to a temporary name and renamed, so readers
// never see half a file.
absl::Status WriteTraceFile(const std::string& path,
                            const std::vector<std::string>& event_chunks);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_TRACE_H_
