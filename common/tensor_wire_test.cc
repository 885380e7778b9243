#include "common/tensor_wire.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {
namespace {

std::vector<std::vector<float>> RandomTensors(const std::vector<size_t>& sizes,
                                              uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> tensors;
  for (size_t n : sizes) {
    std::vector<float> t(n);
    for (float& x : t) x = normal(rng);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<absl::Span<const float>> Views(
    const std::vector<std::vector<float>>& tensors) {
  return std::vector<absl::Span<const float>>(tensors.begin(), tensors.end());
}

v1::TensorSetHeader HeaderFor(const std::vector<size_t>& sizes, v1::DType dtype) {
  v1::TensorSetHeader header;
  for (size_t i = 0; i < sizes.size(); ++i) {
    v1::TensorInfo* info = header.add_tensors();
    info->set_name("t" + std::to_string(i));
    info->set_dtype(dtype);
    info->add_shape(static_cast<int64_t>(sizes[i]));
  }
  return header;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

// The same bytes cut into slices at the given positions, as a transport
// might deliver them.
grpc::ByteBuffer Resliced(const std::string& bytes, std::vector<size_t> cuts) {
  cuts.push_back(bytes.size());
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t cut : cuts) {
    cut = std::min(cut, bytes.size());
    if (cut < begin) continue;
    slices.emplace_back(bytes.data() + begin, cut - begin);
    begin = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The messages written here are what protobuf itself parses: every chunk
// message, read back by protobuf's own parser as a WeightsPart, carries the
// tensor index, offset and bytes of the source.
TEST(TensorWireTest, ChunkMessagesAreValidProtobuf) {
  const std::vector<size_t> sizes = {1000, 1, 0, 3000};
  const auto tensors = RandomTensors(sizes, 1);
  for (bool by_reference : {false, true}) {
    SCOPED_TRACE(by_reference);
    std::shared_ptr<const void> keep_alive;
    if (by_reference) keep_alive = std::make_shared<int>(0);
    std::vector<std::vector<float>> rebuilt(sizes.size());
    for (size_t t = 0; t < sizes.size(); ++t) rebuilt[t].resize(sizes[t]);
    int messages = 0;
    ASSERT_TRUE(ForEachChunkMessage(
                    Views(tensors), v1::DTYPE_FLOAT32, 1024, keep_alive,
                    [&](grpc::ByteBuffer& buffer, size_t data_bytes) -> absl::Status {
                      v1::WeightsPart part;
                      EXPECT_TRUE(part.ParseFromString(Flatten(buffer)));
                      EXPECT_TRUE(part.has_chunk());
                      const v1::TensorChunk& chunk = part.chunk();
                      EXPECT_EQ(data_bytes, chunk.data().size());
                      EXPECT_LE(chunk.data().size(), 1024u);
                      EXPECT_EQ(chunk.byte_offset() % 4, 0u);
                      std::memcpy(reinterpret_cast<char*>(
                                      rebuilt[chunk.tensor_index()].data()) +
                                      chunk.byte_offset(),
                                  chunk.data().data(), chunk.data().size());
                      ++messages;
                      return absl::OkStatus();
                    })
                    .ok());
    // 4000 B in 4 chunks, 4 B in 1, none for the empty tensor, 12000 B in 12.
    EXPECT_EQ(messages, 4 + 1 + 0 + 12);
    EXPECT_EQ(rebuilt, tensors);
    // Every reference the chunks took is given back with the buffers.
    if (by_reference) {
      EXPECT_EQ(keep_alive.use_count(), 1);
    }
  }
}

// Messages protobuf serialized (any client's) are read into the
// destination exactly, wherever the transport cuts them into slices.
TEST(TensorWireTest, ReadsProtobufMessagesCutAnywhere) {
  const std::vector<size_t> sizes = {700, 5, 1300};
  const auto tensors = RandomTensors(sizes, 2);
  const v1::TensorSetHeader header = HeaderFor(sizes, v1::DTYPE_FLOAT32);
  std::vector<std::string> messages;
  {
    v1::WeightsPart part;
    *part.mutable_header() = header;
    messages.push_back(part.SerializeAsString());
  }
  std::vector<absl::Span<const char>> bytes;
  for (const auto& t : tensors) {
    bytes.push_back(absl::Span<const char>(
        reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float)));
  }
  ASSERT_TRUE(ForEachChunk(bytes, 1000, [&](v1::TensorChunk& chunk) {
                v1::WeightsPart part;
                *part.mutable_chunk() = chunk;
                messages.push_back(part.SerializeAsString());
                return absl::OkStatus();
              }).ok());
  for (size_t step : {size_t{1}, size_t{7}, size_t{333}, size_t{100000}}) {
    SCOPED_TRACE(step);
    std::vector<std::vector<float>> out(sizes.size());
    std::vector<absl::Span<float>> dest;
    for (size_t t = 0; t < sizes.size(); ++t) {
      out[t].assign(sizes[t], -1.0f);
      dest.push_back(absl::MakeSpan(out[t]));
    }
    v1::TensorSetHeader read_header;
    std::optional<TensorSetAssembler> assembler;
    for (const std::string& m : messages) {
      std::vector<size_t> cuts;
      for (size_t c = step; c < m.size(); c += step) cuts.push_back(c);
      auto part = ReadTensorPart(Resliced(m, cuts), &read_header,
                                 assembler ? &*assembler : nullptr, "test");
      ASSERT_TRUE(part.ok()) << part.status();
      if (*part == TensorPart::kHeader) {
        auto created = TensorSetAssembler::Create(read_header, dest);
        ASSERT_TRUE(created.ok()) << created.status();
        assembler.emplace(std::move(*created));
      }
    }
    ASSERT_TRUE(assembler.has_value());
    EXPECT_TRUE(assembler->Finish().ok());
    EXPECT_EQ(out, tensors);
  }
}

// Reduced precision: the chunks carry the encoded values, and reading them
// gives back what decoding the wire values gives (the codec's own test
// bounds the rounding).
TEST(TensorWireTest, ReducedPrecisionRoundTrip) {
  const std::vector<size_t> sizes = {513, 2048};
  const auto tensors = RandomTensors(sizes, 3);
  for (v1::DType dtype : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const v1::TensorSetHeader header = HeaderFor(sizes, dtype);
    std::vector<std::vector<float>> out(sizes.size());
    std::vector<absl::Span<float>> dest;
    for (size_t t = 0; t < sizes.size(); ++t) {
      out[t].assign(sizes[t], 0.0f);
      dest.push_back(absl::MakeSpan(out[t]));
    }
    auto assembler = TensorSetAssembler::Create(header, dest);
    ASSERT_TRUE(assembler.ok()) << assembler.status();
    v1::TensorSetHeader unused;
    ASSERT_TRUE(ForEachChunkMessage(Views(tensors), dtype, 999, nullptr,
                                    [&](grpc::ByteBuffer& buffer, size_t) {
                                      // Odd cuts split 2-byte elements.
                                      const std::string m = Flatten(buffer);
                                      return ReadTensorPart(
                                                 Resliced(m, {3, 10, 501}),
                                                 &unused, &*assembler, "test")
                                          .status();
                                    })
                    .ok());
    ASSERT_TRUE(assembler->Finish().ok());
    for (size_t t = 0; t < sizes.size(); ++t) {
      std::vector<char> wire(sizes[t] * 2);
      EncodeFloats(tensors[t], dtype, wire.data());
      std::vector<float> expected(sizes[t]);
      DecodeFloats(wire, dtype, expected.data());
      EXPECT_EQ(out[t], expected);
      const float bound = dtype == v1::DTYPE_BFLOAT16 ? 1.0f / 256 : 1.0f / 2048;
      for (size_t i = 0; i < sizes[t]; ++i) {
        ASSERT_LE(std::fabs(out[t][i] - tensors[t][i]),
                  bound * std::fabs(tensors[t][i]) + 1e-4f);
      }
    }
  }
}

// A chunk whose data comes before its index and offset (legal protobuf)
// is still placed by the index and offset.
TEST(TensorWireTest, UnusualFieldOrderIsParsed) {
  const std::vector<size_t> sizes = {2, 2};
  std::vector<std::vector<float>> out = {{0, 0}, {0, 0}};
  std::vector<absl::Span<float>> dest = {absl::MakeSpan(out[0]),
                                         absl::MakeSpan(out[1])};
  auto assembler =
      TensorSetAssembler::Create(HeaderFor(sizes, v1::DTYPE_FLOAT32), dest);
  ASSERT_TRUE(assembler.ok());
  const float values[4] = {1.5f, -2.0f, 3.0f, 4.25f};
  for (int t = 0; t < 2; ++t) {
    v1::TensorChunk data_only;
    data_only.set_data(std::string(reinterpret_cast<const char*>(values + 2 * t), 8));
    v1::TensorChunk index_only;
    index_only.set_tensor_index(static_cast<uint32_t>(t));
    // data first, then the index: concatenated messages merge.
    const std::string chunk =
        data_only.SerializeAsString() + index_only.SerializeAsString();
    std::string message;
    message.push_back(static_cast<char>((2 << 3) | 2));
    message.push_back(static_cast<char>(chunk.size()));
    message += chunk;
    v1::TensorSetHeader unused;
    auto part = ReadTensorPart(Resliced(message, {5}), &unused, &*assembler, "test");
    ASSERT_TRUE(part.ok()) << part.status();
  }
  EXPECT_TRUE(assembler->Finish().ok());
  EXPECT_EQ(out, (std::vector<std::vector<float>>{{1.5f, -2.0f}, {3.0f, 4.25f}}));
}

TEST(TensorWireTest, MalformedMessagesAreInvalidArgument) {
  std::vector<std::vector<float>> out = {{0, 0}};
  std::vector<absl::Span<float>> dest = {absl::MakeSpan(out[0])};
  auto assembler = TensorSetAssembler::Create(HeaderFor({2}, v1::DTYPE_FLOAT32), dest);
  ASSERT_TRUE(assembler.ok());
  v1::WeightsPart part;
  part.mutable_chunk()->set_data(std::string(8, '\0'));
  const std::string good = part.SerializeAsString();
  v1::TensorSetHeader header;
  // Truncated anywhere.
  for (size_t n = 1; n < good.size(); ++n) {
    auto read = ReadTensorPart(Resliced(good.substr(0, n), {}), &header,
                               &*assembler, "PushGradient");
    ASSERT_FALSE(read.ok()) << n;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(read.status().message().find("PushGradient"), std::string::npos);
  }
  // A chunk before any header.
  auto early = ReadTensorPart(Resliced(good, {}), &header, nullptr, "PushGradient");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kInvalidArgument);
  // A header where only chunks may follow.
  v1::WeightsPart second;
  *second.mutable_header() = HeaderFor({2}, v1::DTYPE_FLOAT32);
  auto again = ReadTensorPart(Resliced(second.SerializeAsString(), {}), nullptr,
                              &*assembler, "PushGradient");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("expected only chunks"),
            std::string::npos);
  // An empty message.
  auto empty = ReadTensorPart(Resliced("", {}), &header, &*assembler, "x");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  // A chunk that overruns its tensor.
  v1::WeightsPart big;
  big.mutable_chunk()->set_data(std::string(12, '\0'));
  auto overrun = ReadTensorPart(Resliced(big.SerializeAsString(), {}), &header,
                                &*assembler, "x");
  EXPECT_EQ(overrun.status().code(), absl::StatusCode::kInvalidArgument);
  // A chunk whose data length is a varint running past the chunk's end into
  // the next byte (found by tensor_wire_fuzz: it read past the buffer).
  const std::string past_end = std::string("\x12\x0a\x1a") + std::string(9, '\xff') + "\x25";
  for (const std::vector<size_t>& cuts : {std::vector<size_t>{}, {3}, {5, 11}}) {
    auto past = ReadTensorPart(Resliced(past_end, cuts), &header, &*assembler, "x");
    EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument) << past.status();
    EXPECT_NE(past.status().message().find("chunk data overruns the chunk"), std::string::npos)
        << past.status();
  }
}

}  // namespace
}  // namespace mpilearn
