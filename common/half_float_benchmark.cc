// Throughput of the wire conversions (half_float.h) on a 10M-element
// tensor, the size of one push, in ns/element, next to a plain fp32 copy of
// the same tensor as a baseline measured in the same run. Build with -c opt:
//   bazel run -c opt //common:half_float_benchmark
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/half_float.h"

namespace mpilearn {
namespace {

constexpr size_t kElements = 10'000'000;
constexpr int kRepeats = 7;

// Best of kRepeats runs of `body`, in ns per element.
double NanosPerElement(const std::function<void()>& body) {
  double best = 1e300;
  for (int r = 0; r < kRepeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    const std::chrono::duration<double, std::nano> took =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / kElements);
  }
  return best;
}

int Main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> values(kElements), residual(kElements, 0.0f),
      decoded(kElements), copy(kElements);
  for (float& x : values) x = normal(rng);
  std::vector<char> wire(kElements * 2);

  const double copy_ns = NanosPerElement([&] {
    std::memcpy(copy.data(), values.data(), kElements * sizeof(float));
  });
  std::printf("fp32 memcpy (baseline)   %.3f ns/element\n", copy_ns);
  for (HalfFormat format : {HalfFormat::kBFloat16, HalfFormat::kFloat16}) {
    const char* name = format == HalfFormat::kBFloat16 ? "bf16" : "fp16";
    const double encode = NanosPerElement(
        [&] { EncodeHalf(format, values, wire.data()); });
    const double feedback = NanosPerElement([&] {
      EncodeHalfWithFeedback(format, values, absl::MakeSpan(residual),
                             wire.data());
    });
    const double decode = NanosPerElement(
        [&] { DecodeHalf(format, wire, decoded.data()); });
    std::printf("%s encode               %.3f ns/element (%.2fx memcpy)\n",
                name, encode, encode / copy_ns);
    std::printf("%s encode with feedback %.3f ns/element (%.2fx memcpy)\n",
                name, feedback, feedback / copy_ns);
    std::printf("%s decode               %.3f ns/element (%.2fx memcpy)\n",
                name, decode, decode / copy_ns);
  }
  // Keep the results observable.
  float sink = 0;
  for (size_t i = 0; i < kElements; i += 4096) sink += decoded[i] + residual[i];
  std::printf("(checksum %g)\n", sink);
  return 0;
}

}  // namespace
}  // namespace mpilearn

int main() { return mpilearn::Main(); }
