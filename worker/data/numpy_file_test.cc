// OpenNumpyFile on .npy files written byte by byte here (header versions 1,
// 2 and 3) and on .npz archives written by numpy.savez and
// savez_compressed (through /usr/bin/python3; those tests skip when it
// cannot import numpy). Values are checked against the formula that made
// them, in double precision.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/data/data_file.h"

namespace mpilearn::worker {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A .npy file as numpy writes it: magic, version, little-endian header
// length (2 bytes for version 1, 4 for 2 and 3), the dict padded with
// spaces and ended by '\n' so the data starts 64-byte aligned, then the
// data.
std::string Npy(const std::string& descr, const std::string& shape,
                const std::string& data, int version = 1,
                const std::string& fortran = "False") {
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': ", fortran,
                   ", 'shape': ", shape, ", }");
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(version);
  out += '\0';
  const uint32_t length = static_cast<uint32_t>(dict.size());
  for (size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) {
    out += static_cast<char>((length >> (8 * i)) & 0xFF);
  }
  return out + dict + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

// Expects float tensor `t` to hold `expected` (row-major) within `tol`.
void ExpectNear(const torch::Tensor& t, const std::vector<double>& expected,
                double tol) {
  const torch::Tensor flat = t.to(torch::kFloat64).contiguous().view({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), expected[i], tol) << "at " << i;
  }
}

// Features f[i][j] = 0.25 * i - j (exact in float32), labels i % 10.
void WriteFloatPair(const std::string& features_path,
                    const std::string& labels_path, int64_t rows, int64_t width,
                    int version = 1) {
  std::vector<float> f;
  std::vector<int64_t> l;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < width; ++j) f.push_back(0.25f * i - j);
    l.push_back(i % 10);
  }
  WriteFile(features_path, Npy("<f4", absl::StrCat("(", rows, ", ", width, ")"),
                               Bytes(f), version));
  WriteFile(labels_path,
            Npy("<i8", absl::StrCat("(", rows, ",)"), Bytes(l), version));
}

TEST(NpyTest, Float32FeaturesInt64Labels) {
  const std::string path = TempPath("float_features.npy");
  WriteFloatPair(path, TempPath("float_labels.npy"), 6, 3);
  auto file = OpenDataFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  DataFile& f = **file;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.rows(), 6);
  EXPECT_EQ(f.feature_shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(f.label_shape(), (std::vector<int64_t>{}));
  EXPECT_EQ(f.feature_type(), ElementType::kFloat32);
  EXPECT_EQ(f.label_type(), ElementType::kInt64);

  auto rows = f.Read(2, 5);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->features.sizes().vec(), (std::vector<int64_t>{3, 3}));
  std::vector<double> expected;
  for (int i = 2; i < 5; ++i) {
    for (int j = 0; j < 3; ++j) expected.push_back(0.25 * i - j);
  }
  ExpectNear(rows->features, expected, 0);
  ASSERT_EQ(rows->labels.scalar_type(), torch::kInt64);
  ASSERT_EQ(rows->labels.sizes().vec(), (std::vector<int64_t>{3}));
  EXPECT_EQ(rows->labels[0].item<int64_t>(), 2);
  EXPECT_EQ(rows->labels[2].item<int64_t>(), 4);

  auto none = f.Read(6, 6);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->features.size(0), 0);
  EXPECT_EQ(none->labels.size(0), 0);

  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{4, 7}, {-1, 2}, {3, 2}}) {
    auto bad = f.Read(begin, end);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("6 rows"));
  }
}

TEST(NpyTest, FeaturesAndLabelsReadAlone) {
  const std::string path = TempPath("alone_features.npy");
  WriteFloatPair(path, TempPath("alone_labels.npy"), 12, 2);
  auto file = OpenDataFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<torch::Tensor> labels = (*file)->ReadLabels(3, 11);
  ASSERT_TRUE(labels.ok()) << labels.status();
  ASSERT_EQ(labels->scalar_type(), torch::kInt64);
  ExpectNear(*labels, {3, 4, 5, 6, 7, 8, 9, 0}, 0);
  absl::StatusOr<torch::Tensor> features = (*file)->ReadFeatures(10, 12);
  ASSERT_TRUE(features.ok()) << features.status();
  ASSERT_EQ(features->sizes().vec(), (std::vector<int64_t>{2, 2}));
  ExpectNear(*features, {2.5, 1.5, 2.75, 1.75}, 0);
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{4, 13}, {-1, 2}, {3, 2}}) {
    for (const absl::Status& status :
         {(*file)->ReadLabels(begin, end).status(),
          (*file)->ReadFeatures(begin, end).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr(absl::StrCat("rows [", begin, ", ", end,
                                         ") are outside '", path,
                                         "', which holds 12 rows")));
    }
  }
}

TEST(NpyTest, Uint8ImagesVersion2And3Headers) {
  for (int version : {2, 3}) {
    SCOPED_TRACE(version);
    const std::string stem = absl::StrCat("v", version, "_");
    std::vector<uint8_t> images(4 * 2 * 3);
    for (size_t i = 0; i < images.size(); ++i) images[i] = 11 * i;
    const std::vector<uint8_t> labels = {3, 1, 4, 1};
    WriteFile(TempPath(stem + "features.npy"),
              Npy("|u1", "(4, 2, 3)", Bytes(images), version));
    WriteFile(TempPath(stem + "labels.npy"),
              Npy("|u1", "(4,)", Bytes(labels), version));
    auto file = OpenDataFile(TempPath(stem + "features.npy"));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ((*file)->feature_type(), ElementType::kUint8);
    auto rows = (*file)->Read(1, 3);
    ASSERT_TRUE(rows.ok()) << rows.status();
    // A single-channel image, scaled by 1/255 as from IDX.
    ASSERT_EQ(rows->features.sizes().vec(), (std::vector<int64_t>{2, 1, 2, 3}));
    std::vector<double> expected;
    for (int i = 6; i < 18; ++i) expected.push_back(11.0 * i / 255);
    ExpectNear(rows->features, expected, 6e-8);
    ASSERT_EQ(rows->labels.scalar_type(), torch::kInt64);
    EXPECT_EQ(rows->labels[0].item<int64_t>(), 1);
    EXPECT_EQ(rows->labels[1].item<int64_t>(), 4);
  }
}

TEST(NpyTest, OneHotAndFloatTargets) {
  const std::vector<double> f = {1.5, -2.0, 0.125};
  const std::vector<int16_t> one_hot = {0, 1, 1, 0, 0, 1};
  WriteFile(TempPath("hot_features.npy"), Npy("<f8", "(3,)", Bytes(f)));
  WriteFile(TempPath("hot_labels.npy"), Npy("<i2", "(3, 2)", Bytes(one_hot)));
  auto file = OpenDataFile(TempPath("hot_features.npy"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto rows = (*file)->Read(0, 3);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->features.sizes().vec(), (std::vector<int64_t>{3, 1}));
  ExpectNear(rows->features, f, 0);
  ASSERT_EQ(rows->labels.scalar_type(), torch::kFloat32);
  ASSERT_EQ(rows->labels.sizes().vec(), (std::vector<int64_t>{3, 2}));
  ExpectNear(rows->labels, {0, 1, 1, 0, 0, 1}, 0);
}

TEST(NpyTest, LabelsFileNaming) {
  // The last occurrence in the file name is replaced; the directory is not.
  const std::string dir = TempPath("features_dir");
  ASSERT_EQ(system(absl::StrCat("mkdir -p '", dir, "'").c_str()), 0);
  WriteFloatPair(dir + "/a_features_b_features.npy",
                 dir + "/a_features_b_labels.npy", 2, 2);
  auto file = OpenDataFile(dir + "/a_features_b_features.npy");
  EXPECT_TRUE(file.ok()) << file.status();

  DataFileNames names;
  names.features = "x";
  names.labels = "y";
  WriteFloatPair(dir + "/data_x.npy", dir + "/data_y.npy", 2, 2);
  file = OpenDataFile(dir + "/data_x.npy", names);
  EXPECT_TRUE(file.ok()) << file.status();

  // A name without `features` (only the directory has it).
  WriteFile(dir + "/inputs.npy", Npy("<f4", "(1, 1)", Bytes<float>({1})));
  file = OpenDataFile(dir + "/inputs.npy");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("does not contain 'features'"));

  // The labels file is missing: the message names the expected path.
  WriteFile(dir + "/lonely_features.npy",
            Npy("<f4", "(1, 1)", Bytes<float>({1})));
  file = OpenDataFile(dir + "/lonely_features.npy");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr(dir + "/lonely_labels.npy"));

  file = OpenDataFile(dir + "/absent_features.npy");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

// Writes x_features.npy with `features` and a valid 2-row labels file, and
// returns the status of opening it.
absl::Status OpenWithFeatures(const std::string& stem,
                              const std::string& features) {
  WriteFile(TempPath(stem + "_features.npy"), features);
  WriteFile(TempPath(stem + "_labels.npy"),
            Npy("<i8", "(2,)", Bytes<int64_t>({0, 1})));
  return OpenDataFile(TempPath(stem + "_features.npy")).status();
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& text) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST(NpyTest, Errors) {
  const std::string two_floats = Bytes<float>({1, 2, 3, 4});
  ExpectError(OpenWithFeatures("magic", "PK\x03\x04 not numpy at all"),
              absl::StatusCode::kInvalidArgument, "\\x93NUMPY");
  ExpectError(OpenWithFeatures("big", Npy(">f4", "(2, 2)", two_floats)),
              absl::StatusCode::kInvalidArgument, "arr.astype('<f4')");
  ExpectError(
      OpenWithFeatures("fortran", Npy("<f4", "(2, 2)", two_floats, 1, "True")),
      absl::StatusCode::kInvalidArgument, "np.ascontiguousarray");
  ExpectError(OpenWithFeatures("truncated",
                               Npy("<f4", "(2, 2)", two_floats.substr(0, 15))),
              absl::StatusCode::kDataLoss, "truncated");
  ExpectError(OpenWithFeatures("complex", Npy("<c8", "(2, 1)", two_floats)),
              absl::StatusCode::kInvalidArgument, "'<c8', which is not");
  ExpectError(OpenWithFeatures("bool", Npy("|b1", "(2, 2)", "\1\0\1\0")),
              absl::StatusCode::kInvalidArgument, "astype('u1')");
  ExpectError(OpenWithFeatures("half", Npy("<f2", "(2, 2)", "12345678")),
              absl::StatusCode::kInvalidArgument, "not supported");
  ExpectError(OpenWithFeatures("version", Npy("<f4", "(2, 2)", two_floats, 4)),
              absl::StatusCode::kInvalidArgument, "version 4");
  ExpectError(OpenWithFeatures("scalar", Npy("<f4", "()", two_floats)),
              absl::StatusCode::kInvalidArgument, "0-dimensional");
  ExpectError(
      OpenWithFeatures("huge", Npy("<f4", "(1048576, 1048576, 2)", two_floats)),
      absl::StatusCode::kInvalidArgument, "elements");
  std::string not_dict = Npy("<f4", "(2, 2)", two_floats);
  not_dict[10] = '[';
  ExpectError(OpenWithFeatures("dict", not_dict),
              absl::StatusCode::kInvalidArgument, "not a NumPy header dict");
  ExpectError(OpenWithFeatures("rows", Npy("<f4", "(4, 1)", two_floats)),
              absl::StatusCode::kInvalidArgument, "same first dimension");
}

TEST(NpyTest, FileShrunkAfterOpen) {
  const std::string path = TempPath("shrink_features.npy");
  WriteFloatPair(path, TempPath("shrink_labels.npy"), 100, 4);
  auto file = OpenDataFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Read(0, 100).ok());
  ASSERT_EQ(truncate(path.c_str(), 200), 0);
  auto rows = (*file)->Read(0, 10);
  ASSERT_FALSE(rows.ok());
  ExpectError(rows.status(), absl::StatusCode::kDataLoss,
              "changed while the job ran");
  EXPECT_THAT(std::string(rows.status().message()), HasSubstr("rows [0, 10)"));
}

// Runs a Python program with numpy; false when /usr/bin/python3 cannot
// import numpy.
bool HaveNumpy() {
  return system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

void RunPython(const std::string& program) {
  const std::string script = TempPath("make_npz.py");
  WriteFile(script, program);
  ASSERT_EQ(system(absl::StrCat("/usr/bin/python3 '", script, "'").c_str()), 0)
      << program;
}

// Archives with features f[i][j] = 0.25 * i - j (float32, [rows, 7]) and
// labels i % 10 (int64), written by numpy.savez or savez_compressed.
TEST(NpzTest, StoredAndCompressed) {
  if (!HaveNumpy()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy";
  const std::string dir = ::testing::TempDir();
  RunPython(absl::StrCat(R"(import numpy as np
rows = 1000
i = np.arange(rows, dtype=np.float64)[:, None]
j = np.arange(7, dtype=np.float64)[None, :]
f = (0.25 * i - j).astype('<f4')
l = np.arange(rows, dtype='<i8') % 10
np.savez(')",
                         dir, R"(/stored.npz', features=f, labels=l)
np.savez_compressed(')",
                         dir, R"(/compressed.npz', features=f, labels=l)
)"));
  for (const char* name : {"stored.npz", "compressed.npz"}) {
    SCOPED_TRACE(name);
    auto file = OpenDataFile(TempPath(name));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->rows(), 1000);
    EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{7}));
    EXPECT_EQ((*file)->feature_type(), ElementType::kFloat32);
    EXPECT_EQ((*file)->label_type(), ElementType::kInt64);
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 1},
                              {998, 1000},
                              {123, 456},
                              {0, 1000}}) {
      auto rows = (*file)->Read(begin, end);
      ASSERT_TRUE(rows.ok()) << rows.status();
      std::vector<double> expected;
      for (int64_t i = begin; i < end; ++i) {
        for (int j = 0; j < 7; ++j) expected.push_back(0.25 * i - j);
      }
      ExpectNear(rows->features, expected, 0);
      ASSERT_EQ(rows->labels.numel(), end - begin);
      for (int64_t i = begin; i < end; i += 37) {
        EXPECT_EQ(rows->labels[i - begin].item<int64_t>(), i % 10);
      }
    }
  }
}

TEST(NpzTest, ImagesAndNamesAndErrors) {
  if (!HaveNumpy()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy";
  const std::string dir = ::testing::TempDir();
  RunPython(absl::StrCat(R"(import numpy as np, zipfile, struct
d = ')",
                         dir, R"('
img = (np.arange(3 * 28 * 28) % 256).astype('|u1').reshape(3, 28, 28)
np.savez_compressed(d + '/images.npz', x=img, y=np.array([7, 8, 9], '|u1'))
np.savez(d + '/other.npz', a=img, b=np.zeros(3))
np.savez(d + '/rows.npz', features=img, labels=np.zeros(4))
np.savez(d + '/shrink.npz', features=img, labels=np.zeros(3))
f = np.random.RandomState(1).rand(4000, 20).astype('<f4')
np.savez_compressed(d + '/corrupt.npz', features=f, labels=np.zeros(4000))
z = zipfile.ZipFile(d + '/corrupt.npz')
info = z.getinfo('features.npy')
data = bytearray(open(d + '/corrupt.npz', 'rb').read())
names, extra = struct.unpack('<HH', data[info.header_offset + 26:info.header_offset + 30])
middle = info.header_offset + 30 + names + extra + info.compress_size // 2
data[middle] ^= 0x5A
open(d + '/corrupt.npz', 'wb').write(bytes(data))
# A central directory that claims an inflated size deflate cannot reach.
data = bytearray(open(d + '/images.npz', 'rb').read())
entry = data.find(b'x.npy', data.find(b'PK\x01\x02')) - 46
data[entry + 24:entry + 28] = struct.pack('<I', 0x7ffffff0)
open(d + '/claims.npz', 'wb').write(bytes(data))
)"));
  DataFileNames names;
  names.features = "x";
  names.labels = "y";
  auto file = OpenDataFile(dir + "/images.npz", names);
  ASSERT_TRUE(file.ok()) << file.status();
  auto rows = (*file)->Read(1, 3);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->features.sizes().vec(), (std::vector<int64_t>{2, 1, 28, 28}));
  std::vector<double> expected;
  for (int k = 784; k < 3 * 784; ++k) expected.push_back((k % 256) / 255.0);
  ExpectNear(rows->features, expected, 6e-8);
  EXPECT_EQ(rows->labels[0].item<int64_t>(), 8);
  EXPECT_EQ(rows->labels[1].item<int64_t>(), 9);

  // A member absent: the message lists the members that exist.
  ExpectError(OpenDataFile(dir + "/other.npz").status(),
              absl::StatusCode::kInvalidArgument,
              "no member 'features.npy'; its members: a.npy, b.npy");
  ExpectError(OpenDataFile(dir + "/rows.npz").status(),
              absl::StatusCode::kInvalidArgument, "same first dimension");
  WriteFile(dir + "/text.npz", "just some text, not a zip archive");
  ExpectError(OpenDataFile(dir + "/text.npz").status(),
              absl::StatusCode::kInvalidArgument, "not a NumPy .npz archive");
  ExpectError(OpenDataFile(dir + "/absent.npz").status(),
              absl::StatusCode::kNotFound, "absent.npz");

  // Opening inflates only the start of a large member (its header); the
  // damage in its middle shows on the first read.
  file = OpenDataFile(dir + "/corrupt.npz");
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectError((*file)->Read(0, 1).status(), absl::StatusCode::kDataLoss,
              "corrupt");

  ExpectError(OpenDataFile(dir + "/claims.npz", names).status(),
              absl::StatusCode::kDataLoss, "cannot inflate to the 2147483632");

  file = OpenDataFile(dir + "/shrink.npz");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(truncate((dir + "/shrink.npz").c_str(), 1000), 0);
  ExpectError((*file)->Read(0, 1).status(), absl::StatusCode::kDataLoss,
              "changed while the job ran");
}

// .npy files as numpy.save writes them, good and refused.
TEST(NpyTest, WrittenByNumpy) {
  if (!HaveNumpy()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy";
  const std::string dir = ::testing::TempDir();
  RunPython(absl::StrCat(R"(import numpy as np
d = ')",
                         dir, R"('
x = (np.arange(5 * 2 * 3) / 8.0).reshape(5, 2, 3)
np.save(d + '/np_features.npy', x)
np.save(d + '/np_labels.npy', np.arange(5, dtype='<i2').reshape(5, 1) * 3)
np.save(d + '/fort_features.npy', np.asfortranarray(x))
np.save(d + '/fort_labels.npy', np.zeros(5))
np.save(d + '/be_features.npy', x.astype('>f8'))
np.save(d + '/be_labels.npy', np.zeros(5))
)"));
  auto file = OpenDataFile(dir + "/np_features.npy");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->feature_type(), ElementType::kFloat64);
  EXPECT_EQ((*file)->feature_shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*file)->label_type(), ElementType::kInt16);
  EXPECT_EQ((*file)->label_shape(), (std::vector<int64_t>{1}));
  auto rows = (*file)->Read(3, 5);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<double> expected;
  for (int k = 18; k < 30; ++k) expected.push_back(k / 8.0);
  ASSERT_EQ(rows->features.sizes().vec(), (std::vector<int64_t>{2, 2, 3}));
  ExpectNear(rows->features, expected, 0);
  // Integer [N, 1] labels are float rows.
  ASSERT_EQ(rows->labels.sizes().vec(), (std::vector<int64_t>{2, 1}));
  ExpectNear(rows->labels, {9, 12}, 0);

  ExpectError(OpenDataFile(dir + "/fort_features.npy").status(),
              absl::StatusCode::kInvalidArgument, "Fortran order");
  ExpectError(OpenDataFile(dir + "/be_features.npy").status(),
              absl::StatusCode::kInvalidArgument, "big-endian");
}

// More than 65535 members: the archive ends in a ZIP64 end record, which
// Python's zipfile writes only then.
TEST(NpzTest, Zip64EndRecord) {
  if (!HaveNumpy()) GTEST_SKIP() << "/usr/bin/python3 cannot import numpy";
  const std::string dir = ::testing::TempDir();
  RunPython(absl::StrCat(R"(import io, numpy as np, zipfile
def npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()
with zipfile.ZipFile(')",
                         dir, R"(/many.npz', 'w') as z:
    for k in range(65536):
        z.writestr('pad%d.npy' % k, b'')
    z.writestr('features.npy', npy(np.arange(12, dtype='<f8').reshape(4, 3)))
    z.writestr('labels.npy', npy(np.array([5, 6, 7, 8], '<i4')))
)"));
  auto file = OpenDataFile(dir + "/many.npz");
  ASSERT_TRUE(file.ok()) << file.status();
  auto rows = (*file)->Read(2, 4);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectNear(rows->features, {6, 7, 8, 9, 10, 11}, 0);
  EXPECT_EQ(rows->labels[1].item<int64_t>(), 8);
  DataFileNames names;
  names.features = "absent";
  ExpectError(OpenDataFile(dir + "/many.npz", names).status(),
              absl::StatusCode::kInvalidArgument, "pad19.npy and 65518 more");
}

}  // namespace
}  // namespace mpilearn::worker
