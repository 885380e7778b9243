// The one place where absl::Status and grpc::Status meet.
#ifndef MPILEARN_COMMON_GRPC_STATUS_H_
#define MPILEARN_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mpilearn {

// Same code (the numeric codes coincide) and message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_GRPC_STATUS_H_
