// make_synthetic_data: the command line of GenerateSyntheticData
// (tools/data/synthetic_data.h): writes gzip'd IDX data sets with a known
// answer, for trying and benchmarking models that Fashion-MNIST does not
// exercise (regression heads, sequence models, 3-channel CNNs).
//
//   make_synthetic_data --kind regression --out_dir /tmp/reg --seed 1
//
// Exit codes: 0 ok, 1 a file cannot be written, 2 usage error.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cli_flags.h"
#include "tools/data/synthetic_data.h"

ABSL_FLAG(std::string, kind, "",
          "regression, sequences or images32 (see --help). Required.");
ABSL_FLAG(std::string, out_dir, "",
          "Directory to write the files into; created if missing (its parent "
          "must exist). Required.");
ABSL_FLAG(uint64_t, seed, 1, "Random seed; the same seed gives the same files.");
ABSL_FLAG(int64_t, train, 0,
          "Training samples (0: the kind's default, see --help).");
ABSL_FLAG(int64_t, test, 0, "Test samples (0: the kind's default).");
ABSL_FLAG(double, noise, 0.01,
          "regression: standard deviation of the Gaussian noise on each "
          "target, >= 0.");

namespace mpilearn {
namespace synthetic_data {
namespace {

// Exit codes (common/cli_flags.h RunToolMain): 0 ok, 1 error, 2 usage.

// Samples per split at most: images32 at this size is about 6 GiB.
constexpr int64_t kMaxSamples = 2'000'000;

constexpr char kUsage[] =
    "make_synthetic_data: write gzip'd IDX data sets with a known answer.\n"
    "\n"
    "Usage: make_synthetic_data --kind regression|sequences|images32|jets\n"
    "           --out_dir DIR [--seed N] [--train N] [--test N] [--noise S]\n"
    "\n"
    "  regression  features float32 [N, 8] uniform in [-1, 1]; targets\n"
    "              float32 [N, 2]: y0 = w.x + 0.5, y1 = sin(pi x0) x1, plus\n"
    "              Gaussian noise (--noise, default 0.01). Default 10000\n"
    "              train, 2000 test.\n"
    "  sequences   features float32 [N, 20, 6] (particle sequences), labels\n"
    "              unsigned byte [N] in 5 classes told apart by a trend and\n"
    "              an oscillation frequency along the sequence. Default 20000\n"
    "              train, 5000 test.\n"
    "  images32    images unsigned byte [N, 3, 32, 32], labels in 10\n"
    "              classes, each a coloured pattern with noise (a CIFAR-10\n"
    "              stand-in). Default 50000 train, 10000 test.\n"
    "  jets        HDF5, two inputs and two outputs: datasets jets float32\n"
    "              [N, 4] and tracks float32 [N, 8, 3] uniform in [-1, 1];\n"
    "              kind unsigned byte [N] in 3 classes (a = jets0 + mean\n"
    "              track0, b = jets1 - mean track1: 0 when a >= b, a >= 0.2;\n"
    "              1 when b > a, b >= 0.2; else 2) and energy float32 [N] =\n"
    "              2 jets2 jets3 + mean track2 + noise (--noise). Default\n"
    "              20000 train, 5000 test.\n"
    "\n"
    "Files: DIR/{train,test}-features.idx.gz and\n"
    "DIR/{train,test}-targets.idx.gz (regression) or\n"
    "DIR/{train,test}-labels.idx.gz; DIR/{train,test}.h5 for jets. The\n"
    "generation rules are documented in\n"
    "docs/examples/README-data.md.\n"
    "\n"
    "Flags:\n"
    "  --kind      regression, sequences, images32 or jets. Required.\n"
    "  --out_dir   directory for the files (created if missing). Required.\n"
    "  --seed      random seed (default 1).\n"
    "  --train     training samples (default: per kind, above).\n"
    "  --test      test samples (default: per kind, above).\n"
    "  --noise     regression, jets: target noise deviation (default 0.01).\n"
    "\n"
    "Exit codes: 0 ok, 1 a file cannot be written, 2 usage error.";

// Reads and checks the flags.
absl::StatusOr<SyntheticDataOptions> OptionsFromFlags() {
  SyntheticDataOptions options;
  const std::string kind = absl::GetFlag(FLAGS_kind);
  int64_t default_train = 0, default_test = 0;
  if (kind == "regression") {
    options.kind = SyntheticKind::kRegression;
    default_train = 10000;
    default_test = 2000;
  } else if (kind == "sequences") {
    options.kind = SyntheticKind::kSequences;
    default_train = 20000;
    default_test = 5000;
  } else if (kind == "images32") {
    options.kind = SyntheticKind::kImages32;
    default_train = 50000;
    default_test = 10000;
  } else if (kind == "jets") {
    options.kind = SyntheticKind::kJets;
    default_train = 20000;
    default_test = 5000;
  } else if (kind.empty()) {
    return absl::InvalidArgumentError(
        "--kind is required: regression, sequences, images32 or jets");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kind must be regression, sequences, images32 or jets, got '", kind, "'"));
  }
  options.out_dir = absl::GetFlag(FLAGS_out_dir);
  if (options.out_dir.empty()) {
    return absl::InvalidArgumentError("--out_dir is required");
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  options.train = absl::GetFlag(FLAGS_train);
  options.test = absl::GetFlag(FLAGS_test);
  for (const auto& [name, value] :
       {std::make_pair("--train", &options.train),
        std::make_pair("--test", &options.test)}) {
    if (*value < 0 || *value > kMaxSamples) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be in [0, ", kMaxSamples, "], got ", *value));
    }
  }
  if (options.train == 0) options.train = default_train;
  if (options.test == 0) options.test = default_test;
  options.noise = absl::GetFlag(FLAGS_noise);
  if (!(options.noise >= 0) || !std::isfinite(options.noise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--noise must be finite and >= 0, got ", options.noise));
  }
  return options;
}

}  // namespace
}  // namespace synthetic_data
}  // namespace mpilearn

int main(int argc, char** argv) {
  namespace sd = mpilearn::synthetic_data;
  absl::StatusOr<sd::SyntheticDataOptions> options;
  mpilearn::ToolMain tool;
  tool.name = "make_synthetic_data";
  tool.usage = sd::kUsage;
  tool.flags_source = "tools/data/make_synthetic_data.cc";
  tool.read_flags = [&] {
    options = sd::OptionsFromFlags();
    return options.status();
  };
  tool.run = [&] { return sd::GenerateSyntheticData(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
