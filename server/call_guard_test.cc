#include "server/call_guard.h"

#include <new>
#include <stdexcept>
#include <vector>

#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

TEST(CallGuardTest, ResultsPassThrough) {
  EXPECT_TRUE(GuardCall("M", [] { return grpc::Status::OK; }).ok());
  const grpc::Status status =
      GuardCall("M", [] { return absl::NotFoundError("unknown job 'x'"); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "unknown job 'x'");
}

TEST(CallGuardTest, AllocationFailureIsResourceExhausted) {
  const grpc::Status status = GuardCall("InitWeights", []() -> absl::Status {
    throw std::bad_alloc();
  });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(status)), v1::ERROR_REASON_LIMIT);
  EXPECT_NE(status.error_message().find("InitWeights"), std::string::npos);
  // What a vector of 10^12 floats throws.
  const grpc::Status length = GuardCall("InitWeights", []() -> absl::Status {
    std::vector<float> values;
    values.reserve(values.max_size() + 1);
    return absl::OkStatus();
  });
  EXPECT_EQ(length.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << length.error_message();
}

TEST(CallGuardTest, OtherExceptionsAreInternalNeverUnknown) {
  const grpc::Status status = GuardCall("ListJobs", []() -> grpc::Status {
    throw std::runtime_error("boom");
  });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(status)), v1::ERROR_REASON_INTERNAL);
  EXPECT_NE(status.error_message().find("boom"), std::string::npos);
  const grpc::Status odd = GuardCall("ListJobs", []() -> grpc::Status {
    throw 42;
  });
  EXPECT_EQ(odd.error_code(), grpc::StatusCode::INTERNAL);
}

}  // namespace
}  // namespace mpilearn::server
