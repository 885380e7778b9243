// Reads jobs back from the state directory (job_store.h): every job at a
// restart (LoadJobs), and an ended job's weights when asked (ReadEndedWeights).
//
// Restart rules. A job with a checkpoint resumes from the newest one whose
// checksum verifies (damaged ones are logged and renamed *.corrupt): QUEUED
// with its weights, optimizer state, version, counters, history,
// validations and data queue, or, if it had ended, as it ended. A job
// without a usable checkpoint comes back as its history.json says if that
// says it ended, else QUEUED from its spec with no weights. A job whose
// history.json says it ended is loaded from that record (merged with
// records.jsonl) alone, its tensors left on disk; only when its newest
// checkpoint was written after history.json (a history write that failed)
// is that checkpoint read, and if it says the job ended, its outcome
// (state, test result, version, counters) wins. An ended job never comes
// back QUEUED. An unreadable records.jsonl is renamed records.jsonl.corrupt
// and the lists come from the checkpoint. A job whose spec cannot be read is
// skipped with a warning.
//
// Threading: call with no write of the jobs under way (at start).
#ifndef MPILEARN_SERVER_CORE_STORE_JOB_LOADER_H_
#define MPILEARN_SERVER_CORE_STORE_JOB_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/job.h"
#include "server/core/job_values.h"
#include "server/core/store/job_store.h"
#include "server/core/update/optimizer.h"

namespace mpilearn::server {

struct LoadedJob {
  std::shared_ptr<Job> job;
  bool persist = false;          // its history.json is to be written now
  bool rewrite_records = false;  // and records.jsonl in full before it
};

struct LoadedJobs {
  std::vector<LoadedJob> jobs;  // in ascending job number
  // The highest group number ("g-12" -> 12) any job's records name, so
  // that a restarted master never reuses a group id.
  int64_t last_group_number = 0;
};

// Loads every job under the store's jobs directory (see the rules above).
// `clock` stamps the statuses logged.
LoadedJobs LoadJobs(JobStore& store, const EngineOptions& engine,
                    const std::function<absl::Time()>& clock);

// The weights of an ended job whose memory was released, decoded from its
// newest checkpoint that reads. FAILED_PRECONDITION (JOB_ENDED) naming the
// checkpoint directory when none does.
absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ReadEndedWeights(
    const JobStore& store, const Job& job);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_STORE_JOB_LOADER_H_
