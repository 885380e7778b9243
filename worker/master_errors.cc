#include "worker/master_errors.h"

#include "common/error_reason.h"

namespace mpilearn::worker {

bool IsGroupUnknown(const absl::Status& status) {
  return ReasonOf(status) == v1::ERROR_REASON_GROUP_UNKNOWN;
}

bool IsStaleRejection(const absl::Status& status) {
  return ReasonOf(status) == v1::ERROR_REASON_STALE_UPDATE;
}

bool IsUpdateRejected(const absl::Status& status) {
  return ReasonOf(status) == v1::ERROR_REASON_UPDATE_REJECTED;
}

}  // namespace mpilearn::worker
