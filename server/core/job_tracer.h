// The job registry's trace events (common/trace.h), as a JobObserver:
// "apply" for each applied update (the update itself, without the wait for
// the job's lock; args version and staleness) and "checkpoint" for each
// checkpoint taken and written (arg version), both in category "master".
//
// Threading: thread-safe (TraceRecorder is). The recorder must outlive it.
#ifndef MPILEARN_SERVER_CORE_JOB_TRACER_H_
#define MPILEARN_SERVER_CORE_JOB_TRACER_H_

#include <cstdint>
#include <string>

#include "common/trace.h"
#include "server/core/job_observer.h"

namespace mpilearn::server {

class JobTracer final : public JobObserver {
 public:
  explicit JobTracer(TraceRecorder& trace) : trace_(trace) {}

  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec& spec,
                       const AppliedUpdate& update) override;
  void OnCheckpointWritten(const std::string& job_id, uint64_t version,
                           absl::Time start, absl::Time end) override;

 private:
  TraceRecorder& trace_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_JOB_TRACER_H_
