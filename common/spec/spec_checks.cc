// The job spec's range checks (spec_internal.h).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_internal.h"
#include "common/status_macros.h"

namespace mpilearn::spec_internal {

absl::Status RangeError(absl::string_view field, absl::string_view range,
                        double got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be ", range, ", got ", got));
}

// Checks lo <= value <= hi for integers.
absl::Status CheckIntRange(absl::string_view field, int64_t value, int64_t lo,
                           int64_t hi) {
  if (value < lo || value > hi) {
    return RangeError(field, absl::StrCat("in [", lo, ", ", hi, "]"),
                      static_cast<double>(value));
  }
  return absl::OkStatus();
}

// Checks that `field` lists at most `most` values, each in [lo, hi].
absl::Status CheckIntList(
    absl::string_view field,
    const google::protobuf::RepeatedField<int32_t>& values, int most,
    int64_t lo, int64_t hi) {
  if (values.size() > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must list 1 to ", most, " values, got ", values.size()));
  }
  for (int i = 0; i < values.size(); ++i) {
    MPILEARN_RETURN_IF_ERROR(
        CheckIntRange(absl::StrCat(field, "[", i, "]"), values.Get(i), lo, hi));
  }
  return absl::OkStatus();
}

// Checks value in [0, 1) (false for NaN).
absl::Status CheckUnitInterval(absl::string_view field, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return RangeError(field, "in [0, 1)", value);
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(absl::string_view field, double value) {
  if (!(std::isfinite(value) && value > 0.0)) {
    return RangeError(field, "a finite number > 0", value);
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegativeFinite(absl::string_view field, double value) {
  if (!(std::isfinite(value) && value >= 0.0)) {
    return RangeError(field, "a finite number >= 0", value);
  }
  return absl::OkStatus();
}

// Checks lo < value < hi (false for NaN).
absl::Status CheckOpenInterval(absl::string_view field, double value, double lo,
                               double hi) {
  if (!(value > lo && value < hi)) {
    return RangeError(field, absl::StrCat("in (", lo, ", ", hi, ")"), value);
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::spec_internal
