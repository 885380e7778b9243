// The text mpilearn-opt prints: trial tables, watch lines, the best-trial
// summary, study listings and the CSV export. Pure functions from the
// Studies protocol's messages (proto/study.proto) to strings, with no gRPC
// and no I/O, so tests check the exact output.
//
//   v1::StudyStatus study = ...;  // GetStudy
//   absl::PrintF("%s\n%s", FormatStudySummary(study), FormatTrialTable(study));
//
// Watching keeps a StudyStatus up to date with ApplyStudyEvent and redraws
// FormatTrialTable from it, or prints FormatStudyEvent per event.
//
// Numbers: parameter values and objective values in tables and lines are
// compact (integral values as integers, others with %.4g: "0.0031",
// "1e-05"); lists as "[256,128]". The CSV export writes every number so it
// reads back exactly. A value not known yet prints as "-" (empty in CSV).
#ifndef MPILEARN_TOOLS_CLI_OPT_FORMAT_H_
#define MPILEARN_TOOLS_CLI_OPT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {

// "TRIAL_STATE_PRUNED" -> "PRUNED"; "STUDY_STATE_RUNNING" -> "RUNNING".
std::string TrialStateName(v1::TrialState state);
std::string StudyStateName(v1::StudyState state);

// A parameter value, compact: 64, 0.0031, 1e-05, sync, true, [256,128].
std::string FormatParamValue(const google::protobuf::Value& value);

// A parameter value that reads back exactly (for CSV): numbers with up to
// 17 significant digits, strings inside lists JSON-quoted
// (["relu","tanh"]), top-level strings bare.
std::string ExactParamValue(const google::protobuf::Value& value);

// The parameter paths in the spec's order, then any other path the trials
// carry (sorted).
std::vector<std::string> ParameterPaths(const v1::StudyStatus& study);

// "learning_rate=0.0031 batch_size=64": each parameter by the last part of
// its path (the whole path where two parameters share a last part), in
// ParameterPaths order.
std::string FormatTrialParams(const v1::Trial& trial,
                              const v1::StudyStatus& study);

// The objective as "val_accuracy (maximize)", with the defaults of an
// unset metric (val_accuracy) and direction (maximize for val_accuracy,
// else minimize) filled in.
std::string ObjectiveText(const v1::StudySpec& spec);

// The trials as a table with fixed column widths (so a live view does not
// shift as values arrive; a wider cell widens only its row):
//
//   TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS
//   0      COMPLETED  10      0.8812      *     learning_rate=0.0031 ...
//
// BEST marks study.best_trial. With max_rows > 0 and more trials than
// that, shows the best trial, the queued and running ones and then the
// newest, max_rows in all (by number), and a last line counting the rest.
std::string FormatTrialTable(const v1::StudyStatus& study, int max_rows = 0);

// `status`: the key/value block above the trial table (study, name, state,
// objective, sampler and pruner, trials against the budget, epochs trained,
// best, message).
std::string FormatStudySummary(const v1::StudyStatus& study);

// One line for the top of the live view: "study s-1 RUNNING  trials 5/20,
// 2 running  best trial 3 value=0.8812".
std::string FormatStudyHeadline(const v1::StudyStatus& study);

// `list`: STUDY NAME STATE SAMPLER BUDGET RUNNING BEST_TRIAL BEST_VALUE
// EPOCHS, one row per study (ListStudies leaves the trials out).
std::string FormatStudyList(absl::Span<const v1::StudyStatus> studies);

// One trial as a line (ask, tell, cancel, and watch without a terminal):
//   trial 3 QUEUED job job-000012 (learning_rate=0.0031)
//   trial 3 RUNNING job job-000012 epoch 2 value=0.8123 (learning_rate=...)
//   trial 3 PRUNED at epoch 2 value=0.8123 (learning_rate=...): MESSAGE
// " [best]" follows the value of the study's best trial.
std::string FormatTrialLine(const v1::Trial& trial,
                            const v1::StudyStatus& study);

// One watch event as a line (no trailing '\n'). KIND_REPORTED prints
// "trial 3 epoch 2 value=0.8123" (the new intermediate value);
// KIND_STUDY_ENDED "study s-1 COMPLETED: MESSAGE"; the others the trial's
// FormatTrialLine. `study` (for the parameter names and the study id) is
// the state before the event.
std::string FormatStudyEvent(const v1::StudyEvent& event,
                             const v1::StudyStatus& study);

// Updates `study` with `event`: replaces (or inserts, keeping trials by
// number) the event's trial, takes the event's best trial, study state and
// (for KIND_STUDY_ENDED) message, and recounts trials_running and
// epochs_trained.
void ApplyStudyEvent(const v1::StudyEvent& event, v1::StudyStatus* study);

// `best`: the best trial's number, state, value, objective, job id and
// parameters (full paths, exact values), as key/value lines; or a line
// saying no trial has a value yet.
std::string FormatBestTrial(const v1::StudyStatus& study);

// A study of several objectives: its Pareto front (StudyStatus.pareto_front),
// one row per trial: TRIAL, each objective's value (headed METRIC (max|min)),
// JOB, PARAMS; a line when the front is empty.
std::string FormatParetoFront(const v1::StudyStatus& study);

// The study's best trial, or nullptr when it has none (yet).
const v1::Trial* FindBestTrial(const v1::StudyStatus& study);

// One CSV field, quoted per RFC 4180 when it holds a comma, a double quote,
// CR or LF (quotes doubled inside).
std::string CsvField(absl::string_view text);

// `export --format csv`: a header, then one row per trial: number, state,
// value, epochs_trained, retries, job_id, one column per parameter path
// (ParameterPaths), then the intermediate values as epoch_E for every epoch
// E any trial reported (ascending). Lines end in '\n'.
std::string FormatStudyCsv(const v1::StudyStatus& study);

// `message` as indented JSON with the field names as in the .proto (and a
// final '\n').
absl::StatusOr<std::string> MessageToJson(
    const google::protobuf::Message& message);

}  // namespace mpilearn::opt

#endif  // MPILEARN_TOOLS_CLI_OPT_FORMAT_H_
