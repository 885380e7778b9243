#include "tools/cli/json_text.h"

#include "absl/strings/str_format.h"

namespace mpilearn::tools {

std::string JsonQuoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace mpilearn::tools
