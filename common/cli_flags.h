// Command-line helpers shared by the tools.
#ifndef MPILEARN_COMMON_CLI_FLAGS_H_
#define MPILEARN_COMMON_CLI_FLAGS_H_

#include <string>

namespace mpilearn {

// Returns the first flag on the command line that no library defines ("" if
// none), so a tool can answer it as a usage error (exit 2) before absl's
// parser would exit 1 on it.
std::string FindUndefinedFlag(int argc, char** argv);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLI_FLAGS_H_
