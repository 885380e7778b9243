// One run of mpilearn-worker, after its flags are checked: the group's (or
// the validation pool's) whole life, from starting MPI to the last line it
// prints.
//
//   GroupSession::Options options;  // from the flags (worker_main.cc)
//   options.master = "127.0.0.1:7070";
//   options.job_spec_path = "spec.json";
//   GroupSession session(std::move(options));
//   return session.Run(&argc, &argv);  // the process's exit code
//
// Training role: every rank connects to the master (or, in local mode, the
// process builds the in-process LocalMaster); the leader submits the job
// and registers the group and broadcasts the registration; every rank loads
// its data and runs the Trainer. A group the master stops knowing (it
// restarted from a checkpoint, or declared the group lost) registers again
// and continues. At the end the leader leaves the job (completing it when
// this group finished the data), prints the run's lines (`job ...: group
// ... trained ...`, `test_loss=`, `test_accuracy=`) and writes
// --summary_json (run_summary.h).
//
// Serving (training role, Options::serve): the group trains queued job
// after queued job without restarting mpirun. The leader registers with an
// empty job id; while the master has no queued job (NOT_FOUND with reason
// NO_QUEUED_JOB) every rank sleeps serve_poll and the leader asks again.
// Each job runs exactly as a single job does (TrainJob); a job that fails on
// every rank together (bad spec, data error, a master error the leader
// broadcast) leaves with its error and the group takes the next one. The
// group ends, exit code 0, after exit_when_idle without a queued job or on
// SIGTERM/SIGINT, which the leader notices between jobs (a job in progress
// is finished first; a second signal ends the process at once). It ends
// with exit code 1 when the master cannot be asked (registration fails for
// another reason) or a job failed on one rank alone (the group is aborted,
// as in single-job mode). Every decision is the leader's, broadcast, so all
// ranks take the same branch.
//
// Validate role: the ranks form a ValidationPool (validation_pool.h) until
// SIGTERM/SIGINT or --exit_when_idle_s.
//
// Liveness (training): the leader promises Options::heartbeat at every
// registration and, for as long as the group is registered to a job (data
// loading and rejoins included), a GroupHeartbeat thread
// (group_heartbeat.h) calls Heartbeat at that period. A master that refuses
// the period (more than a third of its --group_timeout_s) gets a warning
// and a registration without one. Training one job (not serving), the
// leader's SIGTERM/SIGINT handler only stores the signal; the heartbeat
// thread then leaves the group (so the master re-queues its units at once)
// and ends the process with exit code 1: this is how a group ends fast when
// mpirun terminates it after another rank died.
//
// With a trace path, every rank records spans in memory and rank 0 writes
// them all to one Chrome trace file when the group ends.
//
// Threading: Run is called once, on the process's main thread, which is the
// MPI thread; the leader adds its heartbeat thread while it trains a job.
// In the validate role, when serving and (leader) while training one job,
// Run installs SIGTERM/SIGINT handlers.
#ifndef MPILEARN_WORKER_SESSION_H_
#define MPILEARN_WORKER_SESSION_H_

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "common/client/master_connection.h"
#include "common/trace.h"
#include "proto/mpilearn.pb.h"
#include "worker/mpi_group.h"
#include "worker/progress.h"

namespace mpilearn::worker {

class GroupSession {
 public:
  enum class Role {
    kTrain,     // a training group
    kValidate,  // a validation pool
  };

  // Checked values of the worker's flags (worker_main.cc checks them: e.g.
  // local needs job_spec_path, the validate role takes neither).
  struct Options {
    Role role = Role::kTrain;
    // Local baseline mode: one process, no MPI, no master; the master's
    // core runs in this process (LocalMaster), writing under
    // local_state_dir with optimizer_threads CPU threads.
    bool local = false;
    std::string local_state_dir = "mpilearn-local-state";
    int optimizer_threads = 1;
    // host:port of the master (not local), and how calls to it behave.
    std::string master;
    MasterClient::Options connection;
    // Training: a job spec file to submit, or an existing job to serve;
    // both empty: the master's oldest queued job.
    std::string job_spec_path;
    std::string job_id;
    // Training, not local, neither job_spec_path nor job_id: serve queued
    // jobs one after another (see the file comment), asking the master
    // every serve_poll while none is queued.
    bool serve = false;
    absl::Duration serve_poll = absl::Seconds(1);
    // Training: the leader's heartbeat period (--heartbeat_s); zero: none.
    absl::Duration heartbeat = absl::Seconds(2);
    // Compute threads per rank; 0 divides the node's cores among its ranks.
    int threads = 0;
    // --device: auto, cpu, cuda or cuda:N (worker/model/device.h).
    std::string device = "auto";
    // Non-empty: the leader writes the RunSummary here as JSON when done
    // (serving: after every job that trained, so it holds the last one's).
    std::string summary_json;
    // Test aid: sleep this long after every batch (a slow group).
    int slowdown_ms_per_batch = 0;
    // Test aid: the first N streamed unit reads fail (fault injection).
    int fail_unit_reads = 0;
    // The leader's progress line (training).
    ProgressOptions progress;
    // Non-empty: the Chrome trace file rank 0 writes (its directory is
    // checked by the caller).
    std::string trace_path;
    // Validate role: the jobs to validate (empty: every job), the pool's
    // name (empty: HOST:PID of the leader), and how long it waits without
    // a snapshot before it exits; serving: how long it waits without a
    // queued job before it exits.
    std::vector<std::string> validate_job_ids;
    std::string pool_label;
    absl::Duration exit_when_idle = absl::InfiniteDuration();
  };

  explicit GroupSession(Options options);
  ~GroupSession();

  GroupSession(const GroupSession&) = delete;
  GroupSession& operator=(const GroupSession&) = delete;

  // Starts MPI (unless local; `argc`/`argv` go to MPI_Init), runs the role
  // and returns the process's exit code: 0 when the run ended well, 1 when
  // it failed (why is on stderr), 2 when MPI could not start. Call once.
  int Run(int* argc, char*** argv);

 private:
  // How one job's run ended for this rank.
  struct JobEnd {
    // 0: the job trained (or the master stopped it) and the leader left
    // it; 1: it failed, or the leader could not report its end.
    int exit_code = 0;
    // False when this rank failed on its own (the other ranks may wait in
    // a collective): the process ends; for a group of more than one rank
    // TrainJob has already aborted it.
    bool together = true;
  };

  int RunTraining();
  // The serving loop (Options::serve) over `master`; the process's exit
  // code.
  int ServeJobs(MasterConnection& master);
  // All ranks: one job from its registration to the leader's Leave and
  // result lines (the leader has printed the job line). Creates trace_ on
  // the first job when tracing; writes no trace.
  JobEnd TrainJob(MasterConnection& master,
                  v1::RegisterGroupResponse registration);
  int RunValidationPool();
  // Leader: submits (job_spec_path) and registers; the answer (or error,
  // with its reason: common/error_reason.h) is broadcast so every rank sees
  // the same. `rejoin_job` non-empty: register again with that job,
  // submitting nothing.
  absl::StatusOr<v1::RegisterGroupResponse> ObtainJob(
      MasterConnection& master, const std::string& rejoin_job);
  // Leader: the `job ...: group ... with N rank(s)` line.
  void PrintJobLine(const v1::RegisterGroupResponse& registration) const;
  // All ranks (a collective): rank 0 writes the trace file; nothing
  // without a recorder.
  void WriteGroupTrace(TraceRecorder* trace);

  const Options options_;
  std::unique_ptr<MpiGroup> mpi_;  // null in local mode
  SingleProcessGroup single_;      // the group in local mode
  Collectives* group_ = nullptr;   // *mpi_ or single_, once Run started
  std::string tag_;                // "[rank R/N] ", for this rank's errors
  int threads_ = 1;                // compute threads of this rank
  c10::Device device_ = c10::kCPU;  // where this rank trains
  // The leader's heartbeat period: Options::heartbeat until a master
  // refuses it, then zero.
  absl::Duration heartbeat_;
  // With a trace path: this rank's spans for the process's life (every job
  // it serves, every re-registration), created with the first job's group.
  std::unique_ptr<TraceRecorder> trace_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_SESSION_H_
