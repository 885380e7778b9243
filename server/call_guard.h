// Keeps exceptions from turning into UNKNOWN: gRPC answers a handler that
// throws with UNKNOWN "Unexpected error in RPC handling", which tells a
// client nothing about retrying. Every handler of the master's services
// runs its work through GuardCall:
//
//   return rpc.Finish(GuardCall("SubmitJob", [&] {
//     return Reply(core_.SubmitJob(*request), response);
//   }));
//
// An allocation failure (std::bad_alloc, std::length_error: a size no
// container can hold) becomes RESOURCE_EXHAUSTED with ERROR_REASON_LIMIT (the
// master is short of memory now; the call may succeed later or with a
// smaller model), any other exception INTERNAL with ERROR_REASON_INTERNAL.
// Both are logged.
//
// Thread-compatible: a free function template, no state.
#ifndef MPILEARN_SERVER_CALL_GUARD_H_
#define MPILEARN_SERVER_CALL_GUARD_H_

#include <exception>
#include <new>
#include <stdexcept>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "glog/logging.h"
#include "grpcpp/support/status.h"

namespace mpilearn::server {

// The status for an exception that escaped `method`'s work.
inline grpc::Status ExceptionStatus(const char* method,
                                    const std::exception* caught) {
  const bool memory =
      caught != nullptr && (dynamic_cast<const std::bad_alloc*>(caught) ||
                            dynamic_cast<const std::length_error*>(caught));
  const std::string what =
      caught != nullptr ? EchoPrefix(caught->what(), 256) : "unknown exception";
  if (memory) {
    LOG(ERROR) << method << ": out of memory (" << what << ")";
    return ToGrpcStatus(WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            method, ": the master could not allocate memory for this call (",
            what, "); retry later, or with a smaller model")),
        v1::ERROR_REASON_LIMIT));
  }
  LOG(ERROR) << method << ": unexpected exception: " << what;
  return ToGrpcStatus(WithReason(
      absl::InternalError(
          absl::StrCat(method, ": internal error (", what, ")")),
      v1::ERROR_REASON_INTERNAL));
}

// Runs `work` (returning grpc::Status or absl::Status) and turns an
// exception it throws into a status (see the file comment).
template <typename Work>
grpc::Status GuardCall(const char* method, Work&& work) {
  try {
    if constexpr (std::is_same_v<std::invoke_result_t<Work>, absl::Status>) {
      return ToGrpcStatus(work());
    } else {
      return work();
    }
  } catch (const std::exception& e) {
    return ExceptionStatus(method, &e);
  } catch (...) {
    return ExceptionStatus(method, nullptr);
  }
}

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CALL_GUARD_H_
