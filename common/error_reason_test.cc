#include "common/error_reason.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

TEST(ErrorReasonTest, AttachedReasonIsReadBack) {
  const absl::Status status = WithReason(absl::AbortedError("stale update: x"),
                                         v1::ERROR_REASON_STALE_UPDATE);
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_STALE_UPDATE);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(), "stale update: x");
}

TEST(ErrorReasonTest, NoReasonIsUnspecified) {
  EXPECT_EQ(ReasonOf(absl::NotFoundError("x")), v1::ERROR_REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), v1::ERROR_REASON_UNSPECIFIED);
  // OK carries no reason.
  EXPECT_TRUE(WithReason(absl::OkStatus(), v1::ERROR_REASON_INTERNAL).ok());
}

TEST(ErrorReasonTest, LaterReasonReplacesEarlier) {
  absl::Status status =
      WithReason(absl::NotFoundError("x"), v1::ERROR_REASON_JOB_UNKNOWN);
  status = WithReason(status, v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_GROUP_UNKNOWN);
}

absl::StatusOr<int> Fails() {
  return GroupUnknownError("group g-1 is not an active group of job j-1");
}
absl::Status Propagates() {
  MPILEARN_ASSIGN_OR_RETURN(int value, Fails());
  (void)value;
  return absl::OkStatus();
}

TEST(ErrorReasonTest, SurvivesTheStatusMacros) {
  const absl::Status status = Propagates();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_GROUP_UNKNOWN);
}

TEST(ErrorReasonTest, RoundTripsThroughGrpcStatus) {
  const absl::Status status = WithReason(absl::FailedPreconditionError("ended"),
                                         v1::ERROR_REASON_JOB_ENDED);
  const grpc::Status wire = ToGrpcStatus(status);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(wire.error_message(), "ended");
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "ended");
  EXPECT_EQ(ReasonOf(back), v1::ERROR_REASON_JOB_ENDED);
}

TEST(ErrorReasonTest, EveryGrpcErrorCarriesAReason) {
  // A status without a reason gets the default for its code on the wire.
  const absl::Status back =
      FromGrpcStatus(ToGrpcStatus(absl::InvalidArgumentError("bad")));
  EXPECT_EQ(ReasonOf(back), v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(absl::UnavailableError("x")))),
            v1::ERROR_REASON_UNAVAILABLE);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(absl::InternalError("x")))),
            v1::ERROR_REASON_INTERNAL);
  EXPECT_TRUE(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
}

TEST(ErrorReasonTest, StatusesWithoutDetailsGetTheDefaultForTheirCode) {
  // Garbage details are ignored.
  const absl::Status garbage = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::NOT_FOUND, "x", std::string("\xff\xff", 2)));
  EXPECT_EQ(garbage.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(garbage), v1::ERROR_REASON_JOB_UNKNOWN);
  // As the gRPC library makes them on the client: no details at all.
  const absl::Status deadline = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"));
  EXPECT_EQ(ReasonOf(deadline), v1::ERROR_REASON_UNAVAILABLE);
}

}  // namespace
}  // namespace mpilearn
