// Early-return helpers for absl::Status, which Abseil 20220623 lacks.
//
//   absl::Status Load(const std::string& path) {
//     MPILEARN_RETURN_IF_ERROR(CheckReadable(path));
//     MPILEARN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     ...
//   }
#ifndef MPILEARN_COMMON_STATUS_MACROS_H_
#define MPILEARN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MPILEARN_RETURN_IF_ERROR(expr)                 \
  do {                                                 \
    const ::absl::Status mpilearn_status_ = (expr);    \
    if (!mpilearn_status_.ok()) return mpilearn_status_; \
  } while (false)

#define MPILEARN_STATUS_CONCAT_INNER_(a, b) a##b
#define MPILEARN_STATUS_CONCAT_(a, b) MPILEARN_STATUS_CONCAT_INNER_(a, b)

// Declares or assigns `lhs` from the value of a StatusOr expression, or
// returns its error status.
#define MPILEARN_ASSIGN_OR_RETURN(lhs, rexpr)                              \
  MPILEARN_ASSIGN_OR_RETURN_IMPL_(                                         \
      MPILEARN_STATUS_CONCAT_(mpilearn_statusor_, __LINE__), lhs, rexpr)

#define MPILEARN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return statusor.status();               \
  lhs = std::move(statusor).value()

#endif  // MPILEARN_COMMON_STATUS_MACROS_H_
