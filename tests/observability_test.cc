// End to end observability, with the real binaries started as users start
// them.
//
// PrometheusScrapesTrainingRun: a real Prometheus server (Debian's
// `prometheus`, on a loopback port, with a generated config) scrapes the
// master's metrics endpoint every second while a 2-rank group trains; the
// test then asks Prometheus' HTTP API for the job's series and finds the
// samples trained and the validations never decreasing and ending at the
// master's own figures, the group's step-time breakdown and the RPC
// counts present, and the endpoint's text accepted by `promtool check
// metrics` (Prometheus' own exposition-format parser and linter).
//
// TracesAndProgress: a 2-rank sync group and the master run with --trace;
// both files parse as JSON (protobuf's parser, not the writer's) and hold the
// expected events for both ranks and for the master, and the leader printed
// progress lines with the job's figures.
//
// MetricsEndpointNeedsItsToken: a master with --metrics_token_file, its
// endpoint on every interface, answers a scrape without the token (none, a
// wrong one, one sent another way than as the Basic auth password) with
// 401 and no metrics, and one with it with 200 and the metrics; a real
// Prometheus with basic_auth password_file scrapes it (up 1) while a scrape
// job with a wrong password file is down (up 0).
//
//
// None of the tests depends on how fast the machine is: they wait for conditions
// (with generous deadlines), never for a time, and assert no count of
// scrapes, lines or events per unit of time.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/client/master_client.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/http_client.h"
#include "tests/prometheus_server.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

constexpr char kPromtool[] = "/usr/bin/promtool";

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// Values of `points`, in time order, with repeats collapsed.
std::vector<double> DistinctValues(const std::vector<std::pair<double, double>>& points) {
  std::vector<double> values;
  for (const auto& point : points) {
    if (values.empty() || values.back() != point.second) values.push_back(point.second);
  }
  return values;
}

bool NonDecreasing(const std::vector<double>& values) {
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] < values[i - 1]) return false;
  }
  return true;
}

// Runs `promtool check metrics` on `text`; returns its exit code and output.
std::pair<int, std::string> PromtoolCheckMetrics(const std::string& dir,
                                                 const std::string& text) {
  const std::string input = dir + "/scrape.txt";
  const std::string output = dir + "/promtool.out";
  WriteFileOrDie(input, text);
  const int rc = std::system(absl::StrCat(kPromtool, " check metrics < ", input,
                                          " > ", output, " 2>&1")
                                 .c_str());
  return {WEXITSTATUS(rc), ReadFileOrDie(output)};
}

TEST(ObservabilityTest, PrometheusScrapesTrainingRun) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << "this test needs a real Prometheus server: install Debian's "
         "`prometheus` package (tools/install_deps.sh does)";
  const std::string dir = NewTempDir("observability_prometheus");
  const absl::Time test_start = absl::Now() - absl::Seconds(2);
  absl::StatusOr<ScrapedMaster> scraped = ScrapedMaster::Start(dir);
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  MasterProcess& master = *scraped->master;
  PrometheusServer& prometheus = *scraped->prometheus;
  auto client = MasterClient::Connect(master.address());
  ASSERT_TRUE(client.ok()) << client.status();

  v1::JobSpec spec = FashionMnistSubset("downpour", 12000, 3);
  spec.set_data_unit_size(1000);
  auto job_id = (*client)->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(2, master.address(),
                              {"--threads=1", "--slowdown_ms_per_batch=10"},
                              dir + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();

  // While it trains, the endpoint's text is valid exposition format with
  // the job's series in it.
  ASSERT_TRUE(WaitForStatus(**client, *job_id, absl::Seconds(120),
                            [](const v1::JobStatus& s) {
                              return s.samples_trained() > 0;
                            }).ok());
  absl::StatusOr<HttpResponse> scrape = HttpGet(scraped->metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  ASSERT_EQ(scrape->status, 200);
  EXPECT_TRUE(absl::StrContains(
      scrape->body, absl::StrCat("mpilearn_job_samples_trained_total{job_id=\"",
                                 *job_id, "\"}")))
      << scrape->body.substr(0, 3000);
  if (access(kPromtool, X_OK) == 0) {
    auto [rc, out] = PromtoolCheckMetrics(dir, scrape->body);
    EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << out;
  }

  auto done = WaitForStatus(**client, *job_id, absl::Seconds(240),
                            [](const v1::JobStatus& s) {
                              return s.state() == v1::JOB_STATE_COMPLETED &&
                                     s.has_test_accuracy();
                            });
  ASSERT_TRUE(done.ok()) << done.status() << "\n" << (*workers)->Log();
  ASSERT_EQ((*workers)->Wait(absl::Seconds(60)), 0) << (*workers)->Log();
  // Wait for a scrape that began after the run ended: it sees the final
  // figures, however few scrapes fell inside the run.
  const absl::Status after_run =
      prometheus.WaitForScrapeAfter(absl::Now(), absl::Seconds(60));
  ASSERT_TRUE(after_run.ok()) << after_run;

  absl::StatusOr<double> up = prometheus.Instant("up{job=\"mpilearn\"}");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(*up, 1.0) << "Prometheus could not scrape the master";

  const std::string job = absl::StrCat("{job_id=\"", *job_id, "\"}");
  auto samples = prometheus.Range("mpilearn_job_samples_trained_total" + job,
                                  test_start);
  ASSERT_TRUE(samples.ok()) << samples.status();
  // How many scrapes fell inside the run depends on how fast it trained, so
  // only the order of the series and its final value are checked. The range
  // is sampled on a 1 s grid that may end before the last scrape: the final
  // value comes from an instant query, which sees the scrape waited for.
  const std::vector<double> sample_values = DistinctValues(*samples);
  EXPECT_TRUE(NonDecreasing(sample_values)) << absl::StrJoin(sample_values, ", ");
  auto final_samples = prometheus.Instant("mpilearn_job_samples_trained_total" + job);
  ASSERT_TRUE(final_samples.ok()) << final_samples.status();
  EXPECT_EQ(*final_samples, static_cast<double>(done->samples_trained()));
  EXPECT_LE(sample_values.back(), *final_samples);
  EXPECT_EQ(done->samples_trained(), 3u * 10000u);

  auto validations = prometheus.Range("mpilearn_job_validations_total" + job,
                                      test_start);
  ASSERT_TRUE(validations.ok()) << validations.status();
  const std::vector<double> validation_values = DistinctValues(*validations);
  EXPECT_TRUE(NonDecreasing(validation_values))
      << absl::StrJoin(validation_values, ", ");
  auto final_validations =
      prometheus.Instant("mpilearn_job_validations_total" + job);
  ASSERT_TRUE(final_validations.ok()) << final_validations.status();
  EXPECT_EQ(*final_validations, static_cast<double>(done->validations_size()));
  EXPECT_LE(validation_values.back(), *final_validations);
  auto accuracy = prometheus.Instant("mpilearn_job_validation_accuracy" + job);
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ASSERT_GT(done->validations_size(), 0);
  EXPECT_NEAR(*accuracy, done->validations().rbegin()->val_accuracy(), 1e-9);
  EXPECT_GT(*accuracy, 0.6);

  // The group's own figures arrived through the master while it trained.
  // Its series end with the run, so take the largest value any scrape saw;
  // the run lasts seconds however fast the machine (10 ms per batch, ~470
  // batches per rank), so scrapes every second see the group.
  auto compute = prometheus.Instant(
      absl::StrCat("sum(max_over_time(mpilearn_group_step_seconds_total{job_id=\"",
                   *job_id, "\",phase=\"compute\"}[10m]))"));
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_GT(*compute, 0.0);
  auto pushes = prometheus.Instant(
      "sum(mpilearn_rpc_duration_seconds_count{method=\"PushGradient\",code=\"OK\"})");
  ASSERT_TRUE(pushes.ok()) << pushes.status();
  EXPECT_EQ(*pushes, static_cast<double>(done->updates_applied()));
  auto applies = prometheus.Instant(
      "sum(mpilearn_apply_duration_seconds_count" + job + ")");
  ASSERT_TRUE(applies.ok()) << applies.status();
  EXPECT_EQ(*applies, static_cast<double>(done->updates_applied()));
}

TEST(ObservabilityTest, MetricsEndpointNeedsItsToken) {
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << "this test needs a real Prometheus server: install Debian's "
         "`prometheus` package (tools/install_deps.sh does)";
  const std::string dir = NewTempDir("observability_metrics_token");
  const std::string token = "metrics-token-0123456789abcdef";
  const std::string token_file = dir + "/metrics.token";
  const std::string wrong_file = dir + "/wrong.token";
  WriteFileOrDie(token_file, token + "\n");
  WriteFileOrDie(wrong_file, "not-the-metrics-token-0123456789\n");
  // Every interface: allowed because a token guards it.
  auto master = MasterProcess::Start(
      dir + "/master",
      {"--metrics_listen=0.0.0.0:0", "--metrics_token_file=" + token_file});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<int> port = (*master)->MetricsPort();
  ASSERT_TRUE(port.ok()) << port.status();

  struct Case {
    const char* what;
    HttpHeaders headers;
    int status;
  };
  const std::vector<Case> cases = {
      {"no credentials", {}, 401},
      {"a wrong token", {BasicAuthorization("prometheus", "not-the-token-0123456789")}, 401},
      {"the token with a suffix", {BasicAuthorization("prometheus", token + "x")}, 401},
      {"the token as a user name", {BasicAuthorization(token, "")}, 401},
      {"the token as a bearer token", {{"Authorization", "Bearer " + token}}, 401},
      {"the token", {BasicAuthorization("prometheus", token)}, 200},
      {"the token, any user", {BasicAuthorization("", token)}, 200},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<HttpResponse> scrape = HttpGet(*port, "/metrics", c.headers);
    ASSERT_TRUE(scrape.ok()) << scrape.status();
    EXPECT_EQ(scrape->status, c.status) << scrape->body.substr(0, 500);
    EXPECT_EQ(absl::StrContains(scrape->body, "mpilearn_build_info"),
              c.status == 200)
        << scrape->body.substr(0, 500);
  }

  // A real Prometheus with basic_auth password_file scrapes it; the same
  // target with a wrong password file is down.
  auto prometheus = PrometheusServer::Start(
      dir, {PrometheusServer::ScrapeJob("mpilearn", absl::StrCat("127.0.0.1:", *port),
                                        token_file),
            PrometheusServer::ScrapeJob("wrong_token", absl::StrCat("127.0.0.1:", *port),
                                        wrong_file)});
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::StatusOr<double> up = absl::NotFoundError("not scraped yet");
  absl::StatusOr<double> wrong_up = absl::NotFoundError("not scraped yet");
  while (absl::Now() < deadline) {
    up = (*prometheus)->Instant("up{job=\"mpilearn\"}");
    wrong_up = (*prometheus)->Instant("up{job=\"wrong_token\"}");
    if (up.ok() && wrong_up.ok()) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(wrong_up.ok()) << wrong_up.status();
  EXPECT_EQ(*up, 1.0) << "Prometheus could not scrape with the token";
  EXPECT_EQ(*wrong_up, 0.0) << "a wrong token was accepted";
  // The metrics themselves arrived.
  absl::StatusOr<double> build = (*prometheus)->Instant(
      "mpilearn_build_info{job=\"mpilearn\"}");
  ASSERT_TRUE(build.ok()) << build.status();
  EXPECT_EQ(*build, 1.0);
}

// Event names per pid in a Chrome trace (JSON array format).
absl::StatusOr<std::map<int, std::set<std::string>>> TraceEvents(
    const std::string& path, absl::Time not_before) {
  absl::StatusOr<Value> json = ParseJson(ReadFileOrDie(path));
  if (!json.ok()) return json.status();
  if (!json->has_list_value()) return absl::DataLossError("not a JSON array");
  std::map<int, std::set<std::string>> names;
  for (const Value& event : json->list_value().values()) {
    const std::string phase = Field(event, "ph").string_value();
    if (phase == "M") continue;
    if (phase != "X") return absl::DataLossError("unexpected phase " + phase);
    const double ts = Field(event, "ts").number_value();
    if (ts < absl::ToUnixMicros(not_before) || Field(event, "dur").number_value() < 0) {
      return absl::DataLossError(absl::StrCat("event ", Field(event, "name").string_value(),
                                              " has a bad time"));
    }
    names[static_cast<int>(Field(event, "pid").number_value())].insert(
        Field(event, "name").string_value());
  }
  return names;
}

TEST(ObservabilityTest, TracesAndProgress) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("observability_trace");
  const absl::Time test_start = absl::Now();
  const std::string master_trace = dir + "/master.trace.json";
  const std::string group_trace = dir + "/group.trace.json";
  auto master = MasterProcess::Start(dir + "/master", {"--trace=" + master_trace});
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto job_id = (*client)->SubmitJob(FashionMnistSubset("sync", 6000, 2));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(
      2, (*master)->address(),
      {"--threads=1", "--slowdown_ms_per_batch=3", "--trace=" + group_trace,
       // A line at the first answer 1 ms after the start and at every one
       // after that: a unit takes longer than that to train (3 ms per
       // batch), so at least one line is printed however fast the run.
       "--progress=plain", "--progress_interval_s=0.001"},
      dir + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ((*workers)->Wait(absl::Seconds(240)), 0) << (*workers)->Log();
  auto status = (*client)->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(status->groups_size(), 1);

  // One file for the group, both ranks in it: pid 1000 * group number + rank.
  int group_number = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      absl::StripPrefix(status->groups(0).group_id(), "g-"), &group_number));
  auto group_events = TraceEvents(group_trace, test_start);
  ASSERT_TRUE(group_events.ok()) << group_events.status();
  for (int rank : {0, 1}) {
    const std::set<std::string>& names = (*group_events)[1000 * group_number + rank];
    for (const char* name :
         {"data_load", "forward_backward", "allreduce", "broadcast", "validation"}) {
      EXPECT_TRUE(names.count(name)) << "rank " << rank << " has no " << name;
    }
  }
  for (const char* name : {"push", "next_unit", "test"}) {
    EXPECT_TRUE((*group_events)[1000 * group_number].count(name))
        << "the leader has no " << name;
  }
  EXPECT_EQ(group_events->size(), 2u) << "only the group's two ranks";

  // The master's file is complete once it shut down.
  (*master)->process().Stop();
  auto master_events = TraceEvents(master_trace, test_start);
  ASSERT_TRUE(master_events.ok()) << master_events.status();
  for (const char* name : {"receive", "apply", "send", "next_unit", "pull",
                           "validation_report"}) {
    EXPECT_TRUE((*master_events)[0].count(name)) << "the master has no " << name;
  }

  // Plain progress lines (stdout is not a terminal here), with the figures:
  // "progress: epoch E/2  P%  samples/s=R  loss=L  eta=T". How many lines a
  // run prints depends on its speed; that there is one does not.
  int progress_lines = 0;
  for (absl::string_view line : absl::StrSplit((*workers)->Log(), '\n')) {
    if (!absl::StartsWith(line, "progress: epoch ")) continue;
    ++progress_lines;
    EXPECT_FALSE(absl::StrContains(line, "\r")) << line;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, "  ", absl::SkipEmpty());
    ASSERT_EQ(fields.size(), 5u) << line;
    int epoch = 0;
    EXPECT_TRUE(absl::SimpleAtoi(
        absl::StripSuffix(absl::StripPrefix(fields[0], "progress: epoch "), "/2"),
        &epoch))
        << line;
    EXPECT_TRUE(epoch == 1 || epoch == 2) << line;
    double percent = -1;
    EXPECT_TRUE(absl::SimpleAtod(absl::StripSuffix(fields[1], "%"), &percent))
        << line;
    EXPECT_GE(percent, 0.0) << line;
    EXPECT_LE(percent, 100.0) << line;
    EXPECT_TRUE(absl::StartsWith(fields[2], "samples/s=")) << line;
    EXPECT_TRUE(absl::StartsWith(fields[3], "loss=")) << line;
    EXPECT_TRUE(absl::StartsWith(fields[4], "eta=")) << line;
  }
  EXPECT_GE(progress_lines, 1) << (*workers)->Log();
}

}  // namespace
}  // namespace mpilearn::testing
