// The one place where absl::Status and grpc::Status meet.
//
// The code and message map one to one (the numeric codes coincide). The
// reason (common/error_reason.h) travels as a serialized v1::ErrorInfo in
// grpc::Status's error_details: ToGrpcStatus writes it (the reason attached
// to the status, else DefaultReasonFor its code, so every error the master
// sends carries one) and FromGrpcStatus reads it back onto the absl::Status
// (the default for the code when the status has no details, as for errors
// the gRPC library makes itself: deadlines, broken connections).
#ifndef MPILEARN_COMMON_GRPC_STATUS_H_
#define MPILEARN_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mpilearn {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_GRPC_STATUS_H_
