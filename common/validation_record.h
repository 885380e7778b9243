// The values of a validation report (ValidationRecord from a pool or a
// group, EpochRecord from a group at an epoch end), checked before the
// master keeps them: a record the master keeps can become the job's best
// value, which early stopping, target metrics and MPI Opt then trust, so a
// NaN loss or an accuracy of 17 is refused with INVALID_ARGUMENT naming the
// field, and the job's history and best value stay as they were.
//
// Rules: every loss, error and metric finite and at most 1e15 in magnitude;
// accuracies and AUCs (val_accuracy, metrics named *_accuracy, *_auc) in
// [0, 1]; MAEs and MSEs (*_mae, *_mse) >= 0 (losses may be negative: a
// TorchScript loss's); metric names start "val_"; sample counts and epochs
// not negative
// (an epoch report's epoch >= 1). A validated version ahead of the job's
// weights is the registry's to refuse (it knows the version).
//
// Thread-safe: pure functions.
#ifndef MPILEARN_COMMON_VALIDATION_RECORD_H_
#define MPILEARN_COMMON_VALIDATION_RECORD_H_

#include "absl/status/status.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// A ValidationRecord's values (ReportValidationRequest.record).
absl::Status CheckValidationRecord(const v1::ValidationRecord& record);

// What a group reports of an epoch (ReportEpochRequest.record).
absl::Status CheckEpochReport(const v1::EpochRecord& record);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_VALIDATION_RECORD_H_
