#include "server/opt/pareto.h"

#include <vector>

#include "gtest/gtest.h"

namespace mpilearn::opt {
namespace {

TEST(ParetoTest, DominanceNeedsNoWorseEverywhereAndBetterOnce) {
  EXPECT_TRUE(Dominates({1, 2}, {1, 3}));
  EXPECT_TRUE(Dominates({0, 0, 0}, {1, 1, 1}));
  EXPECT_FALSE(Dominates({1, 3}, {1, 2}));
  EXPECT_FALSE(Dominates({1, 2}, {1, 2}));  // equal
  EXPECT_FALSE(Dominates({0, 5}, {5, 0}));  // a trade-off
}

TEST(ParetoTest, TheFrontIsWhatNothingDominates) {
  // (error, size): 0 and 1 trade off, 2 is worse than 0 in both, 3 equals
  // 1, 4 is best in error alone.
  const std::vector<std::vector<double>> points = {
      {0.1, 300}, {0.2, 100}, {0.3, 400}, {0.2, 100}, {0.05, 900}, {0.2, 150}};
  EXPECT_EQ(ParetoFront(points), (std::vector<size_t>{0, 1, 3, 4}));
  EXPECT_TRUE(ParetoFront({}).empty());
  EXPECT_EQ(ParetoFront({{1, 1}}), (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace mpilearn::opt
