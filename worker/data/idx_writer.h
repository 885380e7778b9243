// Writer for gzip'd IDX files (the format idx_reader.h reads): the header at
// Open, then the elements streamed in row-major order, float32 (written
// big-endian) or unsigned bytes, so a file of any size is written without
// holding it in memory.
//
//   IdxGzWriter labels;
//   MPILEARN_RETURN_IF_ERROR(
//       labels.Open("/tmp/train-labels.idx.gz", IdxType::kUnsignedByte, {n}));
//   MPILEARN_RETURN_IF_ERROR(labels.Append(absl::MakeConstSpan(bytes)));
//   MPILEARN_RETURN_IF_ERROR(labels.Close());
//
// Call order: Open, Append any number of times, Close, which fails with
// Internal unless exactly the declared number of elements (the product of
// dims) came. Errors name the file: from errno when it cannot be created or
// written, DataLoss for a gzip failure. Not thread-safe: one thread uses a
// writer.
#ifndef MPILEARN_WORKER_DATA_IDX_WRITER_H_
#define MPILEARN_WORKER_DATA_IDX_WRITER_H_

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/data/idx_reader.h"

namespace mpilearn::worker {

class IdxGzWriter {
 public:
  // Creates (or truncates) `path` and writes the header of an array of
  // `type` (kFloat32 or kUnsignedByte) and shape `dims`.
  absl::Status Open(const std::string& path, IdxType type,
                    const std::vector<int64_t>& dims);

  // Appends float32 elements (type kFloat32), big-endian.
  absl::Status Append(absl::Span<const float> values);
  // Appends unsigned byte elements (type kUnsignedByte).
  absl::Status Append(absl::Span<const uint8_t> values);

  // Finishes the file.
  absl::Status Close();

  const std::string& path() const { return path_; }
  IdxType type() const { return type_; }
  const std::vector<int64_t>& dims() const { return dims_; }

 private:
  struct GzFileCloser {
    void operator()(gzFile f) const { gzclose(f); }
  };

  absl::Status Write(absl::Span<const uint8_t> bytes);

  std::string path_;
  IdxType type_ = IdxType::kUnsignedByte;
  std::vector<int64_t> dims_;
  int64_t expected_ = 0;
  int64_t written_ = 0;
  std::unique_ptr<gzFile_s, GzFileCloser> file_;
  std::vector<uint8_t> buffer_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_IDX_WRITER_H_
