// FeatureMoments against a direct two-pass computation in double, the
// transforms' arithmetic, and LoadTrainingData's normalization of streamed
// NumPy files (statistics from the first sample_rows training rows).
#include "worker/data/training_data.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

// Writes a version 1.0 .npy file of `values` with dtype `descr` and `shape`.
void WriteNpy(const std::string& path, const std::string& descr,
              const std::string& shape, const void* data, size_t bytes) {
  std::string header = absl::StrCat("{'descr': '", descr,
                                    "', 'fortran_order': False, 'shape': ",
                                    shape, ", }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  ASSERT_TRUE(out.good()) << path;
}

TEST(FeatureMomentsTest, ChunkedEqualsTwoPassInDouble) {
  std::mt19937 random(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t kRows = 101;
  constexpr int64_t kWidth = 4;
  std::vector<float> values(kRows * kWidth);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kWidth; ++j) {
      // Feature j: mean 1000 j, scale j + 1 (feature 3 large and offset).
      values[i * kWidth + j] = 1000.0f * j + (j + 1) * normal(random);
    }
  }
  const torch::Tensor x = torch::from_blob(values.data(), {kRows, kWidth});
  FeatureMoments moments;
  for (int64_t begin = 0; begin < kRows; begin += 7) {
    moments.Add(x.narrow(0, begin, std::min<int64_t>(7, kRows - begin)));
  }
  ASSERT_EQ(moments.rows(), kRows);
  const FeatureTransform t = moments.Standardize();
  for (int64_t j = 0; j < kWidth; ++j) {
    double sum = 0.0;
    for (int64_t i = 0; i < kRows; ++i) sum += values[i * kWidth + j];
    const double mean = sum / kRows;
    double squares = 0.0;
    for (int64_t i = 0; i < kRows; ++i) {
      const double d = values[i * kWidth + j] - mean;
      squares += d * d;
    }
    const double std = std::sqrt(squares / kRows);
    EXPECT_NEAR(t.mean()[j].item<float>(), mean, 1e-3) << "feature " << j;
    EXPECT_NEAR(t.std()[j].item<float>(), std, 1e-5 * std + 1e-6) << "feature " << j;
  }
}

TEST(FeatureTransformTest, ScaleStandardizeAndConstantFeatures) {
  torch::Tensor x = torch::tensor({{2.0f, 5.0f}, {4.0f, 5.0f}});
  torch::Tensor scaled = x.clone();
  FeatureTransform::Scale(0.5, -1.0).Apply(&scaled);
  EXPECT_TRUE(torch::allclose(scaled, torch::tensor({{0.0f, 1.5f}, {1.0f, 1.5f}})));

  FeatureMoments moments;
  moments.Add(x);
  torch::Tensor standardized = x.clone();
  moments.Standardize().Apply(&standardized);
  // Feature 0: mean 3, std 1; feature 1 is constant: centred only.
  EXPECT_TRUE(torch::allclose(standardized,
                              torch::tensor({{-1.0f, 0.0f}, {1.0f, 0.0f}})));
  torch::Tensor same = x.clone();
  FeatureTransform().Apply(&same);
  EXPECT_TRUE(torch::equal(same, x));
}

// Streamed NumPy files with "standardize": the statistics are those of the
// first sample_rows training rows, and the training sample LoadTrainingData
// keeps is already transformed.
TEST(LoadTrainingDataTest, StandardizesStreamedFilesFromTheFirstRows) {
  constexpr int64_t kRows = 50;
  std::vector<float> features(kRows * 2);
  std::vector<int64_t> labels(kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    features[2 * i] = static_cast<float>(i);           // mean of 0..19: 9.5
    features[2 * i + 1] = 100.0f + (i % 2 == 0 ? 1 : -1);
    labels[i] = i % 3;
  }
  const std::string dir = ::testing::TempDir();
  WriteNpy(dir + "/norm_features.npy", "<f4", absl::StrCat("(", kRows, ", 2)"),
           features.data(), features.size() * sizeof(float));
  WriteNpy(dir + "/norm_labels.npy", "<i8", absl::StrCat("(", kRows, ",)"),
           labels.data(), labels.size() * sizeof(int64_t));
  v1::DataSpec spec;
  spec.add_train_files(dir + "/norm_features.npy");
  spec.set_validation_count(10);
  spec.mutable_normalization()->set_mode("standardize");
  spec.mutable_normalization()->set_sample_rows(20);
  v1::JobSpec job;
  *job.mutable_data() = spec;
  absl::StatusOr<TrainingData> data =
      LoadTrainingData(JobConfig::FromNormalized(job), /*sample_rows=*/4);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(data->streamed());
  const FeatureTransform& t = data->transform;
  // Rows 0..19: feature 0 is 0..19 (mean 9.5, population std
  // sqrt((20^2 - 1) / 12)); feature 1 alternates 101, 99 (mean 100, std 1).
  EXPECT_NEAR(t.mean()[0].item<float>(), 9.5, 1e-5);
  EXPECT_NEAR(t.std()[0].item<float>(), std::sqrt(399.0 / 12.0), 1e-5);
  EXPECT_NEAR(t.mean()[1].item<float>(), 100.0, 1e-5);
  EXPECT_NEAR(t.std()[1].item<float>(), 1.0, 1e-5);
  // The kept training sample (rows 0..3) is transformed.
  ASSERT_EQ(data->splits.train.size(), 4);
  EXPECT_NEAR(data->splits.train.features[3][0].item<float>(),
              (3.0 - 9.5) / std::sqrt(399.0 / 12.0), 1e-5);
  EXPECT_NEAR(data->splits.train.features[3][1].item<float>(), -1.0, 1e-5);
}

}  // namespace
}  // namespace mpilearn::worker
