// OpenHdf5File against files this test writes with the HDF5 C API
// (contiguous, chunked and gzip'd; many types and shapes): every Read is
// checked against the values written, recomputed here in double precision,
// and each error names what a user needs to fix it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "hdf5/serial/hdf5.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

// How WriteDataset stores its data: contiguous (chunk_rows 0) or in
// chunks of chunk_rows rows, gzip'd at `gzip` (0: not compressed).
struct Layout {
  hsize_t chunk_rows = 0;
  int gzip = 0;
};

// Writes dataset `name` of HDF5 type `file_type` and shape `dims` into
// `file`, from `data` held as `memory_type`.
void WriteDataset(hid_t file, const std::string& name, hid_t file_type,
                  hid_t memory_type, const std::vector<hsize_t>& dims,
                  const void* data, Layout layout = {}) {
  const hid_t space =
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  ASSERT_GE(space, 0);
  const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
  if (layout.chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = layout.chunk_rows;
    ASSERT_GE(
        H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data()), 0);
    if (layout.gzip > 0) {
      ASSERT_GE(H5Pset_deflate(create, layout.gzip), 0);
    }
  }
  const hid_t dataset = H5Dcreate2(file, name.c_str(), file_type, space,
                                   H5P_DEFAULT, create, H5P_DEFAULT);
  ASSERT_GE(dataset, 0) << name;
  ASSERT_GE(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
            0);
  H5Dclose(dataset);
  H5Pclose(create);
  H5Sclose(space);
}

hid_t CreateFile(const std::string& path) {
  return H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
}

// Expects `t` to have `sizes` and hold `expected` (row-major), each within
// `tolerance`.
void ExpectValues(const torch::Tensor& t, const std::vector<int64_t>& sizes,
                  const std::vector<double>& expected, double tolerance = 0.0) {
  ASSERT_EQ(t.sizes().vec(), sizes);
  const torch::Tensor flat = t.to(torch::kFloat64).contiguous().view({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  const double* values = flat.data_ptr<double>();
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(values[i], expected[i], tolerance) << "at " << i;
  }
}

// float32 features [10, 3, 4] and int64 labels [10], contiguous.
double FloatFeature(int i, int j, int k) {
  return 0.5 * i - 0.25 * j + k / 8.0;
}
int64_t ClassLabel(int i) { return (i * 7) % 5; }

std::string WriteFloatFile(const std::string& name, int rows = 10) {
  const std::string path = TempPath(name);
  std::vector<float> features;
  std::vector<int64_t> labels;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        features.push_back(static_cast<float>(FloatFeature(i, j, k)));
      }
    }
    labels.push_back(ClassLabel(i));
  }
  const hid_t file = CreateFile(path);
  EXPECT_GE(file, 0);
  const hsize_t n = rows;
  WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n, 3, 4},
               features.data());
  WriteDataset(file, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {n},
               labels.data());
  H5Fclose(file);
  return path;
}

TEST(Hdf5FileTest, FeaturesAndLabelsReadAlone) {
  const std::string path = WriteFloatFile("alone.h5");
  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenHdf5File(path, {});
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<torch::Tensor> labels = (*file)->ReadLabels(2, 9);
  ASSERT_TRUE(labels.ok()) << labels.status();
  absl::StatusOr<torch::Tensor> features = (*file)->ReadFeatures(4, 6);
  ASSERT_TRUE(features.ok()) << features.status();
  std::vector<double> expected_labels, expected_features;
  for (int i = 2; i < 9; ++i) expected_labels.push_back(ClassLabel(i));
  for (int i = 4; i < 6; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        expected_features.push_back(FloatFeature(i, j, k));
      }
    }
  }
  EXPECT_EQ(labels->scalar_type(), torch::kInt64);
  ExpectValues(*labels, {7}, expected_labels);
  ExpectValues(*features, {2, 3, 4}, expected_features);
  for (const auto& [begin, end] :
       std::vector<std::pair<int, int>>{{-1, 2}, {3, 2}, {8, 11}}) {
    for (const absl::Status& status :
         {(*file)->ReadLabels(begin, end).status(),
          (*file)->ReadFeatures(begin, end).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(),
                  AllOf(HasSubstr(absl::StrCat("rows [", begin, ", ", end,
                                               ") are outside '")),
                        HasSubstr(path), HasSubstr("holds 10 rows")));
    }
  }
}

TEST(Hdf5FileTest, Float32FeaturesAndClassLabels) {
  const std::string path = WriteFloatFile("float.h5");
  absl::StatusOr<std::unique_ptr<DataFile>> file = OpenHdf5File(path, {});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->rows(), 10);
  EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE((*file)->label_shape().empty());
  EXPECT_EQ((*file)->feature_type(), ElementType::kFloat32);
  EXPECT_EQ((*file)->label_type(), ElementType::kInt64);

  for (const auto& [begin, end] :
       std::vector<std::pair<int, int>>{{0, 10}, {3, 7}, {9, 10}, {5, 5}}) {
    SCOPED_TRACE(absl::StrCat("rows [", begin, ", ", end, ")"));
    absl::StatusOr<DataRows> rows = (*file)->Read(begin, end);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(rows->features.scalar_type(), torch::kFloat32);
    EXPECT_EQ(rows->labels.scalar_type(), torch::kInt64);
    std::vector<double> features, labels;
    for (int i = begin; i < end; ++i) {
      for (int j = 0; j < 3; ++j) {
        for (int k = 0; k < 4; ++k) features.push_back(FloatFeature(i, j, k));
      }
      labels.push_back(ClassLabel(i));
    }
    // Every value written is a multiple of 1/8 below 8: exact in float32.
    ExpectValues(rows->features, {end - begin, 3, 4}, features);
    ExpectValues(rows->labels, {end - begin}, labels);
  }
}

// uint8 images [50, 28, 28] and uint8 labels, chunked (8 rows) and gzip'd,
// as convert_data writes Fashion-MNIST.
uint8_t Pixel(int i, int j, int k) { return (i * 31 + j * 7 + k) % 256; }

std::string WriteImageFile(const std::string& name, Layout layout) {
  const std::string path = TempPath(name);
  constexpr int kRows = 50;
  std::vector<uint8_t> images, labels;
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < 28; ++j) {
      for (int k = 0; k < 28; ++k) images.push_back(Pixel(i, j, k));
    }
    labels.push_back(static_cast<uint8_t>(i % 10));
  }
  const hid_t file = CreateFile(path);
  EXPECT_GE(file, 0);
  WriteDataset(file, "features", H5T_STD_U8LE, H5T_NATIVE_UINT8,
               {kRows, 28, 28}, images.data(), layout);
  WriteDataset(file, "labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, {kRows},
               labels.data(), layout);
  H5Fclose(file);
  return path;
}

TEST(Hdf5FileTest, Uint8ImagesAreScaledAndGainAChannel) {
  for (const Layout layout : {Layout{0, 0}, Layout{8, 0}, Layout{8, 4}}) {
    SCOPED_TRACE(
        absl::StrCat("chunk rows ", layout.chunk_rows, ", gzip ", layout.gzip));
    const std::string path = WriteImageFile(
        absl::StrCat("images_", layout.chunk_rows, "_", layout.gzip, ".h5"),
        layout);
    absl::StatusOr<std::unique_ptr<DataFile>> file = OpenHdf5File(path, {});
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->rows(), 50);
    EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{28, 28}));
    EXPECT_EQ((*file)->feature_type(), ElementType::kUint8);
    EXPECT_EQ((*file)->label_type(), ElementType::kUint8);
    // Ranges inside one chunk, across chunks, and the short last chunk.
    for (const auto& [begin, end] : std::vector<std::pair<int, int>>{
             {0, 50}, {13, 29}, {17, 20}, {45, 50}}) {
      SCOPED_TRACE(absl::StrCat("rows [", begin, ", ", end, ")"));
      absl::StatusOr<DataRows> rows = (*file)->Read(begin, end);
      ASSERT_TRUE(rows.ok()) << rows.status();
      std::vector<double> features, labels;
      for (int i = begin; i < end; ++i) {
        for (int j = 0; j < 28; ++j) {
          for (int k = 0; k < 28; ++k)
            features.push_back(Pixel(i, j, k) / 255.0);
        }
        labels.push_back(i % 10);
      }
      // float32 holds x / 255 to within half an ulp of 1.
      ExpectValues(rows->features, {end - begin, 1, 28, 28}, features, 6e-8);
      EXPECT_EQ(rows->labels.scalar_type(), torch::kInt64);
      ExpectValues(rows->labels, {end - begin}, labels);
    }
  }
}

TEST(Hdf5FileTest, RankOneFeaturesAndFloatTargets) {
  const std::string path = TempPath("targets.hdf5");
  constexpr int kRows = 12;
  std::vector<double> features, targets;
  for (int i = 0; i < kRows; ++i) {
    features.push_back(i / 3.0);
    targets.push_back(1.0 / (i + 1));
    targets.push_back(-2.5 * i);
  }
  const hid_t file = CreateFile(path);
  ASSERT_GE(file, 0);
  // float64 features [N]; float64 targets [N, 2], chunked and gzip'd.
  WriteDataset(file, "features", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {kRows},
               features.data());
  WriteDataset(file, "labels", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {kRows, 2},
               targets.data(), {5, 6});
  H5Fclose(file);

  // Through OpenDataFile: the .hdf5 extension picks this reader.
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenDataFile(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  DataFile& data = **opened;
  EXPECT_EQ(data.feature_type(), ElementType::kFloat64);
  EXPECT_EQ(data.label_type(), ElementType::kFloat64);
  EXPECT_EQ(data.label_shape(), (std::vector<int64_t>{2}));
  absl::StatusOr<DataRows> rows = data.Read(4, 11);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->features.scalar_type(), torch::kFloat32);
  EXPECT_EQ(rows->labels.scalar_type(), torch::kFloat32);
  ExpectValues(rows->features, {7, 1},
               std::vector<double>(features.begin() + 4, features.begin() + 11),
               1e-6);
  ExpectValues(rows->labels, {7, 2},
               std::vector<double>(targets.begin() + 8, targets.begin() + 22),
               1e-6);
}

TEST(Hdf5FileTest, OneHotIntegerRowsBecomeFloatTargets) {
  const std::string path = TempPath("onehot.h5");
  constexpr int kRows = 9;
  std::vector<float> features;
  std::vector<int32_t> one_hot;
  for (int i = 0; i < kRows; ++i) {
    features.push_back(static_cast<float>(i));
    features.push_back(static_cast<float>(-i));
    for (int c = 0; c < 3; ++c) one_hot.push_back(c == i % 3 ? 1 : 0);
  }
  const hid_t file = CreateFile(path);
  ASSERT_GE(file, 0);
  WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {kRows, 2},
               features.data());
  WriteDataset(file, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, 3},
               one_hot.data());
  H5Fclose(file);

  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<DataRows> rows = (*opened)->Read(2, 8);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->labels.scalar_type(), torch::kFloat32);
  std::vector<double> expected;
  for (int i = 2; i < 8; ++i) {
    for (int c = 0; c < 3; ++c) expected.push_back(c == i % 3 ? 1.0 : 0.0);
  }
  ExpectValues(rows->labels, {6, 3}, expected);
}

// Every integer width and sign, and a big-endian float: HDF5 converts to
// the native form, uint16 is read as int32 and uint32 as int64.
TEST(Hdf5FileTest, IntegerTypesAndByteOrders) {
  struct Case {
    const char* name;
    hid_t file_type;
    ElementType read_as;
    std::vector<double> values;  // exactly representable in file_type
  };
  const std::vector<Case> cases = {
      {"int8", H5T_STD_I8LE, ElementType::kInt8, {-128, -1, 0, 127}},
      {"int16", H5T_STD_I16BE, ElementType::kInt16, {-32768, -7, 300, 32767}},
      {"int32", H5T_STD_I32LE, ElementType::kInt32, {-1e6, -1, 0, 16777216}},
      {"int64", H5T_STD_I64BE, ElementType::kInt64, {-(1 << 20), 5, 0, 1e9}},
      {"uint16", H5T_STD_U16LE, ElementType::kInt32, {0, 1, 40000, 65535}},
      {"uint32", H5T_STD_U32BE, ElementType::kInt64, {0, 7, 3e9, 4294967040.0}},
      {"float32be",
       H5T_IEEE_F32BE,
       ElementType::kFloat32,
       {-1.5, 0, 2.25, 1e6}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = TempPath(absl::StrCat("type_", c.name, ".h5"));
    const hid_t file = CreateFile(path);
    ASSERT_GE(file, 0);
    // Written from doubles: HDF5 converts them to the file type exactly.
    WriteDataset(file, "features", c.file_type, H5T_NATIVE_DOUBLE, {4},
                 c.values.data());
    WriteDataset(file, "labels", c.file_type, H5T_NATIVE_DOUBLE, {4},
                 c.values.data());
    H5Fclose(file);

    absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ((*opened)->feature_type(), c.read_as)
        << ElementTypeName((*opened)->feature_type());
    absl::StatusOr<DataRows> rows = (*opened)->Read(0, 4);
    ASSERT_TRUE(rows.ok()) << rows.status();
    // Features are float32: each value here is a float32 value.
    ExpectValues(rows->features, {4, 1}, c.values);
    if (c.read_as == ElementType::kFloat32) {
      ExpectValues(rows->labels, {4, 1}, c.values);
    } else {
      EXPECT_EQ(rows->labels.scalar_type(), torch::kInt64);
      ExpectValues(rows->labels, {4}, c.values);
    }
  }
}

TEST(Hdf5FileTest, OtherDatasetNames) {
  const std::string path = TempPath("named.h5");
  const std::vector<float> x = {1, 2, 3};
  const std::vector<int64_t> y = {2, 0, 1};
  const hid_t file = CreateFile(path);
  ASSERT_GE(file, 0);
  WriteDataset(file, "x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3}, x.data());
  WriteDataset(file, "y", H5T_STD_I64LE, H5T_NATIVE_INT64, {3}, y.data());
  H5Fclose(file);

  DataFileNames names;
  names.features = "x";
  names.labels = "y";
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, names);
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<DataRows> rows = (*opened)->Read(1, 3);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectValues(rows->features, {2, 1}, {2, 3});
  ExpectValues(rows->labels, {2}, {0, 1});

  // With the default names, the error lists what the root holds.
  absl::StatusOr<std::unique_ptr<DataFile>> missing = OpenHdf5File(path, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr(path), HasSubstr("no dataset 'features'"),
                    HasSubstr("'x', 'y'")));
}

TEST(Hdf5FileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("no_such_file.h5");
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(opened.status().message(), HasSubstr(path));
}

TEST(Hdf5FileTest, NotAnHdf5File) {
  const std::string path = TempPath("text.h5");
  std::ofstream(path) << "features,labels\n1,2\n";
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(),
              AllOf(HasSubstr(path), HasSubstr("is not an HDF5 file")));

  opened = OpenHdf5File(::testing::TempDir(), {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Hdf5FileTest, MissingLabelsListsTheRoot) {
  const std::string path = TempPath("no_labels.h5");
  const std::vector<float> x = {1, 2};
  const hid_t file = CreateFile(path);
  ASSERT_GE(file, 0);
  WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2},
               x.data());
  WriteDataset(file, "targets", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2},
               x.data());
  const hid_t group =
      H5Gcreate2(file, "extra", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(group);
  H5Fclose(file);

  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(),
              AllOf(HasSubstr(path), HasSubstr("no dataset 'labels'"),
                    HasSubstr("'extra', 'features', 'targets'")));

  // A group where a dataset belongs.
  DataFileNames names;
  names.labels = "extra";
  opened = OpenHdf5File(path, names);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr("is not a dataset"));
}

TEST(Hdf5FileTest, DifferentRowCounts) {
  const std::string path = TempPath("rows.h5");
  const std::vector<float> x(10, 1.0f);
  const std::vector<int64_t> y(9, 1);
  const hid_t file = CreateFile(path);
  ASSERT_GE(file, 0);
  WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {10},
               x.data());
  WriteDataset(file, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {9}, y.data());
  H5Fclose(file);

  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(),
              AllOf(HasSubstr("holds 10 rows of features"),
                    HasSubstr("holds 9 rows of labels")));
}

TEST(Hdf5FileTest, UnsupportedTypes) {
  const std::vector<float> x = {1, 2};
  {
    SCOPED_TRACE("strings");
    const std::string path = TempPath("strings.h5");
    const hid_t file = CreateFile(path);
    ASSERT_GE(file, 0);
    WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2},
                 x.data());
    const hid_t string_type = H5Tcopy(H5T_C_S1);
    H5Tset_size(string_type, 4);
    const char labels[2][4] = {"cat", "dog"};
    WriteDataset(file, "labels", string_type, string_type, {2}, labels);
    H5Tclose(string_type);
    H5Fclose(file);
    absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opened.status().message(),
                AllOf(HasSubstr("dataset 'labels'"), HasSubstr(path),
                      HasSubstr("unsupported type, string")));
  }
  {
    SCOPED_TRACE("uint64");
    const std::string path = TempPath("uint64.h5");
    const std::vector<uint64_t> y = {1, 2};
    const hid_t file = CreateFile(path);
    ASSERT_GE(file, 0);
    WriteDataset(file, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2},
                 x.data());
    WriteDataset(file, "labels", H5T_STD_U64LE, H5T_NATIVE_UINT64, {2},
                 y.data());
    H5Fclose(file);
    absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opened.status().message(),
                HasSubstr("unsupported type, unsigned integer of 8 bytes"));
  }
  {
    SCOPED_TRACE("scalar");
    const std::string path = TempPath("scalar.h5");
    const hid_t file = CreateFile(path);
    ASSERT_GE(file, 0);
    WriteDataset(file, "labels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2},
                 x.data());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t dataset = H5Dcreate2(file, "features", H5T_IEEE_F32LE, space,
                                     H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(dataset);
    H5Sclose(space);
    H5Fclose(file);
    absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opened.status().message(), HasSubstr("is a scalar"));
  }
}

TEST(Hdf5FileTest, RangeOutsideTheFile) {
  const std::string path = WriteFloatFile("range.h5");
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  for (const auto& [begin, end] :
       std::vector<std::pair<int, int>>{{-1, 2}, {3, 2}, {0, 11}, {10, 11}}) {
    absl::StatusOr<DataRows> rows = (*opened)->Read(begin, end);
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument)
        << begin << ", " << end;
    EXPECT_THAT(rows.status().message(), HasSubstr("holds 10 rows"));
  }
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The file is rewritten in place (as `cp small.h5 big.h5` does) with fewer
// rows while it is open: the next Read reports it instead of returning
// zeros or stale rows.
TEST(Hdf5FileTest, FileRewrittenWithFewerRowsIsDataLoss) {
  const std::string path = WriteFloatFile("rewritten.h5", 100);
  const std::string smaller = ReadBytes(WriteFloatFile("smaller.h5", 4));
  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE((*opened)->Read(0, 100).ok());

  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << smaller;
  }
  absl::StatusOr<DataRows> rows = (*opened)->Read(0, 100);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(rows.status().message(),
              AllOf(HasSubstr(path), HasSubstr("rows [0, 100)"),
                    HasSubstr("did it change while the job ran?")));
}

// A chunk whose compressed bytes are damaged (before the file is opened):
// rows in other chunks still read, rows in it are DataLoss naming the
// file, the dataset and the rows.
TEST(Hdf5FileTest, CorruptChunkIsDataLoss) {
  const std::string path = WriteImageFile("corrupt.h5", Layout{8, 4});
  haddr_t address = 0;
  hsize_t size = 0;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t dataset = H5Dopen2(file, "features", H5P_DEFAULT);
    const hid_t space = H5Dget_space(dataset);
    hsize_t offset[3];
    unsigned filter_mask = 0;
    // Chunk 1 holds rows [8, 16).
    ASSERT_GE(H5Dget_chunk_info(dataset, space, 1, offset, &filter_mask,
                                &address, &size),
              0);
    ASSERT_EQ(offset[0], 8u);
    H5Sclose(space);
    H5Dclose(dataset);
    H5Fclose(file);
  }
  ASSERT_GT(size, 16u);
  {
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(static_cast<std::streamoff>(address));
    const std::string garbage(16, '\xff');
    out.write(garbage.data(), garbage.size());
  }

  absl::StatusOr<std::unique_ptr<DataFile>> opened = OpenHdf5File(path, {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE((*opened)->Read(0, 8).ok());
  EXPECT_TRUE((*opened)->Read(16, 50).ok());
  absl::StatusOr<DataRows> rows = (*opened)->Read(4, 12);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(rows.status().message(),
              AllOf(HasSubstr("rows [4, 12)"), HasSubstr("dataset 'features'"),
                    HasSubstr(path)));
}

}  // namespace
}  // namespace mpilearn::worker
