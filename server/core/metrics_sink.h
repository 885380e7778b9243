// What the job registry tells the master's metrics (master_metrics.h) as it
// happens, so that job_registry needs no Prometheus library.
#ifndef MPILEARN_SERVER_CORE_METRICS_SINK_H_
#define MPILEARN_SERVER_CORE_METRICS_SINK_H_

#include <string>

#include "server/core/job_values.h"

namespace mpilearn::server {

// Threading: called from RPC threads concurrently; implementations must be
// thread-safe and must not block.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;

  // An update was applied to the job (update.applied is true): its apply
  // time, staleness, device and optimizer labels.
  virtual void OnUpdateApplied(const std::string& job_id,
                               const AppliedUpdate& update) = 0;

  // The job was deleted (DeleteJob): whatever is kept for it can go.
  virtual void OnJobDeleted(const std::string& /*job_id*/) {}
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_METRICS_SINK_H_
