// Fuzz target: the bytes of the master's raw tensor streams (InitWeights,
// PushGradient, PullWeights replies, snapshots), as common/tensor_wire reads
// them into a TensorSetAssembler. Input layout: one byte of slice cuts, then
// stream messages, each a 2-byte little-endian length and that many bytes.
// The first message must be a header (WeightsPart.header), the rest chunks,
// exactly as the master's push loop reads them. Properties:
//   - no message crashes the reader, whatever its bytes or slicing;
//   - a set that completes, re-encoded with ForEachChunkMessage and read
//     again, gives back the same floats (bit for bit; NaN payloads too).
#include <cstring>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "common/tensor_wire.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/mpilearn.pb.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

using mpilearn::TensorPart;
using mpilearn::TensorSetAssembler;
namespace v1 = mpilearn::v1;

// The most elements a fuzz input may announce: the master bounds a set's size
// before it allocates (its --max_* limits); this target bounds it the same way.
constexpr int64_t kMaxElements = int64_t{1} << 20;

grpc::ByteBuffer Sliced(const std::string& bytes, uint8_t cuts) {
  std::vector<grpc::Slice> slices;
  const size_t step = 1 + cuts % 13;
  if (cuts < 128 || bytes.empty()) {
    slices.emplace_back(bytes.data(), bytes.size());
  } else {
    for (size_t at = 0; at < bytes.size(); at += step) {
      slices.emplace_back(bytes.data() + at, std::min(step, bytes.size() - at));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// One stream message as this target's input frames it.
std::string Framed(const std::string& bytes) {
  const uint16_t n = static_cast<uint16_t>(bytes.size());
  return std::string{static_cast<char>(n & 0xff), static_cast<char>(n >> 8)} +
         bytes;
}

}  // namespace

namespace mpilearn::fuzz {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    v1::TensorSetHeader header =
        MakeFloat32Header(3, {"w", "b"}, {{3, 2}, {2}});
    SetWireDType(&header, dtype);
    v1::WeightsPart head;
    *head.mutable_header() = header;
    std::string seed(1, static_cast<char>(dtype == v1::DTYPE_BFLOAT16 ? 200 : 0));
    seed += Framed(head.SerializeAsString());
    const std::vector<float> w = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f};
    const std::vector<float> b = {0.125f, -1.0f};
    const std::vector<absl::Span<const float>> values = {w, b};
    const absl::Status encoded = ForEachChunkMessage(
        values, dtype, /*max_chunk_bytes=*/8, nullptr,
        [&seed](grpc::ByteBuffer& message, size_t) {
          std::vector<grpc::Slice> slices;
          if (!message.Dump(&slices).ok()) return absl::InternalError("dump");
          std::string bytes;
          for (const grpc::Slice& s : slices) {
            bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
          }
          seed += Framed(bytes);
          return absl::OkStatus();
        });
    if (encoded.ok()) seeds.push_back(seed);
  }
  return seeds;
}

}  // namespace mpilearn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mpilearn::fuzz::QuietProtobufLogs();
  if (size < 1) return 0;
  const uint8_t cuts = data[0];
  std::vector<std::string> messages;
  for (size_t at = 1; at + 2 <= size;) {
    const size_t n = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    const size_t take = std::min(n, size - at);
    messages.emplace_back(reinterpret_cast<const char*>(data + at), take);
    at += take;
  }
  if (messages.empty()) return 0;

  v1::TensorSetHeader header;
  absl::StatusOr<TensorPart> first =
      mpilearn::ReadTensorPart(Sliced(messages[0], cuts), &header, nullptr, "fuzz");
  if (!first.ok()) return 0;
  FUZZ_CHECK(*first == TensorPart::kHeader, "a null assembler takes no chunk");
  absl::StatusOr<std::vector<int64_t>> counts =
      TensorSetAssembler::ElementCounts(header);
  if (!counts.ok()) return 0;
  int64_t total = 0;
  for (int64_t n : *counts) {
    FUZZ_CHECK(n >= 0, "element counts are not negative");
    total += n;
    if (total > kMaxElements) return 0;
  }
  std::vector<std::vector<float>> tensors;
  std::vector<absl::Span<float>> destinations;
  tensors.reserve(counts->size());
  for (int64_t n : *counts) tensors.emplace_back(static_cast<size_t>(n));
  for (auto& t : tensors) destinations.emplace_back(t);
  absl::StatusOr<TensorSetAssembler> assembler =
      TensorSetAssembler::Create(header, destinations);
  if (!assembler.ok()) return 0;
  for (size_t i = 1; i < messages.size(); ++i) {
    absl::StatusOr<TensorPart> part = mpilearn::ReadTensorPart(
        Sliced(messages[i], cuts), nullptr, &*assembler, "fuzz");
    if (!part.ok()) return 0;
    FUZZ_CHECK(*part == TensorPart::kChunk, "a null header takes no header");
  }
  if (!assembler->Finish().ok()) return 0;

  // Round trip of what was received, as fp32.
  std::vector<absl::Span<const float>> values(tensors.begin(), tensors.end());
  v1::TensorSetHeader plain = header;
  mpilearn::SetWireDType(&plain, v1::DTYPE_FLOAT32);
  std::vector<std::vector<float>> again;
  for (int64_t n : *counts) again.emplace_back(static_cast<size_t>(n), 0.0f);
  std::vector<absl::Span<float>> again_spans(again.begin(), again.end());
  absl::StatusOr<TensorSetAssembler> reader =
      TensorSetAssembler::Create(plain, again_spans);
  FUZZ_CHECK(reader.ok(), "an fp32 copy of a valid header is valid");
  const absl::Status sent = mpilearn::ForEachChunkMessage(
      values, v1::DTYPE_FLOAT32, /*max_chunk_bytes=*/64, nullptr,
      [&reader](grpc::ByteBuffer& message, size_t) {
        return mpilearn::ReadTensorPart(message, nullptr, &*reader, "again").status();
      });
  FUZZ_CHECK(sent.ok(), "our own chunks read back");
  FUZZ_CHECK(reader->Finish().ok(), "our own chunks cover the set");
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].empty()) continue;
    FUZZ_CHECK(std::memcmp(tensors[t].data(), again[t].data(),
                           tensors[t].size() * sizeof(float)) == 0,
               "fp32 round trip is exact");
  }
  mpilearn::fuzz::Accepted();
  return 0;
}
