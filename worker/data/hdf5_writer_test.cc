// Hdf5DataWriter's files in each layout (contiguous, chunked, gzip'd) read
// back through OpenDataFile, and the chunk size it refuses.
#include "worker/data/hdf5_writer.h"

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

struct LayoutCase {
  const char* name;
  Hdf5Layout layout;
};

class Hdf5DataWriterTest : public ::testing::TestWithParam<LayoutCase> {};

// uint8 images [5, 2, 3] and int16 class labels [5], written in two blocks,
// read back as the worker reads them: features scaled by 1/255 with a
// channel added, labels as int64 class indices.
TEST_P(Hdf5DataWriterTest, RowsReadBackAsWritten) {
  const std::string path = TempPath(absl::StrCat(GetParam().name, ".h5"));
  const int64_t rows = 5;
  const StoredArray features{ElementType::kUint8, {rows, 2, 3}};
  const StoredArray labels{ElementType::kInt16, {rows}};
  EXPECT_EQ(features.RowElements(), 6);
  EXPECT_EQ(DescribeStoredArray(features), "uint8 [5, 2, 3]");

  const torch::Tensor pixels =
      torch::arange(rows * 6, torch::kFloat32).mul_(7).remainder_(256);
  const torch::Tensor classes =
      torch::tensor({3, -1, 300, 0, 9}, torch::kInt64);
  absl::StatusOr<std::unique_ptr<Hdf5DataWriter>> writer =
      Hdf5DataWriter::Create(path, features, labels, GetParam().layout);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)
                  ->WriteRows(0, 2, pixels.slice(0, 0, 12),
                              classes.slice(0, 0, 2))
                  .ok());
  ASSERT_TRUE((*writer)
                  ->WriteRows(2, 3, pixels.slice(0, 12, 30).contiguous(),
                              classes.slice(0, 2, 5).contiguous())
                  .ok());
  ASSERT_TRUE((*writer)->Finish().ok());

  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->rows(), rows);
  EXPECT_EQ((*file)->feature_type(), ElementType::kUint8);
  EXPECT_EQ((*file)->label_type(), ElementType::kInt16);
  EXPECT_THAT((*file)->feature_shape(), ElementsAre(2, 3));
  absl::StatusOr<DataRows> read = (*file)->Read(0, rows);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(torch::allclose(read->features,
                              pixels.view({rows, 1, 2, 3}).div(255.0)));
  EXPECT_TRUE(torch::equal(read->labels, classes));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Hdf5DataWriterTest,
    ::testing::Values(LayoutCase{"contiguous", {0, 0}},
                      LayoutCase{"chunked", {2, 0}},
                      LayoutCase{"gzip", {4, 6}}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) {
      return std::string(info.param.name);
    });

TEST(Hdf5DataWriterErrorsTest, RefusesChunksOfFourGibOrMore) {
  const std::string path = TempPath("huge_chunks.h5");
  // 1024 rows of 2^20 float64 values: 8 GiB a chunk.
  const absl::StatusOr<std::unique_ptr<Hdf5DataWriter>> writer =
      Hdf5DataWriter::Create(path, {ElementType::kFloat64, {4096, 1 << 20}},
                             {ElementType::kInt64, {4096}}, {1024, 0});
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(writer.status().message(), HasSubstr("'features'"));
  EXPECT_THAT(writer.status().message(), HasSubstr("lower --chunk_rows"));
}

TEST(Hdf5DataWriterErrorsTest, NamesAFileThatCannotBeCreated) {
  const std::string path = TempPath("no/such/dir/x.h5");
  const absl::StatusOr<std::unique_ptr<Hdf5DataWriter>> writer =
      Hdf5DataWriter::Create(path, {ElementType::kFloat32, {1, 1}},
                             {ElementType::kInt64, {1}}, {});
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(writer.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace mpilearn::worker
