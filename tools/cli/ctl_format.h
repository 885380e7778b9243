// The text mpilearnctl prints: the jobs tables of `list`, `queue` and
// `status`, the summary block and GROUPS / EPOCHS / VALIDATIONS sections of
// `status JOB_ID`, and `version`'s lines with the version rule. Pure functions from the protocol's messages to strings
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

// `mpilearnctl list`: JOB STATE OWNER NAME MODEL ALGORITHM EPOCHS UPDATES
// TEST_ACC (OWNER "-" for a job without one: a master without tokens).
std::string FormatJobList(absl::Span<const v1::JobStatus> jobs);

// `mpilearnctl queue`: the QUEUED jobs among `jobs` in the order groups
// will take them (JobStatus.queue_position; a job without a position, as
// from a master before 0.10, after those with one, in list order).
std::vector<v1::JobStatus> QueuedInOrder(absl::Span<const v1::JobStatus> jobs);

// The queue table of QueuedInOrder's jobs: POS JOB OWNER PRIORITY STUDY
// NAME, plus NOTE (why a limit holds the job back) when any job has one.
std::string FormatQueue(absl::Span<const v1::JobStatus> queued);

// Whether a client of release `client` may work with a master of release
// `master`: both "MAJOR.MINOR[.PATCH...]" with the same MAJOR.MINOR
// ("0.10.0" and "0.10.3" yes; "0.10.0" and "0.9.1" no). A version that is
// not of that form (an empty one) matches nothing.
bool SameMajorMinor(absl::string_view client, absl::string_view master);

// `mpilearnctl version`: the client's release, the master's (at `address`)
// and who the token is (ServerInfo.caller and role; "-" for a master
// without tokens).
std::string FormatVersions(absl::string_view client_version,
                           const v1::ServerInfo& info,
                           absl::string_view address);

// Why `mpilearnctl version` fails when !SameMajorMinor, and what to do. An
// empty `master_version` says the master has no GetServerInfo (it predates
// 0.10).
std::string VersionMismatchMessage(absl::string_view client_version,
                                   absl::string_view master_version,
                                   absl::string_view address);

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
