// The load a soak run puts on a master: simulated worker groups speaking
// the Master protocol through MasterClient (no LibTorch, no data files),
// in two phases.
//
//   groups  GroupsLoad: teams of groups, each team serving one small job at
//           a time (the algorithms in turn: downpour with max_staleness 1,
//           sync, easgd, gem): the team's first group submits the job,
//           registers and installs random weights; the others register and
//           pull; every group then loops NextDataUnit / PushGradient x2 /
//           PullWeights / Heartbeat per data unit, reports each epoch it
//           finishes (PullWeights + ReportEpoch), and leaves when the queue
//           says DONE (the finisher with completed = true). The first group
//           then checks the job's status against what the team did and
//           deletes the job (unless keep_ended), and the team goes on with
//           a new job until Stop.
//   churn   ChurnLoad: `jobs` short jobs with larger weights, `concurrency`
//           at a time: submit, register, init, train a few units, then one
//           of three endings by job index (cancel while running; leave,
//           then cancel the re-queued job; train to the end and complete),
//           then DeleteJob, and GetJobStatus to see it gone.
//
// Expected errors (counted by code but not failing the run):
//   - PushGradient ABORTED with reason STALE_UPDATE on the downpour jobs
//     (max_staleness 1 with several groups per job): the group pulls and
//     goes on, as the worker does;
//   - churn: GetJobStatus NOT_FOUND (JOB_UNKNOWN) after DeleteJob.
// Any other error, and any check that comes out wrong, is unexpected: the
// one PushGradient a group makes right after its job was cancelled under it
// must succeed without being applied (the reply is the last weights).
//
// Threading: each load runs its own threads (one per group, one per
// concurrent churn job), each with its own MasterClient and TCP connection;
// Start, Stop, Done and Join are for one controlling thread.
#ifndef MPILEARN_TOOLS_SOAK_SOAK_LOAD_H_
#define MPILEARN_TOOLS_SOAK_SOAK_LOAD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/client_security.h"
#include "tools/soak/soak_stats.h"

namespace mpilearn {
namespace soak {

struct LoadOptions {
  std::string address;      // the master, host:port
  ClientSecurity security;  // plaintext without a token by default
  absl::Duration rpc_timeout = absl::Seconds(30);
  // groups phase
  int groups = 64;
  int groups_per_job = 2;
  bool keep_ended = false;  // leave completed jobs on the master
  // churn phase
  int jobs = 1000;
  int concurrency = 8;
};

// The soak's fixed shapes, for the help text and the report.
inline constexpr int kGroupHidden = 32;  // MLP 64 -> 32 -> 10: 2,442 floats
inline constexpr int kChurnHidden =
    1024;  // MLP 64 -> 1024 -> 10: 76,810 floats
inline constexpr int kGroupEpochs = 2;
inline constexpr int64_t kGroupTrainSamples = 2048;
inline constexpr int64_t kGroupUnitSamples = 128;  // 16 units per epoch
inline constexpr int64_t kChurnTrainSamples = 1024;
inline constexpr int64_t kChurnUnitSamples = 256;  // 4 units, 1 epoch
inline constexpr int kChurnUnitsBeforeEnd = 2;

class GroupsLoad {
 public:
  // Starts options.groups threads; fails only if a client cannot connect.
  static absl::StatusOr<std::unique_ptr<GroupsLoad>> Start(
      const LoadOptions& options, RpcStats& stats);
  ~GroupsLoad();  // Stop()
  GroupsLoad(const GroupsLoad&) = delete;
  GroupsLoad& operator=(const GroupsLoad&) = delete;

  // Asks every group to leave after its current data unit, lets each
  // team's first group cancel and delete an unfinished job, and joins the
  // threads (within about one RPC deadline).
  void Stop();

  // Jobs trained to the end and checked.
  uint64_t jobs_completed() const { return jobs_completed_.load(); }

 private:
  struct Team;
  explicit GroupsLoad(const LoadOptions& options);

  const LoadOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> jobs_completed_{0};
  std::vector<std::unique_ptr<Team>> teams_;
  std::vector<std::thread> threads_;
};

class ChurnLoad {
 public:
  static absl::StatusOr<std::unique_ptr<ChurnLoad>> Start(
      const LoadOptions& options, RpcStats& stats);
  ~ChurnLoad();  // Stop() and Join()
  ChurnLoad(const ChurnLoad&) = delete;
  ChurnLoad& operator=(const ChurnLoad&) = delete;

  // Every job has been handled (or Stop was called and the threads ended).
  bool Done() const { return running_.load() == 0; }
  // Starts no new job; the ones in flight finish.
  void Stop() { stop_ = true; }
  void Join();

  uint64_t jobs_done() const { return jobs_done_.load(); }

 private:
  explicit ChurnLoad(const LoadOptions& options) : options_(options) {}

  const LoadOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_job_{0};
  std::atomic<int> running_{0};
  std::atomic<uint64_t> jobs_done_{0};
  std::vector<std::thread> threads_;
};

}  // namespace soak
}  // namespace mpilearn

#endif  // MPILEARN_TOOLS_SOAK_SOAK_LOAD_H_
