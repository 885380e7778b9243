#include "tools/cli/opt_commands.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/grpc_status.h"
#include "common/spec/job_spec.h"
#include "common/client/master_client.h"
#include "google/protobuf/struct.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/study.grpc.pb.h"
#include "proto/study.pb.h"
#include "tools/cli/opt_format.h"

namespace mpilearn::opt {
namespace {

// The largest reply taken from the master: a study's status with every
// trial's intermediate values.
constexpr int kMaxReplyBytes = 64 << 20;

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
    while (!again.ok() &&
           again.status().code() == absl::StatusCode::kUnavailable &&
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
  if (study->spec().objectives_size() > 0) {
    // Several objectives: the result is the front.
    if (options.json) {
      v1::StudyStatus front;
      front.set_study_id(study->study_id());
      *front.mutable_pareto_front() = study->pareto_front();
      for (int number : study->pareto_front()) {
        if (number >= 0 && number < study->trials_size()) {
          *front.add_trials() = study->trials(number);
        }
      }
      return PrintJson(front);
    }
    absl::PrintF("%s", FormatParetoFront(*study));
    return kExitOk;
  }
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
}  // namespace

int RunStudyCommand(const StudyCommand& command, const Options& options) {
  absl::StatusOr<std::unique_ptr<StudiesConnection>> connection =
      StudiesConnection::Connect(options);
  if (!connection.ok()) return FailRpc(connection.status(), options);
  StudiesConnection& master = **connection;
  const std::string& name = command.name;
  const std::string& operand = command.operand;
  if (name == "create") return CreateStudy(master, command.spec, options);
  if (name == "watch") return WatchStudy(master, operand, options);
  if (name == "status") return ShowStatus(master, operand, options);
  if (name == "list") return ListStudies(master, options);
  if (name == "best") return ShowBest(master, operand, options);
  if (name == "cancel") return Cancel(master, operand, options);
  if (name == "export") return Export(master, operand, options);
  if (name == "ask") return Ask(master, operand, command.ask_params, options);
  if (name == "tell") return Tell(master, operand, command.tell_state, options);
  return Fail(
      absl::InvalidArgumentError(absl::StrCat("unknown command '", name, "'")));
}

}  // namespace mpilearn::opt
