// A client of the gRPC health checking protocol (grpc.health.v1.Health,
// method Check), which mpilearn-master serves for load balancers and
// Kubernetes probes: the master's status, or one service's.
//
//   absl::StatusOr<ServingStatus> serving = CheckHealth(channel, "", absl::Seconds(5));
//   if (serving.ok() && *serving == ServingStatus::kServing) { ... }
//
// The two messages (one string field in, one enum field out) are read and
// written as protobuf's unknown fields, so no generated code is needed.
#ifndef MPILEARN_COMMON_CLIENT_HEALTH_CHECK_H_
#define MPILEARN_COMMON_CLIENT_HEALTH_CHECK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace mpilearn {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// "SERVING", "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN".
absl::string_view ServingStatusName(ServingStatus status);

// The health of `service` ("" for the whole server; "mpilearn.v1.Master",
// "mpilearn.v1.Studies") behind `channel`, asked with a `timeout` deadline.
// Errors are the call's: UNAVAILABLE when nothing answers, NOT_FOUND for a
// service the server does not know, DATA_LOSS for a reply that does not
// parse.
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service,
                                          absl::Duration timeout);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_HEALTH_CHECK_H_
