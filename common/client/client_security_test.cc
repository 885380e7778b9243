#include "common/client/client_security.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.grpc.pb.h"

namespace mpilearn {
namespace {

std::string TempFile(const std::string& name, const std::string& contents) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

TEST(ClientSecurityTest, CheckToken) {
  EXPECT_TRUE(CheckToken("").ok());
  EXPECT_TRUE(CheckToken("abcDEF0123-_.~+/=").ok());
  EXPECT_FALSE(CheckToken("two words").ok());
  EXPECT_FALSE(CheckToken("line\nbreak").ok());
  EXPECT_FALSE(CheckToken(std::string(513, 'a')).ok());
}

TEST(ClientSecurityTest, ReadTokenFileStripsTheNewline) {
  absl::StatusOr<std::string> token =
      ReadTokenFile(TempFile("token", "  s3cr3t-token-value\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cr3t-token-value");
  EXPECT_FALSE(ReadTokenFile(TempFile("empty", "\n")).ok());
  absl::StatusOr<std::string> missing = ReadTokenFile("/nonexistent/token");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/token"),
            std::string::npos);
}

TEST(ClientSecurityTest, RefusesIncompleteOrUnreadableTls) {
  grpc::ChannelArguments args;
  ClientSecurity cert_only;
  cert_only.tls_ca = TempFile("ca.pem", "-----BEGIN CERTIFICATE-----\n");
  cert_only.tls_cert = cert_only.tls_ca;
  EXPECT_EQ(CreateMasterChannel("127.0.0.1:1", cert_only, args).status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientSecurity missing_ca;
  missing_ca.tls_ca = "/nonexistent/ca.pem";
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateMasterChannel("127.0.0.1:1", missing_ca, args);
  ASSERT_FALSE(channel.ok());
  EXPECT_NE(channel.status().message().find("--tls_ca"), std::string::npos);
  ClientSecurity not_pem;
  not_pem.tls_ca = TempFile("not.pem", "hello");
  EXPECT_FALSE(CreateMasterChannel("127.0.0.1:1", not_pem, args).ok());
}

// Answers ListJobs with one job named after the call's authorization
// metadata ("" when absent).
class EchoAuthorization final : public v1::Master::Service {
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    std::string value;
    const auto it = context->client_metadata().find("authorization");
    if (it != context->client_metadata().end()) {
      value.assign(it->second.data(), it->second.size());
    }
    response->add_jobs()->mutable_spec()->set_name(value);
    return grpc::Status::OK;
  }
};

std::string AuthorizationSeen(const std::string& address,
                              const ClientSecurity& security) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateMasterChannel(address, security, grpc::ChannelArguments());
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::Master::NewStub(*channel);
  std::string seen;
  for (int call = 0; call < 2; ++call) {  // every call carries it
    grpc::ClientContext context;
    v1::ListJobsResponse response;
    const grpc::Status status =
        stub->ListJobs(&context, v1::ListJobsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (status.ok() && response.jobs_size() == 1) {
      if (call > 0) {
        EXPECT_EQ(response.jobs(0).spec().name(), seen);
      }
      seen = response.jobs(0).spec().name();
    }
  }
  return seen;
}

TEST(ClientSecurityTest, SendsTheBearerTokenOnEveryCallOverPlaintext) {
  EchoAuthorization service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ClientSecurity with_token;
  with_token.token = "tok-123456789abcdef";
  EXPECT_EQ(AuthorizationSeen(address, with_token),
            "Bearer tok-123456789abcdef");
  EXPECT_EQ(AuthorizationSeen(address, ClientSecurity()), "");
  server->Shutdown();
}

}  // namespace
}  // namespace mpilearn
