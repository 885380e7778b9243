// Runs the convert_data binary on small IDX and .npy data sets written
// here, reads the HDF5 files back through OpenDataFile and compares them
// with the values written (recomputed in double precision), and checks the
// usage and read errors.
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_file.h"

namespace mpilearn {
namespace {

using ::mpilearn::worker::DataFile;
using ::mpilearn::worker::DataRows;
using ::mpilearn::worker::ElementType;
using ::mpilearn::worker::OpenDataFile;
using ::testing::HasSubstr;

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult RunTool(const std::vector<std::string>& args) {
  std::string command = ShellQuote(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/mpilearn/tools/data/convert_data"));
  for (const std::string& arg : args) {
    absl::StrAppend(&command, " ", ShellQuote(arg));
  }
  absl::StrAppend(&command, " 2>&1");
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << command;
    return result;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// An IDX file: type code, big-endian dims, then `data` (already big-endian
// element bytes), gzip'd when the name ends in .gz.
void WriteIdx(const std::string& path, uint8_t type,
              const std::vector<uint32_t>& dims, const std::string& data) {
  std::string bytes = {0, 0, static_cast<char>(type),
                       static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      bytes.push_back(static_cast<char>((d >> shift) & 0xff));
    }
  }
  bytes += data;
  if (path.size() > 3 && path.substr(path.size() - 3) == ".gz") {
    gzFile gz = gzopen(path.c_str(), "wb");
    ASSERT_NE(gz, nullptr);
    ASSERT_EQ(gzwrite(gz, bytes.data(), bytes.size()),
              static_cast<int>(bytes.size()));
    gzclose(gz);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
}

// Expects `t` to have `sizes` and hold `expected`, each within `tolerance`.
void ExpectValues(const torch::Tensor& t, const std::vector<int64_t>& sizes,
                  const std::vector<double>& expected, double tolerance = 0.0) {
  ASSERT_EQ(t.sizes().vec(), sizes);
  const torch::Tensor flat = t.to(torch::kFloat64).contiguous().view({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(flat[i].item<double>(), expected[i], tolerance) << "at " << i;
  }
}

uint8_t Pixel(int i, int j, int k) { return (i * 37 + j * 11 + k * 3) % 256; }

// uint8 images [30, 5, 4] and labels [30] as gzip'd IDX, as Fashion-MNIST.
struct ImageSet {
  std::string features;
  std::string labels;
};
ImageSet WriteImageIdx(const std::string& name) {
  std::string images, labels;
  for (int i = 0; i < 30; ++i) {
    for (int j = 0; j < 5; ++j) {
      for (int k = 0; k < 4; ++k)
        images.push_back(static_cast<char>(Pixel(i, j, k)));
    }
    labels.push_back(static_cast<char>(i % 10));
  }
  ImageSet set = {TempPath(name + "-images.gz"), TempPath(name + "-labels.gz")};
  WriteIdx(set.features, 0x08, {30, 5, 4}, images);
  WriteIdx(set.labels, 0x08, {30}, labels);
  return set;
}

TEST(ConvertDataTest, IdxImagesReadBackLikeIdx) {
  const ImageSet idx = WriteImageIdx("images");
  for (const std::vector<std::string>& layout :
       std::vector<std::vector<std::string>>{
           {"--chunk_rows", "0"},
           {"--chunk_rows", "7"},
           {"--chunk_rows", "7", "--gzip", "6"}}) {
    SCOPED_TRACE(absl::StrJoin(layout, " "));
    const std::string out = TempPath("images.h5");
    std::vector<std::string> args = {"--features", idx.features, "--labels",
                                     idx.labels,   "--out",      out};
    args.insert(args.end(), layout.begin(), layout.end());
    const RunResult run = RunTool(args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output,
                HasSubstr("features uint8 [30, 5, 4], labels uint8 [30]"));

    absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(out);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->rows(), 30);
    EXPECT_EQ((*file)->feature_type(), ElementType::kUint8);
    EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{5, 4}));
    absl::StatusOr<DataRows> rows = (*file)->Read(5, 23);
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::vector<double> features, labels;
    for (int i = 5; i < 23; ++i) {
      for (int j = 0; j < 5; ++j) {
        for (int k = 0; k < 4; ++k) features.push_back(Pixel(i, j, k) / 255.0);
      }
      labels.push_back(i % 10);
    }
    // As from IDX: scaled by 1/255, a channel added, class indices.
    ExpectValues(rows->features, {18, 1, 5, 4}, features, 6e-8);
    EXPECT_EQ(rows->labels.scalar_type(), torch::kInt64);
    ExpectValues(rows->labels, {18}, labels);
  }
}

TEST(ConvertDataTest, FloatIdxWithLimit) {
  // float32 features [12, 3] (plain IDX), signed-byte labels [12].
  std::string features, labels;
  auto value = [](int i, int j) { return (i - 6) * 0.75 + j / 4.0; };
  for (int i = 0; i < 12; ++i) {
    for (int j = 0; j < 3; ++j) {
      const float f = static_cast<float>(value(i, j));
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      for (int shift = 24; shift >= 0; shift -= 8) {
        features.push_back(static_cast<char>((bits >> shift) & 0xff));
      }
    }
    labels.push_back(static_cast<char>(i - 6));
  }
  const std::string features_path = TempPath("float-features.idx");
  const std::string labels_path = TempPath("float-labels.idx");
  WriteIdx(features_path, 0x0D, {12, 3}, features);
  WriteIdx(labels_path, 0x09, {12}, labels);

  const std::string out = TempPath("float.h5");
  const RunResult run = RunTool({"--features", features_path, "--labels",
                                 labels_path, "--out", out, "--limit", "8"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->rows(), 8);
  EXPECT_EQ((*file)->label_type(), ElementType::kInt8);
  absl::StatusOr<DataRows> rows = (*file)->Read(0, 8);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<double> expected_features, expected_labels;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 3; ++j) expected_features.push_back(value(i, j));
    expected_labels.push_back(i - 6);
  }
  ExpectValues(rows->features, {8, 3}, expected_features);
  ExpectValues(rows->labels, {8}, expected_labels);
}

// A .npy file (version 1, little-endian, C order) of `descr` and `shape`.
void WriteNpy(const std::string& path, const std::string& descr,
              const std::string& shape, const std::string& data) {
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", shape, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string bytes = "\x93NUMPY\x01";
  bytes.push_back('\0');
  bytes.push_back(static_cast<char>(header.size() & 0xff));
  bytes.push_back(static_cast<char>(header.size() >> 8));
  std::ofstream(path, std::ios::binary) << bytes << header << data;
}

TEST(ConvertDataTest, NumpyPairKeepsUint8AndClassLabels) {
  std::string images, labels;
  for (int i = 0; i < 30; ++i) {
    for (int j = 0; j < 5; ++j) {
      for (int k = 0; k < 4; ++k)
        images.push_back(static_cast<char>(Pixel(i, j, k)));
    }
    const int64_t label = (i * 3) % 7;
    labels.append(reinterpret_cast<const char*>(&label), 8);
  }
  const std::string features_path = TempPath("set_features.npy");
  WriteNpy(features_path, "|u1", "30, 5, 4", images);
  WriteNpy(TempPath("set_labels.npy"), "<i8", "30,", labels);

  const std::string out = TempPath("from_numpy.h5");
  const RunResult run =
      RunTool({"--features", features_path, "--out", out, "--gzip", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("features uint8 [30, 5, 4], labels int64 [30]"));
  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenDataFile(out);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<DataRows> rows = (*file)->Read(0, 30);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<double> features, expected_labels;
  for (int i = 0; i < 30; ++i) {
    for (int j = 0; j < 5; ++j) {
      for (int k = 0; k < 4; ++k) features.push_back(Pixel(i, j, k) / 255.0);
    }
    expected_labels.push_back((i * 3) % 7);
  }
  ExpectValues(rows->features, {30, 1, 5, 4}, features, 6e-8);
  ExpectValues(rows->labels, {30}, expected_labels);
}

TEST(ConvertDataTest, UsageErrors) {
  const ImageSet idx = WriteImageIdx("usage");
  const std::string out = TempPath("usage.h5");
  const std::vector<std::vector<std::string>> cases = {
      {"--features", idx.features, "--out", out},            // no --labels
      {"--labels", idx.labels, "--out", out},                // no --features
      {"--features", idx.features, "--labels", idx.labels},  // no --out
      {"--features", "x.npy", "--labels", idx.labels, "--out", out},
      {"--features", idx.features, "--labels", idx.labels, "--out", out,
       "--chunk_rows", "0", "--gzip", "4"},
      {"--features", idx.features, "--labels", idx.labels, "--out", out,
       "--gzip", "10"},
      {"--features", idx.features, "--labels", idx.labels, "--out", out,
       "--limit", "-1"},
      {"--features", idx.features, "--labels", idx.labels, "--out", out,
       "--no_such_flag", "1"},
  };
  for (const std::vector<std::string>& args : cases) {
    const RunResult run = RunTool(args);
    EXPECT_EQ(run.exit_code, 2) << absl::StrJoin(args, " ") << "\n"
                                << run.output;
    EXPECT_THAT(run.output, HasSubstr("Try 'convert_data --help'"));
  }
  EXPECT_FALSE(Exists(out));
  EXPECT_EQ(RunTool({"--help"}).exit_code, 0);
}

TEST(ConvertDataTest, ReadErrorsLeaveNoOutput) {
  const ImageSet idx = WriteImageIdx("errors");
  const std::string out = TempPath("errors.h5");
  RunResult run = RunTool({"--features", TempPath("missing.gz"), "--labels",
                           idx.labels, "--out", out});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("missing.gz"));

  // Features and labels with different counts.
  const std::string short_labels = TempPath("short-labels");
  WriteIdx(short_labels, 0x08, {3}, std::string("\x01\x02\x03", 3));
  run = RunTool(
      {"--features", idx.features, "--labels", short_labels, "--out", out});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("holds 30 items"));
  EXPECT_FALSE(Exists(out));
}

}  // namespace
}  // namespace mpilearn
