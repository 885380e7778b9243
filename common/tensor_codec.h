// Tensor sets on the wire: a TensorSetHeader followed by TensorChunks.
//
// Sending side:
//   TensorSetHeader header = MakeFloat32Header(version, names, shapes);
//   MPILEARN_RETURN_IF_ERROR(ForEachChunk(buffers, kDefaultChunkBytes,
//       [&](TensorChunk chunk) { return Send(chunk); }));
//
// Receiving side:
//   MPILEARN_ASSIGN_OR_RETURN(auto assembler,
//                             TensorSetAssembler::Create(header, dest));
//   for each chunk: MPILEARN_RETURN_IF_ERROR(assembler.Add(chunk));
//   MPILEARN_RETURN_IF_ERROR(assembler.Finish());
//
// The assembler writes straight into buffers the caller owns (a torch tensor,
// the master's gradient scratch), so a transfer costs one copy out of the
// message and none after. Only fp32 is implemented; fp16/bf16 exist in the
// protocol and are rejected with a clear error until they are.
#ifndef MPILEARN_COMMON_TENSOR_CODEC_H_
#define MPILEARN_COMMON_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// Chunk size used on the wire: well under gRPC's 4 MiB message limit.
inline constexpr size_t kDefaultChunkBytes = 1 << 20;

// Bytes per element of `dtype`, or an error for an unspecified or
// unimplemented type.
absl::StatusOr<size_t> DTypeSize(v1::DType dtype);

// Number of elements a shape describes; error for negative dimensions or
// overflow.
absl::StatusOr<int64_t> ElementCount(absl::Span<const int64_t> shape);

// Builds a header for fp32 tensors. `names` and `shapes` have equal length.
v1::TensorSetHeader MakeFloat32Header(
    uint64_t version, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes);

// Checks that `header` describes exactly the fp32 tensors of `expected`
// (same count, names, shapes), so a gradient can be applied to weights.
// Messages name the first mismatching tensor.
absl::Status CheckSameLayout(const v1::TensorSetHeader& expected,
                             const v1::TensorSetHeader& header);

// Splits each buffer into chunks of at most `max_chunk_bytes` and calls
// `emit` for each, in order. Stops at the first error `emit` returns. An
// empty tensor produces no chunk.
absl::Status ForEachChunk(
    absl::Span<const absl::Span<const char>> buffers, size_t max_chunk_bytes,
    const std::function<absl::Status(v1::TensorChunk&)>& emit);

// Reassembles chunks into caller-owned buffers, checking that they arrive in
// order, fit their tensor, and cover it exactly. Not thread-safe.
class TensorSetAssembler {
 public:
  // `destinations[i]` receives tensor i and must be exactly its byte size.
  static absl::StatusOr<TensorSetAssembler> Create(
      const v1::TensorSetHeader& header,
      std::vector<absl::Span<char>> destinations);

  // Byte size of every tensor in `header`, for sizing destinations.
  static absl::StatusOr<std::vector<size_t>> ByteSizes(
      const v1::TensorSetHeader& header);

  absl::Status Add(const v1::TensorChunk& chunk);

  // OK once every tensor has been received in full.
  absl::Status Finish() const;

 private:
  explicit TensorSetAssembler(std::vector<absl::Span<char>> destinations)
      : destinations_(std::move(destinations)) {}

  std::vector<absl::Span<char>> destinations_;
  // Next tensor expected and the bytes of it already received; tensors
  // before `tensor_` are complete.
  size_t tensor_ = 0;
  size_t received_ = 0;
};

// Owns fp32 tensors decoded from a whole TensorSet message (files on disk).
struct Float32Tensors {
  v1::TensorSetHeader header;
  std::vector<std::vector<float>> values;
};

// Converts between Float32Tensors and the single-message TensorSet used for
// files. Decoding validates sizes and dtypes.
v1::TensorSet ToTensorSet(const v1::TensorSetHeader& header,
                          const std::vector<std::vector<float>>& values);
absl::StatusOr<Float32Tensors> FromTensorSet(const v1::TensorSet& set);

// Views of float buffers as bytes, for ForEachChunk and the assembler.
absl::Span<const char> AsBytes(absl::Span<const float> values);
absl::Span<char> AsWritableBytes(absl::Span<float> values);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_TENSOR_CODEC_H_
