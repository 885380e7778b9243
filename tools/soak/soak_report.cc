#include "tools/soak/soak_report.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "tools/cli/json_text.h"

namespace mpilearn {
namespace soak {
namespace {

using tools::JsonQuoted;

std::string JsonCounts(const std::map<std::string, uint64_t>& counts) {
  std::vector<std::string> parts;
  for (const auto& [key, n] : counts)
    parts.push_back(absl::StrCat(JsonQuoted(key), ": ", n));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

}  // namespace

std::string Num(std::optional<double> value, int digits) {
  if (!value.has_value() || !std::isfinite(*value)) return "null";
  return absl::StrFormat("%.*f", digits, *value);
}

void PrintJson(const Report& r, const RpcStats& stats) {
  std::map<std::string, uint64_t> rpcs;
  for (const auto& [rpc, n] : r.rpcs) rpcs[std::string(RpcName(rpc))] = n;
  std::vector<std::string> messages;
  for (const std::string& m : stats.Messages())
    messages.push_back(JsonQuoted(m));
  std::vector<std::string> failures;
  for (const std::string& f : r.failures) failures.push_back(JsonQuoted(f));
  const std::string null = "null";
  auto when = [&](bool ran, const std::string& value) {
    return ran ? value : null;
  };
  std::printf(
      "{\"groups\": %s, \"groups_per_job\": %s, \"seconds\": %s, "
      "\"rpcs_total\": %s, \"rpcs_per_second\": %s, \"rpcs\": %s, "
      "\"jobs_completed\": %s, \"master_cpu_seconds\": %s, "
      "\"master_cpu_us_per_rpc\": %s, \"errors\": %s, \"unexpected_errors\": "
      "%s, "
      "\"check_failures\": %llu, \"rss_mib_start\": %s, \"rss_mib_warm\": %s, "
      "\"rss_mib_end\": %s, \"rss_mib_max\": %s, \"rss_mib_min\": %s, "
      "\"rss_samples\": %d, \"rss_slope_mib_per_min\": %s, "
      "\"churn_jobs\": %s, \"churn_seconds\": %s, \"churn_rpcs_total\": %s, "
      "\"churn_rss_start_mib\": %s, \"churn_rss_end_mib\": %s, "
      "\"churn_rss_peak_mib\": %s, \"churn_rss_growth_mib\": %s, "
      "\"churn_rss_warm_mib\": %s, \"churn_rss_growth_after_warmup_mib\": %s, "
      "\"state_jobs_left\": %s, "
      "\"messages\": [%s], \"failures\": [%s], \"pass\": %s}\n",
      when(r.groups_ran, absl::StrCat(r.groups)).c_str(),
      when(r.groups_ran, absl::StrCat(r.groups_per_job)).c_str(),
      when(r.groups_ran, Num(r.groups_seconds)).c_str(),
      when(r.groups_ran, absl::StrCat(r.rpcs_total)).c_str(),
      when(r.groups_ran, Num(r.rpcs_per_second)).c_str(),
      when(r.groups_ran, JsonCounts(rpcs)).c_str(),
      when(r.groups_ran, absl::StrCat(r.jobs_completed)).c_str(),
      Num(r.master_cpu_seconds).c_str(),
      Num(r.master_cpu_us_per_rpc, 0).c_str(),
      JsonCounts(stats.Errors()).c_str(),
      JsonCounts(stats.UnexpectedErrors()).c_str(),
      static_cast<unsigned long long>(stats.CheckFailures()),
      Num(r.rss_start).c_str(), Num(r.rss_warm).c_str(), Num(r.rss_end).c_str(),
      Num(r.rss_max).c_str(), Num(r.rss_min).c_str(), r.rss_samples,
      Num(r.slope, 2).c_str(),
      when(r.churn_ran, absl::StrCat(r.churn_jobs)).c_str(),
      when(r.churn_ran, Num(r.churn_seconds)).c_str(),
      when(r.churn_ran, absl::StrCat(r.churn_rpcs)).c_str(),
      Num(r.churn_start).c_str(), Num(r.churn_end).c_str(),
      Num(r.churn_peak).c_str(),
      Num(r.churn_end.has_value() && r.churn_start.has_value()
              ? std::optional<double>(*r.churn_end - *r.churn_start)
              : std::nullopt)
          .c_str(),
      Num(r.churn_warm).c_str(),
      Num(r.churn_end.has_value() && r.churn_warm.has_value()
              ? std::optional<double>(*r.churn_end - *r.churn_warm)
              : std::nullopt)
          .c_str(),
      r.state_jobs_left.has_value() ? absl::StrCat(*r.state_jobs_left).c_str()
                                    : "null",
      absl::StrJoin(messages, ", ").c_str(),
      absl::StrJoin(failures, ", ").c_str(), r.pass() ? "true" : "false");
}

void PrintHuman(const Report& r, const RpcStats& stats) {
  if (r.groups_ran) {
    std::printf(
        "groups: %d groups (%d per job) for %.1f s: %llu RPCs, %.1f/s; "
        "%llu jobs completed and checked\n",
        r.groups, r.groups_per_job, r.groups_seconds,
        static_cast<unsigned long long>(r.rpcs_total), r.rpcs_per_second,
        static_cast<unsigned long long>(r.jobs_completed));
    std::vector<std::string> parts;
    for (const auto& [rpc, n] : r.rpcs)
      parts.push_back(absl::StrCat(RpcName(rpc), " ", n));
    std::printf("  by call: %s\n", absl::StrJoin(parts, ", ").c_str());
    std::printf("  master CPU: %s s, %s us per RPC\n",
                Num(r.master_cpu_seconds).c_str(),
                Num(r.master_cpu_us_per_rpc, 0).c_str());
    std::printf(
        "  master RSS MiB: start %s, after warm-up %s, end %s, "
        "min %s, max %s (%d samples after warm-up); slope %s MiB/min\n",
        Num(r.rss_start).c_str(), Num(r.rss_warm).c_str(),
        Num(r.rss_end).c_str(), Num(r.rss_min).c_str(), Num(r.rss_max).c_str(),
        r.rss_samples, Num(r.slope, 2).c_str());
  }
  if (r.churn_ran) {
    std::printf(
        "churn: %llu jobs in %.1f s (%llu RPCs); master RSS MiB: "
        "start %s, after a quarter of the jobs %s, peak %s, end %s\n",
        static_cast<unsigned long long>(r.churn_jobs), r.churn_seconds,
        static_cast<unsigned long long>(r.churn_rpcs),
        Num(r.churn_start).c_str(), Num(r.churn_warm).c_str(),
        Num(r.churn_peak).c_str(), Num(r.churn_end).c_str());
  }
  std::vector<std::string> errors;
  for (const auto& [code, n] : stats.Errors())
    errors.push_back(absl::StrCat(code, " ", n));
  std::vector<std::string> unexpected;
  for (const auto& [code, n] : stats.UnexpectedErrors()) {
    unexpected.push_back(absl::StrCat(code, " ", n));
  }
  std::printf(
      "errors: %s; unexpected: %s; failed checks: %llu\n",
      errors.empty() ? "none" : absl::StrJoin(errors, ", ").c_str(),
      unexpected.empty() ? "none" : absl::StrJoin(unexpected, ", ").c_str(),
      static_cast<unsigned long long>(stats.CheckFailures()));
  for (const std::string& m : stats.Messages())
    std::printf("  %s\n", m.c_str());
  for (const std::string& f : r.failures) std::printf("FAIL: %s\n", f.c_str());
  std::printf("%s\n", r.pass() ? "PASS" : "FAIL");
}

}  // namespace soak
}  // namespace mpilearn
