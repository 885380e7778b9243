#include "server/core/update/finite_bound.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

using Floats = std::vector<std::vector<float>>;

TEST(FiniteBoundTest, FirstNonFiniteFindsNanAndInf) {
  Floats values = {{0.5f, -2.0f, 3.0f}, {1.0f, 4.0f, -0.25f}};
  EXPECT_EQ(FirstNonFinite(values), -1);
  values[1][2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(values), 1);
  values[0][0] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(values), 0);
}

// Every position of a tensor (the scan's unrolled body and its tail), each
// kind of non-finite value, and the extreme finite ones, against
// std::isfinite.
TEST(FiniteBoundTest, FirstNonFiniteAtEveryPosition) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::nanf(""), -std::nanf("1")};
  const float finite[] = {std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -0.0f};
  for (size_t n : {size_t{1}, size_t{3}, size_t{64}, size_t{65}, size_t{130}}) {
    for (size_t at = 0; at < n; ++at) {
      for (float bad : specials) {
        Floats values = {std::vector<float>(n, 1.0f), std::vector<float>(n, 1.0f)};
        values[1][at] = bad;
        EXPECT_FALSE(std::isfinite(values[1][at]));
        EXPECT_EQ(FirstNonFinite(values), 1) << n << " " << at << " " << bad;
      }
      for (float good : finite) {
        Floats values = {std::vector<float>(n, 1.0f)};
        values[0][at] = good;
        EXPECT_EQ(FirstNonFinite(values), -1) << n << " " << at << " " << good;
      }
    }
  }
}

// MaxAbsBits orders magnitudes as the floats do, puts NaN and Inf above
// every finite value, and FromAbsBits reads the maximum back.
TEST(FiniteBoundTest, MaxAbsBitsIsTheLargestMagnitude) {
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{129}}) {
    std::vector<float> x(n, 0.5f);
    x[n / 2] = -7.25f;
    const int32_t most = MaxAbsBits(x.data(), x.size());
    EXPECT_TRUE(FiniteBits(most));
    EXPECT_EQ(FromAbsBits(most), 7.25) << n;
    x[n - 1] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(FiniteBits(MaxAbsBits(x.data(), x.size())));
  }
  EXPECT_TRUE(FiniteBits(AbsBits(std::numeric_limits<float>::max())));
  EXPECT_FALSE(FiniteBits(AbsBits(std::nanf(""))));
  EXPECT_EQ(MaxAbsBits(nullptr, 0), 0);
}

// A bound is certain only well inside the fp32 range, never when NaN.
TEST(FiniteBoundTest, WithinBoundLeavesRoomForRounding) {
  EXPECT_TRUE(WithinBound(0.0));
  EXPECT_TRUE(WithinBound(1e35));
  EXPECT_FALSE(WithinBound(kCertainlyFiniteBound));
  EXPECT_FALSE(WithinBound(3.4e38));
  EXPECT_FALSE(WithinBound(std::nan("")));
  EXPECT_FALSE(WithinBound(std::numeric_limits<double>::infinity()));
  EXPECT_LT(kCertainlyFiniteBound, std::numeric_limits<float>::max() / 100);
}

}  // namespace
}  // namespace mpilearn::server
