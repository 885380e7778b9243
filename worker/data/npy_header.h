// The .npy array format (numpy.lib.format) as the NumPy reader needs it:
// where an array's bytes come from (NpyBytes: a whole .npy file, or one
// member of a .npz archive), and the header that says what they hold
// (magic "\x93NUMPY", version 1 to 3, a Python dict literal with 'descr',
// 'fortran_order' and 'shape'), checked against the bytes' size.
//
// Private to the data_file library (numpy_file.cc). Errors name the array
// (NpyArray::what): InvalidArgument for what is not a supported .npy array
// (a big-endian, structured, Fortran-order or 0-dimensional one, an
// unsupported dtype), DataLoss for truncated bytes. An NpyArray is used by
// one thread at a time.
#ifndef MPILEARN_WORKER_DATA_NPY_HEADER_H_
#define MPILEARN_WORKER_DATA_NPY_HEADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {

// Little-endian integers, as .npy headers and ZIP records store them.
inline uint16_t Le16(const unsigned char* b) {
  return static_cast<uint16_t>(b[0] | (b[1] << 8));
}
inline uint32_t Le32(const unsigned char* b) {
  return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) |
         (uint32_t{b[3]} << 24);
}
inline uint64_t Le64(const unsigned char* b) {
  return uint64_t{Le32(b)} | (uint64_t{Le32(b + 4)} << 32);
}

// The bytes of one .npy array (a whole .npy file or one .npz member).
class NpyBytes {
 public:
  virtual ~NpyBytes() = default;
  // Size of the .npy bytes (header and data).
  virtual int64_t size() const = 0;
  // Reads `n` bytes at `offset` (from the start of the .npy bytes); the
  // caller keeps offset + n <= size().
  virtual absl::Status ReadAt(int64_t offset, int64_t n, void* dst) = 0;
  // ReadAt for the header, which may spare work the data needs.
  virtual absl::Status ReadHeaderAt(int64_t offset, int64_t n, void* dst) {
    return ReadAt(offset, n, dst);
  }
  // Says the header has been read: what ReadHeaderAt kept can go.
  virtual void HeaderDone() {}
};

// One array of a NumPy file: where its bytes are and what they hold.
struct NpyArray {
  std::string what;  // for messages: "'x.npy'" or "'x.npz' member 'f.npy'"
  std::unique_ptr<NpyBytes> bytes;
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> shape;  // [rows, ...]
  int64_t data_offset = 0;     // from the start of `bytes`
  int64_t row_bytes = 0;
};

// Reads and checks the header of the .npy bytes in `array->bytes`, filling
// the rest of `array`.
absl::Status ReadNpyHeader(NpyArray* array);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_NPY_HEADER_H_
