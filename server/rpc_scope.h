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
// and a handler whose core call checks the caller passes it rpc.caller().
#ifndef MPILEARN_SERVER_RPC_SCOPE_H_
#define MPILEARN_SERVER_RPC_SCOPE_H_

#include <chrono>
#include <string>
#include <utility>

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
    if (auth == nullptr) return grpc::Status::OK;
    absl::StatusOr<Caller> caller = auth->Authenticate(*context, method_);
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    caller_ = *std::move(caller);
    return grpc::Status::OK;
  }

  // Who made the call (Authorize sets it): passed to the core, which
  // decides what the caller may do to groups and validations. Without an
  // authorizer: an admin named "".
  const Caller& caller() const { return caller_; }

 private:
  MasterMetrics* const metrics_;
  const char* const method_;
  const bool streaming_;
  const std::chrono::steady_clock::time_point start_;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
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
