// A soak run's figures (tools/soak/soak.cc) and their two renderings: one JSON
// object, or lines for people.
#ifndef MPILEARN_TOOLS_SOAK_SOAK_REPORT_H_
#define MPILEARN_TOOLS_SOAK_SOAK_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/soak/soak_stats.h"

namespace mpilearn {
namespace soak {

// What the run measured; optional fields are absent when not measured.
struct Report {
  bool groups_ran = false;
  int groups = 0;
  int groups_per_job = 0;
  double groups_seconds = 0;
  uint64_t rpcs_total = 0;
  double rpcs_per_second = 0;
  uint64_t jobs_completed = 0;
  // The master's CPU time over the groups phase, and per RPC.
  std::optional<double> master_cpu_seconds, master_cpu_us_per_rpc;
  std::map<Rpc, uint64_t> rpcs;
  std::optional<double> rss_start, rss_warm, rss_end, rss_max, rss_min, slope;
  int rss_samples = 0;
  bool churn_ran = false;
  uint64_t churn_jobs = 0;
  double churn_seconds = 0;
  uint64_t churn_rpcs = 0;
  std::optional<double> churn_start, churn_end, churn_peak;
  // The first sample once a quarter of the churn jobs were done.
  std::optional<double> churn_warm;
  // Job directories left in the started master's state directory after
  // every job was deleted; nullopt when not checked.
  std::optional<int> state_jobs_left;
  std::vector<std::string> failures;
  bool pass() const { return failures.empty(); }
};

// "12.3" with `digits` decimals, or "null" when absent or not finite.
std::string Num(std::optional<double> value, int digits = 1);

// Prints exactly one JSON object (one line) on stdout: the report's
// figures and `stats`' error counts and kept messages.
void PrintJson(const Report& report, const RpcStats& stats);

// Prints the report for people on stdout, ending in PASS or FAIL.
void PrintHuman(const Report& report, const RpcStats& stats);

}  // namespace soak
}  // namespace mpilearn

#endif  // MPILEARN_TOOLS_SOAK_SOAK_REPORT_H_
