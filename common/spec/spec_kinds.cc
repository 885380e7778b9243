#include "common/spec/spec_kinds.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mpilearn {
namespace {

constexpr ModelKindInfo kModelKinds[] = {
    {ModelKind::kMlp, "mlp", "Mlp", 0, 0},
    {ModelKind::kCnn, "cnn", "Cnn", 2, 0},
    {ModelKind::kCnn1d, "cnn1d", "Cnn1d", 1, 0},
    {ModelKind::kGru, "gru", "Gru", 0, 3},
    {ModelKind::kLstm, "lstm", "Lstm", 0, 4},
    {ModelKind::kTowers, "towers", "Towers", 0, 0},
    {ModelKind::kTorchScript, "torchscript", "", 0, 0},
};

constexpr LossKindInfo kLossKinds[] = {
    {LossKind::kCategoricalCrossentropy, "categorical_crossentropy", true},
    {LossKind::kBinaryCrossentropy, "binary_crossentropy", true},
    {LossKind::kMse, "mse", false},
    {LossKind::kMae, "mae", false},
    {LossKind::kHuber, "huber", false},
};

template <typename Kind>
struct Named {
  Kind kind;
  absl::string_view name;
};

constexpr Named<NormalizationMode> kNormalizationModes[] = {
    {NormalizationMode::kNone, "none"},
    {NormalizationMode::kScale, "scale"},
    {NormalizationMode::kStandardize, "standardize"},
};

constexpr Named<BadValues> kBadValues[] = {
    {BadValues::kFail, "fail"},
    {BadValues::kSkip, "skip"},
};

constexpr Named<StalenessScaling> kStalenessScalings[] = {
    {StalenessScaling::kNone, "none"},
    {StalenessScaling::kInverse, "inverse"},
};

constexpr Named<v1::Algorithm> kAlgorithms[] = {
    {v1::ALGORITHM_DOWNPOUR, "downpour"},
    {v1::ALGORITHM_SYNC, "sync"},
    {v1::ALGORITHM_EASGD, "easgd"},
    {v1::ALGORITHM_GEM, "gem"},
};

template <typename Row, size_t N>
auto FindByName(const Row (&table)[N], absl::string_view name)
    -> std::optional<decltype(table[0].kind)> {
  for (const Row& row : table) {
    if (row.name == name) return row.kind;
  }
  return std::nullopt;
}

template <typename Row, size_t N, typename Kind>
const Row& FindByKind(const Row (&table)[N], Kind kind) {
  for (const Row& row : table) {
    if (row.kind == kind) return row;
  }
  return table[0];  // unreachable: every enumerator has a row
}

template <typename Row, size_t N>
std::string QuotedNames(const Row (&table)[N], size_t count = N) {
  std::vector<std::string> quoted;
  for (size_t i = 0; i < count; ++i) {
    quoted.push_back(absl::StrCat("'", table[i].name, "'"));
  }
  return absl::StrJoin(quoted, ", ");
}

}  // namespace

absl::Span<const ModelKindInfo> ModelKinds() { return kModelKinds; }

const ModelKindInfo& InfoOf(ModelKind kind) {
  return FindByKind(kModelKinds, kind);
}

std::optional<ModelKind> BuiltInModelFromName(absl::string_view name) {
  const std::optional<ModelKind> kind = FindByName(kModelKinds, name);
  if (kind == ModelKind::kTorchScript) return std::nullopt;
  return kind;
}

absl::Span<const LossKindInfo> LossKinds() { return kLossKinds; }

const LossKindInfo& InfoOf(LossKind kind) { return FindByKind(kLossKinds, kind); }

std::optional<LossKind> LossKindFromName(absl::string_view name) {
  return FindByName(kLossKinds, name);
}

std::optional<NormalizationMode> NormalizationModeFromName(
    absl::string_view name) {
  return FindByName(kNormalizationModes, name);
}

absl::string_view NameOf(NormalizationMode mode) {
  return FindByKind(kNormalizationModes, mode).name;
}

std::optional<BadValues> BadValuesFromName(absl::string_view name) {
  return FindByName(kBadValues, name);
}

absl::string_view NameOf(BadValues policy) {
  return FindByKind(kBadValues, policy).name;
}

std::optional<StalenessScaling> StalenessScalingFromName(
    absl::string_view name) {
  return FindByName(kStalenessScalings, name);
}

absl::string_view NameOf(StalenessScaling scaling) {
  return FindByKind(kStalenessScalings, scaling).name;
}

std::optional<v1::Algorithm> AlgorithmKindFromName(absl::string_view name) {
  return FindByName(kAlgorithms, name);
}

absl::string_view NameOf(v1::Algorithm algorithm) {
  for (const auto& row : kAlgorithms) {
    if (row.kind == algorithm) return row.name;
  }
  return "unspecified";
}

std::string ModelNames() {
  return QuotedNames(kModelKinds, std::size(kModelKinds) - 1);
}
std::string LossNames() { return QuotedNames(kLossKinds); }
std::string NormalizationModeNames() { return QuotedNames(kNormalizationModes); }
std::string BadValuesNames() { return QuotedNames(kBadValues); }
std::string StalenessScalingNames() { return QuotedNames(kStalenessScalings); }
std::string AlgorithmNames() { return QuotedNames(kAlgorithms); }

absl::Status UnknownName(absl::string_view field, absl::string_view what,
                         absl::string_view got, absl::string_view available) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown ", what, " '", got, "'; available: ", available));
}

}  // namespace mpilearn
