#include "common/grpc_status.h"

#include <string>

#include "common/error_reason.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  v1::ErrorReason reason = ReasonOf(status);
  if (reason == v1::ERROR_REASON_UNSPECIFIED) {
    reason = DefaultReasonFor(status.code());
  }
  v1::ErrorInfo info;
  info.set_reason(reason);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()), info.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  // Errors made by the gRPC library itself (a deadline, a broken
  // connection) have no details: they get the default for their code.
  v1::ErrorInfo info;
  const bool parsed = !status.error_details().empty() &&
                      info.ParseFromString(status.error_details());
  return WithReason(std::move(converted),
                    parsed ? info.reason() : DefaultReasonFor(converted.code()));
}

}  // namespace mpilearn
