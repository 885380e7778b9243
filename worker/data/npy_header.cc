// ReadNpyHeader (npy_header.h): the .npy header's dict literal parsed by
// hand (only the three keys numpy writes), and its dtype mapped to an
// ElementType.
#include "worker/data/npy_header.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr int64_t kNpyMagicBytes = 6;
// A real header is a few hundred bytes; anything past this is not one.
constexpr int64_t kMaxHeaderBytes = int64_t{1} << 20;
// Bounds the element count, so byte counts never overflow int64.
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr int kMaxRank = 32;

// A parsed .npy header.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the header's Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    if (!Consume('{')) return Error("expected '{'");
    while (!Consume('}')) {
      std::string key;
      if (!String(&key)) return Error("expected a quoted key");
      if (!Consume(':')) return Error("expected ':'");
      if (key == "descr") {
        if (Peek() == '[') {
          return Error(
              "'descr' is a list: structured arrays are not supported");
        }
        if (!String(&header.descr)) return Error("'descr' is not a string");
        has_descr = true;
      } else if (key == "fortran_order") {
        if (Word("True")) {
          header.fortran_order = true;
        } else if (!Word("False")) {
          return Error("'fortran_order' is not True or False");
        }
        has_order = true;
      } else if (key == "shape") {
        if (!Shape(&header.shape)) {
          return Error("'shape' is not a tuple of non-negative integers");
        }
        has_shape = true;
      } else {
        return Error(absl::StrCat("unexpected key '", key, "'"));
      }
      if (!Consume(',')) {
        if (!Consume('}')) return Error("expected ',' or '}'");
        break;
      }
    }
    if (!has_descr || !has_order || !has_shape) {
      return Error("it lacks one of 'descr', 'fortran_order' and 'shape'");
    }
    return header;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("its header is not a NumPy header dict: ", what,
                     " at character ", pos_));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  char Peek() {
    SkipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool Word(absl::string_view word) {
    SkipSpace();
    if (!absl::StartsWith(text_.substr(pos_), word)) return false;
    pos_ += word.size();
    return true;
  }
  bool String(std::string* out) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return false;
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    *out = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return true;
  }
  bool Integer(int64_t* out) {
    SkipSpace();
    const size_t begin = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) {
      if (value > kMaxElements) return false;  // Refused later anyway.
      value = value * 10 + (text_[pos_] - '0');
      ++pos_;
    }
    if (pos_ == begin) return false;
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2.
    *out = value;
    return true;
  }
  // A tuple: (), (3,), (3, 4) or (3, 4,).
  bool Shape(std::vector<int64_t>* out) {
    if (!Consume('(')) return false;
    while (!Consume(')')) {
      int64_t dim = 0;
      if (!Integer(&dim) || out->size() >= kMaxRank) return false;
      out->push_back(dim);
      if (!Consume(',')) return Consume(')');
    }
    return true;
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

// The element type and size that a little-endian descr names.
absl::StatusOr<std::pair<ElementType, int64_t>> TypeOfDescr(
    const std::string& what, const std::string& descr) {
  if (descr.size() >= 2 && descr[0] == '>' && descr != ">u1" &&
      descr != ">i1") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds a big-endian array (dtype '", descr,
                     "'); big-endian arrays are not supported; save with "
                     "arr.astype('<",
                     descr.substr(1), "')"));
  }
  // One-byte types have no byte order: numpy writes '|', any mark is fine.
  const std::string kind =
      descr.size() >= 2 && (descr[0] == '<' || descr[0] == '|' ||
                            descr[0] == '=' || descr[0] == '>')
          ? descr.substr(1)
          : descr;
  const bool one_byte = kind == "u1" || kind == "i1";
  if (!one_byte && descr[0] == '|' &&
      (kind == "i2" || kind == "i4" || kind == "i8" || kind == "f4" ||
       kind == "f8")) {
    // '|' on a multi-byte type: not something numpy writes.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has dtype '", descr, "' with no byte order"));
  }
  if (kind == "u1") return std::make_pair(ElementType::kUint8, int64_t{1});
  if (kind == "i1") return std::make_pair(ElementType::kInt8, int64_t{1});
  if (kind == "i2") return std::make_pair(ElementType::kInt16, int64_t{2});
  if (kind == "i4") return std::make_pair(ElementType::kInt32, int64_t{4});
  if (kind == "i8") return std::make_pair(ElementType::kInt64, int64_t{8});
  if (kind == "f4") return std::make_pair(ElementType::kFloat32, int64_t{4});
  if (kind == "f8") return std::make_pair(ElementType::kFloat64, int64_t{8});
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has dtype '", descr,
      "', which is not supported: use float32 ('<f4'), float64 ('<f8'), "
      "uint8 ('|u1'), int8 ('|i1'), int16 ('<i2'), int32 ('<i4') or int64 "
      "('<i8'), e.g. arr.astype('<f4')",
      kind == "b1" ? " (booleans: arr.astype('u1'))" : ""));
}

}  // namespace

absl::Status ReadNpyHeader(NpyArray* array) {
  NpyBytes& bytes = *array->bytes;
  const std::string& what = array->what;
  unsigned char prefix[12];
  if (bytes.size() < 10) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a NumPy .npy array: it holds only ",
                     bytes.size(), " bytes"));
  }
  MPILEARN_RETURN_IF_ERROR(bytes.ReadHeaderAt(0, 10, prefix));
  if (std::memcmp(prefix, kNpyMagic, kNpyMagicBytes) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " is not a NumPy .npy array: it does not start with "
                     "\"\\x93NUMPY\""));
  }
  const int major = prefix[6];
  int64_t header_begin = 10;
  int64_t header_bytes = Le16(prefix + 8);
  if (major == 2 || major == 3) {
    if (bytes.size() < 12) {
      return absl::DataLossError(absl::StrCat(what, " is truncated"));
    }
    MPILEARN_RETURN_IF_ERROR(bytes.ReadHeaderAt(0, 12, prefix));
    header_begin = 12;
    header_bytes = Le32(prefix + 8);
  } else if (major != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is a .npy file of format version ", major,
                     "; versions 1, 2 and 3 are supported"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has a .npy header of ", header_bytes,
                     " bytes; at most ", kMaxHeaderBytes, " are accepted"));
  }
  if (header_begin + header_bytes > bytes.size()) {
    return absl::DataLossError(absl::StrCat(
        what, " is truncated: its .npy header ends past its last byte"));
  }
  std::string text(static_cast<size_t>(header_bytes), '\0');
  MPILEARN_RETURN_IF_ERROR(
      bytes.ReadHeaderAt(header_begin, header_bytes, text.data()));
  bytes.HeaderDone();
  absl::StatusOr<NpyHeader> header = HeaderParser(text).Parse();
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", header.status().message()));
  }
  MPILEARN_ASSIGN_OR_RETURN(auto type_and_size,
                            TypeOfDescr(what, header->descr));
  if (header->shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds a 0-dimensional array; data needs rows [N, ...]"));
  }
  if (header->fortran_order && header->shape.size() >= 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " is stored in Fortran order; save C-order: "
                     "np.save(path, np.ascontiguousarray(arr))"));
  }
  int64_t elements = 1;
  for (const int64_t dim : header->shape) {
    if (dim > kMaxElements || (dim > 0 && elements > kMaxElements / dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " claims shape (", absl::StrJoin(header->shape, ", "),
          "), more than ", kMaxElements, " elements"));
    }
    elements *= dim;
  }
  if (elements > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " claims more than ", kMaxElements, " elements"));
  }
  array->type = type_and_size.first;
  array->shape = std::move(header->shape);
  array->data_offset = header_begin + header_bytes;
  int64_t row_elements = 1;
  for (size_t i = 1; i < array->shape.size(); ++i) {
    row_elements *= array->shape[i];
  }
  array->row_bytes = row_elements * type_and_size.second;
  const int64_t need = array->data_offset + elements * type_and_size.second;
  if (bytes.size() < need) {
    return absl::DataLossError(absl::StrCat(
        what, " is truncated: shape (", absl::StrJoin(array->shape, ", "),
        ") of ", ElementTypeName(array->type), " needs ", need,
        " bytes but it holds ", bytes.size()));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::worker
