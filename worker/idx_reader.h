// Reader for IDX files, the format MNIST and Fashion-MNIST ship in.
//
// An IDX file is a 4-byte magic number (two zero bytes, an element type code,
// the number of dimensions), one big-endian uint32 per dimension, then the
// elements in row-major order. Files may be gzip'd (as Debian's
// dataset-fashion-mnist ships them) or plain; both read the same.
//
//   MPILEARN_ASSIGN_OR_RETURN(
//       IdxArray labels,
//       ReadIdxFile("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"));
//   // labels.dims == {10000}, labels.data.size() == 10000
//
// Thread safety: ReadIdxFile has no shared state; call it from any thread.
#ifndef MPILEARN_WORKER_IDX_READER_H_
#define MPILEARN_WORKER_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mpilearn {
namespace worker {

// An unsigned-byte IDX array.
struct IdxArray {
  // Size of each dimension, outermost (items) first; never empty.
  std::vector<int64_t> dims;
  // The elements in row-major order; data.size() is the product of dims.
  std::vector<uint8_t> data;
};

// Reads the IDX file at `path`, gzip'd or plain. Only element type 0x08
// (unsigned byte) is supported. With `max_items` > 0 only the first
// `max_items` items along dimension 0 are read (dims[0] is lowered to match),
// so a subset of a large file costs only its own bytes. Bytes after the data
// the header describes are ignored.
//
// Errors (each message names `path`):
//   NotFound / PermissionDenied / ...  the file cannot be opened (from errno);
//   InvalidArgument  bad magic, zero or too many dimensions, an unsupported
//                    element type, or max_items < 0;
//   DataLoss         the header or the data is shorter than the header says,
//                    or the gzip stream is corrupt.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     int64_t max_items = 0);

}  // namespace worker
}  // namespace mpilearn

#endif  // MPILEARN_WORKER_IDX_READER_H_
