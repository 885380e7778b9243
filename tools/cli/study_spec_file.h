// Reading a study spec (v1::StudySpec) from the JSON or YAML file a user
// gives `mpilearn-opt create`.
//
//   absl::StatusOr<v1::StudySpec> spec = ReadStudySpecFile("study.yaml");
//   if (!spec.ok()) { /* "study.yaml: ..." names the field or the line */ }
//
// Both formats go through protobuf's JSON mapping, so they accept the same
// field names (as in proto/study.proto, or lowerCamelCase) and refuse the
// same unknown fields, naming them. A YAML document is first turned into
// JSON text: plain scalars that read as YAML 1.2 core-schema numbers,
// booleans or nulls become those, quoted scalars stay strings, so
// `learning_rate: 0.001` is a number and `algorithm: "sync"` a string.
// Pure functions apart from ReadStudySpecFile's read; thread-safe.
#ifndef MPILEARN_TOOLS_CLI_STUDY_SPEC_FILE_H_
#define MPILEARN_TOOLS_CLI_STUDY_SPEC_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

// The largest study spec file read (a spec is a few KiB; this bounds the
// memory a wrong path, e.g. a data file, can take).
inline constexpr int64_t kMaxStudySpecBytes = 1 << 20;

// The largest JSON text a YAML document may expand to: aliases can repeat
// a node many times (`*a` of `*a` ...), so the output is bounded too.
inline constexpr int64_t kMaxYamlJsonBytes = 4 << 20;

// How deeply YAML sequences and mappings may nest.
inline constexpr int kMaxYamlDepth = 64;

enum class StudySpecFormat { kJson, kYaml };

// The format a file name implies: ".json" is JSON, ".yaml" and ".yml" (any
// case) are YAML; anything else is InvalidArgument.
absl::StatusOr<StudySpecFormat> StudySpecFormatOf(absl::string_view path);

// One YAML document as JSON text (compact). InvalidArgument for a syntax
// error (with its line and column), several documents, an empty document,
// a non-string mapping key, an unsupported tag, or past kMaxYamlDepth /
// kMaxYamlJsonBytes.
absl::StatusOr<std::string> YamlToJson(absl::string_view yaml);

// Parses `text` in `format` into a StudySpec. Unknown fields and values of
// the wrong type are InvalidArgument naming the field. The spec is not
// normalized or checked beyond its shape (the master does that).
absl::StatusOr<v1::StudySpec> ParseStudySpec(absl::string_view text,
                                             StudySpecFormat format);

// Reads `path` (at most kMaxStudySpecBytes) and parses it in the format its
// name implies. Errors start with the path.
absl::StatusOr<v1::StudySpec> ReadStudySpecFile(const std::string& path);

// Checks the base job spec as the master will (NormalizeJobSpec on a copy),
// so a bad base fails before the study is sent. Errors start with "base: ".
absl::Status CheckBaseJobSpec(const v1::StudySpec& spec);

}  // namespace mpilearn::opt

#endif  // MPILEARN_TOOLS_CLI_STUDY_SPEC_FILE_H_
