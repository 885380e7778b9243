#include "common/error_reason.h"

#include <string>

#include "absl/strings/cord.h"

namespace mpilearn {

absl::Status WithReason(absl::Status status, v1::ErrorReason reason) {
  if (status.ok()) return status;
  v1::ErrorInfo info;
  info.set_reason(reason);
  status.SetPayload(kErrorReasonPayloadKey, absl::Cord(info.SerializeAsString()));
  return status;
}

v1::ErrorReason ReasonOf(const absl::Status& status) {
  if (status.ok()) return v1::ERROR_REASON_UNSPECIFIED;
  const absl::optional<absl::Cord> payload =
      status.GetPayload(kErrorReasonPayloadKey);
  if (!payload.has_value()) return v1::ERROR_REASON_UNSPECIFIED;
  v1::ErrorInfo info;
  if (!info.ParseFromString(std::string(*payload))) {
    return v1::ERROR_REASON_UNSPECIFIED;
  }
  return info.reason();
}

v1::ErrorReason DefaultReasonFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return v1::ERROR_REASON_UNSPECIFIED;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return v1::ERROR_REASON_INVALID_REQUEST;
    case absl::StatusCode::kNotFound:
      return v1::ERROR_REASON_JOB_UNKNOWN;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return v1::ERROR_REASON_JOB_STATE;
    case absl::StatusCode::kResourceExhausted:
      return v1::ERROR_REASON_LIMIT;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return v1::ERROR_REASON_UNAVAILABLE;
    default:
      return v1::ERROR_REASON_INTERNAL;
  }
}

}  // namespace mpilearn
