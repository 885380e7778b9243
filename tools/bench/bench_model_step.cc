// bench_model_step: what running a model as TorchScript costs a training
// step, against the same architecture written with LibTorch's eager C++
// modules.
//
//   bazel run -c opt //tools:bench_model_step -- [--json] [--steps N]
//
// For the default MLP (784-256-128-10) and CNN (conv 32, conv 64, dense 128)
// on batches of 64 Fashion-MNIST-sized inputs, one compute thread: the mean
// time of a forward + summed cross-entropy + backward step, in
//   eager:  torch::nn::Sequential (the layers the zoo emits, by hand);
//   zoo:    the built-in model (worker/model/model.h: generated TorchScript)
//           under the simple graph executor the worker uses
//           (UseSimpleGraphExecutor);
// both with identical weights, timed interleaved in rounds after a warm-up.
// The eager CNN keeps LibTorch's default NCHW activations; the zoo's runs
// them channels-last on the CPU (worker/model/model.cc, BuildCnn), so the cnn
// ratio includes what that layout buys (about 1.2-1.4x).
// Prints ms per step and zoo/eager throughput ratios; --json prints one JSON
// object with the same figures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/model/model.h"

ABSL_FLAG(bool, json, false, "Print one JSON object of the figures.");
ABSL_FLAG(int, steps, 60, "Timed steps per round (5 rounds).");

namespace {

using mpilearn::worker::Model;

torch::nn::Sequential EagerMlp() {
  torch::nn::Sequential s;
  s->push_back(torch::nn::Flatten());
  s->push_back(torch::nn::Linear(784, 256));
  s->push_back(torch::nn::ReLU());
  s->push_back(torch::nn::Linear(256, 128));
  s->push_back(torch::nn::ReLU());
  s->push_back(torch::nn::Linear(128, 10));
  return s;
}

torch::nn::Sequential EagerCnn() {
  using torch::nn::Conv2dOptions;
  torch::nn::Sequential s;
  s->push_back(torch::nn::Conv2d(Conv2dOptions(1, 32, 3).padding(1)));
  s->push_back(torch::nn::ReLU());
  s->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  s->push_back(torch::nn::Conv2d(Conv2dOptions(32, 64, 3).padding(1)));
  s->push_back(torch::nn::ReLU());
  s->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
  s->push_back(torch::nn::Flatten());
  s->push_back(torch::nn::Linear(64 * 7 * 7, 128));
  s->push_back(torch::nn::ReLU());
  s->push_back(torch::nn::Linear(128, 10));
  return s;
}

// Seconds per step of `step` over `steps` calls.
template <typename Step>
double TimeSteps(int steps, Step step) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
             .count() /
         steps;
}

struct Figures {
  double eager_ms = 0, zoo_ms = 0;
};

Figures Measure(const std::string& name, torch::nn::Sequential eager, int steps) {
  mpilearn::v1::ModelSpec spec;
  spec.set_name(name);
  absl::StatusOr<Model> zoo = Model::Build(spec, {1, 28, 28}, 10);
  if (!zoo.ok()) {
    std::fprintf(stderr, "bench_model_step: %s\n", std::string(zoo.status().message()).c_str());
    std::exit(1);
  }
  // The same weights in both, in layer order.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> mine = eager->parameters();
    for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(zoo->state()[i]);
  }
  zoo->SetTraining(true);
  const torch::Tensor x = torch::rand({64, 1, 28, 28});
  const torch::Tensor y = torch::randint(0, 10, {64});
  auto summed = [&](const torch::Tensor& logits) {
    return torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  };
  auto eager_step = [&] {
    summed(eager->forward(x)).backward();
    for (auto& p : eager->parameters()) p.mutable_grad().zero_();
  };
  auto zoo_step = [&] {
    summed(zoo->Forward(x)).backward();
    for (auto& p : zoo->parameters()) p.mutable_grad().zero_();
  };
  TimeSteps(10, eager_step);  // warm-up
  TimeSteps(10, zoo_step);
  std::vector<double> eager_s, zoo_s;
  for (int round = 0; round < 5; ++round) {
    eager_s.push_back(TimeSteps(steps, eager_step));
    zoo_s.push_back(TimeSteps(steps, zoo_step));
  }
  std::sort(eager_s.begin(), eager_s.end());
  std::sort(zoo_s.begin(), zoo_s.end());
  return {1e3 * eager_s[2], 1e3 * zoo_s[2]};  // medians
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  torch::set_num_threads(1);
  mpilearn::worker::UseSimpleGraphExecutor();
  torch::manual_seed(1);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  const Figures mlp = Measure("mlp", EagerMlp(), steps);
  const Figures cnn = Measure("cnn", EagerCnn(), std::max(1, steps / 4));
  if (absl::GetFlag(FLAGS_json)) {
    absl::PrintF(
        "{\"mlp_eager_ms\": %.4f, \"mlp_zoo_ms\": %.4f, \"mlp_zoo_vs_eager\": %.3f, "
        "\"cnn_eager_ms\": %.4f, \"cnn_zoo_ms\": %.4f, \"cnn_zoo_vs_eager\": %.3f}\n",
        mlp.eager_ms, mlp.zoo_ms, mlp.eager_ms / mlp.zoo_ms, cnn.eager_ms,
        cnn.zoo_ms, cnn.eager_ms / cnn.zoo_ms);
    return 0;
  }
  absl::PrintF("model  eager ms/step  zoo ms/step  zoo/eager throughput\n");
  absl::PrintF("mlp    %13.3f  %11.3f  %.3fx\n", mlp.eager_ms, mlp.zoo_ms,
               mlp.eager_ms / mlp.zoo_ms);
  absl::PrintF("cnn    %13.3f  %11.3f  %.3fx\n", cnn.eager_ms, cnn.zoo_ms,
               cnn.eager_ms / cnn.zoo_ms);
  return 0;
}
