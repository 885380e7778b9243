// What a master's error means to a training rank, decided by the status's
// machine-readable reason (common/error_reason.h), never by its message.
//
//   if (IsStaleRejection(pushed)) version = master.PullWeights(...);
//
// The reasons survive the trip from the master (over gRPC through
// common/grpc_status, in process as a payload) and the leader's broadcast to
// the other ranks (BroadcastStatus in worker/mpi_group.h), so every rank of a
// group classifies the leader's error the same way.
#ifndef MPILEARN_WORKER_MASTER_ERRORS_H_
#define MPILEARN_WORKER_MASTER_ERRORS_H_

#include "absl/status/status.h"

namespace mpilearn::worker {

// True for the master's answer to a group it does not know (any more): after
// a master restart, or once it declared the group lost. The group recovers
// by registering again.
bool IsGroupUnknown(const absl::Status& status);

// True when the master dropped an update as too stale (max_staleness): the
// rank pulls the newest weights and goes on.
bool IsStaleRejection(const absl::Status& status);

// True when the master refused an update because applying it would have
// made the job's weights or optimizer state NaN or Inf (guarded weights):
// the update was not applied, so the rank pulls the weights and goes on
// like after a stale rejection; the master fails the job after several in
// a row.
bool IsUpdateRejected(const absl::Status& status);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MASTER_ERRORS_H_
