// What a soak run counts: RPCs by method and their errors by status code
// (expected or not), check failures, and the master's resident memory over
// time with its least-squares slope.
//
//   RpcStats stats;
//   absl::Status status = ...;          // one RPC's outcome
//   stats.Record(Rpc::kPushGradient, status, /*expected=*/IsStale(status));
//
//   RssSeries rss;
//   rss.Add(seconds, mib);
//   RssSummary after = rss.Summarize(/*from_seconds=*/30);
#ifndef MPILEARN_TOOLS_SOAK_SOAK_STATS_H_
#define MPILEARN_TOOLS_SOAK_SOAK_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace mpilearn {
namespace soak {

// The Master service's calls a soak makes.
enum class Rpc {
  kSubmitJob,
  kRegisterGroup,
  kInitWeights,
  kNextDataUnit,
  kPushGradient,
  kPullWeights,
  kReportEpoch,
  kHeartbeat,
  kLeave,
  kGetJobStatus,
  kCancelJob,
  kDeleteJob,
  kCount,  // not a call: the number of calls
};

// "PushGradient" for Rpc::kPushGradient.
absl::string_view RpcName(Rpc rpc);

// Counts of RPCs and their outcomes. Thread-safe: any thread records; the
// counters are atomics and the few kept messages sit under a mutex.
class RpcStats {
 public:
  // Counts one call of `rpc` that ended with `status`; a non-OK status is
  // counted by its code, and also as unexpected unless `expected` (the
  // caller knows the protocol allows it, e.g. a stale-update refusal).
  // The first kKeptMessages unexpected errors keep their message.
  void Record(Rpc rpc, const absl::Status& status, bool expected = false);

  // A result the soak checks that came out wrong (e.g. a job's
  // updates_applied differs from the pushes the master accepted). Kept as
  // a message, like an unexpected error, and fails the run.
  void CheckFailed(const std::string& message);

  uint64_t Total() const;
  uint64_t Calls(Rpc rpc) const {
    return calls_[static_cast<int>(rpc)].load(std::memory_order_relaxed);
  }
  // Errors by code name ("ABORTED"), all of them / only the unexpected.
  std::map<std::string, uint64_t> Errors() const;
  std::map<std::string, uint64_t> UnexpectedErrors() const;
  uint64_t ErrorCount() const;
  uint64_t UnexpectedCount() const;
  uint64_t CheckFailures() const {
    return check_failures_.load(std::memory_order_relaxed);
  }
  // "RPC: CODE: message" of the first unexpected errors and check failures.
  std::vector<std::string> Messages() const;

  static constexpr int kKeptMessages = 10;
  static constexpr int kCodes = 17;  // absl::StatusCode 0..16

 private:
  static constexpr int kRpcs = static_cast<int>(Rpc::kCount);

  void Keep(std::string message);

  std::array<std::atomic<uint64_t>, kRpcs> calls_{};
  std::array<std::atomic<uint64_t>, kCodes> errors_{};
  std::array<std::atomic<uint64_t>, kCodes> unexpected_{};
  std::atomic<uint64_t> check_failures_{0};
  mutable absl::Mutex mu_;
  std::vector<std::string> messages_ ABSL_GUARDED_BY(mu_);
};

// Figures of resident-memory samples in a time window.
struct RssSummary {
  int samples = 0;
  double first_mib = 0;  // the window's first sample
  double last_mib = 0;
  double min_mib = 0;
  double max_mib = 0;
  // Least-squares slope of MiB over minutes; nullopt with < 2 samples or
  // all at one time.
  std::optional<double> slope_mib_per_min;
};

// Samples of the master's resident memory: (seconds since the run
// started, MiB). Thread-compatible.
class RssSeries {
 public:
  void Add(double seconds, double mib) { samples_.push_back({seconds, mib}); }
  bool empty() const { return samples_.empty(); }

  // The samples with from_seconds <= t <= to_seconds; samples == 0 when
  // none is.
  RssSummary Summarize(double from_seconds, double to_seconds) const;

 private:
  struct Sample {
    double seconds;
    double mib;
  };
  std::vector<Sample> samples_;
};

}  // namespace soak
}  // namespace mpilearn

#endif  // MPILEARN_TOOLS_SOAK_SOAK_STATS_H_
