// The study table (study_table.h). Over ~500 lines because it is one state
// machine (a study's trials from creation to end, across restarts) whose
// parts share the table's lock and the event log; splitting it would spread
// one invariant over several files.
#include "server/opt/study_table.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_file.h"
#include "common/error_reason.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::opt {
namespace {

// A study's whole record travels in one GetStudy reply (4 MiB for default
// clients), and every trial is a job the master keeps.
constexpr int kMaxTrials = 10000;
constexpr int kMaxParallelism = 1024;
constexpr int kMaxRetries = 100;
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxMessageBytes = 1024;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status StudyUnknownError(absl::string_view message) {
  return WithReason(absl::NotFoundError(message), v1::ERROR_REASON_STUDY_UNKNOWN);
}

absl::Status StudyStateError(absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message),
                    v1::ERROR_REASON_STUDY_STATE);
}

bool IsClassification(const std::string& loss) {
  return loss == "categorical_crossentropy" || loss == "binary_crossentropy";
}

// The objective's value in a validation, if it has one.
std::optional<double> MetricOf(const v1::ValidationRecord& record,
                               const std::string& metric) {
  auto it = record.metrics().find(metric);
  if (it != record.metrics().end()) return it->second;
  if (metric == "val_loss") return record.val_loss();
  if (metric == "val_accuracy" && record.metrics().empty()) {
    return record.val_accuracy();
  }
  return std::nullopt;
}

bool InFlight(const v1::Trial& trial) {
  return trial.state() == v1::TRIAL_STATE_QUEUED ||
         trial.state() == v1::TRIAL_STATE_RUNNING;
}

bool Maximizing(const v1::StudySpec& spec) {
  return spec.objective().direction() == "maximize";
}

// `a` is better than `b` in the study's direction.
bool Better(const v1::StudySpec& spec, double a, double b) {
  return Maximizing(spec) ? a > b : a < b;
}

std::string Truncated(absl::string_view text) {
  if (text.size() <= kMaxMessageBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxMessageBytes), "...");
}

std::string JobName(const std::string& study_id, const v1::Trial& trial) {
  std::string name = absl::StrCat(study_id, "/trial-", trial.number());
  if (trial.retries() > 0) absl::StrAppend(&name, "/retry-", trial.retries());
  return name;
}

std::string StudyDir(const std::string& state_dir, const std::string& id) {
  return absl::StrCat(state_dir, "/studies/", id);
}

}  // namespace

absl::Status NormalizeStudySpec(v1::StudySpec* spec) {
  if (spec->name().size() > kMaxNameBytes) {
    return Invalid("name", absl::StrCat(spec->name().size(),
                                        " bytes; give at most ", kMaxNameBytes));
  }
  // The base and the parameters (SearchSpace::Create checks both).
  MPILEARN_ASSIGN_OR_RETURN(SearchSpace space,
                            SearchSpace::Create(spec->base(), spec->parameters()));
  v1::JobSpec base = spec->base();
  MPILEARN_RETURN_IF_ERROR(NormalizeJobSpec(&base));

  v1::Objective& objective = *spec->mutable_objective();
  if (objective.metric().empty()) objective.set_metric("val_accuracy");
  const bool classification = IsClassification(base.loss());
  const std::vector<std::string> metrics =
      classification ? std::vector<std::string>{"val_accuracy", "val_loss"}
                     : std::vector<std::string>{"val_loss", "val_mae", "val_mse"};
  if (std::find(metrics.begin(), metrics.end(), objective.metric()) ==
      metrics.end()) {
    return Invalid("objective.metric",
                   absl::StrCat("\"", objective.metric(),
                                "\" is never reported by jobs with loss ",
                                base.loss(), "; use one of ",
                                absl::StrJoin(metrics, ", ")));
  }
  if (objective.direction().empty()) {
    objective.set_direction(objective.metric() == "val_accuracy" ? "maximize"
                                                                 : "minimize");
  }
  if (objective.direction() != "maximize" &&
      objective.direction() != "minimize") {
    return Invalid("objective.direction",
                   absl::StrCat("\"", objective.direction(),
                                "\"; use maximize or minimize"));
  }

  if (spec->sampler().empty()) spec->set_sampler("tpe");
  const std::string& sampler = spec->sampler();
  if (sampler != "tpe" && sampler != "random" && sampler != "grid" &&
      sampler != "external") {
    return Invalid("sampler", absl::StrCat("\"", sampler,
                                           "\"; use tpe, random, grid or external"));
  }
  v1::TpeSpec& tpe = *spec->mutable_tpe();
  if (!tpe.has_startup_trials()) tpe.set_startup_trials(10);
  if (!tpe.has_ei_candidates()) tpe.set_ei_candidates(24);
  if (!tpe.has_prior_weight()) tpe.set_prior_weight(1.0);
  if (!tpe.has_constant_liar()) tpe.set_constant_liar(true);
  if (tpe.startup_trials() < 0 || tpe.startup_trials() > kMaxTrials) {
    return Invalid("tpe.startup_trials",
                   absl::StrCat(tpe.startup_trials(), "; give 0 to ", kMaxTrials));
  }
  if (tpe.ei_candidates() < 1 || tpe.ei_candidates() > 10000) {
    return Invalid("tpe.ei_candidates",
                   absl::StrCat(tpe.ei_candidates(), "; give 1 to 10000"));
  }
  if (!std::isfinite(tpe.prior_weight()) || tpe.prior_weight() <= 0) {
    return Invalid("tpe.prior_weight",
                   absl::StrCat(tpe.prior_weight(), "; give a value > 0"));
  }

  if (spec->has_trials() &&
      (spec->trials() < 1 || spec->trials() > kMaxTrials)) {
    return Invalid("trials", absl::StrCat(spec->trials(),
                                          "; give a budget of 1 to ", kMaxTrials,
                                          " trials"));
  }
  if (sampler == "grid") {
    MPILEARN_ASSIGN_OR_RETURN(uint64_t size, space.GridSize());
    const int grid = static_cast<int>(
        std::min<uint64_t>(size, static_cast<uint64_t>(kMaxTrials)));
    if (!spec->has_trials() || spec->trials() > grid) spec->set_trials(grid);
  } else if (!spec->has_trials()) {
    spec->set_trials(20);
  }
  if (!spec->has_parallelism()) spec->set_parallelism(2);
  if (spec->parallelism() < 1 || spec->parallelism() > kMaxParallelism) {
    return Invalid("parallelism",
                   absl::StrCat(spec->parallelism(), "; give 1 to ",
                                kMaxParallelism, " trials at once"));
  }
  if (!spec->has_seed()) spec->set_seed(1);
  if (!spec->has_max_retries()) spec->set_max_retries(1);
  if (spec->max_retries() < 0 || spec->max_retries() > kMaxRetries) {
    return Invalid("max_retries", absl::StrCat(spec->max_retries(),
                                               "; give 0 to ", kMaxRetries));
  }
  if (spec->has_target() && !std::isfinite(spec->target())) {
    return Invalid("target", "must be a finite number");
  }

  FillPrunerDefaults(spec->mutable_pruner());
  MPILEARN_RETURN_IF_ERROR(NewPruner(spec->pruner()).status());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Creation and loading.

StudyTable::StudyTable(Options options, TrialJobs& jobs)
    : options_(std::move(options)), jobs_(jobs) {}

absl::StatusOr<std::unique_ptr<StudyTable>> StudyTable::Create(Options options,
                                                               TrialJobs& jobs) {
  std::unique_ptr<StudyTable> table(new StudyTable(std::move(options), jobs));
  if (!table->options_.state_dir.empty()) {
    MPILEARN_RETURN_IF_ERROR(table->LoadStudies());
  }
  if (table->options_.run_thread) {
    StudyTable* self = table.get();
    table->thread_ = std::thread([self] {
      while (true) {
        self->Refresh();
        absl::MutexLock lock(&self->wake_mu_);
        self->wake_mu_.AwaitWithTimeout(absl::Condition(&self->wake_),
                                        self->options_.refresh_period);
        if (self->stop_) return;
        self->wake_ = false;
      }
    });
  }
  return table;
}

StudyTable::~StudyTable() {
  CloseWatches();
  if (thread_.joinable()) thread_.join();
}

void StudyTable::CloseWatches() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    changed_.SignalAll();
  }
  absl::MutexLock lock(&wake_mu_);
  stop_ = true;
  wake_ = true;
}

void StudyTable::Wake() {
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

absl::StatusOr<std::unique_ptr<StudyTable::Study>> StudyTable::NewStudy(
    v1::StudyStatus status) const {
  auto study = std::make_unique<Study>();
  const v1::StudySpec& spec = status.spec();
  MPILEARN_ASSIGN_OR_RETURN(SearchSpace space,
                            SearchSpace::Create(spec.base(), spec.parameters()));
  study->space = std::make_unique<SearchSpace>(std::move(space));
  const uint64_t seed = spec.seed();
  if (spec.sampler() == "grid") {
    MPILEARN_ASSIGN_OR_RETURN(study->sampler, NewGridSampler(*study->space, seed));
  } else if (spec.sampler() == "random") {
    study->sampler = NewRandomSampler(study->space->dimensions(), seed);
  } else if (spec.sampler() == "tpe") {
    TpeOptions tpe;
    tpe.startup_trials = spec.tpe().startup_trials();
    tpe.ei_candidates = spec.tpe().ei_candidates();
    tpe.prior_weight = spec.tpe().prior_weight();
    tpe.constant_liar = spec.tpe().constant_liar();
    study->sampler = NewTpeSampler(study->space->dimensions(), tpe, seed);
  }  // external: trials only come from AskTrial
  MPILEARN_ASSIGN_OR_RETURN(study->pruner, NewPruner(spec.pruner()));
  study->budget = spec.trials();
  study->status = std::move(status);
  return study;
}

absl::Status StudyTable::LoadStudies() {
  const std::string root = absl::StrCat(options_.state_dir, "/studies");
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create ", root, ": ", error.message(),
        "; give --state_dir a directory the master can write"));
  }
  std::vector<std::pair<int, std::string>> found;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string id = entry.path().filename().string();
    int number = 0;
    if (!absl::StartsWith(id, "s-") || !absl::SimpleAtoi(id.substr(2), &number)) {
      continue;
    }
    found.emplace_back(number, id);
  }
  std::sort(found.begin(), found.end());
  absl::MutexLock lock(&mu_);
  for (const auto& [number, id] : found) {
    last_study_number_ = std::max(last_study_number_, number);
    // Temporary files of writes a crash interrupted (WriteFileAtomically).
    for (const auto& file : std::filesystem::directory_iterator(
             absl::StrCat(root, "/", id), error)) {
      if (absl::StrContains(file.path().filename().string(),
                            kAtomicWriteTempInfix)) {
        std::filesystem::remove(file.path(), error);
      }
    }
    const std::string path = absl::StrCat(root, "/", id, "/study.pb");
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    v1::StudyFile file;
    if (!bytes.ok() || !file.ParseFromString(*bytes) ||
        file.status().study_id() != id) {
      LOG(WARNING) << "study " << id << ": cannot read " << path
                   << (bytes.ok() ? "" : absl::StrCat(": ", bytes.status().ToString()))
                   << "; skipped";
      continue;
    }
    absl::StatusOr<std::unique_ptr<Study>> study =
        NewStudy(std::move(*file.mutable_status()));
    if (!study.ok()) {
      LOG(WARNING) << "study " << id << ": " << study.status() << "; skipped";
      continue;
    }
    int in_flight = 0;
    for (const v1::Trial& trial : (*study)->status.trials()) {
      in_flight += InFlight(trial) ? 1 : 0;
      if (InFlight(trial) && trial.job_id().empty()) {
        (*study)->maybe_submitted.insert(trial.number());
      }
    }
    LOG(INFO) << "study " << id << " loaded: "
              << v1::StudyState_Name((*study)->status.state()) << ", "
              << (*study)->status.trials_size() << " trial(s), " << in_flight
              << " in flight (their jobs resume from their checkpoints)";
    order_.push_back(id);
    studies_[id] = std::move(study).value();
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Calls.

absl::StatusOr<v1::CreateStudyResponse> StudyTable::CreateStudy(
    const v1::CreateStudyRequest& request) {
  v1::StudySpec spec = request.spec();
  MPILEARN_RETURN_IF_ERROR(NormalizeStudySpec(&spec));
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(studies_.size()) >= options_.max_studies) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the master holds ", studies_.size(),
        " studies, its limit; remove old ones from the state directory"));
  }
  v1::StudyStatus status;
  status.set_study_id(absl::StrCat("s-", ++last_study_number_));
  *status.mutable_spec() = spec;
  status.set_state(v1::STUDY_STATE_RUNNING);
  status.set_created_unix_seconds(NowSeconds());
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Study> study,
                            NewStudy(std::move(status)));
  const std::string id = study->status.study_id();
  study->dirty = true;
  PersistLocked(*study);
  LOG(INFO) << "study " << id << " created: " << spec.parameters_size()
            << " parameter(s), sampler " << spec.sampler() << ", pruner "
            << spec.pruner().name() << ", " << spec.trials() << " trial(s), "
            << spec.parallelism() << " at once";
  Study& stored = *study;
  order_.push_back(id);
  studies_[id] = std::move(study);
  RefreshStudyLocked(stored);  // its first trials, at once
  v1::CreateStudyResponse response;
  response.set_study_id(id);
  *response.mutable_spec() = spec;
  return response;
}

absl::StatusOr<v1::StudyStatus> StudyTable::GetStudy(
    const std::string& study_id) const {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(study_id));
  return study->status;
}

v1::ListStudiesResponse StudyTable::ListStudies() const {
  absl::MutexLock lock(&mu_);
  v1::ListStudiesResponse response;
  for (const std::string& id : order_) {
    // Copied without its trials (moved aside and back, not copied).
    v1::StudyStatus& status = studies_.at(id)->status;
    google::protobuf::RepeatedPtrField<v1::Trial> trials;
    trials.Swap(status.mutable_trials());
    *response.add_studies() = status;
    trials.Swap(status.mutable_trials());
  }
  return response;
}

absl::StatusOr<v1::StudyStatus> StudyTable::CancelStudy(
    const v1::CancelStudyRequest& request) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(request.study_id()));
  if (study->status.state() != v1::STUDY_STATE_RUNNING) {
    return StudyStateError(absl::StrCat(
        "study ", request.study_id(), " has already ended (",
        v1::StudyState_Name(study->status.state()), ")"));
  }
  EndStudyLocked(*study, v1::STUDY_STATE_CANCELLED,
                 request.reason().empty()
                     ? std::string("cancelled")
                     : absl::StrCat("cancelled: ", Truncated(request.reason())));
  PersistLocked(*study);
  return study->status;
}

absl::StatusOr<v1::Trial> StudyTable::CancelTrial(
    const v1::CancelTrialRequest& request) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(request.study_id()));
  MPILEARN_ASSIGN_OR_RETURN(v1::Trial * trial,
                            TrialOrError(*study, request.trial()));
  if (!InFlight(*trial)) {
    return StudyStateError(absl::StrCat(
        "trial ", trial->number(), " of study ", request.study_id(),
        " has already ended (", v1::TrialState_Name(trial->state()), ")"));
  }
  EndTrialLocked(*study, *trial, v1::TRIAL_STATE_CANCELLED,
                 request.reason().empty()
                     ? std::string("cancelled")
                     : absl::StrCat("cancelled: ", Truncated(request.reason())));
  SummarizeLocked(*study);
  PersistLocked(*study);
  return *trial;
}

absl::StatusOr<v1::Trial> StudyTable::AskTrial(
    const v1::AskTrialRequest& request) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(request.study_id()));
  if (study->status.state() != v1::STUDY_STATE_RUNNING) {
    return StudyStateError(absl::StrCat(
        "study ", request.study_id(), " has ended (",
        v1::StudyState_Name(study->status.state()), "); create a new one"));
  }
  if (study->status.trials_size() >= study->budget) {
    return StudyStateError(absl::StrCat(
        "study ", request.study_id(), " has used its budget of ", study->budget,
        " trials"));
  }
  std::optional<Point> point;
  if (!request.params().empty()) {
    absl::StatusOr<Point> given = study->space->FromValues(request.params());
    if (!given.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("params: ", given.status().message()));
    }
    point = *std::move(given);
  } else if (study->sampler == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params: study ", request.study_id(),
        " has sampler \"external\"; give a value for every parameter"));
  }
  MPILEARN_ASSIGN_OR_RETURN(v1::Trial * trial,
                            NewTrialLocked(*study, point, /*asked=*/true));
  SummarizeLocked(*study);
  PersistLocked(*study);
  return *trial;
}

absl::StatusOr<v1::Trial> StudyTable::TellTrial(
    const v1::TellTrialRequest& request) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(request.study_id()));
  MPILEARN_ASSIGN_OR_RETURN(v1::Trial * trial,
                            TrialOrError(*study, request.trial()));
  const v1::TrialState state = request.state();
  if (state != v1::TRIAL_STATE_COMPLETED && state != v1::TRIAL_STATE_PRUNED &&
      state != v1::TRIAL_STATE_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: ", v1::TrialState_Name(state),
        "; tell TRIAL_STATE_COMPLETED, TRIAL_STATE_PRUNED or TRIAL_STATE_FAILED"));
  }
  if (!InFlight(*trial)) {
    return StudyStateError(absl::StrCat(
        "trial ", trial->number(), " of study ", request.study_id(),
        " has already ended (", v1::TrialState_Name(trial->state()), ")"));
  }
  if (request.has_value()) {
    if (!std::isfinite(request.value())) {
      return absl::InvalidArgumentError("value: must be a finite number");
    }
    trial->set_value(request.value());
  } else if (state == v1::TRIAL_STATE_COMPLETED && !trial->has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value: trial ", trial->number(),
        " has no value yet; give one to complete it"));
  }
  std::string message = Truncated(request.message());
  if (message.empty()) {
    message = state == v1::TRIAL_STATE_PRUNED ? "pruned by the external optimizer"
              : state == v1::TRIAL_STATE_FAILED ? "failed, said the external optimizer"
                                                : "";
  }
  EndTrialLocked(*study, *trial, state, message);
  SummarizeLocked(*study);
  PersistLocked(*study);
  return *trial;
}

// ---------------------------------------------------------------------------
// Watches.

absl::StatusOr<std::unique_ptr<StudyTable::Watch>> StudyTable::WatchStudy(
    const std::string& study_id) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(study_id));
  std::unique_ptr<Watch> watch(new Watch(this, study_id));
  for (const v1::Trial& trial : study->status.trials()) {
    v1::StudyEvent event;
    event.set_kind(v1::StudyEvent::KIND_SNAPSHOT);
    *event.mutable_trial() = trial;
    event.set_study_state(study->status.state());
    if (study->status.has_best_trial()) {
      event.set_best_trial(study->status.best_trial());
      event.set_best_value(study->status.best_value());
    }
    event.set_unix_seconds(NowSeconds());
    watch->pending_.push_back(std::move(event));
  }
  if (study->status.state() != v1::STUDY_STATE_RUNNING) {
    v1::StudyEvent end;
    end.set_kind(v1::StudyEvent::KIND_STUDY_ENDED);
    end.set_study_state(study->status.state());
    if (study->status.has_best_trial()) {
      end.set_best_trial(study->status.best_trial());
      end.set_best_value(study->status.best_value());
    }
    end.set_message(study->status.message());
    end.set_unix_seconds(study->status.ended_unix_seconds());
    watch->pending_.push_back(std::move(end));
  }
  watch->next_sequence_ = next_sequence_;
  return watch;
}

bool StudyTable::Watch::Next(v1::StudyEvent* event, absl::Duration timeout) {
  if (ended_) return false;
  if (!pending_.empty()) {
    *event = std::move(pending_.front());
    pending_.pop_front();
    if (event->kind() == v1::StudyEvent::KIND_STUDY_ENDED) ended_ = true;
    return true;
  }
  StudyTable& table = *table_;
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&table.mu_);
  while (true) {
    if (table.closing_) {
      ended_ = true;
      return false;
    }
    const Study* study = table.FindLocked(study_id_);
    if (study == nullptr) {
      ended_ = true;
      return false;
    }
    const std::deque<v1::StudyEvent>& events = study->events;
    if (!events.empty() && events.front().sequence() > next_sequence_ &&
        events.back().sequence() >= next_sequence_) {
      // Fell behind the log: only the newest events are kept. The ones
      // kept still say how each trial ends; give them from the oldest.
      next_sequence_ = events.front().sequence();
    }
    for (const v1::StudyEvent& logged : events) {
      if (logged.sequence() < next_sequence_) continue;
      *event = logged;
      next_sequence_ = logged.sequence() + 1;
      if (event->kind() == v1::StudyEvent::KIND_STUDY_ENDED) ended_ = true;
      return true;
    }
    if (table.changed_.WaitWithDeadline(&table.mu_, deadline)) return false;
  }
}

// ---------------------------------------------------------------------------
// The refresh: trials' jobs to trial states.

void StudyTable::Refresh() {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) {
    Study& study = *studies_.at(id);
    if (study.status.state() == v1::STUDY_STATE_RUNNING) {
      RefreshStudyLocked(study);
    }
    PersistLocked(study);  // also retries a failed write of an ended study
  }
}

void StudyTable::RefreshStudyLocked(Study& study) {
  const v1::StudySpec& spec = study.status.spec();
  for (v1::Trial& trial : *study.status.mutable_trials()) {
    if (InFlight(trial)) RefreshTrialLocked(study, trial);
  }
  SummarizeLocked(study);
  // The target, by any trial's value so far (running ones too).
  if (spec.has_target()) {
    for (const v1::Trial& trial : study.status.trials()) {
      const bool measured = trial.state() != v1::TRIAL_STATE_FAILED &&
                            trial.state() != v1::TRIAL_STATE_CANCELLED;
      if (measured && trial.has_value() &&
          !Better(spec, spec.target(), trial.value())) {
        EndStudyLocked(study, v1::STUDY_STATE_COMPLETED,
                       absl::StrFormat("target %s %g reached by trial %d (%g)",
                                       spec.objective().metric(), spec.target(),
                                       trial.number(), trial.value()));
        return;
      }
    }
  }
  // New trials up to the parallelism and the budget.
  while (study.sampler != nullptr && !study.exhausted &&
         study.status.trials_running() < spec.parallelism() &&
         study.status.trials_size() < study.budget) {
    absl::StatusOr<v1::Trial*> trial =
        NewTrialLocked(study, std::nullopt, /*asked=*/false);
    if (!trial.ok()) {
      if (trial.status().code() != absl::StatusCode::kOutOfRange) {
        LOG(ERROR) << "study " << study.status.study_id()
                   << ": no new trial: " << trial.status();
      }
      study.exhausted = true;  // the grid is spent (or the sampler broke)
      break;
    }
    SummarizeLocked(study);
  }
  if (study.status.trials_running() == 0 &&
      (study.exhausted || study.status.trials_size() >= study.budget)) {
    EndStudyLocked(study, v1::STUDY_STATE_COMPLETED,
                   absl::StrCat("all ", study.status.trials_size(),
                                " trials ended"));
  }
}

void StudyTable::RefreshTrialLocked(Study& study, v1::Trial& trial) {
  const v1::StudySpec& spec = study.status.spec();
  const std::string& study_id = study.status.study_id();
  if (trial.job_id().empty()) {
    // Written, but its job not submitted (a restart, or a submit that
    // failed for a reason that may pass).
    SubmitTrialJobLocked(study, trial,
                         study.maybe_submitted.erase(trial.number()) > 0);
    return;
  }
  absl::StatusOr<v1::JobStatus> job = jobs_.Status(trial.job_id());
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kNotFound) {
      LOG(WARNING) << "study " << study_id << ": trial " << trial.number()
                   << ": the master no longer holds job " << trial.job_id()
                   << "; submitting it again";
      trial.clear_job_id();
      SubmitTrialJobLocked(study, trial, /*may_exist=*/false);
    } else {
      LOG(WARNING) << "study " << study_id << ": trial " << trial.number()
                   << ": " << job.status();
    }
    return;
  }

  // Epochs and intermediate values.
  const int epochs = job->epochs_done();
  if (epochs != trial.epochs_done()) {
    trial.set_epochs_trained(trial.epochs_trained() + epochs - trial.epochs_done());
    trial.set_epochs_done(epochs);
    study.dirty = true;
  }
  std::map<int, double> values;
  for (const v1::ValidationRecord& record : job->validations()) {
    if (record.epoch() < 1) continue;
    std::optional<double> value = MetricOf(record, spec.objective().metric());
    if (value.has_value()) values[record.epoch()] = *value;
  }
  bool reported = static_cast<int>(values.size()) != trial.intermediate_size();
  if (!reported) {
    int i = 0;
    for (const auto& [epoch, value] : values) {
      const v1::IntermediateValue& old = trial.intermediate(i++);
      if (old.epoch() != epoch || old.value() != value) reported = true;
    }
  }
  if (reported) {
    trial.clear_intermediate();
    for (const auto& [epoch, value] : values) {
      v1::IntermediateValue* stored = trial.add_intermediate();
      stored->set_epoch(epoch);
      stored->set_value(value);
      if (!trial.has_value() || Better(spec, value, trial.value())) {
        trial.set_value(value);
      }
    }
    study.dirty = true;
  }
  if (trial.state() == v1::TRIAL_STATE_QUEUED &&
      job->state() != v1::JOB_STATE_QUEUED) {
    trial.set_state(v1::TRIAL_STATE_RUNNING);
    EventLocked(study, v1::StudyEvent::KIND_STARTED, &trial);
  }
  if (reported) EventLocked(study, v1::StudyEvent::KIND_REPORTED, &trial);

  switch (job->state()) {
    case v1::JOB_STATE_COMPLETED:
      if (absl::StartsWith(job->stop_reason(), "pruned by study ")) {
        // Pruned before a restart that came before the study was written.
        EndTrialLocked(study, trial, v1::TRIAL_STATE_PRUNED, job->stop_reason());
      } else if (trial.has_value()) {
        EndTrialLocked(study, trial, v1::TRIAL_STATE_COMPLETED,
                       job->stop_reason());
      } else {
        EndTrialLocked(
            study, trial, v1::TRIAL_STATE_FAILED,
            absl::StrCat("job ", trial.job_id(), " completed without reporting ",
                         spec.objective().metric(),
                         "; keep inband_validation on or attach a validation "
                         "pool"));
      }
      return;
    case v1::JOB_STATE_FAILED:
      if (trial.retries() < spec.max_retries()) {
        LOG(INFO) << "study " << study_id << ": trial " << trial.number()
                  << ": job " << trial.job_id() << " failed ("
                  << job->message() << "); running it again";
        trial.set_retries(trial.retries() + 1);
        trial.set_epochs_done(0);
        trial.clear_intermediate();
        trial.clear_value();
        trial.clear_rungs();
        trial.set_message(Truncated(absl::StrCat("attempt ", trial.retries(),
                                                 " failed: ", job->message())));
        trial.clear_job_id();
        trial.set_state(v1::TRIAL_STATE_QUEUED);
        SubmitTrialJobLocked(study, trial, /*may_exist=*/false);
      } else {
        EndTrialLocked(study, trial, v1::TRIAL_STATE_FAILED,
                       absl::StrCat("job ", trial.job_id(),
                                    " failed: ", job->message()));
      }
      return;
    case v1::JOB_STATE_CANCELLED:
      // Cancelled outside the study (mpilearnctl cancel): the trial ends.
      EndTrialLocked(study, trial, v1::TRIAL_STATE_CANCELLED,
                     absl::StrCat("job ", trial.job_id(),
                                  " was cancelled: ", job->message()));
      return;
    default:
      break;
  }
  if (!reported || values.empty()) return;

  // The pruner, on every trial's curve in minimize form.
  const double sign = Maximizing(spec) ? -1.0 : 1.0;
  std::vector<TrialCurve> curves;
  int mine = -1;
  for (const v1::Trial& other : study.status.trials()) {
    TrialCurve curve;
    curve.number = other.number();
    curve.complete = other.state() == v1::TRIAL_STATE_COMPLETED;
    for (const v1::IntermediateValue& value : other.intermediate()) {
      curve.values[value.epoch()] = sign * value.value();
    }
    for (const auto& [rung, value] : other.rungs()) curve.rungs[rung] = value;
    if (other.number() == trial.number()) mine = static_cast<int>(curves.size());
    curves.push_back(std::move(curve));
  }
  if (mine < 0) return;
  TrialCurve me = curves[mine];
  const bool prune = study.pruner->ShouldPrune(&me, curves);
  trial.clear_rungs();
  for (const auto& [rung, value] : me.rungs) (*trial.mutable_rungs())[rung] = value;
  if (prune) {
    const v1::IntermediateValue& last =
        trial.intermediate(trial.intermediate_size() - 1);
    EndTrialLocked(study, trial, v1::TRIAL_STATE_PRUNED,
                   absl::StrFormat("pruned by study %s (%s) at epoch %d: %s %g",
                                   study_id, spec.pruner().name(), last.epoch(),
                                   spec.objective().metric(), last.value()));
  }
}

absl::StatusOr<v1::Trial*> StudyTable::NewTrialLocked(Study& study,
                                                      std::optional<Point> point,
                                                      bool asked) {
  const int number = study.status.trials_size();
  if (!point.has_value()) {
    MPILEARN_ASSIGN_OR_RETURN(
        Point suggested,
        study.sampler->Suggest(number, HistoryLocked(study, /*except=*/-1)));
    point = std::move(suggested);
  }
  v1::Trial* trial = study.status.add_trials();
  trial->set_number(number);
  *trial->mutable_params() = study.space->Values(*point);
  trial->set_state(v1::TRIAL_STATE_QUEUED);
  trial->set_created_unix_seconds(NowSeconds());
  trial->set_asked(asked);
  study.dirty = true;
  absl::StatusOr<v1::JobSpec> job_spec = study.space->Apply(*point);
  if (!job_spec.ok()) {
    EndTrialLocked(study, *trial, v1::TRIAL_STATE_FAILED,
                   Truncated(job_spec.status().message()));
    return trial;
  }
  // On disk before its job exists: a master that dies in between finds the
  // job by its name after the restart (see the class comment).
  PersistLocked(study);
  SubmitTrialJobLocked(study, *trial, /*may_exist=*/false);
  return trial;
}

void StudyTable::SubmitTrialJobLocked(Study& study, v1::Trial& trial,
                                      bool may_exist) {
  const std::string name = JobName(study.status.study_id(), trial);
  std::optional<std::string> job_id;
  if (may_exist) job_id = jobs_.FindByName(name);
  if (!job_id.has_value()) {
    absl::StatusOr<Point> point = study.space->FromValues(trial.params());
    absl::StatusOr<v1::JobSpec> spec =
        point.ok() ? study.space->Apply(*point)
                   : absl::StatusOr<v1::JobSpec>(point.status());
    if (!spec.ok()) {
      EndTrialLocked(study, trial, v1::TRIAL_STATE_FAILED,
                     Truncated(spec.status().message()));
      return;
    }
    spec->set_name(name);
    absl::StatusOr<std::string> submitted = jobs_.Submit(*spec);
    if (!submitted.ok()) {
      if (submitted.status().code() == absl::StatusCode::kInvalidArgument) {
        EndTrialLocked(study, trial, v1::TRIAL_STATE_FAILED,
                       Truncated(submitted.status().message()));
      } else {
        // Left without a job; the next refresh tries again.
        LOG(WARNING) << "study " << study.status.study_id() << ": trial "
                     << trial.number() << ": " << submitted.status()
                     << "; will retry";
      }
      return;
    }
    job_id = *std::move(submitted);
  }
  trial.set_job_id(*job_id);
  trial.add_job_ids(*job_id);
  trial.set_state(v1::TRIAL_STATE_QUEUED);
  study.dirty = true;
  VLOG(1) << "study " << study.status.study_id() << ": trial " << trial.number()
          << " is job " << *job_id;
  EventLocked(study, v1::StudyEvent::KIND_CREATED, &trial);
}

void StudyTable::EndTrialLocked(Study& study, v1::Trial& trial,
                                v1::TrialState state,
                                const std::string& message) {
  if (InFlight(trial) && !trial.job_id().empty() &&
      state != v1::TRIAL_STATE_COMPLETED) {
    absl::Status stopped = jobs_.Stop(trial.job_id(), message);
    if (!stopped.ok() && stopped.code() != absl::StatusCode::kFailedPrecondition &&
        stopped.code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "study " << study.status.study_id() << ": trial "
                   << trial.number() << ": " << stopped;
    }
  } else if (InFlight(trial) && !trial.job_id().empty() &&
             state == v1::TRIAL_STATE_COMPLETED) {
    // Told COMPLETED while its job still runs (an external optimizer):
    // stop the job too; a job that completed by itself has ended already.
    (void)jobs_.Stop(trial.job_id(), "completed by the study's optimizer");
  }
  trial.set_state(state);
  trial.set_message(Truncated(message));
  trial.set_ended_unix_seconds(NowSeconds());
  study.dirty = true;
  LOG(INFO) << "study " << study.status.study_id() << ": trial "
            << trial.number() << " " << v1::TrialState_Name(state)
            << (trial.has_value() ? absl::StrCat(" value ", trial.value()) : "")
            << (message.empty() ? "" : absl::StrCat(": ", message));
  SummarizeLocked(study);
  EventLocked(study, v1::StudyEvent::KIND_ENDED, &trial);
}

void StudyTable::EndStudyLocked(Study& study, v1::StudyState state,
                                const std::string& message) {
  for (v1::Trial& trial : *study.status.mutable_trials()) {
    if (InFlight(trial)) {
      EndTrialLocked(study, trial, v1::TRIAL_STATE_CANCELLED,
                     absl::StrCat("study ended: ", message));
    }
  }
  study.status.set_state(state);
  study.status.set_message(message);
  study.status.set_ended_unix_seconds(NowSeconds());
  study.dirty = true;
  SummarizeLocked(study);
  LOG(INFO) << "study " << study.status.study_id() << " "
            << v1::StudyState_Name(state) << ": " << message;
  EventLocked(study, v1::StudyEvent::KIND_STUDY_ENDED, nullptr, message);
}

void StudyTable::SummarizeLocked(Study& study) const {
  v1::StudyStatus& status = study.status;
  status.clear_best_trial();
  status.clear_best_value();
  int running = 0;
  int epochs = 0;
  for (const v1::Trial& trial : status.trials()) {
    running += InFlight(trial) ? 1 : 0;
    epochs += trial.epochs_trained();
    const bool counts = trial.state() == v1::TRIAL_STATE_COMPLETED ||
                        trial.state() == v1::TRIAL_STATE_PRUNED;
    if (counts && trial.has_value() &&
        (!status.has_best_value() ||
         Better(status.spec(), trial.value(), status.best_value()))) {
      status.set_best_trial(trial.number());
      status.set_best_value(trial.value());
    }
  }
  status.set_trials_running(running);
  status.set_trials_created(status.trials_size());
  status.set_epochs_trained(epochs);
}

std::vector<Observation> StudyTable::HistoryLocked(const Study& study,
                                                   int except) const {
  const double sign = Maximizing(study.status.spec()) ? -1.0 : 1.0;
  std::vector<Observation> history;
  for (const v1::Trial& trial : study.status.trials()) {
    if (trial.number() == except) continue;
    absl::StatusOr<Point> point = study.space->FromValues(trial.params());
    if (!point.ok()) continue;
    Observation observation;
    observation.number = trial.number();
    observation.point = *std::move(point);
    for (const v1::IntermediateValue& value : trial.intermediate()) {
      observation.intermediate[value.epoch()] = sign * value.value();
    }
    switch (trial.state()) {
      case v1::TRIAL_STATE_COMPLETED:
        observation.state = trial.has_value() ? Observation::State::kComplete
                                              : Observation::State::kFailed;
        observation.value = sign * trial.value();
        break;
      case v1::TRIAL_STATE_PRUNED:
        observation.state = observation.intermediate.empty()
                                ? Observation::State::kFailed
                                : Observation::State::kPruned;
        break;
      case v1::TRIAL_STATE_QUEUED:
      case v1::TRIAL_STATE_RUNNING:
        observation.state = Observation::State::kRunning;
        break;
      default:
        observation.state = Observation::State::kFailed;
        break;
    }
    history.push_back(std::move(observation));
  }
  return history;
}

void StudyTable::EventLocked(Study& study, v1::StudyEvent::Kind kind,
                             const v1::Trial* trial, const std::string& message) {
  v1::StudyEvent event;
  event.set_sequence(next_sequence_++);
  event.set_kind(kind);
  if (trial != nullptr) *event.mutable_trial() = *trial;
  event.set_study_state(study.status.state());
  if (study.status.has_best_trial()) {
    event.set_best_trial(study.status.best_trial());
    event.set_best_value(study.status.best_value());
  }
  event.set_unix_seconds(NowSeconds());
  event.set_message(message);
  study.events.push_back(std::move(event));
  while (static_cast<int>(study.events.size()) > options_.max_events) {
    study.events.pop_front();
  }
  changed_.SignalAll();
}

void StudyTable::PersistLocked(Study& study) {
  if (!study.dirty) return;
  if (options_.state_dir.empty()) {
    study.dirty = false;
    return;
  }
  const std::string dir = StudyDir(options_.state_dir, study.status.study_id());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  v1::StudyFile file;
  *file.mutable_status() = study.status;
  absl::Status written =
      error ? absl::UnavailableError(error.message())
            : WriteFileAtomically(absl::StrCat(dir, "/study.pb"),
                                  file.SerializeAsString());
  if (!written.ok()) {
    LOG(ERROR) << "study " << study.status.study_id() << ": cannot write "
               << dir << "/study.pb: " << written << "; will retry";
    return;
  }
  study.dirty = false;
}

// ---------------------------------------------------------------------------
// Lookups.

StudyTable::Study* StudyTable::FindLocked(const std::string& id) const {
  auto it = studies_.find(id);
  return it == studies_.end() ? nullptr : it->second.get();
}

absl::StatusOr<StudyTable::Study*> StudyTable::FindOrError(
    const std::string& id) const {
  Study* study = FindLocked(id);
  if (study == nullptr) {
    return StudyUnknownError(absl::StrCat(
        "unknown study '", id.substr(0, 64), id.size() > 64 ? "...'" : "'",
        "; `mpilearn-opt list` shows the studies this master holds"));
  }
  return study;
}

absl::StatusOr<v1::Trial*> StudyTable::TrialOrError(Study& study,
                                                    int number) const {
  if (number < 0 || number >= study.status.trials_size()) {
    return StudyUnknownError(absl::StrCat(
        "study ", study.status.study_id(), " has no trial ", number, " (it has ",
        study.status.trials_size(), ")"));
  }
  return study.status.mutable_trials(number);
}

double StudyTable::NowSeconds() const {
  return absl::ToDoubleSeconds(options_.clock() - absl::UnixEpoch());
}

}  // namespace mpilearn::opt
