#include "common/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/half_float.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

using v1::TensorChunk;
using v1::TensorSetHeader;

struct Sent {
  TensorSetHeader header;
  std::vector<TensorChunk> chunks;
};

std::vector<std::vector<float>> RandomTensors(const std::vector<size_t>& sizes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> out;
  for (size_t n : sizes) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    out.push_back(std::move(v));
  }
  return out;
}

Sent Encode(const std::vector<std::vector<float>>& tensors, size_t chunk_bytes) {
  Sent sent;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<absl::Span<const char>> buffers;
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back("t" + std::to_string(i));
    shapes.push_back({static_cast<int64_t>(tensors[i].size())});
    buffers.push_back(AsBytes(tensors[i]));
  }
  sent.header = MakeFloat32Header(42, names, shapes);
  EXPECT_TRUE(ForEachChunk(buffers, chunk_bytes, [&](TensorChunk& c) {
                sent.chunks.push_back(c);
                return absl::OkStatus();
              }).ok());
  return sent;
}

absl::StatusOr<std::vector<std::vector<float>>> Decode(const Sent& sent) {
  auto counts = TensorSetAssembler::ElementCounts(sent.header);
  if (!counts.ok()) return counts.status();
  std::vector<std::vector<float>> out;
  std::vector<absl::Span<float>> dest;
  for (int64_t n : *counts) out.emplace_back(static_cast<size_t>(n));
  for (auto& v : out) dest.push_back(absl::MakeSpan(v));
  auto assembler = TensorSetAssembler::Create(sent.header, dest);
  if (!assembler.ok()) return assembler.status();
  for (const TensorChunk& c : sent.chunks) {
    absl::Status s = assembler->Add(c);
    if (!s.ok()) return s;
  }
  absl::Status s = assembler->Finish();
  if (!s.ok()) return s;
  return out;
}

TEST(TensorCodecTest, RoundTripWithChunking) {
  // 1 MiB + 3 floats crosses a chunk boundary; 0 and 1 are edge sizes.
  const std::vector<size_t> sizes = {(1 << 18) + 3, 0, 1, 1000};
  const auto tensors = RandomTensors(sizes);
  const Sent sent = Encode(tensors, kDefaultChunkBytes);
  // 2 chunks for the first tensor, none for the empty one, 1 each after.
  ASSERT_EQ(sent.chunks.size(), 4u);
  EXPECT_EQ(sent.chunks[1].byte_offset(), kDefaultChunkBytes);
  EXPECT_EQ(sent.header.version(), 42u);
  auto decoded = Decode(sent);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, tensors);
}

TEST(TensorCodecTest, EveryChunkRespectsTheLimit) {
  const auto tensors = RandomTensors({1001, 17});
  const Sent sent = Encode(tensors, 100);  // 100 bytes: not a float multiple
  size_t total = 0;
  for (const TensorChunk& c : sent.chunks) {
    EXPECT_LE(c.data().size(), 100u);
    total += c.data().size();
  }
  EXPECT_EQ(total, (1001 + 17) * sizeof(float));
  auto decoded = Decode(sent);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, tensors);
}

TEST(TensorCodecTest, RejectsOutOfOrderChunks) {
  Sent sent = Encode(RandomTensors({300, 300}), 512);
  std::swap(sent.chunks[0], sent.chunks[1]);
  auto decoded = Decode(sent);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("out of order"), std::string::npos);
}

TEST(TensorCodecTest, RejectsMissingAndExtraBytes) {
  Sent missing = Encode(RandomTensors({300, 300}), 512);
  missing.chunks.pop_back();
  auto decoded = Decode(missing);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("incomplete"), std::string::npos);

  Sent extra = Encode(RandomTensors({10}), 512);
  extra.chunks.back().mutable_data()->append("xxxx");
  decoded = Decode(extra);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("does not fit"), std::string::npos);
}

TEST(TensorCodecTest, DTypeSizes) {
  EXPECT_EQ(*DTypeSize(v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(*DTypeSize(v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(*DTypeSize(v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeSize(static_cast<v1::DType>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, RejectsUnsupportedDtype) {
  for (int dtype : {static_cast<int>(v1::DTYPE_UNSPECIFIED), 99}) {
    Sent sent = Encode(RandomTensors({8}), 512);
    sent.header.mutable_tensors(0)->set_dtype(static_cast<v1::DType>(dtype));
    auto decoded = Decode(sent);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find(
                  dtype == 0 ? "DTYPE_UNSPECIFIED" : "dtype 99"),
              std::string::npos)
        << decoded.status();
    EXPECT_NE(decoded.status().message().find("'t0'"), std::string::npos);
  }
}

TEST(TensorCodecTest, RejectsNegativeShape) {
  TensorSetHeader header = MakeFloat32Header(0, {"w"}, {{4, -1}});
  EXPECT_FALSE(TensorSetAssembler::ByteSizes(header).ok());
}

TEST(TensorCodecTest, CheckSameLayoutNamesTheMismatch) {
  const TensorSetHeader want = MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}});
  EXPECT_TRUE(CheckSameLayout(want, want).ok());
  TensorSetHeader shape = MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {4}});
  absl::Status s = CheckSameLayout(want, shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s;
  TensorSetHeader count = MakeFloat32Header(0, {"w"}, {{4, 3}});
  EXPECT_NE(CheckSameLayout(want, count).message().find("expected 2 tensors"),
            std::string::npos);
  // Any supported wire dtype fits the job's fp32 layout.
  for (v1::DType wire : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    TensorSetHeader reduced = want;
    SetWireDType(&reduced, wire);
    EXPECT_EQ(reduced.tensors(0).dtype(), wire);
    EXPECT_EQ(reduced.tensors(1).dtype(), wire);
    EXPECT_TRUE(CheckSameLayout(want, reduced).ok());
  }
  TensorSetHeader dtype = want;
  dtype.mutable_tensors(1)->set_dtype(v1::DTYPE_UNSPECIFIED);
  s = CheckSameLayout(want, dtype);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'b'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("DTYPE_UNSPECIFIED"), std::string::npos) << s;
}

TEST(TensorCodecTest, WholeSetRoundTripAndTruncation) {
  const auto tensors = RandomTensors({5, 7});
  const TensorSetHeader header = MakeFloat32Header(3, {"a", "b"}, {{5}, {7}});
  v1::TensorSet set = ToTensorSet(header, tensors);
  auto back = FromTensorSet(set);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->values, tensors);
  set.mutable_data(1)->resize(3);
  EXPECT_EQ(FromTensorSet(set).status().code(), absl::StatusCode::kDataLoss);
}

// fp32 -> wire -> fp32 through the buffer functions, checked against the
// scalar conversions (which half_float_test checks against a reference).
TEST(TensorCodecTest, EncodeAndDecodeFloats) {
  const std::vector<float> values = RandomTensors({1001})[0];
  for (v1::DType dtype :
       {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const size_t size = *DTypeSize(dtype);
    std::vector<char> wire(values.size() * size);
    EncodeFloats(values, dtype, wire.data());
    std::vector<float> back(values.size());
    DecodeFloats(wire, dtype, back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      float want = values[i];
      if (dtype == v1::DTYPE_BFLOAT16) {
        want = BFloat16ToFloat(FloatToBFloat16(values[i]));
        uint16_t bits;
        std::memcpy(&bits, wire.data() + 2 * i, 2);
        ASSERT_EQ(bits, FloatToBFloat16(values[i]));
      } else if (dtype == v1::DTYPE_FLOAT16) {
        want = HalfToFloat(FloatToHalf(values[i]));
      }
      ASSERT_EQ(back[i], want) << i;
    }
  }
}

TEST(TensorCodecTest, Float32FeedbackSendsValuePlusResidual) {
  const std::vector<float> values = {1.0f, -2.0f, 3.5f};
  std::vector<float> residual = {0.25f, 0.5f, 0.0f};
  std::vector<char> wire(values.size() * 4);
  EncodeFloatsWithFeedback(values, absl::MakeSpan(residual), v1::DTYPE_FLOAT32,
                           wire.data());
  std::vector<float> back(values.size());
  DecodeFloats(wire, v1::DTYPE_FLOAT32, back.data());
  EXPECT_EQ(back, (std::vector<float>{1.25f, -1.5f, 3.5f}));
  EXPECT_EQ(residual, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

TEST(TensorCodecTest, ReducedSizesAndCounts) {
  TensorSetHeader header = MakeFloat32Header(0, {"w", "b", "e"}, {{4, 3}, {5}, {0}});
  SetWireDType(&header, v1::DTYPE_BFLOAT16);
  header.mutable_tensors(1)->set_dtype(v1::DTYPE_FLOAT32);
  EXPECT_EQ(*TensorSetAssembler::ByteSizes(header),
            (std::vector<size_t>{24, 20, 0}));
  EXPECT_EQ(*TensorSetAssembler::ElementCounts(header),
            (std::vector<int64_t>{12, 5, 0}));
}

// The wire chunks of `tensors` as `dtype`, and the header that goes first.
Sent EncodeAs(const std::vector<std::vector<float>>& tensors, v1::DType dtype,
              size_t chunk_bytes) {
  Sent sent;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<absl::Span<const float>> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back("t" + std::to_string(i));
    shapes.push_back({static_cast<int64_t>(tensors[i].size())});
    views.push_back(tensors[i]);
  }
  sent.header = MakeFloat32Header(7, names, shapes);
  SetWireDType(&sent.header, dtype);
  absl::Status status = ForEachChunk(views, dtype, chunk_bytes,
                                     [&](TensorChunk& c) {
                                       sent.chunks.push_back(c);
                                       return absl::OkStatus();
                                     });
  EXPECT_TRUE(status.ok()) << status;
  return sent;
}

// What the receiver must hold: each value through the scalar conversion.
std::vector<std::vector<float>> Expected(
    const std::vector<std::vector<float>>& tensors, v1::DType dtype) {
  std::vector<std::vector<float>> out = tensors;
  for (auto& t : out) {
    for (float& x : t) {
      if (dtype == v1::DTYPE_BFLOAT16) x = BFloat16ToFloat(FloatToBFloat16(x));
      if (dtype == v1::DTYPE_FLOAT16) x = HalfToFloat(FloatToHalf(x));
    }
  }
  return out;
}

TEST(TensorCodecTest, FloatChunksAreElementAlignedInTheWireDtype) {
  const auto tensors = RandomTensors({1001, 0, 17});
  for (v1::DType dtype :
       {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const size_t size = *DTypeSize(dtype);
    const Sent sent = EncodeAs(tensors, dtype, 101);  // odd limit
    size_t total = 0;
    for (const TensorChunk& c : sent.chunks) {
      EXPECT_LE(c.data().size(), 101u);
      EXPECT_EQ(c.data().size() % size, 0u);
      EXPECT_EQ(c.byte_offset() % size, 0u);
      total += c.data().size();
    }
    EXPECT_EQ(total, (1001 + 17) * size);
    auto decoded = Decode(sent);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, Expected(tensors, dtype));
  }
  const std::vector<absl::Span<const float>> one = {tensors[0]};
  EXPECT_EQ(ForEachChunk(one, v1::DTYPE_FLOAT32, 3,
                         [](TensorChunk&) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ForEachChunk(one, v1::DTYPE_UNSPECIFIED, 100,
                         [](TensorChunk&) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Feeds every chunk to `assembler` in pieces cut at `cuts` (positions
// within the chunk's data), as a transport may deliver them.
absl::Status AddInPieces(TensorSetAssembler& assembler, const Sent& sent,
                         const std::vector<size_t>& cuts) {
  for (const TensorChunk& c : sent.chunks) {
    const absl::Span<const char> data = c.data();
    size_t begin = 0;
    std::vector<size_t> ends = cuts;
    ends.push_back(data.size());
    for (size_t end : ends) {
      end = std::min(end, data.size());
      if (end <= begin) continue;
      absl::Status s = assembler.Add(c.tensor_index(), c.byte_offset() + begin,
                                     data.subspan(begin, end - begin));
      if (!s.ok()) return s;
      begin = end;
    }
  }
  return absl::OkStatus();
}

TEST(TensorCodecTest, AssemblesPiecesCutInsideElements) {
  const auto tensors = RandomTensors({999, 1, 0, 64});
  for (v1::DType dtype :
       {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16, v1::DTYPE_FLOAT32}) {
    const Sent sent = EncodeAs(tensors, dtype, 256);
    for (const std::vector<size_t>& cuts :
         std::vector<std::vector<size_t>>{{1}, {3, 4, 77, 101}, {255}}) {
      SCOPED_TRACE(v1::DType_Name(dtype) + " cut at " + std::to_string(cuts[0]));
      std::vector<std::vector<float>> out;
      std::vector<absl::Span<float>> dest;
      for (const auto& t : tensors) out.emplace_back(t.size(), -7.0f);
      for (auto& v : out) dest.push_back(absl::MakeSpan(v));
      auto assembler = TensorSetAssembler::Create(sent.header, dest);
      ASSERT_TRUE(assembler.ok()) << assembler.status();
      ASSERT_TRUE(AddInPieces(*assembler, sent, cuts).ok());
      ASSERT_TRUE(assembler->Finish().ok());
      EXPECT_EQ(out, Expected(tensors, dtype));
    }
  }
  // Every byte on its own.
  const Sent sent = EncodeAs(tensors, v1::DTYPE_BFLOAT16, 64);
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < 64; ++i) every_byte.push_back(i);
  std::vector<std::vector<float>> out;
  std::vector<absl::Span<float>> dest;
  for (const auto& t : tensors) out.emplace_back(t.size());
  for (auto& v : out) dest.push_back(absl::MakeSpan(v));
  auto assembler = TensorSetAssembler::Create(sent.header, dest);
  ASSERT_TRUE(assembler.ok());
  ASSERT_TRUE(AddInPieces(*assembler, sent, every_byte).ok());
  ASSERT_TRUE(assembler->Finish().ok());
  EXPECT_EQ(out, Expected(tensors, v1::DTYPE_BFLOAT16));
}

TEST(TensorCodecTest, ReducedDtypeErrorsStillReported) {
  const auto tensors = RandomTensors({100, 100});
  const Sent sent = EncodeAs(tensors, v1::DTYPE_FLOAT16, 64);
  std::vector<std::vector<float>> out = {std::vector<float>(100),
                                         std::vector<float>(100)};
  auto make = [&]() {
    return TensorSetAssembler::Create(
        sent.header, {absl::MakeSpan(out[0]), absl::MakeSpan(out[1])});
  };
  // Destination sized in bytes rather than elements.
  std::vector<float> wrong(50);
  auto mismatched = TensorSetAssembler::Create(
      sent.header, {absl::MakeSpan(wrong), absl::MakeSpan(out[1])});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("100 elements"), std::string::npos)
      << mismatched.status();

  // A piece that skips a byte of a split element.
  auto assembler = make();
  ASSERT_TRUE(assembler.ok());
  const std::string& first = sent.chunks[0].data();
  ASSERT_TRUE(assembler->Add(0, 0, absl::MakeConstSpan(first.data(), 3)).ok());
  absl::Status s = assembler->Add(0, 4, absl::MakeConstSpan(first.data() + 4, 2));
  EXPECT_NE(s.message().find("out of order"), std::string::npos) << s;
  // The next tensor before this one is complete, mid-element.
  s = assembler->Add(sent.chunks.back().tensor_index(), 0,
                     absl::MakeConstSpan(first.data(), 2));
  EXPECT_NE(s.message().find("tensor 0 is incomplete: 3 of 200 bytes"),
            std::string::npos)
      << s;
  // Finish with half an element held.
  s = assembler->Finish();
  EXPECT_NE(s.message().find("incomplete"), std::string::npos) << s;
  // Past the tensor's end.
  auto overrun = make();
  ASSERT_TRUE(overrun.ok());
  const std::string too_long(202, '\0');
  s = overrun->Add(0, 0, too_long);
  EXPECT_NE(s.message().find("does not fit"), std::string::npos) << s;
  // Chunks swapped.
  Sent swapped = sent;
  std::swap(swapped.chunks[0], swapped.chunks[1]);
  auto decoded = Decode(swapped);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("out of order"), std::string::npos);
}

}  // namespace
}  // namespace mpilearn
