#include "tools/soak/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mpilearn::tools {

absl::StatusOr<pid_t> SpawnWithLog(const std::string& binary,
                                   std::vector<std::string> args,
                                   const std::string& log) {
  // Everything the child needs is made before fork: it only execs.
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent already died
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

absl::StatusOr<std::string> RunfilesMaster(const std::string& argv0) {
  const char* runfiles = std::getenv("RUNFILES_DIR");
  const std::string dir = runfiles != nullptr ? std::string(runfiles)
                                              : absl::StrCat(argv0, ".runfiles");
  std::string binary = dir + "/mpilearn/server/mpilearn-master";
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no executable mpilearn-master at '", binary,
        "'; build //server:mpilearn-master or pass --master_bin"));
  }
  return binary;
}

absl::StatusOr<std::unique_ptr<TempDir>> TempDir::Create(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/mpilearn-", tag, ".XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(
        "cannot create a temporary directory ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<TempDir>(new TempDir(std::move(path)));
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

absl::StatusOr<std::unique_ptr<MasterChild>> MasterChild::Start(
    const std::string& binary, std::vector<std::string> args,
    const std::string& port_file, const std::string& log) {
  absl::StatusOr<pid_t> pid = SpawnWithLog(binary, std::move(args), log);
  if (!pid.ok()) return pid.status();
  std::unique_ptr<MasterChild> child(new MasterChild(*pid, log));
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    if (!child->Running()) {
      return absl::InternalError(absl::StrCat(
          "mpilearn-master exited at start; its log:\n", child->LogTail()));
    }
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      child->port_ = port;
      return child;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("mpilearn-master wrote no port file in 60 s; its log:\n",
                   child->LogTail()));
}

MasterChild::~MasterChild() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > give_up) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

bool MasterChild::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

std::string MasterChild::LogTail(size_t bytes) const {
  std::ifstream in(log_, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace mpilearn::tools
