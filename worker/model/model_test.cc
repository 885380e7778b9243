#include "worker/model/model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

using ::mpilearn::v1::ModelSpec;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec Spec(const std::string& name) {
  ModelSpec spec;
  spec.set_name(name);
  return spec;
}

Model MustBuild(const ModelSpec& spec, std::vector<int64_t> input_shape,
                int64_t outputs) {
  absl::StatusOr<Model> model = Model::Build(spec, input_shape, outputs);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) std::abort();
  return *std::move(model);
}

std::vector<int64_t> Sizes(const torch::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", getpid(), "_", name);
}

TEST(ModelBuildTest, MlpNamesAndCountsAsPyTorch) {
  Model model = MustBuild(Spec("mlp"), {1, 28, 28}, 10);
  EXPECT_THAT(model.state_names(),
              ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                          "out.weight", "out.bias"));
  EXPECT_EQ(model.num_parameters(), 6u);
  EXPECT_EQ(model.ParameterCount(),
            784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  // PyTorch's default initialization bound: 1/sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(784.0);
  EXPECT_LE(model.state()[0].abs().max().item<double>(), bound);
  EXPECT_GT(model.state()[0].abs().max().item<double>(), 0.9 * bound);
}

// The mlp's output against the same computation written out in double
// precision from its weights.
TEST(ModelBuildTest, MlpForwardMatchesHandComputation) {
  ModelSpec spec = Spec("mlp");
  spec.add_hidden(7);
  torch::manual_seed(3);
  Model model = MustBuild(spec, {2, 3}, 4);
  model.SetTraining(false);
  const torch::Tensor x = torch::randn({5, 2, 3});
  const torch::Tensor out = model.Forward(x);
  ASSERT_EQ(Sizes(out), (std::vector<int64_t>{5, 4}));
  auto w = [&](int i) { return model.state()[i].to(torch::kDouble); };
  for (int b = 0; b < 5; ++b) {
    std::vector<double> hidden(7);
    for (int j = 0; j < 7; ++j) {
      double s = w(1)[j].item<double>();
      for (int k = 0; k < 6; ++k) {
        s += w(0)[j][k].item<double>() * x[b].flatten()[k].item<double>();
      }
      hidden[j] = std::max(0.0, s);
    }
    for (int o = 0; o < 4; ++o) {
      double s = w(3)[o].item<double>();
      for (int j = 0; j < 7; ++j) s += w(2)[o][j].item<double>() * hidden[j];
      EXPECT_NEAR(out[b][o].item<double>(), s, 1e-5);
    }
  }
}

TEST(ModelBuildTest, CnnOfAnyDepthWithBatchNorm) {
  ModelSpec spec = Spec("cnn");
  for (int c : {8, 16, 16}) spec.add_channels(c);
  spec.set_batch_norm(true);
  spec.set_pool_every(1);
  spec.set_dense(32);
  Model model = MustBuild(spec, {3, 32, 32}, 10);
  EXPECT_EQ(Sizes(model.Forward(torch::rand({4, 3, 32, 32}))),
            (std::vector<int64_t>{4, 10}));
  // Parameters first, then the batch norms' running statistics.
  const auto& names = model.state_names();
  ASSERT_GT(names.size(), model.num_parameters());
  for (size_t i = model.num_parameters(); i < names.size(); ++i) {
    EXPECT_TRUE(absl::EndsWith(names[i], "running_mean") ||
                absl::EndsWith(names[i], "running_var"))
        << names[i];
  }
  EXPECT_THAT(names, testing::Contains("conv3_bn.running_var"));
  EXPECT_THAT(names, testing::Contains("fc_bn.weight"));
  // fc: 16 channels x 4 x 4 after three poolings of 32x32.
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "fc.weight") {
      EXPECT_EQ(Sizes(model.state()[i]), (std::vector<int64_t>{32, 16 * 4 * 4}));
    }
  }
}

TEST(ModelBuildTest, CnnValidPaddingAndPoolEvery) {
  // mpi_learn's MNIST CNN: two 3x3 valid convs, one pooling.
  ModelSpec spec = Spec("cnn");
  spec.add_channels(32);
  spec.add_channels(64);
  spec.set_padding("valid");
  spec.set_pool_every(2);
  Model model = MustBuild(spec, {1, 28, 28}, 10);
  for (size_t i = 0; i < model.state_names().size(); ++i) {
    if (model.state_names()[i] == "fc.weight") {
      EXPECT_EQ(Sizes(model.state()[i]), (std::vector<int64_t>{128, 64 * 12 * 12}));
    }
  }
  EXPECT_EQ(Sizes(model.Forward(torch::rand({2, 1, 28, 28}))),
            (std::vector<int64_t>{2, 10}));
}

TEST(ModelBuildTest, CnnRefusesInputsPooledAway) {
  ModelSpec spec = Spec("cnn");
  for (int i = 0; i < 4; ++i) spec.add_channels(4);
  const absl::Status status = Model::Build(spec, {1, 8, 8}, 10).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("pooling after conv layer 4"));
}

TEST(ModelBuildTest, Cnn1dGruAndLstmShapes) {
  ModelSpec cnn1d = Spec("cnn1d");
  cnn1d.add_channels(8);
  EXPECT_EQ(Sizes(MustBuild(cnn1d, {6, 20}, 3).Forward(torch::rand({2, 6, 20}))),
            (std::vector<int64_t>{2, 3}));
  for (const std::string name : {"gru", "lstm"}) {
    ModelSpec spec = Spec(name);
    spec.add_recurrent(16);
    spec.add_recurrent(8);
    spec.set_dense(12);
    Model model = MustBuild(spec, {20, 6}, 5);
    EXPECT_EQ(Sizes(model.Forward(torch::rand({3, 20, 6}))),
              (std::vector<int64_t>{3, 5}));
    EXPECT_THAT(model.state_names(),
                testing::Contains(name + "2.weight_hh_l0"));
    // Image rows as a sequence: [1, H, W] is taken as [T, F].
    EXPECT_EQ(Sizes(MustBuild(spec, {1, 28, 28}, 10).Forward(torch::rand({2, 1, 28, 28}))),
              (std::vector<int64_t>{2, 10}));
  }
}

// The zoo's GRU layer against LibTorch's own nn::GRU with the same weights.
TEST(ModelBuildTest, GruMatchesLibTorchGru) {
  ModelSpec spec = Spec("gru");
  spec.add_recurrent(5);
  Model model = MustBuild(spec, {7, 3}, 2);
  model.SetTraining(false);
  torch::nn::GRU reference(torch::nn::GRUOptions(3, 5).batch_first(true));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model.state_names().size(); ++i) {
    const std::string& name = model.state_names()[i];
    if (absl::StartsWith(name, "gru1.")) {
      reference->named_parameters()[name.substr(5)].copy_(model.state()[i]);
    }
  }
  const torch::Tensor x = torch::randn({4, 7, 3});
  const torch::Tensor last = std::get<0>(reference->forward(x)).select(1, -1);
  const torch::Tensor expected =
      torch::linear(last, model.state()[4], model.state()[5]);
  EXPECT_TRUE(torch::allclose(model.Forward(x), expected, 1e-5, 1e-6));
}

TEST(ModelBuildTest, DropoutFollowsTrainAndEval) {
  ModelSpec spec = Spec("mlp");
  spec.set_dropout(0.5);
  Model model = MustBuild(spec, {16}, 4);
  const torch::Tensor x = torch::rand({8, 16});
  model.SetTraining(false);
  EXPECT_TRUE(torch::equal(model.Forward(x), model.Forward(x)));
  model.SetTraining(true);
  torch::manual_seed(1);
  const torch::Tensor a = model.Forward(x);
  const torch::Tensor b = model.Forward(x);
  EXPECT_FALSE(torch::equal(a, b));
}

TEST(ModelBuildTest, BatchNormStatisticsMoveOnlyInTraining) {
  ModelSpec spec = Spec("mlp");
  spec.add_hidden(6);
  spec.set_batch_norm(true);
  Model model = MustBuild(spec, {4}, 2);
  ASSERT_EQ(model.state_names().back(), "fc1_bn.running_var");
  const torch::Tensor mean = model.state()[model.state().size() - 2];
  const torch::Tensor x = torch::randn({32, 4}) * 3 + 1;
  model.SetTraining(false);
  model.Forward(x);
  EXPECT_EQ(mean.abs().sum().item<double>(), 0.0);
  model.SetTraining(true);
  model.Forward(x);
  EXPECT_GT(mean.abs().sum().item<double>(), 0.0);
}

TEST(ModelBuildTest, BackwardReachesEveryParameter) {
  ModelSpec spec = Spec("cnn");
  spec.set_batch_norm(true);
  Model model = MustBuild(spec, {1, 12, 12}, 3);
  model.SetTraining(true);
  model.Forward(torch::rand({4, 1, 12, 12})).sum().backward();
  for (const torch::Tensor& p : model.parameters()) {
    ASSERT_TRUE(p.grad().defined());
  }
}

// The CNN runs its activations channels-last on the CPU (model.cc,
// BuildCnn): outputs and every gradient still equal those of the same
// layers in NCHW, computed in double precision by eager LibTorch calls.
TEST(ModelBuildTest, CnnMatchesDoublePrecisionNchwReference) {
  for (const int64_t channels_in : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE(absl::StrCat(channels_in, " input channel(s)"));
    ModelSpec spec = Spec("cnn");
    spec.add_channels(4);
    spec.add_channels(6);
    spec.set_dense(16);
    Model model = MustBuild(spec, {channels_in, 12, 12}, 5);
    model.SetTraining(true);
    const torch::Tensor x = torch::rand({7, channels_in, 12, 12});
    const torch::Tensor out = model.Forward(x);
    out.square().sum().backward();

    // conv1.weight, conv1.bias, conv2.weight, conv2.bias, fc.weight,
    // fc.bias, out.weight, out.bias.
    std::vector<torch::Tensor> p;
    for (const torch::Tensor& t : model.parameters()) {
      p.push_back(t.detach().to(torch::kDouble).requires_grad_(true));
    }
    ASSERT_EQ(p.size(), 8u);
    namespace F = torch::nn::functional;
    torch::Tensor h = x.to(torch::kDouble);
    for (int layer = 0; layer < 2; ++layer) {
      h = torch::conv2d(h, p[2 * layer], p[2 * layer + 1], 1, 1);
      h = torch::max_pool2d(torch::relu(h), 2);
    }
    h = torch::relu(torch::linear(h.flatten(1), p[4], p[5]));
    const torch::Tensor reference = torch::linear(h, p[6], p[7]);
    reference.square().sum().backward();

    EXPECT_TRUE(torch::allclose(out.to(torch::kDouble), reference, 1e-5, 1e-6));
    const std::vector<std::string> names = model.state_names();
    for (size_t i = 0; i < p.size(); ++i) {
      const torch::Tensor grad = model.parameters()[i].grad();
      ASSERT_TRUE(grad.defined()) << names[i];
      // The exchange reads gradients as the parameters' NCHW memory.
      EXPECT_TRUE(grad.is_contiguous()) << names[i];
      EXPECT_TRUE(torch::allclose(grad.to(torch::kDouble), p[i].grad(), 1e-4, 1e-5))
          << names[i] << ": max difference "
          << (grad.to(torch::kDouble) - p[i].grad()).abs().max().item<double>();
    }
  }
}

TEST(ModelBuildTest, RefusesBadSpecsAndHugeModels) {
  EXPECT_THAT(Model::Build(Spec("resnet"), {4}, 2).status().message(),
              HasSubstr("unknown model 'resnet'"));
  ModelSpec huge = Spec("mlp");
  huge.add_hidden(1 << 20);
  huge.add_hidden(1 << 20);
  // 2^40 weights: refused before any memory is taken.
  const absl::Status status = Model::Build(huge, {784}, 10).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(Model::Build(Spec("gru"), {2, 3, 4}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelSaveLoadTest, SavedBuiltinLoadsWithSameOutputsAndState) {
  ModelSpec spec = Spec("cnn");
  spec.add_channels(4);
  spec.set_batch_norm(true);
  spec.set_dropout(0.3);
  Model model = MustBuild(spec, {1, 8, 8}, 3);
  model.SetTraining(true);
  model.Forward(torch::rand({6, 1, 8, 8}));  // moves the running statistics
  const std::string path = TempPath("cnn.pt");
  ASSERT_TRUE(model.Save(path).ok());
  absl::StatusOr<Model> loaded = Model::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->state_names(), model.state_names());
  EXPECT_EQ(loaded->num_parameters(), model.num_parameters());
  for (size_t i = 0; i < model.state().size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded->state()[i], model.state()[i]))
        << model.state_names()[i];
  }
  model.SetTraining(false);
  loaded->SetTraining(false);
  const torch::Tensor x = torch::rand({2, 1, 8, 8});
  EXPECT_TRUE(torch::equal(loaded->Forward(x), model.Forward(x)));
  std::remove(path.c_str());
}

TEST(ModelBuildTest, ToMovesStateAndForwardMovesInputs) {
  ModelSpec spec = Spec("mlp");
  spec.set_batch_norm(true);
  Model model = MustBuild(spec, {3}, 2);
  const std::vector<std::string> names = model.state_names();
  model.To(torch::kCPU);
  EXPECT_EQ(model.state_names(), names);
  EXPECT_TRUE(model.device().is_cpu());
  // The state still is the module's: writing it changes the outputs.
  model.SetTraining(false);
  const torch::Tensor x = torch::rand({4, 3});
  const torch::Tensor before = model.Forward(x);
  torch::NoGradGuard no_grad;
  model.state()[0].mul_(2);
  EXPECT_FALSE(torch::equal(before, model.Forward(x)));
}

TEST(ModelSaveLoadTest, SetStateWritesTheModel) {
  Model model = MustBuild(Spec("mlp"), {3}, 2);
  std::vector<std::vector<float>> values;
  std::vector<absl::Span<const float>> views;
  for (const torch::Tensor& t : model.state()) {
    values.emplace_back(t.numel(), 0.25f);
  }
  for (const auto& v : values) views.emplace_back(v);
  ASSERT_TRUE(model.SetState(views).ok());
  EXPECT_EQ(model.state()[0].sum().item<double>(),
            0.25 * static_cast<double>(model.state()[0].numel()));
  views.pop_back();
  EXPECT_EQ(model.SetState(views).code(), absl::StatusCode::kInvalidArgument);
}

// towers: each input through its own layer, side by side through the
// shared one, then the head; against the same arithmetic in double.
TEST(ModelBuildTest, TowersTakeEachInputOnItsOwn) {
  ModelSpec spec = Spec("towers");
  spec.add_hidden(5);
  spec.add_hidden(6);
  const std::vector<std::vector<int64_t>> inputs = {{4}, {8, 3}};
  absl::StatusOr<Model> model = Model::FromSpec(spec, {28}, 4, inputs);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(model->state_names(),
              ElementsAre("tower0.weight", "tower0.bias", "tower1.weight", "tower1.bias",
                          "fc1.weight", "fc1.bias", "out.weight", "out.bias"));
  EXPECT_THAT(Sizes(model->state()[2]), ElementsAre(5, 24));
  EXPECT_THAT(Sizes(model->state()[4]), ElementsAre(6, 10));
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({3, 28});
  const torch::Tensor out = model->Forward(x);
  ASSERT_THAT(Sizes(out), ElementsAre(3, 4));
  const auto dense = [](const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& v) {
    return torch::matmul(v, w.to(torch::kDouble).t()) + b.to(torch::kDouble);
  };
  const std::vector<torch::Tensor>& s = model->state();
  const torch::Tensor xd = x.to(torch::kDouble);
  const torch::Tensor t0 = torch::relu(dense(s[0], s[1], xd.narrow(1, 0, 4)));
  const torch::Tensor t1 = torch::relu(dense(s[2], s[3], xd.narrow(1, 4, 24)));
  const torch::Tensor h = torch::relu(dense(s[4], s[5], torch::cat({t0, t1}, 1)));
  const torch::Tensor want = dense(s[6], s[7], h);
  EXPECT_LT((out.to(torch::kDouble) - want).abs().max().item<double>(), 1e-5);
  // One input is not for towers.
  EXPECT_THAT(std::string(Model::FromSpec(spec, {28}, 4).status().message()),
              HasSubstr("the towers model takes two or more inputs"));
}

// A TorchScript model of two inputs and two outputs: Forward splits the
// packed features into its inputs and gives its outputs side by side.
TEST(ModelLoadTest, SeveralInputsAndATupleOfOutputs) {
  torch::jit::Module m("__torch__.TwoByTwo");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::arange(6, torch::kFloat32).reshape({2, 3}).requires_grad_(),
                       false);
  m.define(R"(
def forward(self, a, b):
    return torch.mm(a, self.w), torch.sum(b, [1, 2])
)");
  const std::string path = TempPath("two_by_two.pt");
  m.save(path);
  absl::StatusOr<Model> model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->SetInputs({{2}, {2, 2}}, /*builtin=*/false).ok());
  const torch::Tensor x = torch::tensor({1.f, 2.f, 1.f, 2.f, 3.f, 4.f,    //
                                         0.f, -1.f, 0.5f, 0.5f, 0.5f, 0.5f})
                              .reshape({2, 6});
  const torch::Tensor out = model->Forward(x);
  EXPECT_THAT(model->output_widths(), ElementsAre(3, 1));
  // Row 0: [1, 2] . w = [6, 9, 12]; 1 + 2 + 3 + 4 = 10.
  // Row 1: [0, -1] . w = [-3, -4, -5]; 4 * 0.5 = 2.
  EXPECT_TRUE(torch::equal(out, torch::tensor({6.f, 9.f, 12.f, 10.f, -3.f, -4.f, -5.f, 2.f})
                                    .reshape({2, 4})))
      << out;
  EXPECT_THAT(std::string(model->SetInputs({{2}, {2, 2}, {1}}, false).message()),
              HasSubstr("the model's forward takes 2 tensors but the data has 3 inputs"));
  std::remove(path.c_str());
  // A module of one input is refused several, unless it is a built-in
  // model (which then takes the packed features).
  Model mlp = MustBuild(Spec("mlp"), {6}, 2);
  EXPECT_TRUE(mlp.SetInputs({{2}, {2, 2}}, /*builtin=*/true).ok());
  EXPECT_THAT(Sizes(mlp.Forward(x)), ElementsAre(2, 2));
  EXPECT_THAT(std::string(mlp.SetInputs({{2}, {2, 2}}, /*builtin=*/false).message()),
              HasSubstr("takes 1 tensor but the data has 2 inputs"));
}

// A module whose dropout has the mode as a constant: what torch.jit.trace
// records.
TEST(ModelLoadTest, RefusesTracedLookingModule) {
  torch::jit::Module m("__torch__.Traced");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::ones({2, 2}, torch::requires_grad()), false);
  m.define(R"(
def forward(self, x):
    return torch.dropout(torch.mm(x, self.w), 0.5, True)
)");
  const std::string path = TempPath("traced.pt");
  m.save(path);
  const absl::Status status = Model::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("traced"));
  EXPECT_THAT(status.message(), HasSubstr("torch.jit.script"));
  std::remove(path.c_str());
}

// The zoo's recurrent layers pass self.training: saved, they load; a GRU
// call with the mode as a constant (a traced GRU) does not.
TEST(ModelLoadTest, RecurrentModeMustNotBeConstant) {
  ModelSpec spec = Spec("lstm");
  spec.add_recurrent(4);
  const std::string saved = TempPath("lstm.pt");
  ASSERT_TRUE(MustBuild(spec, {5, 3}, 2).Save(saved).ok());
  EXPECT_TRUE(Model::Load(saved).ok());
  std::remove(saved.c_str());

  torch::jit::Module m("__torch__.TracedGru");
  m.register_attribute("training", c10::BoolType::get(), true);
  for (const std::string name : {"w_ih", "w_hh", "b_ih", "b_hh"}) {
    m.register_parameter(name, torch::ones({6}, torch::requires_grad()), false);
  }
  m.define(R"(
def forward(self, x):
    h0 = torch.zeros([1, x.size(0), 2])
    out, h = torch.gru(x, h0, [self.w_ih, self.w_hh, self.b_ih, self.b_hh], True, 1, 0.0, False, False, True)
    return out
)");
  const std::string path = TempPath("traced_gru.pt");
  m.save(path);
  const absl::Status status = Model::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("recurrent layer"));
  std::remove(path.c_str());
}

TEST(ModelLoadTest, RefusesModulesWithoutParameters) {
  torch::jit::Module m("__torch__.Frozen");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.define(R"(
def forward(self, x):
    return torch.relu(x)
)");
  const std::string path = TempPath("frozen.pt");
  m.save(path);
  const absl::Status status = Model::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("frozen"));
  std::remove(path.c_str());
}

TEST(ModelLoadTest, MissingAndNonTorchScriptFiles) {
  EXPECT_EQ(Model::Load("/nonexistent/model.pt").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = TempPath("garbage.pt");
  std::ofstream(path) << "not a model";
  const absl::Status status = Model::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not a TorchScript file"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mpilearn::worker
