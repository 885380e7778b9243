// The job spec: parsing from JSON, defaults, and validation.
//
//   absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(file_contents);
//   if (!spec.ok()) { /* message names the field, e.g. "optimizer.beta1 ..." */ }
//
// Every path that accepts a spec (the master's SubmitJob, mpilearnctl, the
// worker's --job) calls NormalizeJobSpec, so a spec is checked the same way
// wherever it enters, and the master stores it with every default explicit.
#ifndef MPILEARN_COMMON_SPEC_JOB_SPEC_H_
#define MPILEARN_COMMON_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// The most updates one rank may have on their way to the master at once
// (ExchangeSpec.updates_in_flight).
inline constexpr int kMaxUpdatesInFlight = 4;

// Parses JSON in protobuf's JSON mapping (field names as in the .proto or
// lowerCamelCase). Unknown fields are rejected. The result is normalized.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json);

// Reads and parses a spec file; errors name the file.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

// Fills in defaults for every field left out and checks ranges. Errors are
// InvalidArgument and name the field ("epochs must be in [1, 100000], got 0").
absl::Status NormalizeJobSpec(v1::JobSpec* spec);

// Sharing one master (docs/scheduling.md): JobSpec.priority's range, the
// largest max_wall_seconds (a year).
inline constexpr int kMinPriority = -100;
inline constexpr int kMaxPriority = 100;
inline constexpr double kMaxWallSeconds = 366.0 * 24 * 3600;
// The stop_reason of a job its max_wall_seconds ended begins with this
// (MPI Opt does not retry such a trial).
inline constexpr char kWallTimeStop[] = "wall-time limit";
// NormalizeJobSpec's part for owner, study, priority and max_wall_seconds.
absl::Status NormalizeSharing(v1::JobSpec* spec);
// Whether `name` may be a token's, a job owner's or a study's name: 1 to 64
// of A-Z a-z 0-9 _ . @ -.
bool IsOwnerName(absl::string_view name);

// The optimizer part of NormalizeJobSpec: fills in the named optimizer's
// defaults (PyTorch's; sgd's learning rate defaults to 0.01) and checks the
// fields it uses, leaving the others alone. Errors are InvalidArgument and
// name the field ("optimizer.beta1 must be in [0, 1), got 1.5"). The master's
// optimizers resolve their hyperparameters through this same function.
absl::Status NormalizeOptimizerSpec(v1::OptimizerSpec* spec);

// The algorithm a spec names: users write JobSpec.algorithm as a string
// ("downpour", "sync", "easgd", "gem"); code past parsing switches on the
// enum. AlgorithmFromName gives ALGORITHM_UNSPECIFIED for an unknown name
// (NormalizeJobSpec refuses those); AlgorithmOf takes an empty name as the
// default, downpour.
v1::Algorithm AlgorithmFromName(absl::string_view name);
v1::Algorithm AlgorithmOf(const v1::JobSpec& spec);

// What pushes to a job of `algorithm` carry: an elastic exchange (easgd), a
// delta (gem), else a gradient.
v1::UpdateKind UpdateKindOf(v1::Algorithm algorithm);

// A lower bound on the parameters of a normalized spec's built-in model,
// from the spec alone: the data's input size and class count are known
// only to the workers, so each counts as 1 (and a convolution's spatial
// size as 1). 0 for a TorchScript model. Saturates at UINT64_MAX. The
// master refuses a spec whose bound, as fp32 bytes, is over its
// --max_model_mib before queueing it.
uint64_t MinModelParameters(const v1::ModelSpec& model);

// The k of a normalized spec's top-k accuracy (loss_options.top_k, default
// 5), and its metric's name: "val_top5_accuracy".
int TopKOf(const v1::JobSpec& spec);
std::string TopKMetricName(int k);
// The k of a top-k metric's name ("val_top3_accuracy" -> 3; k >= 2), none
// for another name.
std::optional<int> TopKOfMetric(absl::string_view metric);

// Whether a higher value of validation metric `metric` is better: the
// accuracies and AUCs (val_accuracy, val_auc, val_top<K>_accuracy,
// val_<output>_accuracy, ...); lower is better for the others (val_loss,
// val_mae, val_mse, val_<output>_loss, ...).
bool HigherIsBetter(absl::string_view metric);

// The validation metrics a normalized spec's jobs may report, val_loss
// first: for one output its loss's (val_accuracy and val_top<K>_accuracy
// for categorical_crossentropy, val_accuracy and val_auc for
// binary_crossentropy, val_mae and val_mse for regression); for several
// (JobSpec.outputs) the weighted val_loss and each output's as
// val_<name>_loss, val_<name>_accuracy, ... (docs/protocol.md). Top-k
// accuracy is reported only over more than K classes, AUC only for one
// score per sample.
std::vector<std::string> ReportedMetrics(const v1::JobSpec& spec);

// Whether the master brings a job's initial weights (warm_start from a job
// or a checkpoint file); a warm start from a TorchScript file is the
// workers' (they load it and send its weights as any initial weights).
bool WarmStartsOnMaster(const v1::JobSpec& spec);

// Pretty JSON of a spec, with field names as in the .proto.
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_SPEC_JOB_SPEC_H_
