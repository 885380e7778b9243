// A real Slurm cluster on the hosts of a NetnsCluster, for the tests that
// run the deploy/ batch scripts: munged and slurmctld (Debian's slurm-wlm
// and munge) in the root namespace on the bridge's address, and one slurmd
// per host, each in its host's namespace as node n1, n2, ... The daemons run
// in the foreground as ChildProcesses; their configuration, state, spool
// and log files are in one short directory under /tmp (Unix socket paths
// must stay short), removed at the end.
//
//   auto slurm = SlurmCluster::Start(*hosts);
//   if (!slurm.ok()) GTEST_SKIP() << slurm.status();  // no Slurm here
//   absl::StatusOr<std::string> id = (*slurm)->Submit({"--nodes=3", script, spec});
//   absl::StatusOr<std::string> state = (*slurm)->WaitForEnd(*id, absl::Minutes(5));
//
// The destructor cancels every Slurm job, stops the daemons and kills what
// is left in the hosts' namespaces (every process there was started by this
// test through Slurm).
#ifndef MPILEARN_TESTS_SLURM_CLUSTER_H_
#define MPILEARN_TESTS_SLURM_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/test_process.h"
#include "tools/cluster/netns_cluster.h"

namespace mpilearn::testing {

class SlurmCluster {
 public:
  // Every host of `hosts` becomes a node with 2 CPUs. FailedPrecondition
  // when Slurm or munge is not installed (callers skip); other errors when a
  // daemon does not come up (with its log).
  static absl::StatusOr<std::unique_ptr<SlurmCluster>> Start(
      tools::NetnsCluster& hosts);
  ~SlurmCluster();

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Host i's node name: "n<i+1>".
  static std::string Node(int host);
  // The Slurm configuration file (SLURM_CONF for Slurm's commands).
  const std::string& conf() const { return conf_; }
  // Where each job's output goes: dir()/slurm-<id>.out.
  const std::string& dir() const { return dir_; }

  // `sbatch --parsable <args>` with SLURM_CONF and `env` ("NAME=value")
  // added to this process's environment; the Slurm job id.
  absl::StatusOr<std::string> Submit(const std::vector<std::string>& args,
                                     const std::vector<std::string>& env = {});
  // Polls the job until it ends: its JobState (COMPLETED, FAILED, ...), or
  // DEADLINE_EXCEEDED with the last state after `timeout` (the job is
  // cancelled).
  absl::StatusOr<std::string> WaitForEnd(const std::string& job, absl::Duration timeout);
  // A Slurm command (`srun ...`, `sinfo`) with SLURM_CONF set: its output
  // with stderr, or an error with them when it fails.
  absl::StatusOr<std::string> Run(const std::vector<std::string>& argv) const;
  // The job's output file, read.
  std::string Output(const std::string& job) const;
  // What slurmd of host i logged (which steps it launched).
  std::string NodeLog(int host) const;

 private:
  explicit SlurmCluster(tools::NetnsCluster& hosts) : hosts_(hosts) {}
  absl::Status WriteConfig(int ctld_port);
  absl::Status WaitForNodes(absl::Duration timeout);

  tools::NetnsCluster& hosts_;
  std::string dir_;
  std::string conf_;
  std::unique_ptr<ChildProcess> munged_;
  std::unique_ptr<ChildProcess> slurmctld_;
  std::vector<std::unique_ptr<ChildProcess>> slurmds_;
  std::vector<std::string> jobs_;
};

}  // namespace mpilearn::testing

#endif  // MPILEARN_TESTS_SLURM_CLUSTER_H_
