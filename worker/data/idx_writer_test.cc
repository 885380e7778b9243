// IdxGzWriter's files read back through ReadIdxFile, and the writer's own
// errors.
#include "worker/data/idx_writer.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/idx_reader.h"

namespace mpilearn::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

TEST(IdxGzWriterTest, FloatsReadBackExactlyInRowsWrittenInPieces) {
  const std::string path = TempPath("floats.idx.gz");
  // Values whose bytes differ from each other in every position, so a byte
  // order mistake shows.
  const std::vector<float> values = {1.5f, -2.25f, 3.0e-8f, 65504.0f,
                                     -0.0f, 1.0e20f};
  IdxGzWriter writer;
  ASSERT_TRUE(writer.Open(path, IdxType::kFloat32, {3, 2}).ok());
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(values.data(), 4)).ok());
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(values.data() + 4, 2)).ok());
  ASSERT_TRUE(writer.Close().ok());

  const absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->type, IdxType::kFloat32);
  EXPECT_THAT(read->dims, ElementsAre(3, 2));
  EXPECT_THAT(read->values, ElementsAreArray(values));
}

TEST(IdxGzWriterTest, BytesReadBackWithTheirShape) {
  const std::string path = TempPath("bytes.idx.gz");
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 2 * 3 * 4; ++i) {
    bytes.push_back(static_cast<uint8_t>(i * 11));
  }
  IdxGzWriter writer;
  ASSERT_TRUE(writer.Open(path, IdxType::kUnsignedByte, {2, 3, 4}).ok());
  EXPECT_EQ(writer.path(), path);
  EXPECT_EQ(writer.type(), IdxType::kUnsignedByte);
  EXPECT_THAT(writer.dims(), ElementsAre(2, 3, 4));
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(bytes)).ok());
  ASSERT_TRUE(writer.Close().ok());

  const absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->type, IdxType::kUnsignedByte);
  EXPECT_THAT(read->dims, ElementsAre(2, 3, 4));
  ASSERT_EQ(read->values.size(), bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_EQ(read->values[i], bytes[i]) << i;
  }
}

TEST(IdxGzWriterTest, CloseRefusesAnElementCountOtherThanDeclared) {
  const std::string path = TempPath("short.idx.gz");
  const std::vector<uint8_t> bytes = {1, 2, 3};
  IdxGzWriter writer;
  ASSERT_TRUE(writer.Open(path, IdxType::kUnsignedByte, {4}).ok());
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(bytes)).ok());
  const absl::Status closed = writer.Close();
  EXPECT_EQ(closed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(closed.message(), HasSubstr("wrote 3 elements but declared 4"));
}

TEST(IdxGzWriterTest, OpenNamesAFileThatCannotBeCreated) {
  const std::string path = TempPath("no/such/dir/x.idx.gz");
  IdxGzWriter writer;
  const absl::Status opened = writer.Open(path, IdxType::kFloat32, {1});
  EXPECT_FALSE(opened.ok());
  EXPECT_THAT(opened.message(), HasSubstr(path));
}

}  // namespace
}  // namespace mpilearn::worker
