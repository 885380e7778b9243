#include "common/tensor_codec.h"

#include <numeric>
#include <random>

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
  auto sizes = TensorSetAssembler::ByteSizes(sent.header);
  if (!sizes.ok()) return sizes.status();
  std::vector<std::vector<float>> out;
  std::vector<absl::Span<char>> dest;
  for (size_t bytes : *sizes) out.emplace_back(bytes / sizeof(float));
  for (auto& v : out) dest.push_back(AsWritableBytes(absl::MakeSpan(v)));
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

TEST(TensorCodecTest, RejectsUnsupportedDtype) {
  Sent sent = Encode(RandomTensors({8}), 512);
  sent.header.mutable_tensors(0)->set_dtype(v1::DTYPE_FLOAT16);
  auto decoded = Decode(sent);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("DTYPE_FLOAT16"), std::string::npos);
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
  TensorSetHeader dtype = want;
  dtype.mutable_tensors(1)->set_dtype(v1::DTYPE_BFLOAT16);
  EXPECT_NE(CheckSameLayout(want, dtype).message().find("DTYPE_BFLOAT16"),
            std::string::npos);
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

}  // namespace
}  // namespace mpilearn
