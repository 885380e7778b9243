// The figures of a finished training run, as `mpilearn-worker
// --summary_json FILE` writes them: a RunSummary (proto/worker_summary.proto)
// printed with protobuf's JSON mapping on one line.
//
//   v1::RunSummary summary = BuildRunSummary(registration, group.size(),
//                                            /*local=*/false, result);
//   MPILEARN_RETURN_IF_ERROR(WriteRunSummary("summary.json", summary));
//
// The line reads `{"mode": "sync", "ranks": 2, ..., "share": {"data": 0.1,
// ...}, "test_accuracy": 0.8123}`: tools/bench/bench_lib.sh's bench_field takes
// `"KEY": NUMBER` off it, so keys, value types (numbers, not the strings
// proto3 JSON makes of 64-bit integers) and the `": "` separator are part
// of the format.
//
// Threading: plain functions without shared state.
#ifndef MPILEARN_WORKER_RUN_SUMMARY_H_
#define MPILEARN_WORKER_RUN_SUMMARY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/mpilearn.pb.h"
#include "proto/worker_summary.pb.h"
#include "worker/trainer.h"

namespace mpilearn::worker {

// The summary of `result`, a run of `ranks` ranks in `local` mode or with
// the job's algorithm. Figures are rounded as the JSON has always shown
// them: samples_per_s (and per rank) to 3 decimals, seconds, shares and the
// test accuracy to 4.
v1::RunSummary BuildRunSummary(const v1::RegisterGroupResponse& registration,
                               int ranks, bool local, const TrainResult& result);

// `summary` as one line of JSON (no line break): the JSON mapping with the
// proto's field names and every field, laid out `{"key": value, ...}`.
absl::StatusOr<std::string> RunSummaryJson(const v1::RunSummary& summary);

// Writes RunSummaryJson(summary) and a line break to `path` (replacing it).
// An error names the path and why.
absl::Status WriteRunSummary(const std::string& path, const v1::RunSummary& summary);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_RUN_SUMMARY_H_
