#include "common/cli_flags.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace mpilearn {

std::string FindUndefinedFlag(int argc, char** argv) {
  // absl's parser handles these itself; they are not registered flags.
  static constexpr absl::string_view kUsageFlags[] = {
      "help",      "helpfull",  "helpshort", "helppackage",
      "helpon",    "helpmatch", "version",   "only_check_args"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    absl::string_view name = arg.substr(arg[1] == '-' ? 2 : 1);
    const bool has_value = absl::StrContains(name, '=');
    name = name.substr(0, name.find('='));
    if (std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) !=
        std::end(kUsageFlags)) {
      continue;
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::ConsumePrefix(&name, "no")) {
      flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && !flag->IsOfType<bool>()) flag = nullptr;
    }
    if (flag == nullptr) return std::string(arg);
    // "--flag value": the value is the next argument, whatever it looks like.
    if (!has_value && !flag->IsOfType<bool>()) ++i;
  }
  return "";
}

int RunToolMain(int argc, char** argv, const ToolMain& tool) {
  constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2;
  absl::SetProgramUsageMessage(tool.usage);
  absl::FlagsUsageConfig usage_config;
  const std::string source = tool.flags_source;
  usage_config.contains_help_flags = [source](absl::string_view path) {
    return absl::EndsWith(path, source);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" ||
        arg == "--helpfull" || arg == "--helpshort") {
      absl::PrintF("%s\n", tool.usage);
      return kExitOk;
    }
  }
  auto usage_error = [&](absl::string_view message) {
    absl::FPrintF(stderr, "%s: %s\nTry '%s --help'.\n", tool.name, message,
                  tool.name);
    return kExitUsage;
  };
  const std::string undefined = FindUndefinedFlag(argc, argv);
  if (!undefined.empty()) {
    return usage_error(absl::StrCat("unknown flag '", undefined, "'"));
  }
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return usage_error(absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  const absl::Status flags = tool.read_flags();
  if (!flags.ok()) return usage_error(flags.message());
  const absl::Status status = tool.run();
  if (!status.ok()) {
    absl::FPrintF(stderr, "%s: %s\n", tool.name, status.message());
    return kExitError;
  }
  return kExitOk;
}

MasterAddress ResolveMasterAddress(const std::string& flag,
                                   const std::string& default_address) {
  if (!flag.empty()) return {flag, "--master"};
  const char* env = std::getenv("MPILEARN_MASTER");
  if (env != nullptr && *env != '\0') return {env, "$MPILEARN_MASTER"};
  return {default_address, "the default (no --master, no $MPILEARN_MASTER)"};
}

int PrintMasterError(absl::string_view tool, const absl::Status& status,
                     const MasterAddress& master) {
  absl::FPrintF(stderr, "%s: %s\n", tool, status.message());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    absl::FPrintF(stderr,
                  "%s: address %s taken from %s; start a master there with "
                  "`mpilearn-master --listen %s --state_dir DIR` (under "
                  "systemd: deploy/README.md)\n",
                  tool, master.address, master.source, master.address);
  }
  return 1;
}

}  // namespace mpilearn
