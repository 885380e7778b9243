#include "common/client/health_check.h"

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

// gRPC's own health service, on a free loopback port, is the reference.
class HealthCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    // A server needs one service of its own besides the health service.
    builder.RegisterCallbackGenericService(&generic_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  absl::StatusOr<ServingStatus> Check(const std::string& service) {
    return CheckHealth(channel_, service, absl::Seconds(10));
  }

  int port_ = 0;
  grpc::CallbackGenericService generic_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(HealthCheckTest, ReadsEveryStatusTheServerSets) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  ASSERT_NE(health, nullptr);
  EXPECT_EQ(Check("").value(), ServingStatus::kServing);  // gRPC's default
  health->SetServingStatus(false);
  EXPECT_EQ(Check("").value(), ServingStatus::kNotServing);
  // A named service, long enough that its length takes two varint bytes.
  const std::string name(200, 's');
  health->SetServingStatus(name, true);
  EXPECT_EQ(Check(name).value(), ServingStatus::kServing);
  health->SetServingStatus(name, false);
  EXPECT_EQ(Check(name).value(), ServingStatus::kNotServing);
  const absl::Status unknown = Check("no.such.Service").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  // Shutdown: every service NOT_SERVING, whatever is set afterwards.
  health->Shutdown();
  health->SetServingStatus(name, true);
  EXPECT_EQ(Check(name).value(), ServingStatus::kNotServing);
  EXPECT_EQ(ServingStatusName(ServingStatus::kNotServing), "NOT_SERVING");
}

TEST_F(HealthCheckTest, NoServerIsUnavailable) {
  server_->Shutdown();
  server_.reset();
  const absl::Status gone =
      CheckHealth(channel_, "", absl::Seconds(2)).status();
  EXPECT_TRUE(gone.code() == absl::StatusCode::kUnavailable ||
              gone.code() == absl::StatusCode::kDeadlineExceeded)
      << gone;
}

}  // namespace
}  // namespace mpilearn
