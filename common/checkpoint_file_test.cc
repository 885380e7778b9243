#include "common/checkpoint_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

using ::testing::HasSubstr;

v1::JobCheckpointFile SampleCheckpoint() {
  v1::JobCheckpointFile file;
  file.mutable_status()->set_job_id("job-000001");
  file.mutable_status()->set_stop_reason("target reached");
  *file.mutable_weights() =
      ToTensorSet(MakeFloat32Header(812, {"w"}, {{3}}), {{1.5f, -2, 3}});
  file.mutable_queue()->set_train_samples(450);
  file.set_created_unix_seconds(1234.5);
  return file;
}

// CRC-32 by its bitwise definition (IEEE 802.3, reflected polynomial
// 0xEDB88320), independent of zlib.
uint32_t ReferenceCrc32(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

// The bytes EncodeCheckpoint would write for `payload`, built by hand.
std::string WithTrailer(const std::string& payload) {
  std::string bytes = payload;
  const uint32_t crc = ReferenceCrc32(payload);
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
  return bytes + "MLCK";
}

TEST(CheckpointFileTest, LayoutIsPayloadThenLittleEndianCrc32ThenMagic) {
  // The reference CRC gives the standard check value.
  ASSERT_EQ(ReferenceCrc32("123456789"), 0xCBF43926u);
  const v1::JobCheckpointFile file = SampleCheckpoint();
  const std::string bytes = EncodeCheckpoint(file).value();
  EXPECT_EQ(bytes, WithTrailer(file.SerializeAsString()));
  EXPECT_EQ(bytes.size(), file.ByteSizeLong() + kCheckpointTrailerBytes);
}

TEST(CheckpointFileTest, RoundTrip) {
  const v1::JobCheckpointFile file = SampleCheckpoint();
  const std::string bytes = EncodeCheckpoint(file).value();
  auto decoded = DecodeCheckpoint(bytes, "x");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->SerializeAsString(), file.SerializeAsString());
  EXPECT_EQ(decoded->weights().header().version(), 812);
  EXPECT_EQ(decoded->status().stop_reason(), "target reached");

  // An empty message is a valid checkpoint too (payload of 0 bytes).
  auto empty = DecodeCheckpoint(
      EncodeCheckpoint(v1::JobCheckpointFile()).value(), "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->ByteSizeLong(), 0u);
}

TEST(CheckpointFileTest, BadCrcIsDataLossNamingTheFile) {
  const std::string bytes = EncodeCheckpoint(SampleCheckpoint()).value();
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  auto damaged = DecodeCheckpoint(flipped, "ckpt-a.pb");
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.status().message()),
              HasSubstr("'ckpt-a.pb' is damaged: CRC-32"));

  // A damaged checksum with an intact payload fails the same way.
  std::string bad_trailer = bytes;
  bad_trailer[bytes.size() - kCheckpointTrailerBytes] ^= 0x01;
  EXPECT_EQ(DecodeCheckpoint(bad_trailer, "t").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointFileTest, TruncationIsDataLoss) {
  const std::string bytes = EncodeCheckpoint(SampleCheckpoint()).value();
  // Every cut of the tail loses the trailer.
  for (size_t cut = 1; cut <= kCheckpointTrailerBytes + 2; ++cut) {
    auto truncated = DecodeCheckpoint(bytes.substr(0, bytes.size() - cut), "b");
    EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_THAT(std::string(truncated.status().message()),
                HasSubstr("truncated"))
        << cut;
  }
  // A payload cut short with the trailer copied after it fails the checksum.
  auto cut = DecodeCheckpoint(
      bytes.substr(0, 10) + bytes.substr(bytes.size() - kCheckpointTrailerBytes),
      "c");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointFileTest, MissingTrailerIsDataLoss) {
  // A bare serialized message (what weights.pb holds) is not a checkpoint.
  const std::string bare = SampleCheckpoint().SerializeAsString();
  auto status = DecodeCheckpoint(bare, "weights.pb").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no MLCK trailer"));
  EXPECT_EQ(DecodeCheckpoint("", "e").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeCheckpoint("MLCK", "m").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointFileTest, PayloadThatDoesNotParseIsDataLoss) {
  // A correct trailer over bytes that are not a JobCheckpointFile.
  const std::string bytes = WithTrailer("\xff\xff\xff\xff");
  auto status = DecodeCheckpoint(bytes, "g").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("does not parse"));
}

class CheckpointFileOnDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/checkpoint_file_test.",
                        getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(CheckpointFileOnDiskTest, WriteThenReadAndNoTempFileLeft) {
  const std::string path = dir_ + "/ckpt.pb";
  const v1::JobCheckpointFile file = SampleCheckpoint();
  ASSERT_TRUE(WriteFileAtomically(path, EncodeCheckpoint(file).value()).ok());
  auto read = ReadCheckpointFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), file.SerializeAsString());

  // Overwriting replaces the file whole.
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(ReadWholeFile(path).value(), "second");
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StrContains(entry.path().filename().string(),
                                   kAtomicWriteTempInfix))
        << entry.path();
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(CheckpointFileOnDiskTest, ReadErrors) {
  EXPECT_EQ(ReadCheckpointFile(dir_ + "/missing.pb").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = dir_ + "/short.pb";
  { std::ofstream(path, std::ios::binary) << "abc"; }
  auto status = ReadCheckpointFile(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_EQ(WriteFileAtomically(dir_ + "/no/such/dir/f", "x").code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mpilearn
