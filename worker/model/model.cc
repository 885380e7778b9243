#include "worker/model/model.h"

#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/spec_kinds.h"
#include "common/status_macros.h"

namespace mpilearn::worker {
namespace {

using ::mpilearn::v1::ModelSpec;

// Built-in models are refused above this many parameters (8 GiB of fp32
// weights, before gradients and optimizer state): far beyond what a rank
// trains on a CPU, and counted before any memory is taken.
constexpr int64_t kMaxBuiltinParameters = int64_t{1} << 31;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}


// Builds a built-in model as a TorchScript module: one submodule per layer
// with parameters (its own class, its forward written in TorchScript), and
// the model's forward calling them in order. Plain functions (relu,
// pooling, flatten, dropout) are statements of that forward.
class ZooBuilder {
 public:
  // `meta`: tensors on LibTorch's meta device, which takes no memory: a
  // first pass that only counts the parameters.
  explicit ZooBuilder(bool meta)
      : unit_(std::make_shared<torch::jit::CompilationUnit>()),
        options_(torch::TensorOptions().device(meta ? torch::kMeta : torch::kCPU)) {}

  int64_t parameters() const { return parameters_; }

  // A module of class __torch__.mpilearn.<type> (mangled per instance, so
  // each layer has its own class), with the `training` attribute train()
  // and eval() set.
  torch::jit::Module NewModule(const std::string& type) {
    torch::jit::Module module(c10::QualifiedName("__torch__.mpilearn." + type),
                              unit_, /*shouldMangle=*/true);
    module.register_attribute("training", c10::BoolType::get(), true);
    return module;
  }

  // Counts `n` more parameters; ResourceExhausted past the limit, before any
  // memory is taken for them.
  absl::Status Reserve(int64_t n) {
    parameters_ += n;
    if (parameters_ > kMaxBuiltinParameters) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model would have more than ", kMaxBuiltinParameters,
          " parameters; make model.hidden, model.channels, model.dense or "
          "model.recurrent smaller"));
    }
    return absl::OkStatus();
  }

  // Linear(in -> out), PyTorch's initialization: U(-1/sqrt(in), 1/sqrt(in)).
  absl::StatusOr<torch::jit::Module> Linear(int64_t in, int64_t out) {
    MPILEARN_RETURN_IF_ERROR(Reserve(in * out + out));
    torch::jit::Module m = NewModule("Linear");
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    m.register_parameter("weight", Uniform({out, in}, bound), false);
    m.register_parameter("bias", Uniform({out}, bound), false);
    m.define(R"(
def forward(self, x):
    return torch.linear(x, self.weight, self.bias)
)");
    return m;
  }

  // Conv1d / Conv2d (dims 1 or 2) with stride 1, padding "same" or "valid".
  absl::StatusOr<torch::jit::Module> Conv(int dims, int64_t in, int64_t out,
                                          int64_t kernel,
                                          const std::string& padding) {
    std::vector<int64_t> shape = {out, in};
    int64_t fan_in = in;
    for (int d = 0; d < dims; ++d) {
      shape.push_back(kernel);
      fan_in *= kernel;
    }
    MPILEARN_RETURN_IF_ERROR(Reserve(fan_in * out + out));
    torch::jit::Module m = NewModule(dims == 1 ? "Conv1d" : "Conv2d");
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    m.register_parameter("weight", Uniform(shape, bound), false);
    m.register_parameter("bias", Uniform({out}, bound), false);
    const std::string ones = dims == 1 ? "[1]" : "[1, 1]";
    m.define(absl::StrCat("\ndef forward(self, x):\n    return torch.conv",
                          dims, "d(x, self.weight, self.bias, ", ones, ", \"",
                          padding, "\", ", ones, ", 1)\n"));
    return m;
  }

  // BatchNorm over `features` channels (1-d or 2-d alike): PyTorch's
  // defaults (momentum 0.1, eps 1e-5, affine, running statistics).
  absl::StatusOr<torch::jit::Module> BatchNorm(int64_t features) {
    MPILEARN_RETURN_IF_ERROR(Reserve(2 * features));
    torch::jit::Module m = NewModule("BatchNorm");
    m.register_parameter("weight", torch::ones({features}, options_), false);
    m.register_parameter("bias", torch::zeros({features}, options_), false);
    m.register_buffer("running_mean", torch::zeros({features}, options_));
    m.register_buffer("running_var", torch::ones({features}, options_));
    m.register_buffer("num_batches_tracked",
                      torch::zeros({}, options_.dtype(torch::kLong)));
    m.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked.add_(1)
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.training, 0.1, 1e-05, True)
)");
    return m;
  }

  // One GRU or LSTM layer (batch first), returning the whole output
  // sequence [B, T, units]. Parameters named as PyTorch's nn.GRU/nn.LSTM
  // name their first layer's, initialized U(-1/sqrt(units), 1/sqrt(units)).
  absl::StatusOr<torch::jit::Module> Recurrent(bool lstm, int64_t in,
                                               int64_t units) {
    const int64_t gates = (lstm ? 4 : 3) * units;
    MPILEARN_RETURN_IF_ERROR(Reserve(gates * (in + units + 2)));
    torch::jit::Module m = NewModule(lstm ? "LSTM" : "GRU");
    const double bound = 1.0 / std::sqrt(static_cast<double>(units));
    auto draw = [&](std::vector<int64_t> shape) { return Uniform(shape, bound); };
    m.register_parameter("weight_ih_l0", draw({gates, in}), false);
    m.register_parameter("weight_hh_l0", draw({gates, units}), false);
    m.register_parameter("bias_ih_l0", draw({gates}), false);
    m.register_parameter("bias_hh_l0", draw({gates}), false);
    const std::string zeros = absl::StrCat(
        "torch.zeros([1, x.size(0), ", units, "], dtype=x.dtype, device=x.device)");
    const std::string params =
        "[self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0]";
    if (lstm) {
      m.define(absl::StrCat(
          "\ndef forward(self, x):\n    h0 = ", zeros, "\n    c0 = ", zeros,
          "\n    out, h, c = torch.lstm(x, [h0, c0], ", params,
          ", True, 1, 0.0, self.training, False, True)\n    return out\n"));
    } else {
      m.define(absl::StrCat("\ndef forward(self, x):\n    h0 = ", zeros,
                            "\n    out, h = torch.gru(x, h0, ", params,
                            ", True, 1, 0.0, self.training, False, True)\n"
                            "    return out\n"));
    }
    return m;
  }

 private:
  torch::Tensor Uniform(const std::vector<int64_t>& shape, double bound) {
    return torch::empty(shape, options_).uniform_(-bound, bound);
  }

  std::shared_ptr<torch::jit::CompilationUnit> unit_;
  const torch::TensorOptions options_;
  int64_t parameters_ = 0;
};

// The model being assembled: its module and the body of its forward.
struct Assembly {
  torch::jit::Module module;
  std::string body;  // statements of forward, each ending in a newline
  std::string args = "x";  // forward's parameters after self

  void Add(const std::string& name, const torch::jit::Module& layer) {
    module.register_module(name, layer);
    Statement(absl::StrCat("x = self.", name, ".forward(x)"));
  }
  void Statement(const std::string& line) {
    absl::StrAppend(&body, "    ", line, "\n");
  }
  void Dropout(double p) {
    if (p > 0.0) Statement(absl::StrCat("x = torch.dropout(x, ", p, ", self.training)"));
  }
  void Finish() {
    module.define(absl::StrCat("\ndef forward(self, ", args, "):\n", body, "    return x\n"));
  }
};

absl::Status BadInput(const std::string& model, absl::Span<const int64_t> shape,
                      const std::string& takes) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the ", model, " model takes samples of shape ", takes, "; the data's are ",
      ShapeString(shape)));
}

// Dense layers of `widths` (+ batch norm) + ReLU from `in` features;
// returns the width of the last.
// Named fc1, fc2, ... (`numbered`) or fc (at most one layer).
absl::StatusOr<int64_t> AddDense(ZooBuilder& zoo, Assembly& model,
                                 bool numbered,
                                 const std::vector<int64_t>& widths,
                                 bool batch_norm, int64_t in) {
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string name = numbered ? absl::StrCat("fc", i + 1) : "fc";
    MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module fc, zoo.Linear(in, widths[i]));
    model.Add(name, fc);
    if (batch_norm) {
      MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module bn, zoo.BatchNorm(widths[i]));
      model.Add(name + "_bn", bn);
    }
    model.Statement("x = torch.relu(x)");
    in = widths[i];
  }
  return in;
}

absl::Status AddHead(ZooBuilder& zoo, Assembly& model, const ModelSpec& spec,
                     int64_t in, int64_t outputs) {
  model.Dropout(spec.dropout());
  MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module out, zoo.Linear(in, outputs));
  model.Add("out", out);
  return absl::OkStatus();
}

std::vector<int64_t> Widths(const google::protobuf::RepeatedField<int32_t>& values,
                            std::vector<int64_t> defaults) {
  if (values.empty()) return defaults;
  return std::vector<int64_t>(values.begin(), values.end());
}

absl::Status CheckWidths(const char* field, const std::vector<int64_t>& widths) {
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.", field, "[", i, "] must be > 0, got ", widths[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status BuildMlp(ZooBuilder& zoo, Assembly& model, const ModelSpec& spec,
                      absl::Span<const int64_t> input_shape, int64_t outputs) {
  int64_t inputs = 1;
  for (int64_t d : input_shape) inputs *= d;
  const std::vector<int64_t> hidden = Widths(spec.hidden(), {256, 128});
  MPILEARN_RETURN_IF_ERROR(CheckWidths("hidden", hidden));
  model.Statement("x = torch.flatten(x, 1)");
  MPILEARN_ASSIGN_OR_RETURN(
      const int64_t last,
      AddDense(zoo, model, /*numbered=*/true, hidden, spec.batch_norm(), inputs));
  return AddHead(zoo, model, spec, last, outputs);
}

// towers: each input flattened through its own dense layer of hidden[0]
// units (+ batch norm) + ReLU ("tower0", "tower1", ...), the towers' outputs
// side by side through the shared dense layers of hidden[1:], then the
// head: forward(x0, x1, ...).
absl::Status BuildTowers(ZooBuilder& zoo, Assembly& model, const ModelSpec& spec,
                         absl::Span<const std::vector<int64_t>> inputs, int64_t outputs) {
  if (inputs.size() < 2) {
    return absl::InvalidArgumentError(
        "the towers model takes two or more inputs (data.features_datasets names them); this "
        "data has one: use mlp, cnn, cnn1d, gru or lstm");
  }
  const std::vector<int64_t> hidden = Widths(spec.hidden(), {128, 64});
  MPILEARN_RETURN_IF_ERROR(CheckWidths("hidden", hidden));
  std::vector<std::string> args, towers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t in = 1;
    for (const int64_t d : inputs[i]) in *= d;
    const std::string tower = absl::StrCat("tower", i);
    MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module fc, zoo.Linear(in, hidden[0]));
    model.module.register_module(tower, fc);
    model.Statement(absl::StrCat("t", i, " = self.", tower, ".forward(torch.flatten(x", i, ", 1))"));
    if (spec.batch_norm()) {
      MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module bn, zoo.BatchNorm(hidden[0]));
      model.module.register_module(tower + "_bn", bn);
      model.Statement(absl::StrCat("t", i, " = self.", tower, "_bn.forward(t", i, ")"));
    }
    model.Statement(absl::StrCat("t", i, " = torch.relu(t", i, ")"));
    args.push_back(absl::StrCat("x", i));
    towers.push_back(absl::StrCat("t", i));
  }
  model.args = absl::StrJoin(args, ", ");
  model.Statement(absl::StrCat("x = torch.cat([", absl::StrJoin(towers, ", "), "], 1)"));
  MPILEARN_ASSIGN_OR_RETURN(
      const int64_t last,
      AddDense(zoo, model, /*numbered=*/true,
               std::vector<int64_t>(hidden.begin() + 1, hidden.end()), spec.batch_norm(),
               hidden[0] * static_cast<int64_t>(inputs.size())));
  return AddHead(zoo, model, spec, last, outputs);
}

absl::Status BuildCnn(ZooBuilder& zoo, Assembly& model, const ModelSpec& spec,
                      int dims, absl::Span<const int64_t> input_shape,
                      int64_t outputs) {
  // The input as [C, spatial...], reshaped in forward where needed.
  std::vector<int64_t> shape(input_shape.begin(), input_shape.end());
  if (dims == 2) {
    if (shape.size() == 2) {
      model.Statement("x = torch.unsqueeze(x, 1)");
      shape.insert(shape.begin(), 1);
    } else if (shape.size() != 3) {
      return BadInput("cnn", input_shape, "[C, H, W] or [H, W]");
    }
  } else {
    if (shape.size() == 1) {
      model.Statement("x = torch.unsqueeze(x, 1)");
      shape.insert(shape.begin(), 1);
    } else if (shape.size() == 3) {
      model.Statement("x = torch.flatten(x, 2)");
      shape = {shape[0], shape[1] * shape[2]};
    } else if (shape.size() != 2) {
      return BadInput("cnn1d", input_shape, "[C, L], [L] or [C, H, W]");
    }
  }
  if (dims == 2) {
    // On the CPU, channels-last (NHWC) activations: oneDNN convolves them
    // without reordering to and from its blocked layout on every call, and
    // max pooling, ReLU and batch norm have vectorized NHWC kernels (the
    // NCHW max pooling is a scalar loop). The same values as NCHW (oneDNN
    // computes in one layout either way); flatten restores the NCHW feature
    // order for the dense layers, so the weights mean what they always did.
    // A training step of the default CNN on Fashion-MNIST costs about 0.7x
    // of the NCHW one (docs/performance.md, issue 14). `to` rather than
    // `contiguous`: a one-channel NCHW tensor already counts as
    // channels-last contiguous, so only `to` gives it the strides that make
    // the convolution choose NHWC. (TorchScript compiled from C++ has no
    // `torch.channels_last`; memory formats are their c10 enum values.)
    model.Statement("if not x.is_cuda:");
    model.Statement(absl::StrCat(
        "    x = x.to(memory_format=",
        static_cast<int>(c10::MemoryFormat::ChannelsLast), ")"));
  }
  const std::vector<int64_t> channels = Widths(spec.channels(), {32, 64});
  MPILEARN_RETURN_IF_ERROR(CheckWidths("channels", channels));
  const int64_t kernel = spec.has_kernel_size() ? spec.kernel_size() : 3;
  const std::string padding = spec.padding().empty() ? "same" : spec.padding();
  const int64_t pool_every = spec.has_pool_every() ? spec.pool_every() : 1;
  if (kernel <= 0 || pool_every < 0 || (padding != "same" && padding != "valid")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.kernel_size must be > 0, model.pool_every >= 0 and "
        "model.padding 'same' or 'valid'; got ",
        kernel, ", ", pool_every, ", '", padding, "'"));
  }
  const std::string pool = dims == 1 ? "torch.max_pool1d(x, [2])"
                                     : "torch.max_pool2d(x, [2, 2])";
  int64_t in = shape[0];
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string name = absl::StrCat("conv", i + 1);
    MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module conv,
                              zoo.Conv(dims, in, channels[i], kernel, padding));
    model.Add(name, conv);
    if (spec.batch_norm()) {
      MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module bn, zoo.BatchNorm(channels[i]));
      model.Add(name + "_bn", bn);
    }
    model.Statement("x = torch.relu(x)");
    in = channels[i];
    for (size_t d = 1; d < shape.size(); ++d) {
      if (padding == "valid") shape[d] -= kernel - 1;
      if (shape[d] < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model: conv layer ", i + 1, " with kernel ", kernel,
            " and padding 'valid' leaves no input of the data's ",
            ShapeString(input_shape), "; use padding 'same' or fewer layers"));
      }
    }
    if (pool_every > 0 && (i + 1) % pool_every == 0) {
      model.Statement(absl::StrCat("x = ", pool));
      for (size_t d = 1; d < shape.size(); ++d) {
        shape[d] /= 2;
        if (shape[d] < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model: the pooling after conv layer ", i + 1,
              " leaves no input of the data's ", ShapeString(input_shape),
              "; use fewer model.channels or a larger model.pool_every"));
        }
      }
      model.Dropout(spec.conv_dropout());
    }
  }
  int64_t flat = in;
  for (size_t d = 1; d < shape.size(); ++d) flat *= shape[d];
  model.Statement("x = torch.flatten(x, 1)");
  const int64_t dense = spec.has_dense() ? spec.dense() : 128;
  std::vector<int64_t> widths;
  if (dense > 0) widths.push_back(dense);
  MPILEARN_ASSIGN_OR_RETURN(
      const int64_t last, AddDense(zoo, model, /*numbered=*/false, widths, spec.batch_norm(), flat));
  return AddHead(zoo, model, spec, last, outputs);
}

absl::Status BuildRecurrent(ZooBuilder& zoo, Assembly& model,
                            const ModelSpec& spec, bool lstm,
                            absl::Span<const int64_t> input_shape,
                            int64_t outputs) {
  const std::string kind = lstm ? "lstm" : "gru";
  int64_t features = 0;
  if (input_shape.size() == 1) {
    model.Statement("x = torch.unsqueeze(x, 2)");
    features = 1;
  } else if (input_shape.size() == 2) {
    features = input_shape[1];
  } else if (input_shape.size() == 3 && input_shape[0] == 1) {
    model.Statement("x = torch.squeeze(x, 1)");
    features = input_shape[2];
  } else {
    return BadInput(kind, input_shape, "[T, F], [T] or [1, T, F]");
  }
  const std::vector<int64_t> recurrent = Widths(spec.recurrent(), {64});
  MPILEARN_RETURN_IF_ERROR(CheckWidths("recurrent", recurrent));
  int64_t in = features;
  for (size_t i = 0; i < recurrent.size(); ++i) {
    MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module layer,
                              zoo.Recurrent(lstm, in, recurrent[i]));
    model.Add(absl::StrCat(kind, i + 1), layer);
    in = recurrent[i];
  }
  model.Statement("x = torch.select(x, 1, -1)");  // the last time step
  const int64_t dense = spec.has_dense() ? spec.dense() : 0;
  std::vector<int64_t> widths;
  if (dense > 0) widths.push_back(dense);
  MPILEARN_ASSIGN_OR_RETURN(
      const int64_t last, AddDense(zoo, model, /*numbered=*/false, widths, spec.batch_norm(), in));
  return AddHead(zoo, model, spec, last, outputs);
}

// True when `node` is an operator whose behaviour depends on the train/eval
// mode (dropout, normalization, recurrent layers with dropout) and its mode
// argument is a constant, as torch.jit.trace records it. A scripted module
// passes `self.training` (or a value computed from it) instead.
bool BakedMode(const torch::jit::Node* node) {
  static const std::set<c10::Symbol> kModal = {
      c10::aten::dropout,       c10::aten::feature_dropout,
      c10::aten::alpha_dropout, c10::aten::feature_alpha_dropout,
      c10::aten::batch_norm,    c10::aten::instance_norm,
      c10::aten::gru,           c10::aten::lstm,
      c10::aten::rnn_tanh,      c10::aten::rnn_relu};
  if (kModal.count(node->kind()) == 0) return false;
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema == nullptr) return false;
  const std::vector<c10::Argument>& args = schema->arguments();
  for (size_t i = 0; i < args.size() && i < node->inputs().size(); ++i) {
    const std::string& name = args[i].name();
    if (name == "train" || name == "training" || name == "use_input_stats") {
      return node->inputs()[i]->node()->kind() == c10::prim::Constant;
    }
  }
  return false;
}

bool HasBakedMode(const torch::jit::Block* block) {
  for (const torch::jit::Node* node : block->nodes()) {
    for (const torch::jit::Block* inner : node->blocks()) {
      if (HasBakedMode(inner)) return true;
    }
    if (BakedMode(node)) return true;
  }
  return false;
}

}  // namespace

void UseSimpleGraphExecutor() { torch::jit::setGraphExecutorOptimize(false); }

Model::Model(torch::jit::Module module) : module_(std::move(module)) {
  CollectState();
}

void Model::CollectState() {
  state_.clear();
  names_.clear();
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
    if (!p.value.requires_grad()) continue;
    state_.push_back(p.value);
    names_.push_back(p.name);
  }
  num_parameters_ = state_.size();
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
    if (!b.value.is_floating_point()) continue;
    state_.push_back(b.value);
    names_.push_back(b.name);
  }
}

absl::StatusOr<Model> Model::Build(const ModelSpec& spec,
                                   absl::Span<const int64_t> input_shape,
                                   int64_t outputs,
                                   absl::Span<const std::vector<int64_t>> inputs) {
  if (input_shape.empty()) {
    return absl::InvalidArgumentError("the data's samples have no shape");
  }
  for (int64_t d : input_shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model inputs must have positive dimensions, got ",
          ShapeString(input_shape)));
    }
  }
  if (outputs <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model needs at least 1 output, got ", outputs));
  }
  const double dropout = spec.has_dropout() ? spec.dropout() : 0.0;
  const double conv_dropout = spec.has_conv_dropout() ? spec.conv_dropout() : 0.0;
  if (!(dropout >= 0.0 && dropout < 1.0) ||
      !(conv_dropout >= 0.0 && conv_dropout < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.dropout and model.conv_dropout must be in [0, 1), got ", dropout,
        " and ", conv_dropout));
  }
  const std::string& name = spec.name().empty() ? std::string("mlp") : spec.name();
  const std::optional<ModelKind> kind = BuiltInModelFromName(name);
  if (!kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.name: unknown model '", name, "'; built-in models are ",
        ModelNames(), ", or set model.torchscript"));
  }
  const ModelKindInfo& info = InfoOf(*kind);
  // Twice: on the meta device to check the spec and count the parameters
  // without taking memory, then for real.
  std::optional<Assembly> built;
  for (const bool meta : {true, false}) {
    ZooBuilder zoo(meta);
    Assembly model{zoo.NewModule(std::string(info.class_name)), ""};
    try {
      if (*kind == ModelKind::kMlp) {
        MPILEARN_RETURN_IF_ERROR(BuildMlp(zoo, model, spec, input_shape, outputs));
      } else if (*kind == ModelKind::kTowers) {
        MPILEARN_RETURN_IF_ERROR(BuildTowers(zoo, model, spec, inputs, outputs));
      } else if (info.conv_dims > 0) {
        MPILEARN_RETURN_IF_ERROR(BuildCnn(zoo, model, spec, info.conv_dims,
                                          input_shape, outputs));
      } else {
        MPILEARN_RETURN_IF_ERROR(BuildRecurrent(zoo, model, spec,
                                                *kind == ModelKind::kLstm,
                                                input_shape, outputs));
      }
      if (meta) continue;
      model.Finish();
      for (torch::Tensor p : model.module.parameters(/*recurse=*/true)) {
        p.requires_grad_(true);
      }
    } catch (const c10::Error& e) {
      // Allocation failures.
      return absl::ResourceExhaustedError(absl::StrCat(
          "could not build the ", name, " model: ", ShortExceptionMessage(e)));
    } catch (const std::exception& e) {
      // TorchScript compile errors: a bug here.
      return absl::InternalError(
          absl::StrCat("could not build the ", name, " model: ", e.what()));
    }
    built.emplace(std::move(model));
  }
  return Model(std::move(built->module));
}

absl::StatusOr<Model> Model::Load(const std::string& path, absl::string_view field) {
  constexpr char kHowTo[] =
      "export the model with tools/cli/export_torchscript.py (torch.jit.script, "
      "then .save; see docs/torchscript.md)";
  MPILEARN_ASSIGN_OR_RETURN(torch::jit::Module module,
                            LoadTorchScriptFile(path, field, kHowTo));
  size_t parameters = 0, trainable = 0;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true)) {
    ++parameters;
    if (p.requires_grad()) ++trainable;
  }
  if (parameters == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path,
        "' has no parameters: a frozen module (torch.jit.freeze) holds its "
        "weights as constants and cannot be trained; save the scripted module "
        "without freezing it; ",
        kHowTo));
  }
  if (trainable == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path,
        "' has no trainable parameters (requires_grad is False for all ",
        parameters, "); set requires_grad on the parameters to train"));
  }
  std::shared_ptr<torch::jit::Graph> graph =
      module.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  if (HasBakedMode(graph->block())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path,
        "' is a traced module: its dropout, batch norm or recurrent layer has "
        "the train/eval mode of the moment it was traced baked in, so it would "
        "train and evaluate alike; use torch.jit.script instead of "
        "torch.jit.trace; ",
        kHowTo));
  }
  Model model(std::move(module));
  for (size_t i = 0; i < model.state_.size(); ++i) {
    if (model.state_[i].scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", path, "': tensor '", model.names_[i], "' is ",
          c10::toString(model.state_[i].scalar_type()),
          "; MPI Learn trains float32 models: call model.float() before "
          "scripting"));
    }
    if (!model.state_[i].is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", path, "': tensor '", model.names_[i],
          "' is not contiguous; call .contiguous() on it before saving"));
    }
  }
  return model;
}

absl::StatusOr<Model> Model::FromSpec(const ModelSpec& spec,
                                      absl::Span<const int64_t> input_shape,
                                      int64_t outputs,
                                      absl::Span<const std::vector<int64_t>> inputs) {
  absl::StatusOr<Model> model = spec.torchscript().empty()
                                    ? Build(spec, input_shape, outputs, inputs)
                                    : Load(spec.torchscript());
  if (!model.ok() || inputs.size() < 2) return model;
  MPILEARN_RETURN_IF_ERROR(
      model->SetInputs({inputs.begin(), inputs.end()}, spec.torchscript().empty()));
  return model;
}

absl::Status Model::SetInputs(std::vector<std::vector<int64_t>> shapes, bool builtin) {
  const size_t takes =
      module_.get_method("forward").function().getSchema().arguments().size() - 1;
  if (takes == shapes.size()) {
    split_ = std::move(shapes);
    return absl::OkStatus();
  }
  if (takes == 1 && builtin) return absl::OkStatus();  // the packed features
  std::vector<std::string> listed;
  for (const std::vector<int64_t>& shape : shapes) listed.push_back(ShapeString(shape));
  return absl::InvalidArgumentError(absl::StrCat(
      "the model's forward takes ", takes, " tensor", takes == 1 ? "" : "s", " but the data has ",
      shapes.size(), " inputs (data.features_datasets: rows of ", absl::StrJoin(listed, ", "),
      "); write forward(self, ", takes == 1 ? "x0, x1, ...)" : "...) with one parameter per input",
      " in the order the datasets are listed"));
}

torch::Tensor Model::Forward(const torch::Tensor& x) {
  const torch::Tensor in = x.device() == device_ ? x : x.to(device_);
  std::vector<c10::IValue> args;
  if (split_.empty()) {
    args.emplace_back(in);
  } else {
    // The packed [B, F] back into each input [B, ...].
    const int64_t batch = in.size(0);
    int64_t at = 0;
    for (const std::vector<int64_t>& shape : split_) {
      std::vector<int64_t> sizes = {batch};
      int64_t columns = 1;
      for (const int64_t d : shape) {
        sizes.push_back(d);
        columns *= d;
      }
      args.emplace_back(in.narrow(1, at, columns).reshape(sizes));
      at += columns;
    }
  }
  c10::IValue out = module_.forward(args);
  if (out.isTuple()) {
    // Several outputs: side by side, each [B, n] ([B] as [B, 1]).
    std::vector<torch::Tensor> parts;
    output_widths_.clear();
    for (const c10::IValue& element : out.toTupleRef().elements()) {
      TORCH_CHECK(element.isTensor(),
                  "the model's forward returned a tuple holding ", element.tagKind(),
                  "; it must return a tensor or a tuple of tensors");
      const torch::Tensor part = element.toTensor();
      TORCH_CHECK(part.dim() >= 1, "the model's outputs must have a batch dimension");
      parts.push_back(part.reshape({part.size(0), -1}));
      output_widths_.push_back(parts.back().size(1));
    }
    TORCH_CHECK(!parts.empty(), "the model's forward returned an empty tuple");
    return torch::cat(parts, 1);
  }
  TORCH_CHECK(out.isTensor(),
              "the model's forward must return a tensor or a tuple of tensors, it returned ",
              out.tagKind());
  output_widths_.clear();
  return out.toTensor();
}

void Model::SetTraining(bool on) { module_.train(on); }

void Model::To(const torch::Device& device) {
  module_.to(device);
  device_ = device;
  CollectState();
}

std::vector<torch::Tensor> Model::parameters() const {
  return std::vector<torch::Tensor>(state_.begin(),
                                    state_.begin() + num_parameters_);
}

int64_t Model::ParameterCount() const {
  int64_t count = 0;
  for (size_t i = 0; i < num_parameters_; ++i) count += state_[i].numel();
  return count;
}

absl::Status Model::SetState(absl::Span<const absl::Span<const float>> values) {
  if (values.size() != state_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights hold ", values.size(), " tensors; the model has ",
        state_.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (static_cast<int64_t>(values[i].size()) != state_[i].numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", names_[i], "' holds ", values[i].size(),
          " values in the weights; the model's holds ", state_[i].numel()));
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < values.size(); ++i) {
    std::memcpy(state_[i].data_ptr<float>(), values[i].data(),
                values[i].size() * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status Model::Save(const std::string& path) {
  try {
    module_.save(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("cannot write '", path, "': ", ShortExceptionMessage(e)));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::worker
