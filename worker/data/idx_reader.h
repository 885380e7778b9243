// Reader for IDX files, the format MNIST and Fashion-MNIST ship in.
//
// An IDX file is a 4-byte magic number (two zero bytes, an element type code,
// the number of dimensions), one big-endian uint32 per dimension, then the
// elements in row-major order, each big-endian. Every element type IDX
// defines is read: unsigned and signed bytes, int16, int32, float32 and
// float64. Files may be gzip'd (as Debian's dataset-fashion-mnist ships
// them) or plain; both read the same.
//
//   MPILEARN_ASSIGN_OR_RETURN(
//       IdxArray labels,
//       ReadIdxFile("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"));
//   // labels.type == IdxType::kUnsignedByte, labels.dims == {10000},
//   // labels.values.size() == 10000, each a class index 0..9
//
// Thread safety: ReadIdxFile and the IdxType helpers have no shared state;
// call them from any thread.
#ifndef MPILEARN_WORKER_DATA_IDX_READER_H_
#define MPILEARN_WORKER_DATA_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mpilearn {
namespace worker {

// IDX element types; each value is the type's code, the third byte of the
// magic number.
enum class IdxType : uint8_t {
  kUnsignedByte = 0x08,
  kSignedByte = 0x09,
  kInt16 = 0x0B,
  kInt32 = 0x0C,
  kFloat32 = 0x0D,
  kFloat64 = 0x0E,
};

// The type's name in messages: "unsigned byte", "signed byte", "int16",
// "int32", "float32" or "float64".
absl::string_view IdxTypeName(IdxType type);

// Bytes per element in the file: 1, 2, 4 or 8.
int IdxTypeBytes(IdxType type);

// True for the four integer types, false for float32 and float64.
bool IsIntegerIdxType(IdxType type);

// An IDX array of any element type, its elements converted to float.
struct IdxArray {
  // The element type in the file.
  IdxType type = IdxType::kUnsignedByte;
  // Size of each dimension, outermost (items) first; never empty.
  std::vector<int64_t> dims;
  // The elements in row-major order, values.size() being the product of
  // dims. Exact for the byte types, int16, and int32 within +-2^24; other
  // int32 values and float64 values are rounded to the nearest float, and
  // float64 values beyond float's range become +-inf.
  std::vector<float> values;
};

// Refuse headers that describe more elements than this (2^34), rather than
// overflow or try to allocate them.
inline constexpr int64_t kMaxIdxElements = int64_t{1} << 34;

// Reads the IDX file at `path`, gzip'd or plain. With `max_items` > 0 only
// the first `max_items` items along dimension 0 are read (dims[0] is lowered
// to match), so a subset of a large file costs only its own bytes. Bytes
// after the data the header describes are ignored. Memory follows the bytes
// actually present, not what the header claims.
//
// Errors (each message names `path`):
//   NotFound / PermissionDenied / ...  the file cannot be opened (from errno);
//   InvalidArgument  bad magic, zero or too many dimensions, an unknown
//                    element type, more than kMaxIdxElements elements, or
//                    max_items < 0;
//   DataLoss         the header or the data is shorter than the header says,
//                    or the gzip stream is corrupt.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     int64_t max_items = 0);

}  // namespace worker
}  // namespace mpilearn

#endif  // MPILEARN_WORKER_DATA_IDX_READER_H_
