// mpilearn-export: turns a job's trained weights into a file that a program
// outside MPI Learn loads with plain PyTorch or LibTorch.
//
//   mpilearn-export --state_dir /var/lib/mpilearn --job_id job-000042
//       --out model.pt
//
// writes model.pt and model.pt.spec.json (the job's normalized spec). The
// default format (--format torchscript) is the job's model itself, as a
// TorchScript module holding the trained parameters and buffers (BatchNorm's
// running statistics), saved in eval mode; it needs no MPI Learn code:
//
//   m = torch.jit.load("model.pt"); m.eval(); m(x)       # Python
//   torch::jit::Module m = torch::jit::load("model.pt");  // C++
//
// The model is rebuilt as the job's workers built it (worker/model/model.h): a
// built-in model from spec.json's model section for the sample shape and
// outputs the weights header records (TensorSetHeader.input_shape, outputs;
// --input_shape and --num_classes override them, and are needed only for
// weights written before the header carried them), or the job's TorchScript
// file (model.torchscript; --model_file when it has moved). The weights
// must fit that model exactly (count, names, shapes) before they are copied
// in.
//
// A job whose weights lived on parameter shards (docs/sharding.md): the
// lead gathers a completed job's final weights into its own weights.pb;
// without them, --shard_state_dirs names the shards' state directories
// (copies of them will do), and the export joins the slices of their final
// weights (each slice tensor is named "NAME[BEGIN:END]") into the model's
// tensors, every element exactly once.
//
// --format tensors writes a LibTorch archive of named tensors instead, one
// entry per parameter and float buffer ("fc1.weight", "fc1_bn.running_mean",
// ...), read with torch::serialize::InputArchive (see kUsage).
//
// Exit codes: 0 ok, 1 a file cannot be read or written or the weights do not
// fit the job's model, 2 usage error. main() only parses flags; Export()
// does the work. The checkpoint file format is common/checkpoint_file.h's.
#include <sys/stat.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/checkpoint_file.h"
#include "common/cli_flags.h"
#include "common/spec/job_spec.h"
#include "common/shard/sharded_connection.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, state_dir, "",
          "The master's --state_dir (holds jobs/<job_id>/). Required.");
ABSL_FLAG(std::string, job_id, "",
          "The job to export, e.g. job-000042. "
          "Required.");
ABSL_FLAG(std::string, weights, "final",
          "final (jobs/<job_id>/weights.pb), best (jobs/<job_id>/checkpoints/best.pb), or "
          "the path of any TensorSet file.");
ABSL_FLAG(std::string, shard_state_dirs, "",
          "A sharded job: the --state_dir of each of its parameter shards, comma-separated, "
          "in any order; their final weights (jobs/<job_id>/weights.pb) are joined.");
ABSL_FLAG(std::string, out, "", "File to write. Required.");
ABSL_FLAG(std::string, format, "torchscript", "torchscript or tensors.");
ABSL_FLAG(std::string, input_shape, "",
          "Shape of one input sample, comma-separated (e.g. 1,28,28 or 20,6); "
          "empty: as the weights record (else 1,28,28).");
// A string, so that a bad value is our usage error (exit 2), not absl's.
ABSL_FLAG(std::string, num_classes, "",
          "Model outputs; empty: as the weights record (else the first "
          "dimension of the last weight tensor).");
ABSL_FLAG(std::string, model_file, "",
          "TorchScript jobs: the job's .pt, when it is no longer at the path "
          "spec.json names.");

namespace mpilearn::export_model {
namespace {

// Exit codes (common/cli_flags.h RunToolMain): 0 ok, 1 error, 2 usage.

constexpr char kUsage[] =
    "MPI Learn export: write a job's trained model as a TorchScript file.\n"
    "\n"
    "Usage: mpilearn-export --state_dir DIR --job_id JOB --out FILE\n"
    "           [--weights final|best|PATH] [--format torchscript|tensors]\n"
    "           [--input_shape D1,D2,...] [--num_classes N]\n"
    "           [--model_file PATH] [--shard_state_dirs D1,D2,...]\n"
    "\n"
    "Flags:\n"
    "  --state_dir DIR     the master's --state_dir (required)\n"
    "  --job_id JOB        job whose DIR/jobs/JOB/spec.json describes the\n"
    "                      model (required)\n"
    "  --weights W         final: DIR/jobs/JOB/weights.pb (default);\n"
    "                      best: DIR/jobs/JOB/checkpoints/best.pb; anything else is the\n"
    "                      path of a TensorSet file (write ./final for a\n"
    "                      file named 'final')\n"
    "  --out FILE          file to write (required); FILE.spec.json gets the\n"
    "                      job's spec\n"
    "  --format F          torchscript (default): the model with its trained\n"
    "                      parameters and buffers, in eval mode;\n"
    "                      tensors: a LibTorch archive of named tensors\n"
    "  --input_shape S     built-in models: one input sample's shape, any\n"
    "                      rank (1,28,28 or 20,6); default: as recorded in\n"
    "                      the weights, else 1,28,28\n"
    "  --num_classes N     built-in models: the model's outputs; default: as\n"
    "                      recorded in the weights, else the first dimension\n"
    "                      of the last weight tensor\n"
    "  --model_file PATH   TorchScript jobs: the job's .pt when it is no\n"
    "                      longer at the path spec.json names\n"
    "  --shard_state_dirs D1,D2,...\n"
    "                      a sharded job: every parameter shard's --state_dir;\n"
    "                      the slices of their final weights are joined\n"
    "\n"
    "Example:\n"
    "  mpilearn-export --state_dir /var/lib/mpilearn --job_id job-000042 \\\n"
    "      --out model.pt\n"
    "\n"
    "Loading --format torchscript in Python (no MPI Learn code needed):\n"
    "  import torch\n"
    "  m = torch.jit.load(\"model.pt\"); m.eval(); m(x)  # x: [B, *sample]\n"
    "\n"
    "Loading --format torchscript in C++ (LibTorch):\n"
    "  torch::jit::Module m = torch::jit::load(\"model.pt\");\n"
    "  m.eval();\n"
    "  torch::Tensor y = m.forward({x}).toTensor();\n"
    "\n"
    "Loading --format tensors (C++; keys are the parameter names):\n"
    "  torch::serialize::InputArchive archive;\n"
    "  archive.load_from(\"model.pt\");\n"
    "  torch::Tensor w;\n"
    "  archive.read(\"fc1.weight\", w);\n"
    "\n"
    "Exit codes: 0 ok, 1 a file cannot be read or written or the weights do\n"
    "not fit the job's model, 2 usage error.";

enum class Format { kTorchScript, kTensors };

// One export, read from the flags by main().
struct Options {
  std::string state_dir;
  std::string job_id;
  // "final", "best", or a TensorSet file's path.
  std::string weights = "final";
  std::string out;
  Format format = Format::kTorchScript;
  // One input sample, all dimensions positive; empty: from the weights
  // header, else {1, 28, 28}.
  std::vector<int64_t> input_shape;
  // 0: from the weights header, else inferred from the weights.
  int64_t num_classes = 0;
  // TorchScript jobs: overrides spec.model().torchscript() when set.
  std::string model_file;
  // A sharded job: its shards' state directories.
  std::vector<std::string> shard_state_dirs;
};


bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Reads a weights file (weights.pb or any file holding one serialized
// mpilearn.v1.TensorSet, or a checkpoint) and decodes its fp32 tensors.
absl::StatusOr<Float32Tensors> ReadWeightsFile(const std::string& path) {
  // A checkpoint (best.pb, checkpoints/ckpt-*.pb) is checksum-verified.
  absl::StatusOr<v1::JobCheckpointFile> file =
      ReadWeightsOrCheckpointFile(path, std::numeric_limits<uint64_t>::max());
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("weights file: ", file.status().message()));
  }
  absl::StatusOr<Float32Tensors> tensors = FromTensorSet(file->weights());
  if (!tensors.ok()) {
    return absl::DataLossError(absl::StrCat("weights file '", path,
                                            "': ", tensors.status().message()));
  }
  if (tensors->header.tensors().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights file '", path, "' holds no tensors"));
  }
  return tensors;
}

// The weights file --weights names for the job in `job_dir`.
absl::StatusOr<std::string> WeightsPath(const Options& options,
                                        const std::string& job_dir) {
  if (options.weights == "final") {
    const std::string path = absl::StrCat(job_dir, "/weights.pb");
    if (!Exists(path)) {
      return absl::NotFoundError(
          absl::StrCat("job '", options.job_id, "' has no final weights: '",
                       path, "' does not exist (has the job finished?)"));
    }
    return path;
  }
  if (options.weights == "best") {
    const std::string path = absl::StrCat(job_dir, "/checkpoints/best.pb");
    if (!Exists(path)) {
      return absl::NotFoundError(absl::StrCat(
          "job '", options.job_id, "' has no best weights: '", path,
          "' does not exist (the job kept no best checkpoint); use --weights "
          "final for its final weights"));
    }
    return path;
  }
  return options.weights;
}

// The final weights of job `job_id` on each shard, slices named
// "NAME[BEGIN:END]".
absl::StatusOr<std::vector<Float32Tensors>> ReadShardSlices(const Options& options) {
  if (options.weights != "final") {
    return absl::InvalidArgumentError(
        "with --shard_state_dirs the export joins the shards' final weights; leave --weights "
        "at final (a shard keeps no best checkpoint of its slice)");
  }
  std::vector<Float32Tensors> slices;
  for (const std::string& dir : options.shard_state_dirs) {
    const std::string path = absl::StrCat(dir, "/jobs/", options.job_id, "/weights.pb");
    if (!Exists(path)) {
      return absl::NotFoundError(absl::StrCat(
          "shard state directory '", dir, "' has no final weights of job '", options.job_id,
          "': '", path, "' does not exist (is it one of the job's shards, and has the job "
          "ended?)"));
    }
    MPILEARN_ASSIGN_OR_RETURN(Float32Tensors slice, ReadWeightsFile(path));
    slices.push_back(std::move(slice));
  }
  return slices;
}

// The whole weights of `model` from the shards' `slices`: each slice
// tensor's range copied into its tensor; an error names a slice that fits
// no tensor, an element held twice, or one held by none.
absl::StatusOr<Float32Tensors> JoinSlices(const std::vector<Float32Tensors>& slices,
                                          const worker::Model& model) {
  const std::vector<std::string>& names = model.state_names();
  std::vector<std::vector<int64_t>> shapes;
  Float32Tensors whole;
  std::vector<std::vector<char>> covered;
  for (const torch::Tensor& t : model.state()) {
    shapes.push_back(t.sizes().vec());
    whole.values.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
    covered.emplace_back(static_cast<size_t>(t.numel()), 0);
  }
  whole.header = MakeFloat32Header(0, names, shapes);
  whole.header.mutable_input_shape()->CopyFrom(slices.front().header.input_shape());
  whole.header.set_outputs(slices.front().header.outputs());
  whole.header.mutable_inputs()->CopyFrom(slices.front().header.inputs());
  for (const Float32Tensors& slice : slices) {
    whole.header.set_version(whole.header.version() + slice.header.version());
    for (int i = 0; i < slice.header.tensors_size(); ++i) {
      const v1::TensorInfo& info = slice.header.tensors(i);
      std::string name;
      int64_t begin = 0, end = 0;
      if (!shard::ParseSliceName(info.name(), &name, &begin, &end)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", info.name(), "' in a shard's weights is not a slice (NAME[BEGIN:END]): is "
            "every --shard_state_dirs a shard's state directory?"));
      }
      const auto at = std::find(names.begin(), names.end(), name);
      const size_t t = static_cast<size_t>(at - names.begin());
      if (at == names.end() || end > static_cast<int64_t>(whole.values[t].size()) ||
          static_cast<int64_t>(slice.values[static_cast<size_t>(i)].size()) != end - begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the shards' slice '", info.name(), "' fits no tensor of the job's model"));
      }
      whole.header.mutable_tensors(static_cast<int>(t))->set_buffer(info.buffer());
      for (int64_t e = begin; e < end; ++e) {
        if (covered[t][static_cast<size_t>(e)]++ != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "element ", e, " of '", name, "' is in two shards' slices: are two of the "
              "directories copies of one shard?"));
        }
        whole.values[t][static_cast<size_t>(e)] =
            slice.values[static_cast<size_t>(i)][static_cast<size_t>(e - begin)];
      }
    }
  }
  for (size_t t = 0; t < covered.size(); ++t) {
    const auto gap = std::find(covered[t].begin(), covered[t].end(), 0);
    if (gap != covered[t].end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "element ", gap - covered[t].begin(), " of '", names[t],
          "' is in no shard's slice: give the state directory of every shard of the job (",
          slices.size(), " given)"));
    }
  }
  return whole;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The job's model, rebuilt to take the trained weights, and how it was
// rebuilt (for messages and the summary).
struct RebuiltModel {
  worker::Model model;
  // For the summary: the built-in model's name or "torchscript PATH".
  std::string name;
  // "the model built from spec.json" or "the TorchScript model 'PATH'".
  std::string what;
  // Appended to weights mismatch messages: which inputs built the model.
  std::string hint;
  // One sample's shape and the outputs, as far as known (empty / 0 when a
  // TorchScript job's weights do not record them).
  std::vector<int64_t> input_shape;
  int64_t outputs = 0;
};

// The last trained parameter in `header` (buffers follow the parameters),
// or the last tensor when none is marked.
const v1::TensorInfo& LastParameter(const v1::TensorSetHeader& header) {
  for (int i = header.tensors_size() - 1; i >= 0; --i) {
    if (!header.tensors(i).buffer()) return header.tensors(i);
  }
  return header.tensors(header.tensors_size() - 1);
}

// Loads a TorchScript job's module: --model_file, else the spec's path.
absl::StatusOr<RebuiltModel> LoadTorchScriptModel(
    const v1::JobSpec& spec, const v1::TensorSetHeader& header,
    const Options& options) {
  const bool from_flag = !options.model_file.empty();
  const std::string path =
      from_flag ? options.model_file : spec.model().torchscript();
  absl::StatusOr<worker::Model> loaded = worker::Model::Load(path);
  if (absl::IsNotFound(loaded.status())) {
    if (from_flag) {
      return absl::NotFoundError(absl::StrCat(
          "--model_file '", path, "' does not exist or is not a file"));
    }
    return absl::NotFoundError(absl::StrCat(
        "the job's TorchScript model '", path,
        "' (spec.json model.torchscript) does not exist or is not a file; "
        "if it has moved, pass --model_file with its current path"));
  }
  if (!loaded.ok()) {
    return absl::Status(
        loaded.status().code(),
        absl::StrCat("cannot load the job's TorchScript model: ",
                     loaded.status().message()));
  }
  RebuiltModel rebuilt{*std::move(loaded), absl::StrCat("torchscript ", path),
                       absl::StrCat("the TorchScript model '", path, "'"),
                       from_flag ? " (is --model_file the .pt the job "
                                   "trained?)"
                                 : " (if the job's .pt has changed since it "
                                   "trained, pass the original with "
                                   "--model_file)",
                       {}, 0};
  rebuilt.input_shape.assign(header.input_shape().begin(),
                             header.input_shape().end());
  rebuilt.outputs = header.outputs();
  return rebuilt;
}

// Builds a built-in job's model for the input shape and outputs the flags,
// else the weights header, else the defaults give.
absl::StatusOr<RebuiltModel> BuildBuiltinModel(
    const v1::JobSpec& spec, const v1::TensorSetHeader& header,
    const Options& options) {
  std::vector<int64_t> input_shape = options.input_shape;
  std::string shape_source = "--input_shape";
  if (input_shape.empty() && !header.input_shape().empty()) {
    input_shape.assign(header.input_shape().begin(), header.input_shape().end());
    shape_source = "the weights";
  }
  if (input_shape.empty()) {
    input_shape = {1, 28, 28};
    shape_source = "the default; pass --input_shape";
  }
  int64_t outputs = options.num_classes;
  std::string outputs_source = "--num_classes";
  if (outputs == 0 && header.outputs() > 0) {
    outputs = header.outputs();
    outputs_source = "the weights";
  }
  if (outputs == 0) {
    const v1::TensorInfo& last = LastParameter(header);
    if (last.shape().empty() || last.shape(0) <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot infer the model's outputs from weights tensor '",
          last.name(), "' of shape ", ShapeString(last.shape()),
          "; pass --num_classes"));
    }
    outputs = last.shape(0);
    outputs_source = absl::StrCat("tensor '", last.name(), "'");
  }
  // A model of several inputs: each one's shape, from the weights.
  std::vector<std::vector<int64_t>> inputs;
  for (const v1::InputShape& input : header.inputs()) {
    inputs.emplace_back(input.dims().begin(), input.dims().end());
  }
  absl::StatusOr<worker::Model> built =
      worker::Model::Build(spec.model(), input_shape, outputs, inputs);
  if (!built.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot build the model spec.json describes for inputs ",
                     ShapeString(input_shape), " and ", outputs,
                     " outputs: ", built.status().message()));
  }
  return RebuiltModel{
      *std::move(built), spec.model().name(), "the model built from spec.json",
      absl::StrCat(" (the model follows spec.json's model section, input "
                   "shape ",
                   ShapeString(input_shape), " from ", shape_source, " and ",
                   outputs, " outputs from ", outputs_source, ")"),
      input_shape, outputs};
}

// Checks that `weights` holds exactly the state of `rebuilt.model`: same
// count, and the same name and shape at each position. The message names
// the first mismatch.
absl::Status CheckWeightsFitModel(const RebuiltModel& rebuilt,
                                  const v1::TensorSetHeader& weights) {
  const std::vector<std::string>& names = rebuilt.model.state_names();
  const std::vector<torch::Tensor>& state = rebuilt.model.state();
  const std::string& hint = rebuilt.hint;
  const size_t common =
      std::min(names.size(), static_cast<size_t>(weights.tensors_size()));
  for (size_t i = 0; i < common; ++i) {
    const v1::TensorInfo& info = weights.tensors(static_cast<int>(i));
    if (info.name() != names[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights tensor ", i, " is '", info.name(), "' but ",
                       rebuilt.what, " has '", names[i], "' there", hint));
    }
    const std::vector<int64_t> want = state[i].sizes().vec();
    if (!std::equal(info.shape().begin(), info.shape().end(), want.begin(),
                    want.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights tensor '", info.name(), "' has shape ",
          ShapeString(info.shape()), " but ", rebuilt.what, " has ",
          ShapeString(want), hint));
    }
  }
  if (names.size() > common) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights have ", weights.tensors_size(), " tensors but ",
        rebuilt.what, " has ", names.size(), "; the weights lack '",
        names[common], "'", hint));
  }
  if (static_cast<size_t>(weights.tensors_size()) > common) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights have ", weights.tensors_size(), " tensors but ",
        rebuilt.what, " has ", names.size(), "; the model has no '",
        weights.tensors(static_cast<int>(common)).name(), "'", hint));
  }
  return absl::OkStatus();
}

// Writes through `write(tmp)` to `path + ".tmp"`, then renames it to `path`,
// so `path` is never left half written.
template <typename WriteFn>
absl::Status WriteAtomically(const std::string& path, WriteFn write) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  absl::Status status = write(tmp);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(absl::StrCat(
        "cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
  }
  if (!status.ok()) std::remove(tmp.c_str());
  return status;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  return WriteAtomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", tmp, "': ", std::strerror(errno)));
    }
    out << text;
    out.close();
    if (!out) {
      return absl::DataLossError(absl::StrCat("error writing '", tmp, "'"));
    }
    return absl::OkStatus();
  });
}

// Runs `save(tmp)` (returning absl::Status) through WriteAtomically; a
// LibTorch serializer's exceptions become errors too.
template <typename SaveFn>
absl::Status WriteTorchFile(const std::string& path, SaveFn save) {
  return WriteAtomically(path, [&](const std::string& tmp) {
    // LibTorch's own message for an unwritable path is obscure: try first.
    if (!std::ofstream(tmp, std::ios::binary | std::ios::trunc)) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", tmp, "': ", std::strerror(errno)));
    }
    try {
      MPILEARN_RETURN_IF_ERROR(save(tmp));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat(
          "cannot write '", tmp, "': ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("cannot write '", tmp, "': ", e.what()));
    }
    return absl::OkStatus();
  });
}

// The export itself; see the file comment. Prints one summary line on
// success.
absl::Status Export(Options options) {
  if (!IsDirectory(options.state_dir)) {
    return absl::NotFoundError(absl::StrCat(
        "state directory '", options.state_dir, "' does not exist"));
  }
  const std::string job_dir =
      absl::StrCat(options.state_dir, "/jobs/", options.job_id);
  if (!IsDirectory(job_dir)) {
    return absl::NotFoundError(absl::StrCat(
        "job '", options.job_id, "' not found: '", job_dir,
        "' does not exist (is --state_dir the master's --state_dir?)"));
  }
  MPILEARN_ASSIGN_OR_RETURN(
      const v1::JobSpec spec,
      ReadJobSpecFile(absl::StrCat(job_dir, "/spec.json")));
  const bool sharded = !options.shard_state_dirs.empty();
  std::vector<Float32Tensors> slices;
  std::string weights_path;
  Float32Tensors weights;
  if (sharded) {
    MPILEARN_ASSIGN_OR_RETURN(slices, ReadShardSlices(options));
    // The slices carry the job's input shape and outputs in their headers.
    weights.header = slices.front().header;
    weights_path = absl::StrCat(slices.size(), " shards' final weights");
  } else {
    MPILEARN_ASSIGN_OR_RETURN(weights_path, WeightsPath(options, job_dir));
    MPILEARN_ASSIGN_OR_RETURN(weights, ReadWeightsFile(weights_path));
  }

  const bool torchscript = !spec.model().torchscript().empty();
  if (!torchscript && !options.model_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model_file is for jobs that train a TorchScript model; job '",
        options.job_id, "' trains the built-in model '", spec.model().name(),
        "'"));
  }
  MPILEARN_ASSIGN_OR_RETURN(
      RebuiltModel rebuilt,
      torchscript ? LoadTorchScriptModel(spec, weights.header, options)
                  : BuildBuiltinModel(spec, weights.header, options));
  if (sharded) {
    MPILEARN_ASSIGN_OR_RETURN(weights, JoinSlices(slices, rebuilt.model));
  }
  MPILEARN_RETURN_IF_ERROR(CheckWeightsFitModel(rebuilt, weights.header));
  worker::Model& model = rebuilt.model;
  const std::vector<absl::Span<const float>> views(weights.values.begin(),
                                                   weights.values.end());
  MPILEARN_RETURN_IF_ERROR(model.SetState(views));
  model.SetTraining(false);

  if (options.format == Format::kTorchScript) {
    MPILEARN_RETURN_IF_ERROR(WriteTorchFile(
        options.out,
        [&](const std::string& path) { return model.Save(path); }));
  } else {
    MPILEARN_RETURN_IF_ERROR(
        WriteTorchFile(options.out, [&](const std::string& path) {
          torch::serialize::OutputArchive archive;
          for (size_t i = 0; i < model.state().size(); ++i) {
            archive.write(model.state_names()[i], model.state()[i].detach());
          }
          archive.save_to(path);
          return absl::OkStatus();
        }));
  }
  const std::string spec_path = absl::StrCat(options.out, ".spec.json");
  MPILEARN_RETURN_IF_ERROR(WriteText(spec_path, JobSpecToJson(spec)));

  std::vector<std::string> input_dims = {"B"};
  for (int64_t d : rebuilt.input_shape) input_dims.push_back(absl::StrCat(d));
  absl::PrintF(
      "wrote %s (%s, %d tensors, %d parameters, from %s) and %s; model "
      "'%s' for inputs %s and %s outputs\n",
      options.out,
      options.format == Format::kTorchScript ? "torchscript" : "tensors",
      model.state().size(), model.ParameterCount(), weights_path, spec_path,
      rebuilt.name,
      rebuilt.input_shape.empty()
          ? std::string("of the job's sample shape")
          : absl::StrCat("[", absl::StrJoin(input_dims, ", "), "]"),
      rebuilt.outputs > 0 ? absl::StrCat(rebuilt.outputs)
                          : std::string("the model's"));
  return absl::OkStatus();
}


// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.weights = absl::GetFlag(FLAGS_weights);
  options.out = absl::GetFlag(FLAGS_out);
  if (options.state_dir.empty()) {
    return absl::InvalidArgumentError("--state_dir is required");
  }
  if (options.job_id.empty()) {
    return absl::InvalidArgumentError("--job_id is required");
  }
  if (absl::StrContains(options.job_id, '/') || options.job_id == "." ||
      options.job_id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("--job_id must be a job id such as job-000042, got '",
                     options.job_id, "'"));
  }
  if (options.weights.empty()) {
    return absl::InvalidArgumentError(
        "--weights must be final, best or a file path");
  }
  if (options.out.empty())
    return absl::InvalidArgumentError("--out is required");

  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "torchscript") {
    options.format = Format::kTorchScript;
  } else if (format == "tensors") {
    options.format = Format::kTensors;
  } else if (format == "libtorch") {
    return absl::InvalidArgumentError(
        "--format libtorch is no longer written: every model now exports as "
        "TorchScript, which torch.jit.load (Python) and torch::jit::load "
        "(C++) read; use --format torchscript (the default)");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format must be torchscript or tensors, got '", format, "'"));
  }

  const std::string shape = absl::GetFlag(FLAGS_input_shape);
  if (!shape.empty()) {
    for (absl::string_view dim : absl::StrSplit(shape, ',')) {
      int64_t value = 0;
      if (!absl::SimpleAtoi(dim, &value) || value <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--input_shape must be positive integers separated by commas "
            "(e.g. 1,28,28 or 20,6), got '",
            shape, "'"));
      }
      options.input_shape.push_back(value);
    }
  }
  options.model_file = absl::GetFlag(FLAGS_model_file);
  for (absl::string_view dir :
       absl::StrSplit(absl::GetFlag(FLAGS_shard_state_dirs), ',', absl::SkipEmpty())) {
    options.shard_state_dirs.emplace_back(dir);
  }

  const std::string classes = absl::GetFlag(FLAGS_num_classes);
  if (!classes.empty() && (!absl::SimpleAtoi(classes, &options.num_classes) ||
                           options.num_classes <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_classes must be a positive integer, got '", classes, "'"));
  }
  return options;
}

}  // namespace
}  // namespace mpilearn::export_model

int main(int argc, char** argv) {
  namespace ex = mpilearn::export_model;
  absl::StatusOr<ex::Options> options;
  mpilearn::ToolMain tool;
  tool.name = "mpilearn-export";
  tool.usage = ex::kUsage;
  tool.flags_source = "tools/cli/export_model.cc";
  tool.read_flags = [&] {
    options = ex::OptionsFromFlags();
    return options.status();
  };
  tool.run = [&] { return ex::Export(*std::move(options)); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
