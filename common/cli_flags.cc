#include "common/cli_flags.h"

#include <algorithm>
#include <iterator>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
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

}  // namespace mpilearn
