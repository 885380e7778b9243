#include "common/bounded_text.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"

namespace mpilearn {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

// "...[N bytes]" when `text` was cut to `kept` bytes, else nothing.
std::string CutNote(absl::string_view text, size_t kept) {
  if (kept >= text.size()) return "";
  return absl::StrCat("...[", text.size(), " bytes]");
}

// The index of the first control byte, or npos.
size_t FirstControl(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (IsControl(static_cast<unsigned char>(text[i]))) return i;
  }
  return absl::string_view::npos;
}

}  // namespace

std::string EchoPrefix(absl::string_view text, size_t max_bytes) {
  const absl::string_view kept = text.substr(0, max_bytes);
  return absl::StrCat(absl::CHexEscape(kept), CutNote(text, kept.size()));
}

std::string SanitizeText(absl::string_view text, size_t max_bytes) {
  const absl::string_view kept = text.substr(0, max_bytes);
  std::string out;
  out.reserve(kept.size());
  for (char c : kept) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (!IsControl(byte)) {
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += absl::CHexEscape(absl::string_view(&c, 1));
    }
  }
  out += CutNote(text, kept.size());
  return out;
}

bool HasControlBytes(absl::string_view text) {
  return FirstControl(text) != absl::string_view::npos;
}

absl::Status CheckStringField(absl::string_view field, absl::string_view value,
                              size_t max_bytes) {
  if (value.size() > max_bytes) {
    return LimitError(absl::StrCat(
        field, " is ", value.size(), " bytes ('", EchoPrefix(value),
        "'); this master takes strings of at most ", max_bytes,
        " bytes (mpilearn-master --max_string_bytes)"));
  }
  const size_t control = FirstControl(value);
  if (control != absl::string_view::npos) {
    return InvalidRequestError(absl::StrCat(
        field, " holds a control character (byte ", control, " of '",
        EchoPrefix(value), "'); names, labels, hosts and paths must be "
        "printable text"));
  }
  return absl::OkStatus();
}

absl::Status CheckStringFields(const google::protobuf::Message& message,
                               absl::string_view path, size_t max_bytes) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  std::string scratch;
  for (const FieldDescriptor* field : fields) {
    const std::string name =
        path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (field->is_repeated()) {
        const int n = reflection->FieldSize(message, field);
        for (int i = 0; i < n; ++i) {
          const std::string& value = reflection->GetRepeatedStringReference(
              message, field, i, &scratch);
          MPILEARN_RETURN_IF_ERROR(CheckStringField(
              absl::StrCat(name, "[", i, "]"), value, max_bytes));
        }
      } else {
        MPILEARN_RETURN_IF_ERROR(CheckStringField(
            name, reflection->GetStringReference(message, field, &scratch),
            max_bytes));
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        const int n = reflection->FieldSize(message, field);
        for (int i = 0; i < n; ++i) {
          // A map's entries are named by the map ("metrics.key").
          MPILEARN_RETURN_IF_ERROR(CheckStringFields(
              reflection->GetRepeatedMessage(message, field, i),
              field->is_map() ? name : absl::StrCat(name, "[", i, "]"),
              max_bytes));
        }
      } else {
        MPILEARN_RETURN_IF_ERROR(CheckStringFields(
            reflection->GetMessage(message, field), name, max_bytes));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mpilearn
