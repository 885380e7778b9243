// The master without its transport: the core (jobs, groups, snapshots,
// callers' bindings; core/master_core.h), MPI Opt's study table over the
// core's jobs (opt/study_table.h), the registry's observers that belong to
// neither (the trace's events, the study table's wake-up), and the threads
// that keep them going: the ticker (MasterCore::Tick about once a second:
// lost groups, timed checkpoints, retries of failed writes; and the
// trace's flush) and the study table's refresh thread. The gRPC daemon (master_server.h) and the
// worker's --local mode (worker/local_master.h) both run one, so both tick
// alike; each adds only how calls reach it.
//
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Master> master,
//                             Master::Create(options));  // loads the state
//   master->Start();                                      // the ticker
//   master->core().SubmitJob(request);
//   master->CloseStreams();  // then let the transport's calls drain
//   master->Shutdown();      // stops the threads, checkpoints every job
//
// Threading: Create, Start, CloseStreams and Shutdown are called from one
// thread; core() and studies() are thread-safe. The study table calls the
// core (never the reverse: the core's observer only wakes the table, which
// takes a small lock of its own, StudyTable::Wake).
#ifndef MPILEARN_SERVER_MASTER_H_
#define MPILEARN_SERVER_MASTER_H_

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/trace.h"
#include "server/core/job_observer.h"
#include "server/core/master_core.h"
#include "server/opt/study_table.h"

namespace mpilearn::server {

class Master {
 public:
  struct Options {
    // The core's options: its registry's state directory, group timeout,
    // engine and observers (the Master adds its own after them); its
    // limits; check_callers.
    MasterCore::Options core;
    // When given (it must outlive the Master): the registry's events are
    // traced into it (JobTracer) and the ticker flushes it.
    TraceRecorder* trace = nullptr;
    // MPI Opt's studies, under <core.registry.state_dir>/studies. Off: no
    // study table (studies() is null).
    bool studies = true;
  };

  // Opens the state directory, loads its jobs (per
  // core.registry.resume_jobs) and studies; the study table's thread
  // starts refreshing them at once.
  static absl::StatusOr<std::unique_ptr<Master>> Create(Options options);

  // Shutdown, if not done yet.
  ~Master();

  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  // Starts the ticker. Once only.
  void Start();

  MasterCore& core() { return *core_; }
  // Null when Options::studies is off.
  opt::StudyTable* studies() { return studies_.get(); }

  // The first half of the shutdown, before the transport drains its calls:
  // ends snapshot streams and study watches, and stops the ticker and the
  // study table's thread (no study starts or stops a job any more). Calls
  // still running finish. Idempotent.
  void CloseStreams();
  // Once no call runs any more: CloseStreams if not done, joins the
  // threads, releases the study table, and checkpoints every job changed
  // since its last checkpoint (MasterCore::CheckpointAll). Idempotent.
  void Shutdown();

 private:
  class CoreTrialJobs;
  class StudyWake;

  Master();

  // studies_ for study_wake_, which any thread calls; set once the table
  // exists.
  std::atomic<opt::StudyTable*> studies_for_wake_{nullptr};
  // The registry's observers: declared before the core, so they outlive
  // its registry.
  std::unique_ptr<JobObserver> job_tracer_;
  std::unique_ptr<JobObserver> study_wake_;
  std::unique_ptr<MasterCore> core_;
  // The core's jobs as the study table sees them; the table calls them
  // from its thread, so it is declared after them (destroyed first).
  std::unique_ptr<CoreTrialJobs> trial_jobs_;
  std::unique_ptr<opt::StudyTable> studies_;
  // The trace the ticker flushes (the core's registry records into it).
  TraceRecorder* trace_ = nullptr;
  absl::Notification stopping_;
  std::thread ticker_;
  bool shut_down_ = false;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_H_
