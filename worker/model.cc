#include "worker/model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace worker {
namespace {

using ::mpilearn::v1::ModelSpec;

const std::vector<int64_t> kDefaultHidden = {256, 128};
const std::vector<int64_t> kDefaultChannels = {32, 64};
constexpr int64_t kDefaultDense = 128;

// The widths in `field` (e.g. "hidden"), or `defaults` when it is empty;
// each must be positive.
absl::StatusOr<std::vector<int64_t>> Widths(
    const char* field, const google::protobuf::RepeatedField<int32_t>& values,
    const std::vector<int64_t>& defaults) {
  if (values.empty()) return defaults;
  std::vector<int64_t> widths;
  for (int i = 0; i < values.size(); ++i) {
    if (values[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.", field, "[", i, "] must be > 0, got ", values[i]));
    }
    widths.push_back(values[i]);
  }
  return widths;
}

absl::StatusOr<double> Dropout(const ModelSpec& spec) {
  const double p = spec.has_dropout() ? spec.dropout() : 0.0;
  // Written so that NaN fails too.
  if (!(p >= 0.0 && p < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout must be in [0, 1), got ", p));
  }
  return p;
}

// Appends the optional dropout and the output layer.
void AddHead(torch::nn::Sequential& model, double dropout, int64_t in,
             int64_t num_classes) {
  if (dropout > 0.0) {
    model->push_back("dropout",
                     torch::nn::Dropout(torch::nn::DropoutOptions(dropout)));
  }
  model->push_back("out", torch::nn::Linear(in, num_classes));
}

absl::StatusOr<torch::nn::Sequential> BuildMlp(const ModelSpec& spec,
                                               int64_t inputs,
                                               int64_t num_classes) {
  MPILEARN_ASSIGN_OR_RETURN(const std::vector<int64_t> hidden,
                            Widths("hidden", spec.hidden(), kDefaultHidden));
  MPILEARN_ASSIGN_OR_RETURN(const double dropout, Dropout(spec));
  torch::nn::Sequential model;
  model->push_back("flatten", torch::nn::Flatten());
  int64_t in = inputs;
  for (size_t i = 0; i < hidden.size(); ++i) {
    model->push_back(absl::StrCat("fc", i + 1),
                     torch::nn::Linear(in, hidden[i]));
    model->push_back(absl::StrCat("relu", i + 1), torch::nn::ReLU());
    in = hidden[i];
  }
  AddHead(model, dropout, in, num_classes);
  return model;
}

absl::StatusOr<torch::nn::Sequential> BuildCnn(const ModelSpec& spec,
                                               int64_t channels,
                                               int64_t height, int64_t width,
                                               int64_t num_classes) {
  if (spec.channels_size() != 0 && spec.channels_size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.channels must list the output channels of the 2 conv layers, "
        "got ",
        spec.channels_size(), " values"));
  }
  MPILEARN_ASSIGN_OR_RETURN(
      const std::vector<int64_t> conv,
      Widths("channels", spec.channels(), kDefaultChannels));
  const int64_t dense = spec.has_dense() ? spec.dense() : kDefaultDense;
  if (dense <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dense must be > 0, got ", dense));
  }
  MPILEARN_ASSIGN_OR_RETURN(const double dropout, Dropout(spec));
  // Two 2x2 poolings (rounding down) leave H/4 x W/4.
  if (height < 4 || width < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cnn model needs images of at least 4x4 pixels, got ", height,
        "x", width, "; use model.name 'mlp'"));
  }
  torch::nn::Sequential model;
  model->push_back("conv1",
                   torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, conv[0],
                                                              /*kernel_size=*/3)
                                         .padding(1)));
  model->push_back("relu1", torch::nn::ReLU());
  model->push_back("pool1",
                   torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  model->push_back("conv2",
                   torch::nn::Conv2d(torch::nn::Conv2dOptions(conv[0], conv[1],
                                                              /*kernel_size=*/3)
                                         .padding(1)));
  model->push_back("relu2", torch::nn::ReLU());
  model->push_back("pool2",
                   torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  model->push_back("flatten", torch::nn::Flatten());
  model->push_back("fc",
                   torch::nn::Linear(conv[1] * (height / 4) * (width / 4), dense));
  model->push_back("relu3", torch::nn::ReLU());
  AddHead(model, dropout, dense, num_classes);
  return model;
}

}  // namespace

absl::StatusOr<torch::nn::Sequential> BuildModel(const ModelSpec& spec,
                                                 int64_t channels,
                                                 int64_t height, int64_t width,
                                                 int64_t num_classes) {
  if (channels <= 0 || height <= 0 || width <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model inputs must have positive dimensions, got channels=", channels,
        " height=", height, " width=", width));
  }
  if (num_classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model needs at least 1 class, got ", num_classes));
  }
  if (spec.name() == "mlp") {
    return BuildMlp(spec, channels * height * width, num_classes);
  }
  if (spec.name() == "cnn") {
    return BuildCnn(spec, channels, height, width, num_classes);
  }
  if (spec.name().empty()) {
    return absl::InvalidArgumentError(
        "model.name is required; built-in models are 'mlp' and 'cnn'");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.name: unknown model '", spec.name(),
                   "'; built-in models are 'mlp' and 'cnn'"));
}

std::vector<torch::Tensor> ModelParameters(const torch::nn::Sequential& model) {
  return model->parameters(/*recurse=*/true);
}

std::vector<std::string> ModelParameterNames(
    const torch::nn::Sequential& model) {
  return model->named_parameters(/*recurse=*/true).keys();
}

int64_t ParameterCount(const torch::nn::Sequential& model) {
  int64_t count = 0;
  for (const torch::Tensor& p : model->parameters(/*recurse=*/true)) {
    count += p.numel();
  }
  return count;
}

}  // namespace worker
}  // namespace mpilearn
