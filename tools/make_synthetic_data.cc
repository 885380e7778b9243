// make_synthetic_data: writes gzip'd IDX data sets with a known answer, for
// trying and benchmarking models that Fashion-MNIST does not exercise
// (regression heads, sequence models, 3-channel CNNs) with no download.
//
//   make_synthetic_data --kind regression --out_dir /tmp/reg --seed 1
//
// writes <out_dir>/{train,test}-features.idx.gz and, per kind,
// {train,test}-targets.idx.gz (regression) or {train,test}-labels.idx.gz
// (classification), printing one line per file. The same flags give the
// same bytes on every machine: the generator is std::mt19937_64 (whose
// output the C++ standard fixes) seeded by std::seed_seq{seed, split}, with
// this file's own uniform and Gaussian transforms (the standard library's
// distributions differ between implementations). The train and test splits
// use separate streams, so --train does not change the test set.
//
// The kinds, and the rule that makes each learnable:
//
// regression (default 10000 train, 2000 test): features float32 [N, 8], each
//   x_i uniform in [-1, 1]; targets float32 [N, 2]:
//     y0 = sum_i kRegressionWeights[i] * x_i + 0.5 + e0
//          (weights 0.9, -0.7, 0.5, -0.3, 0.2, -0.1, 0.6, -0.4)
//     y1 = sin(pi * x0) * x1 + e1
//   with e0, e1 independent Gaussian noise of standard deviation --noise
//   (default 0.01). The best possible mean squared error over both targets
//   is noise^2; predicting the targets' means scores
//   (sum_i w_i^2 / 3 + 1/6) / 2 + noise^2 = 0.4517 + noise^2. Both are
//   printed.
//
// sequences (default 20000 train, 5000 test): a stand-in for hls4ml-style
//   jet tagging from particle sequences. Features float32 [N, T=20, F=6]
//   (20 particles, 6 features each), labels unsigned byte [N], the class c
//   uniform in 0..4. With s = t / 19 the particle's position in [0, 1]:
//     f0 = 0.5 * (c - 2) * (2s - 1) + N(0, 0.6^2)  a trend whose slope is
//          the class: -1, -0.5, 0, 0.5, 1 over the sequence
//     f1 = sin(2 pi (1 + c / 2) s + phase) + N(0, 0.5^2), phase uniform in
//          [0, 2 pi) per sequence: 1, 1.5, 2, 2.5 or 3 cycles along the
//          sequence
//     f2 = exp(-3 s) * (1 + N(0, 0.1^2))  falling like sorted momenta;
//          the same for every class
//     f3, f4 = N(0, 1)  noise, the same for every class
//     f5 = b + N(0, 0.1^2), b ~ N(0, 1) per sequence  a per-sequence
//          offset, the same for every class
//   Only the trend of f0 and the frequency of f1 tell the classes apart, and
//   both are properties of the whole sequence: one particle's f0 separates
//   neighbouring classes by under one noise deviation, and its f1, at a
//   uniformly random phase, has the same distribution in every class.
//   Measured once (PyTorch, the default sizes): an MLP on the last particle
//   alone reaches 45% test accuracy (chance 20%); a 64-unit GRU over the
//   sequence 78% after one epoch and 89% after six.
//
// images32 (default 50000 train, 10000 test, CIFAR-10's sizes): a stand-in
//   for CIFAR-10, which cannot be downloaded here. Images unsigned byte
//   [N, 3, 32, 32] (channel-major, like CIFAR's binary files), labels
//   unsigned byte [N], the class k uniform in 0..9. Class k draws pattern k
//   (horizontal stripes, vertical stripes, checkerboard, diagonal stripes,
//   anti-diagonal stripes, rings, cross, disc, grid, dots) in colour
//   kPalette[k % 5] (red, green, blue, yellow, magenta) over a grey
//   background of random level in [0, 100], with a random shift of 0 to 7
//   pixels in x and y, a random contrast in [0.25, 1] and Gaussian pixel
//   noise of deviation 70, clipped to [0, 255]. Classes k and k + 5 share a
//   colour, so colour alone is not enough: a model must see the pattern.
//   Measured once (PyTorch, 10000 training images): a linear model on the
//   mean colour reaches 53% test accuracy; a two-conv-layer CNN 85% after
//   one epoch and 97% after three.
//
// Exit codes: 0 ok, 1 a file cannot be written, 2 usage error. main() only
// parses flags; Generate() does the work.
//
// Over ~500 lines because it is a whole tool (flags, usage, a streaming IDX
// writer) with three generators, and this comment is the data sets'
// specification.
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/cli_flags.h"
#include "common/status_macros.h"
#include "worker/idx_reader.h"

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

using ::mpilearn::worker::IdxType;
using ::mpilearn::worker::IdxTypeName;

// Exit codes (common/cli_flags.h RunToolMain): 0 ok, 1 error, 2 usage.

// Samples per split at most: images32 at this size is about 6 GiB.
constexpr int64_t kMaxSamples = 2'000'000;

constexpr char kUsage[] =
    "make_synthetic_data: write gzip'd IDX data sets with a known answer.\n"
    "\n"
    "Usage: make_synthetic_data --kind regression|sequences|images32\n"
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
    "\n"
    "Files: DIR/{train,test}-features.idx.gz and\n"
    "DIR/{train,test}-targets.idx.gz (regression) or\n"
    "DIR/{train,test}-labels.idx.gz. The generation rules are documented in\n"
    "tools/make_synthetic_data.cc and docs/examples/README-data.md.\n"
    "\n"
    "Flags:\n"
    "  --kind      regression, sequences or images32. Required.\n"
    "  --out_dir   directory for the files (created if missing). Required.\n"
    "  --seed      random seed (default 1).\n"
    "  --train     training samples (default: per kind, above).\n"
    "  --test      test samples (default: per kind, above).\n"
    "  --noise     regression: target noise deviation (default 0.01).\n"
    "\n"
    "Exit codes: 0 ok, 1 a file cannot be written, 2 usage error.";

enum class Kind { kRegression, kSequences, kImages32 };

// One run, read from the flags by main().
struct Options {
  Kind kind = Kind::kRegression;
  std::string out_dir;
  uint64_t seed = 1;
  int64_t train = 0;  // > 0 after OptionsFromFlags
  int64_t test = 0;   // > 0 after OptionsFromFlags
  double noise = 0.01;
};

// regression: y0's weights, documented in the file comment.
constexpr float kRegressionWeights[8] = {0.9f, -0.7f, 0.5f, -0.3f,
                                         0.2f, -0.1f, 0.6f, -0.4f};
constexpr int kRegressionInputs = 8;
constexpr int kRegressionTargets = 2;

// sequences: particles per sequence, features per particle, classes.
constexpr int kSequenceLength = 20;
constexpr int kParticleFeatures = 6;
constexpr int kSequenceClasses = 5;

// images32
constexpr int kImageSide = 32;
constexpr int kImageChannels = 3;
constexpr int kImageClasses = 10;
constexpr uint8_t kPalette[5][3] = {
    {220, 40, 40},   // red
    {40, 200, 60},   // green
    {50, 80, 230},   // blue
    {230, 210, 40},  // yellow
    {200, 50, 200},  // magenta
};

constexpr double kPi = 3.14159265358979323846;

// Deterministic random numbers from one seeded stream: the same seed and
// split give the same values with any standard library.
class Random {
 public:
  Random(uint64_t seed, uint32_t split) {
    std::seed_seq seq{static_cast<uint32_t>(seed),
                      static_cast<uint32_t>(seed >> 32), split};
    engine_.seed(seq);
  }

  // Uniform in [0, 1), from the top 53 bits of one draw.
  double Uniform() { return (engine_() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform in 0..n-1 (n small, so the modulo bias is below 2^-50).
  int UniformInt(int n) { return static_cast<int>(engine_() % n); }
  // Standard normal, by the Box-Muller transform.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // in (0, 1], so log(u1) is finite
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2 * kPi * u2);
    has_spare_ = true;
    return r * std::cos(2 * kPi * u2);
  }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

struct GzFileCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzFileCloser>;

std::string Shape(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Streams one gzip'd IDX file: the header at Open, then the elements in
// row-major order, float32 or unsigned byte. Close checks that exactly the
// declared number of elements came. Not thread-safe.
class IdxGzWriter {
 public:
  absl::Status Open(const std::string& path, IdxType type,
                    const std::vector<int64_t>& dims) {
    path_ = path;
    type_ = type;
    dims_ = dims;
    expected_ = 1;
    for (const int64_t d : dims) expected_ *= d;
    written_ = 0;
    errno = 0;
    // Level 1, the fastest: the noisy payloads barely compress at any
    // level.
    file_.reset(gzopen(path.c_str(), "wb1"));
    if (file_ == nullptr) {
      return absl::ErrnoToStatus(errno == 0 ? ENOMEM : errno,
                                 absl::StrCat("cannot create '", path, "'"));
    }
    std::vector<uint8_t> header = {0, 0, static_cast<uint8_t>(type),
                                   static_cast<uint8_t>(dims.size())};
    for (const int64_t d : dims) {
      const uint32_t u = static_cast<uint32_t>(d);
      header.insert(header.end(), {static_cast<uint8_t>(u >> 24),
                                   static_cast<uint8_t>(u >> 16),
                                   static_cast<uint8_t>(u >> 8),
                                   static_cast<uint8_t>(u)});
    }
    return Write(header);
  }

  // Appends float32 elements, big-endian.
  absl::Status Append(absl::Span<const float> values) {
    buffer_.clear();
    for (const float v : values) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      buffer_.insert(buffer_.end(), {static_cast<uint8_t>(bits >> 24),
                                     static_cast<uint8_t>(bits >> 16),
                                     static_cast<uint8_t>(bits >> 8),
                                     static_cast<uint8_t>(bits)});
    }
    written_ += values.size();
    return Write(buffer_);
  }

  // Appends unsigned byte elements.
  absl::Status Append(absl::Span<const uint8_t> values) {
    written_ += values.size();
    return Write(values);
  }

  // Finishes the file and prints the line that reports it.
  absl::Status Close() {
    if (written_ != expected_) {
      return absl::InternalError(absl::StrCat(
          "'", path_, "': wrote ", written_, " elements but declared ",
          expected_));
    }
    const int result = gzclose(file_.release());
    if (result != Z_OK) {
      return absl::DataLossError(absl::StrCat(
          "cannot finish '", path_, "': gzclose returned ", result));
    }
    absl::PrintF("wrote %s: %s %s\n", path_, IdxTypeName(type_),
                 Shape(dims_));
    return absl::OkStatus();
  }

 private:
  absl::Status Write(absl::Span<const uint8_t> bytes) {
    if (bytes.empty()) return absl::OkStatus();
    if (gzwrite(file_.get(), bytes.data(), bytes.size()) !=
        static_cast<int>(bytes.size())) {
      int zerr = Z_OK;
      const char* msg = gzerror(file_.get(), &zerr);
      if (zerr == Z_ERRNO) {
        return absl::ErrnoToStatus(errno,
                                   absl::StrCat("cannot write '", path_, "'"));
      }
      return absl::DataLossError(absl::StrCat(
          "cannot write '", path_, "': gzip: ", msg == nullptr ? "?" : msg));
    }
    return absl::OkStatus();
  }

  std::string path_;
  IdxType type_ = IdxType::kUnsignedByte;
  std::vector<int64_t> dims_;
  int64_t expected_ = 0;
  int64_t written_ = 0;
  GzFilePtr file_;
  std::vector<uint8_t> buffer_;
};

// Writes one regression split of `n` samples to <prefix>-features.idx.gz
// and <prefix>-targets.idx.gz.
absl::Status WriteRegression(const std::string& prefix, int64_t n,
                             double noise, Random& rng) {
  IdxGzWriter features, targets;
  MPILEARN_RETURN_IF_ERROR(features.Open(absl::StrCat(prefix, "-features.idx.gz"),
                                         IdxType::kFloat32,
                                         {n, kRegressionInputs}));
  MPILEARN_RETURN_IF_ERROR(targets.Open(absl::StrCat(prefix, "-targets.idx.gz"),
                                        IdxType::kFloat32,
                                        {n, kRegressionTargets}));
  float x[kRegressionInputs];
  float y[kRegressionTargets];
  for (int64_t i = 0; i < n; ++i) {
    for (float& v : x) v = static_cast<float>(rng.Uniform(-1, 1));
    // In double from the stored (float) inputs, so the formula holds for
    // the file's values to float rounding.
    double y0 = 0.5;
    for (int j = 0; j < kRegressionInputs; ++j) {
      y0 += double{kRegressionWeights[j]} * x[j];
    }
    const double y1 = std::sin(kPi * x[0]) * x[1];
    y[0] = static_cast<float>(y0 + noise * rng.Normal());
    y[1] = static_cast<float>(y1 + noise * rng.Normal());
    MPILEARN_RETURN_IF_ERROR(features.Append(absl::MakeConstSpan(x)));
    MPILEARN_RETURN_IF_ERROR(targets.Append(absl::MakeConstSpan(y)));
  }
  MPILEARN_RETURN_IF_ERROR(features.Close());
  return targets.Close();
}

// Writes one sequences split of `n` samples to <prefix>-features.idx.gz and
// <prefix>-labels.idx.gz (rule: the file comment).
absl::Status WriteSequences(const std::string& prefix, int64_t n,
                            Random& rng) {
  IdxGzWriter features, labels;
  MPILEARN_RETURN_IF_ERROR(features.Open(
      absl::StrCat(prefix, "-features.idx.gz"), IdxType::kFloat32,
      {n, kSequenceLength, kParticleFeatures}));
  MPILEARN_RETURN_IF_ERROR(labels.Open(absl::StrCat(prefix, "-labels.idx.gz"),
                                       IdxType::kUnsignedByte, {n}));
  std::vector<float> sequence(kSequenceLength * kParticleFeatures);
  for (int64_t i = 0; i < n; ++i) {
    const int c = rng.UniformInt(kSequenceClasses);
    const double slope = 0.5 * (c - 2);
    const double cycles = 1 + c / 2.0;
    const double phase = rng.Uniform(0, 2 * kPi);
    const double offset = rng.Normal();
    for (int t = 0; t < kSequenceLength; ++t) {
      const double s = t / double{kSequenceLength - 1};
      float* p = &sequence[t * kParticleFeatures];
      p[0] = static_cast<float>(slope * (2 * s - 1) + 0.6 * rng.Normal());
      p[1] = static_cast<float>(std::sin(2 * kPi * cycles * s + phase) +
                                0.5 * rng.Normal());
      p[2] = static_cast<float>(std::exp(-3 * s) * (1 + 0.1 * rng.Normal()));
      p[3] = static_cast<float>(rng.Normal());
      p[4] = static_cast<float>(rng.Normal());
      p[5] = static_cast<float>(offset + 0.1 * rng.Normal());
    }
    const uint8_t label = static_cast<uint8_t>(c);
    MPILEARN_RETURN_IF_ERROR(features.Append(absl::MakeConstSpan(sequence)));
    MPILEARN_RETURN_IF_ERROR(labels.Append(absl::MakeConstSpan(&label, 1)));
  }
  MPILEARN_RETURN_IF_ERROR(features.Close());
  return labels.Close();
}

// images32: whether pixel (x, y) belongs to class k's pattern, shifted by
// (dx, dy) in 0..7.
bool InPattern(int k, int x, int y, int dx, int dy) {
  const int cx = 12 + dx, cy = 12 + dy;  // centre for rings, cross, disc
  const double r = std::hypot(x - cx, y - cy);
  switch (k) {
    case 0: return ((y + dy) / 4) % 2 == 0;                  // h stripes
    case 1: return ((x + dx) / 4) % 2 == 0;                  // v stripes
    case 2: return ((x + dx) / 4 + (y + dy) / 4) % 2 == 0;   // checkerboard
    case 3: return ((x + y + dx) / 4) % 2 == 0;              // diagonal
    case 4: return ((x - y + kImageSide + dx) / 4) % 2 == 0; // anti-diagonal
    case 5: return static_cast<int>(r / 3) % 2 == 0;         // rings
    case 6: return std::abs(x - cx) < 3 || std::abs(y - cy) < 3;  // cross
    case 7: return r < 9;                                    // disc
    case 8: return (x + dx) % 8 < 2 || (y + dy) % 8 < 2;     // grid
    default: return (x + dx) % 8 < 3 && (y + dy) % 8 < 3;    // dots
  }
}

// Writes one images32 split of `n` samples to <prefix>-features.idx.gz and
// <prefix>-labels.idx.gz (rule: the file comment).
absl::Status WriteImages32(const std::string& prefix, int64_t n, Random& rng) {
  IdxGzWriter images, labels;
  MPILEARN_RETURN_IF_ERROR(images.Open(
      absl::StrCat(prefix, "-features.idx.gz"), IdxType::kUnsignedByte,
      {n, kImageChannels, kImageSide, kImageSide}));
  MPILEARN_RETURN_IF_ERROR(labels.Open(absl::StrCat(prefix, "-labels.idx.gz"),
                                       IdxType::kUnsignedByte, {n}));
  std::vector<uint8_t> image(kImageChannels * kImageSide * kImageSide);
  for (int64_t i = 0; i < n; ++i) {
    const int k = rng.UniformInt(kImageClasses);
    const double background = rng.Uniform(0, 100);
    const double contrast = rng.Uniform(0.25, 1.0);
    const int dx = rng.UniformInt(8), dy = rng.UniformInt(8);
    const uint8_t* colour = kPalette[k % 5];
    for (int y = 0; y < kImageSide; ++y) {
      for (int x = 0; x < kImageSide; ++x) {
        const bool on = InPattern(k, x, y, dx, dy);
        for (int ch = 0; ch < kImageChannels; ++ch) {
          double v = background;
          if (on) v += contrast * (colour[ch] - background);
          v += 70 * rng.Normal();
          image[(ch * kImageSide + y) * kImageSide + x] =
              static_cast<uint8_t>(std::clamp(std::round(v), 0.0, 255.0));
        }
      }
    }
    const uint8_t label = static_cast<uint8_t>(k);
    MPILEARN_RETURN_IF_ERROR(images.Append(absl::MakeConstSpan(image)));
    MPILEARN_RETURN_IF_ERROR(labels.Append(absl::MakeConstSpan(&label, 1)));
  }
  MPILEARN_RETURN_IF_ERROR(images.Close());
  return labels.Close();
}

// Writes both splits of the kind `options` names.
absl::Status Generate(const Options& options) {
  if (mkdir(options.out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot create directory '", options.out_dir, "'"));
  }
  const std::pair<const char*, int64_t> splits[] = {{"train", options.train},
                                                    {"test", options.test}};
  for (uint32_t split = 0; split < 2; ++split) {
    const std::string prefix =
        absl::StrCat(options.out_dir, "/", splits[split].first);
    const int64_t n = splits[split].second;
    Random rng(options.seed, split);
    switch (options.kind) {
      case Kind::kRegression:
        MPILEARN_RETURN_IF_ERROR(
            WriteRegression(prefix, n, options.noise, rng));
        break;
      case Kind::kSequences:
        MPILEARN_RETURN_IF_ERROR(WriteSequences(prefix, n, rng));
        break;
      case Kind::kImages32:
        MPILEARN_RETURN_IF_ERROR(WriteImages32(prefix, n, rng));
        break;
    }
  }
  if (options.kind == Kind::kRegression) {
    double sum_w2 = 0;
    for (const float w : kRegressionWeights) sum_w2 += double{w} * w;
    const double noise2 = options.noise * options.noise;
    absl::PrintF(
        "irreducible MSE (noise^2): %.6g; MSE of predicting the means: "
        "%.6g\n",
        noise2, (sum_w2 / 3 + 1.0 / 6) / 2 + noise2);
  }
  return absl::OkStatus();
}

// Reads and checks the flags.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  const std::string kind = absl::GetFlag(FLAGS_kind);
  int64_t default_train = 0, default_test = 0;
  if (kind == "regression") {
    options.kind = Kind::kRegression;
    default_train = 10000;
    default_test = 2000;
  } else if (kind == "sequences") {
    options.kind = Kind::kSequences;
    default_train = 20000;
    default_test = 5000;
  } else if (kind == "images32") {
    options.kind = Kind::kImages32;
    default_train = 50000;
    default_test = 10000;
  } else if (kind.empty()) {
    return absl::InvalidArgumentError(
        "--kind is required: regression, sequences or images32");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kind must be regression, sequences or images32, got '", kind, "'"));
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
  absl::StatusOr<sd::Options> options;
  mpilearn::ToolMain tool;
  tool.name = "make_synthetic_data";
  tool.usage = sd::kUsage;
  tool.flags_source = "tools/make_synthetic_data.cc";
  tool.read_flags = [&] {
    options = sd::OptionsFromFlags();
    return options.status();
  };
  tool.run = [&] { return sd::Generate(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
