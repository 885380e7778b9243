#include "tests/slurm_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace mpilearn::testing {
namespace {

constexpr const char* kPrograms[] = {"/usr/sbin/munged", "/usr/sbin/slurmctld",
                                     "/usr/sbin/slurmd", "/usr/bin/sbatch"};
constexpr int kCpusPerNode = 2;

// `value` as one shell word.
std::string Quote(const std::string& value) {
  std::string quoted = "'";
  for (char c : value) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// A TCP port free on `address` now (the kernel's pick for port 0).
absl::StatusOr<int> FreePort(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  socklen_t length = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  close(fd);
  if (!ok) return absl::InternalError("cannot bind a port on " + address);
  return ntohs(addr.sin_port);
}

std::string ReadOrEmpty(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The value of `key` in `scontrol show ... -o` output ("JobState=RUNNING").
std::string FieldOf(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() + 2;
  return line.substr(start, line.find_first_of(" \n", start) - start);
}

bool Ended(const std::string& state) {
  return !state.empty() && state != "PENDING" && state != "RUNNING" &&
         state != "CONFIGURING" && state != "COMPLETING" && state != "SUSPENDED";
}

}  // namespace

std::string SlurmCluster::Node(int host) { return absl::StrCat("n", host + 1); }

absl::StatusOr<std::unique_ptr<SlurmCluster>> SlurmCluster::Start(
    tools::NetnsCluster& hosts) {
  for (const char* program : kPrograms) {
    if (access(program, X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          program, " is missing: install Debian's slurm-wlm and munge "
                   "(tools/install_deps.sh does)"));
    }
  }
  auto cluster = std::unique_ptr<SlurmCluster>(new SlurmCluster(hosts));
  char dir_template[] = "/tmp/mlslurm.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  cluster->dir_ = dir_template;
  const std::string& dir = cluster->dir_;
  std::filesystem::create_directories(dir + "/state");
  for (int i = 0; i < hosts.hosts(); ++i) {
    std::filesystem::create_directories(dir + "/spool-" + Node(i));
    std::filesystem::create_directories(dir + "/tmp-" + Node(i));
  }

  // munged with a key of this cluster's own, on a socket in the directory.
  {
    std::random_device random;
    std::string key(1024, '\0');
    for (char& c : key) c = static_cast<char>(random());
    WriteFileOrDie(dir + "/munge.key", key);
    std::filesystem::permissions(dir + "/munge.key", std::filesystem::perms::owner_read |
                                                         std::filesystem::perms::owner_write);
  }
  auto munged = ChildProcess::Start(
      {"/usr/sbin/munged", "--foreground", "--force", "--key-file=" + dir + "/munge.key",
       "--socket=" + dir + "/munge.sock", "--pid-file=" + dir + "/munged.pid",
       "--seed-file=" + dir + "/munged.seed", "--log-file=" + dir + "/munged.log"},
      dir + "/munged.out");
  if (!munged.ok()) return munged.status();
  cluster->munged_ = *std::move(munged);
  const absl::Time munge_deadline = absl::Now() + absl::Seconds(20);
  while (!std::filesystem::exists(dir + "/munge.sock")) {
    if (absl::Now() > munge_deadline || cluster->munged_->Wait(absl::ZeroDuration())) {
      return absl::InternalError("munged did not start: " + ReadOrEmpty(dir + "/munged.log") +
                                 cluster->munged_->Log());
    }
    absl::SleepFor(absl::Milliseconds(50));
  }

  absl::StatusOr<int> port = FreePort(hosts.bridge_address());
  if (!port.ok()) return port.status();
  if (absl::Status written = cluster->WriteConfig(*port); !written.ok()) return written;

  auto ctld = ChildProcess::Start({"/usr/sbin/slurmctld", "-D", "-f", cluster->conf_},
                                  dir + "/slurmctld.out");
  if (!ctld.ok()) return ctld.status();
  cluster->slurmctld_ = *std::move(ctld);
  for (int i = 0; i < hosts.hosts(); ++i) {
    auto slurmd = ChildProcess::Start(
        hosts.InHost(i, {"/usr/sbin/slurmd", "-D", "-f", cluster->conf_, "-N", Node(i)}),
        absl::StrCat(dir, "/slurmd-", Node(i), ".out"));
    if (!slurmd.ok()) return slurmd.status();
    cluster->slurmds_.push_back(*std::move(slurmd));
  }
  if (absl::Status up = cluster->WaitForNodes(absl::Seconds(60)); !up.ok()) return up;
  return cluster;
}

absl::Status SlurmCluster::WriteConfig(int ctld_port) {
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  std::vector<std::string> addresses;
  for (int i = 0; i < hosts_.hosts(); ++i) addresses.push_back(hosts_.address(i));
  const std::string& d = dir_;
  conf_ = d + "/slurm.conf";
  // No cgroups for jobs (proctrack/linuxproc, task/none), no accounting;
  // SlurmdSpoolDir and TmpFS (PMIx's directories) per node, since every
  // slurmd shares this machine's filesystem.
  WriteFileOrDie(
      conf_,
      absl::StrCat(
          "ClusterName=mltest\n", "SlurmctldHost=", hostname, "(", hosts_.bridge_address(),
          ")\n", "SlurmctldPort=", ctld_port, "\nSlurmdPort=6818\n",
          "SlurmUser=root\nSlurmdUser=root\n", "AuthType=auth/munge\nCredType=cred/munge\n",
          "AuthInfo=socket=", d, "/munge.sock\n", "StateSaveLocation=", d, "/state\n",
          "SlurmdSpoolDir=", d, "/spool-%n\n", "TmpFS=", d, "/tmp-%n\n",
          "SlurmctldPidFile=", d, "/slurmctld.pid\n", "SlurmdPidFile=", d,
          "/slurmd-%n.pid\n", "SlurmctldLogFile=", d, "/slurmctld.log\n",
          "SlurmdLogFile=", d, "/slurmd-%n.log\n",
          "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n",
          "JobAcctGatherType=jobacct_gather/none\n",
          "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n",
          "SchedulerType=sched/backfill\nMpiDefault=none\nReturnToService=2\n",
          "SlurmdParameters=config_overrides\nMailProg=/bin/true\n",
          "NodeName=DEFAULT CPUs=", kCpusPerNode, " Sockets=1 CoresPerSocket=", kCpusPerNode,
          " ThreadsPerCore=1 State=UNKNOWN\n"));
  std::ofstream conf(conf_, std::ios::app);
  for (int i = 0; i < hosts_.hosts(); ++i) {
    conf << "NodeName=" << Node(i) << " NodeAddr=" << hosts_.address(i) << "\n";
  }
  std::vector<std::string> nodes;
  for (int i = 0; i < hosts_.hosts(); ++i) nodes.push_back(Node(i));
  conf << "PartitionName=main Nodes=" << absl::StrJoin(nodes, ",")
       << " Default=YES MaxTime=INFINITE State=UP\n";
  if (!conf) return absl::InternalError("cannot write " + conf_);
  // slurmd reads cgroup.conf next to slurm.conf even without cgroup
  // plugins; name the v1 hierarchy these machines mount.
  WriteFileOrDie(d + "/cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n");
  return absl::OkStatus();
}

absl::Status SlurmCluster::WaitForNodes(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> out = Run({"sinfo", "-h", "-N", "-o", "%N=%T"});
    if (out.ok()) {
      last = *out;
      int idle = 0;
      for (int i = 0; i < hosts_.hosts(); ++i) {
        if (last.find(Node(i) + "=idle") != std::string::npos) ++idle;
      }
      if (idle == hosts_.hosts()) return absl::OkStatus();
    } else {
      last = out.status().ToString();
    }
    if (slurmctld_->Wait(absl::ZeroDuration()).has_value()) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  std::string logs = ReadOrEmpty(dir_ + "/slurmctld.log") + slurmctld_->Log();
  for (int i = 0; i < hosts_.hosts(); ++i) {
    logs += ReadOrEmpty(absl::StrCat(dir_, "/slurmd-", Node(i), ".log"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the Slurm nodes did not come up idle: ", last, "\n", logs));
}

absl::StatusOr<std::string> SlurmCluster::Run(const std::vector<std::string>& argv) const {
  std::vector<std::string> command = {"env", Quote("SLURM_CONF=" + conf_)};
  for (const std::string& a : argv) command.push_back(Quote(a));
  return tools::RunCommand(command);
}

absl::StatusOr<std::string> SlurmCluster::Submit(const std::vector<std::string>& args,
                                                 const std::vector<std::string>& env) {
  std::vector<std::string> argv = env;
  argv.insert(argv.end(), {"sbatch", "--parsable", "--chdir=" + dir_,
                           "--output=" + dir_ + "/slurm-%j.out"});
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::string> out = Run(argv);
  if (!out.ok()) return out.status();
  std::string id(absl::StripAsciiWhitespace(*out));
  id = id.substr(0, id.find(';'));
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InternalError("sbatch printed no job id: " + *out);
  }
  jobs_.push_back(id);
  return id;
}

absl::StatusOr<std::string> SlurmCluster::WaitForEnd(const std::string& job,
                                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string state;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> out = Run({"scontrol", "-o", "show", "job", job});
    if (out.ok()) state = FieldOf(" " + *out, "JobState");
    if (Ended(state)) return state;
    absl::SleepFor(absl::Milliseconds(500));
  }
  (void)Run({"scancel", job});
  return absl::DeadlineExceededError(absl::StrCat("Slurm job ", job, " still ", state,
                                                  " after ", absl::FormatDuration(timeout),
                                                  "; its output:\n", Output(job)));
}

std::string SlurmCluster::Output(const std::string& job) const {
  return ReadOrEmpty(absl::StrCat(dir_, "/slurm-", job, ".out"));
}

std::string SlurmCluster::NodeLog(int host) const {
  return ReadOrEmpty(absl::StrCat(dir_, "/slurmd-", Node(host), ".log"));
}

SlurmCluster::~SlurmCluster() {
  if (!jobs_.empty() && slurmctld_ != nullptr) {
    std::vector<std::string> cancel = {"scancel"};
    cancel.insert(cancel.end(), jobs_.begin(), jobs_.end());
    (void)Run(cancel);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::string> queue = Run({"squeue", "-h", "-o", "%i"});
      if (!queue.ok() || absl::StripAsciiWhitespace(*queue).empty()) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
  }
  slurmds_.clear();  // SIGTERM to each slurmd
  // slurmstepd and the tasks it started detach from slurmd: whatever is
  // left in a node's namespace is this test's.
  for (int i = 0; i < hosts_.hosts(); ++i) {
    if (absl::Status killed = hosts_.KillHostProcesses(i); !killed.ok()) {
      LOG(WARNING) << killed;
    }
  }
  slurmctld_.reset();
  munged_.reset();
  if (!dir_.empty() && std::getenv("MPILEARN_KEEP_SLURM_DIR") == nullptr) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace mpilearn::testing
