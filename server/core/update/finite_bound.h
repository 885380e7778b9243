// "Finite and within bound": the one test behind the update guard, shared by
// the update admission (the scan of an incoming update), the update rules
// and the CPU optimizer (the magnitudes a step writes, the bound it is
// vouched for by).
//
// A float's magnitude is read as the bit pattern of |x| as an int32
// (AbsBits): for finite floats the patterns order as the magnitudes do, and
// NaN and Inf (exponent all ones) lie above kMaxFiniteBits. An int32 max
// over them vectorises at -O2 where a NaN-aware float max does not, so one
// pass yields both the largest magnitude and whether anything is non-finite.
//
// A bound (in double) that a step is computed to stay under is "certain"
// when it is below kCertainlyFiniteBound (WithinBound): far enough inside
// the fp32 range (3.4e38) that the rounding of fp32 arithmetic cannot carry
// a value bounded there past it. NaN bounds are never within bound.
//
// Plain functions, no state: callable from any thread.
#ifndef MPILEARN_SERVER_CORE_UPDATE_FINITE_BOUND_H_
#define MPILEARN_SERVER_CORE_UPDATE_FINITE_BOUND_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mpilearn::server {

// AbsBits of the largest finite float; anything above is NaN or Inf.
inline constexpr int32_t kMaxFiniteBits = 0x7f7fffff;

// See the file comment.
inline constexpr double kCertainlyFiniteBound = 1e36;

// |x|'s bit pattern as a non-negative int32.
inline int32_t AbsBits(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffff;
}

// The magnitude whose AbsBits are `bits`.
inline double FromAbsBits(int32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return static_cast<double>(x);
}

// Whether a magnitude measured as AbsBits is finite.
inline bool FiniteBits(int32_t bits) { return bits <= kMaxFiniteBits; }

// Whether a bound on magnitudes is certain to stay finite (false for NaN).
inline bool WithinBound(double bound) { return bound < kCertainlyFiniteBound; }

// The largest AbsBits of x[0, n): above kMaxFiniteBits when any is NaN or
// Inf. Fixed blocks, which GCC's -O2 vectoriser turns into SSE2 compares.
inline int32_t MaxAbsBits(const float* x, size_t n) {
  constexpr size_t kBlock = 64;
  int32_t most = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int32_t bits[kBlock];
    std::memcpy(bits, x + i, sizeof(bits));
    for (size_t k = 0; k < kBlock; ++k) {
      most = std::max(most, bits[k] & 0x7fffffff);
    }
  }
  for (; i < n; ++i) most = std::max(most, AbsBits(x[i]));
  return most;
}

// Index of the first tensor of `tensors` (a list of float ranges with
// data() and size(): vectors or spans) holding NaN or Inf, or -1. Costly on
// a large model: callers scan outside their locks where they can.
template <typename Tensors>
int FirstNonFinite(const Tensors& tensors) {
  int t = 0;
  for (const auto& tensor : tensors) {
    if (!FiniteBits(MaxAbsBits(tensor.data(), tensor.size()))) return t;
    ++t;
  }
  return -1;
}

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_UPDATE_FINITE_BOUND_H_
