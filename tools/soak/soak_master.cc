#include "tools/soak/soak_master.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/soak/child_process.h"

namespace mpilearn {
namespace soak {

absl::StatusOr<std::unique_ptr<SoakMaster>> SoakMaster::Start(
    const std::string& binary) {
  absl::StatusOr<std::unique_ptr<tools::TempDir>> dir =
      tools::TempDir::Create("soak");
  if (!dir.ok()) return dir.status();
  const std::string& path = (*dir)->path();
  const std::string port_file = path + "/port";
  std::vector<std::string> args = {
      binary,
      "--listen=127.0.0.1:0",
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--state_dir=", path, "/state"),
      // Metrics served as by default, but on a free port so that several
      // masters (other soaks, tests) can run on one machine.
      "--metrics_listen=127.0.0.1:0",
  };
  absl::StatusOr<std::unique_ptr<tools::MasterChild>> child =
      tools::MasterChild::Start(binary, std::move(args), port_file,
                                path + "/master.log");
  if (!child.ok()) return child.status();
  std::unique_ptr<SoakMaster> master(new SoakMaster());
  master->address_ = absl::StrCat("127.0.0.1:", (*child)->port());
  master->dir_ = *std::move(dir);
  master->child_ = *std::move(child);
  return master;
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
