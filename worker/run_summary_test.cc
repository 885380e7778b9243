#include "worker/run_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

v1::RegisterGroupResponse Registration(const std::string& algorithm, int epochs) {
  v1::RegisterGroupResponse registration;
  registration.set_job_id("job-7");
  registration.set_group_id("g-3");
  registration.mutable_spec()->set_algorithm(algorithm);
  registration.mutable_spec()->set_epochs(epochs);
  return registration;
}

TrainResult SampleResult() {
  TrainResult result;
  result.units = 42;
  result.samples = 3'000'000'123;  // beyond 32 bits
  result.stale_dropped = 5;
  result.seconds = 61.23456789;
  result.train_seconds = 50.5;
  result.validation_seconds = 2.25;
  result.samples_per_second = 9650.12345;
  result.samples_per_second_per_rank = 4825.061725;
  result.times.data = 1.0;
  result.times.compute = 6.0;
  result.times.master = 2.0;
  result.times.mpi = 3.0;
  result.test.accuracy = 0.81234;
  result.test.samples = 10000;
  return result;
}

// The summary as the worker wrote it before it was a proto (a printf), the
// reference for what the consumers read.
std::string LegacySummary(const v1::RegisterGroupResponse& registration, int ranks,
                          bool local, const TrainResult& result) {
  const double total = result.times.total();
  auto share = [&](double s) { return total > 0 ? s / total : 0.0; };
  const double epochs =
      std::max(1.0, static_cast<double>(registration.spec().epochs()));
  char buffer[2048];
  std::snprintf(
      buffer, sizeof(buffer),
      "{\"mode\": \"%s\", \"ranks\": %d, \"job_id\": \"%s\", "
      "\"samples_per_s\": %.3f, \"samples_per_s_per_rank\": %.3f, "
      "\"epoch_s\": %.4f, \"train_s\": %.4f, \"validation_s\": %.4f, "
      "\"total_s\": %.4f, \"units\": %llu, "
      "\"samples\": %lld, \"stale_dropped\": %llu, "
      "\"share\": {\"data\": %.4f, \"compute\": %.4f, "
      "\"master\": %.4f, \"mpi\": %.4f}, \"test_accuracy\": %.4f}",
      local ? "local" : registration.spec().algorithm().c_str(), ranks,
      registration.job_id().c_str(), result.samples_per_second,
      result.samples_per_second_per_rank, result.train_seconds / epochs,
      result.train_seconds, result.validation_seconds, result.seconds,
      static_cast<unsigned long long>(result.units),
      static_cast<long long>(result.samples),
      static_cast<unsigned long long>(result.stale_dropped), share(result.times.data),
      share(result.times.compute), share(result.times.master), share(result.times.mpi),
      result.test.accuracy);
  return buffer;
}

// tools/bench/bench_lib.sh's bench_field: `"KEY": NUMBER` off one line; NaN when
// the key is not followed by a number.
double BenchField(const std::string& json, const std::string& key) {
  const std::regex pattern("\"" + key + "\": ([0-9.eE+-]+)");
  std::smatch match;
  if (!std::regex_search(json, match, pattern)) return std::nan("");
  return std::strtod(match[1].str().c_str(), nullptr);
}

const std::vector<std::string> kNumberKeys = {
    "ranks",   "samples_per_s", "samples_per_s_per_rank", "epoch_s", "train_s",
    "validation_s", "total_s", "units", "samples", "stale_dropped",
    "data",    "compute",       "master", "mpi", "test_accuracy"};

TEST(RunSummaryTest, JsonLineIsTheFormatConsumersRead) {
  const v1::RunSummary summary =
      BuildRunSummary(Registration("sync", 2), 2, /*local=*/false, SampleResult());
  absl::StatusOr<std::string> json = RunSummaryJson(summary);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json,
            "{\"mode\": \"sync\", \"ranks\": 2, \"job_id\": \"job-7\", "
            "\"samples_per_s\": 9650.123, \"samples_per_s_per_rank\": 4825.062, "
            "\"epoch_s\": 25.25, \"train_s\": 50.5, \"validation_s\": 2.25, "
            "\"total_s\": 61.2346, \"units\": 42, \"samples\": 3000000123, "
            "\"stale_dropped\": 5, \"share\": {\"data\": 0.0833, \"compute\": 0.5, "
            "\"master\": 0.1667, \"mpi\": 0.25}, \"test_accuracy\": 0.8123}");
}

// Every number the consumers read has the value the printf wrote, for a run
// with figures and for an empty one (every key still present).
TEST(RunSummaryTest, NumbersMatchTheLegacySummary) {
  struct Case {
    v1::RegisterGroupResponse registration;
    int ranks;
    bool local;
    TrainResult result;
  };
  const std::vector<Case> cases = {
      {Registration("sync", 2), 2, false, SampleResult()},
      {Registration("downpour", 0), 4, false, SampleResult()},
      {Registration("sync", 3), 1, true, TrainResult{}},
  };
  for (const Case& c : cases) {
    const std::string legacy = LegacySummary(c.registration, c.ranks, c.local, c.result);
    absl::StatusOr<std::string> json = RunSummaryJson(
        BuildRunSummary(c.registration, c.ranks, c.local, c.result));
    ASSERT_TRUE(json.ok()) << json.status();
    SCOPED_TRACE(*json);
    EXPECT_EQ(json->find('\n'), std::string::npos);
    for (const std::string& key : kNumberKeys) {
      const double expected = BenchField(legacy, key);
      ASSERT_FALSE(std::isnan(expected)) << key << " in " << legacy;
      EXPECT_DOUBLE_EQ(BenchField(*json, key), expected) << key;
    }
    // The mode the way tools/bench/bench_scaling.sh's mode_of reads it.
    const std::regex mode("\"mode\": \"([a-z]+)\"");
    std::smatch mine, theirs;
    ASSERT_TRUE(std::regex_search(*json, mine, mode));
    ASSERT_TRUE(std::regex_search(legacy, theirs, mode));
    EXPECT_EQ(mine[1].str(), theirs[1].str());
    EXPECT_EQ(mine[1].str(), c.local ? "local" : c.registration.spec().algorithm());
  }
}

TEST(RunSummaryTest, JsonParsesBackToTheSameSummary) {
  const v1::RunSummary summary =
      BuildRunSummary(Registration("easgd", 5), 3, false, SampleResult());
  absl::StatusOr<std::string> json = RunSummaryJson(summary);
  ASSERT_TRUE(json.ok()) << json.status();
  v1::RunSummary parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, summary))
      << parsed.DebugString();
}

TEST(RunSummaryTest, WritesOneLineToTheFile) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/summary.json";
  const v1::RunSummary summary =
      BuildRunSummary(Registration("gem", 1), 1, false, SampleResult());
  ASSERT_TRUE(WriteRunSummary(path, summary).ok());
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text, *RunSummaryJson(summary) + "\n");

  const absl::Status unwritable = WriteRunSummary(path + "/no/such/dir", summary);
  EXPECT_FALSE(unwritable.ok());
  EXPECT_NE(unwritable.message().find(path), absl::string_view::npos);
}

}  // namespace
}  // namespace mpilearn::worker
