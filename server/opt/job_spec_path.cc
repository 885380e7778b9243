// Job-spec paths: protobuf reflection over v1::JobSpec (see the header).
#include "server/opt/job_spec_path.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mpilearn::opt {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::Value;

constexpr int kMaxListLength = 1024;

// The message holding the chain's last field, created on the way as needed.
Message* LeafParent(Message* root, const JobSpecPath& chain) {
  Message* message = root;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    message = message->GetReflection()->MutableMessage(message, chain[i]);
  }
  return message;
}

// What is wrong with `value` as one value of `field`'s type (an element for
// a repeated field), or "" when it fits.
std::string ElementProblem(const FieldDescriptor* field, const Value& value) {
  const std::string got = absl::StrCat(", got ", DescribeValue(value));
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      const auto [low, high] = IntegerLimits(field);
      const double x = value.number_value();
      if (value.kind_case() != Value::kNumberValue || !std::isfinite(x) ||
          x != std::floor(x) || x < low || x > high) {
        return absl::StrCat("expected a whole number in [", FormatNumber(low),
                            ", ", FormatNumber(high), "] for the ",
                            field->type_name(), " field", got);
      }
      return "";
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const double limit = field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT
                               ? FLT_MAX
                               : DBL_MAX;
      if (value.kind_case() != Value::kNumberValue ||
          !(std::abs(value.number_value()) <= limit)) {
        return absl::StrCat("expected a finite number for the ",
                            field->type_name(), " field", got);
      }
      return "";
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      if (value.kind_case() != Value::kBoolValue) {
        return absl::StrCat("expected true or false for the bool field", got);
      }
      return "";
    case FieldDescriptor::CPPTYPE_STRING:
      if (value.kind_case() != Value::kStringValue) {
        return absl::StrCat("expected a string for the string field", got);
      }
      return "";
    case FieldDescriptor::CPPTYPE_ENUM:
      if (value.kind_case() != Value::kStringValue ||
          field->enum_type()->FindValueByName(value.string_value()) ==
              nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < field->enum_type()->value_count(); ++i) {
          names.push_back(field->enum_type()->value(i)->name());
        }
        return absl::StrCat("expected one of ", absl::StrJoin(names, ", "),
                            " for the enum field", got);
      }
      return "";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // ResolveJobSpecPath refuses paths that end at messages
  }
  return "not a scalar field";
}

// Adds (repeated) or sets one element; `value` passed ElementProblem, or is
// a number for a numeric field.
void SetElement(Message* parent, const FieldDescriptor* field,
                const Value& value) {
  const Reflection* reflection = parent->GetReflection();
  const bool add = field->is_repeated();
  const double x = value.number_value();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      add ? reflection->AddInt32(parent, field, static_cast<int32_t>(x))
          : reflection->SetInt32(parent, field, static_cast<int32_t>(x));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      add ? reflection->AddInt64(parent, field, static_cast<int64_t>(x))
          : reflection->SetInt64(parent, field, static_cast<int64_t>(x));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      add ? reflection->AddUInt32(parent, field, static_cast<uint32_t>(x))
          : reflection->SetUInt32(parent, field, static_cast<uint32_t>(x));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      add ? reflection->AddUInt64(parent, field, static_cast<uint64_t>(x))
          : reflection->SetUInt64(parent, field, static_cast<uint64_t>(x));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      add ? reflection->AddDouble(parent, field, x)
          : reflection->SetDouble(parent, field, x);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      add ? reflection->AddFloat(parent, field, static_cast<float>(x))
          : reflection->SetFloat(parent, field, static_cast<float>(x));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      add ? reflection->AddBool(parent, field, value.bool_value())
          : reflection->SetBool(parent, field, value.bool_value());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      add ? reflection->AddString(parent, field, value.string_value())
          : reflection->SetString(parent, field, value.string_value());
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* enum_value =
          field->enum_type()->FindValueByName(value.string_value());
      if (enum_value == nullptr) break;  // refused by ElementProblem
      add ? reflection->AddEnum(parent, field, enum_value)
          : reflection->SetEnum(parent, field, enum_value);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // refused by ResolveJobSpecPath
  }
}

}  // namespace

bool IsIntegerField(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return true;
    default:
      return false;
  }
}

bool IsFloatingField(const FieldDescriptor* field) {
  return field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
         field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT;
}

std::pair<double, double> IntegerLimits(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return {std::numeric_limits<int32_t>::min(),
              std::numeric_limits<int32_t>::max()};
    case FieldDescriptor::CPPTYPE_UINT32:
      return {0, std::numeric_limits<uint32_t>::max()};
    case FieldDescriptor::CPPTYPE_UINT64:
      return {0, kMaxExactInteger};
    default:  // int64, float, double
      return {-kMaxExactInteger, kMaxExactInteger};
  }
}

std::string FieldTypeName(const FieldDescriptor* field) {
  std::string type = field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM
                         ? absl::StrCat("enum ", field->enum_type()->name())
                         : std::string(field->type_name());
  return field->is_repeated() ? absl::StrCat("repeated ", type) : type;
}

std::string FormatNumber(double x) {
  if (std::abs(x) <= kMaxExactInteger && x == std::floor(x)) {
    return absl::StrCat(static_cast<int64_t>(x));
  }
  return absl::StrFormat("%.12g", x);
}

std::string ShownPath(absl::string_view path) {
  constexpr size_t kShown = 64;
  if (path.size() <= kShown) return std::string(path);
  return absl::StrCat(path.substr(0, kShown), "...");
}

std::string DescribeValue(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNumberValue:
      return FormatNumber(value.number_value());
    case Value::kStringValue: {
      constexpr size_t kShown = 64;
      const std::string& s = value.string_value();
      return absl::StrCat("\"", s.substr(0, kShown),
                          s.size() > kShown ? "...\"" : "\"");
    }
    case Value::kBoolValue:
      return value.bool_value() ? "true" : "false";
    case Value::kListValue: {
      constexpr int kShown = 8;
      const auto& list = value.list_value().values();
      std::vector<std::string> parts;
      for (int i = 0; i < list.size() && i < kShown; ++i) {
        parts.push_back(DescribeValue(list[i]));
      }
      if (list.size() > kShown) parts.push_back("...");
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    case Value::kStructValue:
      return "an object";
    case Value::kNullValue:
    case Value::KIND_NOT_SET:
      break;
  }
  return "null";
}

bool ValuesEqual(const Value& a, const Value& b) {
  if (a.kind_case() != b.kind_case()) return false;
  switch (a.kind_case()) {
    case Value::kNumberValue:
      return a.number_value() == b.number_value();
    case Value::kStringValue:
      return a.string_value() == b.string_value();
    case Value::kBoolValue:
      return a.bool_value() == b.bool_value();
    case Value::kListValue: {
      const auto& x = a.list_value().values();
      const auto& y = b.list_value().values();
      if (x.size() != y.size()) return false;
      for (int i = 0; i < x.size(); ++i) {
        if (!ValuesEqual(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::kStructValue:
      return false;  // never a valid choice
    case Value::kNullValue:
    case Value::KIND_NOT_SET:
      break;
  }
  return true;
}

absl::StatusOr<JobSpecPath> ResolveJobSpecPath(absl::string_view path) {
  JobSpecPath chain;
  const Descriptor* message = v1::JobSpec::descriptor();
  std::string walked;  // the proto names so far, for messages
  for (absl::string_view segment : absl::StrSplit(path, '.')) {
    if (message == nullptr) {
      const FieldDescriptor* last = chain.back();
      return absl::InvalidArgumentError(absl::StrCat(
          walked, " is a ", FieldTypeName(last),
          " field, not a message; a path goes on only through message "
          "fields"));
    }
    if (segment.empty()) {
      return absl::InvalidArgumentError(
          "empty segment; join field names with single dots, e.g. "
          "optimizer.learning_rate");
    }
    const FieldDescriptor* found = nullptr;
    std::vector<std::string> names;
    for (int i = 0; i < message->field_count(); ++i) {
      const FieldDescriptor* field = message->field(i);
      names.push_back(field->name());
      if (field->name() == segment || field->json_name() == segment) {
        found = field;
      }
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no field '", ShownPath(segment), "' in ",
          walked.empty() ? "the job spec" : walked, " (", message->name(),
          "); its fields: ", absl::StrJoin(names, ", ")));
    }
    walked = walked.empty() ? found->name()
                            : absl::StrCat(walked, ".", found->name());
    chain.push_back(found);
    message = nullptr;
    if (found->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (found->is_repeated()) {
        return absl::InvalidArgumentError(
            absl::StrCat(walked,
                         " is a repeated message field; a path can name only "
                         "singular messages and scalar fields"));
      }
      message = found->message_type();
    }
  }
  if (message != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        walked, " is a message (", message->name(),
        "); name one of its fields, e.g. ", walked, ".",
        message->field_count() > 0 ? message->field(0)->name() : "..."));
  }
  if (chain.back()->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
      chain.back()->type() == FieldDescriptor::TYPE_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat(walked, " is a bytes field, which cannot be searched"));
  }
  return chain;
}

std::string CanonicalPath(const JobSpecPath& chain) {
  std::vector<std::string> names;
  for (const FieldDescriptor* field : chain) names.push_back(field->name());
  return absl::StrJoin(names, ".");
}

std::string ValueProblem(const FieldDescriptor* field, const Value& value) {
  if (!field->is_repeated()) return ElementProblem(field, value);
  if (value.kind_case() != Value::kListValue) {
    return absl::StrCat("expected a list for the ", FieldTypeName(field),
                        " field (it is replaced by the whole list), got ",
                        DescribeValue(value));
  }
  const auto& list = value.list_value().values();
  if (list.size() > kMaxListLength) {
    return absl::StrCat("a list of ", list.size(), " values; at most ",
                        kMaxListLength);
  }
  for (int i = 0; i < list.size(); ++i) {
    std::string problem = ElementProblem(field, list[i]);
    if (!problem.empty()) return absl::StrCat("element ", i, ": ", problem);
  }
  return "";
}

void SetJobSpecValue(v1::JobSpec* spec, const JobSpecPath& chain,
                     const Value& value) {
  Message* parent = LeafParent(spec, chain);
  const FieldDescriptor* field = chain.back();
  if (!field->is_repeated()) {
    SetElement(parent, field, value);
    return;
  }
  parent->GetReflection()->ClearField(parent, field);
  for (const Value& element : value.list_value().values()) {
    SetElement(parent, field, element);
  }
}

}  // namespace mpilearn::opt
