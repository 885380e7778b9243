// Starting the tools' own child processes (a master for a benchmark or a
// soak): fork + exec with stdout and stderr to a log file, the child killed
// when the tool dies (PR_SET_PDEATHSIG), and where a tool finds the master
// binary it was built with. Used by bench_exchange and soak.
#ifndef MPILEARN_TOOLS_CHILD_PROCESS_H_
#define MPILEARN_TOOLS_CHILD_PROCESS_H_

#include <sys/types.h>

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

}  // namespace mpilearn::tools

#endif  // MPILEARN_TOOLS_CHILD_PROCESS_H_
