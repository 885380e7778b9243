// A study's search space: parameters over job-spec fields by path, checked
// against the base spec at creation, and the mapping between a sampler's
// points and job specs.
//
//   MPILEARN_ASSIGN_OR_RETURN(SearchSpace space,
//                             SearchSpace::Create(spec.base(), spec.parameters()));
//   Point point = sampler.Suggest(...);              // internal coordinates
//   MPILEARN_ASSIGN_OR_RETURN(v1::JobSpec job, space.Apply(point));
//   *trial.mutable_params() = space.Values(point);   // what users read
//
// Paths name fields of v1::JobSpec by their proto or JSON names joined with
// '.' ("optimizer.learning_rate", "model.hidden", "batch_size",
// "easgd.alpha"). A path must end at a scalar field (number, string, bool,
// enum) or a repeated scalar field (set from a categorical list choice);
// messages on the way are created as needed. Floating-point fields take
// real or int ranges, integer fields int ranges, and any field categorical
// choices of its type (a list for a repeated field).
//
// Internal coordinates (Point), one double per dimension, in the order of
// the parameters: a real range's value, an int range's value (a whole
// number), a categorical's choice index (0 .. choices - 1). Samplers see
// only Dimension and Point; only this class knows about job specs.
//
// Threading: immutable after Create; safe to share between threads.
#ifndef MPILEARN_SERVER_OPT_SEARCH_SPACE_H_
#define MPILEARN_SERVER_OPT_SEARCH_SPACE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/map.h"
#include "google/protobuf/repeated_field.h"
#include "google/protobuf/struct.pb.h"
#include "proto/mpilearn.pb.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

// One parameter as samplers see it.
struct Dimension {
  enum class Kind { kReal, kInt, kCategorical };
  std::string path;
  Kind kind = Kind::kReal;
  // kReal, kInt: the inclusive bounds. kCategorical: 0 and choices - 1.
  double low = 0;
  double high = 0;
  // Sampled uniformly in log space (kReal, kInt; low > 0).
  bool log = false;
  // kReal: the grid step if given; kInt: the step (default 1).
  std::optional<double> step;
  // kCategorical: the number of choices (>= 2).
  int choices = 0;
  // A conditional parameter (ParameterSpec.when): the earlier dimension it
  // depends on and that dimension's coordinates (choice indices, int
  // values) under which it exists; -1: it always does.
  int parent = -1;
  std::vector<double> parent_values;
};

// A point of the space in internal coordinates (see the file comment). A
// conditional dimension that does not exist at the point (its condition
// fails) holds NaN.
using Point = std::vector<double>;

// Coordinate x moved onto `d`'s range and grid: clamped to [low, high], an
// int (or a real with a step) rounded to low + k * step, a categorical to
// the nearest index. NaN counts as low.
double SnapToGrid(const Dimension& d, double x);

// Whether dimension `i` exists at `point`: unconditional, or its parent
// exists and takes one of parent_values (the parent's coordinate rounded to
// its grid). Parents come before their children.
bool Active(const std::vector<Dimension>& dimensions, const Point& point, size_t i);
// Sets every dimension that does not exist at `point` to NaN, in order.
void MaskInactive(const std::vector<Dimension>& dimensions, Point& point);
using ParamValues = google::protobuf::Map<std::string, google::protobuf::Value>;

class SearchSpace {
 public:
  // The most combinations a conditional space's grid enumerates.
  static constexpr uint64_t kMaxConditionalGrid = uint64_t{1} << 16;

  // Checks every parameter and returns the space. INVALID_ARGUMENT, with a
  // message naming the parameter ("parameters[2] (optimizer.momentum): ..."),
  // for: no parameters; an empty or duplicate path; a path that names no
  // field of the job spec or ends at a message field; a range kind the
  // field cannot take; low > high or a non-finite bound; log with low <= 0
  // or with a step; step <= 0 or larger than high - low (real); fewer than
  // two choices or a choice the field cannot take; and a value that makes
  // the base spec fail the job spec's validation (NormalizeJobSpec): each
  // range's low and high, and each choice, applied alone to the base.
  static absl::StatusOr<SearchSpace> Create(
      const v1::JobSpec& base,
      const google::protobuf::RepeatedPtrField<v1::ParameterSpec>& parameters);

  const std::vector<Dimension>& dimensions() const { return dimensions_; }

  // The base spec with the point's values applied (not normalized: the
  // registry's Submit normalizes); a dimension that does not exist at the
  // point is left as the base has it. An int dimension's value is rounded
  // to its step; a real's to its step if it has one. INVALID_ARGUMENT
  // naming the path when the combination fails the job spec's validation.
  absl::StatusOr<v1::JobSpec> Apply(const Point& point) const;

  // The point's values by path as users read them: numbers (ints as whole
  // numbers), strings, bools, or lists (a categorical's chosen value).
  // Dimensions that do not exist at the point are left out.
  ParamValues Values(const Point& point) const;

  // The point of values given by path (AskTrial). INVALID_ARGUMENT naming
  // the path for a missing or unknown path, a value of the wrong type, out
  // of range, off the step, or not one of the choices, and for a value of
  // a conditional parameter whose condition fails.
  absl::StatusOr<Point> FromValues(const ParamValues& values) const;

  // The grid sampler's points: INVALID_ARGUMENT naming the first real
  // dimension without a step; else the number of points (the product of
  // each dimension's value count; at most 2^40, else INVALID_ARGUMENT).
  // With conditional parameters, only the valid combinations (a
  // dimension that does not exist counts once), enumerated at Create from
  // at most kMaxConditionalGrid combinations.
  absl::StatusOr<uint64_t> GridSize() const;
  // Point `index` of the grid, index < GridSize(): mixed-radix over the
  // dimensions, the first dimension varying slowest.
  Point GridPoint(uint64_t index) const;

 private:
  SearchSpace() = default;

  // SnapToGrid for dimension i.
  double Snap(size_t i, double x) const;
  // The job-spec value of dimension i at coordinate x (snapped), as users
  // read it and as Apply sets it.
  google::protobuf::Value ValueAt(size_t i, double x) const;
  // Dimension i's number of grid values (0 for a real without a step).
  double GridCount(size_t i) const;

  // ParameterSpec.when of parameter `index` into dimension `index`.
  absl::Status AddCondition(size_t index, const v1::ParameterCondition& when,
                            const std::vector<std::string>& canonical_paths);
  // The valid combinations of a conditional space's grid (empty when it
  // has no conditions, or no grid).
  void EnumerateConditionalGrid();
  // The grid's point at mixed-radix `index` over every dimension.
  Point FullGridPoint(uint64_t index) const;

  v1::JobSpec base_;
  std::vector<v1::ParameterSpec> parameters_;
  bool conditional_ = false;
  std::vector<Point> conditional_grid_;
  std::vector<Dimension> dimensions_;
  // Per parameter: the fields its path names, from v1::JobSpec down to the
  // field it sets (every one but the last a singular message field).
  std::vector<std::vector<const google::protobuf::FieldDescriptor*>> fields_;
};

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_SEARCH_SPACE_H_
