// Runs the mpilearn-export binary on state directories this test writes, as
// the master writes them: the trained state (parameters and BatchNorm's
// running statistics) of a built-in or TorchScript model comes back, through
// Model::Load and through Python's torch.jit.load, and the exported model
// computes what the same model built in C++ with that state computes in eval
// mode. Every error path exits non-zero with a message that names the
// problem.
#include <sys/wait.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/types/span.h"
#include "common/checkpoint_file.h"
#include "common/spec/job_spec.h"
#include "common/shard/placement.h"
#include "common/shard/sharded_connection.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/model/model.h"

namespace mpilearn {
namespace {

using ::mpilearn::worker::Model;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-000007";
constexpr char kPython[] = "/usr/bin/python3";

// The default job: an mlp for 1x6x6 samples and 4 outputs.
const std::vector<int64_t> kMlpShape = {1, 6, 6};
constexpr int64_t kMlpOutputs = 4;

// A normalized spec whose model section is `model_json`. The data files are
// never opened.
v1::JobSpec SpecWithModel(const std::string& model_json) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
      R"({"name": "export-test", "model": )", model_json, R"(,
          "data": {"train_images": "/nonexistent/train-images.gz",
                   "train_labels": "/nonexistent/train-labels.gz"},
          "seed": 1})"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

v1::JobSpec MlpSpec(int hidden, bool batch_norm = false) {
  return SpecWithModel(absl::StrCat(
      R"({"name": "mlp", "hidden": [)", hidden,
      R"(], "dropout": 0.25, "batch_norm": )", batch_norm ? "true" : "false",
      "}"));
}

// `spec`'s built-in model after seeding LibTorch's generator with `seed`,
// as if trained: BatchNorm's parameters and float buffers (running
// statistics) are drawn from the same seed instead of their initial zeros
// and ones, so every tensor differs between seeds and a model that lost its
// buffers would compute something else in eval mode.
Model Build(const v1::JobSpec& spec, absl::Span<const int64_t> input_shape,
            int64_t outputs, uint64_t seed) {
  torch::manual_seed(seed);
  absl::StatusOr<Model> model = Model::Build(spec.model(), input_shape, outputs);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) std::abort();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model->state().size(); ++i) {
    const std::string& name = model->state_names()[i];
    torch::Tensor t = model->state()[i];
    if (absl::EndsWith(name, "running_var") ||
        absl::EndsWith(name, "_bn.weight")) {
      t.uniform_(0.5, 2.0);
    } else if (absl::EndsWith(name, "running_mean") ||
               absl::EndsWith(name, "_bn.bias")) {
      t.normal_(0.0, 0.5);
    }
  }
  return *std::move(model);
}

Model BuildMlp(const v1::JobSpec& spec, uint64_t seed) {
  return Build(spec, kMlpShape, kMlpOutputs, seed);
}

// The model's state as a TensorSet, as the master writes weights.pb: names,
// shapes and buffer flags as worker/model/job_model.cc's BuildJobModel lays
// them out, with the input shape and outputs when `input_shape` is not empty
// (weights written before the header carried them have neither).
v1::TensorSet ToWeights(const Model& model,
                        absl::Span<const int64_t> input_shape = {},
                        int64_t outputs = 0) {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  for (const torch::Tensor& t : model.state()) {
    shapes.push_back(t.sizes().vec());
    const torch::Tensor flat = t.detach().contiguous().view({-1});
    values.emplace_back(flat.data_ptr<float>(),
                        flat.data_ptr<float>() + flat.numel());
  }
  v1::TensorSetHeader header =
      MakeFloat32Header(/*version=*/12, model.state_names(), shapes);
  for (size_t i = model.num_parameters(); i < model.state().size(); ++i) {
    header.mutable_tensors(static_cast<int>(i))->set_buffer(true);
  }
  for (int64_t d : input_shape) header.add_input_shape(d);
  header.set_outputs(outputs);
  return ToTensorSet(header, values);
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

// Runs the shell command `command` and waits for it.
RunResult RunCommand(std::string command) {
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

// Runs mpilearn-export with `args`.
RunResult RunExport(const std::vector<std::string>& args) {
  std::string command = ShellQuote(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/mpilearn/tools/cli/mpilearn-export"));
  for (const std::string& arg : args) {
    absl::StrAppend(&command, " ", ShellQuote(arg));
  }
  return RunCommand(command);
}

// Loads an exported TorchScript file as the workers load a user's model.
Model LoadExport(const std::string& path) {
  absl::StatusOr<Model> model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) std::abort();
  return *std::move(model);
}

// Same names, and every tensor of `got` equal to `want`'s.
void ExpectStateEqual(const Model& got, const Model& want) {
  ASSERT_EQ(got.state_names(), want.state_names());
  for (size_t i = 0; i < got.state().size(); ++i) {
    EXPECT_TRUE(torch::equal(got.state()[i], want.state()[i]))
        << want.state_names()[i];
  }
}

bool AnyStateEqual(const Model& a, const Model& b) {
  for (size_t i = 0; i < a.state().size(); ++i) {
    if (torch::equal(a.state()[i], b.state()[i])) return true;
  }
  return false;
}

// A fresh model of `spec` (another seed) given `trained`'s state, in eval
// mode: what the export must compute.
Model Reference(const v1::JobSpec& spec, absl::Span<const int64_t> input_shape,
                int64_t outputs, const Model& trained) {
  Model model = Build(spec, input_shape, outputs, /*seed=*/99);
  EXPECT_FALSE(AnyStateEqual(model, trained));
  std::vector<std::vector<float>> values;
  for (const torch::Tensor& t : trained.state()) {
    const torch::Tensor flat = t.detach().contiguous().view({-1});
    values.emplace_back(flat.data_ptr<float>(),
                        flat.data_ptr<float>() + flat.numel());
  }
  const std::vector<absl::Span<const float>> views(values.begin(), values.end());
  EXPECT_TRUE(model.SetState(views).ok());
  model.SetTraining(false);
  return model;
}

// A fixed batch of 5 samples of `input_shape`.
torch::Tensor Batch(absl::Span<const int64_t> input_shape) {
  std::vector<int64_t> shape = {5};
  shape.insert(shape.end(), input_shape.begin(), input_shape.end());
  torch::manual_seed(3);
  return torch::randn(shape);
}

// Tensor files shared with the Python side: int64 rank, int64 dims, then the
// float32 values, all little-endian (native here).
void WriteTensorFile(const std::string& path, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  std::string bytes;
  const int64_t rank = c.dim();
  bytes.append(reinterpret_cast<const char*>(&rank), sizeof(rank));
  for (int64_t d : c.sizes()) {
    bytes.append(reinterpret_cast<const char*>(&d), sizeof(d));
  }
  bytes.append(reinterpret_cast<const char*>(c.data_ptr<float>()),
               c.numel() * sizeof(float));
  WriteFile(path, bytes);
}

torch::Tensor ReadTensorFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  int64_t rank = 0;
  in.read(reinterpret_cast<char*>(&rank), sizeof(rank));
  std::vector<int64_t> shape(rank > 0 && rank < 8 ? rank : 0);
  for (int64_t& d : shape) in.read(reinterpret_cast<char*>(&d), sizeof(d));
  torch::Tensor t = torch::empty(shape);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()),
          t.numel() * sizeof(float));
  EXPECT_TRUE(in) << path << " is short";
  return t;
}

// Loads a model with torch.jit.load, prints the names of its parameters and
// buffers, and writes its eval-mode output on the input file's batch.
constexpr char kPythonScript[] = R"(
import struct, sys, torch

model_path, in_path, out_path = sys.argv[1:4]
with open(in_path, 'rb') as f:
    data = f.read()
rank, = struct.unpack_from('<q', data, 0)
shape = struct.unpack_from('<%dq' % rank, data, 8)
x = torch.frombuffer(bytearray(data[8 + 8 * rank:]), dtype=torch.float32)
x = x.reshape(shape)

m = torch.jit.load(model_path)
m.eval()
with torch.no_grad():
    y = m(x).contiguous()
for name, _ in list(m.named_parameters()) + list(m.named_buffers()):
    print('state', name)
values = y.flatten().tolist()
with open(out_path, 'wb') as f:
    f.write(struct.pack('<q', y.dim()))
    f.write(struct.pack('<%dq' % y.dim(), *y.shape))
    f.write(struct.pack('<%df' % len(values), *values))
)";

bool PythonHasTorch() {
  return std::system(absl::StrCat(kPython,
                                  " -c 'import torch' >/dev/null 2>&1")
                         .c_str()) == 0;
}

class ExportModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = absl::StrCat(
        std::getenv("TEST_TMPDIR"), "/state-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    job_dir_ = absl::StrCat(state_dir_, "/jobs/", kJob);
    std::filesystem::create_directories(job_dir_);
    spec_ = MlpSpec(16);
    trained_ = BuildMlp(spec_, /*seed=*/1);
    WriteJob(spec_, ToWeights(*trained_, kMlpShape, kMlpOutputs));
    out_ = absl::StrCat(state_dir_, "/model.pt");
  }

  void TearDown() override { std::filesystem::remove_all(state_dir_); }

  void WriteJob(const v1::JobSpec& spec, const v1::TensorSet& weights) {
    WriteFile(absl::StrCat(job_dir_, "/spec.json"), JobSpecToJson(spec));
    WriteFile(absl::StrCat(job_dir_, "/weights.pb"),
              weights.SerializeAsString());
  }

  // Flags for this test's job, then `extra`.
  std::vector<std::string> Args(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"--state_dir", state_dir_, "--job_id",
                                     kJob};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Exports a job of `spec`'s built-in model trained to the state of a
  // model built with seed 1 (buffers included), checks the file with
  // Model::Load, then runs it in Python when /usr/bin/python3 has torch and
  // compares the outputs with the C++ model's.
  void ExportBuiltinAndCompareWithPython(const v1::JobSpec& spec,
                                         const std::vector<int64_t>& shape,
                                         int64_t outputs) {
    const Model trained = Build(spec, shape, outputs, /*seed=*/1);
    ASSERT_GT(trained.state().size(), trained.num_parameters())
        << "the model should have BatchNorm buffers";
    WriteJob(spec, ToWeights(trained, shape, outputs));
    const RunResult run = RunExport(Args({"--out", out_}));
    ASSERT_EQ(run.exit_code, 0) << run.output;

    const torch::Tensor x = Batch(shape);
    Model reference = Reference(spec, shape, outputs, trained);
    const torch::Tensor want = reference.Forward(x);
    ASSERT_EQ(want.sizes(), (std::vector<int64_t>{5, outputs}));
    Model loaded = LoadExport(out_);
    ExpectStateEqual(loaded, trained);
    EXPECT_FALSE(loaded.module().is_training());
    EXPECT_TRUE(torch::equal(loaded.Forward(x), want));

    if (!PythonHasTorch()) {
      GTEST_SKIP() << kPython << " cannot import torch (install "
                   << "python3-torch): the Python round trip is not checked";
    }
    const std::string script = absl::StrCat(state_dir_, "/load.py");
    const std::string in = absl::StrCat(state_dir_, "/x.bin");
    const std::string out = absl::StrCat(state_dir_, "/y.bin");
    WriteFile(script, kPythonScript);
    WriteTensorFile(in, x);
    const RunResult python =
        RunCommand(absl::StrCat(kPython, " ", ShellQuote(script), " ",
                                ShellQuote(out_), " ", ShellQuote(in), " ",
                                ShellQuote(out)));
    ASSERT_EQ(python.exit_code, 0) << python.output;
    for (const std::string& name : trained.state_names()) {
      EXPECT_THAT(python.output, HasSubstr(absl::StrCat("state ", name, "\n")));
    }
    const torch::Tensor got = ReadTensorFile(out);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << "Python " << got << "\nC++ " << want;
  }

  std::string state_dir_;
  std::string job_dir_;
  std::string out_;
  v1::JobSpec spec_;
  std::optional<Model> trained_;
};

TEST_F(ExportModelTest, MlpWithBatchNormExportsItsStateAndOutputs) {
  spec_ = MlpSpec(16, /*batch_norm=*/true);
  const Model trained = BuildMlp(spec_, /*seed=*/1);
  WriteJob(spec_, ToWeights(trained, kMlpShape, kMlpOutputs));
  const RunResult run = RunExport(Args({"--out", out_}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // 8 state tensors; 592 + 32 + 68 trained parameters (fc1, fc1_bn, out).
  EXPECT_THAT(run.output,
              HasSubstr("(torchscript, 8 tensors, 692 parameters, from "));
  EXPECT_THAT(run.output,
              HasSubstr("model 'mlp' for inputs [B, 1, 6, 6] and 4 outputs"));

  Model loaded = LoadExport(out_);
  // fc1 and its BatchNorm's parameters, out, then the running statistics.
  EXPECT_EQ(loaded.state_names(),
            (std::vector<std::string>{"fc1.weight", "fc1.bias",
                                      "fc1_bn.weight", "fc1_bn.bias",
                                      "out.weight", "out.bias",
                                      "fc1_bn.running_mean",
                                      "fc1_bn.running_var"}));
  ExpectStateEqual(loaded, trained);
  EXPECT_FALSE(loaded.module().is_training());
  Model reference = Reference(spec_, kMlpShape, kMlpOutputs, trained);
  const torch::Tensor x = Batch(kMlpShape);
  EXPECT_TRUE(torch::equal(loaded.Forward(x), reference.Forward(x)));

  // The spec written beside the model is the job's.
  absl::StatusOr<v1::JobSpec> spec =
      ReadJobSpecFile(absl::StrCat(out_, ".spec.json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->SerializeAsString(), spec_.SerializeAsString());
  EXPECT_FALSE(Exists(absl::StrCat(out_, ".tmp")));
}

TEST_F(ExportModelTest, PythonRunsMlpWithBatchNormAsCxxDoes) {
  ExportBuiltinAndCompareWithPython(MlpSpec(16, /*batch_norm=*/true),
                                    kMlpShape, kMlpOutputs);
}

TEST_F(ExportModelTest, PythonRunsCnnWithBatchNormAsCxxDoes) {
  ExportBuiltinAndCompareWithPython(
      SpecWithModel(R"({"name": "cnn", "channels": [4, 8], "dense": 16,
                        "batch_norm": true, "dropout": 0.5,
                        "conv_dropout": 0.25})"),
      {1, 8, 8}, 3);
}

TEST_F(ExportModelTest, PythonRunsGruAsCxxDoes) {
  // batch_norm applies to the dense layer after the GRU.
  ExportBuiltinAndCompareWithPython(
      SpecWithModel(R"({"name": "gru", "recurrent": [8], "dense": 6,
                        "batch_norm": true, "dropout": 0.2})"),
      {5, 3}, 2);
}

TEST_F(ExportModelTest, TensorsFormatHoldsOneEntryPerStateTensor) {
  spec_ = MlpSpec(16, /*batch_norm=*/true);
  const Model trained = BuildMlp(spec_, /*seed=*/1);
  WriteJob(spec_, ToWeights(trained, kMlpShape, kMlpOutputs));
  const RunResult run = RunExport(Args({"--out", out_, "--format", "tensors"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("(tensors, 8 tensors, "));

  torch::serialize::InputArchive archive;
  archive.load_from(out_);
  for (size_t i = 0; i < trained.state().size(); ++i) {
    const std::string& name = trained.state_names()[i];
    torch::Tensor t;
    ASSERT_TRUE(archive.try_read(name, t)) << name;
    EXPECT_TRUE(torch::equal(t, trained.state()[i])) << name;
  }
}

TEST_F(ExportModelTest, WeightsPathExportsThatFile) {
  const Model other = BuildMlp(spec_, /*seed=*/4);
  const std::string path = absl::StrCat(state_dir_, "/other-weights.pb");
  WriteFile(path, ToWeights(other, kMlpShape, kMlpOutputs).SerializeAsString());

  const RunResult run = RunExport(Args({"--out", out_, "--weights", path}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ExpectStateEqual(LoadExport(out_), other);
}

// A sharded job's final weights are slices on its shards, cut as the
// workers cut them (PlaceTensors with a small bound, so tensors split over
// the shards): the export joins them into the trained model, whatever
// order the directories come in, and names what is missing or doubled.
TEST_F(ExportModelTest, ShardedJobIsJoinedFromItsShardsSlices) {
  const v1::TensorSet whole = ToWeights(*trained_, kMlpShape, kMlpOutputs);
  absl::StatusOr<Float32Tensors> tensors = FromTensorSet(whole);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<int64_t> sizes;
  for (const std::vector<float>& t : tensors->values) sizes.push_back(t.size());
  absl::StatusOr<shard::Placement> placement = shard::PlaceTensors(sizes, 3, 500);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<std::string> dirs;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::vector<float>> values;
    for (const shard::TensorRange& r : placement->shards[s]) {
      const std::vector<float>& t = tensors->values[r.tensor];
      values.emplace_back(t.begin() + r.begin, t.begin() + r.end);
    }
    dirs.push_back(absl::StrCat(state_dir_, "/shard", s));
    const std::string job = absl::StrCat(dirs.back(), "/jobs/", kJob);
    std::filesystem::create_directories(job);
    WriteFile(job + "/weights.pb",
              ToTensorSet(shard::SliceHeader(tensors->header, *placement, s), values)
                  .SerializeAsString());
  }
  // The lead's job directory has the spec and no weights.
  std::filesystem::remove(absl::StrCat(job_dir_, "/weights.pb"));
  const RunResult run = RunExport(
      Args({"--out", out_, "--shard_state_dirs", dirs[2] + "," + dirs[0] + "," + dirs[1]}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("from 3 shards' final weights"));
  ExpectStateEqual(LoadExport(out_), *trained_);

  const RunResult missing =
      RunExport(Args({"--out", out_, "--shard_state_dirs", dirs[0] + "," + dirs[1]}));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, ::testing::HasSubstr("is in no shard's slice"));
  const RunResult doubled = RunExport(
      Args({"--out", out_, "--shard_state_dirs", dirs[0] + "," + dirs[1] + "," + dirs[1]}));
  EXPECT_EQ(doubled.exit_code, 1) << doubled.output;
  EXPECT_THAT(doubled.output, ::testing::HasSubstr("is in two shards' slices"));
  const RunResult not_a_shard =
      RunExport(Args({"--out", out_, "--shard_state_dirs", state_dir_ + "/nowhere"}));
  EXPECT_EQ(not_a_shard.exit_code, 1) << not_a_shard.output;
  EXPECT_THAT(not_a_shard.output, ::testing::HasSubstr("has no final weights"));
}

TEST_F(ExportModelTest, BestCheckpointIsExported) {
  // best.pb is a checkpoint (checksummed JobCheckpointFile), not a bare
  // TensorSet: the tool reads its weights.
  const Model best = BuildMlp(spec_, /*seed=*/5);
  v1::JobCheckpointFile checkpoint;
  *checkpoint.mutable_weights() = ToWeights(best, kMlpShape, kMlpOutputs);
  std::filesystem::create_directories(absl::StrCat(job_dir_, "/checkpoints"));
  WriteFile(absl::StrCat(job_dir_, "/checkpoints/best.pb"),
            EncodeCheckpoint(checkpoint).value());
  const RunResult run = RunExport(Args({"--out", out_, "--weights", "best"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ExpectStateEqual(LoadExport(out_), best);

  // A flipped byte fails the checksum and says so.
  std::string bytes = EncodeCheckpoint(checkpoint).value();
  bytes[bytes.size() / 2] ^= 0x5a;
  WriteFile(absl::StrCat(job_dir_, "/checkpoints/best.pb"), bytes);
  const RunResult corrupt =
      RunExport(Args({"--out", out_, "--weights", "best"}));
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
}

TEST_F(ExportModelTest, WeightsWithoutShapeUseFlagsAndInferOutputs) {
  // Written before the header carried the input shape and outputs: the
  // shape comes from --input_shape, the outputs from out.bias.
  WriteJob(spec_, ToWeights(*trained_));
  const RunResult run =
      RunExport(Args({"--out", out_, "--input_shape", "1,6,6"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("inputs [B, 1, 6, 6] and 4 outputs"));
  ExpectStateEqual(LoadExport(out_), *trained_);
}

TEST_F(ExportModelTest, WeightsWithoutShapeDefaultTo28x28AndSaySo) {
  WriteJob(spec_, ToWeights(*trained_));
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("weights tensor 'fc1.weight' has shape [16, 36] but "
                        "the model built from spec.json has [16, 784]"));
  EXPECT_THAT(run.output, HasSubstr("input shape [1, 28, 28] from the "
                                    "default; pass --input_shape"));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, FlagsOverrideTheWeightsHeader) {
  // A rank-2 input shape with the same 36 features fits the mlp too.
  const RunResult run = RunExport(
      Args({"--out", out_, "--input_shape", "6,6", "--num_classes", "4"}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("inputs [B, 6, 6] and 4 outputs"));

  const RunResult wrong =
      RunExport(Args({"--out", out_, "--input_shape", "1,28,28"}));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_THAT(wrong.output,
              HasSubstr("weights tensor 'fc1.weight' has shape [16, 36] but "
                        "the model built from spec.json has [16, 784]"));
  EXPECT_THAT(wrong.output, HasSubstr("from --input_shape"));
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

TEST_F(ExportModelTest, BatchNormSpecWithoutBatchNormWeightsNamesTheTensor) {
  WriteFile(absl::StrCat(job_dir_, "/spec.json"),
            JobSpecToJson(MlpSpec(16, /*batch_norm=*/true)));
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("weights tensor 2 is 'out.weight' but the model built "
                        "from spec.json has 'fc1_bn.weight' there"));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, TorchScriptJobExportsTheTrainedState) {
  // The user's file: a cnn saved as TorchScript with its initial weights.
  const v1::JobSpec cnn = SpecWithModel(
      R"({"name": "cnn", "channels": [4], "dense": 8, "batch_norm": true})");
  const std::vector<int64_t> shape = {1, 8, 8};
  Model user = Build(cnn, shape, 3, /*seed=*/1);
  const std::string user_file = absl::StrCat(state_dir_, "/user_model.pt");
  ASSERT_TRUE(user.Save(user_file).ok());
  // What the job trained it to: other values everywhere.
  const Model trained = Build(cnn, shape, 3, /*seed=*/2);
  ASSERT_FALSE(AnyStateEqual(user, trained));
  const v1::JobSpec spec =
      SpecWithModel(absl::StrCat(R"({"torchscript": ")", user_file, R"("})"));
  WriteJob(spec, ToWeights(trained, shape, 3));

  const RunResult run = RunExport(Args({"--out", out_}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("model 'torchscript ",
                                                 user_file,
                                                 "' for inputs [B, 1, 8, 8] "
                                                 "and 3 outputs")));
  Model loaded = LoadExport(out_);
  ExpectStateEqual(loaded, trained);
  EXPECT_FALSE(loaded.module().is_training());
  Model reference = Reference(cnn, shape, 3, trained);
  const torch::Tensor x = Batch(shape);
  EXPECT_TRUE(torch::equal(loaded.Forward(x), reference.Forward(x)));
  // The user's file is read, not rewritten.
  ExpectStateEqual(LoadExport(user_file), user);

  // The .pt moved: the error says to pass --model_file, which finds it.
  const std::string moved = absl::StrCat(state_dir_, "/moved.pt");
  std::filesystem::rename(user_file, moved);
  std::filesystem::remove(out_);
  const RunResult missing = RunExport(Args({"--out", out_}));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output,
              HasSubstr(absl::StrCat("the job's TorchScript model '", user_file,
                                     "' (spec.json model.torchscript) does "
                                     "not exist")));
  EXPECT_THAT(missing.output, HasSubstr("pass --model_file"));
  EXPECT_FALSE(Exists(out_));

  const RunResult overridden =
      RunExport(Args({"--out", out_, "--model_file", moved}));
  ASSERT_EQ(overridden.exit_code, 0) << overridden.output;
  EXPECT_THAT(overridden.output,
              HasSubstr(absl::StrCat("model 'torchscript ", moved, "'")));
  ExpectStateEqual(LoadExport(out_), trained);

  const RunResult bad_flag = RunExport(
      Args({"--out", out_, "--model_file", absl::StrCat(state_dir_, "/no.pt")}));
  EXPECT_EQ(bad_flag.exit_code, 1) << bad_flag.output;
  EXPECT_THAT(bad_flag.output, HasSubstr("/no.pt' does not exist"));
}

TEST_F(ExportModelTest, TorchScriptJobWithOtherModelsWeightsNamesTheTensor) {
  const std::string user_file = absl::StrCat(state_dir_, "/user_model.pt");
  Model user = Build(
      SpecWithModel(R"({"name": "cnn", "channels": [4], "dense": 8})"),
      {1, 8, 8}, 3, /*seed=*/1);
  ASSERT_TRUE(user.Save(user_file).ok());
  // The mlp's weights (fc1.weight first) for the cnn's file.
  WriteFile(absl::StrCat(job_dir_, "/spec.json"),
            JobSpecToJson(SpecWithModel(
                absl::StrCat(R"({"torchscript": ")", user_file, R"("})"))));
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrCat("weights tensor 0 is 'fc1.weight' but the "
                                     "TorchScript model '",
                                     user_file, "' has 'conv1.weight' there")));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, ModelFileForBuiltinJobIsRefused) {
  const RunResult run = RunExport(
      Args({"--out", out_, "--model_file", absl::StrCat(state_dir_, "/m.pt")}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--model_file is for jobs that train a "
                                    "TorchScript model"));
}

TEST_F(ExportModelTest, MissingStateDirIsReported) {
  const RunResult run = RunExport({"--state_dir", state_dir_ + "/none",
                                   "--job_id", kJob, "--out", out_});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/none' does not exist"));
}

TEST_F(ExportModelTest, MissingJobIsReported) {
  const RunResult run = RunExport(
      {"--state_dir", state_dir_, "--job_id", "job-999999", "--out", out_});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job 'job-999999' not found"));
  EXPECT_THAT(run.output, HasSubstr("/jobs/job-999999' does not exist"));
}

TEST_F(ExportModelTest, MissingWeightsAreReported) {
  std::filesystem::remove(absl::StrCat(job_dir_, "/weights.pb"));
  const RunResult run = RunExport(Args({"--out", out_}));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrCat("job '", kJob, "' has no final weights")));
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
      Args({}),                                          // no --out
      {"--job_id", kJob, "--out", out_},                 // no --state_dir
      Args({"--out", out_, "--input_shape", "1,0,28"}),  // zero dimension
      Args({"--out", out_, "--input_shape", "1,,28"}),
      Args({"--out", out_, "--input_shape", "a,b"}),
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
  // The old format is gone; the message says what replaced it.
  const RunResult libtorch =
      RunExport(Args({"--out", out_, "--format", "libtorch"}));
  EXPECT_EQ(libtorch.exit_code, 2) << libtorch.output;
  EXPECT_THAT(libtorch.output, HasSubstr("use --format torchscript"));
  EXPECT_FALSE(Exists(out_));
}

TEST_F(ExportModelTest, HelpListsFlagsAndLoadingExamples) {
  const RunResult run = RunExport({"--help"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const char* text :
       {"--state_dir", "--job_id", "--weights", "--out", "--format",
        "--input_shape", "--num_classes", "--model_file", "Example:",
        "m = torch.jit.load(\"model.pt\"); m.eval(); m(x)",
        "torch::jit::load(\"model.pt\")"}) {
    EXPECT_THAT(run.output, HasSubstr(text));
  }
}

}  // namespace
}  // namespace mpilearn
