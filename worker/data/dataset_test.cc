// Tests of LoadDatasets and Shard on IDX files each test writes.
//
// Over ~500 lines because every IDX type and shape rule (see dataset.h) and
// every error the loader names has its own case; they share only the small
// writers at the top.
#include "worker/data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/fold_fixtures.h"

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
                  const std::vector<uint8_t>& payload, uint8_t type = 0x08) {
  std::vector<uint8_t> bytes = {0, 0, type, static_cast<uint8_t>(dims.size())};
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

// Writes `values` as an IDX file of element type `type` (code), each value
// stored as T, big-endian.
template <typename T>
void WriteTypedIdx(const std::string& path, uint8_t type,
                   const std::vector<uint32_t>& dims,
                   const std::vector<T>& values) {
  std::vector<uint8_t> payload;
  for (const T v : values) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (int i = sizeof(T) - 1; i >= 0; --i) payload.push_back(b[i]);
  }
  WriteGzipIdx(path, dims, payload, type);
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
  ASSERT_TRUE(d.features.defined());
  EXPECT_EQ(d.features.scalar_type(), torch::kFloat32);
  EXPECT_EQ(d.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.features.sizes(), (std::vector<int64_t>{d.size(), 1, h, w}));
  EXPECT_EQ(d.labels.sizes(), (std::vector<int64_t>{d.size()}));
  auto images = d.features.accessor<float, 4>();
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
  EXPECT_FALSE(s->test.features.defined());
  EXPECT_EQ(s->num_classes, 10);
  EXPECT_FALSE(s->float_labels);
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{1, 4, 3}));
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
      s->train.features, torch::tensor({0.0f, 1.0f}).reshape({1, 1, 1, 2})));
  EXPECT_TRUE(torch::allclose(
      s->validation.features, torch::tensor({0.2f, 0.4f}).reshape({1, 1, 1, 2})));
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

// Cross-validation folds: rows that tell their index. Features float32
// [n, 2] hold (i, -i) and the int32 labels i (class indices).
Files WriteIndexedRows(const std::string& prefix, int n) {
  Files files{TempPath(prefix + "-features.gz"), TempPath(prefix + "-labels.gz")};
  std::vector<float> features;
  std::vector<int32_t> labels;
  for (int i = 0; i < n; ++i) {
    features.push_back(static_cast<float>(i));
    features.push_back(-static_cast<float>(i));
    labels.push_back(i);
  }
  WriteTypedIdx(files.images, 0x0D, {static_cast<uint32_t>(n), 2}, features);
  WriteTypedIdx(files.labels, 0x0C, {static_cast<uint32_t>(n)}, labels);
  return files;
}

// The row indices `d` holds, in order (its labels; its features must agree).
std::vector<int64_t> RowIndices(const Dataset& d) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < d.size(); ++r) {
    const int64_t i = d.labels[r].item<int64_t>();
    EXPECT_EQ(d.features[r][0].item<float>(), i);
    EXPECT_EQ(d.features[r][1].item<float>(), -i);
    rows.push_back(i);
  }
  return rows;
}

TEST(LoadDatasetsTest, EveryFoldHoldsOutItsBlockAndTrainsOnTheRest) {
  const Files files = WriteIndexedRows("folds", 23);
  // n rows after train_limit (0: all 23).
  for (const auto& [folds, limit] : std::vector<std::pair<int, int>>{
           {2, 0}, {3, 0}, {5, 0}, {23, 0}, {4, 17}, {17, 17}}) {
    const int64_t n = limit > 0 ? limit : 23;
    std::vector<int> times_held(n, 0);
    for (int fold = 0; fold < folds; ++fold) {
      SCOPED_TRACE(absl::StrCat(fold, " of ", folds, " folds, train_limit ", limit));
      DataSpec spec = TrainSpec(files);
      spec.set_train_limit(limit);
      spec.set_folds(folds);
      spec.set_fold(fold);
      absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
      ASSERT_TRUE(s.ok()) << s.status();
      const auto [held, rest] = ExpectedFoldRows(n, folds, fold);
      ASSERT_FALSE(held.empty());
      EXPECT_EQ(RowIndices(s->validation), held);
      EXPECT_EQ(RowIndices(s->train), rest);
      for (const int64_t r : RowIndices(s->validation)) ++times_held[r];
      // The last fold leaves the training rows a view (no copy): the
      // validation rows follow them in the same storage.
      if (fold == folds - 1) {
        EXPECT_EQ(s->validation.features.data_ptr<float>(),
                  s->train.features.data_ptr<float>() + 2 * rest.size());
      }
      // A middle fold copies both, so nothing keeps the whole set alive.
      if (fold > 0 && fold < folds - 1) {
        EXPECT_EQ(s->validation.features.storage().nbytes(), s->validation.features.nbytes());
        EXPECT_EQ(s->train.features.storage().nbytes(), s->train.features.nbytes());
      }
    }
    // Over the folds every row is held out exactly once.
    EXPECT_EQ(times_held, std::vector<int>(n, 1)) << folds << " folds";
  }
}

TEST(LoadDatasetsTest, FoldsNeedARowEachAndNoOtherValidation) {
  DataSpec spec = TrainSpec(WriteIndexedRows("few", 6));
  spec.set_folds(7);
  spec.set_fold(0);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("data.folds is 7 but the training set has only 6 samples"));
  EXPECT_THAT(Message(s), HasSubstr("lower data.folds"));
  spec.set_folds(3);
  spec.set_train_limit(2);
  EXPECT_THAT(Message(LoadDatasets(spec)),
              HasSubstr("only 2 samples after data.train_limit; every fold needs at least one, "
                        "so lower data.folds or raise data.train_limit"));
  spec.set_train_limit(0);
  spec.set_fold(3);
  EXPECT_THAT(Message(LoadDatasets(spec)), HasSubstr("data.folds is 3 and data.fold 3"));
  spec.set_fold(1);
  spec.set_validation_count(2);
  EXPECT_THAT(Message(LoadDatasets(spec)), HasSubstr("data.folds chooses the validation rows"));
  spec.set_validation_count(0);
  ASSERT_TRUE(LoadDatasets(spec).ok());
  const Files validation = WriteIndexedRows("few-validation", 2);
  spec.set_validation_images(validation.images);
  spec.set_validation_labels(validation.labels);
  EXPECT_THAT(Message(LoadDatasets(spec)), HasSubstr("remove the validation files"));
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
  EXPECT_THAT(Message(s), HasSubstr("6 samples"));
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
              HasSubstr("shape [4], but features must have at least 2 "
                        "dimensions [N, ...]"));

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
            "data.test_images: samples have shape [1, 5, 5] but the training "
            "samples have shape [1, 4, 3]");
}

TEST(LoadDatasetsTest, EmptyFileIsRejected) {
  const Files files{TempPath("none-images.gz"), TempPath("none-labels.gz")};
  WriteGzipIdx(files.images, {0, 4, 3}, {});
  WriteGzipIdx(files.labels, {0}, {});
  absl::StatusOr<DatasetSplits> s = LoadDatasets(TrainSpec(files));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("holds no samples"));
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
  EXPECT_EQ(s->train.features.sizes(),
            (std::vector<int64_t>{800, 1, 28, 28}));
  EXPECT_EQ(s->validation.size(), 200);
  EXPECT_EQ(s->test.features.sizes(), (std::vector<int64_t>{300, 1, 28, 28}));
  EXPECT_EQ(s->num_classes, 10);
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_GE(s->train.features.min().item<float>(), 0.0f);
  EXPECT_LE(s->train.features.max().item<float>(), 1.0f);
}

// Feature value j of sample i in the float files: negative and past 1, so a
// scaling by 1/255 or a clamp would show.
double FloatFeature(int64_t i, int64_t j) { return i * 0.25 - j * 1.5; }
// Regression target k of sample i, held as float64 in the file.
double Target(int64_t i, int64_t k) { return std::sin(0.3 * i + k) * 10.0; }

// Writes n float32 feature rows of `width` values to <prefix>-features.gz
// and float64 targets [n, k] to <prefix>-targets.gz.
Files WriteRegression(const std::string& prefix, int n, int width, int k) {
  Files files{TempPath(prefix + "-features.gz"),
              TempPath(prefix + "-targets.gz")};
  std::vector<float> features;
  std::vector<double> targets;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < width; ++j) {
      features.push_back(static_cast<float>(FloatFeature(i, j)));
    }
    for (int t = 0; t < k; ++t) targets.push_back(Target(i, t));
  }
  WriteTypedIdx(files.images, 0x0D,
                {static_cast<uint32_t>(n), static_cast<uint32_t>(width)},
                features);
  WriteTypedIdx(files.labels, 0x0E,
                {static_cast<uint32_t>(n), static_cast<uint32_t>(k)}, targets);
  return files;
}

TEST(LoadDatasetsTest, LoadsFloatFeaturesAndRegressionTargets) {
  DataSpec spec = TrainSpec(WriteRegression("regression", 10, 3, 2));
  spec.set_validation_count(4);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->float_labels);
  EXPECT_EQ(s->num_classes, 2);
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{3}));
  ASSERT_EQ(s->train.size(), 6);
  ASSERT_EQ(s->validation.size(), 4);
  for (const auto& [d, first] :
       {std::make_pair(&s->train, 0), std::make_pair(&s->validation, 6)}) {
    EXPECT_EQ(d->features.scalar_type(), torch::kFloat32);
    EXPECT_EQ(d->labels.scalar_type(), torch::kFloat32);
    EXPECT_EQ(d->features.sizes(), (std::vector<int64_t>{d->size(), 3}));
    EXPECT_EQ(d->labels.sizes(), (std::vector<int64_t>{d->size(), 2}));
    auto f = d->features.accessor<float, 2>();
    auto y = d->labels.accessor<float, 2>();
    for (int64_t r = 0; r < d->size(); ++r) {
      for (int j = 0; j < 3; ++j) {
        ASSERT_FLOAT_EQ(f[r][j], FloatFeature(first + r, j));
      }
      for (int k = 0; k < 2; ++k) {
        // float64 in the file, rounded to the nearest float.
        ASSERT_EQ(y[r][k], static_cast<float>(Target(first + r, k)));
      }
    }
  }
}

TEST(LoadDatasetsTest, OneDimensionalFloatLabelsBecomeColumns) {
  const Files files{TempPath("column-features.gz"),
                    TempPath("column-targets.gz")};
  WriteTypedIdx<float>(files.images, 0x0D, {3, 2}, {1, 2, 3, 4, 5, 6});
  WriteTypedIdx<float>(files.labels, 0x0D, {3}, {-0.5f, 7.0f, 2.25f});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(1);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->float_labels);
  EXPECT_EQ(s->num_classes, 1);
  EXPECT_TRUE(torch::equal(s->train.labels,
                           torch::tensor({-0.5f, 7.0f}).reshape({2, 1})));
  EXPECT_TRUE(torch::equal(s->validation.labels,
                           torch::tensor({2.25f}).reshape({1, 1})));
}

TEST(LoadDatasetsTest, IntegerLabelRowsBecomeFloatRows) {
  // Sequences [N, T=3, F=2] of float32 with one-hot ubyte labels [N, 4].
  const Files files{TempPath("onehot-features.gz"),
                    TempPath("onehot-labels.gz")};
  std::vector<float> features(5 * 3 * 2);
  for (size_t i = 0; i < features.size(); ++i) features[i] = i * 0.1f;
  WriteTypedIdx(files.images, 0x0D, {5, 3, 2}, features);
  std::vector<uint8_t> onehot(5 * 4, 0);
  for (int i = 0; i < 5; ++i) onehot[i * 4 + (i % 4)] = 1;
  WriteGzipIdx(files.labels, {5, 4}, onehot);
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(0);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->float_labels);
  EXPECT_EQ(s->num_classes, 4);
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(s->train.features.sizes(), (std::vector<int64_t>{5, 3, 2}));
  // Not scaled: float32 features are taken as stored.
  EXPECT_FLOAT_EQ(s->train.features[4][2][1].item<float>(), 29 * 0.1f);
  ASSERT_EQ(s->train.labels.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(
      s->train.labels,
      torch::one_hot(torch::tensor({0, 1, 2, 3, 0}, torch::kInt64), 4)
          .to(torch::kFloat32)));
}

TEST(LoadDatasetsTest, EveryIntegerTypeGivesClassIndices) {
  const std::string features = TempPath("int-features.gz");
  WriteTypedIdx<float>(features, 0x0D, {4, 1}, {0, 1, 2, 3});
  struct Case {
    uint8_t type;
    std::vector<uint8_t> payload;  // big-endian 3, 0, 70, 1
  };
  const std::vector<Case> cases = {
      {0x08, {3, 0, 70, 1}},
      {0x09, {3, 0, 70, 1}},
      {0x0B, {0, 3, 0, 0, 0, 70, 0, 1}},
      {0x0C, {0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 70, 0, 0, 0, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.type));
    const std::string labels = TempPath("int-labels.gz");
    WriteGzipIdx(labels, {4}, c.payload, c.type);
    DataSpec spec;
    spec.set_train_images(features);
    spec.set_train_labels(labels);
    spec.set_validation_count(1);
    absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(s->float_labels);
    EXPECT_EQ(s->num_classes, 71);
    ASSERT_EQ(s->train.labels.scalar_type(), torch::kInt64);
    EXPECT_TRUE(torch::equal(s->train.labels,
                             torch::tensor({3, 0, 70}, torch::kInt64)));
  }
}

TEST(LoadDatasetsTest, ClassIndicesMustBeInRange) {
  const std::string features = TempPath("range-features.gz");
  WriteTypedIdx<float>(features, 0x0D, {3, 1}, {0, 1, 2});
  const std::string labels = TempPath("range-labels.gz");
  DataSpec spec;
  spec.set_train_images(features);
  spec.set_train_labels(labels);
  spec.set_validation_count(1);

  WriteGzipIdx(labels, {3}, {1, 2, 0xFF}, /*type=*/0x09);  // 1, 2, -1
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_labels: '"));
  EXPECT_THAT(Message(s), HasSubstr("holds class index -1 at sample 2"));

  WriteTypedIdx<int32_t>(labels, 0x0C, {3},
                         {0, static_cast<int32_t>(kMaxClasses), 1});
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("holds class index 1048576 at sample 1; "
                                    "class indices must be in [0, 1048576)"));
}

TEST(LoadDatasetsTest, UnsignedBytesOfOtherRanksAreScaledWithoutAChannel) {
  const Files files{TempPath("rgb-images.gz"), TempPath("rgb-labels.gz")};
  // [N=2, C=3, H=1, W=2]
  std::vector<uint8_t> pixels(12);
  for (int i = 0; i < 12; ++i) pixels[i] = i * 20;
  WriteGzipIdx(files.images, {2, 3, 1, 2}, pixels);
  WriteGzipIdx(files.labels, {2}, {1, 0});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(0);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{3, 1, 2}));
  EXPECT_FLOAT_EQ(s->train.features[1][2][0][1].item<float>(), 220 / 255.0f);

  // [N=2, D=6]
  WriteGzipIdx(files.images, {2, 6}, pixels);
  s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{6}));
  EXPECT_FLOAT_EQ(s->train.features[1][5].item<float>(), 220 / 255.0f);
}

TEST(LoadDatasetsTest, OtherIntegerFeaturesAreNotScaledNorGivenAChannel) {
  const Files files{TempPath("int16-images.gz"), TempPath("int16-labels.gz")};
  WriteTypedIdx<int16_t>(files.images, 0x0B, {2, 1, 2}, {-300, 0, 1000, 7});
  WriteGzipIdx(files.labels, {2}, {0, 1});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(0);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->input_shape, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(torch::equal(
      s->train.features,
      torch::tensor({-300.0f, 0.0f, 1000.0f, 7.0f}).reshape({2, 1, 2})));
}

TEST(LoadDatasetsTest, SplitsMustAgreeOnTheSampleShape) {
  DataSpec spec = TrainSpec(WriteRegression("shape-train", 6, 3, 2));
  const Files test = WriteRegression("shape-test", 4, 4, 2);
  spec.set_validation_count(1);
  spec.set_test_images(test.images);
  spec.set_test_labels(test.labels);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "data.test_images: samples have shape [4] but the training "
            "samples have shape [3]");
}

TEST(LoadDatasetsTest, SplitsMustAgreeOnTheLabelKindAndWidth) {
  DataSpec spec = TrainSpec(WriteRegression("kind-train", 6, 3, 2));
  const Files wide = WriteRegression("kind-wide", 4, 3, 3);
  spec.set_validation_images(wide.images);
  spec.set_validation_labels(wide.labels);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "data.validation_labels: labels are float rows of width 3 "
            "(float64 [4, 3]) but the training labels are float rows of "
            "width 2 (float64 [6, 2])");

  // Class indices where the training labels are rows.
  const std::string indices = TempPath("kind-indices.gz");
  WriteGzipIdx(indices, {4}, {0, 1, 0, 1});
  spec.set_validation_labels(indices);
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s),
              StartsWith("data.validation_labels: labels are class indices "
                         "(unsigned byte [4]) but the training labels are "
                         "float rows of width 2"));
}

TEST(LoadDatasetsTest, SplitsMustAgreeOnTheFeatureScale) {
  // Unsigned byte [N, 3] is scaled by 1/255; float32 [N, 3] is not.
  const Files train{TempPath("scale-images.gz"), TempPath("scale-labels.gz")};
  WriteGzipIdx(train.images, {2, 3}, {1, 2, 3, 4, 5, 6});
  WriteGzipIdx(train.labels, {2}, {0, 1});
  const Files test = WriteRegression("scale-test", 2, 3, 1);
  DataSpec spec = TrainSpec(train);
  spec.set_validation_count(1);
  spec.set_test_images(test.images);
  spec.set_test_labels(train.labels);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s),
              StartsWith("data.test_images: features are float32 but the "
                         "training features are unsigned byte"));
}

TEST(LoadDatasetsTest, NonFiniteValuesAreRejected) {
  const Files files{TempPath("nan-features.gz"), TempPath("nan-targets.gz")};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  WriteTypedIdx<float>(files.images, 0x0D, {3, 2}, {0, 1, 2, 3, nan, 5});
  WriteTypedIdx<float>(files.labels, 0x0D, {3}, {0, 1, 2});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(1);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("data.train_images: '"));
  EXPECT_THAT(Message(s), HasSubstr("holds nan at sample 2"));

  WriteTypedIdx<float>(files.images, 0x0D, {3, 2}, {0, 1, 2, 3, 4, 5});
  // float64 1e300 rounds to +inf in float32.
  WriteTypedIdx<double>(files.labels, 0x0E, {3}, {0, 1e300, 2});
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s), StartsWith("data.train_labels: '"));
  EXPECT_THAT(Message(s), HasSubstr("holds inf at sample 1"));
}

TEST(LoadDatasetsTest, LabelsOfThreeDimensionsOrNoWidthAreRejected) {
  const Files files{TempPath("rank-features.gz"), TempPath("rank-labels.gz")};
  WriteTypedIdx<float>(files.images, 0x0D, {2, 2}, {0, 1, 2, 3});
  WriteTypedIdx<float>(files.labels, 0x0D, {2, 1, 1}, {0, 1});
  DataSpec spec = TrainSpec(files);
  spec.set_validation_count(1);
  absl::StatusOr<DatasetSplits> s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s), HasSubstr("shape [2, 1, 1], but labels must be "
                                    "1-dimensional [N]"));
  WriteTypedIdx<float>(files.labels, 0x0D, {2, 0}, {});
  s = LoadDatasets(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Message(s), HasSubstr("holds label rows of width 0"));
}

// Builds a Dataset of n samples whose label is the sample index.
Dataset Indexed(int64_t n) {
  Dataset d;
  d.features = torch::arange(n, torch::kFloat32).reshape({n, 1, 1, 1});
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
    EXPECT_EQ(shard.features.size(0), shard.size());
    for (int64_t k = 0; k < shard.size(); ++k) {
      EXPECT_EQ(shard.labels[k].item<int64_t>(), next + k);
      EXPECT_EQ(shard.features[k][0][0][0].item<float>(), next + k);
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
  EXPECT_EQ(shard.features.data_ptr<float>(),
            d.features.data_ptr<float>() + 5);
  EXPECT_EQ(shard.labels.data_ptr<int64_t>(), d.labels.data_ptr<int64_t>() + 5);
}

// ---------------------------------------------------------------------------
// File lists (HDF5, NumPy): written here as NumPy .npy pairs by hand.

// Writes a version-1 .npy file of float32 values with `shape`.
void WriteNpyFloat(const std::string& path, const std::vector<int64_t>& shape,
                   const std::vector<float>& values) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       dims + "), }";
  // Pad with spaces to a multiple of 64 bytes with the 10-byte preamble, then
  // a newline, as numpy writes it.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(length & 0xff));
  out.put(static_cast<char>(length >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
}

// A pair x_features.npy / x_labels.npy of `n` samples of 2 values each,
// sample i holding (first + i, -(first + i)) and target 2 * (first + i).
std::string WriteNpyPair(const std::string& name, int first, int n) {
  std::vector<float> features, labels;
  for (int i = 0; i < n; ++i) {
    features.push_back(static_cast<float>(first + i));
    features.push_back(-static_cast<float>(first + i));
    labels.push_back(2.0f * static_cast<float>(first + i));
  }
  const std::string path = TempPath(name + "_features.npy");
  WriteNpyFloat(path, {n, 2}, features);
  WriteNpyFloat(TempPath(name + "_labels.npy"), {n}, labels);
  return path;
}

TEST(LoadDatasetsTest, FileListsConcatenateInOrderThroughAListFile) {
  WriteNpyPair("part0", 0, 6);
  WriteNpyPair("part1", 6, 4);
  // Relative paths in the list are relative to the list's directory.
  std::ofstream(TempPath("parts.txt"))
      << "# two parts\npart0_features.npy\n\n  part1_features.npy  \n";
  DataSpec spec;
  spec.add_train_files(TempPath("parts.txt"));
  spec.set_validation_count(3);
  spec.add_test_files(WriteNpyPair("test", 100, 2));
  absl::StatusOr<DatasetSplits> splits = LoadDatasets(spec);
  ASSERT_TRUE(splits.ok()) << splits.status();
  ASSERT_EQ(splits->train.size(), 7);
  ASSERT_EQ(splits->validation.size(), 3);
  ASSERT_EQ(splits->test.size(), 2);
  EXPECT_EQ(splits->input_shape, (std::vector<int64_t>{2}));
  EXPECT_TRUE(splits->float_labels);
  EXPECT_EQ(splits->num_classes, 1);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(splits->train.features[i][0].item<float>(), i);
    EXPECT_EQ(splits->train.features[i][1].item<float>(), -i);
    EXPECT_EQ(splits->train.labels[i][0].item<float>(), 2 * i);
  }
  // The held-out samples are the last of the concatenation (7, 8, 9).
  EXPECT_EQ(splits->validation.features[0][0].item<float>(), 7);
  EXPECT_EQ(splits->test.labels[1][0].item<float>(), 202);

  // train_limit cuts the concatenated rows.
  spec.set_train_limit(8);
  splits = LoadDatasets(spec);
  ASSERT_TRUE(splits.ok()) << splits.status();
  EXPECT_EQ(splits->train.size() + splits->validation.size(), 8);
}

TEST(LoadDatasetsTest, FileListErrorsNameTheFileAndField) {
  DataSpec spec;
  spec.add_train_files(TempPath("nowhere_features.npy"));
  absl::StatusOr<DatasetSplits> missing = LoadDatasets(spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Message(missing), HasSubstr("data.train_files"));
  EXPECT_THAT(Message(missing), HasSubstr("nowhere_features.npy"));

  DataSpec list;
  list.add_train_files(TempPath("no-such-list.txt"));
  EXPECT_THAT(Message(LoadDatasets(list)), HasSubstr("cannot read the file list"));

  // Files whose samples differ in shape.
  WriteNpyPair("shape0", 0, 3);
  WriteNpyFloat(TempPath("shape1_features.npy"), {3, 3}, std::vector<float>(9, 1.0f));
  WriteNpyFloat(TempPath("shape1_labels.npy"), {3}, {1, 2, 3});
  DataSpec shapes;
  shapes.add_train_files(TempPath("shape0_features.npy"));
  shapes.add_train_files(TempPath("shape1_features.npy"));
  shapes.set_validation_count(1);
  const absl::StatusOr<DatasetSplits> mixed = LoadDatasets(shapes);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(mixed), HasSubstr("shape1_features.npy"));
}

}  // namespace
}  // namespace worker
}  // namespace mpilearn
