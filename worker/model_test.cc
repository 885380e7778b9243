#include "worker/model.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace worker {
namespace {

using ::mpilearn::v1::ModelSpec;
using ::testing::ElementsAre;

ModelSpec Spec(const std::string& name) {
  ModelSpec spec;
  spec.set_name(name);
  return spec;
}

// Builds `spec` for 1x28x28 images and 10 classes, asserting success.
torch::nn::Sequential Build(const ModelSpec& spec) {
  absl::StatusOr<torch::nn::Sequential> model = BuildModel(spec, 1, 28, 28, 10);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : torch::nn::Sequential();
}

// The error BuildModel returns for `spec` on 1x28x28 images, 10 classes.
absl::Status Rejection(const ModelSpec& spec) {
  return BuildModel(spec, 1, 28, 28, 10).status();
}

void ExpectRejected(const ModelSpec& spec, const std::string& message) {
  const absl::Status status = Rejection(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(), message);
}

TEST(BuildModelTest, MlpOutputsLogitsPerClass) {
  torch::nn::Sequential model = Build(Spec("mlp"));
  const torch::Tensor out = model->forward(torch::rand({5, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(out.scalar_type(), torch::kFloat32);
}

TEST(BuildModelTest, CnnOutputsLogitsPerClass) {
  torch::nn::Sequential model = Build(Spec("cnn"));
  const torch::Tensor out = model->forward(torch::rand({5, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 10}));
}

TEST(BuildModelTest, DefaultMlpParameterCount) {
  torch::nn::Sequential model = Build(Spec("mlp"));
  EXPECT_EQ(ParameterCount(model),
            784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_THAT(ModelParameterNames(model),
              ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                          "out.weight", "out.bias"));
}

TEST(BuildModelTest, DefaultCnnParameterCount) {
  torch::nn::Sequential model = Build(Spec("cnn"));
  const int64_t conv1 = 1 * 32 * 3 * 3 + 32;
  const int64_t conv2 = 32 * 64 * 3 * 3 + 64;
  const int64_t fc = 64 * 7 * 7 * 128 + 128;
  const int64_t out = 128 * 10 + 10;
  EXPECT_EQ(ParameterCount(model), conv1 + conv2 + fc + out);
  EXPECT_THAT(ModelParameterNames(model),
              ElementsAre("conv1.weight", "conv1.bias", "conv2.weight",
                          "conv2.bias", "fc.weight", "fc.bias", "out.weight",
                          "out.bias"));
}

TEST(BuildModelTest, ParametersMatchNamesAndShareStorage) {
  torch::nn::Sequential model = Build(Spec("mlp"));
  const std::vector<torch::Tensor> params = ModelParameters(model);
  const std::vector<std::string> names = ModelParameterNames(model);
  ASSERT_EQ(params.size(), names.size());
  const auto named = model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].is_same(named[names[i]])) << names[i];
  }
  EXPECT_EQ(params[0].sizes(), (std::vector<int64_t>{256, 784}));
  EXPECT_EQ(params[5].sizes(), (std::vector<int64_t>{10}));
}

TEST(BuildModelTest, CustomWidthsAndInputShape) {
  ModelSpec mlp = Spec("mlp");
  mlp.add_hidden(7);
  absl::StatusOr<torch::nn::Sequential> model = BuildModel(mlp, 3, 5, 6, 4);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ParameterCount(*model), 3 * 5 * 6 * 7 + 7 + 7 * 4 + 4);
  EXPECT_EQ((*model)->forward(torch::rand({2, 3, 5, 6})).sizes(),
            (std::vector<int64_t>{2, 4}));

  // A non-square image whose sides are not multiples of 4: pooling rounds
  // down, 18x13 -> 9x6 -> 4x3.
  ModelSpec cnn = Spec("cnn");
  cnn.add_channels(4);
  cnn.add_channels(8);
  cnn.set_dense(16);
  model = BuildModel(cnn, 2, 18, 13, 3);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ParameterCount(*model), (2 * 4 * 9 + 4) + (4 * 8 * 9 + 8) +
                                        (8 * 4 * 3 * 16 + 16) + (16 * 3 + 3));
  EXPECT_EQ((*model)->forward(torch::rand({2, 2, 18, 13})).sizes(),
            (std::vector<int64_t>{2, 3}));
}

TEST(BuildModelTest, DropoutIsAddedOnlyWhenPositive) {
  torch::nn::Sequential plain = Build(Spec("mlp"));
  EXPECT_EQ(plain->named_children().find("dropout"), nullptr);

  ModelSpec spec = Spec("cnn");
  spec.set_dropout(0.5);
  torch::nn::Sequential model = Build(spec);
  const std::shared_ptr<torch::nn::Module>* dropout =
      model->named_children().find("dropout");
  ASSERT_NE(dropout, nullptr);
  auto* impl = (*dropout)->as<torch::nn::Dropout>();
  ASSERT_NE(impl, nullptr);
  EXPECT_DOUBLE_EQ(impl->options.p(), 0.5);
  // Dropout sits right before the output layer.
  const std::vector<std::string> names = model->named_children().keys();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[names.size() - 2], "dropout");
  EXPECT_EQ(names.back(), "out");
}

TEST(BuildModelTest, SameSeedGivesSameWeights) {
  for (const char* name : {"mlp", "cnn"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(7);
    const std::vector<torch::Tensor> a = ModelParameters(Build(Spec(name)));
    torch::manual_seed(7);
    const std::vector<torch::Tensor> b = ModelParameters(Build(Spec(name)));
    torch::manual_seed(8);
    const std::vector<torch::Tensor> c = ModelParameters(Build(Spec(name)));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
    }
    EXPECT_FALSE(torch::equal(a[0], c[0]));
  }
}

TEST(BuildModelTest, RejectsUnknownOrMissingName) {
  ExpectRejected(Spec("xyz"),
                 "model.name: unknown model 'xyz'; built-in models are 'mlp' "
                 "and 'cnn'");
  ExpectRejected(Spec(""),
                 "model.name is required; built-in models are 'mlp' and 'cnn'");
}

TEST(BuildModelTest, RejectsNonPositiveHiddenWidths) {
  ModelSpec spec = Spec("mlp");
  spec.add_hidden(64);
  spec.add_hidden(0);
  ExpectRejected(spec, "model.hidden[1] must be > 0, got 0");
  spec.set_hidden(1, 8);
  spec.set_hidden(0, -3);
  ExpectRejected(spec, "model.hidden[0] must be > 0, got -3");
}

TEST(BuildModelTest, RejectsDropoutOutsideUnitInterval) {
  for (const char* name : {"mlp", "cnn"}) {
    SCOPED_TRACE(name);
    ModelSpec spec = Spec(name);
    spec.set_dropout(1.0);
    ExpectRejected(spec, "model.dropout must be in [0, 1), got 1");
    spec.set_dropout(-0.25);
    ExpectRejected(spec, "model.dropout must be in [0, 1), got -0.25");
    spec.set_dropout(std::numeric_limits<double>::quiet_NaN());
    EXPECT_EQ(Rejection(spec).code(), absl::StatusCode::kInvalidArgument);
    spec.set_dropout(0.0);
    EXPECT_TRUE(Rejection(spec).ok());
  }
}

TEST(BuildModelTest, RejectsBadCnnShapes) {
  ModelSpec spec = Spec("cnn");
  spec.add_channels(16);
  ExpectRejected(spec,
                 "model.channels must list the output channels of the 2 conv "
                 "layers, got 1 values");
  spec.add_channels(32);
  spec.add_channels(64);
  ExpectRejected(spec,
                 "model.channels must list the output channels of the 2 conv "
                 "layers, got 3 values");

  spec = Spec("cnn");
  spec.add_channels(16);
  spec.add_channels(0);
  ExpectRejected(spec, "model.channels[1] must be > 0, got 0");

  spec = Spec("cnn");
  spec.set_dense(0);
  ExpectRejected(spec, "model.dense must be > 0, got 0");

  const absl::Status small = BuildModel(Spec("cnn"), 1, 3, 28, 10).status();
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(small.message(),
            "the cnn model needs images of at least 4x4 pixels, got 3x28; use "
            "model.name 'mlp'");
}

TEST(BuildModelTest, RejectsBadInputsAndClasses) {
  EXPECT_EQ(BuildModel(Spec("mlp"), 0, 28, 28, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildModel(Spec("mlp"), 1, 28, -1, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildModel(Spec("cnn"), 1, 28, 28, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace worker
}  // namespace mpilearn
