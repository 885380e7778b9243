// The master's gRPC health service (grpc.health.v1.Health), as load
// balancers and Kubernetes probes use it, against the real binary: a
// master with TLS and tokens answers health checks without a token while
// refusing its own calls without one, reports every service SERVING, and on
// SIGTERM says NOT_SERVING for its --drain_s before it stops, exiting 0.
#include <signal.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/client_security.h"
#include "common/client/health_check.h"
#include "common/client/master_client.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

constexpr char kAdminToken[] = "health-admin-token-0123456789";

TEST(HealthTest, ServingWithoutTokenThenNotServingWhileDraining) {
  const std::string dir = NewTempDir("health");
  const absl::Status made = MakeCertificates(dir, "IP:127.0.0.1,DNS:localhost");
  ASSERT_TRUE(made.ok()) << made;
  WriteFileOrDie(dir + "/tokens.txt", absl::StrCat("admin ops ", kAdminToken, "\n"));
  auto master = MasterProcess::Start(
      dir + "/state", {"--drain_s=8", "--tls_cert=" + dir + "/server.pem",
                       "--tls_key=" + dir + "/server.key",
                       "--tokens_file=" + dir + "/tokens.txt"});
  ASSERT_TRUE(master.ok()) << master.status();

  ClientSecurity no_token;
  no_token.tls_ca = dir + "/ca.pem";
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateMasterChannel((*master)->address(), no_token, grpc::ChannelArguments());
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (const std::string service : {"", "mpilearn.v1.Master", "mpilearn.v1.Studies"}) {
    absl::StatusOr<ServingStatus> serving = CheckHealth(*channel, service, absl::Seconds(10));
    ASSERT_TRUE(serving.ok()) << "'" << service << "': " << serving.status();
    EXPECT_EQ(*serving, ServingStatus::kServing) << service;
  }
  // The master's own calls still need a token on the same channel.
  MasterClient::Options options;
  options.security = no_token;
  auto anonymous = MasterClient::Connect((*master)->address(), options);
  const absl::Status refused =
      anonymous.ok() ? (*anonymous)->ListJobs().status() : anonymous.status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;

  // SIGTERM: NOT_SERVING during the 8 s drain (several times a check's 2 s
  // deadline, so a slow machine still sees it), then a clean stop.
  ASSERT_EQ(kill((*master)->process().pid(), SIGTERM), 0);
  bool saw_not_serving = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && !saw_not_serving) {
    absl::StatusOr<ServingStatus> serving = CheckHealth(*channel, "", absl::Seconds(2));
    if (serving.ok() && *serving == ServingStatus::kNotServing) saw_not_serving = true;
    if (!serving.ok()) break;  // stopped already
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(saw_not_serving) << "no NOT_SERVING seen during --drain_s";
  const std::optional<int> exit_code = (*master)->process().Wait(absl::Seconds(60));
  ASSERT_TRUE(exit_code.has_value()) << (*master)->process().Log();
  EXPECT_EQ(*exit_code, 0) << (*master)->process().Log();
  EXPECT_NE((*master)->process().Log().find("health: NOT_SERVING; draining for 8s"),
            std::string::npos)
      << (*master)->process().Log();
}

}  // namespace
}  // namespace mpilearn::testing
