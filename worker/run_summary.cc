#include "worker/run_summary.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace mpilearn::worker {
namespace {

// `value` rounded to `decimals` places, as printf's %.Nf shows it.
double Rounded(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

}  // namespace

v1::RunSummary BuildRunSummary(const v1::RegisterGroupResponse& registration,
                               int ranks, bool local, const TrainResult& result) {
  const double total = result.times.total();
  auto share = [&](double s) { return Rounded(total > 0 ? s / total : 0.0, 4); };
  const double epochs =
      std::max(1.0, static_cast<double>(registration.spec().epochs()));
  v1::RunSummary summary;
  summary.set_mode(local ? "local" : registration.spec().algorithm());
  summary.set_ranks(ranks);
  summary.set_job_id(registration.job_id());
  summary.set_samples_per_s(Rounded(result.samples_per_second, 3));
  summary.set_samples_per_s_per_rank(Rounded(result.samples_per_second_per_rank, 3));
  summary.set_epoch_s(Rounded(result.train_seconds / epochs, 4));
  summary.set_train_s(Rounded(result.train_seconds, 4));
  summary.set_validation_s(Rounded(result.validation_seconds, 4));
  summary.set_total_s(Rounded(result.seconds, 4));
  summary.set_units(static_cast<double>(result.units));
  summary.set_samples(static_cast<double>(result.samples));
  summary.set_stale_dropped(static_cast<double>(result.stale_dropped));
  v1::TimeShare& shares = *summary.mutable_share();
  shares.set_data(share(result.times.data));
  shares.set_compute(share(result.times.compute));
  shares.set_master(share(result.times.master));
  shares.set_mpi(share(result.times.mpi));
  summary.set_test_accuracy(Rounded(result.test.accuracy, 4));
  return summary;
}

absl::StatusOr<std::string> RunSummaryJson(const v1::RunSummary& summary) {
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;  // `"key": value`, one pair per line
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names = true;
  std::string indented;
  const auto printed =
      google::protobuf::util::MessageToJsonString(summary, &indented, print);
  if (!printed.ok()) {
    return absl::InternalError(
        absl::StrCat("the run summary as JSON: ", printed.ToString()));
  }
  // Joins the lines: a line break (JSON strings escape their own) and the
  // next line's indent become one space after a comma, nothing elsewhere
  // (after `{`, before `}`).
  std::string line;
  line.reserve(indented.size());
  for (size_t i = 0; i < indented.size(); ++i) {
    if (indented[i] != '\n') {
      line += indented[i];
      continue;
    }
    while (i + 1 < indented.size() && indented[i + 1] == ' ') ++i;
    if (!line.empty() && line.back() == ',') line += ' ';
  }
  return line;
}

absl::Status WriteRunSummary(const std::string& path, const v1::RunSummary& summary) {
  MPILEARN_ASSIGN_OR_RETURN(const std::string json, RunSummaryJson(summary));
  FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  const bool written = std::fprintf(out, "%s\n", json.c_str()) >= 0;
  if (std::fclose(out) != 0 || !written) {
    return absl::DataLossError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace mpilearn::worker
