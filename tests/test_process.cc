#include "tests/test_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn::testing {
namespace {

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist/";

// Parent pid of every process, from /proc.
std::map<pid_t, pid_t> ParentMap() {
  std::map<pid_t, pid_t> parents;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return parents;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    // "pid (comm) state ppid ...": comm may hold spaces; parse after ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
    int ppid = 0;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid)) {
      parents[pid] = ppid;
    }
  }
  closedir(proc);
  return parents;
}

}  // namespace

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  CHECK(srcdir != nullptr) << "run under bazel test";
  return absl::StrCat(srcdir, "/mpilearn/", path);
}

std::string NewTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path);
  CHECK(in) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileOrDie(const std::string& path, const std::string& contents) {
  std::ofstream out(path);
  out << contents;
  CHECK(out) << "cannot write " << path;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log < 0) return absl::InternalError("cannot open log " + log_path);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  ::close(log);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() { Stop(absl::Seconds(5)); }

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::vector<pid_t> ChildProcess::Descendants() const {
  const std::map<pid_t, pid_t> parents = ParentMap();
  std::vector<pid_t> found = {pid_};
  for (size_t i = 0; i < found.size(); ++i) {
    for (const auto& [child, parent] : parents) {
      if (parent == found[i]) found.push_back(child);
    }
  }
  found.erase(found.begin());
  return found;
}

void ChildProcess::Stop(absl::Duration grace) {
  if (exit_code_.has_value()) return;
  const std::vector<pid_t> descendants = Descendants();
  kill(pid_, SIGTERM);
  if (!Wait(grace).has_value()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(5));
  }
  for (pid_t pid : descendants) kill(pid, SIGKILL);
}

absl::StatusOr<std::unique_ptr<MasterProcess>> MasterProcess::Start(
    const std::string& state_dir, const std::vector<std::string>& extra_flags) {
  return StartOn("127.0.0.1", {}, state_dir, extra_flags);
}

absl::StatusOr<std::unique_ptr<MasterProcess>> MasterProcess::StartOn(
    const std::string& host, const std::vector<std::string>& prefix,
    const std::string& state_dir, const std::vector<std::string>& extra_flags) {
  const std::string port_file = state_dir + "/port";
  std::filesystem::create_directories(state_dir);
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {Runfile("server/mpilearn-master"),
                           "--listen=" + host + ":0",
                           "--state_dir=" + state_dir,
                           "--port_file=" + port_file,
                           "--metrics_listen=127.0.0.1:0",
                           "--metrics_port_file=" + state_dir + "/metrics_port"});
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  auto master = std::unique_ptr<MasterProcess>(new MasterProcess());
  master->host_ = host;
  master->metrics_port_file_ = state_dir + "/metrics_port";
  std::filesystem::remove(master->metrics_port_file_);
  auto process = ChildProcess::Start(argv, state_dir + "/master.log");
  if (!process.ok()) return process.status();
  master->process_ = std::move(process).value();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (master->process_->Wait(absl::ZeroDuration()).has_value()) {
      return absl::InternalError("master exited: " + master->process_->Log());
    }
    std::ifstream in(port_file);
    if (in >> master->port_ && master->port_ > 0) return master;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("master did not start within 30s");
}

absl::StatusOr<int> MasterProcess::MetricsPort() {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(metrics_port_file_);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (process_->Wait(absl::ZeroDuration()).has_value()) {
      return absl::InternalError("master exited: " + process_->Log());
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      "the master wrote no metrics port within 30s (--metrics_port_file)");
}

absl::StatusOr<std::unique_ptr<ChildProcess>> StartWorkers(
    int ranks, const std::string& master,
    const std::vector<std::string>& worker_flags, const std::string& log_path,
    const std::vector<std::string>& mpirun_args) {
  // Open MPI names its session directory after mpirun's pid. Bazel's
  // sandbox gives each test its own pid namespace, so two tests' mpiruns can
  // share a pid: keep each test's session directory in its own TMPDIR.
  // The same goes for its shared-memory segments in /dev/shm. Each mpirun
  // gets a directory of its own below it: two started at once by one test
  // raced to create the same top-level session directory ("File exists").
  if (const char* test_tmp = std::getenv("TEST_TMPDIR")) {
    std::string dir = std::string(test_tmp) + "/mpirun.XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) dir = test_tmp;
    setenv("TMPDIR", dir.c_str(), /*overwrite=*/1);
    setenv("OMPI_MCA_btl_vader_backing_directory", dir.c_str(), /*overwrite=*/1);
  }
  std::vector<std::string> argv = {"mpirun", "--allow-run-as-root",
                                   "--oversubscribe"};
  argv.insert(argv.end(), mpirun_args.begin(), mpirun_args.end());
  argv.insert(argv.end(), {"-np", std::to_string(ranks),
                           Runfile("worker/mpilearn-worker"), "--master=" + master});
  argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
  return ChildProcess::Start(argv, log_path);
}

bool WaitForLog(ChildProcess& process, const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (process.Log().find(text) != std::string::npos) return true;
    if (process.Wait(absl::Milliseconds(100)).has_value()) {
      return process.Log().find(text) != std::string::npos;
    }
  }
  return false;
}

absl::StatusOr<v1::JobStatus> WaitForStatus(
    MasterClient& client, const std::string& job_id, absl::Duration timeout,
    const std::function<bool(const v1::JobStatus&)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::JobStatus> status;
  while (absl::Now() < deadline) {
    status = client.GetJobStatus(job_id);
    if (!status.ok() || done(*status)) return status;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      "condition not reached; last status: " +
      (status.ok() ? status->ShortDebugString() : status.status().ToString()));
}

std::string CommandLine(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kFashionMnist) +
                                 "train-images-idx3-ubyte.gz");
}

absl::StatusOr<JobRun> RunJobToEnd(MasterClient& client, const std::string& master,
                                   const v1::JobSpec& spec, int ranks,
                                   const std::string& dir) {
  absl::StatusOr<std::string> job_id = client.SubmitJob(spec);
  if (!job_id.ok()) return job_id.status();
  absl::StatusOr<std::unique_ptr<ChildProcess>> workers =
      StartWorkers(ranks, master, {"--job_id=" + *job_id, "--threads=1"},
                   absl::StrCat(dir, "/workers-", *job_id, ".log"));
  if (!workers.ok()) return workers.status();
  const std::optional<int> exited = (*workers)->Wait(absl::Seconds(300));
  JobRun run;
  run.log = (*workers)->Log();
  if (!exited.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("workers did not finish in 300 s:\n", run.log));
  }
  run.exit_code = *exited;
  absl::StatusOr<v1::JobStatus> status = client.GetJobStatus(*job_id);
  if (!status.ok()) return status.status();
  run.status = *std::move(status);
  return run;
}

absl::Status MakeCertificates(const std::string& dir, const std::string& server_names) {
  const std::string log = dir + "/openssl.log";
  auto shell = [&](const std::string& command) -> absl::Status {
    const int rc = std::system(
        absl::StrCat("cd '", dir, "' && (", command, ") >>", log, " 2>&1").c_str());
    if (rc == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(command, "\n", ReadFileOrDie(log)));
  };
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  WriteFileOrDie(dir + "/server.ext", "subjectAltName=" + server_names + "\n");
  WriteFileOrDie(dir + "/client.ext", "extendedKeyUsage=clientAuth\n");
  for (const std::string& command : {
           absl::StrCat("openssl req -x509 ", key,
                        " -keyout ca.key -out ca.pem -days 2 -subj '/CN=test CA'"),
           absl::StrCat("openssl req ", key,
                        " -keyout server.key -out server.csr -subj '/CN=master'"),
           std::string("openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
                       "-CAcreateserial -days 2 -extfile server.ext -out server.pem"),
           absl::StrCat("openssl req ", key,
                        " -keyout client.key -out client.csr -subj '/CN=worker'"),
           std::string("openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key "
                       "-CAcreateserial -days 2 -extfile client.ext -out client.pem")}) {
    if (absl::Status status = shell(command); !status.ok()) return status;
  }
  return absl::OkStatus();
}

v1::JobSpec FashionMnistSubset(const std::string& algorithm, int64_t train,
                               int epochs) {
  v1::JobSpec spec;
  spec.set_name("test-" + algorithm);
  spec.mutable_model()->set_name("mlp");
  v1::DataSpec* data = spec.mutable_data();
  const std::string dir = kFashionMnist;
  data->set_train_images(dir + "train-images-idx3-ubyte.gz");
  data->set_train_labels(dir + "train-labels-idx1-ubyte.gz");
  data->set_test_images(dir + "t10k-images-idx3-ubyte.gz");
  data->set_test_labels(dir + "t10k-labels-idx1-ubyte.gz");
  data->set_train_limit(train);
  data->set_validation_count(2000);
  data->set_test_limit(2000);
  spec.set_algorithm(algorithm);
  spec.set_epochs(epochs);
  spec.set_batch_size(32);
  spec.set_seed(3);
  return spec;
}

absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& json) {
  google::protobuf::Value value;
  auto status = google::protobuf::util::JsonStringToMessage(json, &value);
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat("not JSON (", status.ToString(),
                                            "): ", json.substr(0, 300)));
  }
  return value;
}

const google::protobuf::Value& Field(const google::protobuf::Value& object,
                                     const std::string& key) {
  static const google::protobuf::Value* const kNull = new google::protobuf::Value();
  const auto& fields = object.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? *kNull : it->second;
}

}  // namespace mpilearn::testing
