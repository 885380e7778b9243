// mpilearn-opt: create, watch, inspect, export and drive MPI Opt studies on
// mpilearn-master's Studies service (proto/study.proto, docs/opt.md).
//
//   mpilearn-opt --master 127.0.0.1:7070 create study.yaml --watch
//   mpilearn-opt best s-1 --spec > best_job.json
//
// main() only parses flags; Run() checks the command line and dispatches
// the subcommand, which returns the exit code: 0 success, 1 the master (or
// reaching it) reported an error, 2 usage or local spec error. Everything
// it prints comes from tools/opt_format.h; study files are read by
// tools/study_spec_file.h. Over 500 lines: the --help text and one short
// function per subcommand, which belong together.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/client/client_security_flags.h"
#include "common/client/master_client.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/study.grpc.pb.h"
#include "proto/study.pb.h"
#include "tools/opt_format.h"
#include "tools/study_spec_file.h"

ABSL_FLAG(std::string, master, "",
          "host:port of mpilearn-master. Default: $MPILEARN_MASTER if set, "
          "else 127.0.0.1:7070.");
ABSL_FLAG(double, connect_timeout_s, 10,
          "Seconds to wait for the master to answer before giving up.");
ABSL_FLAG(double, rpc_timeout_s, 30,
          "Deadline of each call to the master (not of watch's stream).");
ABSL_FLAG(bool, watch, false, "create: go on as `watch` on the new study.");
ABSL_FLAG(double, reconnect_timeout_s, 300,
          "watch: how long to keep trying when the master goes away "
          "(restarting) before giving up; the study continues on the master "
          "either way.");
ABSL_FLAG(std::optional<double>, target, std::nullopt,
          "create: end the study (COMPLETED) as soon as any trial's value "
          "reaches V (>= when maximizing, <= when minimizing); overrides the "
          "file's `target`.");
ABSL_FLAG(std::optional<int>, trials, std::nullopt,
          "create: the trial budget (>= 1); overrides the file's `trials`.");
ABSL_FLAG(std::optional<int>, parallelism, std::nullopt,
          "create: trials queued or running at once (>= 1); overrides the "
          "file's `parallelism`.");
ABSL_FLAG(bool, json, false,
          "status, list, best, cancel, ask, tell: print the master's reply "
          "as JSON (field names as in proto/study.proto).");
ABSL_FLAG(bool, spec, false,
          "best: print the best trial's job spec (the base spec with its "
          "parameters applied) as JSON.");
ABSL_FLAG(std::optional<int>, trial, std::nullopt,
          "cancel: the trial to cancel (else the whole study); tell: the "
          "trial told about.");
ABSL_FLAG(std::string, reason, "", "cancel: why, recorded on the master.");
ABSL_FLAG(std::string, format, "csv", "export: csv or json.");
ABSL_FLAG(std::string, out, "",
          "export: write to this file instead of stdout.");
ABSL_FLAG(std::string, params, "",
          "ask: the trial's parameter values as a JSON object by path, e.g. "
          "'{\"optimizer.learning_rate\": 0.003, \"batch_size\": 64}'; "
          "empty: the study's sampler proposes them.");
ABSL_FLAG(std::string, state, "", "tell: completed, pruned or failed.");
ABSL_FLAG(std::optional<double>, value, std::nullopt,
          "tell: the trial's objective value (required for completed unless "
          "the trial has one).");
ABSL_FLAG(std::string, message, "", "tell: why, recorded on the trial.");

namespace mpilearn::opt {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // the master, the RPC or the study failed
constexpr int kExitUsage = 2;  // bad arguments or an invalid spec file

constexpr char kDefaultMaster[] = "127.0.0.1:7070";
// The largest reply taken from the master: a study's status with every
// trial's intermediate values.
constexpr int kMaxReplyBytes = 64 << 20;

constexpr char kUsage[] =
    "MPI Opt: hyperparameter studies on mpilearn-master (docs/opt.md).\n"
    "\n"
    "Usage: mpilearn-opt [--master HOST:PORT] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "Commands:\n"
    "  create STUDY.(json|yaml) [--watch] [--target V] [--trials N]\n"
    "        [--parallelism N]\n"
    "        check a study spec file and start the study; prints\n"
    "        `study s-1 created`; --watch then goes on as `watch`;\n"
    "        --target ends the study as soon as a trial's value reaches V;\n"
    "        --trials and --parallelism override the file's values\n"
    "  watch STUDY_ID\n"
    "        follow the study until it ends: a live table on a terminal\n"
    "        (trial, state, epochs, value, best marker, parameters), else\n"
    "        one line per event; then prints the best trial\n"
    "  status STUDY_ID [--json]   the study and a table of its trials\n"
    "  list [--json]              the master's studies\n"
    "  best STUDY_ID [--spec]     the best trial: parameters, value, job id;\n"
    "        --spec prints the trial job's full spec as JSON instead\n"
    "  cancel STUDY_ID [--trial N] [--reason TEXT]\n"
    "        stop the study (trials in flight are cancelled), or one trial\n"
    "  export STUDY_ID [--format csv|json] [--out FILE]\n"
    "        csv: one row per trial (number, state, value, epochs_trained,\n"
    "        retries, job_id, one column per parameter, epoch_1, epoch_2...\n"
    "        the intermediate values); json: the StudyStatus\n"
    "  ask STUDY_ID [--params JSON]\n"
    "        start a trial now with these values (an external optimizer's),\n"
    "        or the study sampler's without --params\n"
    "  tell STUDY_ID --trial N --state completed|pruned|failed [--value V]\n"
    "        [--message TEXT]   an external optimizer's verdict on a trial\n"
    "\n"
    "Examples:\n"
    "  mpilearn-opt --master 127.0.0.1:7070 create "
    "docs/examples/opt_fashion_mnist.yaml --watch\n"
    "  mpilearn-opt create study.yaml --trials 8 --parallelism 4 "
    "--target 0.9\n"
    "  mpilearn-opt watch s-1\n"
    "  mpilearn-opt status s-1\n"
    "  mpilearn-opt list\n"
    "  mpilearn-opt best s-1\n"
    "  mpilearn-opt best s-1 --spec > best_job.json\n"
    "  mpilearn-opt cancel s-1 --trial 3 --reason 'bad data'\n"
    "  mpilearn-opt export s-1 --format csv --out s-1.csv\n"
    "  mpilearn-opt export s-1 --format json > s-1.json\n"
    "  mpilearn-opt ask s-2 --params '{\"optimizer.learning_rate\": 0.003, "
    "\"batch_size\": 64}'\n"
    "  mpilearn-opt tell s-2 --trial 0 --state completed --value 0.87\n"
    "\n"
    "Exit codes: 0 ok, 1 master/RPC error, 2 usage or spec file error. The\n"
    "master address defaults to $MPILEARN_MASTER, else 127.0.0.1:7070.\n"
    "\n"
    "A master with TLS and tokens (docs/security.md) takes --tls_ca FILE\n"
    "(and --tls_cert/--tls_key for mutual TLS) and --token_file FILE or\n"
    "$MPILEARN_TOKEN; studies need an admin token.";

// Settings of one invocation, read from the flags by main().
struct Options {
  std::string master;         // host:port
  std::string master_source;  // where `master` came from, for messages
  MasterClient::Options client;
  bool watch = false;
  absl::Duration reconnect_timeout = absl::Minutes(5);  // watch
  std::optional<double> target;  // create: overrides of the spec file's
  std::optional<int> trials;
  std::optional<int> parallelism;
  bool json = false;
  bool spec = false;
  std::optional<int> trial;
  std::string reason;
  std::string format;
  std::string out;
  std::string params;
  std::string state;
  std::optional<double> value;
  std::string message;
};

int UsageError(absl::string_view message) {
  absl::FPrintF(stderr, "mpilearn-opt: %s\nTry 'mpilearn-opt --help'.\n",
                message);
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  absl::FPrintF(stderr, "mpilearn-opt: %s\n", status.message());
  return kExitError;
}

// Fail for errors of the master or of reaching it: the master's message,
// and where the address came from when nothing answered there.
int FailRpc(const absl::Status& status, const Options& options) {
  PrintMasterError("mpilearn-opt", status,
                   {options.master, options.master_source});
  return kExitError;
}

// The master's Studies service and, for trial jobs' specs, its Master
// service, over one channel. Thread-compatible.
class StudiesConnection {
 public:
  // UNAVAILABLE when nothing answers at options.master in time;
  // INVALID_ARGUMENT when the TLS files cannot be read.
  static absl::StatusOr<std::unique_ptr<StudiesConnection>> Connect(
      const Options& options) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxReplyBytes);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> created =
        CreateMasterChannel(options.master, options.client.security, args);
    if (!created.ok()) return created.status();
    std::shared_ptr<grpc::Channel> channel = *std::move(created);
    const auto deadline =
        std::chrono::system_clock::now() +
        absl::ToChronoMilliseconds(options.client.connect_timeout);
    if (!channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach mpilearn-master at ", options.master, " within ",
          absl::FormatDuration(options.client.connect_timeout),
          "; is it running and is the address right?",
          options.client.security.tls_ca.empty()
              ? " If it serves TLS, give --tls_ca (docs/security.md)."
              : " With --tls_ca: does it serve TLS with a certificate for "
                "this address, signed by that CA?"));
    }
    return std::unique_ptr<StudiesConnection>(
        new StudiesConnection(options, channel));
  }

  // One unary call of the Studies service with the call deadline.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (v1::Studies::StubInterface::*method)(grpc::ClientContext*,
                                                         const Request&,
                                                         Response*),
      const Request& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(rpc_timeout_));
    Response response;
    const grpc::Status status =
        (studies_.get()->*method)(&context, request, &response);
    if (!status.ok()) return Annotate(status);
    return response;
  }

  absl::StatusOr<v1::StudyStatus> GetStudy(const std::string& study_id) {
    v1::GetStudyRequest request;
    request.set_study_id(study_id);
    return Call(&v1::Studies::StubInterface::GetStudy, request);
  }

  // A WatchStudy stream, without a deadline; `context` must outlive it.
  std::unique_ptr<grpc::ClientReaderInterface<v1::StudyEvent>> WatchStudy(
      grpc::ClientContext* context, const std::string& study_id) {
    v1::WatchStudyRequest request;
    request.set_study_id(study_id);
    return studies_->WatchStudy(context, request);
  }

  // The Master service (GetJobStatus for a trial's job).
  MasterClient& master() { return *master_; }

  // The master's status with its address on transport errors, and a hint
  // when it serves no studies.
  absl::Status Annotate(const grpc::Status& status) const {
    const absl::Status converted = FromGrpcStatus(status);
    if (absl::IsUnavailable(converted) || absl::IsDeadlineExceeded(converted)) {
      return absl::Status(
          converted.code(),
          absl::StrCat("master at ", address_, ": ", converted.message()));
    }
    if (absl::IsUnimplemented(converted)) {
      return absl::UnimplementedError(absl::StrCat(
          "the master at ", address_,
          " does not serve studies (an mpilearn-master without MPI Opt?): ",
          converted.message()));
    }
    return converted;
  }

 private:
  StudiesConnection(const Options& options,
                    std::shared_ptr<grpc::Channel> channel)
      : address_(options.master),
        rpc_timeout_(options.client.rpc_timeout),
        studies_(v1::Studies::NewStub(channel)),
        master_(MasterClient::ForChannel(channel, options.master,
                                         options.client)) {}

  const std::string address_;
  const absl::Duration rpc_timeout_;
  std::unique_ptr<v1::Studies::StubInterface> studies_;
  std::unique_ptr<MasterClient> master_;
};

using Stub = v1::Studies::StubInterface;

// Prints `message` as JSON.
int PrintJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = MessageToJson(message);
  if (!json.ok()) return Fail(json.status());
  absl::PrintF("%s", *json);
  return kExitOk;
}

// --- watch -------------------------------------------------------------------

// Draws the live table in place on a terminal: each redraw moves the cursor
// back over the lines drawn before and clears them. Lines are cut to the
// terminal's width, since a wrapped line would throw the count off.
class LiveTable {
 public:
  LiveTable() {
    winsize size{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_row > 0) {
      rows_ = size.ws_row;
      columns_ = size.ws_col;
    }
  }

  void Draw(const v1::StudyStatus& study) {
    // The headline, the table's header and its "more trials" line.
    const int max_rows = std::max(3, rows_ - 4);
    const std::string text = absl::StrCat(FormatStudyHeadline(study), "\n",
                                          FormatTrialTable(study, max_rows));
    std::string screen;
    if (lines_drawn_ > 0) absl::StrAppend(&screen, "\033[", lines_drawn_, "A");
    screen += "\r\033[J";
    lines_drawn_ = 0;
    for (absl::string_view line :
         absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (columns_ > 1 && static_cast<int>(line.size()) >= columns_) {
        line = line.substr(0, columns_ - 1);
      }
      absl::StrAppend(&screen, line, "\n");
      ++lines_drawn_;
    }
    std::fwrite(screen.data(), 1, screen.size(), stdout);
    std::fflush(stdout);
  }

 private:
  int rows_ = 24;
  int columns_ = 0;  // 0: unknown, lines not cut
  int lines_drawn_ = 0;
};

bool IsTerminal() {
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) &&
         !(term != nullptr && absl::string_view(term) == "dumb");
}

// The study's end: its best trial, from a fresh GetStudy (else `view`).
int PrintStudyEnd(StudiesConnection& connection, const v1::StudyStatus& view) {
  absl::StatusOr<v1::StudyStatus> final_status =
      connection.GetStudy(view.study_id());
  const v1::StudyStatus& study = final_status.ok() ? *final_status : view;
  absl::PrintF("\n%s", FormatBestTrial(study));
  return kExitOk;
}

int WatchStudy(StudiesConnection& connection, const std::string& study_id,
               const Options& options) {
  absl::StatusOr<v1::StudyStatus> initial = connection.GetStudy(study_id);
  if (!initial.ok()) return FailRpc(initial.status(), options);
  v1::StudyStatus view = *std::move(initial);
  const bool live = IsTerminal();
  LiveTable table;
  if (view.state() != v1::STUDY_STATE_RUNNING) {
    // Ended already: nothing to follow.
    absl::PrintF("%s\n%s", FormatStudyHeadline(view), FormatTrialTable(view));
    return PrintStudyEnd(connection, view);
  }
  if (live) {
    table.Draw(view);
  } else {
    absl::PrintF("%s\n", FormatStudyHeadline(view));
    std::fflush(stdout);
  }
  v1::StudyEvent event;
  bool ended = false;
  grpc::Status status;
  while (true) {
    grpc::ClientContext context;
    auto reader = connection.WatchStudy(&context, study_id);
    while (reader->Read(&event)) {
      if (!live) {
        absl::PrintF("%s\n", FormatStudyEvent(event, view));
        std::fflush(stdout);
      }
      ApplyStudyEvent(event, &view);
      if (live) table.Draw(view);
      if (event.kind() == v1::StudyEvent::KIND_STUDY_ENDED) {
        ended = true;
        break;
      }
    }
    if (ended) {
      context.TryCancel();
      if (live) absl::PrintF("%s\n", FormatStudyEvent(event, view));
    }
    status = reader->Finish();
    if (ended || status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    // The master went away (a restart): the study lives on in its state
    // directory. Watch again once it answers; the new stream starts with
    // every trial as it stands.
    absl::FPrintF(stderr,
                  "mpilearn-opt: lost the master (%s); watching %s again once "
                  "it is back (up to %s)\n",
                  status.error_message(), study_id,
                  absl::FormatDuration(options.reconnect_timeout));
    const absl::Time give_up = absl::Now() + options.reconnect_timeout;
    absl::StatusOr<v1::StudyStatus> again = connection.GetStudy(study_id);
    while (!again.ok() && again.status().code() == absl::StatusCode::kUnavailable &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Seconds(1));
      again = connection.GetStudy(study_id);
    }
    if (!again.ok()) return FailRpc(again.status(), options);
    view = *std::move(again);
  }
  if (!ended) {
    if (!status.ok()) return FailRpc(connection.Annotate(status), options);
    if (view.state() == v1::STUDY_STATE_RUNNING) {
      return Fail(absl::UnavailableError(
          absl::StrCat("the master ended the watch of ", study_id,
                       " before the study ended; run `mpilearn-opt watch ",
                       study_id, "` again")));
    }
  }
  return PrintStudyEnd(connection, view);
}

// --- the other subcommands
// -----------------------------------------------------

int CreateStudy(StudiesConnection& connection, const v1::StudySpec& spec,
                const Options& options) {
  v1::CreateStudyRequest request;
  *request.mutable_spec() = spec;
  absl::StatusOr<v1::CreateStudyResponse> created =
      connection.Call(&Stub::CreateStudy, request);
  if (!created.ok()) return FailRpc(created.status(), options);
  absl::PrintF("study %s created\n", created->study_id());
  std::fflush(stdout);
  if (!options.watch) return kExitOk;
  return WatchStudy(connection, created->study_id(), options);
}

int ShowStatus(StudiesConnection& connection, const std::string& study_id,
               const Options& options) {
  absl::StatusOr<v1::StudyStatus> study = connection.GetStudy(study_id);
  if (!study.ok()) return FailRpc(study.status(), options);
  if (options.json) return PrintJson(*study);
  absl::PrintF("%s\n%s", FormatStudySummary(*study), FormatTrialTable(*study));
  return kExitOk;
}

int ListStudies(StudiesConnection& connection, const Options& options) {
  absl::StatusOr<v1::ListStudiesResponse> listed =
      connection.Call(&Stub::ListStudies, v1::ListStudiesRequest());
  if (!listed.ok()) return FailRpc(listed.status(), options);
  if (options.json) return PrintJson(*listed);
  if (listed->studies().empty()) {
    absl::PrintF("no studies on the master at %s\n", options.master);
    return kExitOk;
  }
  absl::PrintF("%s", FormatStudyList(std::vector<v1::StudyStatus>(
                         listed->studies().begin(), listed->studies().end())));
  return kExitOk;
}

int ShowBest(StudiesConnection& connection, const std::string& study_id,
             const Options& options) {
  absl::StatusOr<v1::StudyStatus> study = connection.GetStudy(study_id);
  if (!study.ok()) return FailRpc(study.status(), options);
  const v1::Trial* best = FindBestTrial(*study);
  if (best == nullptr) {
    return Fail(absl::NotFoundError(
        absl::StrCat("study ", study_id,
                     " has no trial with a value yet (COMPLETED or "
                     "PRUNED)")));
  }
  if (options.spec) {
    // The trial's job spec is the base spec with its parameters applied,
    // as the master ran it.
    absl::StatusOr<v1::JobStatus> job =
        connection.master().GetJobStatus(best->job_id());
    if (!job.ok()) return FailRpc(job.status(), options);
    std::string json = JobSpecToJson(job->spec());
    if (!absl::EndsWith(json, "\n")) json += "\n";
    absl::PrintF("%s", json);
    return kExitOk;
  }
  if (options.json) return PrintJson(*best);
  absl::PrintF("%s", FormatBestTrial(*study));
  return kExitOk;
}

int Cancel(StudiesConnection& connection, const std::string& study_id,
           const Options& options) {
  if (options.trial.has_value()) {
    v1::CancelTrialRequest request;
    request.set_study_id(study_id);
    request.set_trial(*options.trial);
    request.set_reason(options.reason);
    absl::StatusOr<v1::Trial> trial =
        connection.Call(&Stub::CancelTrial, request);
    if (!trial.ok()) return FailRpc(trial.status(), options);
    if (options.json) return PrintJson(*trial);
    v1::StudyStatus study;
    study.set_study_id(study_id);
    absl::PrintF("%s\n", FormatTrialLine(*trial, study));
    return kExitOk;
  }
  v1::CancelStudyRequest request;
  request.set_study_id(study_id);
  request.set_reason(options.reason);
  absl::StatusOr<v1::StudyStatus> study =
      connection.Call(&Stub::CancelStudy, request);
  if (!study.ok()) return FailRpc(study.status(), options);
  if (options.json) return PrintJson(*study);
  absl::PrintF("study %s %s%s\n", study->study_id(),
               StudyStateName(study->state()),
               study->message().empty() ? "" : ": " + study->message());
  return kExitOk;
}

int Export(StudiesConnection& connection, const std::string& study_id,
           const Options& options) {
  absl::StatusOr<v1::StudyStatus> study = connection.GetStudy(study_id);
  if (!study.ok()) return FailRpc(study.status(), options);
  std::string text;
  if (options.format == "csv") {
    text = FormatStudyCsv(*study);
  } else {
    absl::StatusOr<std::string> json = MessageToJson(*study);
    if (!json.ok()) return Fail(json.status());
    text = *std::move(json);
  }
  if (options.out.empty()) {
    absl::PrintF("%s", text);
    return kExitOk;
  }
  errno = 0;
  std::ofstream out(options.out, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    return Fail(absl::UnavailableError(absl::StrCat(
        "cannot write '", options.out,
        "': ", errno != 0 ? std::strerror(errno) : "write failed")));
  }
  absl::PrintF("study %s: %d trials written to %s\n", study_id,
               study->trials_size(), options.out);
  return kExitOk;
}

// `params`: --params parsed (empty: the sampler proposes the values).
int Ask(StudiesConnection& connection, const std::string& study_id,
        const google::protobuf::Struct& params, const Options& options) {
  v1::AskTrialRequest request;
  request.set_study_id(study_id);
  for (const auto& [path, value] : params.fields()) {
    (*request.mutable_params())[path] = value;
  }
  absl::StatusOr<v1::Trial> trial = connection.Call(&Stub::AskTrial, request);
  if (!trial.ok()) return FailRpc(trial.status(), options);
  if (options.json) return PrintJson(*trial);
  v1::StudyStatus study;
  study.set_study_id(study_id);
  absl::PrintF("%s\n", FormatTrialLine(*trial, study));
  return kExitOk;
}

int Tell(StudiesConnection& connection, const std::string& study_id,
         v1::TrialState state, const Options& options) {
  v1::TellTrialRequest request;
  request.set_study_id(study_id);
  request.set_trial(*options.trial);
  request.set_state(state);
  if (options.value.has_value()) request.set_value(*options.value);
  request.set_message(options.message);
  absl::StatusOr<v1::Trial> trial = connection.Call(&Stub::TellTrial, request);
  if (!trial.ok()) return FailRpc(trial.status(), options);
  if (options.json) return PrintJson(*trial);
  v1::StudyStatus study;
  study.set_study_id(study_id);
  absl::PrintF("%s\n", FormatTrialLine(*trial, study));
  return kExitOk;
}

// --- command line
// --------------------------------------------------------------

struct Command {
  absl::string_view name;
  absl::string_view operand;  // empty: takes none
  // The command's own flags; another command's is a usage error (--master,
  // --connect_timeout_s and --rpc_timeout_s go with every command).
  std::vector<absl::string_view> flags;
};

const std::vector<Command>& Commands() {
  static const std::vector<Command>* const commands = new std::vector<Command>{
      {"create",
       "STUDY.(json|yaml)",
       {"watch", "target", "trials", "parallelism"}},
      {"watch", "STUDY_ID", {}},
      {"status", "STUDY_ID", {"json"}},
      {"list", "", {"json"}},
      {"best", "STUDY_ID", {"spec", "json"}},
      {"cancel", "STUDY_ID", {"trial", "reason", "json"}},
      {"export", "STUDY_ID", {"format", "out"}},
      {"ask", "STUDY_ID", {"params", "json"}},
      {"tell", "STUDY_ID", {"trial", "state", "value", "message", "json"}},
  };
  return *commands;
}

// Every flag named on the command line ("--name", "-name=x", "--noname"),
// up to "--".
std::set<std::string> FlagsOnCommandLine(int argc, char** argv) {
  std::set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    names.insert(name);
    if (absl::StartsWith(name, "no")) names.insert(name.substr(2));
  }
  return names;
}

// Checks the command line and runs the command. `args`: the positional
// arguments (the command and its operand); `given`: the flags named.
int Run(const std::vector<std::string>& args,
        const std::set<std::string>& given, const Options& options) {
  if (args.empty()) return UsageError("missing command");
  const std::string& name = args[0];
  const Command* command = nullptr;
  std::vector<absl::string_view> names;
  for (const Command& c : Commands()) {
    names.push_back(c.name);
    if (c.name == name) command = &c;
  }
  if (command == nullptr) {
    return UsageError(absl::StrCat("unknown command '", name, "'; commands: ",
                                   absl::StrJoin(names, ", ")));
  }
  const size_t operands = command->operand.empty() ? 0 : 1;
  if (args.size() < operands + 1) {
    return UsageError(absl::StrCat("missing argument: mpilearn-opt ", name, " ",
                                   command->operand));
  }
  if (args.size() > operands + 1) {
    return UsageError(absl::StrCat("unexpected argument '", args[operands + 1],
                                   "' after '", name, "'"));
  }
  // Flags of other commands: a mistake (e.g. --trial on best), not ignored.
  for (const Command& other : Commands()) {
    for (absl::string_view flag : other.flags) {
      const bool own = std::find(command->flags.begin(), command->flags.end(),
                                 flag) != command->flags.end();
      if (!own && given.count(std::string(flag)) > 0) {
        return UsageError(
            absl::StrCat("--", flag, " does not go with '", name, "'"));
      }
    }
  }
  const std::string operand = operands > 0 ? args[1] : "";

  // Checks that need no master.
  v1::StudySpec spec;
  v1::TrialState tell_state = v1::TRIAL_STATE_UNSPECIFIED;
  if (name == "create") {
    if (options.trials.has_value() && *options.trials < 1) {
      return UsageError(
          absl::StrCat("--trials must be >= 1, got ", *options.trials));
    }
    if (options.parallelism.has_value() && *options.parallelism < 1) {
      return UsageError(absl::StrCat("--parallelism must be >= 1, got ",
                                     *options.parallelism));
    }
    if (options.target.has_value() && !std::isfinite(*options.target)) {
      return UsageError("--target must be a finite number");
    }
    absl::StatusOr<v1::StudySpec> read = ReadStudySpecFile(operand);
    absl::Status checked = read.ok() ? CheckBaseJobSpec(*read) : read.status();
    if (!checked.ok()) {
      absl::FPrintF(stderr, "mpilearn-opt: %s%s\n",
                    read.ok() ? absl::StrCat(operand, ": ") : "",
                    checked.message());
      return kExitUsage;
    }
    spec = *std::move(read);
    // The flags win over the file; the master checks the result (e.g. the
    // budget's upper bound) like any spec.
    if (options.target.has_value()) spec.set_target(*options.target);
    if (options.trials.has_value()) spec.set_trials(*options.trials);
    if (options.parallelism.has_value()) {
      spec.set_parallelism(*options.parallelism);
    }
  }
  if (name == "export" && options.format != "csv" && options.format != "json") {
    return UsageError(absl::StrCat("--format must be csv or json, got '",
                                   options.format, "'"));
  }
  google::protobuf::Struct ask_params;
  if (name == "ask" && !options.params.empty()) {
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        options.params, &ask_params);
    if (!parsed.ok()) {
      return UsageError(
          absl::StrCat("--params must be a JSON object of values by path: ",
                       std::string(parsed.message())));
    }
  }
  if (name == "cancel" && options.trial.has_value() && *options.trial < 0) {
    return UsageError("--trial must be >= 0");
  }
  if (name == "tell") {
    if (!options.trial.has_value() || *options.trial < 0) {
      return UsageError("tell needs --trial N (N >= 0)");
    }
    if (options.state == "completed") {
      tell_state = v1::TRIAL_STATE_COMPLETED;
    } else if (options.state == "pruned") {
      tell_state = v1::TRIAL_STATE_PRUNED;
    } else if (options.state == "failed") {
      tell_state = v1::TRIAL_STATE_FAILED;
    } else {
      return UsageError(
          absl::StrCat("tell needs --state completed, pruned or failed, got '",
                       options.state, "'"));
    }
  }

  absl::StatusOr<std::unique_ptr<StudiesConnection>> connection =
      StudiesConnection::Connect(options);
  if (!connection.ok()) return FailRpc(connection.status(), options);
  StudiesConnection& master = **connection;
  if (name == "create") return CreateStudy(master, spec, options);
  if (name == "watch") return WatchStudy(master, operand, options);
  if (name == "status") return ShowStatus(master, operand, options);
  if (name == "list") return ListStudies(master, options);
  if (name == "best") return ShowBest(master, operand, options);
  if (name == "cancel") return Cancel(master, operand, options);
  if (name == "export") return Export(master, operand, options);
  if (name == "ask") return Ask(master, operand, ask_params, options);
  return Tell(master, operand, tell_state, options);
}

// Reads the flags into Options; an error is a usage error.
absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  const MasterAddress master =
      ResolveMasterAddress(absl::GetFlag(FLAGS_master), kDefaultMaster);
  options.master = master.address;
  options.master_source = master.source;
  const double connect_s = absl::GetFlag(FLAGS_connect_timeout_s);
  const double rpc_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  if (!(connect_s > 0)) {
    return absl::InvalidArgumentError("--connect_timeout_s must be > 0");
  }
  if (!(rpc_s > 0)) {
    return absl::InvalidArgumentError("--rpc_timeout_s must be > 0");
  }
  options.client.connect_timeout = absl::Seconds(connect_s);
  options.client.rpc_timeout = absl::Seconds(rpc_s);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromFlags();
  if (!security.ok()) return security.status();
  options.client.security = *std::move(security);
  options.watch = absl::GetFlag(FLAGS_watch);
  const double reconnect_s = absl::GetFlag(FLAGS_reconnect_timeout_s);
  if (!(reconnect_s >= 0)) {
    return absl::InvalidArgumentError("--reconnect_timeout_s must be >= 0");
  }
  options.reconnect_timeout = absl::Seconds(reconnect_s);
  options.target = absl::GetFlag(FLAGS_target);
  options.trials = absl::GetFlag(FLAGS_trials);
  options.parallelism = absl::GetFlag(FLAGS_parallelism);
  options.json = absl::GetFlag(FLAGS_json);
  options.spec = absl::GetFlag(FLAGS_spec);
  options.trial = absl::GetFlag(FLAGS_trial);
  options.reason = absl::GetFlag(FLAGS_reason);
  options.format = absl::GetFlag(FLAGS_format);
  options.out = absl::GetFlag(FLAGS_out);
  options.params = absl::GetFlag(FLAGS_params);
  options.state = absl::GetFlag(FLAGS_state);
  options.value = absl::GetFlag(FLAGS_value);
  options.message = absl::GetFlag(FLAGS_message);
  return options;
}

}  // namespace
}  // namespace mpilearn::opt

int main(int argc, char** argv) {
  namespace opt = mpilearn::opt;
  absl::SetProgramUsageMessage(opt::kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "tools/mpilearn_opt.cc") ||
           absl::EndsWith(path, mpilearn::kClientSecurityFlagsSource);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  const std::string undefined = mpilearn::FindUndefinedFlag(argc, argv);
  if (!undefined.empty()) {
    return opt::UsageError(absl::StrCat("unknown flag '", undefined, "'"));
  }
  const std::set<std::string> given = opt::FlagsOnCommandLine(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::StatusOr<opt::Options> options = opt::OptionsFromFlags();
  if (!options.ok()) return opt::UsageError(options.status().message());
  return opt::Run(
      std::vector<std::string>(positional.begin() + 1, positional.end()), given,
      *options);
}
