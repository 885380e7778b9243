#include "common/process_stats.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"

namespace mpilearn {
namespace {

TEST(ProcessStatsTest, CpuSecondsGrowWithWork) {
  const double before = ProcessCpuSeconds();
  EXPECT_GE(before, 0.0);
  // Busy work until the process's CPU clock has visibly advanced (bounded by
  // the CPU time itself, not by a count that depends on machine speed).
  volatile uint64_t sink = 0;
  while (ProcessCpuSeconds() < before + 0.02) {
    for (int i = 0; i < 100000; ++i) sink = sink + i;
  }
  EXPECT_GE(ProcessCpuSeconds(), before + 0.02);
}

TEST(ProcessStatsTest, ResidentBytesSeeTouchedMemory) {
  const double before = ProcessResidentBytes();
  ASSERT_GT(before, 0.0);  // Linux always has /proc/self/statm
  // 64 MiB, every page written so it becomes resident.
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<char> block(kBytes, 1);
  const double after = ProcessResidentBytes();
  EXPECT_GE(after, before + 0.9 * kBytes);
  // Keep the block alive (and touched) until after the second reading.
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace mpilearn
