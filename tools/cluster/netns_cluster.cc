#include "tools/cluster/netns_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace mpilearn::tools {

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv) {
  const std::string command = absl::StrCat(absl::StrJoin(argv, " "), " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed: " + command);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' failed (", status,
                                            "): ", output));
  }
  return output;
}

namespace {

bool PidRuns(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// Removes namespaces and links named "ml<pid>..." of pids that no longer
// run: what a test killed before its destructor ran left behind.
void RemoveStale() {
  const std::regex netns(R"(^ml(\d+)h\d+)");
  if (absl::StatusOr<std::string> list = RunCommand({"ip", "netns", "list"}); list.ok()) {
    for (absl::string_view line : absl::StrSplit(*list, '\n')) {
      std::smatch match;
      const std::string entry(line.substr(0, line.find(' ')));
      if (std::regex_search(entry, match, netns) &&
          !PidRuns(std::stoi(match[1].str()))) {
        (void)RunCommand({"ip", "netns", "del", entry});
      }
    }
  }
  const std::regex link(R"(^\d+: (ml[bv](\d+)\w*)[@:])");
  if (absl::StatusOr<std::string> links = RunCommand({"ip", "-o", "link", "show"});
      links.ok()) {
    for (absl::string_view line : absl::StrSplit(*links, '\n')) {
      std::smatch match;
      const std::string text(line);
      if (std::regex_search(text, match, link) &&
          !PidRuns(std::stoi(match[2].str()))) {
        (void)RunCommand({"ip", "link", "del", match[1].str()});
      }
    }
  }
}

// A /24 of 10.231.X.0 that no address of this machine is in.
absl::StatusOr<int> FreeSubnet() {
  absl::StatusOr<std::string> addresses = RunCommand({"ip", "-4", "-o", "addr", "show"});
  if (!addresses.ok()) return addresses.status();
  std::set<int> used;
  const std::regex in_range(R"(inet 10\.231\.(\d+)\.)");
  for (std::sregex_iterator it(addresses->begin(), addresses->end(), in_range), end;
       it != end; ++it) {
    used.insert(std::stoi((*it)[1].str()));
  }
  const int start = static_cast<int>(getpid() % 250);
  for (int i = 0; i < 250; ++i) {
    const int x = 1 + (start + i) % 250;
    if (used.count(x) == 0) return x;
  }
  return absl::ResourceExhaustedError("no free subnet in 10.231.0.0/16");
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetnsCluster>> NetnsCluster::Create(int hosts) {
  if (hosts < 1 || hosts > 16) {
    return absl::InvalidArgumentError(absl::StrCat("hosts must be 1 to 16, got ", hosts));
  }
  if (geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root");
  }
  if (!RunCommand({"ip", "netns", "list"}).ok()) {
    return absl::FailedPreconditionError("this machine refuses 'ip netns'");
  }
  RemoveStale();
  auto cluster = std::unique_ptr<NetnsCluster>(new NetnsCluster());
  NetnsCluster& c = *cluster;
  c.tag_ = absl::StrCat("ml", getpid());
  absl::StatusOr<int> x = FreeSubnet();
  if (!x.ok()) return x.status();
  const std::string prefix = absl::StrCat("10.231.", *x, ".");
  c.subnet_ = prefix + "0/24";
  c.bridge_ = absl::StrCat("mlb", getpid());
  c.bridge_address_ = prefix + "1";
  // From here on the destructor removes whatever was made.
  auto run = [](const std::vector<std::string>& argv) -> absl::Status {
    absl::StatusOr<std::string> out = RunCommand(argv);
    return out.ok() ? absl::OkStatus() : out.status();
  };
  std::vector<std::vector<std::string>> steps = {
      {"ip", "link", "add", c.bridge_, "type", "bridge"},
      {"ip", "addr", "add", c.bridge_address_ + "/24", "dev", c.bridge_},
      {"ip", "link", "set", c.bridge_, "up"},
  };
  for (int i = 0; i < hosts; ++i) {
    const std::string name = absl::StrCat(c.tag_, "h", i);
    const std::string outside = absl::StrCat("mlv", getpid(), "h", i);
    const std::string inside = absl::StrCat("mlv", getpid(), "n", i);
    const std::string address = absl::StrCat(prefix, 11 + i);
    c.names_.push_back(name);
    c.addresses_.push_back(address);
    c.root_links_.push_back(outside);
    c.host_links_.push_back(inside);
    std::vector<std::vector<std::string>> host = {
        {"ip", "netns", "add", name},
        {"ip", "link", "add", outside, "type", "veth", "peer", "name", inside},
        {"ip", "link", "set", inside, "netns", name},
        {"ip", "link", "set", outside, "master", c.bridge_},
        {"ip", "link", "set", outside, "up"},
        {"ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"},
        {"ip", "netns", "exec", name, "ip", "addr", "add", address + "/24", "dev",
         inside},
        {"ip", "netns", "exec", name, "ip", "link", "set", inside, "up"},
    };
    steps.insert(steps.end(), host.begin(), host.end());
  }
  for (const auto& step : steps) {
    if (absl::Status status = run(step); !status.ok()) return status;
  }
  // The rsh agent: mpirun names a host by its address; the agent runs the
  // command in that address's namespace.
  c.agent_ = absl::StrCat(std::filesystem::temp_directory_path().string(), "/",
                          c.tag_, "-agent.sh");
  c.agent_log_ = c.agent_ + ".log";
  // Each host's own TMPDIR: the namespaces share one file system and one
  // host name, and Open MPI's daemons on two hosts would otherwise race for
  // the same session directory.
  c.host_tmp_ = c.agent_.substr(0, c.agent_.size() - 3) + "-tmp";
  for (const std::string& name : c.names_) {
    std::filesystem::create_directories(c.host_tmp_ + "/" + name);
  }
  {
    std::ofstream agent(c.agent_);
    agent << "#!/bin/sh\n# mpirun's rsh agent: the host is a namespace's address\n"
          << "host=\"$1\"; shift\ncase \"$host\" in\n";
    for (int i = 0; i < hosts; ++i) {
      agent << "  " << c.addresses_[i] << "|" << c.names_[i] << ") ns=" << c.names_[i]
            << " ;;\n";
    }
    agent << "  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
          << "echo \"$ns\" >>" << c.agent_log_ << "\n"
          << "TMPDIR=" << c.host_tmp_ << "/$ns; export TMPDIR\n"
          << "exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n";
  }
  std::filesystem::permissions(c.agent_, std::filesystem::perms::owner_all);
  return cluster;
}

NetnsCluster::~NetnsCluster() { TearDown(); }

void NetnsCluster::TearDown() {
  for (const std::string& name : names_) {
    if (absl::StatusOr<std::string> out = RunCommand({"ip", "netns", "del", name}); !out.ok()) {
      LOG(WARNING) << out.status();
    }
  }
  // Deleting a namespace deletes its veth ends, and with them their peers.
  for (const std::string& link : root_links_) (void)RunCommand({"ip", "link", "del", link});
  if (!bridge_.empty()) (void)RunCommand({"ip", "link", "del", bridge_});
  if (!agent_.empty()) std::filesystem::remove(agent_);
  if (!agent_log_.empty()) std::filesystem::remove(agent_log_);
  if (!host_tmp_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(host_tmp_, ignored);
  }
}

std::vector<std::string> NetnsCluster::InHost(
    int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> in = {"ip", "netns", "exec", names_[host]};
  in.insert(in.end(), argv.begin(), argv.end());
  return in;
}

std::vector<std::string> NetnsCluster::MpirunArgs(const std::vector<int>& hosts) const {
  std::vector<std::string> addresses;
  for (int host : hosts) addresses.push_back(addresses_[host]);
  return {"--host", absl::StrJoin(addresses, ","),
          "--mca", "plm_rsh_agent", agent_,
          "--mca", "oob_tcp_if_include", subnet_,
          "--mca", "btl_tcp_if_include", subnet_,
          "--mca", "btl", "tcp,self",
          // mpirun maps its hardware topology into a hole of its address
          // space for the daemons to share; picking "the biggest" hole
          // crashed mpirun once in hwloc_shmem_topology_write here.
          // Daemons on other hosts read their own topology anyway.
          "--mca", "rtc_hwloc_vmhole", "none"};
}

std::vector<NetnsCluster::LinkEnd> NetnsCluster::Ends(int host) const {
  return {{{}, root_links_[host]}, {InHost(host, {}), host_links_[host]}};
}

absl::Status NetnsCluster::SetLinkUp(int host, bool up) {
  for (const LinkEnd& end : Ends(host)) {
    std::vector<std::string> argv = end.prefix;
    argv.insert(argv.end(), {"ip", "link", "set", end.device, up ? "up" : "down"});
    absl::StatusOr<std::string> out = RunCommand(argv);
    if (!out.ok()) return out.status();
  }
  return absl::OkStatus();
}

absl::Status NetnsCluster::KillHostProcesses(int host) {
  absl::StatusOr<std::string> pids = RunCommand({"ip", "netns", "pids", names_[host]});
  if (!pids.ok()) return pids.status();
  for (absl::string_view line : absl::StrSplit(*pids, '\n', absl::SkipEmpty())) {
    int pid = 0;
    if (absl::SimpleAtoi(line, &pid) && pid > 1) kill(pid, SIGKILL);
  }
  return absl::OkStatus();
}

absl::Status NetnsCluster::SetRateMbit(int host, int mbit) {
  for (const LinkEnd& end : Ends(host)) {
    std::vector<std::string> argv = end.prefix;
    argv.insert(argv.end(), {"tc", "qdisc", "del", "dev", end.device, "root"});
    (void)RunCommand(argv);  // no qdisc yet is fine
    if (mbit <= 0) continue;
    argv = end.prefix;
    argv.insert(argv.end(), {"tc", "qdisc", "add", "dev", end.device, "root", "tbf", "rate",
                             absl::StrCat(mbit, "mbit"), "burst", "32kbit", "latency", "50ms"});
    absl::StatusOr<std::string> out = RunCommand(argv);
    if (!out.ok()) return out.status();
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::tools
