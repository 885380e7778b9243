#include "tools/data/synthetic_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/data/data_file.h"
#include "worker/data/hdf5_writer.h"
#include "worker/data/idx_reader.h"
#include "worker/data/idx_writer.h"

namespace mpilearn {
namespace synthetic_data {
namespace {

// regression: y0's weights (docs/examples/README-data.md).
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

// jets: per sample one jet's features, a few tracks' features, the classes.
constexpr int kJetFeatures = 4;
constexpr int kTracks = 8;
constexpr int kTrackFeatures = 3;

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

// Closes `writer` and prints the line that reports its file.
absl::Status CloseAndReport(worker::IdxGzWriter& writer) {
  MPILEARN_RETURN_IF_ERROR(writer.Close());
  absl::PrintF("wrote %s: %s %s\n", writer.path(),
               worker::IdxTypeName(writer.type()),
               worker::ShapeText(writer.dims()));
  return absl::OkStatus();
}

// Writes one regression split of `n` samples to <prefix>-features.idx.gz
// and <prefix>-targets.idx.gz.
absl::Status WriteRegression(const std::string& prefix, int64_t n,
                             double noise, Random& rng) {
  worker::IdxGzWriter features, targets;
  MPILEARN_RETURN_IF_ERROR(
      features.Open(absl::StrCat(prefix, "-features.idx.gz"),
                    worker::IdxType::kFloat32, {n, kRegressionInputs}));
  MPILEARN_RETURN_IF_ERROR(targets.Open(absl::StrCat(prefix, "-targets.idx.gz"),
                                        worker::IdxType::kFloat32,
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
  MPILEARN_RETURN_IF_ERROR(CloseAndReport(features));
  return CloseAndReport(targets);
}

// Writes one sequences split of `n` samples to <prefix>-features.idx.gz and
// <prefix>-labels.idx.gz (rule: docs/examples/README-data.md).
absl::Status WriteSequences(const std::string& prefix, int64_t n,
                            Random& rng) {
  worker::IdxGzWriter features, labels;
  MPILEARN_RETURN_IF_ERROR(features.Open(
      absl::StrCat(prefix, "-features.idx.gz"), worker::IdxType::kFloat32,
      {n, kSequenceLength, kParticleFeatures}));
  MPILEARN_RETURN_IF_ERROR(labels.Open(absl::StrCat(prefix, "-labels.idx.gz"),
                                       worker::IdxType::kUnsignedByte, {n}));
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
  MPILEARN_RETURN_IF_ERROR(CloseAndReport(features));
  return CloseAndReport(labels);
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
// <prefix>-labels.idx.gz (rule: docs/examples/README-data.md).
absl::Status WriteImages32(const std::string& prefix, int64_t n, Random& rng) {
  worker::IdxGzWriter images, labels;
  MPILEARN_RETURN_IF_ERROR(images.Open(
      absl::StrCat(prefix, "-features.idx.gz"), worker::IdxType::kUnsignedByte,
      {n, kImageChannels, kImageSide, kImageSide}));
  MPILEARN_RETURN_IF_ERROR(labels.Open(absl::StrCat(prefix, "-labels.idx.gz"),
                                       worker::IdxType::kUnsignedByte, {n}));
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
  MPILEARN_RETURN_IF_ERROR(CloseAndReport(images));
  return CloseAndReport(labels);
}

// Writes one jets split of `n` samples to <prefix>.h5: two inputs (jets,
// tracks) and two outputs (kind, energy); rule: docs/examples/README-data.md.
absl::Status WriteJets(const std::string& prefix, int64_t n, double noise, Random& rng) {
  torch::Tensor jets = torch::empty({n, kJetFeatures}, torch::kFloat32);
  torch::Tensor tracks = torch::empty({n, kTracks, kTrackFeatures}, torch::kFloat32);
  torch::Tensor kind = torch::empty({n}, torch::kInt64);
  torch::Tensor energy = torch::empty({n}, torch::kFloat32);
  float* jet = jets.data_ptr<float>();
  float* track = tracks.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    float* j = jet + i * kJetFeatures;
    float* t = track + i * kTracks * kTrackFeatures;
    for (int f = 0; f < kJetFeatures; ++f) j[f] = static_cast<float>(rng.Uniform(-1, 1));
    double mean[kTrackFeatures] = {0, 0, 0};
    for (int k = 0; k < kTracks * kTrackFeatures; ++k) {
      t[k] = static_cast<float>(rng.Uniform(-1, 1));
      mean[k % kTrackFeatures] += t[k] / double{kTracks};
    }
    // In double from the stored floats, as the documented rule reads.
    const double a = j[0] + mean[0];
    const double b = j[1] - mean[1];
    kind.data_ptr<int64_t>()[i] = a >= b && a >= 0.2 ? 0 : (b > a && b >= 0.2 ? 1 : 2);
    energy.data_ptr<float>()[i] =
        static_cast<float>(2.0 * j[2] * j[3] + mean[2] + noise * rng.Normal());
  }
  const std::string path = absl::StrCat(prefix, ".h5");
  MPILEARN_RETURN_IF_ERROR(worker::WriteHdf5Arrays(
      path, {{"jets", worker::ElementType::kFloat32, jets},
             {"tracks", worker::ElementType::kFloat32, tracks},
             {"kind", worker::ElementType::kUint8, kind},
             {"energy", worker::ElementType::kFloat32, energy}}));
  absl::PrintF("wrote %s: jets float32 [%d, %d], tracks float32 [%d, %d, %d], kind uint8 [%d], "
               "energy float32 [%d]\n",
               path, n, kJetFeatures, n, kTracks, kTrackFeatures, n, n);
  return absl::OkStatus();
}

}  // namespace

absl::Status GenerateSyntheticData(const SyntheticDataOptions& options) {
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
      case SyntheticKind::kRegression:
        MPILEARN_RETURN_IF_ERROR(
            WriteRegression(prefix, n, options.noise, rng));
        break;
      case SyntheticKind::kSequences:
        MPILEARN_RETURN_IF_ERROR(WriteSequences(prefix, n, rng));
        break;
      case SyntheticKind::kImages32:
        MPILEARN_RETURN_IF_ERROR(WriteImages32(prefix, n, rng));
        break;
      case SyntheticKind::kJets:
        MPILEARN_RETURN_IF_ERROR(WriteJets(prefix, n, options.noise, rng));
        break;
    }
  }
  if (options.kind == SyntheticKind::kRegression) {
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

}  // namespace synthetic_data
}  // namespace mpilearn
