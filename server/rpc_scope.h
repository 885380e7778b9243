// What the master's gRPC services (master_service, study_service) share:
// RpcScope, one RPC's latency and status code into the master's metrics and
// its caller's authorization (server/auth.h), and Reply, a unary call's
// outcome as a gRPC status.
//
// Every handler starts with
//
//   RpcScope rpc(metrics_, "SubmitJob");
//   if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
//     return rpc.Finish(denied);
//   }
//
// and a handler naming a worker group checks it with rpc.OwnsGroup(id);
// ReportValidation checks rpc.MayReportValidation(job) against the
// subscriptions SubscribeSnapshots records with rpc.RecordSubscription.
#ifndef MPILEARN_SERVER_RPC_SCOPE_H_
#define MPILEARN_SERVER_RPC_SCOPE_H_

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "server/auth.h"
#include "server/master_metrics.h"

namespace mpilearn::server {

// Times one RPC into mpilearn_rpc_duration_seconds{method,code} and, for a
// streaming RPC, counts it in mpilearn_open_streams while it runs. The
// handler returns its status through Finish; an RPC that never gets there
// counts as UNKNOWN. A no-op without metrics.
//
// Threading: one RpcScope belongs to one RPC's handler thread.
class RpcScope {
 public:
  RpcScope(MasterMetrics* metrics, const char* method, bool streaming = false)
      : metrics_(metrics),
        method_(method),
        streaming_(streaming),
        start_(std::chrono::steady_clock::now()) {
    if (metrics_ != nullptr && streaming_) metrics_->StreamOpened(method_);
  }
  ~RpcScope() {
    if (metrics_ == nullptr) return;
    const std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start_;
    metrics_->ObserveRpc(
        method_,
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code_)),
        elapsed.count());
    if (streaming_) metrics_->StreamClosed(method_);
  }
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  grpc::Status Finish(grpc::Status status) {
    code_ = status.error_code();
    return status;
  }

  // Checks the call's bearer token against `auth` for this method
  // (Authorizer::Authenticate): OK, or the refusal to Finish with. A null
  // `auth` checks nothing (tests that build a service alone).
  grpc::Status Authorize(Authorizer* auth, const grpc::ServerContext* context) {
    auth_ = auth;
    if (auth_ == nullptr) return grpc::Status::OK;
    absl::StatusOr<Caller> caller = auth_->Authenticate(*context, method_);
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    caller_ = *std::move(caller);
    return grpc::Status::OK;
  }

  // OK when the authorized caller's token registered `group_id`
  // (Authorizer::CheckGroup); always OK without an authorizer.
  absl::Status OwnsGroup(absl::string_view group_id) const {
    if (auth_ == nullptr) return absl::OkStatus();
    return auth_->CheckGroup(group_id, caller_);
  }
  // Binds a group just registered for `job_id` to the caller
  // (Authorizer::BindGroup).
  absl::Status BindGroup(const std::string& group_id,
                         const std::string& job_id) const {
    if (auth_ == nullptr) return absl::OkStatus();
    return auth_->BindGroup(group_id, job_id, caller_);
  }
  // Records the caller's snapshot stream following `job_ids` (empty: every
  // job) while the result lives (Authorizer::RecordSubscription).
  Authorizer::Subscription RecordSubscription(
      const std::vector<std::string>& job_ids) const {
    if (auth_ == nullptr) return Authorizer::Subscription();
    return auth_->RecordSubscription(caller_, job_ids);
  }
  // OK when the caller may report a validation of `job_id`
  // (Authorizer::CheckValidation); always OK without an authorizer.
  absl::Status MayReportValidation(absl::string_view job_id) const {
    if (auth_ == nullptr) return absl::OkStatus();
    return auth_->CheckValidation(job_id, caller_);
  }
  // Forgets a group that left.
  void UnbindGroup(absl::string_view group_id) const {
    if (auth_ != nullptr) auth_->UnbindGroup(group_id);
  }

 private:
  MasterMetrics* const metrics_;
  const char* const method_;
  const bool streaming_;
  const std::chrono::steady_clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
  Authorizer* auth_ = nullptr;
  Caller caller_;
};

// A unary call's outcome: the core's response moved into `response`, or
// its error as a gRPC status.
template <typename Response>
grpc::Status Reply(absl::StatusOr<Response> result, Response* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(result).value();
  return grpc::Status::OK;
}

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_RPC_SCOPE_H_
