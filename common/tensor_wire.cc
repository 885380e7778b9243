#include "common/tensor_wire.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpc/slice.h"
#include "grpcpp/support/slice.h"

namespace mpilearn {
namespace {

// Protobuf wire types and the tags this file writes and reads.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;
// Field 1 / 2 of the stream messages, fields 1-3 of TensorChunk.
constexpr int kHeaderField = 1;
constexpr int kChunkField = 2;
constexpr uint8_t kChunkTag = (kChunkField << 3) | kLengthDelimited;
constexpr uint8_t kTensorIndexTag = (1 << 3) | kVarint;
constexpr uint8_t kByteOffsetTag = (2 << 3) | kVarint;
constexpr uint8_t kDataTag = (3 << 3) | kLengthDelimited;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// The serialized message up to the chunk's data bytes: the chunk field's
// tag and length, tensor_index and byte_offset (omitted when zero, as
// proto3 does), and the data field's tag and length.
std::string ChunkPrefix(uint32_t tensor_index, uint64_t byte_offset,
                        size_t data_bytes) {
  std::string inner;
  if (tensor_index != 0) {
    inner.push_back(static_cast<char>(kTensorIndexTag));
    AppendVarint(tensor_index, &inner);
  }
  if (byte_offset != 0) {
    inner.push_back(static_cast<char>(kByteOffsetTag));
    AppendVarint(byte_offset, &inner);
  }
  inner.push_back(static_cast<char>(kDataTag));
  AppendVarint(data_bytes, &inner);
  std::string prefix;
  prefix.reserve(inner.size() + 11);
  prefix.push_back(static_cast<char>(kChunkTag));
  AppendVarint(inner.size() + data_bytes, &prefix);
  prefix += inner;
  return prefix;
}

void ReleaseKeepAlive(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

// Reads a byte buffer's slices in order without copying them.
class SliceCursor {
 public:
  explicit SliceCursor(std::vector<grpc::Slice> slices)
      : slices_(std::move(slices)) {
    for (const grpc::Slice& s : slices_) remaining_ += s.size();
    SkipEmpty();
  }

  size_t remaining() const { return remaining_; }

  bool ReadByte(uint8_t* byte) {
    if (remaining_ == 0) return false;
    *byte = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  bool Skip(uint64_t bytes) {
    if (bytes > remaining_) return false;
    while (bytes > 0) {
      const size_t n = std::min<uint64_t>(bytes, Current().size());
      Advance(n);
      bytes -= n;
    }
    return true;
  }

  // Copies the next `bytes` bytes into `out` (small fields only).
  bool ReadString(uint64_t bytes, std::string* out) {
    if (bytes > remaining_) return false;
    out->clear();
    out->reserve(bytes);
    while (bytes > 0) {
      const absl::Span<const char> piece = Current();
      const size_t n = std::min<uint64_t>(bytes, piece.size());
      out->append(piece.data(), n);
      Advance(n);
      bytes -= n;
    }
    return true;
  }

  // Hands the next `bytes` bytes to `consume` as the slices hold them;
  // INVALID_ARGUMENT when fewer remain.
  template <typename Consume>
  absl::Status ForEachPiece(uint64_t bytes, Consume consume) {
    if (bytes > remaining_) return absl::InvalidArgumentError("truncated data");
    while (bytes > 0) {
      const absl::Span<const char> piece = Current();
      const size_t n = std::min<uint64_t>(bytes, piece.size());
      MPILEARN_RETURN_IF_ERROR(consume(piece.subspan(0, n)));
      Advance(n);
      bytes -= n;
    }
    return absl::OkStatus();
  }

 private:
  absl::Span<const char> Current() const {
    const grpc::Slice& s = slices_[slice_];
    return absl::Span<const char>(reinterpret_cast<const char*>(s.begin()) + offset_,
                                  s.size() - offset_);
  }
  void Advance(size_t n) {
    offset_ += n;
    remaining_ -= n;
    SkipEmpty();
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  size_t remaining_ = 0;
};

// Skips a field's value of `wire_type`; false when truncated or the type is
// not one protobuf writes.
bool SkipValue(SliceCursor& cursor, int wire_type) {
  uint64_t value;
  switch (wire_type) {
    case kVarint:
      return cursor.ReadVarint(&value);
    case kFixed64:
      return cursor.Skip(8);
    case kLengthDelimited:
      return cursor.ReadVarint(&value) && cursor.Skip(value);
    case kFixed32:
      return cursor.Skip(4);
    default:
      return false;
  }
}

absl::Status Malformed(absl::string_view what, absl::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": malformed stream message (", detail, ")"));
}

// Reads a TensorChunk of `length` bytes at the cursor into `assembler`.
absl::Status ReadChunk(SliceCursor& cursor, uint64_t length,
                       TensorSetAssembler& assembler, absl::string_view what) {
  if (length > cursor.remaining()) return Malformed(what, "truncated chunk");
  const size_t end = cursor.remaining() - length;  // remaining() at the end
  uint64_t tensor_index = 0;
  uint64_t byte_offset = 0;
  // A field read past the chunk's end (a varint or skipped value running
  // over it) is malformed, and never lets the arithmetic below wrap.
  auto inside = [&cursor, end] { return cursor.remaining() >= end; };
  while (cursor.remaining() > end) {
    uint64_t tag;
    if (!cursor.ReadVarint(&tag) || !inside()) return Malformed(what, "bad chunk field");
    const int field = static_cast<int>(tag >> 3);
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 1 && wire_type == kVarint) {
      if (!cursor.ReadVarint(&tensor_index) || !inside()) return Malformed(what, "bad index");
    } else if (field == 2 && wire_type == kVarint) {
      if (!cursor.ReadVarint(&byte_offset) || !inside()) return Malformed(what, "bad offset");
    } else if (field == 3 && wire_type == kLengthDelimited) {
      uint64_t bytes;
      if (!cursor.ReadVarint(&bytes) || !inside() || bytes > cursor.remaining() - end) {
        return Malformed(what, "chunk data overruns the chunk");
      }
      if (cursor.remaining() - bytes != end) {
        // Fields after the data (an order no encoder we know of writes):
        // the index and offset may still change, so parse it the plain way.
        std::string rest;
        if (!cursor.ReadString(bytes, &rest)) return Malformed(what, "truncated");
        v1::TensorChunk chunk;
        chunk.set_tensor_index(static_cast<uint32_t>(tensor_index));
        chunk.set_byte_offset(byte_offset);
        chunk.set_data(std::move(rest));
        std::string tail;
        if (!cursor.ReadString(cursor.remaining() - end, &tail) ||
            !chunk.MergeFromString(tail)) {
          return Malformed(what, "bad chunk fields");
        }
        return assembler.Add(chunk);
      }
      if (tensor_index > UINT32_MAX) return Malformed(what, "tensor index");
      uint64_t fed = 0;
      return cursor.ForEachPiece(bytes, [&](absl::Span<const char> piece) {
        const uint64_t at = fed;
        fed += piece.size();
        return assembler.Add(static_cast<uint32_t>(tensor_index),
                             byte_offset + at, piece);
      });
    } else if (!SkipValue(cursor, wire_type) || !inside()) {
      return Malformed(what, "bad chunk field");
    }
  }
  // No data field: an empty chunk, which the assembler refuses.
  v1::TensorChunk chunk;
  chunk.set_tensor_index(static_cast<uint32_t>(tensor_index));
  chunk.set_byte_offset(byte_offset);
  return assembler.Add(chunk);
}

}  // namespace

grpc::ByteBuffer SerializeToByteBuffer(
    const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message,
                                 absl::string_view what) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return Malformed(what, "unreadable buffer");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the request is not a valid ",
                     message->GetTypeName(), " message"));
  }
  return absl::OkStatus();
}

absl::Status ForEachChunkMessage(
    absl::Span<const absl::Span<const float>> values, v1::DType dtype,
    size_t max_chunk_bytes, std::shared_ptr<const void> keep_alive,
    const std::function<absl::Status(grpc::ByteBuffer&, size_t data_bytes)>& emit,
    absl::Span<const absl::Span<float>> residual) {
  MPILEARN_ASSIGN_OR_RETURN(const size_t element_bytes, DTypeSize(dtype));
  const bool feedback = !residual.empty() && dtype != v1::DTYPE_FLOAT32;
  if (feedback && residual.size() != values.size()) {
    return absl::InternalError("error feedback needs a residual per tensor");
  }
  const size_t per_chunk = max_chunk_bytes / element_bytes;
  if (per_chunk == 0) {
    return absl::InvalidArgumentError("chunk size below one element");
  }
  const bool by_reference =
      keep_alive != nullptr && dtype == v1::DTYPE_FLOAT32;
  for (size_t t = 0; feedback && t < values.size(); ++t) {
    if (residual[t].size() != values[t].size()) {
      return absl::InternalError("error feedback residual of the wrong size");
    }
  }
  for (size_t t = 0; t < values.size(); ++t) {
    const absl::Span<const float> tensor = values[t];
    for (size_t first = 0; first < tensor.size(); first += per_chunk) {
      const absl::Span<const float> part =
          tensor.subspan(first, std::min(per_chunk, tensor.size() - first));
      const size_t bytes = part.size() * element_bytes;
      const std::string prefix = ChunkPrefix(static_cast<uint32_t>(t),
                                             first * element_bytes, bytes);
      grpc::Slice slices[2] = {grpc::Slice(prefix.data(), prefix.size()),
                               grpc::Slice()};
      if (by_reference) {
        slices[1] = grpc::Slice(
            const_cast<float*>(part.data()), bytes, &ReleaseKeepAlive,
            new std::shared_ptr<const void>(keep_alive));
      } else {
        grpc_slice data = grpc_slice_malloc(bytes);
        char* out = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(data));
        if (feedback) {
          EncodeFloatsWithFeedback(
              part, residual[t].subspan(first, part.size()), dtype, out);
        } else {
          EncodeFloats(part, dtype, out);
        }
        slices[1] = grpc::Slice(data, grpc::Slice::STEAL_REF);
      }
      grpc::ByteBuffer message(slices, 2);
      MPILEARN_RETURN_IF_ERROR(emit(message, bytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorPart> ReadTensorPart(const grpc::ByteBuffer& buffer,
                                          google::protobuf::MessageLite* header,
                                          TensorSetAssembler* assembler,
                                          absl::string_view what) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return Malformed(what, "unreadable buffer");
  SliceCursor cursor(std::move(slices));
  std::optional<TensorPart> part;
  while (cursor.remaining() > 0) {
    uint64_t tag;
    if (!cursor.ReadVarint(&tag)) return Malformed(what, "bad field tag");
    const int field = static_cast<int>(tag >> 3);
    const int wire_type = static_cast<int>(tag & 7);
    if ((field == kHeaderField || field == kChunkField) &&
        wire_type == kLengthDelimited) {
      if (part.has_value()) {
        return Malformed(what, "more than one header or chunk in a message");
      }
      uint64_t length;
      if (!cursor.ReadVarint(&length) || length > cursor.remaining()) {
        return Malformed(what, "truncated field");
      }
      if (field == kHeaderField) {
        if (header == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": expected only chunks after the header"));
        }
        std::string bytes;
        cursor.ReadString(length, &bytes);
        if (!header->ParseFromString(bytes)) {
          return Malformed(what, "unparsable header");
        }
        part = TensorPart::kHeader;
      } else {
        if (assembler == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": the first message of the stream must be a header"));
        }
        MPILEARN_RETURN_IF_ERROR(ReadChunk(cursor, length, *assembler, what));
        part = TensorPart::kChunk;
      }
    } else if (!SkipValue(cursor, wire_type)) {
      return Malformed(what, "bad field");
    }
  }
  if (!part.has_value()) {
    return Malformed(what, "a message with neither header nor chunk");
  }
  return *part;
}

}  // namespace mpilearn
