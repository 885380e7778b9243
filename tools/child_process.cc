#include "tools/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

}  // namespace mpilearn::tools
