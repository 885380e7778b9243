// Command-line helpers shared by the tools.
#ifndef MPILEARN_COMMON_CLI_FLAGS_H_
#define MPILEARN_COMMON_CLI_FLAGS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mpilearn {

// Returns the first flag on the command line that no library defines ("" if
// none), so a tool can answer it as a usage error (exit 2) before absl's
// parser would exit 1 on it.
std::string FindUndefinedFlag(int argc, char** argv);

// A command-line tool whose flags are absl flags and that takes no
// positional arguments, as RunToolMain runs it.
struct ToolMain {
  std::string name;   // "convert_data": messages start "convert_data: "
  std::string usage;  // printed by --help, -h, -help, --helpfull, --helpshort
  // The source file defining the tool's own flags
  // ("tools/data/convert_data.cc"), so absl's flag listings show only them.
  std::string flags_source;
  // Reads and checks the flags: an error is a usage error.
  std::function<absl::Status()> read_flags;
  // The work: an error is printed as "NAME: message".
  std::function<absl::Status()> run;
};

// The whole of such a tool's main(): prints the usage for a help flag
// (exit 0); for an unknown flag, a positional argument or a read_flags
// error prints "NAME: message" and "Try 'NAME --help'." (exit 2); else runs
// it (exit 0, or 1 with the error printed).
int RunToolMain(int argc, char** argv, const ToolMain& tool);

// The master a client tool talks to: `flag` (--master) if set, else
// $MPILEARN_MASTER if set, else `default_address`; `source` says which, for
// messages ("--master", "$MPILEARN_MASTER", "the default (...)").
struct MasterAddress {
  std::string address;
  std::string source;
};
MasterAddress ResolveMasterAddress(const std::string& flag,
                                   const std::string& default_address);

// Prints "TOOL: message" for an error of the master or of reaching it and,
// when nothing answered (UNAVAILABLE, DEADLINE_EXCEEDED), where the address
// came from and how to start a master there. Returns 1, the tools' exit
// code for such errors.
int PrintMasterError(absl::string_view tool, const absl::Status& status,
                     const MasterAddress& master);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLI_FLAGS_H_
