#include "tests/study_helpers.h"

#include <chrono>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace mpilearn::testing {

v1::StudySpec LearningRateStudy(const v1::JobSpec& base, int trials, int parallelism) {
  v1::StudySpec spec;
  *spec.mutable_base() = base;
  v1::ParameterSpec* lr = spec.add_parameters();
  lr->set_path("optimizer.learning_rate");
  lr->mutable_real()->set_low(1e-3);
  lr->mutable_real()->set_high(3e-2);
  lr->mutable_real()->set_log(true);
  spec.set_sampler("random");
  spec.set_trials(trials);
  spec.set_parallelism(parallelism);
  spec.set_seed(1);
  return spec;
}

absl::StatusOr<std::string> CreateStudy(v1::Studies::Stub& stub, const v1::StudySpec& spec) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CreateStudyRequest request;
  *request.mutable_spec() = spec;
  v1::CreateStudyResponse created;
  const grpc::Status rpc = stub.CreateStudy(&context, request, &created);
  if (!rpc.ok()) return absl::UnavailableError(rpc.error_message());
  return created.study_id();
}

absl::StatusOr<v1::StudyStatus> GetStudy(v1::Studies::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStudyRequest request;
  request.set_study_id(id);
  v1::StudyStatus status;
  const grpc::Status rpc = stub.GetStudy(&context, request, &status);
  if (!rpc.ok()) return absl::UnavailableError(rpc.error_message());
  return status;
}

absl::StatusOr<v1::StudyStatus> WaitForStudy(
    v1::Studies::Stub& stub, const std::string& id, absl::Duration timeout,
    const std::function<bool(const v1::StudyStatus&)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::StudyStatus> last = absl::UnavailableError("not asked");
  while (absl::Now() < deadline) {
    last = GetStudy(stub, id);
    if (last.ok() && done(*last)) return last;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      last.ok() ? last->DebugString() : std::string(last.status().message()));
}

}  // namespace mpilearn::testing
