#include "tests/prometheus_server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/http_client.h"

namespace mpilearn::testing {

using google::protobuf::ListValue;
using google::protobuf::Value;

std::string PrometheusServer::ScrapeJob(const std::string& job, const std::string& target,
                                        const std::string& password_file) {
  std::string text = absl::StrCat("  - job_name: ", job,
                                  "\n"
                                  "    static_configs:\n"
                                  "      - targets: ['",
                                  target, "']\n");
  if (!password_file.empty()) {
    absl::StrAppend(&text,
                    "    basic_auth:\n"
                    "      username: prometheus\n"
                    "      password_file: ",
                    password_file, "\n");
  }
  return text;
}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, int target_port) {
  return Start(dir, {ScrapeJob("mpilearn", absl::StrCat("127.0.0.1:", target_port))});
}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, const std::vector<std::string>& scrape_jobs) {
  return Start(dir, scrape_jobs, Where());
}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, const std::vector<std::string>& scrape_jobs, const Where& where) {
  const std::string config = dir + "/prometheus.yml";
  WriteFileOrDie(config, absl::StrCat("global:\n"
                                      "  scrape_interval: 1s\n"
                                      "  evaluation_interval: 1s\n"
                                      "scrape_configs:\n",
                                      absl::StrJoin(scrape_jobs, "")));
  auto server = std::unique_ptr<PrometheusServer>(new PrometheusServer());
  server->host_ = where.host;
  // The free port could be taken between picking and binding: retry.
  for (int attempt = 0; attempt < 3; ++attempt) {
    server->port_ = PickFreePort();
    std::vector<std::string> argv = where.prefix;
    argv.insert(argv.end(), {kPrometheus, "--config.file=" + config,
                             "--storage.tsdb.path=" + dir + "/tsdb",
                             absl::StrCat("--web.listen-address=", where.host, ":",
                                          server->port_),
                             "--log.level=warn"});
    auto process = ChildProcess::Start(argv, dir + "/prometheus.log");
    if (!process.ok()) return process.status();
    server->process_ = std::move(process).value();
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      if (server->process_->Wait(absl::Milliseconds(200)).has_value()) break;
      absl::StatusOr<HttpResponse> ready = HttpGetFrom(where.host, server->port_, "/-/ready");
      if (ready.ok() && ready->status == 200) return server;
    }
    server->process_->Stop();
  }
  return absl::UnavailableError("Prometheus did not become ready: " + server->process_->Log());
}

absl::StatusOr<Value> PrometheusServer::Api(const std::string& endpoint,
                                            const std::map<std::string, std::string>& params) {
  std::string target = "/api/v1/" + endpoint;
  char separator = '?';
  for (const auto& [key, value] : params) {
    absl::StrAppend(&target, std::string(1, separator), key, "=", UrlEncode(value));
    separator = '&';
  }
  absl::StatusOr<HttpResponse> response = HttpGetFrom(host_, port_, target);
  if (!response.ok()) return response.status();
  absl::StatusOr<Value> json = ParseJson(response->body);
  if (!json.ok()) return json.status();
  if (response->status != 200 || Field(*json, "status").string_value() != "success") {
    return absl::InternalError(
        absl::StrCat("Prometheus answered ", response->status, ": ", response->body));
  }
  return Field(*json, "data");
}

absl::StatusOr<std::vector<std::pair<double, double>>> PrometheusServer::Range(
    const std::string& promql, absl::Time start) {
  absl::StatusOr<Value> data =
      Api("query_range", {{"query", promql},
                          {"start", absl::StrCat(absl::ToUnixSeconds(start))},
                          {"end", absl::StrCat(absl::ToUnixSeconds(absl::Now()))},
                          {"step", "1"}});
  if (!data.ok()) return data.status();
  const ListValue& result = Field(*data, "result").list_value();
  if (result.values_size() == 0) {
    return absl::NotFoundError("Prometheus has no series for " + promql);
  }
  std::vector<std::pair<double, double>> points;
  for (const Value& point : Field(result.values(0), "values").list_value().values()) {
    double value = 0;
    if (!absl::SimpleAtod(point.list_value().values(1).string_value(), &value)) {
      return absl::DataLossError("bad sample value");
    }
    points.emplace_back(point.list_value().values(0).number_value(), value);
  }
  return points;
}

absl::StatusOr<double> PrometheusServer::Instant(const std::string& promql) {
  absl::StatusOr<Value> data = Api("query", {{"query", promql}});
  if (!data.ok()) return data.status();
  const ListValue& result = Field(*data, "result").list_value();
  if (result.values_size() == 0) {
    return absl::NotFoundError("Prometheus has no series for " + promql);
  }
  double value = 0;
  if (!absl::SimpleAtod(Field(result.values(0), "value").list_value().values(1).string_value(),
                        &value)) {
    return absl::DataLossError("bad sample value");
  }
  return value;
}

absl::Status PrometheusServer::WaitForScrapeAfter(absl::Time after, absl::Duration timeout,
                                                  const std::string& job) {
  const double after_seconds = absl::ToDoubleSeconds(after - absl::UnixEpoch());
  const std::string promql = absl::StrCat("timestamp(up{job=\"", job, "\"})");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<double> scraped = Instant(promql);
    if (scraped.ok() && *scraped > after_seconds) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Prometheus did not scrape job ", job, " after the time waited for: ",
          scraped.ok() ? absl::StrCat("last scrape at ", *scraped)
                       : scraped.status().ToString()));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
}

absl::StatusOr<ScrapedMaster> ScrapedMaster::Start(const std::string& dir) {
  ScrapedMaster scraped;
  absl::StatusOr<std::unique_ptr<MasterProcess>> master = MasterProcess::Start(dir + "/master");
  if (!master.ok()) return master.status();
  scraped.master = std::move(master).value();
  absl::StatusOr<int> metrics_port = scraped.master->MetricsPort();
  if (!metrics_port.ok()) return metrics_port.status();
  scraped.metrics_port = *metrics_port;
  absl::StatusOr<std::unique_ptr<PrometheusServer>> prometheus =
      PrometheusServer::Start(dir, scraped.metrics_port);
  if (!prometheus.ok()) return prometheus.status();
  scraped.prometheus = std::move(prometheus).value();
  return scraped;
}

}  // namespace mpilearn::testing
