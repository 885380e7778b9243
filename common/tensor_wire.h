// Tensor streams as raw gRPC byte buffers: the fast path of the exchange.
//
// Every tensor-carrying stream message of the protocol (PushGradientRequest,
// WeightsPart, SnapshotPart, InitWeightsRequest) is a oneof of a header
// (field 1) and a TensorChunk (field 2). This file writes and reads those
// messages byte for byte as protobuf does, so the wire stays valid protobuf
// and any client (Python, other languages) keeps working, but without
// building message objects for the tensor bytes:
//
//   - Sending, a chunk is a small serialized prefix plus a grpc::Slice of the
//     tensor bytes. The slice either references memory kept alive by the
//     caller's shared_ptr (the master's immutable weight snapshots: no copy
//     at all) or is one buffer the floats are encoded into (one copy, which
//     is also where fp32 becomes bf16/fp16).
//   - Receiving, a chunk's data goes from gRPC's own slices straight into
//     the destination through TensorSetAssembler::Add (one copy, or the
//     decode from bf16/fp16), never through a std::string.
//
// A message whose fields come in an unusual order (legal protobuf, which no
// known encoder produces for these messages) is parsed the ordinary way.
//
// Thread-compatible: free functions, no shared state.
#ifndef MPILEARN_COMMON_TENSOR_WIRE_H_
#define MPILEARN_COMMON_TENSOR_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor_codec.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// A message serialized into a byte buffer (headers, small messages).
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);

// Parses a whole byte buffer into `message`; INVALID_ARGUMENT naming `what`
// when the bytes are not a valid message.
absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message,
                                 absl::string_view what);

// Encodes fp32 `values` as `dtype` chunks of at most `max_chunk_bytes` wire
// bytes (element-aligned), each as a complete stream message with the chunk
// in field 2, passed to `emit` in order. `keep_alive`, when given, owns the
// memory `values` point into: fp32 chunks then reference that memory (no
// copy), holding a reference to it until gRPC is done with the bytes.
// Without it every chunk is a copy. `emit` also gets the chunk's data bytes
// (the tensor bytes it carries, without the message's framing). `residual`, when given (one span per
// tensor, sized as `values`), turns on error feedback for a reduced dtype:
// each value is sent as value + residual and the residual becomes what
// rounding lost (EncodeFloatsWithFeedback). Stops at the first error of
// `emit`.
absl::Status ForEachChunkMessage(
    absl::Span<const absl::Span<const float>> values, v1::DType dtype,
    size_t max_chunk_bytes, std::shared_ptr<const void> keep_alive,
    const std::function<absl::Status(grpc::ByteBuffer&, size_t data_bytes)>& emit,
    absl::Span<const absl::Span<float>> residual = {});

// What one received stream message held.
enum class TensorPart { kHeader, kChunk };

// Reads one stream message: a header (field 1) is parsed into `header`; a
// chunk's bytes go into `assembler`. Pass a null `assembler` before the
// header has arrived (a chunk is then INVALID_ARGUMENT: the stream must
// start with a header) and a null `header` after it (a second header is
// INVALID_ARGUMENT: only chunks may follow). Errors name `what` (the RPC).
absl::StatusOr<TensorPart> ReadTensorPart(const grpc::ByteBuffer& buffer,
                                          google::protobuf::MessageLite* header,
                                          TensorSetAssembler* assembler,
                                          absl::string_view what);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_TENSOR_WIRE_H_
