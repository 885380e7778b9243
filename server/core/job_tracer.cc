#include "server/core/job_tracer.h"

namespace mpilearn::server {

void JobTracer::OnUpdateApplied(const std::string& /*job_id*/,
                                const v1::JobSpec& /*spec*/,
                                const AppliedUpdate& update) {
  const TraceRecorder::Arg args[] = {
      {"version", static_cast<int64_t>(update.weights->header.version())},
      {"staleness", static_cast<int64_t>(update.staleness)}};
  trace_.Complete("apply", "master", update.apply_start, update.apply_end,
                  args);
}

void JobTracer::OnCheckpointWritten(const std::string& /*job_id*/,
                                    uint64_t version, absl::Time start,
                                    absl::Time end) {
  const TraceRecorder::Arg args[] = {
      {"version", static_cast<int64_t>(version)}};
  trace_.Complete("checkpoint", "master", start, end, args);
}

}  // namespace mpilearn::server
