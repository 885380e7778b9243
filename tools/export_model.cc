// mpilearn-export: turns a job's trained weights into a LibTorch file that a
// program outside MPI Learn can load.
//
//   mpilearn-export --state_dir /var/lib/mpilearn --job_id job-000042
//       --out model.pt
//
// writes model.pt and model.pt.spec.json (the job's normalized spec). The
// default format (--format libtorch) is what torch::save(model, path) writes
// for the torch::nn::Sequential that worker/model.h's BuildModel returns, so a
// user rebuilds the same architecture and loads the weights into it:
//
//   auto spec = *mpilearn::ReadJobSpecFile("model.pt.spec.json");
//   torch::nn::Sequential model = *mpilearn::worker::BuildModel(
//       spec.model(), /*channels=*/1, /*height=*/28, /*width=*/28, 10);
//   torch::load(model, "model.pt");
//   model->eval();  // logits = model->forward(images), images [B, 1, 28, 28]
//
// The channels, height, width and classes must be those the export used; the
// tool prints them. The file holds weights only, keyed by layer name (fc1,
// out, ...), so any Sequential with the same named layers loads it as well.
//
// --format tensors writes a LibTorch archive of named tensors instead, one
// entry per parameter ("fc1.weight", ...), read with
// torch::serialize::InputArchive (see kUsage). It needs no model code.
//
// Exit codes: 0 ok, 1 a file cannot be read or written or the weights do not
// fit the model spec.json describes, 2 usage error. main() only parses flags;
// Export() does the work.
//
// Over ~500 lines because it is a whole command-line tool (flags, state
// directory lookup, checkpoint selection, two output formats, model
// rebuilding) with no logic shared elsewhere; the checkpoint file format
// itself lives in common/checkpoint_file.h.
#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
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
#include "common/checkpoint_file.h"
#include "common/cli_flags.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "worker/model.h"

ABSL_FLAG(std::string, state_dir, "",
          "The master's --state_dir (holds jobs/<job_id>/). Required.");
ABSL_FLAG(std::string, job_id, "",
          "The job to export, e.g. job-000042. "
          "Required.");
ABSL_FLAG(std::string, weights, "final",
          "final (jobs/<job_id>/weights.pb), best (jobs/<job_id>/checkpoints/best.pb), or "
          "the path of any TensorSet file.");
ABSL_FLAG(std::string, out, "", "File to write. Required.");
ABSL_FLAG(std::string, format, "libtorch", "libtorch or tensors.");
ABSL_FLAG(std::string, input_shape, "1,28,28",
          "C,H,W of one input image, as the job trained on.");
// A string, so that a bad value is our usage error (exit 2), not absl's.
ABSL_FLAG(std::string, num_classes, "",
          "Model outputs; empty infers them from the last weight tensor.");

namespace mpilearn::export_model {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // I/O error or weights that do not fit
constexpr int kExitUsage = 2;  // bad arguments

constexpr char kUsage[] =
    "MPI Learn export: write a job's trained weights as a LibTorch file.\n"
    "\n"
    "Usage: mpilearn-export --state_dir DIR --job_id JOB --out FILE\n"
    "           [--weights final|best|PATH] [--format libtorch|tensors]\n"
    "           [--input_shape C,H,W] [--num_classes N]\n"
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
    "  --format F          libtorch (default): torch::save of the model;\n"
    "                      tensors: a LibTorch archive of named tensors\n"
    "  --input_shape C,H,W one input image as the job trained on it\n"
    "                      (default 1,28,28)\n"
    "  --num_classes N     model outputs (default: the first dimension of\n"
    "                      the last weight tensor)\n"
    "\n"
    "Example:\n"
    "  mpilearn-export --state_dir /var/lib/mpilearn --job_id job-000042 \\\n"
    "      --out model.pt\n"
    "\n"
    "Loading --format libtorch (C++; the same spec, shape and classes):\n"
    "  auto spec = *mpilearn::ReadJobSpecFile(\"model.pt.spec.json\");\n"
    "  torch::nn::Sequential model = *mpilearn::worker::BuildModel(\n"
    "      spec.model(), /*C=*/1, /*H=*/28, /*W=*/28, /*classes=*/10);\n"
    "  torch::load(model, \"model.pt\");\n"
    "  model->eval();  // then model->forward(images [B, C, H, W])\n"
    "\n"
    "Loading --format tensors (C++; keys are the parameter names):\n"
    "  torch::serialize::InputArchive archive;\n"
    "  archive.load_from(\"model.pt\");\n"
    "  torch::Tensor w;\n"
    "  archive.read(\"fc1.weight\", w);\n"
    "\n"
    "Exit codes: 0 ok, 1 a file cannot be read or written or the weights do\n"
    "not fit the model spec.json describes, 2 usage error.";

enum class Format { kLibTorch, kTensors };

// One export, read from the flags by main().
struct Options {
  std::string state_dir;
  std::string job_id;
  // "final", "best", or a TensorSet file's path.
  std::string weights = "final";
  std::string out;
  Format format = Format::kLibTorch;
  // One input image: channels, height, width; all positive.
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  // 0: inferred from the weights.
  int64_t num_classes = 0;
};

int UsageError(absl::string_view message) {
  absl::FPrintF(stderr, "mpilearn-export: %s\nTry 'mpilearn-export --help'.\n",
                message);
  return kExitUsage;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path,
                                            "': ", std::strerror(errno)));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("error reading ", what, " '", path, "'"));
  }
  return contents.str();
}

// Reads a TensorSet file (weights.pb or any file holding one serialized
// mpilearn.v1.TensorSet) and decodes its fp32 tensors. The one place that
// knows the weight file format.
absl::StatusOr<Float32Tensors> ReadWeightsFile(const std::string& path) {
  MPILEARN_ASSIGN_OR_RETURN(const std::string bytes,
                            ReadFile(path, "weights file"));
  v1::TensorSet set;
  if (absl::EndsWith(bytes, kCheckpointMagic)) {
    // A checkpoint (best.pb, checkpoints/ckpt-*.pb): checksum-verified.
    MPILEARN_ASSIGN_OR_RETURN(v1::JobCheckpointFile checkpoint,
                              DecodeCheckpoint(bytes, path));
    set = checkpoint.weights();
  } else if (!set.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(
        "weights file '", path,
        "' is neither a serialized mpilearn.v1.TensorSet nor a checkpoint "
        "(corrupt or another format)"));
  }
  absl::StatusOr<Float32Tensors> tensors = FromTensorSet(set);
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

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Checks that `weights` holds exactly the parameters of `model`: same count,
// and the same name and shape at each position. The message names the first
// mismatch.
absl::Status CheckWeightsFitModel(const torch::nn::Sequential& model,
                                  const v1::TensorSetHeader& weights,
                                  const Options& options) {
  const std::vector<std::string> names = worker::ModelParameterNames(model);
  const std::vector<torch::Tensor> params = worker::ModelParameters(model);
  const std::string hint = absl::StrCat(
      " (the model follows spec.json's model section, --input_shape ",
      options.channels, ",", options.height, ",", options.width,
      " and --num_classes ", options.num_classes, ")");
  const size_t common =
      std::min(names.size(), static_cast<size_t>(weights.tensors_size()));
  for (size_t i = 0; i < common; ++i) {
    const v1::TensorInfo& info = weights.tensors(static_cast<int>(i));
    if (info.name() != names[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights tensor ", i, " is '", info.name(),
                       "' but the model built from spec.json has '", names[i],
                       "' there", hint));
    }
    const std::vector<int64_t> want = params[i].sizes().vec();
    if (!std::equal(info.shape().begin(), info.shape().end(), want.begin(),
                    want.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights tensor '", info.name(), "' has shape ",
          ShapeString(info.shape()), " but the model built from spec.json has ",
          ShapeString(want), hint));
    }
  }
  if (names.size() > common) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights have ", weights.tensors_size(),
        " tensors but the model built from spec.json has ", names.size(),
        "; the weights lack '", names[common], "'", hint));
  }
  if (static_cast<size_t>(weights.tensors_size()) > common) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weights have ", weights.tensors_size(),
        " tensors but the model built from spec.json has ", names.size(),
        "; the model has no '",
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

// Runs a LibTorch serializer, which reports errors by throwing.
template <typename SaveFn>
absl::Status WriteTorchFile(const std::string& path, SaveFn save) {
  return WriteAtomically(path, [&](const std::string& tmp) {
    // LibTorch's own message for an unwritable path is obscure: try first.
    if (!std::ofstream(tmp, std::ios::binary | std::ios::trunc)) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", tmp, "': ", std::strerror(errno)));
    }
    try {
      save(tmp);
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
  MPILEARN_ASSIGN_OR_RETURN(const std::string weights_path,
                            WeightsPath(options, job_dir));
  MPILEARN_ASSIGN_OR_RETURN(const Float32Tensors weights,
                            ReadWeightsFile(weights_path));

  if (options.num_classes == 0) {
    const v1::TensorInfo& last =
        weights.header.tensors(weights.header.tensors_size() - 1);
    if (last.shape().empty() || last.shape(0) <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot infer the number of classes from weights tensor '",
          last.name(), "' of shape ", ShapeString(last.shape()),
          "; pass --num_classes"));
    }
    options.num_classes = last.shape(0);
  }
  absl::StatusOr<torch::nn::Sequential> built =
      worker::BuildModel(spec.model(), options.channels, options.height,
                         options.width, options.num_classes);
  if (!built.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot build the model spec.json describes: ",
                     built.status().message()));
  }
  torch::nn::Sequential model = *std::move(built);
  MPILEARN_RETURN_IF_ERROR(
      CheckWeightsFitModel(model, weights.header, options));

  const std::vector<std::string> names = worker::ModelParameterNames(model);
  std::vector<torch::Tensor> params = worker::ModelParameters(model);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      // from_blob only views the vector; copy_ takes the values into the model.
      params[i].copy_(
          torch::from_blob(const_cast<float*>(weights.values[i].data()),
                           params[i].sizes(), torch::kFloat32));
    }
  }
  model->eval();

  if (options.format == Format::kLibTorch) {
    MPILEARN_RETURN_IF_ERROR(WriteTorchFile(
        options.out,
        [&](const std::string& path) { torch::save(model, path); }));
  } else {
    MPILEARN_RETURN_IF_ERROR(
        WriteTorchFile(options.out, [&](const std::string& path) {
          torch::serialize::OutputArchive archive;
          for (size_t i = 0; i < params.size(); ++i) {
            archive.write(names[i], params[i].detach());
          }
          archive.save_to(path);
        }));
  }
  const std::string spec_path = absl::StrCat(options.out, ".spec.json");
  MPILEARN_RETURN_IF_ERROR(WriteText(spec_path, JobSpecToJson(spec)));

  absl::PrintF(
      "wrote %s (%s, %d tensors, %d parameters, from %s) and %s; model "
      "'%s' for inputs [B, %d, %d, %d] and %d classes\n",
      options.out, options.format == Format::kLibTorch ? "libtorch" : "tensors",
      params.size(), worker::ParameterCount(model), weights_path, spec_path,
      spec.model().name(), options.channels, options.height, options.width,
      options.num_classes);
  return absl::OkStatus();
}


// True when the command line asks for --help (or -h): main prints kUsage,
// which lists every flag, and exits 0.
bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "-h" || arg == "-help" || arg == "--help") return true;
  }
  return false;
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
  if (format == "libtorch") {
    options.format = Format::kLibTorch;
  } else if (format == "tensors") {
    options.format = Format::kTensors;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format must be libtorch or tensors, got '", format, "'"));
  }

  const std::string shape = absl::GetFlag(FLAGS_input_shape);
  const std::vector<absl::string_view> dims = absl::StrSplit(shape, ',');
  int64_t values[3];
  bool valid = dims.size() == 3;
  for (size_t i = 0; valid && i < 3; ++i) {
    valid = absl::SimpleAtoi(dims[i], &values[i]) && values[i] > 0;
  }
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input_shape must be C,H,W with three positive integers (e.g. "
        "1,28,28), got '",
        shape, "'"));
  }
  options.channels = values[0];
  options.height = values[1];
  options.width = values[2];

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
  absl::SetProgramUsageMessage(ex::kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "tools/export_model.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  if (ex::WantsHelp(argc, argv)) {
    absl::PrintF("%s\n", ex::kUsage);
    return ex::kExitOk;
  }
  const std::string undefined = mpilearn::FindUndefinedFlag(argc, argv);
  if (!undefined.empty()) {
    return ex::UsageError(absl::StrCat("unknown flag '", undefined, "'"));
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return ex::UsageError(
        absl::StrCat("unexpected argument '", positional[1], "'"));
  }
  absl::StatusOr<ex::Options> options = ex::OptionsFromFlags();
  if (!options.ok()) return ex::UsageError(options.status().message());
  const absl::Status status = ex::Export(*std::move(options));
  if (!status.ok()) {
    absl::FPrintF(stderr, "mpilearn-export: %s\n", status.message());
    return ex::kExitError;
  }
  return ex::kExitOk;
}
