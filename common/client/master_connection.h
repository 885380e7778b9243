// What a training group needs from a master, whichever master it is: the
// gRPC client of a remote mpilearn-master (common/client/master_client.h) or the
// in-process master of the local baseline mode (worker/local_master.h). The
// trainer is written against this interface only, so both modes run the
// same training loop.
//
// Weights travel as spans over caller-owned fp32 buffers, laid out as the
// job's weights (one span per tensor). Errors are the master's statuses,
// unchanged.
#ifndef MPILEARN_COMMON_CLIENT_MASTER_CONNECTION_H_
#define MPILEARN_COMMON_CLIENT_MASTER_CONNECTION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

class MasterConnection {
 public:
  virtual ~MasterConnection() = default;

  virtual absl::StatusOr<std::string> SubmitJob(const v1::JobSpec& spec) = 0;
  virtual absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request) = 0;

  // Offers initial weights; false when another group's were taken first.
  virtual absl::StatusOr<bool> InitWeights(
      const std::string& job_id, const std::string& group_id,
      const v1::TensorSetHeader& header,
      absl::Span<const absl::Span<const float>> values) = 0;

  // Pushes an update (header.kind() says what it is) and writes the weights
  // the master returns into `weights`; returns their version.
  virtual absl::StatusOr<uint64_t> PushGradient(
      const v1::PushGradientRequest::Header& header,
      absl::Span<const absl::Span<const float>> gradient,
      absl::Span<const absl::Span<float>> weights) = 0;

  // How tensors travel from now on (the job's JobSpec.exchange: wire dtypes,
  // error feedback). Transports without a wire ignore it.
  virtual void UseWireFormat(const v1::ExchangeSpec& /*exchange*/) {}

  // Writes the job's current weights into `weights`; returns their version.
  virtual absl::StatusOr<uint64_t> PullWeights(
      const std::string& job_id, const std::string& group_id,
      absl::Span<const absl::Span<float>> weights) = 0;

  virtual absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request) = 0;
  virtual absl::StatusOr<v1::JobState> ReportEpoch(
      const v1::ReportEpochRequest& request) = 0;
  virtual absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) = 0;
  virtual absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& job_id) = 0;

  // Tells the master the group is alive (with the group's telemetry when
  // the request carries it); returns the job's state. One attempt within
  // `timeout`, never retried, touching no state of the connection that
  // other calls use: a heartbeat thread may call it while another thread
  // uses the same connection.
  virtual absl::StatusOr<v1::JobState> Heartbeat(
      const v1::HeartbeatRequest& request, absl::Duration timeout) = 0;

  // Leave as one attempt within `timeout`, with the same thread guarantee
  // as Heartbeat: for a leader that must leave before its process is
  // killed. By default, Leave.
  virtual absl::StatusOr<v1::JobState> LeaveWithin(
      const v1::LeaveRequest& request, absl::Duration /*timeout*/) {
    return Leave(request);
  }
};

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_MASTER_CONNECTION_H_
