#include "server/opt/trial_scheduler.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/opt/pareto.h"
#include "server/opt/trial_values.h"
#include "glog/logging.h"

namespace mpilearn::opt {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

}  // namespace

bool TrialInFlight(const v1::Trial& trial) {
  return trial.state() == v1::TRIAL_STATE_QUEUED ||
         trial.state() == v1::TRIAL_STATE_RUNNING;
}

bool TrialAwaitsJob(const v1::Trial& trial) {
  if (!TrialInFlight(trial)) return false;
  if (trial.folds_size() == 0) return trial.job_id().empty();
  for (const v1::TrialFold& fold : trial.folds()) {
    if (FoldInFlight(fold) && fold.job_id().empty()) return true;
  }
  return false;
}

std::string TruncatedMessage(absl::string_view text) {
  if (text.size() <= kMaxMessageBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxMessageBytes), "...");
}

absl::StatusOr<std::unique_ptr<Study>> TrialScheduler::NewStudy(
    v1::StudyStatus status) const {
  auto study = std::make_unique<Study>();
  const v1::StudySpec& spec = status.spec();
  MPILEARN_ASSIGN_OR_RETURN(
      SearchSpace space, SearchSpace::Create(spec.base(), spec.parameters()));
  study->space = std::make_unique<SearchSpace>(std::move(space));
  const uint64_t seed = spec.seed();
  if (spec.sampler() == "grid") {
    MPILEARN_ASSIGN_OR_RETURN(study->sampler,
                              NewGridSampler(*study->space, seed));
  } else if (spec.sampler() == "random") {
    study->sampler = NewRandomSampler(study->space->dimensions(), seed);
  } else if (spec.sampler() == "tpe") {
    TpeOptions tpe;
    tpe.startup_trials = spec.tpe().startup_trials();
    tpe.ei_candidates = spec.tpe().ei_candidates();
    tpe.prior_weight = spec.tpe().prior_weight();
    tpe.constant_liar = spec.tpe().constant_liar();
    study->sampler = NewTpeSampler(study->space->dimensions(), tpe, seed);
  } else if (spec.sampler() == "nsga2") {
    Nsga2Options nsga2;
    nsga2.population_size = spec.nsga2().population_size();
    nsga2.crossover_prob = spec.nsga2().crossover_prob();
    nsga2.swapping_prob = spec.nsga2().swapping_prob();
    if (spec.nsga2().has_mutation_prob()) nsga2.mutation_prob = spec.nsga2().mutation_prob();
    study->sampler = NewNsga2Sampler(study->space->dimensions(), nsga2, seed);
  }  // external: trials only come from AskTrial
  MPILEARN_ASSIGN_OR_RETURN(study->pruner, NewPruner(spec.pruner()));
  study->budget = spec.trials();
  study->status = std::move(status);
  return study;
}

void TrialScheduler::Refresh(Study& study) {
  const v1::StudySpec& spec = study.status.spec();
  for (v1::Trial& trial : *study.status.mutable_trials()) {
    if (TrialInFlight(trial)) RefreshTrial(study, trial);
  }
  Summarize(study);
  // The target, by any trial's value so far (running ones too).
  if (spec.has_target()) {
    for (const v1::Trial& trial : study.status.trials()) {
      const bool measured = trial.state() != v1::TRIAL_STATE_FAILED &&
                            trial.state() != v1::TRIAL_STATE_CANCELLED;
      if (measured && trial.has_value() &&
          !Better(spec, spec.target(), trial.value())) {
        EndStudy(study, v1::STUDY_STATE_COMPLETED,
                 absl::StrFormat("target %s %g reached by trial %d (%g)",
                                 spec.objective().metric(), spec.target(),
                                 trial.number(), trial.value()),
                 trial.number());
        return;
      }
    }
  }
  // New trials up to the parallelism and the budget.
  while (study.sampler != nullptr && !study.exhausted &&
         study.status.trials_running() < spec.parallelism() &&
         study.status.trials_size() < study.budget) {
    absl::StatusOr<v1::Trial*> trial =
        NewTrial(study, std::nullopt, /*asked=*/false);
    if (!trial.ok()) {
      if (trial.status().code() != absl::StatusCode::kOutOfRange) {
        LOG(ERROR) << "study " << study.status.study_id()
                   << ": no new trial: " << trial.status();
      }
      study.exhausted = true;  // the grid is spent (or the sampler broke)
      break;
    }
    Summarize(study);
  }
  if (study.status.trials_running() == 0 &&
      (study.exhausted || study.status.trials_size() >= study.budget)) {
    EndStudy(study, v1::STUDY_STATE_COMPLETED,
             absl::StrCat("all ", study.status.trials_size(), " trials ended"));
  }
}

void TrialScheduler::RefreshTrial(Study& study, v1::Trial& trial) {
  if (trial.folds_size() > 0) {
    RefreshFoldTrial(study, trial);
    return;
  }
  const v1::StudySpec& spec = study.status.spec();
  const std::string& study_id = study.status.study_id();
  if (trial.job_id().empty()) {
    // Written, but its job not submitted (a restart, or a submit that
    // failed for a reason that may pass).
    SubmitTrialJob(study, trial,
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
      SubmitTrialJob(study, trial, /*may_exist=*/false);
    } else {
      LOG(WARNING) << "study " << study_id << ": trial " << trial.number()
                   << ": " << job.status();
    }
    return;
  }

  // Epochs and intermediate values.
  int new_epochs = 0;
  const bool reported = ReadAttempt(spec, *job, trial, &new_epochs);
  if (new_epochs != 0 || reported) {
    trial.set_epochs_trained(trial.epochs_trained() + new_epochs);
    study.dirty = true;
  }
  if (trial.state() == v1::TRIAL_STATE_QUEUED &&
      job->state() != v1::JOB_STATE_QUEUED) {
    trial.set_state(v1::TRIAL_STATE_RUNNING);
    events_.Log(study, v1::StudyEvent::KIND_STARTED, &trial, "");
  }
  if (reported) events_.Log(study, v1::StudyEvent::KIND_REPORTED, &trial, "");

  JobOutcome outcome = JudgeJob(spec, *job, trial.has_value(), trial.retries(),
                                absl::StrCat("job ", trial.job_id()));
  switch (outcome.kind) {
    case JobOutcome::Kind::kGoingOn:
      if (reported && trial.intermediate_size() > 0) MaybePrune(study, trial);
      return;
    case JobOutcome::Kind::kCompleted:
      if (spec.objectives_size() > 0) {
        trial.clear_values();
        for (double value : outcome.values) trial.add_values(value);
      }
      EndTrial(study, trial, v1::TRIAL_STATE_COMPLETED, outcome.message);
      return;
    case JobOutcome::Kind::kRetry:
      LOG(INFO) << "study " << study_id << ": trial " << trial.number()
                << ": job " << trial.job_id() << " failed (" << outcome.message
                << "); running it again";
      trial.set_retries(trial.retries() + 1);
      trial.set_epochs_done(0);
      trial.clear_intermediate();
      trial.clear_value();
      trial.clear_rungs();
      trial.set_message(TruncatedMessage(
          absl::StrCat("attempt ", trial.retries(), " failed: ", outcome.message)));
      trial.clear_job_id();
      trial.set_state(v1::TRIAL_STATE_QUEUED);
      SubmitTrialJob(study, trial, /*may_exist=*/false);
      return;
    case JobOutcome::Kind::kPruned:
      EndTrial(study, trial, v1::TRIAL_STATE_PRUNED, outcome.message);
      return;
    case JobOutcome::Kind::kFailed:
      EndTrial(study, trial, v1::TRIAL_STATE_FAILED, outcome.message);
      return;
    case JobOutcome::Kind::kCancelled:
      EndTrial(study, trial, v1::TRIAL_STATE_CANCELLED, outcome.message);
      return;
  }
}

void TrialScheduler::MaybePrune(Study& study, v1::Trial& trial) {
  const v1::StudySpec& spec = study.status.spec();
  const std::string& study_id = study.status.study_id();
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
    if (other.number() == trial.number())
      mine = static_cast<int>(curves.size());
    curves.push_back(std::move(curve));
  }
  if (mine < 0) return;
  TrialCurve me = curves[mine];
  const bool prune = study.pruner->ShouldPrune(&me, curves);
  trial.clear_rungs();
  for (const auto& [rung, value] : me.rungs)
    (*trial.mutable_rungs())[rung] = value;
  if (prune) {
    const v1::IntermediateValue& last =
        trial.intermediate(trial.intermediate_size() - 1);
    EndTrial(study, trial, v1::TRIAL_STATE_PRUNED,
             absl::StrFormat("pruned by study %s (%s) at epoch %d: %s %g",
                             study_id, spec.pruner().name(), last.epoch(),
                             spec.objective().metric(), last.value()));
  }
}

absl::StatusOr<v1::Trial*> TrialScheduler::NewTrial(Study& study,
                                                    std::optional<Point> point,
                                                    bool asked) {
  const int number = study.status.trials_size();
  const v1::StudySpec& spec = study.status.spec();
  if (!point.has_value() && number < spec.enqueue_size()) {
    // An enqueued configuration (checked at creation) before any sampled.
    const auto& fields = spec.enqueue(number).fields();
    absl::StatusOr<Point> enqueued =
        study.space->FromValues(ParamValues(fields.begin(), fields.end()));
    if (enqueued.ok()) point = *std::move(enqueued);
  }
  std::optional<int> generation;
  if (!point.has_value()) {
    const std::vector<Observation> history = History(study, /*except=*/-1);
    MPILEARN_ASSIGN_OR_RETURN(Point suggested, study.sampler->Suggest(number, history));
    point = std::move(suggested);
    generation = study.sampler->Generation(history);
  }
  v1::Trial* trial = study.status.add_trials();
  if (generation.has_value()) trial->set_generation(*generation);
  trial->set_number(number);
  *trial->mutable_params() = study.space->Values(*point);
  trial->set_state(v1::TRIAL_STATE_QUEUED);
  trial->set_created_unix_seconds(NowSeconds());
  trial->set_asked(asked);
  for (int i = 0; i < spec.folds(); ++i) {
    v1::TrialFold* fold = trial->add_folds();
    fold->set_fold(i);
    fold->set_state(v1::TRIAL_STATE_QUEUED);
  }
  study.dirty = true;
  absl::StatusOr<v1::JobSpec> job_spec = study.space->Apply(*point);
  if (!job_spec.ok()) {
    EndTrial(study, *trial, v1::TRIAL_STATE_FAILED,
             TruncatedMessage(job_spec.status().message()));
    return trial;
  }
  // On disk before its job exists: a master that dies in between finds the
  // job by its name after the restart (study_table.h).
  Persist(study);
  SubmitTrialJob(study, *trial, /*may_exist=*/false);
  return trial;
}

void TrialScheduler::SubmitTrialJob(Study& study, v1::Trial& trial,
                                    bool may_exist) {
  if (trial.folds_size() > 0) {
    SubmitFoldJobs(study, trial, may_exist);
    return;
  }
  const std::optional<std::string> job_id =
      SubmitJob(study, trial, /*fold=*/-1, trial.retries(), may_exist);
  if (!job_id.has_value()) return;
  trial.set_job_id(*job_id);
  trial.add_job_ids(*job_id);
  trial.set_state(v1::TRIAL_STATE_QUEUED);
  study.dirty = true;
  VLOG(1) << "study " << study.status.study_id() << ": trial " << trial.number()
          << " is job " << *job_id;
  events_.Log(study, v1::StudyEvent::KIND_CREATED, &trial, "");
}

std::optional<std::string> TrialScheduler::SubmitJob(Study& study,
                                                     v1::Trial& trial, int fold,
                                                     int retries,
                                                     bool may_exist) {
  const std::string name =
      TrialJobName(study.status.study_id(), trial.number(), fold, retries);
  if (may_exist) {
    std::optional<std::string> found = jobs_.FindByName(name);
    if (found.has_value()) return found;
  }
  absl::StatusOr<Point> point = study.space->FromValues(trial.params());
  absl::StatusOr<v1::JobSpec> spec =
      point.ok() ? study.space->Apply(*point)
                 : absl::StatusOr<v1::JobSpec>(point.status());
  if (!spec.ok()) {
    EndTrial(study, trial, v1::TRIAL_STATE_FAILED,
             TruncatedMessage(spec.status().message()));
    return std::nullopt;
  }
  spec->set_name(name);
  // Fair share and group limits count the trials of one study together.
  spec->set_study(study.status.study_id());
  if (fold >= 0) {
    spec->mutable_data()->set_folds(study.status.spec().folds());
    spec->mutable_data()->set_fold(fold);
  }
  absl::StatusOr<std::string> submitted = jobs_.Submit(*spec);
  if (!submitted.ok()) {
    if (submitted.status().code() == absl::StatusCode::kInvalidArgument) {
      EndTrial(study, trial, v1::TRIAL_STATE_FAILED,
               TruncatedMessage(submitted.status().message()));
    } else {
      // Left without a job; the next refresh tries again.
      LOG(WARNING) << "study " << study.status.study_id() << ": trial "
                   << trial.number() << ": " << submitted.status()
                   << "; will retry";
    }
    return std::nullopt;
  }
  return *std::move(submitted);
}

void TrialScheduler::EndTrial(Study& study, v1::Trial& trial,
                              v1::TrialState state,
                              const std::string& message) {
  // Told COMPLETED while its job still runs (an external optimizer): stop
  // the job too; a job that completed by itself has ended already.
  const std::string reason = state == v1::TRIAL_STATE_COMPLETED
                                 ? std::string("completed by the study's optimizer")
                                 : message;
  if (trial.folds_size() > 0) {
    StopFolds(study, trial, state, reason);
  } else if (TrialInFlight(trial) && !trial.job_id().empty()) {
    StopJob(study, trial, trial.job_id(), reason);
  }
  trial.set_state(state);
  trial.set_message(TruncatedMessage(message));
  trial.set_ended_unix_seconds(NowSeconds());
  study.dirty = true;
  LOG(INFO) << "study " << study.status.study_id() << ": trial "
            << trial.number() << " " << v1::TrialState_Name(state)
            << (trial.has_value() ? absl::StrCat(" value ", trial.value()) : "")
            << (message.empty() ? "" : absl::StrCat(": ", message));
  Summarize(study);
  events_.Log(study, v1::StudyEvent::KIND_ENDED, &trial, "");
}

void TrialScheduler::StopJob(const Study& study, const v1::Trial& trial,
                             const std::string& job_id,
                             const std::string& reason) {
  const absl::Status stopped = jobs_.Stop(job_id, reason);
  if (!stopped.ok() && stopped.code() != absl::StatusCode::kFailedPrecondition &&
      stopped.code() != absl::StatusCode::kNotFound) {
    LOG(WARNING) << "study " << study.status.study_id() << ": trial "
                 << trial.number() << ": " << stopped;
  }
}

void TrialScheduler::EndStudy(Study& study, v1::StudyState state,
                              const std::string& message, int reached) {
  for (v1::Trial& trial : *study.status.mutable_trials()) {
    if (!TrialInFlight(trial)) continue;
    if (trial.number() == reached) {
      EndTrial(study, trial, v1::TRIAL_STATE_COMPLETED, "reached the study's target");
    } else {
      EndTrial(study, trial, v1::TRIAL_STATE_CANCELLED, absl::StrCat("study ended: ", message));
    }
  }
  study.status.set_state(state);
  study.status.set_message(message);
  study.status.set_ended_unix_seconds(NowSeconds());
  study.dirty = true;
  Summarize(study);
  LOG(INFO) << "study " << study.status.study_id() << " "
            << v1::StudyState_Name(state) << ": " << message;
  events_.Log(study, v1::StudyEvent::KIND_STUDY_ENDED, nullptr, message);
}

void TrialScheduler::Summarize(Study& study) const {
  v1::StudyStatus& status = study.status;
  status.clear_best_trial();
  status.clear_best_value();
  status.clear_pareto_front();
  const v1::StudySpec& spec = status.spec();
  const bool several = spec.objectives_size() > 0;
  if (several) {
    // The result is the front of the COMPLETED trials, not a best one.
    std::vector<std::vector<double>> points;
    std::vector<int> numbers;
    for (const v1::Trial& trial : status.trials()) {
      if (trial.state() != v1::TRIAL_STATE_COMPLETED ||
          trial.values_size() != spec.objectives_size()) {
        continue;
      }
      std::vector<double>& point = points.emplace_back();
      for (int i = 0; i < spec.objectives_size(); ++i) {
        const double sign = spec.objectives(i).direction() == "maximize" ? -1.0 : 1.0;
        point.push_back(sign * trial.values(i));
      }
      numbers.push_back(trial.number());
    }
    for (size_t i : ParetoFront(points)) status.add_pareto_front(numbers[i]);
  }
  int running = 0;
  int epochs = 0;
  for (const v1::Trial& trial : status.trials()) {
    running += TrialInFlight(trial) ? 1 : 0;
    epochs += trial.epochs_trained();
    const bool counts = trial.state() == v1::TRIAL_STATE_COMPLETED ||
                        trial.state() == v1::TRIAL_STATE_PRUNED;
    if (!several && counts && trial.has_value() &&
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

std::vector<Observation> TrialScheduler::History(const Study& study,
                                                 int except) const {
  const double sign = Maximizing(study.status.spec()) ? -1.0 : 1.0;
  std::vector<Observation> history;
  // The trials seeded from another study (numbered below 0) come first.
  std::vector<const v1::Trial*> trials;
  for (const v1::Trial& trial : study.status.seeded()) trials.push_back(&trial);
  for (const v1::Trial& trial : study.status.trials()) trials.push_back(&trial);
  for (const v1::Trial* seen : trials) {
    const v1::Trial& trial = *seen;
    if (trial.number() == except) continue;
    absl::StatusOr<Point> point = study.space->FromValues(trial.params());
    if (!point.ok()) continue;
    Observation observation;
    observation.number = trial.number();
    observation.point = *std::move(point);
    observation.generation = trial.has_generation() ? trial.generation() : -1;
    const v1::StudySpec& spec = study.status.spec();
    if (trial.values_size() == spec.objectives_size()) {
      for (int i = 0; i < trial.values_size(); ++i) {
        const double minimize = spec.objectives(i).direction() == "maximize" ? -1.0 : 1.0;
        observation.values.push_back(minimize * trial.values(i));
      }
    }
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

void TrialScheduler::Persist(Study& study) {
  if (!study.dirty) return;
  const absl::Status written = store_.Write(study.status);
  if (!written.ok()) {
    LOG(ERROR) << "study " << study.status.study_id() << ": "
               << written.message() << "; will retry";
    return;
  }
  study.dirty = false;
}

double TrialScheduler::NowSeconds() const {
  return absl::ToDoubleSeconds(clock_() - absl::UnixEpoch());
}

}  // namespace mpilearn::opt
