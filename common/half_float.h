// The two 16-bit float formats of the wire, bfloat16 and IEEE binary16
// ("fp16"), converted to and from fp32 bit-exactly.
//
//   uint16_t h = FloatToHalf(0.1f);       // round to nearest, ties to even
//   float back = HalfToFloat(h);          // exact: every fp16 is an fp32
//   EncodeHalf(HalfFormat::kBFloat16, values, out);   // whole buffers
//
// Rounding is IEEE round-to-nearest-even for both formats; fp16 keeps its
// subnormals and overflows to +-Inf; a NaN stays a (quiet) NaN and Inf stays
// Inf. Decoding is exact. Results do not depend on the FPU's rounding mode
// being other than the default (round to nearest), nor on flush-to-zero or
// denormals-are-zero settings.
//
// The scalar functions are inline and branch-free so the buffer loops in
// half_float.cc vectorise with the plain -O2 the build uses (SSE2 suffices).
//
// Thread-compatible: pure functions.
#ifndef MPILEARN_COMMON_HALF_FLOAT_H_
#define MPILEARN_COMMON_HALF_FLOAT_H_

#include <cstdint>
#include <cstring>

#include "absl/types/span.h"

namespace mpilearn {

enum class HalfFormat { kBFloat16, kFloat16 };

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// All ones when `condition` holds, else zero. The conversions below pick
// their result with these masks rather than with ?: because the compiler,
// honouring -ftrapping-math (on by default), will not speculate a float
// operation that a ?: guards, which would keep the loops scalar.
inline uint32_t SelectMask(bool condition) {
  return 0u - static_cast<uint32_t>(condition);
}

// True for a NaN, from its bits (independent of -ffast-math and such).
inline bool IsNanBits(uint32_t bits) {
  return static_cast<int32_t>(bits & 0x7fffffffu) >
         static_cast<int32_t>(0x7f800000u);
}

// fp32 -> bfloat16 bits: the top 16 bits, rounded to nearest even on the 16
// dropped ones. A carry out of the mantissa bumps the exponent, which is
// the right result, up to Inf for values beyond bf16's largest. A NaN keeps
// its sign and upper payload with the quiet bit set (rounding could
// otherwise carry it into Inf).
inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>(IsNanBits(bits) ? quiet_nan : rounded);
}

inline float BFloat16ToFloat(uint16_t bits) {
  return FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

// fp32 -> IEEE binary16 bits. Three cases on the magnitude, all computed
// and one selected (no branches, so loops vectorise):
//   - >= 2^16 (fp32 bits 0x47800000): Inf, or a quiet NaN for a NaN. Values
//     in [65520, 2^16) take the normal path, whose rounding carries them
//     into Inf as IEEE requires.
//   - [2^-14, 2^16): rebias the exponent (127 -> 15) and round the 13
//     dropped mantissa bits to nearest even.
//   - below 2^-14 (subnormal or zero in fp16): adding 0.5f, whose ulp is
//     2^-24 (fp16's smallest subnormal), lets the fp32 adder round the
//     magnitude to a multiple of 2^-24 (ties to even); the low bits of the
//     sum are then that multiple, up to 0x400 (the smallest normal) for
//     values that round up into the normal range.
inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t special =
      IsNanBits(magnitude) ? 0x7e00u | ((magnitude >> 13) & 0x3ffu) : 0x7c00u;
  const uint32_t normal =
      (magnitude - ((127u - 15u) << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >>
      13;
  const uint32_t subnormal =
      FloatBits(FloatFromBits(magnitude) + 0.5f) - FloatBits(0.5f);
  const uint32_t is_normal = SelectMask(magnitude >= 0x38800000u);
  const uint32_t is_special = SelectMask(magnitude >= 0x47800000u);
  const uint32_t result = (subnormal & ~is_normal) |
                          (normal & is_normal & ~is_special) |
                          (special & is_special);
  return static_cast<uint16_t>(result | sign);
}

// IEEE binary16 bits -> fp32, exact. Normal numbers rebias the exponent;
// Inf/NaN get fp32's all-ones exponent; subnormals (and zero) are their
// 10-bit mantissa times 2^-24, which fp32 holds exactly as a normal number.
inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t magnitude = bits & 0x7fffu;
  const uint32_t normal = (magnitude << 13) + ((127u - 15u) << 23);
  const uint32_t special = (magnitude << 13) | 0x7f800000u;
  const uint32_t subnormal =
      FloatBits(static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f);
  const uint32_t is_normal = SelectMask(magnitude >= 0x0400u);
  const uint32_t is_special = SelectMask(magnitude >= 0x7c00u);
  const uint32_t result = (subnormal & ~is_normal) |
                          (normal & is_normal & ~is_special) |
                          (special & is_special);
  return FloatFromBits(result | sign);
}

// Buffers: `out` / `in` hold 2 bytes per value, little-endian, with no
// alignment required.

// Encodes `values` into `out` (values.size() * 2 bytes).
void EncodeHalf(HalfFormat format, absl::Span<const float> values, char* out);

// Encodes values[i] + residual[i] into `out` and sets residual[i] to what
// rounding lost: (values[i] + residual[i]) - decoded value. Where that
// difference is not finite (a non-finite sum, or fp16 overflow to Inf) the
// residual becomes 0, so one bad value never poisons later steps.
// `residual` has values.size() elements and must not overlap `values`.
void EncodeHalfWithFeedback(HalfFormat format, absl::Span<const float> values,
                            absl::Span<float> residual, char* out);

// Decodes in.size() / 2 values into `out`; in.size() must be even.
void DecodeHalf(HalfFormat format, absl::Span<const char> in, float* out);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_HALF_FLOAT_H_
