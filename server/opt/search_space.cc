// SearchSpace: paths resolved by job_spec_path.h, values checked against
// each field's type and against NormalizeJobSpec.
//
// Every value a dimension can take is a number (ranges) or one of the
// parameter's own google.protobuf.Value choices (categoricals); both go into
// the job spec through SetJobSpecValue, so Create's checks, Apply and Values
// agree on what a coordinate means.
#include "server/opt/search_space.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"
#include "server/opt/job_spec_path.h"

namespace mpilearn::opt {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Value;

// Bounds on what a study spec may ask for, so the work Create does (a copy
// of the base and a NormalizeJobSpec per checked value) stays bounded.
constexpr int kMaxParameters = 64;
constexpr int kMaxChoices = 1024;
constexpr size_t kMaxPathBytes = 256;
// Values checked against the job spec in all (two per range, one per
// choice).
constexpr int kMaxCheckedValues = 4096;
constexpr uint64_t kMaxGridSize = uint64_t{1} << 40;
// Slack for a real step's last grid value: (high - low) / step computed in
// floating point can fall just short of a whole number.
constexpr double kStepSlack = 1e-9;

Value NumberValue(double x) {
  Value value;
  value.set_number_value(x);
  return value;
}

// The largest k with low + k * step <= high (up to kStepSlack) for a real
// step.
double RealStepCount(double low, double high, double step) {
  return std::floor((high - low) / step + kStepSlack);
}

}  // namespace

absl::StatusOr<SearchSpace> SearchSpace::Create(
    const v1::JobSpec& base,
    const google::protobuf::RepeatedPtrField<v1::ParameterSpec>& parameters) {
  if (parameters.empty()) {
    return absl::InvalidArgumentError(
        "parameters: none given; give at least one parameter (a job-spec "
        "path with a real, int or categorical range)");
  }
  if (parameters.size() > kMaxParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters: ", parameters.size(),
                     " given; a study searches at most ", kMaxParameters));
  }
  {
    v1::JobSpec normalized = base;
    const absl::Status valid = NormalizeJobSpec(&normalized);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("base: ", valid.message(),
                       " (the base spec must be a valid job on its own)"));
    }
  }

  SearchSpace space;
  space.base_ = base;
  absl::flat_hash_map<std::string, int> seen;  // canonical path -> index
  std::vector<std::string> canonical_paths;     // by index
  int checked_values = 0;
  for (int i = 0; i < parameters.size(); ++i) {
    const v1::ParameterSpec& parameter = parameters[i];
    const std::string prefix = absl::StrCat("parameters[", i, "] (",
                                            ShownPath(parameter.path()), "): ");
    auto error = [&prefix](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, parts...));
    };
    if (parameter.path().empty()) {
      return error(
          "empty path; name a job-spec field, e.g. "
          "optimizer.learning_rate");
    }
    if (parameter.path().size() > kMaxPathBytes) {
      return error("path of ", parameter.path().size(), " bytes; at most ",
                   kMaxPathBytes);
    }
    absl::StatusOr<JobSpecPath> chain = ResolveJobSpecPath(parameter.path());
    if (!chain.ok()) return error(chain.status().message());
    const std::string canonical = CanonicalPath(*chain);
    const auto [previous, inserted] = seen.emplace(canonical, i);
    if (!inserted) {
      return error("duplicate: parameters[", previous->second,
                   "] already searches ", canonical, "; give each field once");
    }
    const FieldDescriptor* field = chain->back();

    Dimension dimension;
    dimension.path = parameter.path();
    // The values checked alone against the job spec, with their names.
    std::vector<std::pair<std::string, Value>> checks;
    std::string hint;
    switch (parameter.kind_case()) {
      case v1::ParameterSpec::kReal: {
        const v1::RealRange& range = parameter.real();
        if (field->is_repeated() || !IsFloatingField(field)) {
          return error("a real range cannot set the ", FieldTypeName(field),
                       " field; ",
                       IsIntegerField(field) && !field->is_repeated()
                           ? "give an int range or categorical choices"
                           : "give categorical choices");
        }
        const double limit = field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT
                                 ? FLT_MAX
                                 : DBL_MAX;
        if (!(std::abs(range.low()) <= limit) ||
            !(std::abs(range.high()) <= limit)) {
          return error("real range bounds must be finite numbers for the ",
                       field->type_name(), " field, got low ",
                       FormatNumber(range.low()), ", high ",
                       FormatNumber(range.high()));
        }
        if (range.low() > range.high()) {
          return error("real range low ", FormatNumber(range.low()), " > high ",
                       FormatNumber(range.high()), "; give low <= high");
        }
        if (range.log() && range.low() <= 0) {
          return error("log real range needs low > 0, got ",
                       FormatNumber(range.low()), "; raise low or drop log");
        }
        if (range.has_step()) {
          if (range.log()) {
            return error("a log real range cannot have a step; drop one");
          }
          if (!(range.step() > 0) ||
              !(range.step() <= range.high() - range.low())) {
            return error("real range step ", FormatNumber(range.step()),
                         " must be > 0 and at most high - low (",
                         FormatNumber(range.high() - range.low()), ")");
          }
          dimension.step = range.step();
        }
        dimension.kind = Dimension::Kind::kReal;
        dimension.low = range.low();
        dimension.high = range.high();
        dimension.log = range.log();
        break;
      }
      case v1::ParameterSpec::kInt: {
        const v1::IntRange& range = parameter.int_();
        if (field->is_repeated() ||
            (!IsIntegerField(field) && !IsFloatingField(field))) {
          return error("an int range cannot set the ", FieldTypeName(field),
                       " field; give categorical choices");
        }
        const auto [min, max] = IntegerLimits(field);
        const double low = static_cast<double>(range.low());
        const double high = static_cast<double>(range.high());
        if (low < min || high > max || low > max || high < min) {
          return error("int range [", range.low(), ", ", range.high(),
                       "] goes outside [", FormatNumber(min), ", ",
                       FormatNumber(max), "], what the ", field->type_name(),
                       " field holds");
        }
        if (range.low() > range.high()) {
          return error("int range low ", range.low(), " > high ", range.high(),
                       "; give low <= high");
        }
        if (range.log() && range.low() <= 0) {
          return error("log int range needs low > 0, got ", range.low(),
                       "; raise low or drop log");
        }
        if (range.has_step()) {
          if (range.log()) {
            return error("a log int range cannot have a step; drop one");
          }
          if (range.step() <= 0 ||
              static_cast<double>(range.step()) > kMaxExactInteger) {
            return error("int range step ", range.step(),
                         " must be in [1, 2^53]");
          }
        }
        dimension.kind = Dimension::Kind::kInt;
        dimension.low = low;
        dimension.high = high;
        dimension.log = range.log();
        dimension.step =
            static_cast<double>(range.has_step() ? range.step() : 1);
        break;
      }
      case v1::ParameterSpec::kCategorical: {
        const auto& choices = parameter.categorical().choices();
        if (choices.size() < 2) {
          return error(choices.size(),
                       " categorical choice(s); give at least two (a single "
                       "value belongs in the base spec)");
        }
        if (choices.size() > kMaxChoices) {
          return error(choices.size(), " categorical choices; at most ",
                       kMaxChoices);
        }
        for (int j = 0; j < choices.size(); ++j) {
          const std::string problem = ValueProblem(field, choices[j]);
          if (!problem.empty()) {
            return error("choice ", j, ": ", problem);
          }
          checks.emplace_back(
              absl::StrCat("choice ", j, " (", DescribeValue(choices[j]), ")"),
              choices[j]);
        }
        dimension.kind = Dimension::Kind::kCategorical;
        dimension.low = 0;
        dimension.high = choices.size() - 1;
        dimension.choices = choices.size();
        hint = "drop or change that choice";
        break;
      }
      case v1::ParameterSpec::KIND_NOT_SET:
        return error("no range; give real, int or categorical");
    }
    space.parameters_.push_back(parameter);
    space.dimensions_.push_back(std::move(dimension));
    space.fields_.push_back(*std::move(chain));
    canonical_paths.push_back(canonical);
    const size_t index = space.dimensions_.size() - 1;
    if (parameter.has_when()) {
      const absl::Status condition =
          space.AddCondition(index, parameter.when(), canonical_paths);
      if (!condition.ok()) return error(condition.message());
    }

    // Ranges: their lowest and highest values (high itself unless a step
    // stops short of it).
    const Dimension& added = space.dimensions_[index];
    if (added.kind != Dimension::Kind::kCategorical) {
      const double top = space.Snap(index, added.high);
      checks.emplace_back(absl::StrCat("low ", FormatNumber(added.low)),
                          NumberValue(added.low));
      checks.emplace_back(
          top == added.high ? absl::StrCat("high ", FormatNumber(added.high))
                            : absl::StrCat("largest value ", FormatNumber(top)),
          NumberValue(top));
      hint = "narrow the range";
    }
    checked_values += checks.size();
    if (checked_values > kMaxCheckedValues) {
      return error("the study has over ", kMaxCheckedValues,
                   " choices and range bounds in all; search fewer values");
    }
    for (const auto& [name, value] : checks) {
      v1::JobSpec trial = base;
      // A conditional parameter is checked where it exists: its parent at
      // the first value that makes it.
      const Dimension& checked = space.dimensions_[index];
      if (checked.parent >= 0) {
        const size_t parent = static_cast<size_t>(checked.parent);
        SetJobSpecValue(&trial, space.fields_[parent],
                        space.ValueAt(parent, checked.parent_values.front()));
      }
      SetJobSpecValue(&trial, space.fields_[index], value);
      const absl::Status valid = NormalizeJobSpec(&trial);
      if (!valid.ok()) {
        return error(name,
                     " fails the job spec's validation: ", valid.message(),
                     "; ", hint);
      }
    }
  }
  if (space.conditional_) space.EnumerateConditionalGrid();
  return space;
}

absl::Status SearchSpace::AddCondition(size_t index, const v1::ParameterCondition& when,
                                       const std::vector<std::string>& canonical_paths) {
  absl::StatusOr<JobSpecPath> chain = ResolveJobSpecPath(when.path());
  int parent = -1;
  if (chain.ok()) {
    const std::string canonical = CanonicalPath(*chain);
    for (size_t j = 0; j < index; ++j) {
      if (canonical_paths[j] == canonical) parent = static_cast<int>(j);
    }
  }
  if (parent < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "when.path '", ShownPath(when.path()),
        "' is not an earlier parameter of the study; a condition names a parameter listed "
        "before the one it conditions"));
  }
  const Dimension& on = dimensions_[static_cast<size_t>(parent)];
  if (on.kind == Dimension::Kind::kReal) {
    return absl::InvalidArgumentError(absl::StrCat(
        "when.path ", on.path, " is a real range; a condition needs a categorical or an int "
        "range"));
  }
  if (when.values().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "when.values is empty; give the values of ", on.path, " under which it exists"));
  }
  Dimension& d = dimensions_[index];
  for (const Value& value : when.values()) {
    std::optional<double> coordinate;
    if (on.kind == Dimension::Kind::kCategorical) {
      const auto& choices = parameters_[static_cast<size_t>(parent)].categorical().choices();
      for (int j = 0; j < choices.size() && !coordinate.has_value(); ++j) {
        if (ValuesEqual(choices[j], value)) coordinate = j;
      }
    } else {
      const double x = value.number_value();
      if (value.kind_case() == Value::kNumberValue && x >= on.low && x <= on.high &&
          Snap(static_cast<size_t>(parent), x) == x) {
        coordinate = x;
      }
    }
    if (!coordinate.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "when.values: ", DescribeValue(value), " is not a value ", on.path, " takes"));
    }
    d.parent_values.push_back(*coordinate);
  }
  d.parent = parent;
  conditional_ = true;
  return absl::OkStatus();
}

bool Active(const std::vector<Dimension>& dimensions, const Point& point, size_t i) {
  const Dimension& d = dimensions[i];
  if (d.parent < 0) return true;
  const size_t parent = static_cast<size_t>(d.parent);
  if (parent >= point.size() || std::isnan(point[parent])) return false;
  // The parent's value as Values shows it (a sampler may hand back a
  // coordinate in between grid points).
  const double x = SnapToGrid(dimensions[parent], point[parent]);
  return std::find(d.parent_values.begin(), d.parent_values.end(), x) != d.parent_values.end();
}

void MaskInactive(const std::vector<Dimension>& dimensions, Point& point) {
  for (size_t i = 0; i < dimensions.size() && i < point.size(); ++i) {
    if (!Active(dimensions, point, i)) point[i] = std::numeric_limits<double>::quiet_NaN();
  }
}

double SnapToGrid(const Dimension& d, double x) {
  if (std::isnan(x)) x = d.low;
  switch (d.kind) {
    case Dimension::Kind::kCategorical:
      return std::clamp(std::round(x), 0.0, static_cast<double>(d.choices - 1));
    case Dimension::Kind::kInt: {
      // Integer arithmetic: the bounds are whole numbers within 2^53.
      const int64_t low = static_cast<int64_t>(d.low);
      const int64_t step = static_cast<int64_t>(*d.step);
      const int64_t most = (static_cast<int64_t>(d.high) - low) / step;
      const double k = std::clamp(std::round((x - d.low) / *d.step), 0.0,
                                  static_cast<double>(most));
      return static_cast<double>(low + static_cast<int64_t>(k) * step);
    }
    case Dimension::Kind::kReal:
      break;
  }
  if (!d.step.has_value()) return std::clamp(x, d.low, d.high);
  const double k = std::clamp(std::round((x - d.low) / *d.step), 0.0,
                              RealStepCount(d.low, d.high, *d.step));
  return std::min(d.low + k * *d.step, d.high);
}

double SearchSpace::Snap(size_t i, double x) const { return SnapToGrid(dimensions_[i], x); }

Value SearchSpace::ValueAt(size_t i, double x) const {
  const double snapped = Snap(i, x);
  if (dimensions_[i].kind == Dimension::Kind::kCategorical) {
    return parameters_[i].categorical().choices(static_cast<int>(snapped));
  }
  return NumberValue(snapped);
}

double SearchSpace::GridCount(size_t i) const {
  const Dimension& d = dimensions_[i];
  switch (d.kind) {
    case Dimension::Kind::kCategorical:
      return d.choices;
    case Dimension::Kind::kInt:
      return static_cast<double>(
          (static_cast<int64_t>(d.high) - static_cast<int64_t>(d.low)) /
              static_cast<int64_t>(*d.step) +
          1);
    case Dimension::Kind::kReal:
      break;
  }
  if (!d.step.has_value()) return 0;
  return RealStepCount(d.low, d.high, *d.step) + 1;
}

absl::StatusOr<v1::JobSpec> SearchSpace::Apply(const Point& point) const {
  if (point.size() != dimensions_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("point of ", point.size(), " values for a space of ",
                     dimensions_.size(), " parameters"));
  }
  v1::JobSpec spec = base_;
  std::vector<std::string> applied;
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    if (!Active(dimensions_, point, i)) continue;
    if (!std::isfinite(point[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters[", i, "] (", dimensions_[i].path, "): coordinate ",
          FormatNumber(point[i]), " is not finite"));
    }
    const Value value = ValueAt(i, point[i]);
    SetJobSpecValue(&spec, fields_[i], value);
    applied.push_back(
        absl::StrCat(dimensions_[i].path, " = ", DescribeValue(value)));
  }
  v1::JobSpec normalized = spec;
  const absl::Status valid = NormalizeJobSpec(&normalized);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters ", absl::StrJoin(applied, ", "),
        ": together they fail the job spec's validation: ", valid.message()));
  }
  return spec;
}

ParamValues SearchSpace::Values(const Point& point) const {
  ParamValues values;
  for (size_t i = 0; i < dimensions_.size() && i < point.size(); ++i) {
    if (!Active(dimensions_, point, i)) continue;
    values[dimensions_[i].path] = ValueAt(i, point[i]);
  }
  return values;
}

absl::StatusOr<Point> SearchSpace::FromValues(const ParamValues& values) const {
  for (const auto& [path, value] : values) {
    const bool known = std::any_of(
        dimensions_.begin(), dimensions_.end(),
        [&path = path](const Dimension& d) { return d.path == path; });
    if (!known) {
      std::vector<std::string> paths;
      for (const Dimension& d : dimensions_) paths.push_back(d.path);
      return absl::InvalidArgumentError(absl::StrCat(
          "params: unknown path '", ShownPath(path),
          "'; the study's parameters are ", absl::StrJoin(paths, ", ")));
    }
  }
  Point point(dimensions_.size());
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    const Dimension& d = dimensions_[i];
    auto error = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters[", i, "] (", d.path, "): ", parts...));
    };
    const auto found = values.find(d.path);
    if (!Active(dimensions_, point, i)) {
      if (found != values.end()) {
        return error("does not exist unless ", dimensions_[static_cast<size_t>(d.parent)].path,
                     " takes one of its when.values; leave it out");
      }
      point[i] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (found == values.end()) {
      return error("missing; give a value for every parameter (that exists at these values)");
    }
    const Value& value = found->second;
    if (d.kind == Dimension::Kind::kCategorical) {
      const auto& choices = parameters_[i].categorical().choices();
      int chosen = -1;
      for (int j = 0; j < choices.size() && chosen < 0; ++j) {
        if (ValuesEqual(choices[j], value)) chosen = j;
      }
      if (chosen < 0) {
        std::vector<std::string> shown;
        for (const Value& choice : choices)
          shown.push_back(DescribeValue(choice));
        return error(DescribeValue(value), " is not one of the choices ",
                     absl::StrJoin(shown, ", "));
      }
      point[i] = chosen;
      continue;
    }
    const double x = value.number_value();
    if (value.kind_case() != Value::kNumberValue || !std::isfinite(x)) {
      return error("expected a finite number, got ", DescribeValue(value));
    }
    if (d.kind == Dimension::Kind::kInt && x != std::floor(x)) {
      return error("expected a whole number, got ", FormatNumber(x));
    }
    if (x < d.low || x > d.high) {
      return error(FormatNumber(x), " is out of range [", FormatNumber(d.low),
                   ", ", FormatNumber(d.high), "]");
    }
    if (d.kind == Dimension::Kind::kInt) {
      const int64_t offset =
          static_cast<int64_t>(x) - static_cast<int64_t>(d.low);
      if (offset % static_cast<int64_t>(*d.step) != 0) {
        return error(FormatNumber(x), " is off the step: values are ",
                     FormatNumber(d.low), " + k * ", FormatNumber(*d.step));
      }
      point[i] = x;
    } else if (d.step.has_value()) {
      const double k = (x - d.low) / *d.step;
      if (std::abs(k - std::round(k)) > kStepSlack) {
        return error(FormatNumber(x), " is off the step: values are ",
                     FormatNumber(d.low), " + k * ", FormatNumber(*d.step));
      }
      point[i] = Snap(i, x);
    } else {
      point[i] = x;
    }
  }
  return point;
}

absl::StatusOr<uint64_t> SearchSpace::GridSize() const {
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    if (GridCount(i) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters[", i, "] (", dimensions_[i].path,
          "): the grid sampler needs a step for every real range; give "
          "real.step or use another sampler"));
    }
  }
  uint64_t size = 1;
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    const double count = GridCount(i);
    if (count > static_cast<double>(kMaxGridSize / size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the grid has over 2^40 points (at parameters[", i, "] (",
          dimensions_[i].path, "), with ", FormatNumber(count),
          " values); use larger steps, fewer parameters or another sampler"));
    }
    size *= static_cast<uint64_t>(count);
  }
  if (!conditional_) return size;
  if (size > kMaxConditionalGrid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the grid of a space with conditional parameters is enumerated and has ", size,
        " combinations before its conditions, over ", kMaxConditionalGrid,
        "; use larger steps, fewer parameters or another sampler"));
  }
  return conditional_grid_.size();
}

void SearchSpace::EnumerateConditionalGrid() {
  uint64_t size = 1;
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    const double count = GridCount(i);
    if (count == 0 || count > static_cast<double>(kMaxConditionalGrid / size)) return;
    size *= static_cast<uint64_t>(count);
  }
  const Point firsts = FullGridPoint(0);
  for (uint64_t index = 0; index < size; ++index) {
    Point point = FullGridPoint(index);
    const Point full = point;
    MaskInactive(dimensions_, point);
    // One point per valid combination: only the combination with a
    // dimension that does not exist at its first value stands for all.
    bool first = true;
    for (size_t i = 0; i < point.size() && first; ++i) {
      if (std::isnan(point[i])) first = full[i] == firsts[i];
    }
    if (first) conditional_grid_.push_back(std::move(point));
  }
}

Point SearchSpace::GridPoint(uint64_t index) const {
  if (conditional_) return conditional_grid_.at(index);
  return FullGridPoint(index);
}

Point SearchSpace::FullGridPoint(uint64_t index) const {
  Point point(dimensions_.size());
  for (size_t i = dimensions_.size(); i-- > 0;) {
    const Dimension& d = dimensions_[i];
    const double count = GridCount(i);
    if (count == 0) {  // no grid; GridSize refuses such spaces
      point[i] = d.low;
      continue;
    }
    const uint64_t radix = static_cast<uint64_t>(count);
    const double digit = static_cast<double>(index % radix);
    index /= radix;
    switch (d.kind) {
      case Dimension::Kind::kCategorical:
        point[i] = digit;
        break;
      case Dimension::Kind::kInt:
        point[i] = d.low + digit * *d.step;
        break;
      case Dimension::Kind::kReal:
        point[i] = std::min(d.low + digit * *d.step, d.high);
        break;
    }
  }
  return point;
}

}  // namespace mpilearn::opt
