#include "server/core/store/job_checkpoint.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace mpilearn::server {
namespace {

// Builds the optimizer `spec` describes for `weights` with the state that
// EncodeJobCheckpoint saved in `saved` (whose tensors it moves from).
absl::StatusOr<std::unique_ptr<Optimizer>> RestoreOptimizer(
    const v1::OptimizerSpec& spec, const EngineOptions& engine,
    const Float32Tensors& weights, Float32Tensors& saved) {
  std::vector<size_t> sizes;
  for (const auto& v : weights.values) sizes.push_back(v.size());
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                            CreateOptimizer(spec, sizes, engine));
  const std::vector<std::string> buffers = StateBufferNames(optimizer->config());
  if (saved.values.size() != buffers.size() * sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state holds ", saved.values.size(), " tensors; ",
        optimizer->name(), " over ", sizes.size(), " weight tensors needs ",
        buffers.size() * sizes.size()));
  }
  OptimizerState state;
  state.steps = static_cast<int64_t>(saved.header.version());
  state.buffers.resize(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = b * sizes.size() + t;
      const std::string want = absl::StrCat(
          buffers[b], "/", weights.header.tensors(static_cast<int>(t)).name());
      if (saved.header.tensors(static_cast<int>(k)).name() != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state tensor ", k, " is '",
            saved.header.tensors(static_cast<int>(k)).name(), "'; expected '",
            want, "'"));
      }
      state.buffers[b].push_back(std::move(saved.values[k]));
    }
  }
  MPILEARN_RETURN_IF_ERROR(optimizer->RestoreState(state));
  return optimizer;
}

absl::StatusOr<DecodedCheckpoint> Decode(const JobCheckpoint& checkpoint,
                                         const v1::JobSpec& spec,
                                         const EngineOptions& engine,
                                         const std::string& job_id) {
  MPILEARN_ASSIGN_OR_RETURN(Float32Tensors weights,
                            FromTensorSet(checkpoint.weights));
  MPILEARN_ASSIGN_OR_RETURN(Float32Tensors saved,
                            FromTensorSet(checkpoint.optimizer_state));
  std::unique_ptr<Optimizer> optimizer;
  if (UpdateKindOf(AlgorithmOf(spec)) != v1::UPDATE_KIND_GRADIENT) {
    if (!saved.values.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state holds ", saved.values.size(), " tensors; job ",
          job_id, " (", spec.algorithm(),
          ") keeps no optimizer state on the master"));
    }
  } else {
    MPILEARN_ASSIGN_OR_RETURN(
        optimizer, RestoreOptimizer(spec.optimizer(), engine, weights, saved));
  }
  DecodedCheckpoint decoded;
  MPILEARN_ASSIGN_OR_RETURN(decoded.rule,
                            UpdateRule::WithOptimizer(spec, std::move(optimizer)));
  decoded.weights.header = std::move(weights.header);
  decoded.weights.values = std::move(weights.values);
  return decoded;
}

}  // namespace

bool CheckpointSchedule::Due(CheckpointTrigger trigger, uint64_t version,
                             bool ended, absl::Time now) const {
  switch (trigger) {
    case CheckpointTrigger::kUpdates:
      // On the grid of multiples of every_updates, whatever other triggers
      // took in between: every shard of a sharded job then checkpoints the
      // same versions, which restore together (docs/sharding.md).
      return spec_.every_updates() > 0 &&
             version / static_cast<uint64_t>(spec_.every_updates()) >
                 version_at_checkpoint_ / static_cast<uint64_t>(spec_.every_updates());
    case CheckpointTrigger::kSeconds:
      return spec_.every_seconds() > 0 && !ended &&
             changes_ != changes_at_checkpoint_ &&
             now - checkpoint_time_ >= absl::Seconds(spec_.every_seconds());
    case CheckpointTrigger::kChanges:
      return changes_ != changes_at_checkpoint_;
  }
  return false;
}

void CheckpointSchedule::Taken(uint64_t version, absl::Time now) {
  version_at_checkpoint_ = version;
  changes_at_checkpoint_ = changes_;
  checkpoint_time_ = now;
}

void CheckpointSchedule::Resumed(uint64_t version) {
  version_at_checkpoint_ = version;
  written_version_ = version;
  changes_at_checkpoint_ = changes_;
}

JobCheckpoint WeightsOnlyCheckpoint(const WeightsSnapshot& weights, uint64_t updates_applied) {
  JobCheckpoint checkpoint;
  checkpoint.weights = ToTensorSet(weights.header, weights.values);
  checkpoint.optimizer_state = ToTensorSet(MakeFloat32Header(updates_applied, {}, {}), {});
  return checkpoint;
}

absl::StatusOr<JobCheckpoint> EncodeJobCheckpoint(const WeightsSnapshot& weights,
                                                  const UpdateRule& rule,
                                                  uint64_t updates_applied) {
  const Optimizer* optimizer = rule.optimizer();
  // easgd, gem: no master optimizer state.
  if (optimizer == nullptr) return WeightsOnlyCheckpoint(weights, updates_applied);
  JobCheckpoint checkpoint;
  checkpoint.weights = ToTensorSet(weights.header, weights.values);
  absl::StatusOr<OptimizerState> state = optimizer->SaveState();
  if (!state.ok()) return WithReason(state.status(), v1::ERROR_REASON_INTERNAL);
  const std::vector<std::string> buffers = StateBufferNames(optimizer->config());
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (int t = 0; t < weights.header.tensors_size(); ++t) {
      const v1::TensorInfo& info = weights.header.tensors(t);
      names.push_back(absl::StrCat(buffers[b], "/", info.name()));
      shapes.emplace_back(info.shape().begin(), info.shape().end());
      values.push_back(std::move(state->buffers[b][t]));
    }
  }
  checkpoint.optimizer_state = ToTensorSet(
      MakeFloat32Header(static_cast<uint64_t>(state->steps), names, shapes),
      values);
  return checkpoint;
}

v1::JobCheckpointFile MakeCheckpointFile(v1::JobStatus status,
                                         JobCheckpoint tensors,
                                         v1::CheckpointQueue queue,
                                         const UpdateStats& stats,
                                         absl::Time now) {
  v1::JobCheckpointFile file;
  *file.mutable_status() = std::move(status);
  *file.mutable_weights() = std::move(tensors.weights);
  *file.mutable_optimizer_state() = std::move(tensors.optimizer_state);
  *file.mutable_queue() = std::move(queue);
  file.set_staleness_sum(stats.staleness_sum);
  file.set_staleness_count(stats.staleness_count);
  file.set_created_unix_seconds(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  return file;
}

JobCheckpoint TakeCheckpointTensors(v1::JobCheckpointFile& file) {
  JobCheckpoint tensors;
  tensors.weights = std::move(*file.mutable_weights());
  tensors.optimizer_state = std::move(*file.mutable_optimizer_state());
  return tensors;
}

absl::StatusOr<DecodedCheckpoint> DecodeJobCheckpoint(
    const JobCheckpoint& checkpoint, const v1::JobSpec& spec,
    const EngineOptions& engine, const std::string& job_id) {
  absl::StatusOr<DecodedCheckpoint> decoded =
      Decode(checkpoint, spec, engine, job_id);
  if (!decoded.ok()) {
    return WithReason(decoded.status(), v1::ERROR_REASON_INTERNAL);
  }
  return decoded;
}

}  // namespace mpilearn::server
