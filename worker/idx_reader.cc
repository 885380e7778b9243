#include "worker/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
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

// Refuse headers that describe more data than this, rather than overflow.
constexpr int64_t kMaxDataBytes = int64_t{1} << 40;

// Data is read in chunks of this size, so memory follows the bytes actually
// present rather than what a (possibly corrupt) header claims.
constexpr int64_t kReadChunkBytes = int64_t{1} << 20;
constexpr int64_t kMaxInitialReserveBytes = int64_t{64} << 20;

constexpr uint8_t kTypeUnsignedByte = 0x08;

struct GzFileCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzFileCloser>;

// Name of an IDX element type code, or nullptr for a code IDX does not define.
const char* ElementTypeName(uint8_t code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
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
  const uint8_t type = magic[2];
  if (type != kTypeUnsignedByte) {
    const char* name = ElementTypeName(type);
    if (name == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' has unknown IDX element type code 0x%02X; %s", path, type,
          kHint));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' has IDX element type code 0x%02X (%s), which is not supported; "
        "only 0x08 (unsigned byte) is",
        path, type, name));
  }
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
  result.dims.resize(num_dims);
  int64_t total_bytes = 1;
  for (int i = 0; i < num_dims; ++i) {
    const uint8_t* b = &dim_bytes[4 * i];
    result.dims[i] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) |
                     (int64_t{b[2]} << 8) | int64_t{b[3]};
  }
  const std::string declared_dims =
      absl::StrCat("[", absl::StrJoin(result.dims, ", "), "]");
  if (max_items > 0 && max_items < result.dims[0]) {
    result.dims[0] = max_items;
  }
  for (const int64_t d : result.dims) {
    if (d != 0 && total_bytes > kMaxDataBytes / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' declares dimensions ", declared_dims,
          ", more than the supported ", kMaxDataBytes, " bytes; ", kHint));
    }
    total_bytes *= d;
  }

  // Data: read in chunks so a header that overstates the size costs no more
  // memory than the bytes that are really there.
  result.data.reserve(std::min(total_bytes, kMaxInitialReserveBytes));
  while (static_cast<int64_t>(result.data.size()) < total_bytes) {
    const int64_t have = result.data.size();
    const int64_t want =
        std::min(total_bytes - have, kReadChunkBytes * 16);
    result.data.resize(have + want);
    MPILEARN_ASSIGN_OR_RETURN(
        const int64_t got,
        ReadUpTo(file.get(), path, result.data.data() + have, want));
    result.data.resize(have + got);
    if (got < want) break;
  }
  if (static_cast<int64_t>(result.data.size()) < total_bytes) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is truncated: its IDX header declares dimensions ",
        declared_dims, (max_items > 0 ? absl::StrCat(" (reading the first ",
                                                     result.dims[0], ")")
                                      : std::string()),
        ", which need ", total_bytes, " bytes of data, but the file has only ",
        result.data.size(), GzipEofNote(file.get()),
        "; the file may be an incomplete download"));
  }
  return result;
}

}  // namespace worker
}  // namespace mpilearn
