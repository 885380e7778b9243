// The tools' own child masters (bench_exchange, soak): a temporary
// directory, an mpilearn-master started in it as a user would (fork + exec,
// output to a log file, a loopback port read back from its --port_file),
// ended with SIGTERM (SIGKILL after 10 s), and killed with this process if
// it dies first (PR_SET_PDEATHSIG); and where a tool finds the master
// binary it was built with.
#ifndef MPILEARN_TOOLS_SOAK_CHILD_PROCESS_H_
#define MPILEARN_TOOLS_SOAK_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mpilearn::tools {

// Starts `binary` with `args` (args[0] included) and its output in `log`
// (truncated). The child gets SIGKILL when the calling thread's process
// ends. Returns the child's pid; reaping it is the caller's.
absl::StatusOr<pid_t> SpawnWithLog(const std::string& binary,
                                   std::vector<std::string> args,
                                   const std::string& log);

// The mpilearn-master a tool's Bazel target carries in its runfiles
// (data = ["//server:mpilearn-master"]): under $RUNFILES_DIR, else next to
// `argv0` in `argv0`.runfiles. INVALID_ARGUMENT, saying what to do, when it
// is not executable there.
absl::StatusOr<std::string> RunfilesMaster(const std::string& argv0);

// A fresh directory under $TMPDIR (else /tmp) named mpilearn-TAG.XXXXXX,
// removed with everything in it by the destructor.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Create(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

// An mpilearn-master child. Start runs `binary` with `args`, which must
// include --port_file=`port_file`, and waits up to 60 s for the port it
// writes there; errors carry the end of `log`. The destructor ends the
// child (SIGTERM, SIGKILL after 10 s) and reaps it. Only this pid is ever
// signalled. Thread-compatible; create and destroy it on the main thread
// (the death signal follows the thread that forked).
class MasterChild {
 public:
  static absl::StatusOr<std::unique_ptr<MasterChild>> Start(
      const std::string& binary, std::vector<std::string> args,
      const std::string& port_file, const std::string& log);
  ~MasterChild();
  MasterChild(const MasterChild&) = delete;
  MasterChild& operator=(const MasterChild&) = delete;

  int port() const { return port_; }
  // -1 once the child exited and was reaped.
  pid_t pid() const { return pid_; }
  // Whether the child still runs (false once it exited: a crash).
  bool Running();
  // The last `bytes` of the child's log, for error messages.
  std::string LogTail(size_t bytes = 4096) const;

 private:
  MasterChild(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}

  pid_t pid_;
  const std::string log_;
  int port_ = 0;
};

}  // namespace mpilearn::tools

#endif  // MPILEARN_TOOLS_SOAK_CHILD_PROCESS_H_
