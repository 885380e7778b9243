// Where the master's core hands weight snapshots for publication (the
// validation pools' feed). JobRegistry calls it; the snapshot hub
// (snapshot_hub.h) implements it and decides, from the job's SnapshotSpec,
// which ones to publish.
//
// Threading: called from RPC threads, for many jobs at once, and must not
// block: the update path calls it right after applying an update.
#ifndef MPILEARN_SERVER_CORE_SNAPSHOT_SINK_H_
#define MPILEARN_SERVER_CORE_SNAPSHOT_SINK_H_

#include <memory>
#include <string>

#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"

namespace mpilearn::server {

class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;

  // After every applied update. `updates_applied` is the job's total.
  virtual void OnUpdate(const std::string& job_id, const v1::JobSpec& spec,
                        std::shared_ptr<const WeightsSnapshot> weights,
                        uint64_t updates_applied, int epochs_done) = 0;

  // When an epoch's last data unit completed (weights as of that moment).
  virtual void OnEpochEnd(const std::string& job_id, const v1::JobSpec& spec,
                          std::shared_ptr<const WeightsSnapshot> weights,
                          int epochs_done) = 0;

  // The job ended (completed, failed, stopped): subscribers stop getting it.
  virtual void OnJobEnded(const std::string& job_id) = 0;

  // The (ended) job was deleted: whatever is kept for it can go.
  virtual void OnJobDeleted(const std::string& /*job_id*/) {}
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_SNAPSHOT_SINK_H_
