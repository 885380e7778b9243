// Machine-readable reasons on error statuses (v1::ErrorReason).
//
// The master attaches a reason to every error it returns; clients (the
// worker, mpilearnctl, MPI Opt) branch on ReasonOf, never on the message,
// which is written for people and may change.
//
//   return WithReason(absl::AbortedError("stale update: ..."),
//                     v1::ERROR_REASON_STALE_UPDATE);
//   ...
//   if (ReasonOf(status) == v1::ERROR_REASON_STALE_UPDATE) Repull();
//
// In process the reason rides on the absl::Status as a payload, so it
// survives MPILEARN_RETURN_IF_ERROR and copies; over gRPC it travels as an
// ErrorInfo in the status details (common/grpc_status.h); between the ranks
// of a group, BroadcastStatus (worker/mpi_group.h) carries code, message and
// reason.
#ifndef MPILEARN_COMMON_ERROR_REASON_H_
#define MPILEARN_COMMON_ERROR_REASON_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// The payload key the reason is stored under.
inline constexpr absl::string_view kErrorReasonPayloadKey =
    "type.mpilearn/mpilearn.v1.ErrorInfo";

// `status` with `reason` attached (replacing any earlier one). An OK status
// is returned unchanged: OK has no reason.
absl::Status WithReason(absl::Status status, v1::ErrorReason reason);

// The reason attached to `status`; ERROR_REASON_UNSPECIFIED when none is
// (or the status is OK).
v1::ErrorReason ReasonOf(const absl::Status& status);

// Shorthands for the errors the master returns most.
inline absl::Status GroupUnknownError(absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message),
                    v1::ERROR_REASON_GROUP_UNKNOWN);
}
inline absl::Status JobUnknownError(absl::string_view message) {
  return WithReason(absl::NotFoundError(message), v1::ERROR_REASON_JOB_UNKNOWN);
}
inline absl::Status NoQueuedJobError(absl::string_view message) {
  return WithReason(absl::NotFoundError(message), v1::ERROR_REASON_NO_QUEUED_JOB);
}
inline absl::Status InvalidRequestError(absl::string_view message) {
  return WithReason(absl::InvalidArgumentError(message),
                    v1::ERROR_REASON_INVALID_REQUEST);
}
// A size, count or length over one of the master's limits: the message
// names the limit and the mpilearn-master flag that raises it.
inline absl::Status LimitError(absl::string_view message) {
  return WithReason(absl::ResourceExhaustedError(message),
                    v1::ERROR_REASON_LIMIT);
}

// A reason for an error that has none, from its code alone: the default the
// master attaches at its boundary (common/grpc_status.h) so that every error
// it returns carries a reason.
v1::ErrorReason DefaultReasonFor(absl::StatusCode code);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_ERROR_REASON_H_
