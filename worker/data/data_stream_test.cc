// ScanDataFiles, FileReader and UnitPrefetcher against HDF5 and NumPy files
// this test writes: the streamed splits must hold exactly the rows
// LoadDatasets loads whole for the same spec (train_limit, a hold-out that
// spans two files, test_limit), every read must equal the values written
// (recomputed here from their formula), and every bad input must be named.
// Long because each of the three classes needs its files written here.
#include "worker/data/data_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "hdf5/serial/hdf5.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/data_file.h"
#include "worker/data/dataset.h"
#include "worker/data/fold_fixtures.h"

namespace mpilearn::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

constexpr int kWidth = 3;

// Feature j of row i of test file `file`: a multiple of 1/4 below 2^12,
// exact in float32.
double Feature(int file, int64_t i, int j) {
  return file * 100 + static_cast<double>(i) + j / 4.0;
}

void WriteDataset(hid_t file, const char* name, hid_t file_type,
                  hid_t memory_type, const std::vector<hsize_t>& dims,
                  const void* data) {
  const hid_t space =
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  ASSERT_GE(space, 0);
  const hid_t dataset = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT,
                                   H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(dataset, 0) << name;
  ASSERT_GE(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
            0);
  H5Dclose(dataset);
  H5Sclose(space);
}

// Float32 features [labels.size(), kWidth] by Feature(file, ...) and int64
// class labels, in HDF5 file `name`; returns its path. `nan_row` >= 0 puts
// a NaN in that row's features.
std::string WriteH5(const std::string& name, int file,
                    const std::vector<int64_t>& labels, int64_t nan_row = -1) {
  const std::string path = TempPath(name);
  std::vector<float> features;
  for (size_t i = 0; i < labels.size(); ++i) {
    for (int j = 0; j < kWidth; ++j) {
      features.push_back(static_cast<float>(Feature(file, i, j)));
    }
  }
  if (nan_row >= 0) {
    features[nan_row * kWidth + 1] = std::numeric_limits<float>::quiet_NaN();
  }
  const hid_t h5 =
      H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(h5, 0) << path;
  const hsize_t n = labels.size();
  WriteDataset(h5, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n, kWidth},
               features.data());
  WriteDataset(h5, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {n},
               labels.data());
  H5Fclose(h5);
  return path;
}

// Rows of labels for `rows` rows of file `file`: (file * 3 + i) % 5.
std::vector<int64_t> Labels(int file, int64_t rows) {
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back((file * 3 + i) % 5);
  return labels;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A version 1 .npy file: magic, header length, the header dict padded to
// 64 bytes, the data.
std::string Npy(const std::string& descr, const std::string& shape,
                const std::string& data) {
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }");
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xFF);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

// As WriteH5, as a NumPy pair `stem`_features.npy and `stem`_labels.npy;
// returns the features' path.
std::string WriteNpy(const std::string& stem, int file,
                     const std::vector<int64_t>& labels) {
  std::vector<float> features;
  for (size_t i = 0; i < labels.size(); ++i) {
    for (int j = 0; j < kWidth; ++j) {
      features.push_back(static_cast<float>(Feature(file, i, j)));
    }
  }
  const std::string path = TempPath(absl::StrCat(stem, "_features.npy"));
  WriteBytes(path,
             Npy("<f4", absl::StrCat("(", labels.size(), ", ", kWidth, ")"),
                 Bytes(features)));
  WriteBytes(TempPath(absl::StrCat(stem, "_labels.npy")),
             Npy("<i8", absl::StrCat("(", labels.size(), ",)"), Bytes(labels)));
  return path;
}

// Expects `actual` to hold exactly `features` and `labels`.
void ExpectSameRows(const DataRows& actual, const torch::Tensor& features,
                    const torch::Tensor& labels) {
  ASSERT_TRUE(actual.features.defined());
  EXPECT_EQ(actual.features.sizes(), features.sizes());
  EXPECT_EQ(actual.labels.sizes(), labels.sizes());
  EXPECT_EQ(actual.labels.scalar_type(), labels.scalar_type());
  EXPECT_TRUE(torch::equal(actual.features, features));
  EXPECT_TRUE(torch::equal(actual.labels, labels));
}

// Expects `rows` to be rows [begin, end) of test file `file` (written by
// WriteH5 / WriteNpy with Labels(file, ...)).
void ExpectFileRows(const DataRows& rows, int file, int64_t begin,
                    int64_t end) {
  ASSERT_EQ(rows.features.sizes().vec(),
            (std::vector<int64_t>{end - begin, kWidth}));
  ASSERT_EQ(rows.labels.sizes().vec(), (std::vector<int64_t>{end - begin}));
  const std::vector<int64_t> labels = Labels(file, end);
  for (int64_t i = begin; i < end; ++i) {
    for (int j = 0; j < kWidth; ++j) {
      ASSERT_EQ(rows.features[i - begin][j].item<double>(), Feature(file, i, j))
          << "file " << file << " row " << i;
    }
    ASSERT_EQ(rows.labels[i - begin].item<int64_t>(), labels[i]);
  }
}

// Every row of `list`, read whole.
DataRows ReadAll(const FileList& list, const DataFileNames& names) {
  FileReader reader(list, names);
  absl::StatusOr<DataRows> rows = reader.ReadRange(0, list.total_rows());
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *rows : DataRows{};
}

// `paths` without repeated separators, to compare.
std::vector<std::string> Normal(const std::vector<std::string>& paths) {
  std::vector<std::string> normal;
  for (const std::string& path : paths) {
    normal.push_back(std::filesystem::path(path).lexically_normal().string());
  }
  return normal;
}

TEST(ScanDataFilesTest, SameSplitsAsLoadDatasets) {
  // Training: a.h5 10 rows, b (NumPy pair) 7, c.h5 8, d.h5 5. train_limit
  // 22 keeps a, b and c's first 5; the hold-out of 8 takes c's 5 and b's
  // last 3. c's row 7 (past the limit) holds class 11 and d a -1: neither
  // is read. The held-out b row 5 holds class 9, the largest read.
  std::vector<int64_t> b_labels = Labels(1, 7);
  b_labels[5] = 9;
  std::vector<int64_t> c_labels = Labels(2, 8);
  c_labels[7] = 11;
  std::vector<int64_t> d_labels = Labels(3, 5);
  d_labels[0] = -1;
  const std::string a = WriteH5("same_a.h5", 0, Labels(0, 10));
  const std::string b = WriteNpy("same_b", 1, b_labels);
  const std::string c = WriteH5("same_c.h5", 2, c_labels);
  const std::string d = WriteH5("same_d.h5", 3, d_labels);
  const std::string e = WriteH5("same_e.h5", 4, Labels(4, 6));
  // The training list as a text file of paths relative to it.
  const std::string list = TempPath("same_train.txt");
  WriteBytes(list,
             "# training files\nsame_a.h5\n\nsame_b_features.npy\n"
             "same_c.h5\nsame_d.h5\n");

  v1::DataSpec spec;
  spec.add_train_files(list);
  spec.add_test_files(e);
  spec.set_train_limit(22);
  spec.set_validation_count(8);
  spec.set_test_limit(4);
  absl::StatusOr<FileSplits> files = ScanDataFiles(spec);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<DatasetSplits> loaded = LoadDatasets(spec);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  EXPECT_EQ(files->input_shape, loaded->input_shape);
  EXPECT_EQ(files->input_shape, (std::vector<int64_t>{kWidth}));
  EXPECT_EQ(files->num_classes, loaded->num_classes);
  EXPECT_EQ(files->num_classes, 10);
  EXPECT_EQ(files->float_labels, loaded->float_labels);
  EXPECT_FALSE(files->float_labels);

  EXPECT_EQ(Normal(files->train.paths), Normal({a, b, c, d}));
  EXPECT_EQ(files->train.field, "train_files");
  EXPECT_EQ(files->train.first, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(files->train.rows, (std::vector<int64_t>{10, 4, 0, 0}));
  EXPECT_EQ(files->validation.paths, files->train.paths);
  EXPECT_EQ(files->validation.first, (std::vector<int64_t>{0, 4, 0, 0}));
  EXPECT_EQ(files->validation.rows, (std::vector<int64_t>{0, 3, 5, 0}));
  EXPECT_EQ(files->test.paths, (std::vector<std::string>{e}));
  EXPECT_EQ(files->test.rows, (std::vector<int64_t>{4}));

  const DataRows train = ReadAll(files->train, files->names);
  ExpectSameRows(train, loaded->train.features, loaded->train.labels);
  const DataRows validation = ReadAll(files->validation, files->names);
  ExpectSameRows(validation, loaded->validation.features,
                 loaded->validation.labels);
  const DataRows test = ReadAll(files->test, files->names);
  ExpectSameRows(test, loaded->test.features, loaded->test.labels);
  // And against the values written: validation is b's rows 4..7 then c's
  // 0..5.
  FileReader reader(files->validation, files->names);
  absl::StatusOr<DataRows> rows = reader.ReadFileRows(1, 0, 3);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->labels[1].item<int64_t>(), 9);
  EXPECT_EQ(rows->features[0][0].item<double>(), Feature(1, 4, 0));
  rows = reader.ReadFileRows(2, 0, 5);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 2, 0, 5);
}

TEST(ScanDataFilesTest, ValidationFilesAndFloatLabelsAsLoadDatasets) {
  // uint8 images [N, 4, 4] with one-hot float rows of width 3, in two
  // training files and one validation file.
  auto write = [](const std::string& name, int file, hsize_t rows) {
    std::vector<uint8_t> images;
    std::vector<float> targets;
    for (hsize_t i = 0; i < rows; ++i) {
      for (hsize_t p = 0; p < 16; ++p) {
        images.push_back((file * 50 + i * 3 + p) % 256);
      }
      for (hsize_t k = 0; k < 3; ++k) {
        targets.push_back(static_cast<float>((i + file) % 3 == k));
      }
    }
    const std::string path = TempPath(name);
    const hid_t h5 =
        H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(h5, "x", H5T_STD_U8LE, H5T_NATIVE_UINT8, {rows, 4, 4},
                 images.data());
    WriteDataset(h5, "y", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {rows, 3},
                 targets.data());
    H5Fclose(h5);
    return path;
  };
  v1::DataSpec spec;
  spec.add_train_files(write("images_a.h5", 0, 6));
  spec.add_train_files(write("images_b.h5", 1, 5));
  spec.add_validation_files(write("images_c.h5", 2, 4));
  spec.set_features_dataset("x");
  spec.set_labels_dataset("y");
  absl::StatusOr<FileSplits> files = ScanDataFiles(spec);
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<DatasetSplits> loaded = LoadDatasets(spec);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(files->input_shape, (std::vector<int64_t>{1, 4, 4}));
  EXPECT_EQ(files->input_shape, loaded->input_shape);
  EXPECT_TRUE(files->float_labels);
  EXPECT_EQ(files->num_classes, 3);
  EXPECT_EQ(files->num_classes, loaded->num_classes);
  EXPECT_EQ(files->validation.field, "validation_files");
  EXPECT_EQ(files->train.rows, (std::vector<int64_t>{6, 5}));
  EXPECT_TRUE(files->test.empty());
  ExpectSameRows(ReadAll(files->train, files->names), loaded->train.features,
                 loaded->train.labels);
  ExpectSameRows(ReadAll(files->validation, files->names),
                 loaded->validation.features, loaded->validation.labels);
  // A pixel against its value written: file 1 row 2 pixel 5 = 61 / 255.
  FileReader reader(files->train, files->names);
  absl::StatusOr<DataRows> rows = reader.ReadFileRows(1, 2, 3);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_NEAR(rows->features[0][0][1][1].item<double>(), 61.0 / 255.0, 1e-7);
}

// A FileList of `files` test files of `rows` rows each (file k written
// with Labels(k, rows)), starting at row `first` of each.
FileList WriteList(const std::string& stem, int files, int64_t rows,
                   int64_t first = 0) {
  FileList list;
  list.field = "train_files";
  for (int k = 0; k < files; ++k) {
    list.paths.push_back(
        WriteH5(absl::StrCat(stem, k, ".h5"), k, Labels(k, first + rows)));
    list.first.push_back(first);
    list.rows.push_back(rows);
  }
  return list;
}

TEST(FileReaderTest, ReadRangeCrossingFilesIsTheConcatenation) {
  // Three files of 6 rows used from row 2: 4 rows each, 12 in all.
  const FileList list = WriteList("cross_", 3, 4, /*first=*/2);
  FileReader reader(list, {});
  std::vector<torch::Tensor> features, labels;
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<DataRows> rows = reader.ReadFileRows(k, 0, 4);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ExpectFileRows(*rows, k, 2, 6);
    features.push_back(rows->features);
    labels.push_back(rows->labels);
  }
  const torch::Tensor all_features = torch::cat(features);
  const torch::Tensor all_labels = torch::cat(labels);
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 12}, {3, 5}, {2, 11}, {4, 8}, {7, 7}, {11, 12}}) {
    SCOPED_TRACE(absl::StrCat("[", begin, ", ", end, ")"));
    absl::StatusOr<DataRows> rows = reader.ReadRange(begin, end);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ExpectSameRows(*rows, all_features.narrow(0, begin, end - begin),
                   all_labels.narrow(0, begin, end - begin));
  }
  absl::StatusOr<DataRows> outside = reader.ReadRange(10, 13);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  outside = reader.ReadFileRows(1, 2, 5);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(),
              AllOf(HasSubstr("data.train_files"), HasSubstr(list.paths[1]),
                    HasSubstr("[2, 5)")));
  EXPECT_EQ(reader.ReadFileRows(3, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FileReaderTest, MoreFilesThanItKeepsOpen) {
  const FileList list = WriteList("many_", 9, 5);
  FileReader reader(list, {});
  // Every file in turn, twice, then back and forth: each read reopens or
  // reuses a file and must give that file's rows.
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < 9; ++k) order.push_back(k);
  }
  for (int k : {8, 0, 7, 1, 6, 0, 8, 3, 3, 2}) order.push_back(k);
  for (int k : order) {
    SCOPED_TRACE(absl::StrCat("file ", k));
    absl::StatusOr<DataRows> rows = reader.ReadFileRows(k, 1, 4);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ExpectFileRows(*rows, k, 1, 4);
  }
  absl::StatusOr<DataRows> all = reader.ReadRange(0, 45);
  ASSERT_TRUE(all.ok()) << all.status();
  for (int k = 0; k < 9; ++k) {
    ExpectFileRows(DataRows{all->features.narrow(0, 5 * k, 5),
                            all->labels.narrow(0, 5 * k, 5)},
                   k, 0, 5);
  }
}

TEST(FileReaderTest, AFileShorterThanWhenScanned) {
  FileList list = WriteList("shrunk_", 1, 6);
  WriteH5("shrunk_0.h5", 0, Labels(0, 4));
  FileReader reader(list, {});
  absl::StatusOr<DataRows> rows = reader.ReadFileRows(0, 0, 2);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(rows.status().message(),
              AllOf(HasSubstr("data.train_files"), HasSubstr(list.paths[0]),
                    HasSubstr("holds 4 rows now")));
}

TEST(FileReaderTest, NonFiniteValuesAndBadClassIndicesNameTheRow) {
  FileList list;
  list.field = "train_files";
  list.paths = {WriteH5("finite_a.h5", 0, Labels(0, 4)),
                WriteH5("finite_b.h5", 1, Labels(1, 6), /*nan_row=*/3)};
  list.first = {0, 0};
  list.rows = {4, 6};
  FileReader reader(list, {});
  // Rows around the NaN read fine.
  ASSERT_TRUE(reader.ReadRange(0, 7).ok());
  ASSERT_TRUE(reader.ReadFileRows(1, 4, 6).ok());
  absl::StatusOr<DataRows> rows = reader.ReadRange(2, 9);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      rows.status().message(),
      AllOf(HasSubstr("data.train_files"), HasSubstr(list.paths[1]),
            HasSubstr("'features'"), HasSubstr("nan"), HasSubstr("at row 3;")));

  // Float labels with an infinity at row 2 of a file used from row 1.
  const std::string path = TempPath("finite_labels.h5");
  {
    std::vector<float> features(5 * kWidth, 1.0f);
    std::vector<float> targets = {0, 1, 2,
                                  std::numeric_limits<float>::infinity(), 4};
    const hid_t h5 =
        H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(h5, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {5, kWidth},
                 features.data());
    WriteDataset(h5, "labels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {5},
                 targets.data());
    H5Fclose(h5);
  }
  FileList targets;
  targets.field = "test_files";
  targets.paths = {path};
  targets.first = {1};
  targets.rows = {4};
  FileReader target_reader(targets, {});
  ASSERT_TRUE(target_reader.ReadFileRows(0, 0, 2).ok());
  rows = target_reader.ReadFileRows(0, 1, 4);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      rows.status().message(),
      AllOf(HasSubstr("data.test_files"), HasSubstr(path),
            HasSubstr("'labels'"), HasSubstr("inf"), HasSubstr("at row 3;")));

  // A class index past kMaxClasses at row 1.
  FileList classes;
  classes.field = "validation_files";
  classes.paths = {WriteH5("finite_classes.h5", 0, {0, kMaxClasses, 1})};
  classes.first = {0};
  classes.rows = {3};
  FileReader class_reader(classes, {});
  rows = class_reader.ReadRange(0, 3);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      rows.status().message(),
      AllOf(HasSubstr("data.validation_files"), HasSubstr(classes.paths[0]),
            HasSubstr(absl::StrCat("class index ", kMaxClasses)),
            HasSubstr("at row 1;")));
}

// data.bad_values "skip": the rows holding a NaN or infinity are left out
// and counted; every other row comes back, in order, with its own label.
TEST(FileReaderTest, SkipsNonFiniteRowsWhenAskedTo) {
  FileList list;
  list.field = "train_files";
  list.paths = {WriteH5("skip_a.h5", 2, Labels(2, 6), /*nan_row=*/1)};
  list.first = {0};
  list.rows = {6};
  FileReader reader(list, {}, /*skip_bad_rows=*/true);
  absl::StatusOr<DataRows> rows = reader.ReadFileRows(0, 0, 6);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->skipped, 1);
  ASSERT_EQ(rows->features.size(0), 5);
  const std::vector<int64_t> kept = {0, 2, 3, 4, 5};
  const std::vector<int64_t> labels = Labels(2, 6);
  for (size_t k = 0; k < kept.size(); ++k) {
    EXPECT_EQ(rows->labels[k].item<int64_t>(), labels[kept[k]]);
    EXPECT_FLOAT_EQ(rows->features[k][0].item<float>(),
                    static_cast<float>(Feature(2, kept[k], 0)));
  }
  // A range without the bad row skips nothing; the prefetcher skips too.
  rows = reader.ReadFileRows(0, 2, 6);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->skipped, 0);
  UnitPrefetcher prefetch(list, {}, /*skip_bad_rows=*/true);
  rows = prefetch.Take({0, 0, 3});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->skipped, 1);
  EXPECT_EQ(rows->features.size(0), 2);
}

// With a shuffle seed the rows come back permuted (rows kept whole: each
// label stays with its features), the same way for the same seed.
TEST(UnitPrefetcherTest, ShufflesRowsBySeed) {
  FileList list;
  list.field = "train_files";
  list.paths = {WriteH5("shuffle.h5", 3, Labels(3, 40))};
  list.first = {0};
  list.rows = {40};
  UnitPrefetcher prefetch(list, {});
  absl::StatusOr<DataRows> plain = prefetch.Take({0, 0, 40});
  absl::StatusOr<DataRows> a = prefetch.Take({0, 0, 40, /*shuffle_seed=*/5});
  absl::StatusOr<DataRows> b = prefetch.Take({0, 0, 40, /*shuffle_seed=*/5});
  ASSERT_TRUE(plain.ok() && a.ok() && b.ok());
  EXPECT_TRUE(torch::equal(a->features, b->features));
  EXPECT_FALSE(torch::equal(a->features, plain->features));
  // Each shuffled row is some original row, with that row's label, and
  // every original row appears once.
  std::vector<bool> seen(40, false);
  for (int64_t i = 0; i < 40; ++i) {
    int64_t original = -1;
    for (int64_t j = 0; j < 40; ++j) {
      if (torch::equal(a->features[i], plain->features[j])) original = j;
    }
    ASSERT_GE(original, 0) << "row " << i;
    EXPECT_FALSE(seen[original]);
    seen[original] = true;
    EXPECT_EQ(a->labels[i].item<int64_t>(), plain->labels[original].item<int64_t>());
  }
}

TEST(UnitPrefetcherTest, TakesWhatWasAskedForInAnyOrder) {
  const FileList list = WriteList("prefetch_", 3, 8);
  UnitPrefetcher prefetch(list, {});
  // Take after Prefetch.
  prefetch.Prefetch({0, 0, 4});
  absl::StatusOr<DataRows> rows = prefetch.Take({0, 0, 4});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 0, 0, 4);
  // Take without Prefetch.
  rows = prefetch.Take({1, 2, 7});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 1, 2, 7);
  // Take that skips a pending one (dropped), which can still be taken.
  prefetch.Prefetch({2, 0, 3});
  prefetch.Prefetch({2, 3, 8});
  rows = prefetch.Take({2, 3, 8});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 2, 3, 8);
  rows = prefetch.Take({2, 0, 3});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 2, 0, 3);
  // Prefetch, then Take of another range first: the prefetched one stays.
  prefetch.Prefetch({0, 4, 8});
  rows = prefetch.Take({1, 0, 2});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 1, 0, 2);
  rows = prefetch.Take({0, 4, 8});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 0, 4, 8);
  // More prefetched than it holds: the oldest is dropped, and read again
  // when taken; the same range asked twice is read once.
  prefetch.Prefetch({0, 0, 1});
  prefetch.Prefetch({0, 1, 2});
  prefetch.Prefetch({0, 1, 2});
  prefetch.Prefetch({0, 2, 3});
  for (int64_t i = 0; i < 3; ++i) {
    rows = prefetch.Take({0, i, i + 1});
    ASSERT_TRUE(rows.ok()) << rows.status();
    ExpectFileRows(*rows, 0, i, i + 1);
  }
}

TEST(UnitPrefetcherTest, AnErrorBelongsToItsRangeOnly) {
  FileList list = WriteList("prefetch_error_", 2, 6);
  list.paths[1] = WriteH5("prefetch_error_nan.h5", 1, Labels(1, 6),
                          /*nan_row=*/2);
  UnitPrefetcher prefetch(list, {});
  prefetch.Prefetch({1, 0, 4});
  prefetch.Prefetch({0, 0, 6});
  absl::StatusOr<DataRows> rows = prefetch.Take({1, 0, 4});
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rows.status().message(), HasSubstr("at row 2;"));
  rows = prefetch.Take({0, 0, 6});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 0, 0, 6);
  // A range outside the file's part, then good ones after it.
  rows = prefetch.Take({0, 5, 9});
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  rows = prefetch.Take({1, 3, 6});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectFileRows(*rows, 1, 3, 6);
}

TEST(UnitPrefetcherTest, DestroyedWithReadsPending) {
  const FileList list = WriteList("prefetch_stop_", 2, 2000);
  for (int round = 0; round < 5; ++round) {
    UnitPrefetcher prefetch(list, {});
    prefetch.Prefetch({0, 0, 2000});
    prefetch.Prefetch({1, 0, 2000});
    if (round % 2 == 1) {
      absl::StatusOr<DataRows> rows = prefetch.Take({0, 0, 2000});
      ASSERT_TRUE(rows.ok()) << rows.status();
    }
  }  // Each destructor returns (joins) with reads pending or in progress.
}

TEST(ScanDataFilesTest, ClassIndicesScannedPastOneChunk) {
  // More rows than one scan chunk (2^20): the largest class and a bad one
  // are in the second chunk, and the row named counts from the file start.
  const int64_t n = (int64_t{1} << 20) + 10;
  std::vector<int64_t> labels(n, 1);
  labels[n - 3] = 6;
  std::vector<float> features(n, 0.5f);
  auto write = [&](const std::string& path) {
    const hid_t h5 =
        H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t rows = n;
    WriteDataset(h5, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {rows},
                 features.data());
    WriteDataset(h5, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {rows},
                 labels.data());
    H5Fclose(h5);
  };
  const std::string path = TempPath("chunks.h5");
  write(path);
  v1::DataSpec spec;
  spec.add_train_files(path);
  absl::StatusOr<FileSplits> files = ScanDataFiles(spec);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->num_classes, 7);
  EXPECT_EQ(files->input_shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(files->train.rows, (std::vector<int64_t>{n - 5000}));
  EXPECT_EQ(files->validation.first, (std::vector<int64_t>{n - 5000}));

  labels[n - 2] = kMaxClasses + 5;
  write(path);
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr(path), HasSubstr("'labels'"),
                    HasSubstr(absl::StrCat("at row ", n - 2, ";"))));
}

v1::DataSpec SpecOf(const std::vector<std::string>& train) {
  v1::DataSpec spec;
  for (const std::string& path : train) spec.add_train_files(path);
  spec.set_validation_count(2);
  return spec;
}

TEST(ScanDataFilesTest, BadInputsAreNamed) {
  const std::string good = WriteH5("bad_good.h5", 0, Labels(0, 6));
  const std::string good2 = WriteH5("bad_good2.h5", 1, Labels(1, 6));

  // No training files.
  absl::StatusOr<FileSplits> files = ScanDataFiles(v1::DataSpec());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("data.train_files"));

  // A list file naming nothing.
  const std::string empty_list = TempPath("bad_empty.txt");
  WriteBytes(empty_list, "# nothing\n\n");
  v1::DataSpec spec = SpecOf({good});
  spec.add_test_files(empty_list);
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.test_files"), HasSubstr("names no files")));

  // A file of no rows.
  files = ScanDataFiles(SpecOf({WriteH5("bad_no_rows.h5", 0, {})}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("hold no samples"));

  // A missing file.
  files = ScanDataFiles(SpecOf({good, TempPath("bad_missing.h5")}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), AllOf(HasSubstr("data.train_files"),
                                              HasSubstr("bad_missing.h5")));

  // A missing dataset.
  spec = SpecOf({good});
  spec.set_features_dataset("images");
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.train_files"), HasSubstr("'images'"),
                    HasSubstr(good)));

  // Feature shapes that differ between training files: both named.
  const std::string wide = TempPath("bad_wide.h5");
  {
    std::vector<float> features(6 * 4, 0.5f);
    std::vector<int64_t> labels = Labels(0, 6);
    const hid_t h5 =
        H5Fcreate(wide.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(h5, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {6, 4},
                 features.data());
    WriteDataset(h5, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {6},
                 labels.data());
    H5Fclose(h5);
  }
  files = ScanDataFiles(SpecOf({good, good2, wide}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.train_files"), HasSubstr(wide),
                    HasSubstr(good), HasSubstr("[4]"), HasSubstr("[3]")));
  // ... or between a test file and the training files.
  spec = SpecOf({good});
  spec.add_test_files(wide);
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.test_files"), HasSubstr(wide),
                    HasSubstr("the training file '" + good + "'")));

  // Unsigned bytes in one file, float32 in the other; float label rows in
  // a validation file against class indices.
  const std::string bytes = TempPath("bad_bytes.h5");
  const std::string rows_file = TempPath("bad_rows.h5");
  {
    std::vector<uint8_t> features(6 * kWidth, 7);
    std::vector<float> floats(6 * kWidth, 0.5f);
    std::vector<int64_t> labels = Labels(0, 6);
    std::vector<float> targets(6 * 2, 0.25f);
    hid_t h5 =
        H5Fcreate(bytes.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(h5, "features", H5T_STD_U8LE, H5T_NATIVE_UINT8, {6, kWidth},
                 features.data());
    WriteDataset(h5, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {6},
                 labels.data());
    H5Fclose(h5);
    h5 = H5Fcreate(rows_file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    WriteDataset(h5, "features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {6, kWidth},
                 floats.data());
    WriteDataset(h5, "labels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {6, 2},
                 targets.data());
    H5Fclose(h5);
  }
  files = ScanDataFiles(SpecOf({good, bytes}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr(bytes), HasSubstr(good), HasSubstr("uint8"),
                    HasSubstr("float32")));
  spec = SpecOf({good});
  spec.add_validation_files(rows_file);
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.validation_files"), HasSubstr(rows_file),
                    HasSubstr(good), HasSubstr("float rows of width 2"),
                    HasSubstr("class indices")));

  // A negative class index at row 4 of the second file.
  std::vector<int64_t> negative = Labels(1, 6);
  negative[4] = -3;
  files =
      ScanDataFiles(SpecOf({good, WriteH5("bad_negative.h5", 1, negative)}));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.train_files"), HasSubstr("bad_negative.h5"),
                    HasSubstr("class index -3"), HasSubstr("at row 4;")));

  // A hold-out that leaves nothing to train on.
  spec = SpecOf({good, good2});
  spec.set_validation_count(12);
  files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.validation_count is 12"),
                    HasSubstr("only 12 samples")));
  spec.clear_validation_count();  // the default, 5000
  files = ScanDataFiles(spec);
  EXPECT_THAT(files.status().message(), HasSubstr("(the default)"));
  spec.set_train_limit(-1);
  EXPECT_EQ(ScanDataFiles(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Cross-validation over four training files of 7, 5, 9 and 4 rows, HDF5
// and NumPy by turns. A row's label is its index in the concatenated list
// and its features are Feature(file, row in the file, j), so every row read
// tells where it came from.
struct FoldFiles {
  std::vector<std::string> paths;
  std::vector<int64_t> starts;  // each file's first row in the list
  std::vector<int64_t> sizes;

  // The file holding list row `row`.
  int FileOf(int64_t row) const {
    int f = 0;
    while (row >= starts[f] + sizes[f]) ++f;
    return f;
  }
};

FoldFiles WriteFoldFiles() {
  FoldFiles files;
  files.sizes = {7, 5, 9, 4};
  int64_t start = 0;
  for (int f = 0; f < 4; ++f) {
    std::vector<int64_t> labels(files.sizes[f]);
    std::iota(labels.begin(), labels.end(), start);
    const std::string stem = absl::StrCat("fold_", f);
    files.paths.push_back(f % 2 == 0 ? WriteH5(stem + ".h5", f, labels)
                                     : WriteNpy(stem, f, labels));
    files.starts.push_back(start);
    start += files.sizes[f];
  }
  return files;
}

// The list rows `rows` holds (its labels), each checked against its
// features; with `file` >= 0 every row must come from that file.
std::vector<int64_t> ListRows(const DataRows& rows, const FoldFiles& files,
                              int file = -1) {
  std::vector<int64_t> list_rows;
  for (int64_t r = 0; r < rows.labels.size(0); ++r) {
    const int64_t row = rows.labels[r].item<int64_t>();
    const int f = files.FileOf(row);
    if (file >= 0) {
      EXPECT_EQ(f, file) << "list row " << row;
    }
    for (int j = 0; j < kWidth; ++j) {
      EXPECT_EQ(rows.features[r][j].item<double>(), Feature(f, row - files.starts[f], j))
          << "list row " << row;
    }
    list_rows.push_back(row);
  }
  return list_rows;
}

TEST(ScanDataFilesTest, EveryFoldHoldsOutItsBlockAndTrainsOnTheRest) {
  const FoldFiles files = WriteFoldFiles();
  const int kFiles = 4;
  // What the cases must cover, counted as they run.
  int inside_one_file = 0, across_files = 0;
  for (const auto& [folds, limit] : std::vector<std::pair<int, int>>{
           {2, 0}, {3, 0}, {5, 0}, {7, 0}, {25, 0}, {4, 20}, {3, 9}}) {
    const int64_t n = limit > 0 ? limit : 25;
    std::vector<int> times_held(n, 0);
    for (int fold = 0; fold < folds; ++fold) {
      SCOPED_TRACE(absl::StrCat(fold, " of ", folds, " folds, train_limit ", limit));
      v1::DataSpec spec;
      for (const std::string& path : files.paths) spec.add_train_files(path);
      spec.set_train_limit(limit);
      spec.set_folds(folds);
      spec.set_fold(fold);
      absl::StatusOr<FileSplits> split = ScanDataFiles(spec);
      ASSERT_TRUE(split.ok()) << split.status();
      const auto [held, rest] = ExpectedFoldRows(n, folds, fold);
      const int first_file = files.FileOf(held.front());
      const int last_file = files.FileOf(held.back());
      const bool inside = first_file == last_file &&
                          held.front() > files.starts[first_file] &&
                          held.back() + 1 < std::min(n, files.starts[first_file] +
                                                            files.sizes[first_file]);
      inside_one_file += inside ? 1 : 0;
      across_files += first_file != last_file ? 1 : 0;

      const DataRows validation = ReadAll(split->validation, split->names);
      EXPECT_EQ(ListRows(validation, files), held);
      // The in-memory loader holds out the same rows.
      absl::StatusOr<DatasetSplits> loaded = LoadDatasets(spec);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ExpectSameRows(validation, loaded->validation.features, loaded->validation.labels);

      // Training: entries 0..3 are the spec's files in order; a fold
      // strictly inside one file adds that file's rows after it at the end.
      const FileList& train = split->train;
      ASSERT_EQ(train.paths.size(), static_cast<size_t>(kFiles + (inside ? 1 : 0)));
      FileReader reader(train, split->names);
      std::vector<int64_t> by_entry;
      for (int e = 0; e < static_cast<int>(train.paths.size()); ++e) {
        const int file = e < kFiles ? e : first_file;
        EXPECT_EQ(train.paths[e], train.paths[file]);
        absl::StatusOr<DataRows> rows = reader.ReadFileRows(e, 0, train.rows[e]);
        ASSERT_TRUE(rows.ok()) << rows.status();
        for (const int64_t row : ListRows(*rows, files, file)) by_entry.push_back(row);
      }
      const std::vector<int64_t> read = ListRows(ReadAll(train, split->names), files);
      EXPECT_EQ(read, by_entry);
      std::vector<int64_t> sorted = read;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, rest);
      for (const int64_t r : held) ++times_held[r];

      if (inside) {
        // The prefetcher reads both entries of the same file.
        UnitPrefetcher prefetch(train, split->names);
        prefetch.Prefetch({kFiles, 0, train.rows[kFiles]});
        prefetch.Prefetch({first_file, 0, train.rows[first_file]});
        absl::StatusOr<DataRows> after = prefetch.Take({kFiles, 0, train.rows[kFiles]});
        ASSERT_TRUE(after.ok()) << after.status();
        EXPECT_EQ(ListRows(*after, files, first_file).front(), held.back() + 1);
        absl::StatusOr<DataRows> before =
            prefetch.Take({first_file, 0, train.rows[first_file]});
        ASSERT_TRUE(before.ok()) << before.status();
        EXPECT_EQ(ListRows(*before, files, first_file).back(), held.front() - 1);
      }
    }
    // Over the folds every row is held out exactly once.
    EXPECT_EQ(times_held, std::vector<int>(n, 1)) << folds << " folds";
  }
  EXPECT_GT(inside_one_file, 0);
  EXPECT_GT(across_files, 0);
}

TEST(ScanDataFilesTest, FoldsNeedARowEach) {
  v1::DataSpec spec;
  spec.add_train_files(WriteH5("fold_few_a.h5", 0, Labels(0, 2)));
  spec.add_train_files(WriteNpy("fold_few_b", 1, Labels(1, 1)));
  spec.set_folds(4);
  spec.set_fold(3);
  absl::StatusOr<FileSplits> files = ScanDataFiles(spec);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data.folds is 4 but the training files hold only 3 samples"),
                    HasSubstr("lower data.folds")));
  spec.set_folds(3);
  EXPECT_EQ(ScanDataFiles(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.set_fold(2);
  files = ScanDataFiles(spec);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->validation.rows, (std::vector<int64_t>{0, 1}));
  spec.add_validation_files(spec.train_files(0));
  EXPECT_THAT(ScanDataFiles(spec).status().message(),
              HasSubstr("remove the validation files"));
}

}  // namespace
}  // namespace mpilearn::worker
