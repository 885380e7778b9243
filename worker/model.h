// The built-in models a job's ModelSpec can name, as LibTorch modules.
//
//   torch::manual_seed(job.seed());  // BuildModel draws the initial weights
//   MPILEARN_ASSIGN_OR_RETURN(
//       torch::nn::Sequential model,
//       BuildModel(job.model(), /*channels=*/1, /*height=*/28, /*width=*/28,
//                  /*num_classes=*/10));
//   torch::Tensor logits = model->forward(images);  // [B, 10]
//
// Models (defaults in parentheses; spec fields of the other model are
// ignored):
//   "mlp": flatten, then Linear + ReLU per `hidden` width ([256, 128]),
//          Dropout(`dropout`) if > 0 (0), Linear to num_classes.
//   "cnn": Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) twice, with
//          `channels` output channels ([32, 64]); flatten; Linear to `dense`
//          (128) + ReLU; Dropout(`dropout`) if > 0; Linear to num_classes.
// Both output logits (no softmax). Modules are named ("fc1", "conv1", "out",
// ...), so parameter names read like "fc1.weight".
//
// Thread safety: BuildModel draws from LibTorch's global generator; callers
// that want reproducible weights seed it and build on one thread.
#ifndef MPILEARN_WORKER_MODEL_H_
#define MPILEARN_WORKER_MODEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {
namespace worker {

// Builds the model `spec` names for inputs of [B, channels, height, width]
// and `num_classes` outputs, with freshly initialized weights (LibTorch's
// default initialization, drawn from the global generator).
//
// Returns InvalidArgument naming the spec field for an unknown or missing
// model name, a non-positive width, a dropout outside [0, 1), or a `channels`
// list that is not 2 long; and for non-positive input dimensions or classes,
// or images smaller than 4x4 for the cnn.
absl::StatusOr<torch::nn::Sequential> BuildModel(
    const mpilearn::v1::ModelSpec& spec, int64_t channels, int64_t height,
    int64_t width, int64_t num_classes);

// The model's parameters in a stable order (that of named_parameters: layer
// by layer, weight before bias). The tensors share storage with the model.
std::vector<torch::Tensor> ModelParameters(const torch::nn::Sequential& model);

// The names of ModelParameters(model), in the same order ("fc1.weight", ...).
std::vector<std::string> ModelParameterNames(
    const torch::nn::Sequential& model);

// Total number of scalar parameters in the model.
int64_t ParameterCount(const torch::nn::Sequential& model);

}  // namespace worker
}  // namespace mpilearn

#endif  // MPILEARN_WORKER_MODEL_H_
