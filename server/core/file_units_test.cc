#include "server/core/file_units.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

bool IsPermutation(std::vector<uint32_t> order) {
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

TEST(FileUnitsTest, EpochOrderIsAPermutationFixedBySeedAndEpoch) {
  const std::vector<uint32_t> a = FileUnits::EpochOrder(7, 0, 1000);
  EXPECT_TRUE(IsPermutation(a));
  EXPECT_EQ(a, FileUnits::EpochOrder(7, 0, 1000));
  EXPECT_NE(a, FileUnits::EpochOrder(7, 1, 1000));
  EXPECT_NE(a, FileUnits::EpochOrder(8, 0, 1000));
  std::vector<uint32_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0u);
  EXPECT_NE(a, identity);
  EXPECT_EQ(FileUnits::EpochOrder(7, 0, 1), std::vector<uint32_t>{0});
  EXPECT_TRUE(FileUnits::EpochOrder(7, 0, 0).empty());
}

// Every order of 3 units turns up, none far from 1/6 of 600 epochs (the
// draw is deterministic, so this is a fixed fact of the generator, not a
// chance one).
TEST(FileUnitsTest, EveryOrderOfThreeUnitsIsDrawn) {
  std::map<std::vector<uint32_t>, int> seen;
  for (int32_t epoch = 0; epoch < 600; ++epoch) {
    ++seen[FileUnits::EpochOrder(1, epoch, 3)];
  }
  ASSERT_EQ(seen.size(), 6u);
  for (const auto& [order, count] : seen) {
    EXPECT_GE(count, 60);
    EXPECT_LE(count, 140);
  }
}

// Files of 10, 0, 7 and 0 rows in units of 4: 3 + 0 + 2 + 0 = 5 units, each
// inside one file, together covering every row once in every epoch.
TEST(FileUnitsTest, UnitsCoverEveryRowOfEveryFileOnce) {
  const std::vector<int64_t> rows = {10, 0, 7, 0};
  FileUnits units(rows, 4, /*seed=*/3);
  ASSERT_EQ(units.units_per_epoch(), 5);
  EXPECT_EQ(FileUnits::CountUnits(rows, 4), 5);
  for (int32_t epoch = 0; epoch < 4; ++epoch) {
    std::set<std::pair<int32_t, int64_t>> covered;
    for (int64_t slot = 0; slot < 5; ++slot) {
      v1::DataUnit unit;
      units.Locate(epoch, slot, &unit);
      ASSERT_GE(unit.file(), 0);
      ASSERT_LT(unit.file(), 4);
      ASSERT_LT(unit.begin(), unit.end());
      ASSERT_LE(unit.end(), rows[static_cast<size_t>(unit.file())]);
      EXPECT_LE(unit.end() - unit.begin(), 4);
      for (int64_t row = unit.begin(); row < unit.end(); ++row) {
        EXPECT_TRUE(covered.emplace(unit.file(), row).second);
      }
    }
    EXPECT_EQ(covered.size(), 17u);
    units.Forget(epoch);
  }
}

}  // namespace
}  // namespace mpilearn::server
