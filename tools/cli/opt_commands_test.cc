// RunStudyCommand when no master answers: every command fails with exit code
// 1 before any RPC, and says where it looked and how to start a master
// there (the commands against a real master are mpilearn_opt_test's).
#include "tools/cli/opt_commands.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn::opt {
namespace {

using ::testing::HasSubstr;

// A loopback port bound but not listening: connections to it are refused.
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address),
                         sizeof(address)) == 0) {
      socklen_t size = sizeof(address);
      if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
        port_ = ntohs(address.sin_port);
      }
    }
  }
  ~ClosedPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(RunStudyCommandTest, NoMasterIsAnErrorThatNamesTheAddress) {
  ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  Options options;
  options.master = absl::StrCat("127.0.0.1:", closed.port());
  options.master_source = "--master";
  options.client.connect_timeout = absl::Milliseconds(300);
  for (const char* name : {"list", "status", "watch", "tell"}) {
    StudyCommand command;
    command.name = name;
    command.operand = "s-1";
    options.trial = 0;
    testing::internal::CaptureStderr();
    EXPECT_EQ(RunStudyCommand(command, options), kExitError) << name;
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr(absl::StrCat("mpilearn-opt: cannot reach "
                                            "mpilearn-master at ",
                                            options.master)))
        << name;
    EXPECT_THAT(err, HasSubstr("taken from --master")) << name;
  }
}

}  // namespace
}  // namespace mpilearn::opt
