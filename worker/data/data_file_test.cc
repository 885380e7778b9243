// The conversions every data file format shares, checked against values
// computed by hand (in double precision), and OpenDataFile's dispatch.
#include "worker/data/data_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace mpilearn::worker {
namespace {

// Expects `t` (any dtype) to hold `expected` (row-major), each within
// `tolerance`, and to have `sizes`.
void ExpectValues(const torch::Tensor& t, const std::vector<int64_t>& sizes,
                  const std::vector<double>& expected, double tolerance = 0.0) {
  ASSERT_EQ(t.sizes().vec(), sizes);
  const torch::Tensor flat = t.to(torch::kFloat64).contiguous().view({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), expected[i], tolerance) << "at " << i;
  }
}

TEST(ElementTypeTest, NamesAndIntegerness) {
  EXPECT_STREQ(ElementTypeName(ElementType::kUint8), "uint8");
  EXPECT_STREQ(ElementTypeName(ElementType::kInt8), "int8");
  EXPECT_STREQ(ElementTypeName(ElementType::kInt16), "int16");
  EXPECT_STREQ(ElementTypeName(ElementType::kInt32), "int32");
  EXPECT_STREQ(ElementTypeName(ElementType::kInt64), "int64");
  EXPECT_STREQ(ElementTypeName(ElementType::kFloat32), "float32");
  EXPECT_STREQ(ElementTypeName(ElementType::kFloat64), "float64");
  for (ElementType t :
       {ElementType::kUint8, ElementType::kInt8, ElementType::kInt16,
        ElementType::kInt32, ElementType::kInt64}) {
    EXPECT_TRUE(IsIntegerElementType(t)) << ElementTypeName(t);
  }
  EXPECT_FALSE(IsIntegerElementType(ElementType::kFloat32));
  EXPECT_FALSE(IsIntegerElementType(ElementType::kFloat64));
}

TEST(FeaturesFromRawTest, Uint8IsScaledBy255) {
  const uint8_t raw[] = {0, 51, 128, 255, 1, 254};
  const torch::Tensor f = FeaturesFromRaw(raw, ElementType::kUint8, {3, 2});
  EXPECT_EQ(f.scalar_type(), torch::kFloat32);
  // float32 holds x / 255 to within half an ulp of 1.
  ExpectValues(f, {3, 2}, {0.0, 0.2, 128 / 255.0, 1.0, 1 / 255.0, 254 / 255.0},
               6e-8);
}

TEST(FeaturesFromRawTest, Uint8ImagesGainAChannel) {
  std::vector<uint8_t> raw(2 * 3 * 4);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(10 * i);
  const torch::Tensor f =
      FeaturesFromRaw(raw.data(), ElementType::kUint8, {2, 3, 4});
  std::vector<double> expected;
  for (size_t i = 0; i < raw.size(); ++i) expected.push_back(10.0 * i / 255);
  ExpectValues(f, {2, 1, 3, 4}, expected, 6e-8);
}

TEST(FeaturesFromRawTest, SignedIntegersAreNotScaled) {
  const int8_t i8[] = {-128, -1, 0, 127};
  ExpectValues(FeaturesFromRaw(i8, ElementType::kInt8, {2, 2}), {2, 2},
               {-128, -1, 0, 127});
  const int16_t i16[] = {-32768, 300, 32767, 7};
  ExpectValues(FeaturesFromRaw(i16, ElementType::kInt16, {2, 2}), {2, 2},
               {-32768, 300, 32767, 7});
  const int32_t i32[] = {-2000000, 16777216, 5, -5};
  ExpectValues(FeaturesFromRaw(i32, ElementType::kInt32, {4}), {4, 1},
               {-2000000, 16777216, 5, -5});
  // 2^40 + 1 rounds to 2^40 in float32.
  const int64_t i64[] = {(int64_t{1} << 40) + 1, -3};
  ExpectValues(FeaturesFromRaw(i64, ElementType::kInt64, {2, 1}), {2, 1},
               {1099511627776.0, -3});
}

TEST(FeaturesFromRawTest, FloatsAsStoredAndRankKept) {
  const float f32[] = {0.5f, -1.25f, 3e-7f, 1e30f, 2, 3, 4, 5};
  // A rank-3 float array keeps its shape: only uint8 images gain a channel.
  ExpectValues(FeaturesFromRaw(f32, ElementType::kFloat32, {2, 2, 2}),
               {2, 2, 2},
               {0.5, -1.25, static_cast<double>(3e-7f),
                static_cast<double>(1e30f), 2, 3, 4, 5});
  const double f64[] = {1.0 / 3, -2.5, 1e-3, 7};
  const torch::Tensor t =
      FeaturesFromRaw(f64, ElementType::kFloat64, {1, 2, 1, 2});
  EXPECT_EQ(t.scalar_type(), torch::kFloat32);
  ExpectValues(t, {1, 2, 1, 2}, {1.0 / 3, -2.5, 1e-3, 7}, 3e-8);
}

TEST(FeaturesFromRawTest, CopiesTheInput) {
  float raw[] = {1, 2, 3, 4};
  const torch::Tensor f = FeaturesFromRaw(raw, ElementType::kFloat32, {2, 2});
  raw[0] = 100;
  ExpectValues(f, {2, 2}, {1, 2, 3, 4});
}

TEST(FeaturesFromRawTest, NoRows) {
  const torch::Tensor f =
      FeaturesFromRaw(nullptr, ElementType::kUint8, {0, 28, 28});
  EXPECT_EQ(f.sizes().vec(), (std::vector<int64_t>{0, 1, 28, 28}));
  EXPECT_EQ(f.scalar_type(), torch::kFloat32);
}

TEST(LabelsFromRawTest, IntegerVectorsAreClassIndices) {
  const uint8_t u8[] = {0, 9, 255};
  torch::Tensor l = LabelsFromRaw(u8, ElementType::kUint8, {3});
  EXPECT_EQ(l.scalar_type(), torch::kInt64);
  ExpectValues(l, {3}, {0, 9, 255});  // Labels are never scaled.
  const int8_t i8[] = {-1, 3};
  l = LabelsFromRaw(i8, ElementType::kInt8, {2});
  EXPECT_EQ(l.scalar_type(), torch::kInt64);
  ExpectValues(l, {2}, {-1, 3});
  const int16_t i16[] = {1000, 2};
  ExpectValues(LabelsFromRaw(i16, ElementType::kInt16, {2}), {2}, {1000, 2});
  const int32_t i32[] = {7, 70000};
  ExpectValues(LabelsFromRaw(i32, ElementType::kInt32, {2}), {2}, {7, 70000});
  // int64 is exact past float32's 2^24 (the check goes through double).
  const int64_t i64[] = {(int64_t{1} << 40) + 1, 4};
  l = LabelsFromRaw(i64, ElementType::kInt64, {2});
  EXPECT_EQ(l.scalar_type(), torch::kInt64);
  EXPECT_EQ(l[0].item<int64_t>(), (int64_t{1} << 40) + 1);
  EXPECT_EQ(l[1].item<int64_t>(), 4);
}

TEST(LabelsFromRawTest, IntegerRowsAreFloatRows) {
  const uint8_t one_hot[] = {0, 1, 0, 1, 0, 0};
  const torch::Tensor l = LabelsFromRaw(one_hot, ElementType::kUint8, {2, 3});
  EXPECT_EQ(l.scalar_type(), torch::kFloat32);
  ExpectValues(l, {2, 3}, {0, 1, 0, 1, 0, 0});
  const int32_t multi[] = {1, 1, 0, 5};
  ExpectValues(LabelsFromRaw(multi, ElementType::kInt32, {2, 2}), {2, 2},
               {1, 1, 0, 5});
}

TEST(LabelsFromRawTest, FloatTargets) {
  const double f64[] = {0.1, -2.0, 3.5};
  torch::Tensor l = LabelsFromRaw(f64, ElementType::kFloat64, {3});
  EXPECT_EQ(l.scalar_type(), torch::kFloat32);
  ExpectValues(l, {3, 1}, {0.1, -2.0, 3.5}, 1e-8);
  const float f32[] = {1, 2, 3, 4, 5, 6};
  ExpectValues(LabelsFromRaw(f32, ElementType::kFloat32, {3, 2}), {3, 2},
               {1, 2, 3, 4, 5, 6});
}

TEST(LabelsFromRawTest, HigherRanksAreFlattened) {
  std::vector<float> f32(2 * 2 * 3);
  std::vector<double> expected;
  for (size_t i = 0; i < f32.size(); ++i) {
    f32[i] = 0.5f * i;
    expected.push_back(0.5 * i);
  }
  ExpectValues(LabelsFromRaw(f32.data(), ElementType::kFloat32, {2, 2, 3}),
               {2, 6}, expected);
  const int16_t i16[] = {1, 2, 3, 4};
  const torch::Tensor l = LabelsFromRaw(i16, ElementType::kInt16, {1, 2, 2});
  EXPECT_EQ(l.scalar_type(), torch::kFloat32);
  ExpectValues(l, {1, 4}, {1, 2, 3, 4});
}

TEST(OpenDataFileTest, RefusesOtherExtensions) {
  for (const char* path :
       {"/tmp/x.csv", "/tmp/x", "/tmp/x.npy.gz", "/tmp/x.h5.bak"}) {
    const auto file = OpenDataFile(path);
    ASSERT_FALSE(file.ok()) << path;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(file.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const char* ext : {".h5", ".hdf5", ".npz", ".npy"}) {
      EXPECT_NE(message.find(ext), std::string::npos) << message;
    }
  }
}

TEST(OpenDataFileTest, DispatchesByExtension) {
  // A missing file: each format's opener says NotFound, which the
  // extension check never does.
  const std::string dir = ::testing::TempDir();
  for (const char* name : {"none_features.npy", "none.npz", "none.NPZ"}) {
    const auto file = OpenDataFile(dir + "/" + name);
    ASSERT_FALSE(file.ok()) << name;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound)
        << name << ": " << file.status();
  }
  for (const char* name : {"none.h5", "none.hdf5", "none.H5"}) {
    const auto file = OpenDataFile(dir + "/" + name);
    ASSERT_FALSE(file.ok()) << name;
    EXPECT_NE(file.status().code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << file.status();
  }
}

}  // namespace
}  // namespace mpilearn::worker
