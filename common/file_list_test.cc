#include "common/file_list.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mpilearn {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(FileListTest, DataFilesAreTakenAsGiven) {
  EXPECT_TRUE(IsDataFile("/d/a.H5"));
  EXPECT_TRUE(IsDataFile("b.hdf5"));
  EXPECT_TRUE(IsDataFile("c.npz"));
  EXPECT_TRUE(IsDataFile("d.NPY"));
  EXPECT_FALSE(IsDataFile("files.txt"));
  const std::vector<std::string> two = {"/d/a.h5", "/d/b.npz"};
  EXPECT_EQ(ExpandFileList("train_files", two).value(), two);
  EXPECT_TRUE(ExpandFileList("train_files", {}).value().empty());
}

TEST(FileListTest, ATextFileListsPathsRelativeToItsDirectory) {
  const std::string list = Write(
      "list.txt", "# training files\n a.h5 \n\n/abs/b.npz\n#c.h5\nsub/c.npy\n");
  const std::filesystem::path dir = std::filesystem::path(list).parent_path();
  const std::vector<std::string> expected = {(dir / "a.h5").string(),
                                             "/abs/b.npz",
                                             (dir / "sub/c.npy").string()};
  EXPECT_EQ(ExpandFileList("train_files", {list}).value(), expected);
}

TEST(FileListTest, BadListsAreRefusedNamingTheField) {
  const absl::Status missing =
      ExpandFileList("test_files", {"/no/such/list.txt"}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("data.test_files: cannot read the file list"),
            std::string::npos)
      << missing;
  const absl::Status empty =
      ExpandFileList("validation_files", {Write("empty.txt", "# none\n\n")})
          .status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("data.validation_files: the file list"),
            std::string::npos)
      << empty;
}

}  // namespace
}  // namespace mpilearn
