#include "common/spec/job_spec.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/schedule/lr_schedule.h"
#include "common/spec/spec_internal.h"
#include "common/spec/spec_kinds.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn {

using spec_internal::CheckIntRange;
using spec_internal::CheckMetric;
using spec_internal::NormalizeCheckpoint;
using spec_internal::NormalizeData;
using spec_internal::NormalizeEarlyStopping;
using spec_internal::NormalizeEasgd;
using spec_internal::NormalizeExchange;
using spec_internal::NormalizeGem;
using spec_internal::NormalizeLoss;
using spec_internal::NormalizeModel;
using spec_internal::NormalizeSnapshots;
using spec_internal::NormalizeTarget;
using spec_internal::NormalizeWarmStart;

v1::Algorithm AlgorithmFromName(absl::string_view name) {
  return AlgorithmKindFromName(name).value_or(v1::ALGORITHM_UNSPECIFIED);
}

v1::Algorithm AlgorithmOf(const v1::JobSpec& spec) {
  // Normalized specs name one of the four; an empty name is the default.
  if (spec.algorithm().empty()) return v1::ALGORITHM_DOWNPOUR;
  return AlgorithmFromName(spec.algorithm());
}

v1::UpdateKind UpdateKindOf(v1::Algorithm algorithm) {
  switch (algorithm) {
    case v1::ALGORITHM_EASGD:
      return v1::UPDATE_KIND_ELASTIC;
    case v1::ALGORITHM_GEM:
      return v1::UPDATE_KIND_DELTA;
    default:
      return v1::UPDATE_KIND_GRADIENT;
  }
}

absl::Status NormalizeJobSpec(v1::JobSpec* spec) {
  MPILEARN_RETURN_IF_ERROR(NormalizeModel(spec->mutable_model()));
  MPILEARN_RETURN_IF_ERROR(NormalizeData(spec->mutable_data()));
  MPILEARN_RETURN_IF_ERROR(NormalizeLoss(spec));
  MPILEARN_RETURN_IF_ERROR(spec_internal::CheckOutputsMatchData(*spec));
  MPILEARN_RETURN_IF_ERROR(NormalizeExchange(spec));
  MPILEARN_RETURN_IF_ERROR(NormalizeOptimizerSpec(spec->mutable_optimizer()));
  if (spec->algorithm().empty()) spec->set_algorithm("downpour");
  const v1::Algorithm algorithm = AlgorithmFromName(spec->algorithm());
  if (algorithm == v1::ALGORITHM_UNSPECIFIED) {
    return UnknownName("algorithm", "algorithm", spec->algorithm(),
                       AlgorithmNames());
  }
  if (spec->optimizer().has_schedule()) {
    v1::LrScheduleSpec* schedule = spec->mutable_optimizer()->mutable_schedule();
    MPILEARN_RETURN_IF_ERROR(NormalizeLrSchedule(schedule));
    if (schedule->name() == "plateau") {
      MPILEARN_RETURN_IF_ERROR(CheckMetric("optimizer.schedule.metric", schedule->metric(), *spec,
                                           /*none_ok=*/false));
    }
  }
  if (!spec->has_epochs()) spec->set_epochs(5);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("epochs", spec->epochs(), 1, 100000));
  if (!spec->has_batch_size()) spec->set_batch_size(64);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("batch_size", spec->batch_size(), 1, 1 << 20));
  if (!spec->has_sync_every()) spec->set_sync_every(1);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("sync_every", spec->sync_every(), 1, 1 << 20));
  if (!spec->has_seed()) spec->set_seed(1);
  if (!spec->has_max_staleness()) spec->set_max_staleness(0);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("max_staleness", spec->max_staleness(), 0, 1 << 30));
  if (spec->staleness_scaling().empty()) spec->set_staleness_scaling("none");
  if (!StalenessScalingFromName(spec->staleness_scaling())) {
    return UnknownName("staleness_scaling", "scaling",
                       spec->staleness_scaling(), StalenessScalingNames());
  }
  if (!spec->has_max_shards()) spec->set_max_shards(0);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("max_shards", spec->max_shards(), 0, 64));
  if (spec->has_slice() && (spec->slice().shards() < 1 || spec->slice().shards() > 64 ||
                            spec->slice().shard() < 0 ||
                            spec->slice().shard() >= spec->slice().shards())) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice: shard ", spec->slice().shard(), " of ", spec->slice().shards(),
                     " is not a shard (0 <= shard < shards <= 64)"));
  }
  if (!spec->has_data_unit_size()) spec->set_data_unit_size(2048);
  MPILEARN_RETURN_IF_ERROR(CheckIntRange("data_unit_size",
                                         spec->data_unit_size(), 1,
                                         int64_t{1} << 40));
  if (spec->exchange().updates_in_flight() > 1 && algorithm != v1::ALGORITHM_DOWNPOUR &&
      algorithm != v1::ALGORITHM_SYNC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exchange.updates_in_flight is ", spec->exchange().updates_in_flight(),
        " but algorithm '", spec->algorithm(),
        "' exchanges the rank's own weights (only downpour and sync keep several "
        "updates in flight); remove it or set it to 1"));
  }
  // The algorithms' own sections are filled in and checked only for the
  // algorithm that uses them; the others are left as given.
  if ((algorithm == v1::ALGORITHM_EASGD || algorithm == v1::ALGORITHM_GEM) &&
      spec->optimizer().has_schedule() && spec->optimizer().schedule().name() != "constant") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.schedule: algorithm '",
        spec->algorithm(), "' applies its own rule on the master, not the optimizer; remove it"));
  }
  if (algorithm == v1::ALGORITHM_EASGD) {
    MPILEARN_RETURN_IF_ERROR(NormalizeEasgd(spec->mutable_easgd()));
  } else if (algorithm == v1::ALGORITHM_GEM) {
    MPILEARN_RETURN_IF_ERROR(NormalizeGem(spec->mutable_gem()));
  }
  // Early stopping is on only when its section is present; the target rule
  // only when target.value is set.
  if (spec->has_early_stopping()) {
    MPILEARN_RETURN_IF_ERROR(
        NormalizeEarlyStopping(*spec, spec->mutable_early_stopping()));
  }
  if (spec->has_target()) {
    MPILEARN_RETURN_IF_ERROR(NormalizeTarget(*spec, spec->mutable_target()));
  }
  MPILEARN_RETURN_IF_ERROR(
      NormalizeCheckpoint(*spec, spec->mutable_checkpoint()));
  MPILEARN_RETURN_IF_ERROR(NormalizeSnapshots(spec->mutable_snapshots()));
  if (spec->has_warm_start()) MPILEARN_RETURN_IF_ERROR(NormalizeWarmStart(spec->warm_start()));
  if (!spec->has_inband_validation()) spec->set_inband_validation(true);
  return NormalizeSharing(spec);
}

absl::Status NormalizeSharing(v1::JobSpec* spec) {
  if (!spec->has_priority()) spec->set_priority(0);
  MPILEARN_RETURN_IF_ERROR(
      CheckIntRange("priority", spec->priority(), kMinPriority, kMaxPriority));
  if (!spec->has_max_wall_seconds()) spec->set_max_wall_seconds(0);
  if (spec->max_wall_seconds() != 0) {
    MPILEARN_RETURN_IF_ERROR(spec_internal::CheckPositiveFinite("max_wall_seconds", spec->max_wall_seconds()));
    if (spec->max_wall_seconds() > kMaxWallSeconds) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_wall_seconds is ", spec->max_wall_seconds(), "; at most ",
                       kMaxWallSeconds, " (a year), or 0 for no limit"));
    }
  }
  for (const auto& [field, name] : {std::pair<const char*, const std::string*>{
                                        "owner", &spec->owner()},
                                    {"study", &spec->study()}}) {
    if (!name->empty() && !IsOwnerName(*name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " '", name->substr(0, 64), "' is not a name: 1 to 64 of A-Z a-z 0-9 _ . @ -"));
    }
  }
  return absl::OkStatus();
}

bool IsOwnerName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-' && c != '@') return false;
  }
  return true;
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not valid JSON for JobSpec: ",
                     std::string(status.message()),
                     " (see docs/protocol.md for the fields)"));
  }
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&spec));
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job spec '", path, "'"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(contents.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

int TopKOf(const v1::JobSpec& spec) {
  return spec.loss_options().has_top_k() ? spec.loss_options().top_k() : kDefaultTopK;
}

std::string TopKMetricName(int k) { return absl::StrCat("val_top", k, "_accuracy"); }

std::optional<int> TopKOfMetric(absl::string_view metric) {
  int k = 0;
  if (absl::ConsumePrefix(&metric, "val_top") && absl::ConsumeSuffix(&metric, "_accuracy") &&
      absl::SimpleAtoi(metric, &k) && k >= 2) {
    return k;
  }
  return std::nullopt;
}

bool WarmStartsOnMaster(const v1::JobSpec& spec) {
  return spec.has_warm_start() && spec.warm_start().torchscript().empty();
}

bool HigherIsBetter(absl::string_view metric) {
  // val_accuracy, val_auc, val_top5_accuracy, val_<output>_accuracy, ...
  return absl::StartsWith(metric, "val_") &&
         (absl::EndsWith(metric, "_accuracy") || absl::EndsWith(metric, "_auc"));
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  return json;
}

}  // namespace mpilearn
