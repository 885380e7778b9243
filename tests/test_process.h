// Helpers for integration tests that start the real binaries: the master on
// a loopback port and worker groups under real mpirun.
//
// Every process a test starts is owned by a ChildProcess, whose destructor
// ends it and every process it started in turn (mpirun's ranks), so a
// failing test leaves nothing running. Only those process ids are signalled.
#ifndef MPILEARN_TESTS_TEST_PROCESS_H_
#define MPILEARN_TESTS_TEST_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "google/protobuf/struct.pb.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::testing {

// Absolute path of a data dependency, e.g. Runfile("server/mpilearn-master").
std::string Runfile(const std::string& path);

// A fresh directory under TEST_TMPDIR.
std::string NewTempDir(const std::string& name);

std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& contents);

class ChildProcess {
 public:
  // Starts argv[0] with stdout and stderr appended to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const std::string& log_path);

  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const;

  // Exit code (128 + signal if killed), or nullopt if still running after
  // `timeout`.
  std::optional<int> Wait(absl::Duration timeout);

  // Processes this one started, transitively (e.g. mpirun's ranks).
  std::vector<pid_t> Descendants() const;

  // SIGTERM, a grace period, then SIGKILL for it and its descendants.
  void Stop(absl::Duration grace = absl::Seconds(10));

 private:
  ChildProcess(pid_t pid, std::string log_path)
      : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_;
  std::string log_path_;
  std::optional<int> exit_code_;
};

// The real mpilearn-master on 127.0.0.1 with ports the OS picks, for gRPC
// and for its metrics endpoint (so tests never collide on the default
// metrics port). `extra_flags` come last and win.
class MasterProcess {
 public:
  static absl::StatusOr<std::unique_ptr<MasterProcess>> Start(
      const std::string& state_dir, const std::vector<std::string>& extra_flags = {});
  // The same, listening on `host` instead of 127.0.0.1, with `prefix` before
  // the master's command line (NetnsCluster::InHost: another host).
  static absl::StatusOr<std::unique_ptr<MasterProcess>> StartOn(
      const std::string& host, const std::vector<std::string>& prefix,
      const std::string& state_dir, const std::vector<std::string>& extra_flags = {});

  std::string address() const { return host_ + ":" + std::to_string(port_); }
  ChildProcess& process() { return *process_; }

  // The metrics endpoint's port, once the master wrote it (waits up to 30s).
  absl::StatusOr<int> MetricsPort();

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string host_ = "127.0.0.1";
  int port_ = 0;
  std::string metrics_port_file_;
};

// `mpirun <mpirun_args> -np N mpilearn-worker --master ADDRESS <worker_flags>`
// (mpirun_args: NetnsCluster::MpirunArgs, ranks on other hosts).
absl::StatusOr<std::unique_ptr<ChildProcess>> StartWorkers(
    int ranks, const std::string& master, const std::vector<std::string>& worker_flags,
    const std::string& log_path, const std::vector<std::string>& mpirun_args = {});

// What RunJobToEnd saw: the job's status after the workers ended, their
// exit code and their output.
struct JobRun {
  v1::JobStatus status;
  int exit_code = 0;
  std::string log;
};

// Submits `spec` through `client`, runs `mpirun -np ranks mpilearn-worker
// --job_id=ID --threads=1` against `master` until the workers end (log in
// `dir`/workers-ID.log) and reads the job's status. Errors: the submit,
// start or status call's, or DEADLINE_EXCEEDED (with the workers' output)
// when they run longer than 300 s (they are stopped).
absl::StatusOr<JobRun> RunJobToEnd(MasterClient& client, const std::string& master,
                                   const v1::JobSpec& spec, int ranks,
                                   const std::string& dir);

// True once `process`'s output holds `text` (polls every 100 ms); false
// after `timeout`, or when it exited without it.
bool WaitForLog(ChildProcess& process, const std::string& text, absl::Duration timeout);

// Polls the job's status (every 50 ms) until `done` holds or `timeout`
// passes; DEADLINE_EXCEEDED (with the last status) in the latter case.
absl::StatusOr<v1::JobStatus> WaitForStatus(
    MasterClient& client, const std::string& job_id, absl::Duration timeout,
    const std::function<bool(const v1::JobStatus&)>& done);

// The command line of a running process (NUL-separated, from /proc).
std::string CommandLine(pid_t pid);

// A job spec on a Fashion-MNIST subset (Debian's dataset-fashion-mnist).
v1::JobSpec FashionMnistSubset(const std::string& algorithm, int64_t train,
                               int epochs);

// Parses JSON text (a Prometheus answer, a Chrome trace); DataLoss with the
// start of the text when it is not JSON.
absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& json);

// An object's member `key`, or a null value when absent.
const google::protobuf::Value& Field(const google::protobuf::Value& object,
                                     const std::string& key);

// A CA, a server certificate for `server_names` (a subjectAltName value:
// "IP:127.0.0.1,DNS:localhost") and a client certificate, all signed by the
// CA, in `dir` (ca.pem, server.pem/.key, client.pem/.key), made with the
// openssl CLI as docs/security.md shows. The error carries openssl's output.
absl::Status MakeCertificates(const std::string& dir, const std::string& server_names);

// True when Debian's Fashion-MNIST files are installed.
bool HaveFashionMnist();

}  // namespace mpilearn::testing

#endif  // MPILEARN_TESTS_TEST_PROCESS_H_
