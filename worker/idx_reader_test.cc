#include "worker/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
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
  EXPECT_THAT(a->dims, ElementsAre(3, 2, 2));
  EXPECT_THAT(a->data, ElementsAreArray(Iota(12)));
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
  EXPECT_THAT(a->data, ElementsAreArray(Iota(12)));
}

TEST(ReadIdxFileTest, ReadsLargeDimensionsBigEndian) {
  // 300 = 0x0000012C exercises more than the lowest header byte.
  const std::string path =
      WriteGzip("big-dim.gz", IdxBytes(0x08, {300}, Iota(300)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(300));
  EXPECT_THAT(a->data, ElementsAreArray(Iota(300)));
}

TEST(ReadIdxFileTest, MaxItemsReadsOnlyThePrefix) {
  const std::string path =
      WriteGzip("prefix.gz", IdxBytes(0x08, {4, 3}, Iota(12)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path, /*max_items=*/2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(2, 3));
  EXPECT_THAT(a->data, ElementsAre(0, 1, 2, 3, 4, 5));

  // More than the file holds: everything.
  a = ReadIdxFile(path, /*max_items=*/10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(4, 3));
  EXPECT_EQ(a->data.size(), 12u);
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
  EXPECT_THAT(a->data, ElementsAre(7, 9));
}

TEST(ReadIdxFileTest, AllowsAnEmptyArray) {
  absl::StatusOr<IdxArray> a =
      ReadIdxFile(WritePlain("empty-array", IdxBytes(0x08, {0, 28, 28}, {})));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->dims, ElementsAre(0, 28, 28));
  EXPECT_TRUE(a->data.empty());
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

TEST(ReadIdxFileTest, UnsupportedTypeNamesTheCode) {
  const std::string path =
      WritePlain("floats", IdxBytes(0x0D, {2}, std::vector<uint8_t>(8, 0)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
  EXPECT_THAT(a.status().message(), HasSubstr("0x0D (float32)"));
  EXPECT_THAT(a.status().message(), HasSubstr("not supported"));
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
                HasSubstr("[3, 2, 2], which need 12 bytes of data, but the "
                          "file has only 10"));
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
  ASSERT_EQ(a->data.size(), 10000u);
  for (uint8_t label : a->data) ASSERT_LT(label, 10);
}

}  // namespace
}  // namespace worker
}  // namespace mpilearn
