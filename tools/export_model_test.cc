// Runs the mpilearn-export binary on a state directory this test writes: the
// weights of a model built with one seed come back, through torch::load, into
// a model built with another, and every error path exits non-zero with a
// message that names the problem.
#include <sys/wait.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/checkpoint_file.h"
#include "common/job_spec.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/model.h"

namespace mpilearn {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kChannels = 1;
constexpr int64_t kHeight = 6;
constexpr int64_t kWidth = 6;
constexpr int64_t kClasses = 4;
constexpr char kJob[] = "job-000007";

// A normalized spec for an mlp with the given hidden widths. The data files
// are never opened.
v1::JobSpec MlpSpec(int hidden) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
      R"({"name": "export-test",
          "model": {"name": "mlp", "hidden": [)",
      hidden, R"(], "dropout": 0.25},
          "data": {"train_images": "/nonexistent/train-images.gz",
                   "train_labels": "/nonexistent/train-labels.gz"},
          "seed": 1})"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// Builds `spec`'s model for kChannels x kHeight x kWidth inputs after seeding
// LibTorch's generator with `seed`.
torch::nn::Sequential Build(const v1::JobSpec& spec, uint64_t seed) {
  torch::manual_seed(seed);
  absl::StatusOr<torch::nn::Sequential> model =
      worker::BuildModel(spec.model(), kChannels, kHeight, kWidth, kClasses);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : torch::nn::Sequential();
}

// The model's parameters as a TensorSet, as the master writes weights.pb.
v1::TensorSet ToWeights(const torch::nn::Sequential& model) {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  for (const torch::Tensor& p : worker::ModelParameters(model)) {
    shapes.push_back(p.sizes().vec());
    const torch::Tensor flat = p.detach().contiguous().view({-1});
    values.emplace_back(flat.data_ptr<float>(),
                        flat.data_ptr<float>() + flat.numel());
  }
  return ToTensorSet(
      MakeFloat32Header(/*version=*/12, worker::ModelParameterNames(model),
                        shapes),
      values);
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << path;
  out << contents;
  out.close();
  ASSERT_TRUE(out) << path;
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs mpilearn-export with `args` and waits for it.
RunResult RunExport(const std::vector<std::string>& args) {
  std::string command = ShellQuote(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/mpilearn/tools/mpilearn-export"));
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

void ExpectParametersEqual(const torch::nn::Sequential& got,
                           const torch::nn::Sequential& want) {
  const std::vector<torch::Tensor> got_params = worker::ModelParameters(got);
  const std::vector<torch::Tensor> want_params = worker::ModelParameters(want);
  ASSERT_EQ(got_params.size(), want_params.size());
  const std::vector<std::string> names = worker::ModelParameterNames(want);
  for (size_t i = 0; i < got_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(got_params[i], want_params[i])) << names[i];
  }
}

bool AnyParameterEqual(const torch::nn::Sequential& a,
                       const torch::nn::Sequential& b) {
  const std::vector<torch::Tensor> pa = worker::ModelParameters(a);
  const std::vector<torch::Tensor> pb = worker::ModelParameters(b);
  for (size_t i = 0; i < pa.size(); ++i) {
    if (torch::equal(pa[i], pb[i])) return true;
  }
  return false;
}

class ExportModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = absl::StrCat(
        std::getenv("TEST_TMPDIR"), "/state-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    job_dir_ = absl::StrCat(state_dir_, "/jobs/", kJob);
    ASSERT_EQ(
        std::system(absl::StrCat("mkdir -p ", ShellQuote(job_dir_)).c_str()),
        0);
    spec_ = MlpSpec(16);
    trained_ = Build(spec_, /*seed=*/1);
    WriteFile(absl::StrCat(job_dir_, "/spec.json"), JobSpecToJson(spec_));
    WriteFile(absl::StrCat(job_dir_, "/weights.pb"),
              ToWeights(trained_).SerializeAsString());
    out_ = absl::StrCat(state_dir_, "/model.pt");
  }

  // Flags for this test's job, the 1x6x6 input shape, and `extra`.
  std::vector<std::string> Args(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"--state_dir", state_dir_,      "--job_id",
                                     kJob,          "--input_shape", "1,6,6"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string state_dir_;
  std::string job_dir_;
  std::string out_;
  v1::JobSpec spec_;
  torch::nn::Sequential trained_;
};

TEST_F(ExportModelTest, LibTorchFileLoadsIntoFreshlyBuiltModel) {
  const RunResult run = RunExport(Args({"--out", out_}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("inputs [B, 1, 6, 6] and 4 classes"));

  torch::nn::Sequential loaded = Build(spec_, /*seed=*/2);
  // Another seed draws other weights, so equality below comes from the file.
  ASSERT_FALSE(AnyParameterEqual(loaded, trained_));
  torch::load(loaded, out_);
  ExpectParametersEqual(loaded, trained_);

  trained_->eval();
  loaded->eval();
  torch::manual_seed(3);
  const torch::Tensor batch = torch::rand({5, kChannels, kHeight, kWidth});
  const torch::Tensor want = trained_->forward(batch);
  EXPECT_EQ(want.sizes(), (std::vector<int64_t>{5, kClasses}));
  EXPECT_TRUE(torch::equal(loaded->forward(batch), want));

  // The spec written beside the model rebuilds the same model.
  absl::StatusOr<v1::JobSpec> spec =
      ReadJobSpecFile(absl::StrCat(out_, ".spec.json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->SerializeAsString(), spec_.SerializeAsString());
  EXPECT_FALSE(Exists(absl::StrCat(out_, ".tmp")));
}

TEST_F(ExportModelTest, TensorsFormatHoldsOneEntryPerParameter) {
  const RunResult run = RunExport(Args({"--out", out_, "--format", "tensors"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  torch::serialize::InputArchive archive;
  archive.load_from(out_);
  const std::vector<std::string> names = worker::ModelParameterNames(trained_);
  const std::vector<torch::Tensor> params = worker::ModelParameters(trained_);
  ASSERT_EQ(names.size(), 4u);  // fc1.weight, fc1.bias, out.weight, out.bias
  for (size_t i = 0; i < names.size(); ++i) {
    torch::Tensor t;
    ASSERT_TRUE(archive.try_read(names[i], t)) << names[i];
    EXPECT_TRUE(torch::equal(t, params[i])) << names[i];
  }
}

TEST_F(ExportModelTest, WeightsPathExportsThatFile) {
  const torch::nn::Sequential other = Build(spec_, /*seed=*/4);
  const std::string path = absl::StrCat(state_dir_, "/other-weights.pb");
  WriteFile(path, ToWeights(other).SerializeAsString());

  const RunResult run =
      RunExport(Args({"--out", out_, "--weights", path, "--num_classes", "4"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  torch::nn::Sequential loaded = Build(spec_, /*seed=*/2);
  torch::load(loaded, out_);
  ExpectParametersEqual(loaded, other);
}

TEST_F(ExportModelTest, BestCheckpointIsExported) {
  // best.pb is a checkpoint (checksummed JobCheckpointFile), not a bare
  // TensorSet: the tool reads its weights.
  const torch::nn::Sequential best = Build(spec_, /*seed=*/5);
  v1::JobCheckpointFile checkpoint;
  *checkpoint.mutable_weights() = ToWeights(best);
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", ShellQuote(job_dir_),
                                     "/checkpoints").c_str()),
            0);
  WriteFile(absl::StrCat(job_dir_, "/checkpoints/best.pb"),
            EncodeCheckpoint(checkpoint).value());
  const RunResult run = RunExport(
      Args({"--out", out_, "--weights", "best", "--num_classes", "4"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  torch::nn::Sequential loaded = Build(spec_, /*seed=*/2);
  torch::load(loaded, out_);
  ExpectParametersEqual(loaded, best);

  // A flipped byte fails the checksum and says so.
  std::string bytes = EncodeCheckpoint(checkpoint).value();
  bytes[bytes.size() / 2] ^= 0x5a;
  WriteFile(absl::StrCat(job_dir_, "/checkpoints/best.pb"), bytes);
  const RunResult corrupt = RunExport(
      Args({"--out", out_, "--weights", "best", "--num_classes", "4"}));
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
}

TEST_F(ExportModelTest, SpecThatDoesNotFitTheWeightsNamesTheTensor) {
  WriteFile(absl::StrCat(job_dir_, "/spec.json"), JobSpecToJson(MlpSpec(32)));
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("weights tensor 'fc1.weight' has shape [16, 36] but "
                        "the model built from spec.json has [32, 36]"));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, WrongInputShapeNamesTheTensor) {
  const RunResult run =
      RunExport(Args({"--out", out_, "--input_shape", "1,28,28"}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("weights tensor 'fc1.weight' has shape [16, 36] but "
                        "the model built from spec.json has [16, 784]"));
}

TEST_F(ExportModelTest, MissingJobIsReported) {
  const RunResult run = RunExport(
      {"--state_dir", state_dir_, "--job_id", "job-999999", "--out", out_});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job 'job-999999' not found"));
  EXPECT_THAT(run.output, HasSubstr("/jobs/job-999999' does not exist"));
}

TEST_F(ExportModelTest, BestWithoutBestFileIsReported) {
  const RunResult run = RunExport(Args({"--out", out_, "--weights", "best"}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrCat("job '", kJob, "' has no best weights: '",
                                     job_dir_, "/checkpoints/best.pb' does not exist")));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, CorruptWeightsAreReported) {
  WriteFile(absl::StrCat(job_dir_, "/weights.pb"), "not a tensor set");
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("weights.pb' is neither a serialized "
                                    "mpilearn.v1.TensorSet"));
}

TEST_F(ExportModelTest, UnwritableOutputIsReported) {
  const RunResult run =
      RunExport(Args({"--out", absl::StrCat(state_dir_, "/no/such/m.pt")}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("No such file or directory"));
}

TEST_F(ExportModelTest, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      Args({}),                                        // no --out
      {"--job_id", kJob, "--out", out_},               // no --state_dir
      Args({"--out", out_, "--input_shape", "1,28"}),  // two dims
      Args({"--out", out_, "--input_shape", "1,0,28"}),
      Args({"--out", out_, "--num_classes", "ten"}),
      Args({"--out", out_, "--format", "onnx"}),
      Args({"--out", out_, "--job_id", "../x"}),
      Args({"--out", out_, "--bogus"}),
      Args({"--out", out_, "extra"}),
  };
  for (const std::vector<std::string>& args : cases) {
    const RunResult run = RunExport(args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr("Try 'mpilearn-export --help'"));
  }
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, HelpListsFlagsAndAnExample) {
  const RunResult run = RunExport({"--help"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const char* text :
       {"--state_dir", "--job_id", "--weights", "--out", "--format",
        "--input_shape", "--num_classes", "Example:", "torch::load(model"}) {
    EXPECT_THAT(run.output, HasSubstr(text));
  }
}

}  // namespace
}  // namespace mpilearn
