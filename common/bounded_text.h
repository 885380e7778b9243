// User text in the master's errors, logs and records, bounded.
//
// Every string a client sends can be megabytes long and hold any byte. The
// master never echoes one whole: error messages and log lines carry
// EchoPrefix (at most kEchoBytes, control bytes escaped, the full length
// noted), free text it keeps (a group's error) goes through SanitizeText,
// and the strings it stores (names, labels, paths, hosts, metric names) are
// checked with CheckStringFields before anything is stored.
//
//   return JobUnknownError(absl::StrCat("unknown job '", EchoPrefix(id), "'"));
//   MPILEARN_RETURN_IF_ERROR(CheckStringFields(request.spec(), "spec",
//                                              max_string_bytes));
//
// Thread-compatible: free functions, no state.
#ifndef MPILEARN_COMMON_BOUNDED_TEXT_H_
#define MPILEARN_COMMON_BOUNDED_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace mpilearn {

// Bytes of user input an error message or log line repeats.
inline constexpr size_t kEchoBytes = 64;

// `text` for an error message or a log line: at most `max_bytes` of it with
// control bytes, quotes and backslashes C-escaped (so it stays one line and
// cannot close a quote), followed by "...[N bytes]" when it was cut.
std::string EchoPrefix(absl::string_view text, size_t max_bytes = kEchoBytes);

// Free text the master keeps and logs (a group's error message): control
// bytes escaped ("\n" becomes the two characters \n), so it is one log
// line, and cut to at most `max_bytes` of the original with "...[N bytes]"
// appended when longer. Other bytes (UTF-8) are kept.
std::string SanitizeText(absl::string_view text, size_t max_bytes);

// Whether `text` holds an ASCII control byte (0x00-0x1f, 0x7f).
bool HasControlBytes(absl::string_view text);

// Checks every string field (not bytes) set in `message` and its
// submessages, map keys and values included: each at most `max_bytes`
// (else RESOURCE_EXHAUSTED, reason ERROR_REASON_LIMIT, naming the field,
// the limit and mpilearn-master --max_string_bytes) and free of control
// bytes (else INVALID_ARGUMENT, reason ERROR_REASON_INVALID_REQUEST).
// `path` prefixes the field names in messages ("spec" -> "spec.name").
absl::Status CheckStringFields(const google::protobuf::Message& message,
                               absl::string_view path, size_t max_bytes);

// The same check for one string field, named `field`.
absl::Status CheckStringField(absl::string_view field, absl::string_view value,
                              size_t max_bytes);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_BOUNDED_TEXT_H_
