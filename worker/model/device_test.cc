#include "worker/model/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn::worker {
namespace {

using ::testing::HasSubstr;

TEST(ResolveDeviceTest, CpuAndAutoWithoutGpus) {
  absl::StatusOr<DeviceChoice> cpu = ResolveDevice("cpu", 3, 0);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->device.is_cpu());
  EXPECT_TRUE(cpu->note.empty());
  absl::StatusOr<DeviceChoice> fallback = ResolveDevice("auto", 3, 0);
  ASSERT_TRUE(fallback.ok());
  EXPECT_TRUE(fallback->device.is_cpu());
  EXPECT_THAT(fallback->note, HasSubstr("training on the CPU"));
}

TEST(ResolveDeviceTest, RanksSpreadOverTheNodesGpus) {
  for (int rank = 0; rank < 6; ++rank) {
    absl::StatusOr<DeviceChoice> choice = ResolveDevice("cuda", rank, 4);
    ASSERT_TRUE(choice.ok());
    EXPECT_TRUE(choice->device.is_cuda());
    EXPECT_EQ(choice->device.index(), rank % 4);
    absl::StatusOr<DeviceChoice> automatic = ResolveDevice("auto", rank, 4);
    ASSERT_TRUE(automatic.ok());
    EXPECT_EQ(automatic->device.index(), rank % 4);
  }
  absl::StatusOr<DeviceChoice> pinned = ResolveDevice("cuda:2", 5, 4);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(pinned->device.index(), 2);
}

TEST(ResolveDeviceTest, ErrorsSayWhatToDo) {
  const absl::Status no_cuda = ResolveDevice("cuda", 0, 0).status();
  EXPECT_EQ(no_cuda.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_cuda.message(), HasSubstr("--device cpu"));
  EXPECT_EQ(ResolveDevice("cuda:4", 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("gpu", 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("cuda:-1", 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// This machine's LibTorch: the whole path from the flag, without a GPU the
// CPU build gives.
TEST(ResolveDeviceTest, ThisBuild) {
  const int gpus = CudaDeviceCount();
  if (gpus > 0) GTEST_SKIP() << "this LibTorch sees " << gpus << " GPU(s)";
  EXPECT_EQ(ResolveDevice("cuda", 0, gpus).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mpilearn::worker
