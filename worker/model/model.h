// The model a job trains: a built-in architecture from the spec's zoo, or
// the user's TorchScript module. Either way it is a torch::jit::Module, so
// training, evaluation, the exchange with the master and export share one
// code path, and every model exports as TorchScript that Python loads.
//
//   torch::manual_seed(job.seed());  // Build draws the initial weights
//   MPILEARN_ASSIGN_OR_RETURN(
//       Model model, Model::FromSpec(job.model(), /*input_shape=*/{1, 28, 28},
//                                    /*outputs=*/10));
//   model.SetTraining(true);
//   torch::Tensor logits = model.Forward(images);  // [B, 10]
//
// Built-in models: mlp, cnn, cnn1d, gru and lstm, as docs/protocol.md
// (ModelSpec) describes them, layers named as PyTorch names its own modules
// ("fc1.weight", "bn1.running_mean") with PyTorch's default initialization.
// Inputs of another rank are reshaped as the model needs; anything else is an
// InvalidArgument naming the shape.
//
// TorchScript models: spec.torchscript names a file written by
// torch.jit.script(...).save (tools/cli/export_torchscript.py). Refused, with a
// message saying how to export correctly: a file that is missing or not
// TorchScript, a traced module (its dropout/BatchNorm have the train/eval
// mode baked in), a frozen module or one without trainable parameters.
//
// State: what the master holds for a job, in layout order: the trainable
// parameters (requires_grad), then the floating-point buffers (BatchNorm's
// running statistics). The tensors share the module's storage, so writing
// them changes the model. Integer buffers (num_batches_tracked) and
// parameters with requires_grad=False stay as built or loaded on each rank.
//
// Thread safety: a Model belongs to one thread. Build draws from LibTorch's
// global generator; callers that want reproducible weights seed it first.
#ifndef MPILEARN_WORKER_MODEL_MODEL_H_
#define MPILEARN_WORKER_MODEL_MODEL_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"
#include "worker/model/torchscript_file.h"

namespace mpilearn::worker {

class Model {
 public:
  // The built-in model `spec.name()` for samples of `input_shape` (without
  // the batch dimension) and `outputs` values per sample, with freshly drawn
  // weights. InvalidArgument naming the spec field for an unknown name or a
  // bad field, and for an input shape the model cannot take.
  // With several inputs (`inputs`: each one's row shape; input_shape is
  // then their packed [F]) the towers model takes them one by one; the
  // others take the packed features.
  static absl::StatusOr<Model> Build(const v1::ModelSpec& spec,
                                     absl::Span<const int64_t> input_shape,
                                     int64_t outputs,
                                     absl::Span<const std::vector<int64_t>> inputs = {});

  // Loads the scripted module at `path`. Errors name the file and say what
  // to do: NotFound (missing), InvalidArgument (not TorchScript, traced,
  // frozen, no trainable parameters).
  // `field` names the spec field in messages.
  static absl::StatusOr<Model> Load(const std::string& path,
                                    absl::string_view field = "model.torchscript");

  // Load(spec.torchscript()) when set, else Build; with two or more
  // `inputs`, then SetInputs.
  static absl::StatusOr<Model> FromSpec(const v1::ModelSpec& spec,
                                        absl::Span<const int64_t> input_shape,
                                        int64_t outputs,
                                        absl::Span<const std::vector<int64_t>> inputs = {});

  // Several inputs (each one's row shape, in order; the features Forward
  // gets are them packed side by side, [B, F]): when the module's forward
  // takes that many tensors, Forward hands it each input [B, shape...].
  // A `builtin` module taking one tensor keeps the packed features;
  // otherwise InvalidArgument naming both counts.
  absl::Status SetInputs(std::vector<std::vector<int64_t>> shapes, bool builtin);

  // The model's output for a batch (the first dimension of `x` is the
  // batch), on the model's device (`x` is moved there first when it is
  // elsewhere). A module returning a tuple of tensors (several outputs)
  // gives them side by side, each as [B, n] (output_widths() says the n's).
  // LibTorch errors propagate as c10::Error.
  torch::Tensor Forward(const torch::Tensor& x);
  // Each output's width in the last Forward whose module returned a
  // tuple; empty when it returned one tensor.
  const std::vector<int64_t>& output_widths() const { return output_widths_; }

  // Moves the model's tensors to `device`; state() then holds the moved
  // tensors.
  void To(const torch::Device& device);
  const torch::Device& device() const { return device_; }

  // train(on) on the module and every submodule (dropout, BatchNorm).
  void SetTraining(bool on);

  // Parameters then float buffers, sharing the module's storage (contiguous
  // float32), and their names ("fc1.weight", "bn1.running_mean").
  const std::vector<torch::Tensor>& state() const { return state_; }
  const std::vector<std::string>& state_names() const { return names_; }
  // The first num_parameters() entries of state() are trained parameters.
  size_t num_parameters() const { return num_parameters_; }
  std::vector<torch::Tensor> parameters() const;
  // Scalars in the trained parameters.
  int64_t ParameterCount() const;

  // Copies `values` (laid out as state()) into the model's state.
  // InvalidArgument when the count or a size differs.
  absl::Status SetState(absl::Span<const absl::Span<const float>> values);

  // Writes the module as a TorchScript file that torch.jit.load (Python)
  // and torch::jit::load (C++) read, with the current state.
  absl::Status Save(const std::string& path);

  torch::jit::Module& module() { return module_; }

 private:
  explicit Model(torch::jit::Module module);
  // Fills state_, names_ and num_parameters_ from the module.
  void CollectState();

  torch::jit::Module module_;
  torch::Device device_ = torch::kCPU;
  std::vector<torch::Tensor> state_;
  std::vector<std::string> names_;
  size_t num_parameters_ = 0;
  // SetInputs's shapes when forward takes them one by one; empty otherwise.
  std::vector<std::vector<int64_t>> split_;
  std::vector<int64_t> output_widths_;
};

// Switches LibTorch's graph executor to run TorchScript without profiling
// and re-optimizing (the profiling executor makes the first iterations of a
// scripted module several times slower, which would distort the first
// epoch's figures). Call once per process before the first Forward.
void UseSimpleGraphExecutor();

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MODEL_MODEL_H_
