// A real Prometheus server (Debian's /usr/bin/prometheus) for the tests
// that check what it scrapes from a master: on a free port of this host's
// loopback, or of another (network-namespace) host. Its ChildProcess ends
// it when the test ends.
//
//   auto prometheus = PrometheusServer::Start(
//       dir, {PrometheusServer::ScrapeJob("mpilearn", "127.0.0.1:7071")});
//   absl::StatusOr<double> updates = (*prometheus)->Instant("max(...)");
#ifndef MPILEARN_TESTS_PROMETHEUS_SERVER_H_
#define MPILEARN_TESTS_PROMETHEUS_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "tests/test_process.h"

namespace mpilearn::testing {

inline constexpr char kPrometheus[] = "/usr/bin/prometheus";

class PrometheusServer {
 public:
  // Where it runs: `host` (an IPv4 address it listens on) and the command
  // prefix that reaches that host (NetnsCluster::InHost); this machine's
  // loopback by default.
  struct Where {
    std::string host = "127.0.0.1";
    std::vector<std::string> prefix;
  };

  // One scrape job named `job` of `target` ("HOST:PORT"); with a
  // `password_file`, scrapes send HTTP Basic auth, user "prometheus" (as
  // docs/security.md shows for --metrics_token_file).
  static std::string ScrapeJob(const std::string& job, const std::string& target,
                               const std::string& password_file = "");

  // Scrapes `127.0.0.1:target_port` every second (job "mpilearn").
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(const std::string& dir,
                                                                 int target_port);
  // Scrapes every second with the jobs `scrape_jobs` (ScrapeJob), on
  // `where` (this machine's loopback without it); waits up to 60 s until
  // it is ready.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::vector<std::string>& scrape_jobs);
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::vector<std::string>& scrape_jobs,
      const Where& where);

  // GET /api/v1/<endpoint>?<params>; the "data" member of a success answer.
  absl::StatusOr<google::protobuf::Value> Api(const std::string& endpoint,
                                              const std::map<std::string, std::string>& params);
  // The points (unix seconds, value) of the series `promql` selects (the
  // first, if several) between `start` and now, one per second.
  absl::StatusOr<std::vector<std::pair<double, double>>> Range(const std::string& promql,
                                                               absl::Time start);
  // The value of an instant query's first series; NOT_FOUND when none.
  absl::StatusOr<double> Instant(const std::string& promql);
  // Waits until Prometheus holds a scrape of job `job` that began after
  // `after` (polls every 250 ms), so that queries see what the target
  // exported then; DEADLINE_EXCEEDED after `timeout`.
  absl::Status WaitForScrapeAfter(absl::Time after, absl::Duration timeout,
                                  const std::string& job = "mpilearn");

  ChildProcess& process() { return *process_; }

 private:
  PrometheusServer() = default;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

// A real master on loopback (MasterProcess::Start in `dir`/master) whose
// metrics endpoint a real Prometheus (in `dir`) scrapes every second as job
// "mpilearn". Members end in reverse order: Prometheus, then the master.
struct ScrapedMaster {
  std::unique_ptr<MasterProcess> master;
  int metrics_port = 0;
  std::unique_ptr<PrometheusServer> prometheus;

  static absl::StatusOr<ScrapedMaster> Start(const std::string& dir);
};

}  // namespace mpilearn::testing

#endif  // MPILEARN_TESTS_PROMETHEUS_SERVER_H_
