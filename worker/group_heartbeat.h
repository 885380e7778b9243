// The training group leader's heartbeat thread (mpilearn-worker
// --heartbeat_s): while the group is registered to a job it calls
// MasterConnection::Heartbeat every period, so the master, which was
// promised that period at RegisterGroup (heartbeat_seconds), declares the
// group lost after 3 missed periods instead of after its --group_timeout_s
// (a dead leader, a whole group SIGKILLed, a hung MPI job).
//
// It also ends the group fast when mpirun terminates it. When one rank
// dies, Open MPI 4 (checked with 4.1.4 here: a rank SIGKILLed, the others
// logging the signals they get) sends SIGTERM to every other rank 1.0 s
// later and SIGKILL 1.0 s after that (odls_base_sigkill_timeout = 1); mpirun
// then exits with 137. With `terminate_signal`, set by the session's SIGTERM/SIGINT
// handler, the thread notices within `poll`, leaves the group at once
// (MasterConnection::LeaveWithin, deadline leave_timeout, below the 1 s
// before SIGKILL) so that the master gives its units back now, and then
// ends the process (_exit(1), or Options::on_terminated in tests). If the
// Leave does not get through, the missed heartbeats still catch the group.
//
//   GroupHeartbeat::Options options;
//   options.period = absl::Seconds(2);
//   GroupHeartbeat heartbeat(master, options);   // starts the thread
//   heartbeat.SetGroup(job_id, group_id);        // again after a rejoin
//   ... train ...
//   heartbeat.Stop();                            // before Leave
//   master.Leave(leave);
//
// A heartbeat that fails (master unreachable, group unknown after a master
// restart) is logged once per streak of failures and is never fatal: the
// training thread meets the same condition in its own calls and handles it
// as it always did.
//
// Threading: the object is used from one thread (the leader's MPI thread);
// its own thread calls only MasterConnection::Heartbeat and LeaveWithin,
// which may run beside the training thread's calls on the same connection.
#ifndef MPILEARN_WORKER_GROUP_HEARTBEAT_H_
#define MPILEARN_WORKER_GROUP_HEARTBEAT_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/master_connection.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

class GroupHeartbeat {
 public:
  struct Options {
    // How often to call Heartbeat (also each call's deadline); zero: never
    // (the thread then only watches terminate_signal).
    absl::Duration period = absl::Seconds(2);
    // How often the thread looks at terminate_signal and at Stop.
    absl::Duration poll = absl::Milliseconds(50);
    // Non-null: a signal number, 0 until a SIGTERM/SIGINT handler stores
    // the signal it caught. Must outlive the object.
    const std::atomic<int>* terminate_signal = nullptr;
    // The termination Leave's deadline.
    absl::Duration leave_timeout = absl::Milliseconds(700);
    // Called on the heartbeat thread after the termination Leave, with the
    // signal; must not return in production. Default: _exit(1).
    std::function<void(int signal)> on_terminated;
  };

  // The Leave sent when the group is terminated by `signal`. The cause goes
  // in `abandoned`, not `error`: the master fails a job on a Leave with an
  // error, and a group killed from outside must not fail the job, only give
  // its units back (the job goes back to QUEUED when no other group serves
  // it, with the cause as its message). It is also printed on the leader's
  // stderr (TerminationText).
  static v1::LeaveRequest TerminationLeave(const std::string& job_id,
                                           const std::string& group_id,
                                           int signal);
  // "rank terminated: signal 15 (another rank of the group probably died)".
  static std::string TerminationText(int signal);

  // Starts the thread; it beats once SetGroup named a group.
  GroupHeartbeat(MasterConnection& master, Options options);
  // Stop().
  ~GroupHeartbeat();

  GroupHeartbeat(const GroupHeartbeat&) = delete;
  GroupHeartbeat& operator=(const GroupHeartbeat&) = delete;

  // Beats for `group_id` of `job_id` from now on (the first heartbeat one
  // period later: the registration itself was contact).
  void SetGroup(const std::string& job_id, const std::string& group_id);

  // Stops and joins the thread; no call is in flight once it returns.
  // Idempotent.
  void Stop();

 private:
  void Run();
  // One heartbeat; logs the first failure of a streak and the recovery.
  void Beat(const v1::HeartbeatRequest& request);

  MasterConnection& master_;
  const Options options_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::string group_id_ ABSL_GUARDED_BY(mu_);
  // Bumped by SetGroup, so the thread restarts its period.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The heartbeat thread's own: whether the last heartbeat failed.
  bool failing_ = false;
  std::thread thread_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_GROUP_HEARTBEAT_H_
