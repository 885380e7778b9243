// A client of mpilearn-master's Master service, used by the workers and by
// mpilearnctl. Hides the chunked tensor streams: gradients go out from, and
// weights come back into, buffers the caller owns.
//
//   MPILEARN_ASSIGN_OR_RETURN(auto master, MasterClient::Connect("host:7070"));
//   MPILEARN_ASSIGN_OR_RETURN(std::string job_id, master->SubmitJob(spec));
//
// Every call but the snapshot stream has a deadline (Options::rpc_timeout)
// and returns the master's status unchanged (code and message), so callers
// can show it to users.
// Threading: thread-compatible; give each thread its own client. Exceptions:
// Heartbeat(request, timeout) and LeaveWithin use only the thread-safe
// channel and stub (not the push sequence or the wire format), so one other
// thread may call them while a thread uses the client; PushGradient may run
// in several threads at once (a rank with several updates in flight): the
// sequence numbers and error feedback are taken under a lock, in the order
// the calls take it.
#ifndef MPILEARN_COMMON_CLIENT_MASTER_CLIENT_H_
#define MPILEARN_COMMON_CLIENT_MASTER_CLIENT_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/client/client_security.h"
#include "common/client/master_connection.h"
#include "grpcpp/grpcpp.h"
#include "proto/mpilearn.grpc.pb.h"

namespace mpilearn {

// Initial metadata the master sends once a SubscribeSnapshots call is
// subscribed (server/master_service.cc sends the same key).
inline constexpr char kSubscribedMetadataKey[] = "mpilearn-subscribed";

// A subscription to the master's weight snapshots (SubscribeSnapshots),
// from MasterClient::SubscribeSnapshots. The stream has no deadline: it runs
// until Cancel, the master's shutdown, or an error.
//
//   MPILEARN_ASSIGN_OR_RETURN(auto stream, master->SubscribeSnapshots(request));
//   v1::SnapshotHeader header;
//   std::vector<std::vector<float>> weights;
//   while (true) {
//     MPILEARN_ASSIGN_OR_RETURN(bool got, stream->Next(&header, &weights));
//     if (!got) break;  // cancelled
//     ...
//   }
//
// Threading: one thread calls Next; Cancel may be called from any thread.
class SnapshotStream {
 public:
  SnapshotStream(const SnapshotStream&) = delete;
  SnapshotStream& operator=(const SnapshotStream&) = delete;
  // Cancels the stream if it is still open.
  ~SnapshotStream();

  // Blocks for the next snapshot: its header into `header` and its tensors,
  // laid out as header->weights(), into `weights` (resized as needed).
  // Returns false once Cancel was called; the master's error otherwise when
  // the stream ends (UNAVAILABLE when it shuts down).
  absl::StatusOr<bool> Next(v1::SnapshotHeader* header,
                            std::vector<std::vector<float>>* weights);

  // Ends the stream; a Next blocked in another thread returns false.
  void Cancel();

 private:
  friend class MasterClient;
  SnapshotStream(std::string address,
                 std::unique_ptr<grpc::ClientContext> context,
                 std::unique_ptr<grpc::ClientReaderInterface<grpc::ByteBuffer>> reader)
      : address_(std::move(address)),
        context_(std::move(context)),
        reader_(std::move(reader)) {}

  // The stream's final status as a Status (OK only if cancelled by us).
  absl::Status Finish();

  const std::string address_;
  std::unique_ptr<grpc::ClientContext> context_;
  // Raw SnapshotPart messages (common/tensor_wire.h).
  std::unique_ptr<grpc::ClientReaderInterface<grpc::ByteBuffer>> reader_;
  std::atomic<bool> cancelled_{false};
  bool finished_ = false;  // Finish() was called (by the Next thread)
};

class MasterClient final : public MasterConnection {
 public:
  struct Options {
    // How long Connect waits for the master to answer.
    absl::Duration connect_timeout = absl::Seconds(10);
    // Deadline of each call.
    absl::Duration rpc_timeout = absl::Seconds(120);
    // How long a call keeps retrying while the master is unreachable
    // (UNAVAILABLE: restarting, network blip), with backoff from 0.1 s to
    // 2 s. 0 = fail at once. A retried PushGradient carries the same
    // sequence number, so the master applies it once even when the first
    // attempt's reply was lost.
    absl::Duration reconnect_timeout = absl::ZeroDuration();
    // TLS and the bearer token (common/client/client_security.h); the default
    // speaks plaintext and sends no token.
    ClientSecurity security;
  };

  // UNAVAILABLE with a hint when nothing answers at `address` in time;
  // INVALID_ARGUMENT when options.security's files cannot be read.
  static absl::StatusOr<std::unique_ptr<MasterClient>> Connect(
      const std::string& address, const Options& options);
  static absl::StatusOr<std::unique_ptr<MasterClient>> Connect(
      const std::string& address) {
    return Connect(address, Options());
  }

  // A client over an existing channel (e.g. a server's InProcessChannel in
  // tests); `address` only names the master in error messages.
  static std::unique_ptr<MasterClient> ForChannel(
      std::shared_ptr<grpc::Channel> channel, const std::string& address,
      const Options& options);

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
  // layout. Returns the new weight version. The tensors travel in the wire
  // format of UseWireFormat (fp32 until it is called); a header without a
  // sequence number gets the client's next one.
  //
  // PushGradient, PullWeights and the snapshot stream use raw byte buffers
  // (common/tensor_wire.h): one copy (or encode) of the gradient out, one
  // copy (or decode) of the weights in.
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
  void UseWireFormat(const v1::ExchangeSpec& exchange) override;
  absl::StatusOr<v1::JobState> Heartbeat(const std::string& job_id,
                                         const std::string& group_id);
  // One attempt within `timeout`, no retry (see the class comment).
  absl::StatusOr<v1::JobState> Heartbeat(const v1::HeartbeatRequest& request,
                                         absl::Duration timeout) override;
  absl::StatusOr<v1::JobState> LeaveWithin(const v1::LeaveRequest& request,
                                           absl::Duration timeout) override;
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) override;
  // A validation pool's result for one snapshot; returns the job's state.
  absl::StatusOr<v1::JobState> ReportValidation(
      const v1::ReportValidationRequest& request);

  // Subscribes to weight snapshots; returns once the master has registered
  // the subscription (snapshots published from then on are delivered).
  // NOT_FOUND for an unknown job id in request.job_ids().
  absl::StatusOr<std::unique_ptr<SnapshotStream>> SubscribeSnapshots(
      const v1::SubscribeSnapshotsRequest& request);

  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& job_id) override;
  // Every job (in `states`, all when empty), following ListJobs' pages;
  // `left_out`, when given, receives how many jobs the master left out as
  // too large to list (GetJobStatus shows them).
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(
      const std::vector<v1::JobState>& states = {},
      uint32_t* left_out = nullptr);
  // One page of the list (ListJobsRequest's paging).
  absl::StatusOr<v1::ListJobsResponse> ListJobsPage(
      const v1::ListJobsRequest& request);
  // Ends a QUEUED or RUNNING job as CANCELLED; returns its status.
  absl::StatusOr<v1::JobStatus> CancelJob(const std::string& job_id,
                                          const std::string& reason);
  // Removes an ended job from the master and its state directory.
  absl::Status DeleteJob(const std::string& job_id);

  v1::Master::StubInterface& stub() { return *stub_; }

 private:
  MasterClient(std::string address, Options options,
               std::shared_ptr<grpc::Channel> channel);

  using Stub = v1::Master::StubInterface;

  // Runs `attempt` again while it fails with UNAVAILABLE or CANCELLED, for up to
  // Options::reconnect_timeout.
  template <typename Attempt>
  auto Retrying(Attempt attempt) -> decltype(attempt()) {
    const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
    absl::Duration backoff = absl::Milliseconds(100);
    bool logged = false;
    while (true) {
      auto result = attempt();
      // UNAVAILABLE: the master is unreachable; CANCELLED: it shut down
      // while the call was in flight. Both clear up when it is back.
      const absl::StatusCode code =
          result.ok() ? absl::StatusCode::kOk : result.status().code();
      if ((code != absl::StatusCode::kUnavailable &&
           code != absl::StatusCode::kCancelled) ||
          absl::Now() + backoff > give_up) {
        return result;
      }
      if (!logged) {
        LogReconnecting(result.status());
        logged = true;
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
  }

  // One unary call with the deadline set and the status annotated.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                   Response*),
      const Request& request) {
    return Retrying([&]() -> absl::StatusOr<Response> {
      Response response;
      auto context = NewContext();
      grpc::Status status =
          (stub_.get()->*method)(context.get(), request, &response);
      if (!status.ok()) return Annotate(status);
      return response;
    });
  }

  // One unary call within `timeout`, not retried; reads only const members
  // and the (thread-safe) stub, so any thread may make it.
  template <typename Request, typename Response>
  absl::StatusOr<Response> CallOnce(
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                   Response*),
      const Request& request, absl::Duration timeout) const {
    Response response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(timeout));
    grpc::Status status = (stub_.get()->*method)(&context, request, &response);
    if (!status.ok()) return Annotate(status);
    return response;
  }

  void LogReconnecting(const absl::Status& status) const;

  // A context with the call deadline set.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Adds "master at <address>" context to transport errors.
  absl::Status Annotate(const grpc::Status& status) const;
  // What a call that read weights (ReadRawWeights' `version`, then the
  // call's final `status`) returns.
  absl::StatusOr<uint64_t> WeightsOutcome(absl::StatusOr<uint64_t> version,
                                          const grpc::Status& status) const;

  const std::string address_;
  const Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Master::StubInterface> stub_;
  // The tensor-stream methods, called on byte buffers (what generated
  // stubs do underneath, with our own serialization).
  const grpc::internal::RpcMethod push_method_;
  const grpc::internal::RpcMethod pull_method_;
  const grpc::internal::RpcMethod subscribe_method_;
  // UseWireFormat's settings, and the rounding error carried into the next
  // reduced-precision push (error feedback), laid out as the gradient.
  v1::ExchangeSpec wire_;
  absl::Mutex push_mu_;
  std::vector<std::vector<float>> residual_ ABSL_GUARDED_BY(push_mu_);
  // The last push's sequence number.
  uint64_t push_sequence_ ABSL_GUARDED_BY(push_mu_) = 0;
};

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_MASTER_CLIENT_H_
