// Tensor sets on the wire: a TensorSetHeader followed by TensorChunks.
//
// Sending side:
//   TensorSetHeader header = MakeFloat32Header(version, names, shapes);
//   SetWireDType(&header, v1::DTYPE_BFLOAT16);  // optional: fp32 by default
//   MPILEARN_RETURN_IF_ERROR(ForEachChunk(values, v1::DTYPE_BFLOAT16,
//       kDefaultChunkBytes, [&](TensorChunk& chunk) { return Send(chunk); }));
//
// Receiving side:
//   MPILEARN_ASSIGN_OR_RETURN(auto assembler,
//                             TensorSetAssembler::Create(header, dest));
//   for each chunk: MPILEARN_RETURN_IF_ERROR(assembler.Add(chunk));
//   MPILEARN_RETURN_IF_ERROR(assembler.Finish());
//
// Values are fp32 everywhere in memory. On the wire each tensor has its own
// dtype (TensorInfo.dtype): DTYPE_FLOAT32 (4 bytes, sent as is),
// DTYPE_BFLOAT16 or DTYPE_FLOAT16 (2 bytes, little-endian; common/
// half_float.h states the rounding: to nearest even, NaN and Inf kept, fp16
// overflowing to Inf). Chunk offsets and sizes count wire bytes. The sender
// encodes while it chunks; the assembler decodes straight into fp32 buffers
// the caller owns (a torch tensor, the master's gradient scratch), so a
// transfer costs one pass over the data out of the message and none after.
// DTYPE_UNSPECIFIED and unknown values are refused with a clear error.
#ifndef MPILEARN_COMMON_TENSOR_CODEC_H_
#define MPILEARN_COMMON_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// Chunk size used on the wire: well under gRPC's 4 MiB message limit.
inline constexpr size_t kDefaultChunkBytes = 1 << 20;

// Bytes per element of `dtype` on the wire: 4 for DTYPE_FLOAT32, 2 for
// DTYPE_FLOAT16 and DTYPE_BFLOAT16; INVALID_ARGUMENT for DTYPE_UNSPECIFIED
// and unknown values.
absl::StatusOr<size_t> DTypeSize(v1::DType dtype);

// Conversions between fp32 and a supported wire dtype (see DTypeSize; the
// caller has checked it: an unsupported dtype here is a programming error
// and crashes). They run on whole tensors and vectorise.

// Encodes `values` into `out`, which holds values.size() * DTypeSize(dtype)
// bytes (no alignment required). fp32 is a copy.
void EncodeFloats(absl::Span<const float> values, v1::DType dtype, char* out);

// Error feedback: encodes values[i] + residual[i] and sets residual[i] to
// what the encoding lost, (values[i] + residual[i]) - decoded, so the next
// call sends it. Where that is not finite (a non-finite sum, fp16 overflow)
// residual[i] becomes 0. `residual` is sized as `values` and does not
// overlap it. For fp32 nothing is lost and the residual becomes 0.
void EncodeFloatsWithFeedback(absl::Span<const float> values,
                              absl::Span<float> residual, v1::DType dtype,
                              char* out);

// Decodes in.size() / DTypeSize(dtype) values into `out`; in.size() is a
// multiple of the element size.
void DecodeFloats(absl::Span<const char> in, v1::DType dtype, float* out);

// Number of elements a shape describes; error for negative dimensions or
// overflow.
absl::StatusOr<int64_t> ElementCount(absl::Span<const int64_t> shape);

// Builds a header for fp32 tensors. `names` and `shapes` have equal length.
v1::TensorSetHeader MakeFloat32Header(
    uint64_t version, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes);

// Sets the wire dtype of every tensor of `header`.
void SetWireDType(v1::TensorSetHeader* header, v1::DType dtype);

// Checks that `header` describes the tensors of `expected` (the job's fp32
// layout): same count, names and shapes, each in a supported wire dtype
// (fp32, bf16 or fp16), so a gradient can be applied to weights. Messages
// name the first mismatching tensor.
absl::Status CheckSameLayout(const v1::TensorSetHeader& expected,
                             const v1::TensorSetHeader& header);

// OK when `model` (a group's layout) has `source`'s tensors (a warm start's
// weights: a checkpoint's, another job's, a TorchScript file's): as many,
// with the same names and shapes, in order. INVALID_ARGUMENT naming `from`
// ("checkpoint 'x.pb'") and the first difference otherwise.
absl::Status CheckWarmStartLayout(const v1::TensorSetHeader& source,
                                  const v1::TensorSetHeader& model, const std::string& from);

// Splits each buffer into chunks of at most `max_chunk_bytes` and calls
// `emit` for each, in order. Stops at the first error `emit` returns. An
// empty tensor produces no chunk. The bytes go as they are (fp32 wire data).
absl::Status ForEachChunk(
    absl::Span<const absl::Span<const char>> buffers, size_t max_chunk_bytes,
    const std::function<absl::Status(v1::TensorChunk&)>& emit);

// The same from fp32 tensors, encoded as `dtype`: chunks hold whole
// elements, at most `max_chunk_bytes` wire bytes each (INVALID_ARGUMENT if
// that is below one element, or for an unsupported dtype).
absl::Status ForEachChunk(
    absl::Span<const absl::Span<const float>> values, v1::DType dtype,
    size_t max_chunk_bytes,
    const std::function<absl::Status(v1::TensorChunk&)>& emit);

// Writes a client stream whose Request is a oneof of a header and a
// TensorChunk `chunk` (InitWeights, ReportSlice): `set_header(request)`
// fills the first message, then `values` follow as fp32 chunks through
// `writer` (a grpc::ClientWriter). UNAVAILABLE once the writer refuses a
// message (the master closed the stream: its Finish says why).
template <typename Request, typename Writer, typename SetHeader>
absl::Status WriteTensorStream(Writer& writer, SetHeader set_header,
                               absl::Span<const absl::Span<const float>> values) {
  Request request;
  set_header(request);
  if (!writer.Write(request)) return absl::UnavailableError("master closed the stream");
  request.Clear();
  return ForEachChunk(values, v1::DTYPE_FLOAT32, kDefaultChunkBytes,
                      [&](v1::TensorChunk& chunk) -> absl::Status {
                        request.mutable_chunk()->Swap(&chunk);
                        if (!writer.Write(request)) {
                          return absl::UnavailableError("master closed the stream");
                        }
                        return absl::OkStatus();
                      });
}

// Reassembles chunks into caller-owned fp32 buffers, decoding each
// tensor's wire dtype, and checks that chunks arrive in order, fit their
// tensor, and cover it exactly. Chunk data may be cut anywhere, even inside
// a 2-byte element (the assembler keeps the first byte until the next piece
// brings the second). Not thread-safe; movable.
class TensorSetAssembler {
 public:
  // `destinations[i]` receives tensor i and holds exactly its element count.
  static absl::StatusOr<TensorSetAssembler> Create(
      const v1::TensorSetHeader& header,
      std::vector<absl::Span<float>> destinations);

  // Wire bytes of every tensor in `header` (element count times the size of
  // its dtype). Errors for unsupported dtypes and invalid shapes.
  static absl::StatusOr<std::vector<size_t>> ByteSizes(
      const v1::TensorSetHeader& header);

  // Element count of every tensor in `header`, for sizing destinations.
  // Errors as ByteSizes.
  static absl::StatusOr<std::vector<int64_t>> ElementCounts(
      const v1::TensorSetHeader& header);

  absl::Status Add(const v1::TensorChunk& chunk);

  // `data` is the piece of tensor `tensor_index`'s wire bytes starting at
  // `byte_offset`: a whole chunk's data or any non-empty part of it, in
  // order.
  absl::Status Add(uint32_t tensor_index, uint64_t byte_offset,
                   absl::Span<const char> data);

  // Whether every tensor has been received in full.
  bool complete() const { return tensor_ >= tensors_.size(); }

  // OK once complete(); otherwise INVALID_ARGUMENT saying what is missing.
  absl::Status Finish() const;

 private:
  struct Tensor {
    absl::Span<float> destination;
    v1::DType dtype;
    size_t element_bytes;
    size_t wire_bytes;
  };

  explicit TensorSetAssembler(std::vector<Tensor> tensors)
      : tensors_(std::move(tensors)) {}

  // Moves `tensor_` past complete (and empty) tensors.
  void SkipCompleteTensors();

  std::vector<Tensor> tensors_;
  // Next tensor expected and the wire bytes of it already received; tensors
  // before `tensor_` are complete.
  size_t tensor_ = 0;
  size_t received_ = 0;
  // The first received_ % element_bytes bytes of an element whose remaining
  // bytes have not arrived yet (2-byte dtypes; fp32 bytes go straight to
  // the destination).
  char partial_[4] = {};
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

// Views of float buffers as bytes (fp32 wire data).
absl::Span<const char> AsBytes(absl::Span<const float> values);
absl::Span<char> AsWritableBytes(absl::Span<float> values);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_TENSOR_CODEC_H_
