// The text mpilearnctl prints: the jobs tables of `list` and `status`, and
// the summary block and GROUPS / EPOCHS / VALIDATIONS sections of
// `status JOB_ID`. Pure functions from the protocol's messages to strings
// (no gRPC, no I/O), so tests check the exact output.
//
//   absl::PrintF("%s", FormatJobStatus(*master->GetJobStatus(job_id)));
//
// Tables are left-aligned columns, each as wide as its widest cell plus two
// blanks, with no trailing blanks; every line ends in '\n'. A value the
// master does not know (yet) prints as "-".
#ifndef MPILEARN_TOOLS_CLI_CTL_FORMAT_H_
#define MPILEARN_TOOLS_CLI_CTL_FORMAT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::ctl {

// Left-aligned text columns, each as wide as its widest cell. Rows may be
// shorter than the header. Not thread-safe; a value type.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);

  void AddRow(std::vector<std::string> row);

  // Every row (header first) as one line, each line prefixed by `indent`;
  // cells separated by at least two blanks; no trailing blanks.
  std::string Format(absl::string_view indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
};

// "JOB_STATE_RUNNING" -> "RUNNING".
std::string StateName(v1::JobState state);

// `mpilearnctl list`: JOB STATE NAME MODEL ALGORITHM EPOCHS UPDATES TEST_ACC.
std::string FormatJobList(absl::Span<const v1::JobStatus> jobs);

// `mpilearnctl status` without a job id: one row per job with its epoch,
// progress, latest samples/s, loss and accuracies (val_mae instead of
// val_accuracy for a job with a regression loss; the column is VAL_MAE when
// every job has one, VAL_ACC/MAE when the jobs are mixed), and alive
// groups. The
// latest values come from history and validations, so the jobs should be
// GetJobStatus's (ListJobs leaves those out; the cells are then "-").
std::string FormatJobsTable(absl::Span<const v1::JobStatus> jobs);

// `mpilearnctl status JOB_ID`: the summary block, then the GROUPS (with the
// step-time shares), EPOCHS and VALIDATIONS (the last kValidationsShown)
// sections, each after a blank line. EPOCHS and VALIDATIONS show
// val_accuracy (VAL_ACC), or val_mae (VAL_MAE, from the records' metrics)
// for a job with a regression loss.
std::string FormatJobStatus(const v1::JobStatus& job);

// How many of the newest validations FormatJobStatus lists.
inline constexpr int kValidationsShown = 5;

}  // namespace mpilearn::ctl

#endif  // MPILEARN_TOOLS_CLI_CTL_FORMAT_H_
