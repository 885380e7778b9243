// The Grafana dashboard (deploy/grafana/mpilearn-dashboard.json) proven on
// real data: deploy_files_test only checks that its queries parse; this
// test checks that each one shows something when a real master runs.
//
// A real master, a real Prometheus scraping it every second, and a small
// MPI Opt study (two trials, one at a time) whose first trial a real 2-rank
// `mpirun` group trains while a real validation pool validates its
// snapshots. Once that trial completed (so the study has a best value and
// its second trial is queued, the study still running), the test reads
// every template variable and every panel query from the dashboard's JSON
// (none is written here), fills in the variables as Grafana does when one
// value is selected ($instance: the master's metrics address, $job: the
// trained job, $group: its group, $study: the study; $__rate_interval: 1m,
// Grafana's value for a data source left at the default 15 s scrape
// interval, and $__interval the same) and asks Prometheus' HTTP API:
//   - each variable's label_values(SELECTOR, LABEL) (LABEL's values among
//     the series SELECTOR matches over the test's time range, Prometheus'
//     label values API) holds the value;
//   - each panel query (a range query over the test's time range, or an
//     instant query at its end where the target is "instant") returns a
//     series with at least one finite point: what Grafana would draw.
// A failure names the panel, the query's refId and the filled-in PromQL.
//
// Nothing is exempt. Figures the master exports for every job from its
// start (stale updates rejected, units re-queued, snapshots skipped: 0;
// shards: 0 for a job the master holds itself) are legitimately there, and
// the RPC error panel gets its error from a status query for a job that
// does not exist (as a user's typo would; the run has no other error).
//
// No assertion depends on how fast the machine is: the test waits for
// conditions with generous deadlines and checks presence, never counts or
// durations. The group runs 40 ms per batch so that it stays connected over
// several 1 s scrapes (125 batches per rank: over 5 s) however fast the
// machine, as the rates of its series need two scrapes.
#include <unistd.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/client/master_client.h"
#include "google/protobuf/struct.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/study.grpc.pb.h"
#include "tests/prometheus_server.h"
#include "tests/study_helpers.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Value;

constexpr char kDashboard[] = "deploy/grafana/mpilearn-dashboard.json";

// One panel target.
struct PanelQuery {
  std::string panel;  // its title, as written (may hold variables)
  std::string ref_id;
  std::string expr;
  bool instant = false;
};

// One template variable.
struct Variable {
  std::string name;
  std::string type;
  std::string query;  // a query variable's PromQL (label_values(...))
};

// The targets of `panels` and of the panels nested in their rows.
void CollectQueries(const ListValue& panels, std::vector<PanelQuery>& out) {
  for (const Value& panel : panels.values()) {
    for (const Value& target : Field(panel, "targets").list_value().values()) {
      PanelQuery query;
      query.panel = Field(panel, "title").string_value();
      query.ref_id = Field(target, "refId").string_value();
      query.expr = Field(target, "expr").string_value();
      query.instant = Field(target, "instant").bool_value();
      out.push_back(query);
    }
    CollectQueries(Field(panel, "panels").list_value(), out);
  }
}

std::vector<Variable> Variables(const Value& dashboard) {
  std::vector<Variable> variables;
  for (const Value& v : Field(Field(dashboard, "templating"), "list").list_value().values()) {
    Variable variable;
    variable.name = Field(v, "name").string_value();
    variable.type = Field(v, "type").string_value();
    const Value& query = Field(v, "query");
    variable.query = query.has_struct_value() ? Field(query, "query").string_value()
                                              : query.string_value();
    variables.push_back(variable);
  }
  return variables;
}

// `text` with Grafana's variables ($name, ${name}, ${name:format}) replaced
// by `values`; an error names a variable with no value.
absl::StatusOr<std::string> Interpolate(const std::string& text,
                                        const std::map<std::string, std::string>& values) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '$') {
      out += text[i++];
      continue;
    }
    std::string name;
    size_t next = i + 1;
    if (next < text.size() && text[next] == '{') {
      const size_t close = text.find('}', next);
      if (close == std::string::npos) return absl::InvalidArgumentError("unclosed ${ in " + text);
      name = text.substr(next + 1, close - next - 1);
      name = name.substr(0, name.find(':'));  // ${name:format}
      next = close + 1;
    } else {
      while (next < text.size() &&
             (absl::ascii_isalnum(text[next]) || text[next] == '_')) {
        name += text[next++];
      }
    }
    auto value = values.find(name);
    if (value == values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the test has no value for the variable $", name, " in ", text));
    }
    out += value->second;
    i = next;
  }
  return out;
}

// True when `text` is a sample value Grafana draws (not NaN or +-Inf).
bool Finite(const Value& text) {
  double value = 0;
  return absl::SimpleAtod(text.string_value(), &value) && std::isfinite(value);
}

// OK when `promql` returns a series with a finite point: over [start, end]
// (1 s steps) or, for an instant target, at `end`.
absl::Status CheckQuery(PrometheusServer& prometheus, const std::string& promql,
                        bool instant, absl::Time start, absl::Time end) {
  const std::string end_s = absl::StrCat(absl::ToUnixSeconds(end));
  absl::StatusOr<Value> data =
      instant ? prometheus.Api("query", {{"query", promql}, {"time", end_s}})
              : prometheus.Api("query_range",
                               {{"query", promql},
                                {"start", absl::StrCat(absl::ToUnixSeconds(start))},
                                {"end", end_s},
                                {"step", "1"}});
  if (!data.ok()) return data.status();
  const ListValue& series = Field(*data, "result").list_value();
  if (series.values_size() == 0) return absl::NotFoundError("no series");
  for (const Value& one : series.values()) {
    if (instant) {
      const ListValue& point = Field(one, "value").list_value();
      if (point.values_size() == 2 && Finite(point.values(1))) return absl::OkStatus();
      continue;
    }
    for (const Value& point : Field(one, "values").list_value().values()) {
      if (point.list_value().values_size() == 2 && Finite(point.list_value().values(1))) {
        return absl::OkStatus();
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat(series.values_size(), " series, but no finite point (NaN or Inf only)"));
}

// OK when the variable's label_values(SELECTOR, LABEL) over [start, end]
// holds `expected`.
absl::Status CheckVariable(PrometheusServer& prometheus, const std::string& query,
                           const std::string& expected, absl::Time start, absl::Time end) {
  absl::string_view inside = query;
  if (!absl::ConsumePrefix(&inside, "label_values(") || !absl::ConsumeSuffix(&inside, ")")) {
    return absl::InvalidArgumentError("not label_values(...)");
  }
  std::map<std::string, std::string> params = {
      {"start", absl::StrCat(absl::ToUnixSeconds(start))},
      {"end", absl::StrCat(absl::ToUnixSeconds(end))}};
  std::string label(absl::StripAsciiWhitespace(inside));
  const size_t comma = inside.rfind(',');
  if (comma != absl::string_view::npos) {
    label = std::string(absl::StripAsciiWhitespace(inside.substr(comma + 1)));
    params["match[]"] = std::string(absl::StripAsciiWhitespace(inside.substr(0, comma)));
  }
  absl::StatusOr<Value> data = prometheus.Api("label/" + label + "/values", params);
  if (!data.ok()) return data.status();
  std::vector<std::string> values;
  for (const Value& value : data->list_value().values()) {
    if (value.string_value() == expected) return absl::OkStatus();
    values.push_back(value.string_value());
  }
  return absl::NotFoundError(absl::StrCat("values [", absl::StrJoin(values, ", "),
                                          "] lack ", expected));
}

// What Grafana would show wrong, one line each: a variable whose values
// lack the one expected (values[name]), a panel query that draws nothing.
// Over [start, now].
std::vector<std::string> CheckDashboard(PrometheusServer& prometheus,
                                        const std::vector<Variable>& variables,
                                        const std::vector<PanelQuery>& queries,
                                        const std::map<std::string, std::string>& values,
                                        absl::Time start) {
  std::vector<std::string> failures;
  const absl::Time end = absl::Now();
  for (const Variable& variable : variables) {
    if (variable.type == "datasource") continue;  // Grafana's own choice
    const std::string what =
        absl::StrCat("variable $", variable.name, " (", variable.query, ")");
    auto expected = values.find(variable.name);
    if (variable.type != "query" || expected == values.end()) {
      failures.push_back(
          absl::StrCat(what, ": of type ", variable.type, ", which the test cannot fill in"));
      continue;
    }
    absl::StatusOr<std::string> query = Interpolate(variable.query, values);
    const absl::Status status =
        query.ok() ? CheckVariable(prometheus, *query, expected->second, start, end)
                   : query.status();
    if (!status.ok()) failures.push_back(absl::StrCat(what, ": ", status.ToString()));
  }
  for (const PanelQuery& query : queries) {
    absl::StatusOr<std::string> promql = Interpolate(query.expr, values);
    const absl::Status status =
        promql.ok() ? CheckQuery(prometheus, *promql, query.instant, start, end)
                    : promql.status();
    if (!status.ok()) {
      failures.push_back(absl::StrCat("panel \"", query.panel, "\" query ", query.ref_id, " (",
                                      promql.ok() ? *promql : query.expr,
                                      "): ", status.ToString()));
    }
  }
  return failures;
}

// Two trials, one at a time, each a short Fashion-MNIST downpour job with
// snapshots for a validation pool.
v1::StudySpec SmallStudy() {
  v1::JobSpec base = FashionMnistSubset("downpour", 6000, 2);  // 4,000 train + 2,000 validation
  base.set_data_unit_size(500);
  base.mutable_snapshots()->set_every_updates(20);
  v1::StudySpec spec = LearningRateStudy(base, /*trials=*/2, /*parallelism=*/1);
  spec.set_name("dashboard");
  return spec;
}

TEST(DashboardTest, EveryPanelAndVariableShowsARealMastersData) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << "this test needs a real Prometheus server: install Debian's "
         "`prometheus` package (tools/install_deps.sh does)";
  absl::StatusOr<Value> dashboard = ParseJson(ReadFileOrDie(Runfile(kDashboard)));
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  std::vector<PanelQuery> queries;
  CollectQueries(Field(*dashboard, "panels").list_value(), queries);
  ASSERT_FALSE(queries.empty()) << "no panel targets in " << kDashboard;
  const std::vector<Variable> variables = Variables(*dashboard);

  const std::string dir = NewTempDir("dashboard");
  const absl::Time test_start = absl::Now() - absl::Seconds(2);
  absl::StatusOr<ScrapedMaster> scraped = ScrapedMaster::Start(dir);
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  MasterProcess& master = *scraped->master;
  PrometheusServer& prometheus = *scraped->prometheus;
  auto client = MasterClient::Connect(master.address());
  ASSERT_TRUE(client.ok()) << client.status();

  auto stub = v1::Studies::NewStub(
      grpc::CreateChannel(master.address(), grpc::InsecureChannelCredentials()));
  absl::StatusOr<std::string> study_id = CreateStudy(*stub, SmallStudy());
  ASSERT_TRUE(study_id.ok()) << study_id.status();
  auto first = WaitForStudy(*stub, *study_id, absl::Seconds(60),
                            [](const v1::StudyStatus& s) {
                              return s.trials_size() > 0 && !s.trials(0).job_id().empty();
                            });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string job_id = first->trials(0).job_id();

  // The pool subscribes before the group starts, so it sees the snapshots.
  auto pool = StartWorkers(1, master.address(),
                           {"--role=validate", "--jobs=" + job_id, "--pool_label=dashboard",
                            "--exit_when_idle_s=60", "--threads=1"},
                           dir + "/pool.log");
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_TRUE(WaitForLog(**pool, "waiting for snapshots", absl::Seconds(120)))
      << (*pool)->Log();
  auto group = StartWorkers(2, master.address(),
                            {"--job_id=" + job_id, "--threads=1",
                             "--slowdown_ms_per_batch=40", "--progress=off"},
                            dir + "/group.log");
  ASSERT_TRUE(group.ok()) << group.status();
  // A user's typo: the RPC error panel's series.
  absl::StatusOr<v1::JobStatus> missing = (*client)->GetJobStatus("job-999999");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();

  const std::optional<int> group_exit = (*group)->Wait(absl::Seconds(300));
  ASSERT_TRUE(group_exit.has_value()) << "the group did not finish:\n" << (*group)->Log();
  ASSERT_EQ(*group_exit, 0) << (*group)->Log();
  auto done = WaitForStatus(**client, job_id, absl::Seconds(60),
                            [](const v1::JobStatus& s) {
                              return s.state() == v1::JOB_STATE_COMPLETED &&
                                     s.has_test_accuracy();
                            });
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->groups_size(), 1) << done->ShortDebugString();
  // The study goes on with its second trial (queued: no group serves it).
  auto running = WaitForStudy(*stub, *study_id, absl::Seconds(60),
                              [](const v1::StudyStatus& s) {
                                return s.state() == v1::STUDY_STATE_RUNNING &&
                                       s.has_best_value() && s.trials_running() > 0;
                              });
  ASSERT_TRUE(running.ok()) << running.status();
  const absl::Status after_trial =
      prometheus.WaitForScrapeAfter(absl::Now(), absl::Seconds(60));
  ASSERT_TRUE(after_trial.ok()) << after_trial;

  const std::map<std::string, std::string> values = {
      {"instance", absl::StrCat("127.0.0.1:", scraped->metrics_port)},
      {"job", job_id},
      {"group", done->groups(0).group_id()},
      {"study", *study_id},
      {"__rate_interval", "1m"},
      {"__interval", "1m"},
  };
  // Everything is in Prometheus by now; polled all the same, so a query
  // that needs one more evaluation step gets it.
  std::vector<std::string> failures;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    failures = CheckDashboard(prometheus, variables, queries, values, test_start);
    if (failures.empty() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Seconds(1));
  }
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  RecordProperty("panel_queries", static_cast<int>(queries.size()));
  RecordProperty("variables", static_cast<int>(variables.size()));
  (*pool)->Stop();
}

}  // namespace
}  // namespace mpilearn::testing
