#include "tools/soak/soak_stats.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mpilearn {
namespace soak {

absl::string_view RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kSubmitJob:
      return "SubmitJob";
    case Rpc::kRegisterGroup:
      return "RegisterGroup";
    case Rpc::kInitWeights:
      return "InitWeights";
    case Rpc::kNextDataUnit:
      return "NextDataUnit";
    case Rpc::kPushGradient:
      return "PushGradient";
    case Rpc::kPullWeights:
      return "PullWeights";
    case Rpc::kReportEpoch:
      return "ReportEpoch";
    case Rpc::kHeartbeat:
      return "Heartbeat";
    case Rpc::kLeave:
      return "Leave";
    case Rpc::kGetJobStatus:
      return "GetJobStatus";
    case Rpc::kCancelJob:
      return "CancelJob";
    case Rpc::kDeleteJob:
      return "DeleteJob";
    case Rpc::kCount:
      break;
  }
  return "?";
}

void RpcStats::Record(Rpc rpc, const absl::Status& status, bool expected) {
  calls_[static_cast<int>(rpc)].fetch_add(1, std::memory_order_relaxed);
  if (status.ok()) return;
  const int code = static_cast<int>(status.code());
  const int slot = code >= 0 && code < kCodes ? code : kCodes - 1;
  errors_[slot].fetch_add(1, std::memory_order_relaxed);
  if (expected) return;
  unexpected_[slot].fetch_add(1, std::memory_order_relaxed);
  Keep(absl::StrCat(RpcName(rpc), ": ", status.ToString()));
}

void RpcStats::CheckFailed(const std::string& message) {
  check_failures_.fetch_add(1, std::memory_order_relaxed);
  Keep(absl::StrCat("check failed: ", message));
}

void RpcStats::Keep(std::string message) {
  absl::MutexLock lock(&mu_);
  if (messages_.size() < kKeptMessages) messages_.push_back(std::move(message));
}

uint64_t RpcStats::Total() const {
  uint64_t total = 0;
  for (const auto& calls : calls_)
    total += calls.load(std::memory_order_relaxed);
  return total;
}

namespace {

using CodeCounts = std::array<std::atomic<uint64_t>, RpcStats::kCodes>;

std::map<std::string, uint64_t> ByCode(const CodeCounts& counts) {
  std::map<std::string, uint64_t> out;
  for (int code = 0; code < RpcStats::kCodes; ++code) {
    const uint64_t n = counts[code].load(std::memory_order_relaxed);
    if (n == 0) continue;
    out[absl::StatusCodeToString(static_cast<absl::StatusCode>(code))] = n;
  }
  return out;
}

uint64_t Sum(const CodeCounts& counts) {
  uint64_t total = 0;
  for (const auto& n : counts) total += n.load(std::memory_order_relaxed);
  return total;
}

}  // namespace

std::map<std::string, uint64_t> RpcStats::Errors() const {
  return ByCode(errors_);
}
std::map<std::string, uint64_t> RpcStats::UnexpectedErrors() const {
  return ByCode(unexpected_);
}
uint64_t RpcStats::ErrorCount() const { return Sum(errors_); }
uint64_t RpcStats::UnexpectedCount() const { return Sum(unexpected_); }

std::vector<std::string> RpcStats::Messages() const {
  absl::MutexLock lock(&mu_);
  return messages_;
}

RssSummary RssSeries::Summarize(double from_seconds, double to_seconds) const {
  RssSummary summary;
  double sum_t = 0, sum_y = 0;
  std::vector<const Sample*> window;
  for (const Sample& s : samples_) {
    if (s.seconds < from_seconds || s.seconds > to_seconds) continue;
    window.push_back(&s);
  }
  if (window.empty()) return summary;
  summary.samples = static_cast<int>(window.size());
  summary.first_mib = window.front()->mib;
  summary.last_mib = window.back()->mib;
  summary.min_mib = summary.max_mib = window.front()->mib;
  for (const Sample* s : window) {
    summary.min_mib = std::min(summary.min_mib, s->mib);
    summary.max_mib = std::max(summary.max_mib, s->mib);
    sum_t += s->seconds / 60.0;
    sum_y += s->mib;
  }
  // Least squares on centred values: slope = cov(t, y) / var(t).
  const double n = static_cast<double>(window.size());
  const double mean_t = sum_t / n, mean_y = sum_y / n;
  double cov = 0, var = 0;
  for (const Sample* s : window) {
    const double dt = s->seconds / 60.0 - mean_t;
    cov += dt * (s->mib - mean_y);
    var += dt * dt;
  }
  if (window.size() >= 2 && var > 0) summary.slope_mib_per_min = cov / var;
  return summary;
}

}  // namespace soak
}  // namespace mpilearn
