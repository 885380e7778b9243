// The master a soak run drives: an mpilearn-master child process that the
// soak starts itself, as a user would (a loopback port picked by the master,
// a fresh temporary --state_dir, metrics on a free loopback port), and the
// master's resident memory read from /proc.
//
//   MPILEARN_ASSIGN_OR_RETURN(auto master, SoakMaster::Start(binary));
//   ... MasterClient on master->address() ...
//   absl::StatusOr<double> rss = ResidentMiB(master->pid());
//
// Only the pid this process started is ever signalled, and only the
// temporary directory it created is removed.
#ifndef MPILEARN_TOOLS_SOAK_SOAK_MASTER_H_
#define MPILEARN_TOOLS_SOAK_SOAK_MASTER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/soak/child_process.h"

namespace mpilearn {
namespace soak {

// An mpilearn-master child on 127.0.0.1, port 0 (read back from its
// --port_file), with --state_dir and its log in a temporary directory
// (tools::MasterChild in a tools::TempDir). The destructor ends the child
// (SIGTERM, SIGKILL after 10 s), then removes the directory. The child gets
// SIGKILL if this process dies first (PR_SET_PDEATHSIG), so no master
// outlives a crashed soak; its temporary directory is then left behind
// (its path is in the log line Start prints). Thread-compatible; create
// and destroy it on the main thread (the death signal follows the thread
// that forked).
class SoakMaster {
 public:
  // Starts `binary` and waits up to 60 s for its port file. Errors carry
  // the end of the master's log.
  static absl::StatusOr<std::unique_ptr<SoakMaster>> Start(
      const std::string& binary);

  SoakMaster(const SoakMaster&) = delete;
  SoakMaster& operator=(const SoakMaster&) = delete;

  const std::string& address() const { return address_; }
  pid_t pid() const { return child_->pid(); }
  const std::string& dir() const { return dir_->path(); }

  // Whether the child is still running (false once it exited: a crash).
  bool Running() { return child_->Running(); }

  // The last `bytes` of the master's log, for error messages.
  std::string LogTail(size_t bytes = 4096) const {
    return child_->LogTail(bytes);
  }

 private:
  SoakMaster() = default;

  std::string address_;
  // Destroyed in reverse: the child ends before its directory goes.
  std::unique_ptr<tools::TempDir> dir_;
  std::unique_ptr<tools::MasterChild> child_;
};

// The resident memory (VmRSS) of process `pid` in MiB, from
// /proc/PID/status; NOT_FOUND when the process is gone.
absl::StatusOr<double> ResidentMiB(pid_t pid);

// The CPU time (user + system, all threads) process `pid` has used, in
// seconds, from /proc/PID/stat; NOT_FOUND when the process is gone.
absl::StatusOr<double> CpuSeconds(pid_t pid);

}  // namespace soak
}  // namespace mpilearn

#endif  // MPILEARN_TOOLS_SOAK_SOAK_MASTER_H_
