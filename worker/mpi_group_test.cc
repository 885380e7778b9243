// BroadcastStatus over a fake group of ranks on threads: every rank ends up
// with the leader's code and error reason, so every rank classifies the
// leader's error (worker/master_errors.h) the same way.
#include "worker/mpi_group.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/error_reason.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/fake_collectives.h"
#include "worker/master_errors.h"

namespace mpilearn::worker {
namespace {

// Every rank's result of BroadcastStatus(rank's status, root).
std::vector<absl::Status> BroadcastFrom(int size, int root,
                                        const absl::Status& roots_status) {
  FakeGroup group(size);
  std::vector<absl::Status> received(size);
  group.Run([&](Collectives& rank) {
    // Non-roots pass something else: only the root's status counts.
    const absl::Status mine = rank.rank() == root
                                  ? roots_status
                                  : absl::InternalError("not the root's");
    received[rank.rank()] = BroadcastStatus(rank, mine, root);
  });
  return received;
}

TEST(BroadcastStatusTest, OkReachesEveryRank) {
  for (const absl::Status& status : BroadcastFrom(3, 0, absl::OkStatus())) {
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(BroadcastStatusTest, KeepsCodeReasonAndMessage) {
  const absl::Status lost =
      GroupUnknownError("group g-2 was declared lost; RegisterGroup again");
  const std::vector<absl::Status> received = BroadcastFrom(3, 0, lost);
  EXPECT_EQ(received[0], lost);  // the root's own, unchanged
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(received[r].code(), lost.code()) << r;
    EXPECT_EQ(ReasonOf(received[r]), v1::ERROR_REASON_GROUP_UNKNOWN) << r;
    EXPECT_EQ(received[r].message(),
              "the leader failed: group g-2 was declared lost; RegisterGroup again");
  }
  for (const absl::Status& status : received) EXPECT_TRUE(IsGroupUnknown(status));
}

TEST(BroadcastStatusTest, StatusWithoutReasonStaysWithoutOne) {
  const std::vector<absl::Status> received =
      BroadcastFrom(2, 1, absl::UnavailableError("connection refused"));
  EXPECT_EQ(received[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(received[0]), v1::ERROR_REASON_UNSPECIFIED);
  EXPECT_EQ(received[1].message(), "connection refused");
}

TEST(BroadcastStatusTest, EmptyMessageAndStaleReason) {
  const absl::Status stale =
      WithReason(absl::AbortedError(""), v1::ERROR_REASON_STALE_UPDATE);
  const std::vector<absl::Status> received = BroadcastFrom(2, 0, stale);
  EXPECT_EQ(received[1].code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(IsStaleRejection(received[1]));
  EXPECT_FALSE(IsGroupUnknown(received[1]));
}

TEST(MasterErrorsTest, ReasonDecidesNotText) {
  // The old message-matching would have called this group-unknown.
  EXPECT_FALSE(IsGroupUnknown(absl::NotFoundError("RegisterGroup first")));
  EXPECT_FALSE(IsStaleRejection(absl::AbortedError("stale update")));
  EXPECT_TRUE(IsGroupUnknown(GroupUnknownError("anything")));
  EXPECT_FALSE(IsGroupUnknown(absl::OkStatus()));
}

}  // namespace
}  // namespace mpilearn::worker
