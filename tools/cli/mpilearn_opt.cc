// mpilearn-opt: create, watch, inspect, export and drive MPI Opt studies on
// mpilearn-master's Studies service (proto/study.proto, docs/opt.md).
//
//   mpilearn-opt --master 127.0.0.1:7070 create study.yaml --watch
//   mpilearn-opt best s-1 --spec > best_job.json
//
// The command line: flags, --help, and every check that needs no master
// (the command and its operand, flags that belong to another command, the
// study spec file, --params). main() only parses flags; Run() checks the
// command line and hands the command to RunStudyCommand
// (tools/cli/opt_commands.h), which talks to the master and prints. Exit
// codes: 0 success, 1 the master (or reaching it) reported an error, 2 usage
// or local spec error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/client/client_security_flags.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "proto/study.pb.h"
#include "tools/cli/opt_commands.h"
#include "tools/cli/study_spec_file.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master. Default: $MPILEARN_MASTER if set, "
          "else 127.0.0.1:7070.");
ABSL_FLAG(double, connect_timeout_s, 10,
          "Seconds to wait for the master to answer before giving up.");
ABSL_FLAG(double, rpc_timeout_s, 30,
          "Deadline of each call to the master (not of watch's stream).");
ABSL_FLAG(bool, watch, false, "create: go on as `watch` on the new study.");
ABSL_FLAG(double, reconnect_timeout_s, 300,
          "watch: how long to keep trying when the master goes away "
          "(restarting) before giving up; the study continues on the master "
          "either way.");
ABSL_FLAG(std::optional<double>, target, std::nullopt,
          "create: end the study (COMPLETED) as soon as any trial's value "
          "reaches V (>= when maximizing, <= when minimizing); overrides the "
          "file's `target`.");
ABSL_FLAG(std::optional<int>, trials, std::nullopt,
          "create: the trial budget (>= 1); overrides the file's `trials`.");
ABSL_FLAG(std::optional<int>, parallelism, std::nullopt,
          "create: trials queued or running at once (>= 1); overrides the "
          "file's `parallelism`.");
ABSL_FLAG(std::optional<int>, folds, std::nullopt,
          "create: k-fold trials, each trial trained as K jobs (one per "
          "held-out fold, 2 to 20) and scored by their mean; overrides the "
          "file's `folds`.");
ABSL_FLAG(bool, json, false,
          "status, list, best, cancel, ask, tell: print the master's reply "
          "as JSON (field names as in proto/study.proto).");
ABSL_FLAG(bool, spec, false,
          "best: print the best trial's job spec (the base spec with its "
          "parameters applied) as JSON.");
ABSL_FLAG(std::optional<int>, trial, std::nullopt,
          "cancel: the trial to cancel (else the whole study); tell: the "
          "trial told about.");
ABSL_FLAG(std::string, reason, "", "cancel: why, recorded on the master.");
ABSL_FLAG(std::string, format, "csv", "export: csv or json.");
ABSL_FLAG(std::string, out, "",
          "export: write to this file instead of stdout.");
ABSL_FLAG(std::string, params, "",
          "ask: the trial's parameter values as a JSON object by path, e.g. "
          "'{\"optimizer.learning_rate\": 0.003, \"batch_size\": 64}'; "
          "empty: the study's sampler proposes them.");
ABSL_FLAG(std::string, state, "", "tell: completed, pruned or failed.");
ABSL_FLAG(std::optional<double>, value, std::nullopt,
          "tell: the trial's objective value (required for completed unless "
          "the trial has one).");
ABSL_FLAG(std::string, message, "", "tell: why, recorded on the trial.");

namespace mpilearn::opt {
namespace {

constexpr char kDefaultMaster[] = "127.0.0.1:7070";

constexpr char kUsage[] =
    "MPI Opt: hyperparameter studies on mpilearn-master (docs/opt.md).\n"
    "\n"
    "Usage: mpilearn-opt [--master HOST:PORT] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "Commands:\n"
    "  create STUDY.(json|yaml) [--watch] [--target V] [--trials N]\n"
    "        [--parallelism N] [--folds K]\n"
    "        check a study spec file and start the study; prints\n"
    "        `study s-1 created`; --watch then goes on as `watch`;\n"
    "        --target ends the study as soon as a trial's value reaches V;\n"
    "        --trials, --parallelism and --folds (k-fold trials: K jobs\n"
    "        per trial, scored by their mean) override the file's values\n"
    "  watch STUDY_ID\n"
    "        follow the study until it ends: a live table on a terminal\n"
    "        (trial, state, epochs, value, best marker, parameters), else\n"
    "        one line per event; then prints the best trial\n"
    "  status STUDY_ID [--json]   the study and a table of its trials\n"
    "  list [--json]              the master's studies\n"
    "  best STUDY_ID [--spec]     the best trial: parameters, value, job id;\n"
    "        --spec prints the trial job's full spec as JSON instead\n"
    "  cancel STUDY_ID [--trial N] [--reason TEXT]\n"
    "        stop the study (trials in flight are cancelled), or one trial\n"
    "  export STUDY_ID [--format csv|json] [--out FILE]\n"
    "        csv: one row per trial (number, state, value, epochs_trained,\n"
    "        retries, job_id, one column per parameter, epoch_1, epoch_2...\n"
    "        the intermediate values); json: the StudyStatus\n"
    "  ask STUDY_ID [--params JSON]\n"
    "        start a trial now with these values (an external optimizer's),\n"
    "        or the study sampler's without --params\n"
    "  tell STUDY_ID --trial N --state completed|pruned|failed [--value V]\n"
    "        [--message TEXT]   an external optimizer's verdict on a trial\n"
    "\n"
    "Examples:\n"
    "  mpilearn-opt --master 127.0.0.1:7070 create "
    "docs/examples/opt_fashion_mnist.yaml --watch\n"
    "  mpilearn-opt create study.yaml --trials 8 --parallelism 4 "
    "--target 0.9\n"
    "  mpilearn-opt watch s-1\n"
    "  mpilearn-opt status s-1\n"
    "  mpilearn-opt list\n"
    "  mpilearn-opt best s-1\n"
    "  mpilearn-opt best s-1 --spec > best_job.json\n"
    "  mpilearn-opt cancel s-1 --trial 3 --reason 'bad data'\n"
    "  mpilearn-opt export s-1 --format csv --out s-1.csv\n"
    "  mpilearn-opt export s-1 --format json > s-1.json\n"
    "  mpilearn-opt ask s-2 --params '{\"optimizer.learning_rate\": 0.003, "
    "\"batch_size\": 64}'\n"
    "  mpilearn-opt tell s-2 --trial 0 --state completed --value 0.87\n"
    "\n"
    "Exit codes: 0 ok, 1 master/RPC error, 2 usage or spec file error. The\n"
    "master address defaults to $MPILEARN_MASTER, else 127.0.0.1:7070.\n"
    "\n"
    "A master with TLS and tokens (docs/security.md) takes --tls_ca FILE\n"
    "(and --tls_cert/--tls_key for mutual TLS) and --token_file FILE or\n"
    "$MPILEARN_TOKEN; studies need an admin token.";

int UsageError(absl::string_view message) {
  absl::FPrintF(stderr, "mpilearn-opt: %s\nTry 'mpilearn-opt --help'.\n",
                message);
  return kExitUsage;
}

struct Command {
  absl::string_view name;
  absl::string_view operand;  // empty: takes none
  // The command's own flags; another command's is a usage error (--master,
  // --connect_timeout_s and --rpc_timeout_s go with every command).
  std::vector<absl::string_view> flags;
};

const std::vector<Command>& Commands() {
  static const std::vector<Command>* const commands = new std::vector<Command>{
      {"create",
       "STUDY.(json|yaml)",
       {"watch", "target", "trials", "parallelism", "folds"}},
      {"watch", "STUDY_ID", {}},
      {"status", "STUDY_ID", {"json"}},
      {"list", "", {"json"}},
      {"best", "STUDY_ID", {"spec", "json"}},
      {"cancel", "STUDY_ID", {"trial", "reason", "json"}},
      {"export", "STUDY_ID", {"format", "out"}},
      {"ask", "STUDY_ID", {"params", "json"}},
      {"tell", "STUDY_ID", {"trial", "state", "value", "message", "json"}},
  };
  return *commands;
}

// Every flag named on the command line ("--name", "-name=x", "--noname"),
// up to "--".
std::set<std::string> FlagsOnCommandLine(int argc, char** argv) {
  std::set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    names.insert(name);
    if (absl::StartsWith(name, "no")) names.insert(name.substr(2));
  }
  return names;
}

// Checks the command line and runs the command. `args`: the positional
// arguments (the command and its operand); `given`: the flags named.
int Run(const std::vector<std::string>& args,
        const std::set<std::string>& given, const Options& options) {
  if (args.empty()) return UsageError("missing command");
  const std::string& name = args[0];
  const Command* command = nullptr;
  std::vector<absl::string_view> names;
  for (const Command& c : Commands()) {
    names.push_back(c.name);
    if (c.name == name) command = &c;
  }
  if (command == nullptr) {
    return UsageError(absl::StrCat("unknown command '", name, "'; commands: ",
                                   absl::StrJoin(names, ", ")));
  }
  const size_t operands = command->operand.empty() ? 0 : 1;
  if (args.size() < operands + 1) {
    return UsageError(absl::StrCat("missing argument: mpilearn-opt ", name, " ",
                                   command->operand));
  }
  if (args.size() > operands + 1) {
    return UsageError(absl::StrCat("unexpected argument '", args[operands + 1],
                                   "' after '", name, "'"));
  }
  // Flags of other commands: a mistake (e.g. --trial on best), not ignored.
  for (const Command& other : Commands()) {
    for (absl::string_view flag : other.flags) {
      const bool own = std::find(command->flags.begin(), command->flags.end(),
                                 flag) != command->flags.end();
      if (!own && given.count(std::string(flag)) > 0) {
        return UsageError(
            absl::StrCat("--", flag, " does not go with '", name, "'"));
      }
    }
  }
  const std::string operand = operands > 0 ? args[1] : "";

  // Checks that need no master.
  v1::StudySpec spec;
  v1::TrialState tell_state = v1::TRIAL_STATE_UNSPECIFIED;
  if (name == "create") {
    if (options.trials.has_value() && *options.trials < 1) {
      return UsageError(
          absl::StrCat("--trials must be >= 1, got ", *options.trials));
    }
    if (options.parallelism.has_value() && *options.parallelism < 1) {
      return UsageError(absl::StrCat("--parallelism must be >= 1, got ",
                                     *options.parallelism));
    }
    if (options.folds.has_value() && (*options.folds < 2 || *options.folds > 20)) {
      return UsageError(absl::StrCat("--folds must be 2 to 20, got ", *options.folds));
    }
    if (options.target.has_value() && !std::isfinite(*options.target)) {
      return UsageError("--target must be a finite number");
    }
    absl::StatusOr<v1::StudySpec> read = ReadStudySpecFile(operand);
    absl::Status checked = read.ok() ? CheckBaseJobSpec(*read) : read.status();
    if (!checked.ok()) {
      absl::FPrintF(stderr, "mpilearn-opt: %s%s\n",
                    read.ok() ? absl::StrCat(operand, ": ") : "",
                    checked.message());
      return kExitUsage;
    }
    spec = *std::move(read);
    // The flags win over the file; the master checks the result (e.g. the
    // budget's upper bound) like any spec.
    if (options.target.has_value()) spec.set_target(*options.target);
    if (options.trials.has_value()) spec.set_trials(*options.trials);
    if (options.parallelism.has_value()) {
      spec.set_parallelism(*options.parallelism);
    }
    if (options.folds.has_value()) spec.set_folds(*options.folds);
  }
  if (name == "export" && options.format != "csv" && options.format != "json") {
    return UsageError(absl::StrCat("--format must be csv or json, got '",
                                   options.format, "'"));
  }
  google::protobuf::Struct ask_params;
  if (name == "ask" && !options.params.empty()) {
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        options.params, &ask_params);
    if (!parsed.ok()) {
      return UsageError(
          absl::StrCat("--params must be a JSON object of values by path: ",
                       std::string(parsed.message())));
    }
  }
  if (name == "cancel" && options.trial.has_value() && *options.trial < 0) {
    return UsageError("--trial must be >= 0");
  }
  if (name == "tell") {
    if (!options.trial.has_value() || *options.trial < 0) {
      return UsageError("tell needs --trial N (N >= 0)");
    }
    if (options.state == "completed") {
      tell_state = v1::TRIAL_STATE_COMPLETED;
    } else if (options.state == "pruned") {
      tell_state = v1::TRIAL_STATE_PRUNED;
    } else if (options.state == "failed") {
      tell_state = v1::TRIAL_STATE_FAILED;
    } else {
      return UsageError(
          absl::StrCat("tell needs --state completed, pruned or failed, got '",
                       options.state, "'"));
    }
  }

  StudyCommand study_command;
  study_command.name = name;
  study_command.operand = operand;
  study_command.spec = std::move(spec);
  study_command.ask_params = std::move(ask_params);
  study_command.tell_state = tell_state;
  return RunStudyCommand(study_command, options);
}

// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  const MasterAddress master =
      ResolveMasterAddress(absl::GetFlag(FLAGS_master), kDefaultMaster);
  options.master = master.address;
  options.master_source = master.source;
  const double connect_s = absl::GetFlag(FLAGS_connect_timeout_s);
  const double rpc_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  if (!(connect_s > 0)) {
    return absl::InvalidArgumentError("--connect_timeout_s must be > 0");
  }
  if (!(rpc_s > 0)) {
    return absl::InvalidArgumentError("--rpc_timeout_s must be > 0");
  }
  options.client.connect_timeout = absl::Seconds(connect_s);
  options.client.rpc_timeout = absl::Seconds(rpc_s);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromFlags();
  if (!security.ok()) return security.status();
  options.client.security = *std::move(security);
  options.watch = absl::GetFlag(FLAGS_watch);
  const double reconnect_s = absl::GetFlag(FLAGS_reconnect_timeout_s);
  if (!(reconnect_s >= 0)) {
    return absl::InvalidArgumentError("--reconnect_timeout_s must be >= 0");
  }
  options.reconnect_timeout = absl::Seconds(reconnect_s);
  options.target = absl::GetFlag(FLAGS_target);
  options.trials = absl::GetFlag(FLAGS_trials);
  options.parallelism = absl::GetFlag(FLAGS_parallelism);
  options.folds = absl::GetFlag(FLAGS_folds);
  options.json = absl::GetFlag(FLAGS_json);
  options.spec = absl::GetFlag(FLAGS_spec);
  options.trial = absl::GetFlag(FLAGS_trial);
  options.reason = absl::GetFlag(FLAGS_reason);
  options.format = absl::GetFlag(FLAGS_format);
  options.out = absl::GetFlag(FLAGS_out);
  options.params = absl::GetFlag(FLAGS_params);
  options.state = absl::GetFlag(FLAGS_state);
  options.value = absl::GetFlag(FLAGS_value);
  options.message = absl::GetFlag(FLAGS_message);
  return options;
}

}  // namespace
}  // namespace mpilearn::opt

int main(int argc, char** argv) {
  namespace opt = mpilearn::opt;
  absl::SetProgramUsageMessage(opt::kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "tools/cli/mpilearn_opt.cc") ||
           absl::EndsWith(path, mpilearn::kClientSecurityFlagsSource);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  const std::string undefined = mpilearn::FindUndefinedFlag(argc, argv);
  if (!undefined.empty()) {
    return opt::UsageError(absl::StrCat("unknown flag '", undefined, "'"));
  }
  const std::set<std::string> given = opt::FlagsOnCommandLine(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::StatusOr<opt::Options> options = opt::OptionsFromFlags();
  if (!options.ok()) return opt::UsageError(options.status().message());
  return opt::Run(
      std::vector<std::string>(positional.begin() + 1, positional.end()), given,
      *options);
}
