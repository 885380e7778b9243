#include "common/validation_record.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mpilearn {
namespace {

// Far beyond any real loss or error, far below what overflows a sum.
constexpr double kMaxMagnitude = 1e15;

absl::Status Refuse(const std::string& field, double value, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; it must be ", range,
                                                 " (the report is refused and the job's "
                                                 "history and best value stay as they were)"));
}

// `value` of metric `name` (named in messages as `field`).
absl::Status CheckMetricValue(const std::string& field, const std::string& name, double value) {
  if (!std::isfinite(value) || std::abs(value) > kMaxMagnitude) {
    return Refuse(field, value, "a finite number of magnitude at most 1e15");
  }
  if (absl::EndsWith(name, "_accuracy") || absl::EndsWith(name, "_auc")) {
    if (!(value >= 0.0 && value <= 1.0)) return Refuse(field, value, "in [0, 1]");
  } else if (absl::EndsWith(name, "_mae") || absl::EndsWith(name, "_mse")) {
    if (!(value >= 0.0)) return Refuse(field, value, ">= 0");
  }
  return absl::OkStatus();
}

template <typename Record>
absl::Status CheckValues(const Record& record) {
  MPILEARN_RETURN_IF_ERROR(CheckMetricValue("record.val_loss", "val_loss", record.val_loss()));
  MPILEARN_RETURN_IF_ERROR(
      CheckMetricValue("record.val_accuracy", "val_accuracy", record.val_accuracy()));
  for (const auto& [name, value] : record.metrics()) {
    if (!absl::StartsWith(name, "val_")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record.metrics: '", name.substr(0, 64),
          "' is not a validation metric's name (they start with val_)"));
    }
    MPILEARN_RETURN_IF_ERROR(
        CheckMetricValue(absl::StrCat("record.metrics[", name, "]"), name, value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckValidationRecord(const v1::ValidationRecord& record) {
  if (record.samples() < 0) {
    return Refuse("record.samples", static_cast<double>(record.samples()), ">= 0");
  }
  if (record.epoch() < 0) return Refuse("record.epoch", record.epoch(), ">= 0");
  return CheckValues(record);
}

absl::Status CheckEpochReport(const v1::EpochRecord& record) {
  if (record.epoch() < 1) return Refuse("record.epoch", record.epoch(), ">= 1");
  return CheckValues(record);
}

}  // namespace mpilearn
