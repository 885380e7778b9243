// The master of the local baseline mode: the master itself (server::Master:
// its core with jobs, optimizers and state directory, and its ticker, so
// groups are reaped, timed checkpoints written and failed writes retried as
// in mpilearn-master) in the worker's process, with no RPC and no studies. `mpilearn-worker --local --job SPEC` trains through
// it with the same Trainer as a distributed group, which makes it the
// reference point for scaling studies and for checking that the distributed
// path computes what it should.
//
// A thin adapter, like the gRPC service (server/master_service.h): each
// call becomes the same MasterCore call the service makes, as an admin
// named "" (callers are not told apart here), with tensors copied from and
// to the trainer's buffers instead of streamed. Destroying it shuts the
// master down (Master::Shutdown: a last checkpoint of changed jobs).
//
// Threading: the core is thread-safe; this wrapper adds no state.
#ifndef MPILEARN_WORKER_LOCAL_MASTER_H_
#define MPILEARN_WORKER_LOCAL_MASTER_H_

#include <memory>
#include <string>

#include "common/client/master_connection.h"
#include "server/core/master_core.h"
#include "server/master.h"

namespace mpilearn::worker {

class LocalMaster final : public MasterConnection {
 public:
  // Job files go under `state_dir` as with mpilearn-master --state_dir.
  static absl::StatusOr<std::unique_ptr<LocalMaster>> Create(
      const std::string& state_dir, const server::EngineOptions& engine);

  absl::StatusOr<std::string> SubmitJob(const v1::JobSpec& spec) override;
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request) override;
  absl::StatusOr<bool> InitWeights(
      const std::string& job_id, const std::string& group_id,
      const v1::TensorSetHeader& header,
      absl::Span<const absl::Span<const float>> values) override;
  absl::StatusOr<uint64_t> PushGradient(
      const v1::PushGradientRequest::Header& header,
      absl::Span<const absl::Span<const float>> gradient,
      absl::Span<const absl::Span<float>> weights) override;
  absl::StatusOr<uint64_t> PullWeights(
      const std::string& job_id, const std::string& group_id,
      absl::Span<const absl::Span<float>> weights) override;
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request) override;
  absl::StatusOr<v1::JobState> ReportEpoch(
      const v1::ReportEpochRequest& request) override;
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) override;
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& job_id) override;
  // In process: never late, so `timeout` is not needed.
  absl::StatusOr<v1::JobState> Heartbeat(const v1::HeartbeatRequest& request,
                                         absl::Duration timeout) override;

 private:
  explicit LocalMaster(std::unique_ptr<server::Master> master)
      : master_(std::move(master)), core_(master_->core()) {}

  std::unique_ptr<server::Master> master_;
  server::MasterCore& core_;
  // Who makes every call: the one process.
  const server::Caller caller_;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_LOCAL_MASTER_H_
