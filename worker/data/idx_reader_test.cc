#include "worker/data/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace worker {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Bytes of an IDX file with the given header fields and payload.
std::vector<uint8_t> IdxBytes(uint8_t type, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(d >> 24);
    out.push_back((d >> 16) & 0xff);
    out.push_back((d >> 8) & 0xff);
    out.push_back(d & 0xff);
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> Iota(int n) {
  std::vector<uint8_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i);
  return v;
}

// Iota(n) as the reader returns it.
std::vector<float> IotaValues(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i % 256);
  return v;
}

// The big-endian bytes of each of `values`, stored as T: the host's bytes
// reversed (x86 is little-endian), a different route from the reader's
// shifts.
template <typename T>
std::vector<uint8_t> BigEndianBytes(const std::vector<T>& values) {
  static_assert(sizeof(T) <= 8, "IDX elements are at most 8 bytes");
  std::vector<uint8_t> out;
  for (const T v : values) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (int i = sizeof(T) - 1; i >= 0; --i) out.push_back(b[i]);
  }
  return out;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

std::string WritePlain(const std::string& name,
                       const std::vector<uint8_t>& bytes) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_TRUE(out.good()) << path;
  return path;
}

std::string WriteGzip(const std::string& name,
                      const std::vector<uint8_t>& bytes) {
  const std::string path = TempPath(name);
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  EXPECT_EQ(gzwrite(f, bytes.data(), bytes.size()),
            static_cast<int>(bytes.size()));
  EXPECT_EQ(gzclose(f), Z_OK);
  return path;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(ReadIdxFileTest, ReadsPlainFile) {
  const std::string path =
      WritePlain("plain-idx3", IdxBytes(0x08, {3, 2, 2}, Iota(12)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kUnsignedByte);
  EXPECT_THAT(a->dims, ElementsAre(3, 2, 2));
  EXPECT_THAT(a->values, ElementsAreArray(IotaValues(12)));
}

TEST(ReadIdxFileTest, ReadsGzipFile) {
  const std::string path =
      WriteGzip("gz-idx3.gz", IdxBytes(0x08, {3, 2, 2}, Iota(12)));
  // The file on disk really is gzip'd.
  const std::vector<uint8_t> raw = ReadAll(path);
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(raw[0], 0x1f);
  EXPECT_EQ(raw[1], 0x8b);

  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(3, 2, 2));
  EXPECT_THAT(a->values, ElementsAreArray(IotaValues(12)));
}

TEST(ReadIdxFileTest, ReadsLargeDimensionsBigEndian) {
  // 300 = 0x0000012C exercises more than the lowest header byte.
  const std::string path =
      WriteGzip("big-dim.gz", IdxBytes(0x08, {300}, Iota(300)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(300));
  EXPECT_THAT(a->values, ElementsAreArray(IotaValues(300)));
}

TEST(ReadIdxFileTest, MaxItemsReadsOnlyThePrefix) {
  const std::string path =
      WriteGzip("prefix.gz", IdxBytes(0x08, {4, 3}, Iota(12)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, /*max_items=*/2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(2, 3));
  EXPECT_THAT(a->values, ElementsAre(0, 1, 2, 3, 4, 5));

  // More than the file holds: everything.
  a = ReadIdxFile(path, /*max_items=*/10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(4, 3));
  EXPECT_EQ(a->values.size(), 12u);
}

TEST(ReadIdxFileTest, MaxItemsSkipsTheCheckOfDataItDoesNotRead) {
  // Header says 4 items, only 2 are present: reading 2 is fine.
  const std::string path =
      WritePlain("short-but-enough", IdxBytes(0x08, {4, 3}, Iota(6)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, /*max_items=*/2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(2, 3));
}

TEST(ReadIdxFileTest, IgnoresTrailingBytes) {
  std::vector<uint8_t> bytes = IdxBytes(0x08, {2}, {7, 9});
  bytes.push_back(0xAA);
  bytes.push_back(0xBB);
  absl::StatusOr<IdxArray> a = ReadIdxFile(WritePlain("trailing", bytes));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->values, ElementsAre(7, 9));
}

TEST(ReadIdxFileTest, AllowsAnEmptyArray) {
  absl::StatusOr<IdxArray> a =
      ReadIdxFile(WritePlain("empty-array", IdxBytes(0x08, {0, 28, 28}, {})));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(0, 28, 28));
  EXPECT_TRUE(a->values.empty());
}

TEST(ReadIdxFileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("no-such-file.gz");
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound) << a.status();
  EXPECT_THAT(a.status().message(),
              HasSubstr("cannot open '" + path + "': No such file"));
}

TEST(ReadIdxFileTest, BadMagicIsInvalidArgument) {
  // A PNG signature, gzip'd: the gzip layer is fine, the content is not IDX.
  const std::string path = WriteGzip(
      "not-idx.gz", {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0});
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
  EXPECT_THAT(a.status().message(), HasSubstr("not an IDX file"));
  EXPECT_THAT(a.status().message(), HasSubstr("89 50 4e 47"));
  EXPECT_THAT(a.status().message(),
              HasSubstr("is this a gzip'd IDX file like "
                        "train-images-idx3-ubyte.gz?"));
}

TEST(ReadIdxFileTest, TooShortForMagicIsInvalidArgument) {
  const std::string path = WritePlain("two-bytes", {0, 0});
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
  EXPECT_THAT(a.status().message(), HasSubstr("only 2 bytes"));
}

TEST(ReadIdxFileTest, ZeroDimensionsIsInvalidArgument) {
  const std::string path = WritePlain("zero-dims", {0, 0, 0x08, 0});
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
  EXPECT_THAT(a.status().message(), HasSubstr("declares 0 dimensions"));
}

TEST(ReadIdxFileTest, TooManyDimensionsIsInvalidArgument) {
  const std::string path = WritePlain("many-dims", {0, 0, 0x08, 200});
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("declares 200 dimensions"));
}

TEST(ReadIdxFileTest, HugeDimensionsAreInvalidArgument) {
  const std::string path = WritePlain(
      "huge-dims", IdxBytes(0x08, {0xffffffff, 0xffffffff, 0xffffffff}, {}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("more than the supported"));
}

TEST(ReadIdxFileTest, ElementLimitIsTwoToThe34) {
  // 2^35 elements: refused before any data is read.
  absl::StatusOr<IdxArray> a = ReadIdxFile(WritePlain(
      "over-limit", IdxBytes(0x0D, {1u << 17, 1u << 17, 2}, {})));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(),
              HasSubstr("more than the supported 17179869184 elements"));

  // Exactly 2^34 is allowed by the header check; the missing data is then
  // DataLoss, and memory follows the bytes present, not the 64 GiB claimed.
  a = ReadIdxFile(
      WritePlain("at-limit", IdxBytes(0x0D, {1u << 17, 1u << 17}, {1, 2})));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr("the file has only 2"));
}

TEST(ReadIdxFileTest, ReadsSignedBytes) {
  const std::string path = WriteGzip(
      "sbyte.gz", IdxBytes(0x09, {4}, {0x80, 0xFF, 0x00, 0x7F}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kSignedByte);
  EXPECT_THAT(a->values, ElementsAre(-128, -1, 0, 127));
}

TEST(ReadIdxFileTest, ReadsInt16) {
  // Written out by hand once, so the encoder below is checked too.
  std::vector<uint8_t> payload = {0xFF, 0xFE, 0x01, 0x2C};  // -2, 300
  EXPECT_EQ(payload, BigEndianBytes<int16_t>({-2, 300}));
  const std::vector<int16_t> more = {-32768, 32767, 0};
  const std::vector<uint8_t> more_bytes = BigEndianBytes(more);
  payload.insert(payload.end(), more_bytes.begin(), more_bytes.end());
  absl::StatusOr<IdxArray> a =
      ReadIdxFile(WriteGzip("int16.gz", IdxBytes(0x0B, {5, 1}, payload)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kInt16);
  EXPECT_THAT(a->dims, ElementsAre(5, 1));
  EXPECT_THAT(a->values, ElementsAre(-2, 300, -32768, 32767, 0));
}

TEST(ReadIdxFileTest, ReadsInt32) {
  EXPECT_EQ(BigEndianBytes<int32_t>({-70000}),
            (std::vector<uint8_t>{0xFF, 0xFE, 0xEE, 0x90}));
  const std::vector<int32_t> ints = {-70000, 16777216, 123456, 0, -1,
                                     std::numeric_limits<int32_t>::min()};
  absl::StatusOr<IdxArray> a = ReadIdxFile(
      WritePlain("int32", IdxBytes(0x0C, {3, 2}, BigEndianBytes(ints))));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kInt32);
  EXPECT_THAT(a->dims, ElementsAre(3, 2));
  // -2^31 is a power of two, so float holds it exactly too.
  EXPECT_THAT(a->values,
              ElementsAre(-70000, 16777216, 123456, 0, -1, -2147483648.0f));
}

TEST(ReadIdxFileTest, ReadsFloat32) {
  EXPECT_EQ(BigEndianBytes<float>({1.0f}),
            (std::vector<uint8_t>{0x3F, 0x80, 0x00, 0x00}));
  const std::vector<float> floats = {
      -1.5f, 0.0f, 3.25e-3f, 1e30f, std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::denorm_min()};
  absl::StatusOr<IdxArray> a = ReadIdxFile(
      WriteGzip("float32.gz", IdxBytes(0x0D, {2, 3}, BigEndianBytes(floats))));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kFloat32);
  EXPECT_THAT(a->dims, ElementsAre(2, 3));
  // Bit-exact: float32 passes through unchanged.
  EXPECT_THAT(a->values, ElementsAreArray(floats));
}

TEST(ReadIdxFileTest, ReadsFloat32NaN) {
  const std::vector<float> floats = {std::nanf("")};
  absl::StatusOr<IdxArray> a = ReadIdxFile(
      WritePlain("float32-nan", IdxBytes(0x0D, {1}, BigEndianBytes(floats))));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->values.size(), 1u);
  EXPECT_TRUE(std::isnan(a->values[0]));
}

TEST(ReadIdxFileTest, ReadsFloat64RoundedToFloat) {
  EXPECT_EQ(BigEndianBytes<double>({1.0}),
            (std::vector<uint8_t>{0x3F, 0xF0, 0, 0, 0, 0, 0, 0}));
  const std::vector<double> doubles = {0.1, -2.5, 1e300, -1e300, 1e-320,
                                       123456789.0};
  absl::StatusOr<IdxArray> a = ReadIdxFile(
      WriteGzip("float64.gz", IdxBytes(0x0E, {6}, BigEndianBytes(doubles))));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, IdxType::kFloat64);
  const float inf = std::numeric_limits<float>::infinity();
  // 0.1 and 123456789 round to the nearest float; values beyond float's
  // range saturate; a double denormal underflows to zero.
  EXPECT_THAT(a->values, ElementsAre(0.1f, -2.5f, inf, -inf, 0.0f,
                                     123456792.0f));
}

TEST(ReadIdxFileTest, MaxItemsCountsItemsNotBytes) {
  std::vector<double> doubles(12);
  for (int i = 0; i < 12; ++i) doubles[i] = i * 0.5;
  absl::StatusOr<IdxArray> a = ReadIdxFile(
      WriteGzip("float64-prefix.gz",
                IdxBytes(0x0E, {4, 3}, BigEndianBytes(doubles))),
      /*max_items=*/2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(2, 3));
  EXPECT_THAT(a->values, ElementsAre(0, 0.5, 1, 1.5, 2, 2.5));
}

TEST(ReadIdxFileTest, TruncatedMultiByteDataCountsBytes) {
  // 3 float32 declared; 9 bytes present (two and a quarter elements).
  std::vector<uint8_t> payload = BigEndianBytes<float>({1, 2, 3});
  payload.resize(9);
  absl::StatusOr<IdxArray> a =
      ReadIdxFile(WritePlain("short-floats", IdxBytes(0x0D, {3}, payload)));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(),
              HasSubstr("[3], which need 12 bytes of data (float32, 4 bytes "
                        "each), but the file has only 9"));
}

TEST(IdxTypeTest, NamesSizesAndKinds) {
  EXPECT_EQ(IdxTypeName(IdxType::kUnsignedByte), "unsigned byte");
  EXPECT_EQ(IdxTypeName(IdxType::kFloat64), "float64");
  EXPECT_EQ(IdxTypeBytes(IdxType::kUnsignedByte), 1);
  EXPECT_EQ(IdxTypeBytes(IdxType::kSignedByte), 1);
  EXPECT_EQ(IdxTypeBytes(IdxType::kInt16), 2);
  EXPECT_EQ(IdxTypeBytes(IdxType::kInt32), 4);
  EXPECT_EQ(IdxTypeBytes(IdxType::kFloat32), 4);
  EXPECT_EQ(IdxTypeBytes(IdxType::kFloat64), 8);
  EXPECT_TRUE(IsIntegerIdxType(IdxType::kInt32));
  EXPECT_TRUE(IsIntegerIdxType(IdxType::kSignedByte));
  EXPECT_FALSE(IsIntegerIdxType(IdxType::kFloat32));
  EXPECT_FALSE(IsIntegerIdxType(IdxType::kFloat64));
}

TEST(ReadIdxFileTest, UnknownTypeNamesTheCode) {
  const std::string path = WritePlain("weird", IdxBytes(0x42, {1}, {0}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("unknown IDX element type code 0x42"));
}

TEST(ReadIdxFileTest, TruncatedHeaderIsDataLoss) {
  // Declares 3 dimensions, holds one and a half.
  const std::string path =
      WritePlain("short-header", {0, 0, 0x08, 3, 0, 0, 0, 5, 0, 0});
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
  EXPECT_THAT(a.status().message(), HasSubstr("ends after 1 of them"));
}

TEST(ReadIdxFileTest, TruncatedDataIsDataLoss) {
  for (const bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    const std::vector<uint8_t> bytes = IdxBytes(0x08, {3, 2, 2}, Iota(10));
    const std::string path = gzip ? WriteGzip("short-data.gz", bytes)
                                  : WritePlain("short-data", bytes);
    absl::StatusOr<IdxArray> a = ReadIdxFile(path);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(a.status().message(), HasSubstr(path));
    EXPECT_THAT(a.status().message(), HasSubstr("truncated"));
    EXPECT_THAT(a.status().message(),
                HasSubstr("[3, 2, 2], which need 12 bytes of data (unsigned "
                          "byte, 1 byte each), but the file has only 10"));
  }
}

TEST(ReadIdxFileTest, CutOffGzipStreamIsDataLoss) {
  const std::string whole =
      WriteGzip("whole.gz", IdxBytes(0x08, {1000}, std::vector<uint8_t>(
                                                       1000, 3)));
  std::vector<uint8_t> raw = ReadAll(whole);
  raw.resize(raw.size() / 2);
  const std::string path = WritePlain("cut.gz", raw);
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr(path));
}

TEST(ReadIdxFileTest, NegativeMaxItemsIsInvalidArgument) {
  const std::string path = WritePlain("neg", IdxBytes(0x08, {1}, {0}));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, -1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReadIdxFileTest, ReadsFashionMnistTestLabels) {
  const std::string path =
      "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    GTEST_SKIP() << path << " is not installed";
  }
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(10000));
  EXPECT_EQ(a->type, IdxType::kUnsignedByte);
  ASSERT_EQ(a->values.size(), 10000u);
  for (float label : a->values) ASSERT_LT(label, 10);
}

}  // namespace
}  // namespace worker
}  // namespace mpilearn
