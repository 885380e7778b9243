#include "common/half_float.h"

#include <cstddef>
#include <cstring>

namespace mpilearn {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swapping first");

// The loops work in blocks of a fixed size through local arrays: GCC's -O2
// vectoriser (the "very cheap" cost model) only vectorises loops whose trip
// count is known and that need no runtime alias checks, and the local
// arrays also make the unaligned 2-byte wire reads and writes plain memcpys.
constexpr size_t kBlock = 64;

struct BFloat16 {
  static uint16_t Encode(float value) { return FloatToBFloat16(value); }
  static float Decode(uint16_t bits) { return BFloat16ToFloat(bits); }
};

struct Float16 {
  static uint16_t Encode(float value) { return FloatToHalf(value); }
  static float Decode(uint16_t bits) { return HalfToFloat(bits); }
};

// One block of kBlock values (a compile-time trip count, which vectorises),
// or a shorter tail (scalar).
template <typename Format, size_t kCount>
void EncodeBlock(const float* values, char* out) {
  uint16_t wire[kCount];
  for (size_t j = 0; j < kCount; ++j) wire[j] = Format::Encode(values[j]);
  std::memcpy(out, wire, sizeof(wire));
}

template <typename Format>
void Encode(absl::Span<const float> values, char* out) {
  size_t i = 0;
  for (; i + kBlock <= values.size(); i += kBlock) {
    EncodeBlock<Format, kBlock>(values.data() + i, out + i * sizeof(uint16_t));
  }
  for (; i < values.size(); ++i) {
    EncodeBlock<Format, 1>(values.data() + i, out + i * sizeof(uint16_t));
  }
}

template <typename Format, size_t kCount>
void EncodeWithFeedbackBlock(const float* values, float* residual, char* out) {
  float sum[kCount];
  float lost[kCount];
  uint16_t wire[kCount];
  std::memcpy(sum, values, sizeof(sum));
  std::memcpy(lost, residual, sizeof(lost));
  for (size_t j = 0; j < kCount; ++j) {
    sum[j] += lost[j];
    wire[j] = Format::Encode(sum[j]);
    const float diff = sum[j] - Format::Decode(wire[j]);
    // Not finite: exponent all ones (checked on the bits, -ffast-math-proof).
    const bool finite = (FloatBits(diff) & 0x7f800000u) != 0x7f800000u;
    lost[j] = finite ? diff : 0.0f;
  }
  std::memcpy(residual, lost, sizeof(lost));
  std::memcpy(out, wire, sizeof(wire));
}

template <typename Format>
void EncodeWithFeedback(absl::Span<const float> values,
                        absl::Span<float> residual, char* out) {
  size_t i = 0;
  for (; i + kBlock <= values.size(); i += kBlock) {
    EncodeWithFeedbackBlock<Format, kBlock>(
        values.data() + i, residual.data() + i, out + i * sizeof(uint16_t));
  }
  for (; i < values.size(); ++i) {
    EncodeWithFeedbackBlock<Format, 1>(values.data() + i, residual.data() + i,
                                       out + i * sizeof(uint16_t));
  }
}

template <typename Format, size_t kCount>
void DecodeBlock(const char* in, float* out) {
  uint16_t wire[kCount];
  float values[kCount];
  std::memcpy(wire, in, sizeof(wire));
  for (size_t j = 0; j < kCount; ++j) values[j] = Format::Decode(wire[j]);
  std::memcpy(out, values, sizeof(values));
}

template <typename Format>
void Decode(absl::Span<const char> in, float* out) {
  const size_t count = in.size() / sizeof(uint16_t);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    DecodeBlock<Format, kBlock>(in.data() + i * sizeof(uint16_t), out + i);
  }
  for (; i < count; ++i) {
    DecodeBlock<Format, 1>(in.data() + i * sizeof(uint16_t), out + i);
  }
}

}  // namespace

void EncodeHalf(HalfFormat format, absl::Span<const float> values, char* out) {
  if (format == HalfFormat::kBFloat16) {
    Encode<BFloat16>(values, out);
  } else {
    Encode<Float16>(values, out);
  }
}

void EncodeHalfWithFeedback(HalfFormat format, absl::Span<const float> values,
                            absl::Span<float> residual, char* out) {
  if (format == HalfFormat::kBFloat16) {
    EncodeWithFeedback<BFloat16>(values, residual, out);
  } else {
    EncodeWithFeedback<Float16>(values, residual, out);
  }
}

void DecodeHalf(HalfFormat format, absl::Span<const char> in, float* out) {
  if (format == HalfFormat::kBFloat16) {
    Decode<BFloat16>(in, out);
  } else {
    Decode<Float16>(in, out);
  }
}

}  // namespace mpilearn
