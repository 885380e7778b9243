// Runs the make_synthetic_data binary with small sizes and reads its files
// back through worker/data/idx_reader.h and worker/data/dataset.h, checking
// each kind's documented rule against a double-precision recomputation.
#include <sys/wait.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/data/data_file.h"
#include "worker/data/dataset.h"
#include "worker/data/idx_reader.h"

namespace mpilearn {
namespace {

using ::mpilearn::worker::IdxArray;
using ::mpilearn::worker::IdxType;
using ::mpilearn::worker::ReadIdxFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kPi = 3.14159265358979323846;
// The weights the tool's file comment documents for y0.
constexpr double kWeights[8] = {0.9, -0.7, 0.5, -0.3, 0.2, -0.1, 0.6, -0.4};

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult RunTool(const std::vector<std::string>& args) {
  std::string command = ShellQuote(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/mpilearn/tools/data/make_synthetic_data"));
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

std::string OutDir(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

// Runs the tool into OutDir(name) and expects success.
void Generate(const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--out_dir", OutDir(name)};
  all.insert(all.end(), args.begin(), args.end());
  const RunResult run = RunTool(all);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

IdxArray Read(const std::string& path) {
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *std::move(a) : IdxArray();
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Root-mean-square and mean of (target - formula) over both targets.
struct Residuals {
  double rms = 0;
  double mean = 0;
};
Residuals RegressionResiduals(const IdxArray& x, const IdxArray& y) {
  const int64_t n = x.dims[0];
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = &x.values[i * 8];
    double y0 = 0.5;
    for (int j = 0; j < 8; ++j) y0 += kWeights[j] * xi[j];
    const double y1 = std::sin(kPi * xi[0]) * xi[1];
    for (const double r : {y.values[2 * i] - y0, y.values[2 * i + 1] - y1}) {
      sum += r;
      sum2 += r * r;
    }
  }
  return {std::sqrt(sum2 / (2 * n)), sum / (2 * n)};
}

TEST(MakeSyntheticDataTest, RegressionTargetsFollowTheFormula) {
  Generate("reg-exact",
           {"--kind", "regression", "--train", "300", "--test", "50",
            "--noise", "0"});
  const std::string dir = OutDir("reg-exact");
  for (const auto& [split, n] :
       {std::make_pair("train", 300), std::make_pair("test", 50)}) {
    SCOPED_TRACE(split);
    const IdxArray x = Read(absl::StrCat(dir, "/", split, "-features.idx.gz"));
    const IdxArray y = Read(absl::StrCat(dir, "/", split, "-targets.idx.gz"));
    EXPECT_EQ(x.type, IdxType::kFloat32);
    EXPECT_EQ(y.type, IdxType::kFloat32);
    EXPECT_THAT(x.dims, ElementsAre(n, 8));
    EXPECT_THAT(y.dims, ElementsAre(n, 2));
    for (const float v : x.values) {
      ASSERT_GE(v, -1.0f);
      ASSERT_LE(v, 1.0f);
    }
    // Without noise only float rounding remains.
    const Residuals r = RegressionResiduals(x, y);
    EXPECT_LT(r.rms, 1e-6);
  }
}

// jets: read back through the reader of several datasets (two inputs
// packed side by side, two labels sets packed as columns), the classes and
// energies recomputed from the stored inputs by the documented rule.
TEST(MakeSyntheticDataTest, JetsFollowTheRuleThroughThePackedReader) {
  Generate("jets", {"--kind", "jets", "--train", "400", "--test", "60", "--noise", "0"});
  worker::DataFileNames names;
  names.all_features = {"jets", "tracks"};
  names.all_labels = {"kind", "energy"};
  for (const auto& [split, n] : {std::make_pair("train", 400), std::make_pair("test", 60)}) {
    SCOPED_TRACE(split);
    auto file = worker::OpenDataFile(absl::StrCat(OutDir("jets"), "/", split, ".h5"), names);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_NE((*file)->packed(), nullptr);
    const worker::PackedLayout& layout = *(*file)->packed();
    ASSERT_EQ(layout.features.size(), 2u);
    EXPECT_THAT(layout.features[0].shape, ElementsAre(4));
    EXPECT_THAT(layout.features[1].shape, ElementsAre(8, 3));
    ASSERT_EQ(layout.labels.size(), 2u);
    EXPECT_TRUE(layout.labels[0].shape.empty());  // class indices
    EXPECT_EQ(layout.labels[0].type, worker::ElementType::kUint8);
    EXPECT_THAT(layout.labels[1].shape, ElementsAre(1));
    auto rows = (*file)->Read(0, n);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_THAT(rows->features.sizes().vec(), ElementsAre(n, 4 + 24));
    ASSERT_THAT(rows->labels.sizes().vec(), ElementsAre(n, 2));
    int classes[3] = {0, 0, 0};
    double max_error = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* x = rows->features[i].data_ptr<float>();
      double mean[3] = {0, 0, 0};
      for (int k = 0; k < 24; ++k) mean[k % 3] += x[4 + k] / 8.0;
      const double a = x[0] + mean[0];
      const double b = x[1] - mean[1];
      const int kind = a >= b && a >= 0.2 ? 0 : (b > a && b >= 0.2 ? 1 : 2);
      ASSERT_EQ(rows->labels[i][0].item<float>(), kind) << "row " << i;
      ++classes[kind];
      max_error = std::max(max_error, std::abs(rows->labels[i][1].item<double>() -
                                               (2.0 * x[2] * x[3] + mean[2])));
    }
    EXPECT_LT(max_error, 1e-6);
    for (const int count : classes) EXPECT_GT(count, n / 10);  // every class occurs
  }
}

TEST(MakeSyntheticDataTest, RegressionNoiseHasTheGivenDeviation) {
  const std::string dir = OutDir("reg-noise");
  const RunResult run =
      RunTool({"--kind", "regression", "--out_dir", dir, "--train", "4000",
               "--test", "10"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat(
                              "wrote ", dir,
                              "/train-features.idx.gz: float32 [4000, 8]\n")));
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrCat(
                  "wrote ", dir, "/test-targets.idx.gz: float32 [10, 2]\n")));
  EXPECT_THAT(run.output, HasSubstr("irreducible MSE (noise^2): 0.0001;"));
  // (sum w^2 / 3 + 1/6) / 2 + noise^2, w as documented.
  double sum_w2 = 0;
  for (const double w : kWeights) sum_w2 += w * w;
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrFormat("MSE of predicting the means: %.6g",
                                        (sum_w2 / 3 + 1.0 / 6) / 2 + 1e-4)));

  const Residuals r =
      RegressionResiduals(Read(dir + "/train-features.idx.gz"),
                          Read(dir + "/train-targets.idx.gz"));
  // 8000 draws of N(0, 0.01^2): the sample deviation is within 1% of 0.01
  // and the mean within 0.00011 of 0 one time in three; these bounds are
  // ten of those widths.
  EXPECT_NEAR(r.rms, 0.01, 0.001);
  EXPECT_NEAR(r.mean, 0.0, 0.0011);
}

TEST(MakeSyntheticDataTest, SameSeedSameBytesAndTestSetIndependentOfTrain) {
  Generate("seed-a", {"--kind", "sequences", "--train", "20", "--test", "7"});
  Generate("seed-b", {"--kind", "sequences", "--train", "20", "--test", "7"});
  Generate("seed-c", {"--kind", "sequences", "--train", "30", "--test", "7"});
  Generate("seed-d", {"--kind", "sequences", "--train", "20", "--test", "7",
                      "--seed", "2"});
  for (const char* file : {"/train-features.idx.gz", "/train-labels.idx.gz",
                           "/test-features.idx.gz", "/test-labels.idx.gz"}) {
    SCOPED_TRACE(file);
    EXPECT_EQ(Bytes(OutDir("seed-a") + file), Bytes(OutDir("seed-b") + file));
  }
  EXPECT_EQ(Bytes(OutDir("seed-a") + "/test-features.idx.gz"),
            Bytes(OutDir("seed-c") + "/test-features.idx.gz"));
  EXPECT_NE(Bytes(OutDir("seed-a") + "/train-features.idx.gz"),
            Bytes(OutDir("seed-d") + "/train-features.idx.gz"));
}

TEST(MakeSyntheticDataTest, SequencesCarryTheClassInTrendAndFrequency) {
  Generate("seq", {"--kind", "sequences", "--train", "3000", "--test", "10"});
  const IdxArray x = Read(OutDir("seq") + "/train-features.idx.gz");
  const IdxArray y = Read(OutDir("seq") + "/train-labels.idx.gz");
  EXPECT_EQ(x.type, IdxType::kFloat32);
  EXPECT_EQ(y.type, IdxType::kUnsignedByte);
  ASSERT_THAT(x.dims, ElementsAre(3000, 20, 6));
  ASSERT_THAT(y.dims, ElementsAre(3000));

  constexpr int kT = 20, kF = 6, kClasses = 5;
  std::vector<int> count(kClasses, 0);
  std::vector<double> slope_sum(kClasses, 0);
  // power_sum[c][k]: summed spectral power of f1 at 1 + k/2 cycles.
  std::vector<std::vector<double>> power_sum(kClasses,
                                             std::vector<double>(kClasses, 0));
  double u2 = 0;
  for (int t = 0; t < kT; ++t) u2 += std::pow(2.0 * t / (kT - 1) - 1, 2);
  for (int64_t i = 0; i < 3000; ++i) {
    const int c = static_cast<int>(y.values[i]);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, kClasses);
    ++count[c];
    // Least-squares slope of f0 on u = 2s - 1 (mean 0).
    double uf = 0;
    for (int t = 0; t < kT; ++t) {
      const double u = 2.0 * t / (kT - 1) - 1;
      uf += u * x.values[(i * kT + t) * kF + 0];
    }
    slope_sum[c] += uf / u2;
    for (int k = 0; k < kClasses; ++k) {
      std::complex<double> z = 0;
      for (int t = 0; t < kT; ++t) {
        const double s = static_cast<double>(t) / (kT - 1);
        z += double{x.values[(i * kT + t) * kF + 1]} *
             std::polar(1.0, -2 * kPi * (1 + k / 2.0) * s);
      }
      power_sum[c][k] += std::norm(z);
    }
  }
  for (int c = 0; c < kClasses; ++c) {
    SCOPED_TRACE(absl::StrCat("class ", c));
    // Uniform classes: 600 expected, deviation about 22.
    EXPECT_GT(count[c], 450);
    // Per sequence the slope's deviation is 0.6 / sqrt(u2) = 0.22; over
    // ~600 sequences 0.009, so 0.05 is over five of those.
    EXPECT_NEAR(slope_sum[c] / count[c], 0.5 * (c - 2), 0.05);
    // f1's power peaks at the class's own frequency.
    for (int k = 0; k < kClasses; ++k) {
      if (k != c) {
        EXPECT_GT(power_sum[c][c], 1.2 * power_sum[c][k]) << k;
      }
    }
  }
}

TEST(MakeSyntheticDataTest, Images32AreColouredPatterns) {
  Generate("img", {"--kind", "images32", "--train", "600", "--test", "20"});
  const IdxArray x = Read(OutDir("img") + "/train-features.idx.gz");
  const IdxArray y = Read(OutDir("img") + "/train-labels.idx.gz");
  EXPECT_EQ(x.type, IdxType::kUnsignedByte);
  EXPECT_EQ(y.type, IdxType::kUnsignedByte);
  ASSERT_THAT(x.dims, ElementsAre(600, 3, 32, 32));
  ASSERT_THAT(y.dims, ElementsAre(600));
  // Mean of each channel per class.
  std::vector<std::vector<double>> mean(10, std::vector<double>(3, 0));
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < 600; ++i) {
    const int k = static_cast<int>(y.values[i]);
    ASSERT_LT(k, 10);
    ++count[k];
    for (int ch = 0; ch < 3; ++ch) {
      for (int p = 0; p < 32 * 32; ++p) {
        mean[k][ch] += x.values[(i * 3 + ch) * 1024 + p] / 1024.0;
      }
    }
  }
  for (int k = 0; k < 10; ++k) {
    SCOPED_TRACE(absl::StrCat("class ", k));
    ASSERT_GT(count[k], 20);
    for (double& m : mean[k]) m /= count[k];
    // Classes 0/5 red, 1/6 green, 2/7 blue: that channel leads by a margin.
    if (k % 5 < 3) {
      const int lead = k % 5;
      for (int ch = 0; ch < 3; ++ch) {
        if (ch != lead) {
          EXPECT_GT(mean[k][lead], mean[k][ch] + 15) << ch;
        }
      }
    }
  }
}

TEST(MakeSyntheticDataTest, FilesLoadAsDatasets) {
  struct Case {
    const char* kind;
    const char* labels;
    std::vector<int64_t> input_shape;
    bool float_labels;
  };
  for (const Case& c :
       {Case{"regression", "targets", {8}, true},
        Case{"sequences", "labels", {20, 6}, false},
        Case{"images32", "labels", {3, 32, 32}, false}}) {
    SCOPED_TRACE(c.kind);
    const std::string name = absl::StrCat("load-", c.kind);
    Generate(name, {"--kind", c.kind, "--train", "60", "--test", "12"});
    const std::string dir = OutDir(name);
    v1::DataSpec spec;
    spec.set_train_images(dir + "/train-features.idx.gz");
    spec.set_train_labels(absl::StrCat(dir, "/train-", c.labels, ".idx.gz"));
    spec.set_test_images(dir + "/test-features.idx.gz");
    spec.set_test_labels(absl::StrCat(dir, "/test-", c.labels, ".idx.gz"));
    spec.set_validation_count(10);
    absl::StatusOr<worker::DatasetSplits> s = worker::LoadDatasets(spec);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->train.size(), 50);
    EXPECT_EQ(s->test.size(), 12);
    EXPECT_EQ(s->input_shape, c.input_shape);
    EXPECT_EQ(s->float_labels, c.float_labels);
    if (c.float_labels) {
      EXPECT_EQ(s->num_classes, 2);
    }
  }
}

TEST(MakeSyntheticDataTest, UsageErrorsExitTwo) {
  const std::string dir = OutDir("usage");
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--out_dir", dir}, "--kind is required"},
           {{"--kind", "cifar", "--out_dir", dir},
            "--kind must be regression, sequences, images32 or jets, got 'cifar'"},
           {{"--kind", "regression"}, "--out_dir is required"},
           {{"--kind", "regression", "--out_dir", dir, "--train", "-1"},
            "--train must be in [0, 2000000], got -1"},
           {{"--kind", "regression", "--out_dir", dir, "--noise", "-0.5"},
            "--noise must be finite and >= 0"},
           {{"--kind", "regression", "--out_dir", dir, "--bogus", "1"},
            "unknown flag '--bogus'"},
       }) {
    SCOPED_TRACE(c.message);
    const RunResult run = RunTool(c.args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr(c.message));
  }
  const RunResult help = RunTool({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("Usage: make_synthetic_data --kind"));

  // A parent that does not exist is an error writing, exit 1.
  const RunResult missing = RunTool(
      {"--kind", "regression", "--out_dir", dir + "/no/such/parent"});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("cannot create directory"));
}

}  // namespace
}  // namespace mpilearn
