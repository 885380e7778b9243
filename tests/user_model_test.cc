// End to end with the user's own models: TorchScript files written by
// tools/cli/export_torchscript.py (so these tests also prove the helper) trained
// by `mpirun -np 2 mpilearn-worker` against the real master, a BatchNorm
// model whose buffers reach the master and the export, and each bad model
// ending its job FAILED with the cause while the master keeps serving.
//
// Needs Debian's python3-torch (/usr/bin/python3) to write the models and
// dataset-fashion-mnist; skips with the reason without them.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_file.h"
#include "common/client/master_client.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"
#include "worker/model/model.h"

namespace mpilearn::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";

bool HaveTorchForPython() {
  return std::system(absl::StrCat(kPython, " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

// Runs the export helper on docs/examples/models/<model>.py; the output goes
// to `dir`/export.log. Returns the helper's exit code.
int ExportModel(const std::string& dir, const std::string& model,
                const std::string& out, const std::vector<std::string>& args) {
  const std::string command = absl::StrCat(
      kPython, " ", Runfile("tools/cli/export_torchscript.py"), " ",
      Runfile(absl::StrCat("docs/examples/models/", model, ".py")), " --out ",
      out, " ", absl::StrJoin(args, " "), " >>", dir, "/export.log 2>&1");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs a Python snippet (with torch) that writes `out`; returns its exit code.
int RunPython(const std::string& dir, const std::string& code) {
  const std::string script = dir + "/snippet.py";
  WriteFileOrDie(script, code);
  const int status = std::system(
      absl::StrCat(kPython, " ", script, " >>", dir, "/python.log 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class UserModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    if (!HaveTorchForPython()) {
      GTEST_SKIP() << kPython << " cannot import torch (Debian's python3-torch; "
                   << "tools/install_deps.sh installs it)";
    }
  }

  // Starts a master in a new directory.
  void StartMaster(const std::string& name,
                   const std::vector<std::string>& flags = {}) {
    dir_ = NewTempDir(name);
    auto master = MasterProcess::Start(dir_, flags);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    auto client = MasterClient::Connect(master_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Runs `spec` on `ranks` workers to the end (RunJobToEnd); the workers'
  // output in *log and exit code in *exit_code.
  v1::JobStatus Run(const v1::JobSpec& spec, int ranks, std::string* log,
                    int* exit_code) {
    absl::StatusOr<JobRun> run =
        RunJobToEnd(*client_, master_->address(), spec, ranks, dir_);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) {
      *exit_code = -1;
      return v1::JobStatus();
    }
    *log = run->log;
    *exit_code = run->exit_code;
    return run->status;
  }

  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::unique_ptr<MasterClient> client_;
};

// The same MLP as the built-in model and as a TorchScript file (exported
// with the job's seed, so both start from the same weights) trains to the
// same accuracy with 2 ranks.
TEST_F(UserModelTest, TorchScriptMlpTrainsLikeTheBuiltin) {
  StartMaster("user_model_mlp");
  const std::string pt = dir_ + "/mlp.pt";
  ASSERT_EQ(ExportModel(dir_, "mlp", pt, {"--input_shape", "1,28,28", "--seed", "3"}), 0)
      << ReadFileOrDie(dir_ + "/export.log");

  v1::JobSpec builtin = FashionMnistSubset("sync", 12000, 2);
  v1::JobSpec scripted = builtin;
  scripted.mutable_model()->Clear();
  scripted.mutable_model()->set_torchscript(pt);
  double accuracy[2];
  int i = 0;
  for (const v1::JobSpec& spec : {builtin, scripted}) {
    std::string log;
    int exit_code = 0;
    const v1::JobStatus status = Run(spec, 2, &log, &exit_code);
    ASSERT_EQ(exit_code, 0) << log;
    ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
    ASSERT_TRUE(status.has_test_accuracy());
    accuracy[i++] = status.test_accuracy();
    if (i == 2) {
      EXPECT_THAT(log, HasSubstr("model torchscript " + pt));
    }
  }
  EXPECT_GE(accuracy[0], 0.75);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.01)
      << "built-in " << accuracy[0] << ", TorchScript " << accuracy[1];
}

// A BatchNorm model: its running statistics are buffers every update
// carries to the master; the final weights and the export hold the master's.
TEST_F(UserModelTest, BatchNormBuffersReachTheMasterAndTheExport) {
  StartMaster("user_model_bn");
  const std::string pt = dir_ + "/cnn_bn.pt";
  ASSERT_EQ(ExportModel(dir_, "cnn_bn", pt,
                        {"--input_shape", "1,28,28", "--param", "channels1=8",
                         "--param", "channels2=16", "--param", "dense=32"}),
            0)
      << ReadFileOrDie(dir_ + "/export.log");
  v1::JobSpec spec = FashionMnistSubset("downpour", 6000, 1);
  spec.mutable_model()->Clear();
  spec.mutable_model()->set_torchscript(pt);
  std::string log;
  int exit_code = 0;
  const v1::JobStatus status = Run(spec, 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  EXPECT_GE(status.test_accuracy(), 0.7);

  // The master's final weights: buffers marked, moved off their initial
  // values (running_mean 0, running_var 1).
  const std::string weights_path =
      absl::StrCat(dir_, "/jobs/", status.job_id(), "/weights.pb");
  v1::TensorSet set;
  ASSERT_TRUE(set.ParseFromString(ReadFileOrDie(weights_path)));
  absl::StatusOr<Float32Tensors> weights = FromTensorSet(set);
  ASSERT_TRUE(weights.ok()) << weights.status();
  int buffers = 0;
  for (int t = 0; t < weights->header.tensors_size(); ++t) {
    const v1::TensorInfo& info = weights->header.tensors(t);
    if (!info.buffer()) continue;
    ++buffers;
    const bool mean = absl::EndsWith(info.name(), "running_mean");
    double moved = 0;
    for (float v : weights->values[t]) moved += std::abs(v - (mean ? 0.0f : 1.0f));
    EXPECT_GT(moved, 0.0) << info.name() << " never left its initial value";
  }
  EXPECT_EQ(buffers, 6);  // running_mean and running_var of 3 batch norms

  // The export holds exactly the master's tensors, buffers included.
  const std::string out = dir_ + "/exported.pt";
  const int exported = std::system(
      absl::StrCat(Runfile("tools/cli/mpilearn-export"), " --state_dir ", dir_,
                   " --job_id ", status.job_id(), " --out ", out, " >>", dir_,
                   "/export.log 2>&1")
          .c_str());
  ASSERT_EQ(exported, 0) << ReadFileOrDie(dir_ + "/export.log");
  absl::StatusOr<worker::Model> model = worker::Model::Load(out);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->state().size(), static_cast<size_t>(weights->header.tensors_size()));
  for (size_t t = 0; t < model->state().size(); ++t) {
    ASSERT_EQ(model->state_names()[t], weights->header.tensors(static_cast<int>(t)).name());
    const torch::Tensor& mine = model->state()[t];
    EXPECT_EQ(std::vector<float>(mine.data_ptr<float>(), mine.data_ptr<float>() + mine.numel()),
              weights->values[t])
        << model->state_names()[t];
  }
}

// A regression head trained with mse on data with a known answer
// (tools/data/make_synthetic_data: the best mean squared error is noise^2 =
// 1e-4; predicting the targets' means scores 0.4518) gets close to it.
TEST_F(UserModelTest, RegressionLearnsAKnownFunction) {
  StartMaster("user_model_regression");
  const std::string data = dir_ + "/data";
  ASSERT_EQ(std::system(absl::StrCat(Runfile("tools/data/make_synthetic_data"),
                                     " --kind regression --out_dir ", data,
                                     " --train 10000 --test 2000 >", dir_,
                                     "/data.log 2>&1")
                            .c_str()),
            0)
      << ReadFileOrDie(dir_ + "/data.log");
  v1::JobSpec spec;
  spec.set_name("regression");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(64);
  spec.mutable_model()->add_hidden(64);
  v1::DataSpec* files = spec.mutable_data();
  files->set_train_images(data + "/train-features.idx.gz");
  files->set_train_labels(data + "/train-targets.idx.gz");
  files->set_test_images(data + "/test-features.idx.gz");
  files->set_test_labels(data + "/test-targets.idx.gz");
  files->set_validation_count(1000);
  spec.set_loss("mse");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.003);
  spec.set_algorithm("sync");
  spec.set_epochs(12);
  spec.set_batch_size(32);
  spec.set_seed(2);
  std::string log;
  int exit_code = 0;
  const v1::JobStatus status = Run(spec, 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  // The printed test metrics: mse per output, 2% of the mean predictor's.
  const size_t at = log.find("test_mse=");
  ASSERT_NE(at, std::string::npos) << log;
  const double test_mse = std::stod(log.substr(at + 9));
  EXPECT_LT(test_mse, 0.01) << log;
  EXPECT_EQ(log.find("test_accuracy="), std::string::npos);
  // The master keeps the test metrics: no accuracy, mae and mse.
  EXPECT_FALSE(status.has_test_accuracy());
  ASSERT_EQ(status.test_metrics().count("test_mse"), 1u);
  EXPECT_NEAR(status.test_metrics().at("test_mse"), test_mse, 1e-4);
  EXPECT_GT(status.test_metrics().count("test_mae"), 0u);
  // Every epoch reported the regression metrics, and they fell.
  ASSERT_EQ(status.history_size(), 12);
  const auto& first = status.history(0).metrics();
  const auto& last = status.history(11).metrics();
  ASSERT_TRUE(first.count("val_mae") && last.count("val_mse")) << log;
  EXPECT_LT(last.at("val_mae"), first.at("val_mae"));
  EXPECT_LT(last.at("val_mse"), 0.01);
}

// Each bad model ends its job FAILED with the cause, before training, and
// the master serves on.
TEST_F(UserModelTest, BadModelsFailTheirJobWithTheCause) {
  StartMaster("user_model_bad", {"--max_model_mib=1"});
  const std::string traced = dir_ + "/traced.pt";
  const std::string frozen = dir_ + "/frozen.pt";
  const std::string nan = dir_ + "/nan.pt";
  ASSERT_EQ(RunPython(dir_, absl::StrCat(R"(
import torch
from torch import nn
m = nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Dropout(0.5))
torch.jit.trace(m, torch.rand(2, 1, 28, 28)).save(")", traced, R"(")
torch.jit.freeze(torch.jit.script(m.eval())).save(")", frozen, R"(")
class Nan(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
    def forward(self, x):
        return self.fc(torch.flatten(x, 1)) * float("nan")
torch.jit.script(Nan()).save(")", nan, R"(")
)")),
            0)
      << ReadFileOrDie(dir_ + "/python.log");
  const std::string five = dir_ + "/five.pt";
  ASSERT_EQ(ExportModel(dir_, "mlp", five,
                        {"--input_shape", "1,28,28", "--param", "outputs=5"}),
            0);
  const std::string wide = dir_ + "/wide.pt";
  ASSERT_EQ(ExportModel(dir_, "mlp", wide,
                        {"--input_shape", "1,10,10", "--param", "inputs=100"}),
            0);
  const std::string not_torchscript = dir_ + "/pickle.pt";
  WriteFileOrDie(not_torchscript, "not a model");

  struct Case {
    std::string model;  // a torchscript path, or "" for a large built-in
    std::string cause;  // in the job's message
  };
  const std::vector<Case> cases = {
      {dir_ + "/missing.pt", "does not exist"},
      {not_torchscript, "not a TorchScript file"},
      {traced, "traced"},
      {frozen, "frozen"},
      {five, "[32, 5]"},
      {wide, "first forward/backward pass"},
      {nan, "loss of the first batch is nan"},
      {"", "--max_model_mib"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model.empty() ? "large built-in" : c.model);
    v1::JobSpec spec = FashionMnistSubset("downpour", 3000, 1);
    if (c.model.empty()) {
      spec.mutable_model()->add_hidden(1024);  // 3.2 MB > --max_model_mib 1
    } else {
      spec.mutable_model()->Clear();
      spec.mutable_model()->set_torchscript(c.model);
    }
    std::string log;
    int exit_code = 0;
    const v1::JobStatus status = Run(spec, 1, &log, &exit_code);
    EXPECT_NE(exit_code, 0) << log;
    EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED) << log;
    EXPECT_THAT(status.message(), HasSubstr(c.cause)) << log;
    EXPECT_EQ(status.samples_trained(), 0u);
  }
  // The master is unharmed.
  EXPECT_TRUE(client_->ListJobs().ok());
}

// Two inputs and two outputs end to end: HDF5 files holding two features
// datasets and two labels datasets (tools/data/make_synthetic_data --kind
// jets, whose kind and energy follow a known rule), the two-input,
// two-output model of docs/examples/models/jets_two_heads.py exported to
// TorchScript, trained on 2 ranks. The kind reaches a stated accuracy and
// the energy a stated error (predicting the mean energy gives an MAE near
// 0.55), each epoch's val_loss is the weighted sum of the outputs' losses,
// and a model of one input fails its job naming the counts.
TEST_F(UserModelTest, TwoInputsAndTwoOutputsTrainFromHdf5) {
  StartMaster("user_model_two_heads");
  const std::string data = dir_ + "/jets";
  ASSERT_EQ(std::system(absl::StrCat(Runfile("tools/data/make_synthetic_data"),
                                     " --kind jets --out_dir ", data,
                                     " --train 12000 --test 3000 >", dir_, "/data.log 2>&1")
                            .c_str()),
            0)
      << ReadFileOrDie(dir_ + "/data.log");
  const std::string model = dir_ + "/jets_two_heads.pt";
  ASSERT_EQ(ExportModel(dir_, "jets_two_heads", model,
                        {"--input_shape", "4", "--input_shape", "8,3", "--outputs", "3,1",
                         "--seed", "3"}),
            0)
      << ReadFileOrDie(dir_ + "/export.log");
  v1::JobSpec spec;
  spec.set_name("two-heads");
  spec.mutable_model()->set_torchscript(model);
  v1::DataSpec* files = spec.mutable_data();
  files->add_train_files(data + "/train.h5");
  files->add_test_files(data + "/test.h5");
  for (const char* name : {"jets", "tracks"}) files->add_features_datasets(name);
  for (const char* name : {"kind", "energy"}) files->add_labels_datasets(name);
  files->set_validation_count(2000);
  v1::OutputSpec* kind = spec.add_outputs();
  kind->set_name("kind");
  v1::OutputSpec* energy = spec.add_outputs();
  energy->set_name("energy");
  energy->set_loss("mse");
  energy->set_weight(2.0);
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.003);
  spec.set_algorithm("sync");
  spec.set_epochs(8);
  spec.set_batch_size(64);
  spec.set_seed(3);
  std::string log;
  int exit_code = 0;
  v1::JobStatus status = Run(spec, 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  ASSERT_EQ(status.test_metrics().count("test_kind_accuracy"), 1u) << log;
  ASSERT_EQ(status.test_metrics().count("test_energy_mae"), 1u) << log;
  EXPECT_GE(status.test_metrics().at("test_kind_accuracy"), 0.93) << log;
  EXPECT_LE(status.test_metrics().at("test_energy_mae"), 0.15) << log;
  EXPECT_THAT(log, HasSubstr("test_kind_accuracy="));
  ASSERT_EQ(status.history_size(), 8);
  for (const v1::EpochRecord& epoch : status.history()) {
    const auto& m = epoch.metrics();
    ASSERT_TRUE(m.count("val_loss") && m.count("val_kind_loss") && m.count("val_energy_loss") &&
                m.count("val_energy_mse"))
        << log;
    EXPECT_NEAR(m.at("val_loss"), m.at("val_kind_loss") + 2 * m.at("val_energy_loss"),
                1e-6 * std::max(1.0, m.at("val_loss")));
  }

  // A model of one input for data of two: the job fails with the counts.
  const std::string one = dir_ + "/one_input.pt";
  ASSERT_EQ(ExportModel(dir_, "mlp", one,
                        {"--input_shape", "28", "--param", "inputs=28", "--param", "outputs=4"}),
            0)
      << ReadFileOrDie(dir_ + "/export.log");
  spec.mutable_model()->set_torchscript(one);
  status = Run(spec, 1, &log, &exit_code);
  EXPECT_NE(exit_code, 0) << log;
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED) << log;
  EXPECT_THAT(status.message(), HasSubstr("forward takes 1 tensor but the data has 2 inputs"));
  EXPECT_TRUE(client_->ListJobs().ok());
}

// Losses of the user's: class weights with label smoothing and top-3
// accuracy, and a focal loss scripted by docs/examples/losses/focal_loss.py,
// each train a model on 2 ranks; a script returning one loss per sample
// fails its job before training with the cause.
TEST_F(UserModelTest, WeightedAndScriptedLossesTrain) {
  StartMaster("user_model_losses");
  const std::string focal = dir_ + "/focal.pt";
  const int status_code = std::system(
      absl::StrCat(kPython, " ", Runfile("docs/examples/losses/focal_loss.py"), " ", focal,
                   " --gamma 2 >>", dir_, "/python.log 2>&1")
          .c_str());
  ASSERT_TRUE(WIFEXITED(status_code) && WEXITSTATUS(status_code) == 0)
      << ReadFileOrDie(dir_ + "/python.log");
  const std::string per_sample = dir_ + "/per_sample.pt";
  ASSERT_EQ(RunPython(dir_, absl::StrCat(R"(
import torch
class PerSample(torch.nn.Module):
    def forward(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, labels, reduction="none")
torch.jit.script(PerSample()).save(")", per_sample, R"(")
)")),
            0)
      << ReadFileOrDie(dir_ + "/python.log");

  v1::JobSpec weighted = FashionMnistSubset("sync", 12000, 2);
  for (int c = 0; c < 10; ++c) {
    weighted.mutable_loss_options()->add_class_weights(c == 6 ? 2.0 : 1.0);
  }
  weighted.mutable_loss_options()->set_label_smoothing(0.05);
  weighted.mutable_loss_options()->set_top_k(3);
  v1::JobSpec scripted = FashionMnistSubset("sync", 12000, 2);
  scripted.mutable_loss_options()->set_torchscript(focal);
  for (const v1::JobSpec& spec : {weighted, scripted}) {
    std::string log;
    int exit_code = 0;
    const v1::JobStatus status = Run(spec, 2, &log, &exit_code);
    ASSERT_EQ(exit_code, 0) << log;
    ASSERT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
    EXPECT_GE(status.test_accuracy(), 0.75) << log;
    if (spec.loss_options().has_top_k()) {
      // Top-3 is reported, and is at least the accuracy.
      ASSERT_EQ(status.test_metrics().count("test_top3_accuracy"), 1u) << status.ShortDebugString();
      EXPECT_GE(status.test_metrics().at("test_top3_accuracy"), status.test_accuracy());
      EXPECT_THAT(log, HasSubstr("val_top3_acc="));
    }
  }

  v1::JobSpec bad = FashionMnistSubset("downpour", 3000, 1);
  bad.mutable_loss_options()->set_torchscript(per_sample);
  std::string log;
  int exit_code = 0;
  const v1::JobStatus failed = Run(bad, 1, &log, &exit_code);
  EXPECT_NE(exit_code, 0) << log;
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED) << log;
  EXPECT_THAT(failed.message(), HasSubstr("the batch's mean loss")) << log;
  EXPECT_THAT(failed.message(), HasSubstr(per_sample)) << log;
  EXPECT_EQ(failed.samples_trained(), 0u);
}

// Warm starts: a job started from a trained job's weights, training at a
// negligible rate, scores what its source scored; a job of another model
// started from them fails before training, naming the first difference.
TEST_F(UserModelTest, WarmStartedJobBeginsWhereItsSourceEnded) {
  StartMaster("user_model_warm");
  std::string log;
  int exit_code = 0;
  const v1::JobStatus source = Run(FashionMnistSubset("sync", 12000, 2), 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(source.state(), v1::JOB_STATE_COMPLETED) << source.message();

  v1::JobSpec warm = FashionMnistSubset("sync", 12000, 1);
  warm.mutable_optimizer()->set_name("sgd");
  warm.mutable_optimizer()->set_learning_rate(1e-9);
  warm.mutable_warm_start()->set_job_id(source.job_id());
  const v1::JobStatus started = Run(warm, 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(started.state(), v1::JOB_STATE_COMPLETED) << started.message();
  EXPECT_NEAR(started.test_accuracy(), source.test_accuracy(), 0.005)
      << "source " << source.test_accuracy() << ", warm-started " << started.test_accuracy();
  // From scratch at that rate the model stays at chance.
  v1::JobSpec cold = warm;
  cold.clear_warm_start();
  const v1::JobStatus untrained = Run(cold, 1, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  EXPECT_LT(untrained.test_accuracy(), 0.5);

  v1::JobSpec other = warm;
  other.mutable_model()->clear_hidden();
  other.mutable_model()->add_hidden(64);
  const v1::JobStatus failed = Run(other, 1, &log, &exit_code);
  EXPECT_NE(exit_code, 0) << log;
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED) << log;
  EXPECT_THAT(failed.message(), HasSubstr("warm_start: tensor 0 is")) << failed.message();
  EXPECT_EQ(failed.samples_trained(), 0u);

  // From the source exported as TorchScript (mpilearn-export), which the
  // workers read: the same accuracy; another model fails naming the file.
  const std::string exported = dir_ + "/source.pt";
  ASSERT_EQ(std::system(absl::StrCat(Runfile("tools/cli/mpilearn-export"), " --state_dir ", dir_,
                                     " --job_id ", source.job_id(), " --out ", exported, " >>",
                                     dir_, "/export.log 2>&1")
                            .c_str()),
            0)
      << ReadFileOrDie(dir_ + "/export.log");
  v1::JobSpec from_file = warm;
  from_file.mutable_warm_start()->Clear();
  from_file.mutable_warm_start()->set_torchscript(exported);
  const v1::JobStatus loaded = Run(from_file, 2, &log, &exit_code);
  ASSERT_EQ(exit_code, 0) << log;
  ASSERT_EQ(loaded.state(), v1::JOB_STATE_COMPLETED) << loaded.message();
  EXPECT_NEAR(loaded.test_accuracy(), source.test_accuracy(), 0.005)
      << "source " << source.test_accuracy() << ", from its export " << loaded.test_accuracy();
  v1::JobSpec other_file = other;
  *other_file.mutable_warm_start() = from_file.warm_start();
  const v1::JobStatus refused = Run(other_file, 1, &log, &exit_code);
  EXPECT_EQ(refused.state(), v1::JOB_STATE_FAILED) << log;
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("warm_start: tensor 0 is"), HasSubstr("TorchScript file")))
      << refused.message();
  EXPECT_EQ(refused.samples_trained(), 0u);
}

}  // namespace
}  // namespace mpilearn::testing
