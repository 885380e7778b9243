// A client of mpilearn-master's Master service, used by the workers and by
// mpilearnctl. Hides the chunked tensor streams: gradients go out from, and
// weights come back into, buffers the caller owns.
//
//   MPILEARN_ASSIGN_OR_RETURN(auto master, MasterClient::Connect("host:7070"));
//   MPILEARN_ASSIGN_OR_RETURN(std::string job_id, master->SubmitJob(spec));
//
// Every call has a deadline (Options::rpc_timeout) and returns the master's
// status unchanged (code and message), so callers can show it to users.
// Threading: thread-compatible; give each thread its own client.
#ifndef MPILEARN_COMMON_MASTER_CLIENT_H_
#define MPILEARN_COMMON_MASTER_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "common/master_connection.h"
#include "proto/mpilearn.grpc.pb.h"

namespace mpilearn {

class MasterClient final : public MasterConnection {
 public:
  struct Options {
    // How long Connect waits for the master to answer.
    absl::Duration connect_timeout = absl::Seconds(10);
    // Deadline of each call.
    absl::Duration rpc_timeout = absl::Seconds(120);
  };

  // UNAVAILABLE with a hint when nothing answers at `address` in time.
  static absl::StatusOr<std::unique_ptr<MasterClient>> Connect(
      const std::string& address, const Options& options);
  static absl::StatusOr<std::unique_ptr<MasterClient>> Connect(
      const std::string& address) {
    return Connect(address, Options());
  }

  absl::StatusOr<std::string> SubmitJob(const v1::JobSpec& spec) override;
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request) override;

  // Offers initial weights laid out as `header`; returns whether the master
  // took them (false: another group's weights were taken first).
  absl::StatusOr<bool> InitWeights(const std::string& job_id,
                                   const std::string& group_id,
                                   const v1::TensorSetHeader& header,
                                   absl::Span<const absl::Span<const float>> values) override;

  // Pushes a gradient (header.gradient() describes `gradient`) and writes the
  // weights the master returns into `weights`, which must match the job's
  // layout. Returns the new weight version.
  absl::StatusOr<uint64_t> PushGradient(
      const v1::PushGradientRequest::Header& header,
      absl::Span<const absl::Span<const float>> gradient,
      absl::Span<const absl::Span<float>> weights) override;

  // Writes the job's current weights into `weights`; returns their version.
  absl::StatusOr<uint64_t> PullWeights(const std::string& job_id,
                                       const std::string& group_id,
                                       absl::Span<const absl::Span<float>> weights) override;

  // Reports the group's completed data units and gets its next one.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request) override;

  absl::StatusOr<v1::JobState> ReportEpoch(const v1::ReportEpochRequest& request) override;
  absl::StatusOr<v1::JobState> Heartbeat(const std::string& job_id,
                                         const std::string& group_id);
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) override;
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs();

  v1::Master::StubInterface& stub() { return *stub_; }

 private:
  MasterClient(std::string address, Options options,
               std::unique_ptr<v1::Master::StubInterface> stub)
      : address_(std::move(address)),
        options_(options),
        stub_(std::move(stub)) {}

  using Stub = v1::Master::StubInterface;

  // One unary call with the deadline set and the status annotated.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                   Response*),
      const Request& request) {
    Response response;
    auto context = NewContext();
    grpc::Status status = (stub_.get()->*method)(context.get(), request, &response);
    if (!status.ok()) return Annotate(status);
    return response;
  }

  // A context with the call deadline set.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Adds "master at <address>" context to transport errors.
  absl::Status Annotate(const grpc::Status& status) const;

  const std::string address_;
  const Options options_;
  std::unique_ptr<v1::Master::StubInterface> stub_;
};

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_MASTER_CLIENT_H_
