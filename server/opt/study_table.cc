#include "server/opt/study_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/spec/job_config.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::opt {
namespace {

// A study's whole record travels in one GetStudy reply (4 MiB for default
// clients), and every trial is a job the master keeps.
constexpr int kMaxTrials = 10000;
constexpr int kMaxParallelism = 1024;
constexpr int kMaxRetries = 100;
constexpr int kMaxObjectives = 8;
constexpr int kMaxFolds = 20;
constexpr size_t kMaxNameBytes = 256;

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

}  // namespace

absl::Status NormalizeStudySpec(v1::StudySpec* spec) {
  if (spec->name().size() > kMaxNameBytes) {
    return Invalid("name", absl::StrCat(spec->name().size(),
                                        " bytes; give at most ", kMaxNameBytes));
  }
  // The base and the parameters (SearchSpace::Create checks both).
  MPILEARN_ASSIGN_OR_RETURN(SearchSpace space,
                            SearchSpace::Create(spec->base(), spec->parameters()));
  MPILEARN_ASSIGN_OR_RETURN(const JobConfig base,
                            JobConfig::Create(spec->base()));

  const std::vector<std::string> metrics = ReportedMetrics(base.spec());
  // One objective: its metric must be reported; several may also take the
  // parameter count.
  auto normalize = [&](v1::Objective& objective, const std::string& field,
                       bool several) -> absl::Status {
    const bool counted = several && objective.metric() == kParametersObjective;
    if (!counted && std::find(metrics.begin(), metrics.end(), objective.metric()) ==
                        metrics.end()) {
      return Invalid(absl::StrCat(field, ".metric"),
                     absl::StrCat("\"", objective.metric(), "\" is never reported by jobs ",
                                  base.multi_output()
                                      ? std::string("of these outputs")
                                      : absl::StrCat("with loss ", InfoOf(base.loss()).name),
                                  "; use one of ", absl::StrJoin(metrics, ", "),
                                  several ? ", parameters" : ""));
    }
    if (objective.direction().empty()) {
      objective.set_direction(!counted && HigherIsBetter(objective.metric()) ? "maximize"
                                                                             : "minimize");
    }
    if (objective.direction() != "maximize" && objective.direction() != "minimize") {
      return Invalid(absl::StrCat(field, ".direction"),
                     absl::StrCat("\"", objective.direction(), "\"; use maximize or minimize"));
    }
    return absl::OkStatus();
  };
  const bool several = spec->objectives_size() > 0;
  if (several) {
    if (spec->objectives_size() < 2 || spec->objectives_size() > kMaxObjectives) {
      return Invalid("objectives", absl::StrCat(spec->objectives_size(), "; give 2 to ",
                                                kMaxObjectives, ", or one as objective"));
    }
    if (!spec->objective().metric().empty()) {
      return Invalid("objective", "give objective or objectives, not both");
    }
    int reported = -1;
    for (int i = 0; i < spec->objectives_size(); ++i) {
      MPILEARN_RETURN_IF_ERROR(
          normalize(*spec->mutable_objectives(i), absl::StrCat("objectives[", i, "]"), true));
      if (reported < 0 && spec->objectives(i).metric() != kParametersObjective) reported = i;
    }
    if (reported < 0) {
      return Invalid("objectives", "name at least one metric the jobs report besides parameters");
    }
    // The first reported metric is followed epoch by epoch (intermediate
    // values), as a single objective is.
    *spec->mutable_objective() = spec->objectives(reported);
    if (spec->has_target()) return Invalid("target", "is for one objective; remove it");
    if (!spec->pruner().name().empty() && spec->pruner().name() != "none") {
      return Invalid("pruner", "pruning is off for several objectives; remove it");
    }
    if (spec->sampler().empty()) spec->set_sampler("nsga2");
    if (spec->sampler() == "tpe") {
      return Invalid("sampler", "tpe takes one objective; use nsga2, random, grid or external");
    }
    v1::Nsga2Spec& nsga2 = *spec->mutable_nsga2();
    if (!nsga2.has_population_size()) nsga2.set_population_size(50);
    if (!nsga2.has_crossover_prob()) nsga2.set_crossover_prob(0.9);
    if (!nsga2.has_swapping_prob()) nsga2.set_swapping_prob(0.5);
    if (nsga2.population_size() < 2 || nsga2.population_size() > kMaxTrials) {
      return Invalid("nsga2.population_size",
                     absl::StrCat(nsga2.population_size(), "; give 2 to ", kMaxTrials));
    }
    for (const auto& [name, value, given] :
         {std::tuple<const char*, double, bool>{"crossover_prob", nsga2.crossover_prob(), true},
          {"swapping_prob", nsga2.swapping_prob(), true},
          {"mutation_prob", nsga2.mutation_prob(), nsga2.has_mutation_prob()}}) {
      if (given && !(value >= 0 && value <= 1)) {
        return Invalid(absl::StrCat("nsga2.", name), absl::StrCat(value, "; give 0 to 1"));
      }
    }
  } else if (spec->sampler() == "nsga2") {
    return Invalid("sampler", "nsga2 is for several objectives; give objectives or use tpe");
  }
  v1::Objective& objective = *spec->mutable_objective();
  if (objective.metric().empty()) {
    objective.set_metric(base.multi_output() ? "val_loss" : "val_accuracy");
  }
  MPILEARN_RETURN_IF_ERROR(normalize(objective, "objective", false));

  if (spec->sampler().empty()) spec->set_sampler("tpe");
  const std::string& sampler = spec->sampler();
  if (sampler != "tpe" && sampler != "random" && sampler != "grid" &&
      sampler != "external" && sampler != "nsga2") {
    return Invalid("sampler", absl::StrCat("\"", sampler,
                                           "\"; use tpe, nsga2, random, grid or external"));
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

  // Warm starts: each enqueued configuration must be a point of the space.
  if (spec->enqueue_size() > spec->trials()) {
    return Invalid("enqueue", absl::StrCat(spec->enqueue_size(), " configurations for a budget of ",
                                           spec->trials(), " trials; raise trials or enqueue fewer"));
  }
  for (int i = 0; i < spec->enqueue_size(); ++i) {
    const auto& fields = spec->enqueue(i).fields();
    const absl::Status fits = space.FromValues(ParamValues(fields.begin(), fields.end())).status();
    if (!fits.ok()) return Invalid(absl::StrCat("enqueue[", i, "]"), fits.message());
  }
  // k-fold trials: the study chooses every job's validation rows.
  if (spec->folds() != 0) {
    const v1::DataSpec& data = spec->base().data();
    if (spec->folds() < 2 || spec->folds() > kMaxFolds) {
      return Invalid("folds", absl::StrCat(spec->folds(), "; give 2 to ", kMaxFolds,
                                           ", or leave it unset for one job per trial"));
    }
    if (!data.validation_files().empty() || !data.validation_images().empty()) {
      return Invalid("folds", "each fold holds out its own block of the training rows; remove "
                              "base.data.validation_files (or validation_images and labels)");
    }
    if (data.validation_count() > 0) {
      return Invalid("folds", "the folds choose the validation rows; remove "
                              "base.data.validation_count");
    }
    if (data.has_folds() || data.has_fold()) {
      return Invalid("folds", "the study sets each job's data.folds and data.fold; remove them "
                              "from base.data");
    }
  }
  if (spec->warm_start_from().size() > kMaxNameBytes) {
    return Invalid("warm_start_from", "is not a study id; give one such as s-3");
  }
  return absl::OkStatus();
}

void StudyTable::SeedLocked(const Study& from, Study& study) const {
  std::vector<const v1::Trial*> taken;
  for (const v1::Trial& trial : from.status.trials()) {
    const bool finished = (trial.state() == v1::TRIAL_STATE_COMPLETED && trial.has_value()) ||
                          (trial.state() == v1::TRIAL_STATE_PRUNED && trial.intermediate_size() > 0);
    if (finished && study.space->FromValues(trial.params()).ok()) taken.push_back(&trial);
  }
  int number = -static_cast<int>(taken.size());
  for (const v1::Trial* trial : taken) {
    v1::Trial* seeded = study.status.add_seeded();
    *seeded = *trial;
    seeded->clear_job_id();
    seeded->clear_job_ids();
    for (v1::TrialFold& fold : *seeded->mutable_folds()) fold.clear_job_id();
    seeded->set_message(absl::StrCat("seeded from study ", from.status.study_id(), " trial ",
                                     trial->number()));
    seeded->set_number(number++);
  }
}

// ---------------------------------------------------------------------------
// Creation and loading.

StudyTable::StudyTable(Options options, TrialJobs& jobs)
    : options_(std::move(options)),
      store_(options_.state_dir),
      scheduler_(jobs, store_, *this, options_.clock) {}

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

absl::Status StudyTable::LoadStudies() {
  MPILEARN_ASSIGN_OR_RETURN(StudyStore::Loaded loaded, store_.Load());
  absl::MutexLock lock(&mu_);
  last_study_number_ = std::max(last_study_number_, loaded.last_number);
  for (v1::StudyStatus& status : loaded.studies) {
    const std::string id = status.study_id();
    absl::StatusOr<std::unique_ptr<Study>> study =
        scheduler_.NewStudy(std::move(status));
    if (!study.ok()) {
      LOG(WARNING) << "study " << id << ": " << study.status() << "; skipped";
      continue;
    }
    int in_flight = 0;
    for (const v1::Trial& trial : (*study)->status.trials()) {
      in_flight += TrialInFlight(trial) ? 1 : 0;
      if (TrialAwaitsJob(trial)) {
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
  const Study* warm_from = nullptr;
  if (!spec.warm_start_from().empty()) {
    absl::StatusOr<Study*> from = FindOrError(spec.warm_start_from());
    if (!from.ok()) {
      return Invalid("warm_start_from", absl::StrCat(from.status().message(),
                                                     "; name a study on this master"));
    }
    warm_from = *from;
  }
  v1::StudyStatus status;
  status.set_study_id(absl::StrCat("s-", ++last_study_number_));
  *status.mutable_spec() = spec;
  status.set_state(v1::STUDY_STATE_RUNNING);
  status.set_created_unix_seconds(scheduler_.NowSeconds());
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Study> study,
                            scheduler_.NewStudy(std::move(status)));
  if (warm_from != nullptr) SeedLocked(*warm_from, *study);
  const std::string id = study->status.study_id();
  study->dirty = true;
  scheduler_.Persist(*study);
  LOG(INFO) << "study " << id << " created: " << spec.parameters_size()
            << " parameter(s), sampler " << spec.sampler() << ", pruner "
            << spec.pruner().name() << ", " << spec.trials() << " trial(s), "
            << spec.parallelism() << " at once";
  Study& stored = *study;
  order_.push_back(id);
  studies_[id] = std::move(study);
  scheduler_.Refresh(stored);  // its first trials, at once
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

absl::StatusOr<std::string> StudyTable::StudyOwner(const std::string& study_id) const {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(study_id));
  return study->status.spec().base().owner();
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
  scheduler_.EndStudy(*study, v1::STUDY_STATE_CANCELLED,
                 request.reason().empty()
                     ? std::string("cancelled")
                     : absl::StrCat("cancelled: ", TruncatedMessage(request.reason())));
  scheduler_.Persist(*study);
  return study->status;
}

absl::StatusOr<v1::Trial> StudyTable::CancelTrial(
    const v1::CancelTrialRequest& request) {
  absl::MutexLock lock(&mu_);
  MPILEARN_ASSIGN_OR_RETURN(Study * study, FindOrError(request.study_id()));
  MPILEARN_ASSIGN_OR_RETURN(v1::Trial * trial,
                            TrialOrError(*study, request.trial()));
  if (!TrialInFlight(*trial)) {
    return StudyStateError(absl::StrCat(
        "trial ", trial->number(), " of study ", request.study_id(),
        " has already ended (", v1::TrialState_Name(trial->state()), ")"));
  }
  scheduler_.EndTrial(*study, *trial, v1::TRIAL_STATE_CANCELLED,
                 request.reason().empty()
                     ? std::string("cancelled")
                     : absl::StrCat("cancelled: ", TruncatedMessage(request.reason())));
  scheduler_.Summarize(*study);
  scheduler_.Persist(*study);
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
                            scheduler_.NewTrial(*study, point, /*asked=*/true));
  scheduler_.Summarize(*study);
  scheduler_.Persist(*study);
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
  if (!TrialInFlight(*trial)) {
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
  std::string message = TruncatedMessage(request.message());
  if (message.empty()) {
    message = state == v1::TRIAL_STATE_PRUNED ? "pruned by the external optimizer"
              : state == v1::TRIAL_STATE_FAILED ? "failed, said the external optimizer"
                                                : "";
  }
  scheduler_.EndTrial(*study, *trial, state, message);
  scheduler_.Summarize(*study);
  scheduler_.Persist(*study);
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
    event.set_unix_seconds(scheduler_.NowSeconds());
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
      scheduler_.Refresh(study);
    }
    scheduler_.Persist(study);  // also retries a failed write of an ended study
  }
}

void StudyTable::Log(Study& study, v1::StudyEvent::Kind kind,
                     const v1::Trial* trial, const std::string& message) {
  mu_.AssertHeld();  // the scheduler calls it under the table's lock
  v1::StudyEvent event;
  event.set_sequence(next_sequence_++);
  event.set_kind(kind);
  if (trial != nullptr) *event.mutable_trial() = *trial;
  event.set_study_state(study.status.state());
  if (study.status.has_best_trial()) {
    event.set_best_trial(study.status.best_trial());
    event.set_best_value(study.status.best_value());
  }
  event.set_unix_seconds(scheduler_.NowSeconds());
  event.set_message(message);
  study.events.push_back(std::move(event));
  while (static_cast<int>(study.events.size()) > options_.max_events) {
    study.events.pop_front();
  }
  changed_.SignalAll();
}

// ---------------------------------------------------------------------------
// Lookups.

Study* StudyTable::FindLocked(const std::string& id) const {
  auto it = studies_.find(id);
  return it == studies_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Study*> StudyTable::FindOrError(
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

}  // namespace mpilearn::opt
