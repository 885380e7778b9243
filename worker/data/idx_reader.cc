#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace worker {
namespace {

constexpr char kHint[] =
    "is this a gzip'd IDX file like train-images-idx3-ubyte.gz?";

// The IDX format allows up to 255 dimensions; anything past this is surely a
// file in another format.
constexpr int kMaxDims = 16;

// Data is read in chunks of this size, so memory follows the bytes actually
// present rather than what a (possibly corrupt) header claims. A multiple of
// every element size, so a chunk holds whole elements.
constexpr int64_t kReadChunkBytes = int64_t{1} << 20;
constexpr int64_t kConvertChunkBytes = kReadChunkBytes * 16;
constexpr int64_t kMaxInitialReserveElements = int64_t{16} << 20;

struct GzFileCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzFileCloser>;

// True when `code` is an element type code IDX defines.
bool IsIdxTypeCode(uint8_t code) {
  switch (code) {
    case 0x08: case 0x09: case 0x0B: case 0x0C: case 0x0D: case 0x0E:
      return true;
    default:
      return false;
  }
}

uint16_t BigEndian16(const uint8_t* b) {
  return static_cast<uint16_t>((uint16_t{b[0]} << 8) | uint16_t{b[1]});
}
uint32_t BigEndian32(const uint8_t* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}
uint64_t BigEndian64(const uint8_t* b) {
  return (uint64_t{BigEndian32(b)} << 32) | BigEndian32(b + 4);
}

// float64 to float32, saturating to +-inf: a plain cast of a value beyond
// float's range is undefined behaviour.
float NarrowDouble(double d) {
  if (d > std::numeric_limits<float>::max()) {
    return std::numeric_limits<float>::infinity();
  }
  if (d < std::numeric_limits<float>::lowest()) {
    return -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(d);
}

// Appends the `count` big-endian elements of `type` at `bytes` to `out` as
// floats.
void AppendConverted(IdxType type, const uint8_t* bytes, int64_t count,
                     std::vector<float>& out) {
  const size_t first = out.size();
  out.resize(first + count);
  float* dst = out.data() + first;
  switch (type) {
    case IdxType::kUnsignedByte:
      for (int64_t i = 0; i < count; ++i) dst[i] = bytes[i];
      break;
    case IdxType::kSignedByte:
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = static_cast<int8_t>(bytes[i]);
      }
      break;
    case IdxType::kInt16:
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = static_cast<int16_t>(BigEndian16(bytes + 2 * i));
      }
      break;
    case IdxType::kInt32:
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = static_cast<float>(
            static_cast<int32_t>(BigEndian32(bytes + 4 * i)));
      }
      break;
    case IdxType::kFloat32:
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t bits = BigEndian32(bytes + 4 * i);
        std::memcpy(&dst[i], &bits, sizeof(float));
      }
      break;
    case IdxType::kFloat64:
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t bits = BigEndian64(bytes + 8 * i);
        double d;
        std::memcpy(&d, &bits, sizeof(double));
        dst[i] = NarrowDouble(d);
      }
      break;
  }
}

// Reads up to `n` bytes into `buf`, stopping early only at end of file.
// Returns the number of bytes read.
absl::StatusOr<int64_t> ReadUpTo(gzFile f, const std::string& path,
                                 uint8_t* buf, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(
        std::min<int64_t>(n - done, kReadChunkBytes));
    const int got = gzread(f, buf + done, want);
    if (got < 0) {
      const int saved_errno = errno;
      int zerr = Z_OK;
      const char* msg = gzerror(f, &zerr);
      if (zerr == Z_ERRNO) {
        return absl::ErrnoToStatus(saved_errno,
                                   absl::StrCat("cannot read '", path, "'"));
      }
      return absl::DataLossError(absl::StrCat(
          "'", path, "' is corrupt: gzip: ", msg == nullptr ? "?" : msg));
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

// Describes why reading stopped short, for truncation messages: zlib reports
// a gzip stream cut off mid-way as an "unexpected end of file".
std::string GzipEofNote(gzFile f) {
  int zerr = Z_OK;
  const char* msg = gzerror(f, &zerr);
  if (zerr == Z_OK || msg == nullptr || *msg == '\0') return "";
  return absl::StrCat(" (gzip: ", msg, ")");
}

}  // namespace

absl::string_view IdxTypeName(IdxType type) {
  switch (type) {
    case IdxType::kUnsignedByte: return "unsigned byte";
    case IdxType::kSignedByte: return "signed byte";
    case IdxType::kInt16: return "int16";
    case IdxType::kInt32: return "int32";
    case IdxType::kFloat32: return "float32";
    case IdxType::kFloat64: return "float64";
  }
  return "unknown";
}

int IdxTypeBytes(IdxType type) {
  switch (type) {
    case IdxType::kUnsignedByte:
    case IdxType::kSignedByte:
      return 1;
    case IdxType::kInt16:
      return 2;
    case IdxType::kInt32:
    case IdxType::kFloat32:
      return 4;
    case IdxType::kFloat64:
      return 8;
  }
  return 1;
}

bool IsIntegerIdxType(IdxType type) {
  return type != IdxType::kFloat32 && type != IdxType::kFloat64;
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     int64_t max_items) {
  if (max_items < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reading '", path, "': max_items must be >= 0, got ", max_items));
  }
  errno = 0;
  GzFilePtr file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    // gzopen fails with errno 0 only when it cannot allocate its state.
    const int saved_errno = errno == 0 ? ENOMEM : errno;
    return absl::ErrnoToStatus(saved_errno,
                               absl::StrCat("cannot open '", path, "'"));
  }
  gzbuffer(file.get(), 256 * 1024);

  // Magic: 0x00 0x00 <element type> <number of dimensions>.
  uint8_t magic[4];
  MPILEARN_ASSIGN_OR_RETURN(const int64_t magic_read,
                            ReadUpTo(file.get(), path, magic, 4));
  if (magic_read < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not an IDX file: it has only ", magic_read,
        " bytes, fewer than the 4-byte magic number; ", kHint));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not an IDX file: it starts with bytes %02x %02x %02x %02x "
        "but an IDX file starts with 00 00 <type> <dims>; %s",
        path, magic[0], magic[1], magic[2], magic[3], kHint));
  }
  if (!IsIdxTypeCode(magic[2])) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' has unknown IDX element type code 0x%02X; %s", path, magic[2],
        kHint));
  }
  const IdxType type = static_cast<IdxType>(magic[2]);
  const int num_dims = magic[3];
  if (num_dims == 0 || num_dims > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' declares %d dimensions in its IDX header; 1 to %d are "
        "supported; %s",
        path, num_dims, kMaxDims, kHint));
  }

  // Dimensions: one big-endian uint32 each.
  std::vector<uint8_t> dim_bytes(4 * num_dims);
  MPILEARN_ASSIGN_OR_RETURN(
      const int64_t dims_read,
      ReadUpTo(file.get(), path, dim_bytes.data(), 4 * num_dims));
  if (dims_read < 4 * num_dims) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is truncated: its IDX header declares ", num_dims,
        " dimensions but the file ends after ", dims_read / 4, " of them",
        GzipEofNote(file.get())));
  }
  IdxArray result;
  result.type = type;
  result.dims.resize(num_dims);
  for (int i = 0; i < num_dims; ++i) {
    result.dims[i] = BigEndian32(&dim_bytes[4 * i]);
  }
  const std::string declared_dims =
      absl::StrCat("[", absl::StrJoin(result.dims, ", "), "]");
  if (max_items > 0 && max_items < result.dims[0]) {
    result.dims[0] = max_items;
  }
  int64_t total_elements = 1;
  for (const int64_t d : result.dims) {
    if (d != 0 && total_elements > kMaxIdxElements / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' declares dimensions ", declared_dims,
          ", more than the supported ", kMaxIdxElements, " elements; ",
          kHint));
    }
    total_elements *= d;
  }
  const int element_bytes = IdxTypeBytes(type);
  const int64_t total_bytes = total_elements * element_bytes;

  // Data: read and converted in chunks, so a header that overstates the
  // size costs no more memory than the bytes that are really there.
  result.values.reserve(
      std::min(total_elements, kMaxInitialReserveElements));
  std::vector<uint8_t> chunk(std::min(total_bytes, kConvertChunkBytes));
  int64_t bytes_read = 0;
  while (bytes_read < total_bytes) {
    const int64_t want = std::min(total_bytes - bytes_read, kConvertChunkBytes);
    MPILEARN_ASSIGN_OR_RETURN(
        const int64_t got, ReadUpTo(file.get(), path, chunk.data(), want));
    bytes_read += got;
    AppendConverted(type, chunk.data(), got / element_bytes, result.values);
    if (got < want) break;
  }
  if (bytes_read < total_bytes) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is truncated: its IDX header declares dimensions ",
        declared_dims,
        (max_items > 0
             ? absl::StrCat(" (reading the first ", result.dims[0], ")")
             : std::string()),
        ", which need ", total_bytes, " bytes of data (", IdxTypeName(type),
        ", ", element_bytes, (element_bytes == 1 ? " byte" : " bytes"),
        " each), but the file has only ",
        bytes_read, GzipEofNote(file.get()),
        "; the file may be an incomplete download"));
  }
  return result;
}

}  // namespace worker
}  // namespace mpilearn
