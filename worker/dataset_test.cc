#include "worker/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace worker {
namespace {

using ::mpilearn::v1::DataSpec;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Pixel j of sample i in the generated files; distinct per sample so a test
// can tell which sample landed where.
uint8_t Pixel(int64_t i, int64_t j) { return (i * 7 + j) % 256; }
int64_t Label(int64_t i) { return i % 10; }

template <typename T>
std::string Message(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

void WriteGzipIdx(const std::string& path, const std::vector<uint32_t>& dims,
                  const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    bytes.push_back(d >> 24);
    bytes.push_back((d >> 16) & 0xff);
    bytes.push_back((d >> 8) & 0xff);
    bytes.push_back(d & 0xff);
  }
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Writes `n` images of h x w pixels to <prefix>-images.gz and their labels
// (Label(i) + label_offset) to <prefix>-labels.gz.
struct Files {
  std::string images;
  std::string labels;
};
Files WriteSplit(const std::string& prefix, int n, int h = 4, int w = 3,
                 int label_offset = 0) {
  Files files{TempPath(prefix + "-images.gz"), TempPath(prefix + "-labels.gz")};
  std::vector<uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < h * w; ++j) pixels.push_back(Pixel(i, j));
    labels.push_back(Label(i) + label_offset);
  }
  WriteGzipIdx(files.images, {static_cast<uint32_t>(n),
                              static_cast<uint32_t>(h),
                              static_cast<uint32_t>(w)},
               pixels);
  WriteGzipIdx(files.labels, {static_cast<uint32_t>(n)}, labels);
  return files;
}

// Checks that `d` holds generated samples first..first+d.size()-1 in order.
void ExpectSamples(const Dataset& d, int64_t first, int h = 4, int w = 3) {
  ASSERT_TRUE(d.images.defined());
  EXPECT_EQ(d.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(d.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{d.size(), 1, h, w}));
  EXPECT_EQ(d.labels.sizes(), (std::vector<int64_t>{d.size()}));
  auto images = d.images.accessor<float, 4>();
  auto labels = d.labels.accessor<int64_t, 1>();
  for (int64_t k = 0; k < d.size(); ++k) {
    const int64_t i = first + k;
    ASSERT_EQ(labels[k], Label(i)) << "sample " << k;
    for (int j = 0; j < h * w; ++j) {
      ASSERT_FLOAT_EQ(images[k][0][j / w][j % w], Pixel(i, j) / 255.0f)
          << "sample " << k << " pixel " << j;
    }
  }
}

DataSpec TrainSpec(const Files& train) {
  DataSpec spec;
  spec.set_train_images(train.images);
  spec.set_train_labels(train.labels);
  return spec;
}

TEST(LoadDatasetsTest, HoldsOutTheLastSamplesForValidation) {
  DataSpec spec = TrainSpec(WriteSplit("holdout", 20));
  spec.set_validation_count(5);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 15);
  EXPECT_EQ(s->validation.size(), 5);
  EXPECT_EQ(s->test.size(), 0);
  EXPECT_FALSE(s->test.images.defined());
  EXPECT_EQ(s->num_classes, 10);
  ExpectSamples(s->train, 0);
  ExpectSamples(s->validation, 15);
}

TEST(LoadDatasetsTest, ScalesPixelsToUnitRange) {
  const Files files{TempPath("extremes-images.gz"),
                    TempPath("extremes-labels.gz")};
  WriteGzipIdx(files.images, {2, 1, 2}, {0, 255, 51, 102});
  WriteGzipIdx(files.labels, {2}, {3, 1});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(1);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(torch::allclose(
      s->train.images, torch::tensor({0.0f, 1.0f}).reshape({1, 1, 1, 2})));
  EXPECT_TRUE(torch::allclose(
      s->validation.images, torch::tensor({0.2f, 0.4f}).reshape({1, 1, 1, 2})));
  EXPECT_EQ(s->num_classes, 4);
}

TEST(LoadDatasetsTest, TrainLimitAppliesBeforeTheHoldOut) {
  DataSpec spec = TrainSpec(WriteSplit("limit", 20));
  spec.set_train_limit(10);
  spec.set_validation_count(2);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 8);
  EXPECT_EQ(s->validation.size(), 2);
  ExpectSamples(s->train, 0);
  ExpectSamples(s->validation, 8);
}

TEST(LoadDatasetsTest, ValidationCountZeroLeavesValidationEmpty) {
  DataSpec spec = TrainSpec(WriteSplit("noval", 6));
  spec.set_validation_count(0);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 6);
  EXPECT_EQ(s->validation.size(), 0);
}

TEST(LoadDatasetsTest, DefaultValidationCountNeedsMoreThan5000Samples) {
  DataSpec spec = TrainSpec(WriteSplit("small", 20));
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s),
              HasSubstr("data.validation_count is 5000 (the default) but the "
                        "training set has only 20 samples"));
}

TEST(LoadDatasetsTest, ValidationCountMustLeaveTrainingSamples) {
  DataSpec spec = TrainSpec(WriteSplit("tight", 20));
  spec.set_train_limit(10);
  spec.set_validation_count(10);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.validation_count is 10"));
  EXPECT_THAT(Message(s), HasSubstr("after data.train_limit"));
}

TEST(LoadDatasetsTest, LoadsSeparateValidationAndTestFiles) {
  DataSpec spec = TrainSpec(WriteSplit("sep-train", 12));
  const Files val = WriteSplit("sep-val", 7);
  const Files test = WriteSplit("sep-test", 9, 4, 3, /*label_offset=*/8);
  spec.set_validation_images(val.images);
  spec.set_validation_labels(val.labels);
  spec.set_test_images(test.images);
  spec.set_test_labels(test.labels);
  spec.set_test_limit(5);
  // Ignored when validation files are given.
  spec.set_validation_count(100);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 12);
  EXPECT_EQ(s->validation.size(), 7);
  EXPECT_EQ(s->test.size(), 5);
  ExpectSamples(s->train, 0);
  ExpectSamples(s->validation, 0);
  // The first 5 test labels are 8..12, so 13 classes (14 had test_limit
  // been ignored).
  EXPECT_EQ(s->num_classes, 13);
}

TEST(LoadDatasetsTest, MissingFileNamesTheField) {
  DataSpec spec;
  spec.set_train_images(TempPath("absent-images.gz"));
  spec.set_train_labels(TempPath("absent-labels.gz"));
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s),
              StartsWith("data.train_images: cannot open '" +
                         TempPath("absent-images.gz") + "'"));

  const Files ok = WriteSplit("present", 3);
  spec.set_train_images(ok.images);
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s),
              StartsWith("data.train_labels: cannot open"));

  spec = TrainSpec(ok);
  spec.set_validation_count(1);
  spec.set_test_images(TempPath("absent-test.gz"));
  spec.set_test_labels(ok.labels);
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s),
              StartsWith("data.test_images: cannot open"));
}

TEST(LoadDatasetsTest, RequiredFields) {
  const Files files = WriteSplit("required", 3);
  DataSpec spec;
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_images is required"));

  spec.set_train_images(files.images);
  s = LoadDatasets(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_labels is required"));

  spec = TrainSpec(files);
  spec.set_test_images(files.images);
  s = LoadDatasets(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "data.test_labels is required when data.test_images is set");

  spec = TrainSpec(files);
  spec.set_validation_labels(files.labels);
  s = LoadDatasets(spec);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "data.validation_images is required when data.validation_labels "
            "is set");
}

TEST(LoadDatasetsTest, NegativeCountsAreRejected) {
  const Files files = WriteSplit("negative", 3);
  for (const char* field : {"train_limit", "test_limit", "validation_count"}) {
    SCOPED_TRACE(field);
    DataSpec spec = TrainSpec(files);
    if (std::string(field) == "train_limit") spec.set_train_limit(-1);
    if (std::string(field) == "test_limit") spec.set_test_limit(-1);
    if (std::string(field) == "validation_count") spec.set_validation_count(-1);
    absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(s),
              absl::StrCat("data.", field, " must be >= 0, got -1"));
  }
}

TEST(LoadDatasetsTest, CountMismatchNamesBothFields) {
  const Files a = WriteSplit("mismatch-a", 6);
  const Files b = WriteSplit("mismatch-b", 5);
  DataSpec spec;
  spec.set_train_images(a.images);
  spec.set_train_labels(b.labels);
  spec.set_validation_count(1);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s),
              StartsWith("data.train_images and data.train_labels disagree"));
  EXPECT_THAT(Message(s), HasSubstr("6 images"));
  EXPECT_THAT(Message(s), HasSubstr("5 labels"));

  // A limit both files satisfy hides the mismatch.
  spec.set_train_limit(4);
  s = LoadDatasets(spec);
  EXPECT_TRUE(s.ok()) << s.status();
}

TEST(LoadDatasetsTest, SwappedFilesAreRejected) {
  const Files files = WriteSplit("swapped", 4);
  DataSpec spec;
  spec.set_train_images(files.labels);
  spec.set_train_labels(files.images);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_images: '"));
  EXPECT_THAT(Message(s),
              HasSubstr("shape [4], but images must be 3-dimensional"));

  spec.set_train_images(files.images);
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_labels: '"));
  EXPECT_THAT(Message(s),
              HasSubstr("shape [4, 4, 3], but labels must be 1-dimensional"));
}

TEST(LoadDatasetsTest, TestImagesMustMatchTrainingImageSize) {
  DataSpec spec = TrainSpec(WriteSplit("size-train", 4));
  spec.set_validation_count(1);
  const Files test = WriteSplit("size-test", 4, /*h=*/5, /*w=*/5);
  spec.set_test_images(test.images);
  spec.set_test_labels(test.labels);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "data.test_images: images are 5x5 pixels but the training images "
            "are 4x3");
}

TEST(LoadDatasetsTest, EmptyFileIsRejected) {
  const Files files{TempPath("none-images.gz"), TempPath("none-labels.gz")};
  WriteGzipIdx(files.images, {0, 4, 3}, {});
  WriteGzipIdx(files.labels, {0}, {});
  absl::StatusOr<DatasetSplits> s = LoadDatasets(TrainSpec(files));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("holds no images"));
}

TEST(LoadDatasetsTest, LoadsFashionMnistSubset) {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  struct stat st;
  if (stat((dir + "train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << dir << " is not installed";
  }
  DataSpec spec;
  spec.set_train_images(dir + "train-images-idx3-ubyte.gz");
  spec.set_train_labels(dir + "train-labels-idx1-ubyte.gz");
  spec.set_test_images(dir + "t10k-images-idx3-ubyte.gz");
  spec.set_test_labels(dir + "t10k-labels-idx1-ubyte.gz");
  spec.set_train_limit(1000);
  spec.set_validation_count(200);
  spec.set_test_limit(300);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.images.sizes(), (std::vector<int64_t>{800, 1, 28, 28}));
  EXPECT_EQ(s->validation.size(), 200);
  EXPECT_EQ(s->test.images.sizes(), (std::vector<int64_t>{300, 1, 28, 28}));
  EXPECT_EQ(s->num_classes, 10);
  EXPECT_GE(s->train.images.min().item<float>(), 0.0f);
  EXPECT_LE(s->train.images.max().item<float>(), 1.0f);
}

// Builds a Dataset of n samples whose label is the sample index.
Dataset Indexed(int64_t n) {
  Dataset d;
  d.images = torch::arange(n, torch::kFloat32).reshape({n, 1, 1, 1});
  d.labels = torch::arange(n, torch::kInt64);
  return d;
}

TEST(ShardTest, SplitsContiguouslyAndAsEquallyAsPossible) {
  const Dataset d = Indexed(10);
  const std::vector<int64_t> want_sizes = {4, 3, 3};
  int64_t next = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const Dataset shard = Shard(d, rank, 3);
    ASSERT_EQ(shard.size(), want_sizes[rank]) << "rank " << rank;
    EXPECT_EQ(shard.images.size(0), shard.size());
    for (int64_t k = 0; k < shard.size(); ++k) {
      EXPECT_EQ(shard.labels[k].item<int64_t>(), next + k);
      EXPECT_EQ(shard.images[k][0][0][0].item<float>(), next + k);
    }
    next += shard.size();
  }
  EXPECT_EQ(next, 10);
}

TEST(ShardTest, SizesDifferByAtMostOneAndCoverEverything) {
  for (int64_t n : {0, 1, 5, 7, 64, 1001}) {
    for (int world : {1, 2, 3, 8, 13}) {
      const Dataset d = n == 0 ? Dataset() : Indexed(n);
      int64_t total = 0, smallest = n, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Dataset shard = Shard(d, rank, world);
        if (shard.size() > 0) {
          EXPECT_EQ(shard.labels[0].item<int64_t>(), total);
        }
        total += shard.size();
        smallest = std::min(smallest, shard.size());
        largest = std::max(largest, shard.size());
      }
      EXPECT_EQ(total, n) << n << " over " << world;
      EXPECT_LE(largest - smallest, 1) << n << " over " << world;
    }
  }
}

TEST(ShardTest, SharesStorageWithTheDataset) {
  const Dataset d = Indexed(10);
  const Dataset shard = Shard(d, 1, 2);
  EXPECT_EQ(shard.images.data_ptr<float>(), d.images.data_ptr<float>() + 5);
  EXPECT_EQ(shard.labels.data_ptr<int64_t>(), d.labels.data_ptr<int64_t>() + 5);
}

}  // namespace
}  // namespace worker
}  // namespace mpilearn
