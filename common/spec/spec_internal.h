// What the job spec's normalizers share (job_spec.cc calls the others):
// range checks with messages that name the field, and each part of the
// spec's normalization. For common/spec only; everyone else calls
// NormalizeJobSpec (job_spec.h).
//
//   spec_checks.cc      the range checks
//   model_data_spec.cc  model and data
//   training_spec.cc    optimizer, loss, exchange, easgd and gem, stop
//                       rules, checkpoints, snapshots
//   outputs_spec.cc     several outputs, and the metrics a job reports
#ifndef MPILEARN_COMMON_SPEC_SPEC_INTERNAL_H_
#define MPILEARN_COMMON_SPEC_SPEC_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_field.h"
#include "common/spec/spec_kinds.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// loss_options.top_k when left out (TopKOf).
inline constexpr int kDefaultTopK = 5;

namespace spec_internal {

// "FIELD must be RANGE, got GOT".
absl::Status RangeError(absl::string_view field, absl::string_view range, double got);
// lo <= value <= hi for integers.
absl::Status CheckIntRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi);
// At most `most` values, each in [lo, hi].
absl::Status CheckIntList(absl::string_view field,
                          const google::protobuf::RepeatedField<int32_t>& values, int most,
                          int64_t lo, int64_t hi);
// value in [0, 1), finite > 0, finite >= 0, lo < value < hi (NaN fails each).
absl::Status CheckUnitInterval(absl::string_view field, double value);
absl::Status CheckPositiveFinite(absl::string_view field, double value);
absl::Status CheckNonNegativeFinite(absl::string_view field, double value);
absl::Status CheckOpenInterval(absl::string_view field, double value, double lo, double hi);

// model_data_spec.cc
absl::Status NormalizeModel(v1::ModelSpec* model);
absl::Status NormalizeData(v1::DataSpec* data);

// training_spec.cc
bool IsClassificationLoss(const std::string& loss);
absl::Status NormalizeLoss(v1::JobSpec* spec);
// warm_start: one source, bounded.
absl::Status NormalizeWarmStart(const v1::WarmStartSpec& warm);
// `options` for a loss `loss` named `loss_name`: the messages name the
// fields with `prefix` ("" or "outputs[1].") and say "<owner>'s loss is"
// ("this job", "this output").
absl::Status NormalizeLossOptions(LossKind loss, const std::string& loss_name,
                                  const v1::LossOptions& options, absl::string_view owner,
                                  absl::string_view prefix);
absl::Status NormalizeExchange(v1::JobSpec* spec);
absl::Status NormalizeEasgd(v1::EasgdSpec* easgd);
absl::Status NormalizeGem(v1::GemSpec* gem);
// outputs_spec.cc
// JobSpec.outputs: names, losses, weights and their options, and that the
// job leaves the single loss's fields out (NormalizeLoss calls it).
absl::Status NormalizeOutputs(v1::JobSpec* spec);
// The data lists and the outputs agree (one output per labels dataset).
absl::Status CheckOutputsMatchData(const v1::JobSpec& spec);
// The metrics besides the loss that loss `loss` reports, as suffixes of
// "val_" or "val_<output>_" ("accuracy", "top5_accuracy", "mae", ...), and
// the k of options' top-k accuracy.
std::vector<std::string> MetricSuffixes(const std::string& loss, int top_k);
int TopKOfOptions(const v1::LossOptions& options);
// A validation metric the spec's jobs report (`none_ok`: or "none").
absl::Status CheckMetric(absl::string_view field, const std::string& metric,
                         const v1::JobSpec& spec, bool none_ok);
absl::Status NormalizeEarlyStopping(const v1::JobSpec& spec, v1::EarlyStoppingSpec* stopping);
absl::Status NormalizeTarget(const v1::JobSpec& spec, v1::TargetSpec* target);
absl::Status NormalizeCheckpoint(const v1::JobSpec& spec, v1::CheckpointSpec* checkpoint);
absl::Status NormalizeSnapshots(v1::SnapshotSpec* snapshots);

}  // namespace spec_internal
}  // namespace mpilearn

#endif  // MPILEARN_COMMON_SPEC_SPEC_INTERNAL_H_
