#include "tools/cli/study_spec_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace mpilearn::opt {
namespace {

// yaml-cpp's tags: "?" for a plain scalar (resolved by its text), "!" for a
// quoted or block scalar (a string), and "tag:yaml.org,2002:..." for an
// explicit `!!str`, `!!int`... tag. Collections carry "?" unless tagged.
constexpr char kPlainTag[] = "?";
constexpr char kNonSpecificTag[] = "!";
constexpr char kYamlTagPrefix[] = "tag:yaml.org,2002:";

bool AllOf(absl::string_view text, bool (*accept)(unsigned char)) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!accept(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool IsDigit(unsigned char c) { return absl::ascii_isdigit(c); }
bool IsOctalDigit(unsigned char c) { return c >= '0' && c <= '7'; }
bool IsHexDigit(unsigned char c) { return absl::ascii_isxdigit(c); }

absl::string_view WithoutSign(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+'))
    text.remove_prefix(1);
  return text;
}

// YAML 1.2 core schema: [-+]?[0-9]+
bool IsDecimalInt(absl::string_view text) {
  return AllOf(WithoutSign(text), IsDigit);
}

// YAML 1.2 core schema: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsDecimalFloat(absl::string_view text) {
  text = WithoutSign(text);
  size_t i = 0;
  const size_t int_digits_start = i;
  while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
  const bool int_digits = i > int_digits_start;
  bool frac_digits = false;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t start = i;
    while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
    frac_digits = i > start;
  }
  if (!int_digits && !frac_digits) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    const size_t start = i;
    while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
    if (i == start) return false;
  }
  return i == text.size();
}

bool IsOneOf(absl::string_view text,
             std::initializer_list<absl::string_view> options) {
  for (absl::string_view option : options) {
    if (text == option) return true;
  }
  return false;
}

bool IsNullText(absl::string_view text) {
  return IsOneOf(text, {"", "~", "null", "Null", "NULL"});
}

// The shortest of %.15g, %.16g, %.17g that reads back as `value` (finite).
std::string ExactJsonNumber(double value) {
  std::string text;
  for (int digits = 15; digits <= 17; ++digits) {
    text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) break;
  }
  return text;
}

// A double as JSON: protobuf's JSON mapping spells the non-finite values as
// the strings "Infinity", "-Infinity" and "NaN".
std::string JsonDouble(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return ExactJsonNumber(value);
}

void AppendJsonString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrFormat(" (line %d, column %d)", mark.line + 1,
                         mark.column + 1);
}

// The JSON value a scalar in the YAML 1.2 core schema stands for, or an
// error for text that does not fit an explicit `!!int`, `!!float`, `!!bool`
// or `!!null` tag.
absl::StatusOr<std::string> PlainScalarJson(absl::string_view text,
                                            absl::string_view tag,
                                            const YAML::Node& node) {
  const bool any = tag == kPlainTag;
  const bool want_int = any || tag == "int";
  const bool want_float = any || tag == "float";
  if (want_int || want_float) {
    if (IsDecimalInt(text)) {
      int64_t value;
      if (absl::SimpleAtoi(text, &value)) return absl::StrCat(value);
      // Past int64: a double, as JSON would read it.
      return JsonDouble(std::strtod(std::string(text).c_str(), nullptr));
    }
    const bool octal = absl::StartsWith(text, "0o");
    const bool hex = absl::StartsWith(text, "0x");
    if ((octal && AllOf(text.substr(2), IsOctalDigit)) ||
        (hex && AllOf(text.substr(2), IsHexDigit))) {
      const std::string digits(text.substr(2));
      errno = 0;
      const unsigned long long value =
          std::strtoull(digits.c_str(), nullptr, octal ? 8 : 16);
      if (errno == 0 && value <= static_cast<unsigned long long>(INT64_MAX)) {
        return absl::StrCat(value);
      }
    }
  }
  if (want_float) {
    if (IsDecimalFloat(text)) {
      return JsonDouble(std::strtod(std::string(text).c_str(), nullptr));
    }
    absl::string_view unsigned_text = WithoutSign(text);
    if (IsOneOf(unsigned_text, {".inf", ".Inf", ".INF"})) {
      return std::string(text[0] == '-' ? "\"-Infinity\"" : "\"Infinity\"");
    }
    if (IsOneOf(text, {".nan", ".NaN", ".NAN"})) return std::string("\"NaN\"");
  }
  if (any || tag == "bool") {
    if (IsOneOf(text, {"true", "True", "TRUE"})) return std::string("true");
    if (IsOneOf(text, {"false", "False", "FALSE"})) return std::string("false");
  }
  if ((any || tag == "null") && IsNullText(text)) return std::string("null");
  if (any) {
    std::string json;
    AppendJsonString(text, &json);
    return json;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "'", Where(node), " is not a valid !!", tag));
}

// Appends `node` as JSON to `out`; `depth` counts the sequences and
// mappings around it.
absl::Status AppendNodeJson(const YAML::Node& node, int depth,
                            std::string* out) {
  if (static_cast<int64_t>(out->size()) > kMaxYamlJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("expands to more than ", kMaxYamlJsonBytes,
                     " bytes of JSON (aliases repeating large nodes?)"));
  }
  // The tag without yaml.org's prefix: "str", "int", ...; "?" and "!" stay.
  absl::string_view tag = node.Tag();
  const bool core_tag = absl::ConsumePrefix(&tag, kYamlTagPrefix);
  if (tag.empty()) tag = kPlainTag;
  if (!tag.empty() && tag != kPlainTag && tag != kNonSpecificTag &&
      !(core_tag &&
        IsOneOf(tag, {"str", "int", "float", "bool", "null", "seq", "map"}))) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tag '", node.Tag(), "'", Where(node)));
  }
  if (node.IsSequence() || node.IsMap()) {
    if (depth >= kMaxYamlDepth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nested more than ", kMaxYamlDepth, " levels deep", Where(node)));
    }
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out->append("null");
      return absl::OkStatus();
    case YAML::NodeType::Scalar: {
      if (tag == kNonSpecificTag || tag == "str") {
        AppendJsonString(node.Scalar(), out);
        return absl::OkStatus();
      }
      if (tag == "seq" || tag == "map") {
        return absl::InvalidArgumentError(
            absl::StrCat("a scalar tagged !!", tag, Where(node)));
      }
      MPILEARN_ASSIGN_OR_RETURN(std::string json,
                                PlainScalarJson(node.Scalar(), tag, node));
      out->append(json);
      return absl::OkStatus();
    }
    case YAML::NodeType::Sequence: {
      out->push_back('[');
      bool first = true;
      for (const YAML::Node& item : node) {
        if (!first) out->push_back(',');
        first = false;
        MPILEARN_RETURN_IF_ERROR(AppendNodeJson(item, depth + 1, out));
      }
      out->push_back(']');
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      out->push_back('{');
      std::set<std::string> keys;
      bool first = true;
      for (const auto& entry : node) {
        const YAML::Node& key = entry.first;
        if (!key.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat("a mapping key that is not a string", Where(key)));
        }
        if (!keys.insert(key.Scalar()).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("duplicate key '", key.Scalar(), "'", Where(key)));
        }
        if (!first) out->push_back(',');
        first = false;
        AppendJsonString(key.Scalar(), out);
        out->push_back(':');
        MPILEARN_RETURN_IF_ERROR(AppendNodeJson(entry.second, depth + 1, out));
      }
      out->push_back('}');
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown YAML node type");
}

absl::StatusOr<v1::StudySpec> ParseStudySpecJson(const std::string& json) {
  v1::StudySpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid study spec: ", std::string(status.message()),
                     " (fields: proto/study.proto's StudySpec; docs/opt.md)"));
  }
  return spec;
}

}  // namespace

absl::StatusOr<StudySpecFormat> StudySpecFormatOf(absl::string_view path) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".json")) return StudySpecFormat::kJson;
  if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    return StudySpecFormat::kYaml;
  }
  return absl::InvalidArgumentError(
      "a study spec file's name ends in .json, .yaml or .yml");
}

absl::StatusOr<std::string> YamlToJson(absl::string_view yaml) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(yaml));
  } catch (const YAML::Exception& e) {
    // e.what() is "yaml-cpp: error at line L, column C: MESSAGE".
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid YAML at line %d, column %d: %s",
                        e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (documents.empty() || documents[0].IsNull()) {
    return absl::InvalidArgumentError("the YAML document is empty");
  }
  if (documents.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("one YAML document expected, found ", documents.size(),
                     " (separated by ---)"));
  }
  std::string json;
  try {
    MPILEARN_RETURN_IF_ERROR(AppendNodeJson(documents[0], 0, &json));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", e.msg));
  }
  return json;
}

absl::StatusOr<v1::StudySpec> ParseStudySpec(absl::string_view text,
                                             StudySpecFormat format) {
  if (format == StudySpecFormat::kJson) {
    return ParseStudySpecJson(std::string(text));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::string json, YamlToJson(text));
  if (!absl::StartsWith(json, "{")) {
    return absl::InvalidArgumentError(
        "a study spec is a mapping of its fields (name, base, parameters, "
        "objective, ...)");
  }
  return ParseStudySpecJson(json);
}

absl::StatusOr<v1::StudySpec> ReadStudySpecFile(const std::string& path) {
  auto with_path = [&path](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat(path, ": ", status.message()));
  };
  absl::StatusOr<StudySpecFormat> format = StudySpecFormatOf(path);
  if (!format.ok()) return with_path(format.status());
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return with_path(absl::NotFoundError(
        absl::StrCat("cannot read: ", std::strerror(errno))));
  }
  if (!S_ISREG(info.st_mode)) {
    return with_path(absl::InvalidArgumentError("not a regular file"));
  }
  if (info.st_size > kMaxStudySpecBytes) {
    return with_path(absl::InvalidArgumentError(
        absl::StrCat("is ", info.st_size, " bytes; a study spec is at most ",
                     kMaxStudySpecBytes, " bytes")));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return with_path(absl::NotFoundError(
        absl::StrCat("cannot read: ", std::strerror(errno))));
  }
  // Read one byte past the bound, in case the file grew since the stat.
  std::string text(static_cast<size_t>(kMaxStudySpecBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    return with_path(absl::DataLossError("read error"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxStudySpecBytes) {
    return with_path(absl::InvalidArgumentError(absl::StrCat(
        "is over ", kMaxStudySpecBytes, " bytes, the most a study spec has")));
  }
  absl::StatusOr<v1::StudySpec> spec = ParseStudySpec(text, *format);
  if (!spec.ok()) return with_path(spec.status());
  return spec;
}

absl::Status CheckBaseJobSpec(const v1::StudySpec& spec) {
  if (!spec.has_base()) {
    return absl::InvalidArgumentError(
        "base: missing; a study needs the job spec its trials start from");
  }
  v1::JobSpec base = spec.base();
  const absl::Status status = NormalizeJobSpec(&base);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("base: ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::opt
