// A cluster of hosts on one machine for the cross-host tests and
// benchmarks: each host is a network namespace with its own address on a
// bridge in the root namespace, joined to it by a veth pair whose rate can
// be limited and
// which can be cut and restored. mpirun spans hosts through an rsh agent
// that enters a host's namespace instead of ssh.
//
//   absl::StatusOr<std::unique_ptr<NetnsCluster>> cluster = NetnsCluster::Create(3);
//   if (!cluster.ok()) GTEST_SKIP() << cluster.status();  // no namespaces here
//   (*cluster)->InHost(0, {"mpilearn-master", "--listen=" + (*cluster)->address(0) + ":0"});
//   (*cluster)->MpirunArgs({1, 2});  // one rank on each of hosts 1 and 2
//   (*cluster)->SetLinkUp(1, false);  // host 1 cut off
//
// Everything it makes (namespaces, links, the bridge) is named after the
// creating process's pid ("ml<pid>h<i>") and removed by the destructor;
// Create also removes what a killed earlier test process left behind (names
// of pids that no longer run). Traffic stays on this machine: the subnet is
// 10.231.X.0/24, with X free among this machine's addresses.
//
// Thread-compatible. Needs root (CAP_NET_ADMIN) and the ip and tc commands.
#ifndef MPILEARN_TOOLS_CLUSTER_NETNS_CLUSTER_H_
#define MPILEARN_TOOLS_CLUSTER_NETNS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mpilearn::tools {

// Runs `argv` through the shell (names, paths and numbers only: nothing is
// quoted), returning its output with stderr; an error naming the command,
// its exit status and output when it fails.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv);

class NetnsCluster {
 public:
  // `hosts` namespaces (1 to 16). FailedPrecondition when this machine
  // refuses namespaces (not root, no ip command): callers skip.
  static absl::StatusOr<std::unique_ptr<NetnsCluster>> Create(int hosts);
  ~NetnsCluster();

  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int hosts() const { return static_cast<int>(names_.size()); }
  // Host i's namespace name and address ("10.231.7.11").
  const std::string& name(int host) const { return names_[host]; }
  const std::string& address(int host) const { return addresses_[host]; }
  // The root namespace's address on the bridge: how a test process
  // (clients, mpirun) reaches the hosts.
  const std::string& bridge_address() const { return bridge_address_; }
  // "10.231.7.0/24".
  const std::string& subnet() const { return subnet_; }
  // Host i's veth end on the bridge, in the root namespace: its byte
  // counters are what the host sent (rx) and received (tx).
  const std::string& root_link(int host) const { return root_links_[host]; }
  // One line per launch through the rsh agent: the namespace it entered.
  const std::string& agent_log() const { return agent_log_; }

  // `argv` run inside host i's namespace: {"ip", "netns", "exec", NAME, ...}.
  std::vector<std::string> InHost(int host, const std::vector<std::string>& argv) const;

  // mpirun flags that put one rank on each of `hosts` (in order), launched
  // through the namespace agent, with Open MPI's traffic on the bridge's
  // subnet: {"--host", "A,B", "--mca", "plm_rsh_agent", AGENT, ...}.
  std::vector<std::string> MpirunArgs(const std::vector<int>& hosts) const;

  // SIGKILLs every process in host i's namespace (`ip netns pids`): the
  // host's share of a run this test started, as if the machine died.
  absl::Status KillHostProcesses(int host);
  // Host i's link up or down (both ends of its veth pair).
  absl::Status SetLinkUp(int host, bool up);
  // Limits host i's link to `mbit` Mbit/s in both directions (tbf on both
  // ends); 0 removes the limit.
  absl::Status SetRateMbit(int host, int mbit);

 private:
  NetnsCluster() = default;
  // Removes everything this cluster made; errors are logged, not returned.
  void TearDown();

  std::string tag_;  // "ml<pid>"
  std::string subnet_;
  std::string bridge_;
  std::string bridge_address_;
  std::string agent_;  // the rsh agent script
  std::string agent_log_;
  std::string host_tmp_;  // one TMPDIR per host under it
  std::vector<std::string> names_;
  std::vector<std::string> addresses_;
  std::vector<std::string> root_links_;  // each host's veth end on the bridge
  std::vector<std::string> host_links_;  // its peer, inside the host

  // One end of a host's link: the command prefix that reaches its namespace
  // (empty for the root namespace) and its device.
  struct LinkEnd {
    std::vector<std::string> prefix;
    std::string device;
  };
  // Host i's two ends: the bridge's side, then the host's.
  std::vector<LinkEnd> Ends(int host) const;
};

}  // namespace mpilearn::tools

#endif  // MPILEARN_TOOLS_CLUSTER_NETNS_CLUSTER_H_
