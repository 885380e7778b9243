// Job-spec fields named by path ("optimizer.learning_rate", "model.hidden"):
// resolving a path with protobuf reflection over v1::JobSpec, checking that
// a google.protobuf.Value fits the field it names, and setting it. The
// search space (search_space.h) is built on these; they know nothing of
// parameters or ranges.
//
//   MPILEARN_ASSIGN_OR_RETURN(JobSpecPath path,
//                             ResolveJobSpecPath("optimizer.learningRate"));
//   if (std::string problem = ValueProblem(path.back(), value);
//       !problem.empty()) { /* "expected a finite number ..." */ }
//   SetJobSpecValue(&spec, path, value);
//
// Threading: stateless functions; the descriptors are the generated pool's,
// immutable and shared.
#ifndef MPILEARN_SERVER_OPT_JOB_SPEC_PATH_H_
#define MPILEARN_SERVER_OPT_JOB_SPEC_PATH_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::opt {

// The fields a path names, from v1::JobSpec down: every one but the last a
// singular message field, the last a scalar or repeated scalar field.
using JobSpecPath = std::vector<const google::protobuf::FieldDescriptor*>;

// Integers travel as doubles (points, google.protobuf.Value): up to 2^53
// they are exact.
inline constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// Resolves '.'-joined segments, each a field's proto name or JSON name.
// INVALID_ARGUMENT saying what is wrong (an unknown field, with the fields
// there are; a scalar on the way; a repeated message; a path ending at a
// message or a bytes field). The message does not repeat the path.
absl::StatusOr<JobSpecPath> ResolveJobSpecPath(absl::string_view path);

// The proto names joined with '.' ("optimizer.learning_rate"): one spelling
// per field.
std::string CanonicalPath(const JobSpecPath& path);

bool IsIntegerField(const google::protobuf::FieldDescriptor* field);
bool IsFloatingField(const google::protobuf::FieldDescriptor* field);
// The whole numbers an integer field holds, within +-2^53 ([-2^53, 2^53]
// for float and double fields).
std::pair<double, double> IntegerLimits(
    const google::protobuf::FieldDescriptor* field);
// "int32", "repeated int32", "enum Foo", ...
std::string FieldTypeName(const google::protobuf::FieldDescriptor* field);

// What is wrong with `value` as what `field` holds ("" when it fits): a
// whole number in range for integer fields, a finite number for float and
// double, a bool, a string (an enum value's name for enums), and for a
// repeated field a list of those (at most 1024).
std::string ValueProblem(const google::protobuf::FieldDescriptor* field,
                         const google::protobuf::Value& value);

// Sets the path's field of `spec` to `value`, creating the messages on the
// way; a repeated field is replaced by the list's elements. `value` passed
// ValueProblem, or is a number in range for a numeric field.
void SetJobSpecValue(v1::JobSpec* spec, const JobSpecPath& path,
                     const google::protobuf::Value& value);

// For error messages: a number (whole numbers in full, others to 12
// significant digits), a path cut to 64 bytes, a value in short JSON-like
// form.
std::string FormatNumber(double x);
std::string ShownPath(absl::string_view path);
std::string DescribeValue(const google::protobuf::Value& value);

// Equal kinds and contents (numbers by ==, lists element by element).
bool ValuesEqual(const google::protobuf::Value& a,
                 const google::protobuf::Value& b);

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_JOB_SPEC_PATH_H_
