#include "common/half_float.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"

// Every check here is against a reference computed in double from the
// definition of the formats (sign, exponent, mantissa), never against the
// conversions themselves.
namespace mpilearn {
namespace {

struct Format {
  HalfFormat format;
  int mantissa_bits;  // stored mantissa bits
  int exponent_bits;
  const char* name;

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  uint16_t exponent_mask() const {
    return static_cast<uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  }
};

void PrintTo(const Format& f, std::ostream* os) { *os << f.name; }

constexpr Format kFloat16 = {HalfFormat::kFloat16, 10, 5, "fp16"};
constexpr Format kBFloat16 = {HalfFormat::kBFloat16, 7, 8, "bf16"};

// The value of bit pattern `bits` by the format's definition.
double Reference(const Format& f, uint16_t bits) {
  const bool negative = (bits & 0x8000) != 0;
  const int exponent = (bits & 0x7fff) >> f.mantissa_bits;
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  const int max_exponent = (1 << f.exponent_bits) - 1;
  double value;
  if (exponent == max_exponent) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(mantissa, 1 - f.bias() - f.mantissa_bits);
  } else {
    value = std::ldexp(mantissa + (1 << f.mantissa_bits),
                       exponent - f.bias() - f.mantissa_bits);
  }
  return negative ? -value : value;
}

uint16_t Encode(const Format& f, float x) {
  return f.format == HalfFormat::kFloat16 ? FloatToHalf(x) : FloatToBFloat16(x);
}

// Round to nearest, ties to even, by searching the sorted non-negative
// finite values of the format. Beyond the largest finite value the format
// continues (as IEEE rounding does with an unbounded exponent) with one
// more step, which stands for Inf.
class NearestReference {
 public:
  explicit NearestReference(const Format& f) : format_(f) {
    const uint16_t inf = f.exponent_mask();
    for (uint32_t bits = 0; bits < inf; ++bits) {
      values_.push_back(Reference(f, static_cast<uint16_t>(bits)));
    }
    const double largest = values_.back();
    values_.push_back(largest + (largest - values_[values_.size() - 2]));
    EXPECT_TRUE(std::is_sorted(values_.begin(), values_.end()));
  }

  // The expected bits for `x`, which is not NaN.
  uint16_t Nearest(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double magnitude = std::fabs(static_cast<double>(x));
    const uint16_t inf = format_.exponent_mask();
    if (magnitude >= values_.back()) return sign | inf;
    const size_t above = static_cast<size_t>(
        std::lower_bound(values_.begin(), values_.end(), magnitude) -
        values_.begin());
    if (values_[above] == magnitude) return sign | static_cast<uint16_t>(above);
    const size_t below = above - 1;  // magnitude > values_[0] == 0
    const double down = magnitude - values_[below];
    const double up = values_[above] - magnitude;
    size_t pick;
    if (down != up) {
      pick = down < up ? below : above;
    } else {
      pick = (below % 2 == 0) ? below : above;  // ties to the even pattern
    }
    return sign | static_cast<uint16_t>(pick);  // `above` may be Inf's bits
  }

  // Midpoints between neighbours, where ties are decided.
  std::vector<float> Ties() const {
    std::vector<float> ties;
    for (size_t i = 0; i + 1 < values_.size(); ++i) {
      // Exact in fp32: at most mantissa_bits + 2 significant bits.
      ties.push_back(static_cast<float>((values_[i] + values_[i + 1]) / 2));
    }
    return ties;
  }

 private:
  Format format_;
  std::vector<double> values_;
};

// Floats across every fp32 exponent (random bit patterns, which include
// subnormals, Inf and NaN), a dense sweep around the format's own range,
// and edge values.
std::vector<float> TestInputs(const Format& f, const NearestReference& nearest) {
  std::mt19937 rng(1234);
  std::vector<float> in;
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) in.push_back(FloatFromBits(bits(rng)));
  // Exponents from below the smallest subnormal to past the overflow.
  const int lowest = 1 - f.bias() - f.mantissa_bits - 3;
  const int highest = f.bias() + 3;
  std::uniform_int_distribution<int> exponent(lowest, highest);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(std::ldexp(mantissa(rng), exponent(rng)));
    in.push_back(i % 2 ? x : -x);
  }
  for (float tie : nearest.Ties()) {
    in.push_back(tie);
    in.push_back(-tie);
    in.push_back(std::nextafter(tie, 0.0f));
    in.push_back(std::nextafter(tie, std::numeric_limits<float>::infinity()));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 65504.0f, 65519.99f,
                  65520.0f, 65536.0f, 1e-8f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                  0x1p-14f, 1.0f, -1.0f}) {
    in.push_back(x);
  }
  return in;
}

TEST(HalfFloatTest, Float16DecodeMatchesDefinitionForAllPatterns) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> bulk(all.size());
  DecodeHalf(HalfFormat::kFloat16,
             absl::MakeConstSpan(reinterpret_cast<const char*>(all.data()),
                                 all.size() * 2),
             bulk.data());
  for (uint32_t b = 0; b < 65536; ++b) {
    const double want = Reference(kFloat16, static_cast<uint16_t>(b));
    const float got = HalfToFloat(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << b;
      ASSERT_TRUE(std::isnan(bulk[b])) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << b;
      ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << std::hex << b;
      ASSERT_EQ(FloatBits(bulk[b]), FloatBits(got)) << std::hex << b;
    }
  }
}

TEST(HalfFloatTest, BFloat16DecodeMatchesDefinitionForAllPatterns) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> bulk(all.size());
  DecodeHalf(HalfFormat::kBFloat16,
             absl::MakeConstSpan(reinterpret_cast<const char*>(all.data()),
                                 all.size() * 2),
             bulk.data());
  for (uint32_t b = 0; b < 65536; ++b) {
    const double want = Reference(kBFloat16, static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(BFloat16ToFloat(static_cast<uint16_t>(b))));
      ASSERT_TRUE(std::isnan(bulk[b]));
    } else {
      ASSERT_EQ(static_cast<double>(bulk[b]), want) << std::hex << b;
      ASSERT_EQ(std::signbit(bulk[b]), (b & 0x8000) != 0) << std::hex << b;
    }
  }
}

class EncodeTest : public ::testing::TestWithParam<Format> {};

TEST_P(EncodeTest, RoundsToNearestEven) {
  const Format f = GetParam();
  const NearestReference nearest(f);
  const std::vector<float> in = TestInputs(f, nearest);
  // The buffer path (vectorised blocks and a tail: the size is not a
  // multiple of the block) must agree with the reference too.
  std::vector<char> wire(in.size() * 2);
  EncodeHalf(f.format, in, wire.data());
  size_t nans = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t bulk;
    std::memcpy(&bulk, wire.data() + 2 * i, 2);
    const uint16_t got = Encode(f, in[i]);
    ASSERT_EQ(bulk, got) << in[i];
    if (std::isnan(in[i])) {
      ++nans;
      ASSERT_TRUE(std::isnan(Reference(f, got))) << std::hex << got;
      // Quiet: the top mantissa bit is set.
      ASSERT_NE(got & (1 << (f.mantissa_bits - 1)), 0) << std::hex << got;
      continue;
    }
    ASSERT_EQ(got, nearest.Nearest(in[i]))
        << f.name << ": " << std::hexfloat << in[i];
  }
  EXPECT_GT(nans, 0u);  // random patterns include NaNs
}

TEST_P(EncodeTest, RelativeErrorWithinHalfAnUlp) {
  const Format f = GetParam();
  const double unit_roundoff = std::ldexp(1.0, -(f.mantissa_bits + 1));
  // Normal range of the format, with margin below its overflow.
  const int lowest = 1 - f.bias();
  const int highest = f.bias() - 1;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> exponent(lowest, highest);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::vector<float> in(100003);
  for (float& x : in) {
    x = static_cast<float>(std::ldexp(mantissa(rng), exponent(rng)));
  }
  std::vector<char> wire(in.size() * 2);
  std::vector<float> back(in.size());
  EncodeHalf(f.format, in, wire.data());
  DecodeHalf(f.format, wire, back.data());
  double worst = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const double error = std::fabs(static_cast<double>(back[i]) - in[i]) /
                         std::fabs(static_cast<double>(in[i]));
    worst = std::max(worst, error);
  }
  EXPECT_LE(worst, unit_roundoff);
  EXPECT_GT(worst, unit_roundoff / 2);  // the bound is tight, not vacuous
}

// Error feedback: what the wire carried, summed over many steps, tracks the
// sum of the inputs within one rounding step; without feedback a steady
// input rounds the same way every step and the sums drift apart.
TEST_P(EncodeTest, ErrorFeedbackKeepsSumsTogether) {
  const Format f = GetParam();
  constexpr size_t kValues = 257;
  constexpr int kSteps = 2000;
  std::mt19937 rng(5);
  const double ulp = std::ldexp(1.0, -f.mantissa_bits);  // of [1, 2)
  std::uniform_real_distribution<float> steady(1.0f, 2.0f);
  // Noise well below an ulp, so rounding without feedback stays biased.
  std::uniform_real_distribution<float> noise(static_cast<float>(-ulp / 16),
                                              static_cast<float>(ulp / 16));
  std::vector<float> base(kValues);
  for (float& x : base) x = steady(rng);
  std::vector<float> residual(kValues, 0.0f);
  std::vector<double> sum_in(kValues, 0), sum_fed(kValues, 0),
      sum_plain(kValues, 0);
  std::vector<float> values(kValues), back(kValues);
  std::vector<char> wire(kValues * 2);
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < kValues; ++i) {
      values[i] = base[i] + noise(rng);
      sum_in[i] += values[i];
    }
    EncodeHalfWithFeedback(f.format, values, absl::MakeSpan(residual),
                           wire.data());
    DecodeHalf(f.format, wire, back.data());
    for (size_t i = 0; i < kValues; ++i) sum_fed[i] += back[i];
    EncodeHalf(f.format, values, wire.data());
    DecodeHalf(f.format, wire, back.data());
    for (size_t i = 0; i < kValues; ++i) sum_plain[i] += back[i];
  }
  // Sum of sent = sum of inputs - final residual (at most half an ulp of a
  // value in [1, 2), so below one ulp 2^-mantissa_bits) + the fp32 rounding
  // of value + residual each step (at most 2^-24 * 4 per step).
  const double bound = ulp + kSteps * std::ldexp(4.0, -24);
  double drift_plain = 0;
  for (size_t i = 0; i < kValues; ++i) {
    ASSERT_LE(std::fabs(sum_fed[i] - sum_in[i]), bound) << i;
    drift_plain += std::fabs(sum_plain[i] - sum_in[i]);
  }
  // Without feedback the mean drift is many times the bound.
  EXPECT_GT(drift_plain / kValues, 20 * bound);
}

TEST_P(EncodeTest, FeedbackDropsNonFiniteResiduals) {
  const Format f = GetParam();
  const float big = f.format == HalfFormat::kFloat16 ? 1e5f : 3e38f;
  const std::vector<float> values = {std::nanf(""), big, 1.0f,
                                     std::numeric_limits<float>::infinity()};
  std::vector<float> residual = {0.5f, big, 0.25f, 0.0f};
  std::vector<char> wire(values.size() * 2);
  EncodeHalfWithFeedback(f.format, values, absl::MakeSpan(residual),
                         wire.data());
  std::vector<float> back(values.size());
  DecodeHalf(f.format, wire, back.data());
  EXPECT_TRUE(std::isnan(back[0]));
  EXPECT_EQ(back[1], std::numeric_limits<float>::infinity());  // overflow
  EXPECT_EQ(back[2], 1.25f);
  EXPECT_EQ(back[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(residual, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

INSTANTIATE_TEST_SUITE_P(Formats, EncodeTest,
                         ::testing::Values(kFloat16, kBFloat16),
                         [](const auto& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace mpilearn
