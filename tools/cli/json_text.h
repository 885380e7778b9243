// A string as a JSON string literal, for the tools that print JSON by hand
// (mpilearn-opt's --json, the benchmarks' and the soak's --json objects).
#ifndef MPILEARN_TOOLS_CLI_JSON_TEXT_H_
#define MPILEARN_TOOLS_CLI_JSON_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace mpilearn::tools {

// `text` in double quotes, with quotes and backslashes escaped and control
// characters as \u00XX: "a \"b\"".
std::string JsonQuoted(absl::string_view text);

}  // namespace mpilearn::tools

#endif  // MPILEARN_TOOLS_CLI_JSON_TEXT_H_
