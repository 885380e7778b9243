// MPI Opt's Studies service from the integration tests: a small study's
// spec, a study's status, waiting for a condition on it.
#ifndef MPILEARN_TESTS_STUDY_HELPERS_H_
#define MPILEARN_TESTS_STUDY_HELPERS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/study.grpc.pb.h"

namespace mpilearn::testing {

// A study of `trials` trials of `base`, `parallelism` of them at once, the
// random sampler drawing optimizer.learning_rate log-uniformly from
// [1e-3, 3e-2] (seed 1).
v1::StudySpec LearningRateStudy(const v1::JobSpec& base, int trials, int parallelism);

// CreateStudy; the new study's id.
absl::StatusOr<std::string> CreateStudy(v1::Studies::Stub& stub, const v1::StudySpec& spec);

// GetStudy (10 s deadline); UNAVAILABLE with the RPC's message on error.
absl::StatusOr<v1::StudyStatus> GetStudy(v1::Studies::Stub& stub, const std::string& id);

// Polls the study (every 200 ms, riding out RPC errors such as a master
// restart) until `done` holds; DEADLINE_EXCEEDED with the last status or
// error after `timeout`.
absl::StatusOr<v1::StudyStatus> WaitForStudy(
    v1::Studies::Stub& stub, const std::string& id, absl::Duration timeout,
    const std::function<bool(const v1::StudyStatus&)>& done);

}  // namespace mpilearn::testing

#endif  // MPILEARN_TESTS_STUDY_HELPERS_H_
