// The mpilearn-opt commands that talk to mpilearn-master's Studies service
// (proto/study.proto, docs/opt.md): create, watch, status, list, best,
// cancel, export, ask and tell, each printing what opt_format.h formats.
// mpilearn_opt.cc owns the command line (flags, --help, the checks that need
// no master) and hands over a StudyCommand it has checked.
//
//   StudyCommand command;
//   command.name = "status";
//   command.operand = "s-1";
//   return RunStudyCommand(command, options);  // the exit code
//
// RunStudyCommand connects (options.client's timeouts and TLS/token
// settings), runs the one command and returns kExitOk, or kExitError after
// printing the error (the master's, with where its address came from when
// nothing answered) to stderr as "mpilearn-opt: ...". watch follows the
// study until it ends, waiting up to options.reconnect_timeout for a
// restarting master. Single-threaded: call it from main's thread.
#ifndef MPILEARN_TOOLS_CLI_OPT_COMMANDS_H_
#define MPILEARN_TOOLS_CLI_OPT_COMMANDS_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "google/protobuf/struct.pb.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // the master, the RPC or the study failed
inline constexpr int kExitUsage = 2;  // bad arguments or an invalid spec file

// Settings of one invocation, read from the flags by main().
struct Options {
  std::string master;         // host:port
  std::string master_source;  // where `master` came from, for messages
  MasterClient::Options client;
  bool watch = false;
  absl::Duration reconnect_timeout = absl::Minutes(5);  // watch
  std::optional<double> target;  // create: overrides of the spec file's
  std::optional<int> trials;
  std::optional<int> parallelism;
  std::optional<int> folds;
  bool json = false;
  bool spec = false;
  std::optional<int> trial;
  std::string reason;
  std::string format;
  std::string out;
  std::string params;
  std::string state;
  std::optional<double> value;
  std::string message;
};

// One command line's command, with what the command line checked before any
// RPC.
struct StudyCommand {
  // create, watch, status, list, best, cancel, export, ask or tell.
  std::string name;
  std::string operand;  // the study id (the spec file for create)
  v1::StudySpec spec;   // create: the file's spec with the flags applied
  google::protobuf::Struct ask_params;  // ask: --params (empty: the sampler's)
  v1::TrialState tell_state = v1::TRIAL_STATE_UNSPECIFIED;  // tell
};

// Runs `command` against options.master; tell needs options.trial set.
// Returns the exit code.
int RunStudyCommand(const StudyCommand& command, const Options& options);

}  // namespace mpilearn::opt

#endif  // MPILEARN_TOOLS_CLI_OPT_COMMANDS_H_
