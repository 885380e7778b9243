#include "tools/soak_master.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/child_process.h"

namespace mpilearn {
namespace soak {

absl::StatusOr<std::unique_ptr<SoakMaster>> SoakMaster::Start(
    const std::string& binary) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                 "/mpilearn-soak.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary directory ", dir, ": ",
                     std::strerror(errno)));
  }
  const std::string port_file = dir + "/port";
  const std::string log = dir + "/master.log";
  std::vector<std::string> args = {
      binary,
      "--listen=127.0.0.1:0",
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--state_dir=", dir, "/state"),
      // Metrics served as by default, but on a free port so that several
      // masters (other soaks, tests) can run on one machine.
      "--metrics_listen=127.0.0.1:0",
  };
  const absl::StatusOr<pid_t> spawned =
      tools::SpawnWithLog(binary, std::move(args), log);
  if (!spawned.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return spawned.status();
  }
  const pid_t pid = *spawned;
  std::unique_ptr<SoakMaster> master(new SoakMaster(pid, dir));
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    if (!master->Running()) {
      return absl::InternalError(absl::StrCat(
          "mpilearn-master exited at start; its log:\n", master->LogTail()));
    }
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      master->address_ = absl::StrCat("127.0.0.1:", port);
      return master;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("mpilearn-master wrote no port file in 60 s; its log:\n",
                   master->LogTail()));
}

SoakMaster::~SoakMaster() {
  Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

bool SoakMaster::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void SoakMaster::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > give_up) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  pid_ = -1;
}

std::string SoakMaster::LogTail(size_t bytes) const {
  std::ifstream in(dir_ + "/master.log", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

absl::StatusOr<double> ResidentMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  if (!in) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    rest = absl::StripAsciiWhitespace(rest);
    double kib = 0;
    if (!absl::SimpleAtod(rest, &kib)) break;
    return kib / 1024.0;
  }
  // A zombie has no VmRSS line: it is gone as far as memory goes.
  return absl::NotFoundError(
      absl::StrCat("process ", pid, " has no VmRSS (exited?)"));
}

absl::StatusOr<double> CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: fields are counted after
  // its closing parenthesis, where field 3 (state) comes first.
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(paren + 1), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;  // fields 14 and 15, in clock ticks
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return absl::NotFoundError(
        absl::StrCat("process ", pid, ": unreadable stat"));
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace soak
}  // namespace mpilearn
