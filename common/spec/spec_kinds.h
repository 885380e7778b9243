// The named choices of a job spec as enums, each with the one table that
// maps it to the names users write in spec files. Normalization checks
// names against these tables and JobConfig reads them into the enums, so
// code past parsing (the master's core, the workers, the tools) switches on
// an enum and never compares a spec string.
//
//   std::optional<LossKind> loss = LossKindFromName("mse");
//   if (!loss) return UnknownName("loss", "loss", "gelu", LossNames());
#ifndef MPILEARN_COMMON_SPEC_SPEC_KINDS_H_
#define MPILEARN_COMMON_SPEC_SPEC_KINDS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {

// ModelSpec.name. kTorchScript is the kind of every spec that names a
// scripted module file (model.torchscript).
enum class ModelKind { kMlp, kCnn, kCnn1d, kGru, kLstm, kTowers, kTorchScript };

struct ModelKindInfo {
  ModelKind kind;
  absl::string_view name;        // as written in specs: "cnn1d"
  absl::string_view class_name;  // the built module's class: "Cnn1d"
  int conv_dims;                 // 2 for cnn, 1 for cnn1d, else 0
  int recurrent_gates;           // 4 for lstm, 3 for gru, else 0
};

// Every kind, built-in models first; kTorchScript last.
absl::Span<const ModelKindInfo> ModelKinds();
const ModelKindInfo& InfoOf(ModelKind kind);
// A built-in model's kind; nullopt for "torchscript" and unknown names.
std::optional<ModelKind> BuiltInModelFromName(absl::string_view name);

// JobSpec.loss.
enum class LossKind {
  kCategoricalCrossentropy,
  kBinaryCrossentropy,
  kMse,
  kMae,
  kHuber,
};

struct LossKindInfo {
  LossKind kind;
  absl::string_view name;
  bool classification;  // labels are classes; accuracy is reported
};

absl::Span<const LossKindInfo> LossKinds();
const LossKindInfo& InfoOf(LossKind kind);
std::optional<LossKind> LossKindFromName(absl::string_view name);

// DataSpec.normalization.mode.
enum class NormalizationMode { kNone, kScale, kStandardize };
std::optional<NormalizationMode> NormalizationModeFromName(absl::string_view name);
absl::string_view NameOf(NormalizationMode mode);

// DataSpec.bad_values: what a streamed training row holding NaN or an
// infinity does.
enum class BadValues { kFail, kSkip };
std::optional<BadValues> BadValuesFromName(absl::string_view name);
absl::string_view NameOf(BadValues policy);

// JobSpec.staleness_scaling.
enum class StalenessScaling { kNone, kInverse };
std::optional<StalenessScaling> StalenessScalingFromName(absl::string_view name);
absl::string_view NameOf(StalenessScaling scaling);

// JobSpec.algorithm: the proto's enum, named as users write it.
std::optional<v1::Algorithm> AlgorithmKindFromName(absl::string_view name);
absl::string_view NameOf(v1::Algorithm algorithm);

// The names of a table quoted and joined for messages: "'none', 'scale',
// 'standardize'". Built-in models only for ModelNames.
std::string ModelNames();
std::string LossNames();
std::string NormalizationModeNames();
std::string BadValuesNames();
std::string StalenessScalingNames();
std::string AlgorithmNames();

// InvalidArgument "<field>: unknown <what> '<got>'; available: <available>".
absl::Status UnknownName(absl::string_view field, absl::string_view what,
                         absl::string_view got, absl::string_view available);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_SPEC_SPEC_KINDS_H_
