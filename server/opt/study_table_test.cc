// The study table over a fake job queue: trials become jobs with the
// trial's values applied, validations become intermediate values, the
// pruner stops jobs, failed jobs are retried, studies end by budget, target
// or cancel, survive a restart, and watches see every change.
#include "server/opt/study_table.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_file.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/opt/study_test_fakes.h"

namespace mpilearn::opt {
namespace {

using ::testing::HasSubstr;

class StudyTableTest : public StudyTableFixture {
 protected:
  std::string CreateStudy(StudyTable& table, const v1::StudySpec& spec) {
    v1::CreateStudyRequest request;
    *request.mutable_spec() = spec;
    auto created = table.CreateStudy(request);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->study_id() : "";
  }
};

TEST_F(StudyTableTest, BadSpecsNameTheField) {
  auto table = NewTable();
  const std::vector<std::pair<std::function<void(v1::StudySpec&)>, std::string>>
      cases = {
          {[](v1::StudySpec& s) { s.mutable_objective()->set_metric("val_mae"); },
           "objective.metric"},
          // val_auc is reported by binary_crossentropy only.
          {[](v1::StudySpec& s) { s.mutable_objective()->set_metric("val_auc"); },
           "objective.metric"},
          {[](v1::StudySpec& s) {
             s.mutable_objective()->set_direction("up");
           },
           "objective.direction"},
          {[](v1::StudySpec& s) { s.set_trials(0); }, "trials"},
          {[](v1::StudySpec& s) { s.set_trials(-3); }, "trials"},
          {[](v1::StudySpec& s) { s.set_parallelism(0); }, "parallelism"},
          {[](v1::StudySpec& s) { s.set_sampler("bayes"); }, "sampler"},
          {[](v1::StudySpec& s) { s.mutable_pruner()->set_name("hyperband"); },
           "pruner.name"},
          {[](v1::StudySpec& s) { s.set_max_retries(-1); }, "max_retries"},
          {[](v1::StudySpec& s) { s.set_sampler("grid"); },
           "optimizer.learning_rate"},
          {[](v1::StudySpec& s) { s.mutable_base()->set_epochs(0); }, "epochs"},
          {[](v1::StudySpec& s) { s.mutable_parameters(0)->set_path("nope"); },
           "nope"},
          {[](v1::StudySpec& s) { s.mutable_tpe()->set_ei_candidates(0); },
           "tpe.ei_candidates"},
      };
  for (const auto& [mutate, field] : cases) {
    v1::StudySpec spec = BaseStudy();
    mutate(spec);
    v1::CreateStudyRequest request;
    *request.mutable_spec() = spec;
    auto created = table->CreateStudy(request);
    ASSERT_FALSE(created.ok()) << field;
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument)
        << created.status();
    EXPECT_THAT(std::string(created.status().message()), HasSubstr(field));
  }
  EXPECT_TRUE(jobs_.jobs.empty());
  EXPECT_EQ(table->ListStudies().studies_size(), 0);
  // With binary_crossentropy it is, maximized by default.
  v1::StudySpec auc = BaseStudy();
  auc.mutable_base()->set_loss("binary_crossentropy");
  auc.mutable_objective()->set_metric("val_auc");
  ASSERT_TRUE(NormalizeStudySpec(&auc).ok());
  EXPECT_EQ(auc.objective().direction(), "maximize");
}

TEST_F(StudyTableTest, TrialsAreJobsWithTheirValuesApplied) {
  auto table = NewTable();
  const std::string id = CreateStudy(*table, BaseStudy());
  ASSERT_EQ(id, "s-1");
  // Two trials at once (parallelism), each a job named after the trial.
  ASSERT_EQ(jobs_.order.size(), 2u);
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Trial& trial = status.trials(i);
    const v1::JobStatus& job = jobs_.jobs.at(trial.job_id());
    EXPECT_EQ(job.spec().name(), absl::StrCat("s-1/trial-", i));
    EXPECT_DOUBLE_EQ(job.spec().optimizer().learning_rate(),
                     trial.params().at("optimizer.learning_rate").number_value());
    EXPECT_EQ(job.spec().batch_size(),
              static_cast<int>(trial.params().at("batch_size").number_value()));
    EXPECT_EQ(job.spec().batch_size() % 16, 0);
    EXPECT_EQ(trial.state(), v1::TRIAL_STATE_QUEUED);
  }
  // Validations become intermediate values; the value is the best.
  const std::string job0 = status.trials(0).job_id();
  jobs_.Validate(job0, 1, 0.70);
  jobs_.Validate(job0, 2, 0.80);
  jobs_.Validate(job0, 3, 0.78);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_RUNNING);
  ASSERT_EQ(status.trials(0).intermediate_size(), 3);
  EXPECT_DOUBLE_EQ(status.trials(0).intermediate(2).value(), 0.78);
  EXPECT_DOUBLE_EQ(status.trials(0).value(), 0.80);
  EXPECT_EQ(status.trials(0).epochs_done(), 3);

  // A completed job completes its trial and the next trial starts.
  jobs_.Complete(job0);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_COMPLETED);
  EXPECT_EQ(status.trials_size(), 3);
  EXPECT_EQ(status.best_trial(), 0);
  EXPECT_DOUBLE_EQ(status.best_value(), 0.80);

  // The rest finish; the study ends with the best trial.
  for (int round = 0; round < 4; ++round) {
    status = Get(*table, id);
    for (const v1::Trial& trial : status.trials()) {
      if (trial.state() == v1::TRIAL_STATE_QUEUED) {
        jobs_.Validate(trial.job_id(), 1, 0.5 + 0.12 * trial.number());
        jobs_.Complete(trial.job_id());
      }
    }
    table->Refresh();
  }
  status = Get(*table, id);
  EXPECT_EQ(status.state(), v1::STUDY_STATE_COMPLETED);
  EXPECT_EQ(status.trials_size(), 4);
  EXPECT_EQ(status.trials_running(), 0);
  EXPECT_EQ(status.best_trial(), 3);  // 0.5 + 0.36 beats trial 0's 0.80
  EXPECT_NEAR(status.best_value(), 0.86, 1e-12);
  EXPECT_EQ(status.epochs_trained(), 3 + 1 + 1 + 1);
  EXPECT_THAT(status.message(), HasSubstr("all 4 trials ended"));
}

TEST_F(StudyTableTest, StudyOwnerIsItsBaseJobsOwner) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.mutable_base()->set_owner("alice");
  const std::string id = CreateStudy(*table, spec);
  EXPECT_EQ(table->StudyOwner(id).value(), "alice");
  EXPECT_EQ(table->StudyOwner("s-99").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StudyTableTest, FailedJobIsRetriedThenTheTrialFails) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_parallelism(1);
  spec.set_trials(2);
  spec.set_max_retries(1);
  const std::string id = CreateStudy(*table, spec);
  const std::string first = Get(*table, id).trials(0).job_id();
  jobs_.Validate(first, 1, 0.6);
  jobs_.Fail(first, "rank 1: out of memory");
  table->Refresh();
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 1);
  const v1::Trial& retried = status.trials(0);
  EXPECT_EQ(retried.state(), v1::TRIAL_STATE_QUEUED);
  EXPECT_EQ(retried.retries(), 1);
  ASSERT_EQ(retried.job_ids_size(), 2);
  EXPECT_NE(retried.job_id(), first);
  EXPECT_EQ(jobs_.jobs.at(retried.job_id()).spec().name(), "s-1/trial-0/retry-1");
  EXPECT_FALSE(retried.has_value());  // the failed attempt's values are gone
  EXPECT_EQ(retried.epochs_trained(), 1);

  jobs_.Fail(retried.job_id(), "rank 1: out of memory again");
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_FAILED);
  EXPECT_THAT(status.trials(0).message(), HasSubstr("out of memory again"));
  // The study goes on with the next trial.
  ASSERT_EQ(status.trials_size(), 2);
  EXPECT_EQ(status.trials(1).state(), v1::TRIAL_STATE_QUEUED);
}

TEST_F(StudyTableTest, ATrialPastItsWallTimeLimitIsNotRetried) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_parallelism(1);
  spec.set_trials(2);
  spec.set_max_retries(3);
  spec.mutable_base()->set_max_wall_seconds(5);
  const std::string id = CreateStudy(*table, spec);
  const std::string first = Get(*table, id).trials(0).job_id();
  // Trials' jobs carry their study and the base's limit.
  EXPECT_EQ(jobs_.jobs.at(first).spec().study(), id);
  EXPECT_EQ(jobs_.jobs.at(first).spec().max_wall_seconds(), 5);
  jobs_.Fail(first, "ran past its wall-time limit of 5 s (max_wall_seconds)");
  jobs_.jobs.at(first).set_stop_reason("wall-time limit of 5 s reached");
  table->Refresh();
  const v1::StudyStatus status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_FAILED);
  EXPECT_EQ(status.trials(0).retries(), 0);
  EXPECT_THAT(status.trials(0).message(), HasSubstr("max_wall_seconds"));
  ASSERT_EQ(status.trials_size(), 2);
  EXPECT_EQ(status.trials(1).state(), v1::TRIAL_STATE_QUEUED);
}

TEST_F(StudyTableTest, AshaStopsTheJobOfAPrunedTrial) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_trials(3);
  spec.set_parallelism(3);
  spec.mutable_pruner()->set_name("asha");
  spec.mutable_pruner()->set_reduction_factor(2);
  const std::string id = CreateStudy(*table, spec);
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 3);
  // Rung 0 at epoch 1. Trial 0 records 0.8 there (alone: promoted).
  jobs_.Validate(status.trials(0).job_id(), 1, 0.8);
  table->Refresh();
  // Trial 1 records 0.5: competing {0.8, 0.5}, top 1/2 is 0.8: pruned.
  jobs_.Validate(status.trials(1).job_id(), 1, 0.5);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_RUNNING);
  EXPECT_EQ(status.trials(1).state(), v1::TRIAL_STATE_PRUNED);
  EXPECT_THAT(status.trials(1).message(), HasSubstr("epoch 1"));
  EXPECT_EQ(status.trials(0).rungs().at(0), -0.8);  // minimize form
  const std::string pruned_job = status.trials(1).job_id();
  ASSERT_EQ(jobs_.stopped.count(pruned_job), 1u);
  EXPECT_THAT(jobs_.stopped.at(pruned_job), HasSubstr("pruned by study s-1"));
  EXPECT_EQ(jobs_.jobs.at(pruned_job).state(), v1::JOB_STATE_COMPLETED);
  // Trial 2 records 0.9: the best so far, promoted.
  jobs_.Validate(status.trials(2).job_id(), 1, 0.9);
  table->Refresh();
  EXPECT_EQ(Get(*table, id).trials(2).state(), v1::TRIAL_STATE_RUNNING);
  // A pruned trial still counts for the best value.
  EXPECT_EQ(Get(*table, id).best_trial(), 1);
}

TEST_F(StudyTableTest, TargetEndsTheStudyAndCancelsTrialsInFlight) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_target(0.85);
  spec.set_trials(10);
  const std::string id = CreateStudy(*table, spec);
  v1::StudyStatus status = Get(*table, id);
  jobs_.Validate(status.trials(0).job_id(), 1, 0.9);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.state(), v1::STUDY_STATE_COMPLETED);
  EXPECT_THAT(status.message(), HasSubstr("target val_accuracy 0.85 reached by trial 0"));
  EXPECT_EQ(status.trials_size(), 2);
  // The trial that reached the target completes (it is the study's best,
  // whether or not its job had ended); the other is cancelled. Both jobs
  // are stopped.
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_COMPLETED);
  EXPECT_EQ(status.trials(1).state(), v1::TRIAL_STATE_CANCELLED);
  EXPECT_EQ(status.best_trial(), 0);
  for (const v1::Trial& trial : status.trials()) {
    EXPECT_EQ(jobs_.jobs.at(trial.job_id()).state(), v1::JOB_STATE_COMPLETED);
  }
  table->Refresh();
  EXPECT_EQ(Get(*table, id).trials_size(), 2);  // no new trials
}

TEST_F(StudyTableTest, ExternalOptimizerAsksAndTells) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_sampler("external");
  spec.set_trials(2);
  const std::string id = CreateStudy(*table, spec);
  EXPECT_TRUE(jobs_.jobs.empty());  // nothing runs by itself

  v1::AskTrialRequest ask;
  ask.set_study_id(id);
  EXPECT_EQ(table->AskTrial(ask).status().code(),
            absl::StatusCode::kInvalidArgument);  // external: params needed
  (*ask.mutable_params())["optimizer.learning_rate"].set_number_value(0.01);
  (*ask.mutable_params())["batch_size"].set_number_value(48);
  auto trial = table->AskTrial(ask);
  ASSERT_TRUE(trial.ok()) << trial.status();
  EXPECT_TRUE(trial->asked());
  EXPECT_EQ(jobs_.jobs.at(trial->job_id()).spec().batch_size(), 48);
  (*ask.mutable_params())["batch_size"].set_number_value(50);  // off the step
  EXPECT_EQ(table->AskTrial(ask).status().code(),
            absl::StatusCode::kInvalidArgument);

  jobs_.Validate(trial->job_id(), 1, 0.4);
  table->Refresh();
  v1::TellTrialRequest tell;
  tell.set_study_id(id);
  tell.set_trial(trial->number());
  tell.set_state(v1::TRIAL_STATE_PRUNED);
  auto told = table->TellTrial(tell);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(told->state(), v1::TRIAL_STATE_PRUNED);
  EXPECT_EQ(jobs_.jobs.at(trial->job_id()).state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(table->TellTrial(tell).status().code(),
            absl::StatusCode::kFailedPrecondition);  // already ended
  EXPECT_EQ(ReasonOf(table->TellTrial(tell).status()),
            v1::ERROR_REASON_STUDY_STATE);
  tell.set_trial(7);
  EXPECT_EQ(table->TellTrial(tell).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(table->TellTrial(tell).status()),
            v1::ERROR_REASON_STUDY_UNKNOWN);
}

TEST_F(StudyTableTest, WatchSeesSnapshotThenEventsThenTheEnd) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.set_trials(1);
  spec.set_parallelism(1);
  const std::string id = CreateStudy(*table, spec);
  auto watch = table->WatchStudy(id);
  ASSERT_TRUE(watch.ok()) << watch.status();
  v1::StudyEvent event;
  ASSERT_TRUE((*watch)->Next(&event, absl::ZeroDuration()));
  EXPECT_EQ(event.kind(), v1::StudyEvent::KIND_SNAPSHOT);
  EXPECT_EQ(event.trial().number(), 0);
  EXPECT_FALSE((*watch)->Next(&event, absl::Milliseconds(10)));
  EXPECT_FALSE((*watch)->ended());

  const std::string job = Get(*table, id).trials(0).job_id();
  jobs_.Validate(job, 1, 0.7);
  jobs_.Complete(job);
  table->Refresh();
  std::vector<v1::StudyEvent::Kind> kinds;
  while ((*watch)->Next(&event, absl::Milliseconds(10))) {
    kinds.push_back(event.kind());
  }
  EXPECT_TRUE((*watch)->ended());
  EXPECT_EQ(kinds, (std::vector<v1::StudyEvent::Kind>{
                       v1::StudyEvent::KIND_STARTED,
                       v1::StudyEvent::KIND_REPORTED, v1::StudyEvent::KIND_ENDED,
                       v1::StudyEvent::KIND_STUDY_ENDED}));
  EXPECT_EQ(event.best_trial(), 0);
  EXPECT_EQ(table->WatchStudy("s-9").status().code(), absl::StatusCode::kNotFound);
}

// The table's thread refreshes when woken (a job validated), not only every
// refresh period: with an hour-long period, only Wake can start trial 1.
TEST_F(StudyTableTest, WakeRefreshesWithoutWaitingForThePeriod) {
  StudyTable::Options options;
  options.refresh_period = absl::Hours(1);
  auto table = StudyTable::Create(options, jobs_);
  ASSERT_TRUE(table.ok()) << table.status();
  v1::StudySpec spec = BaseStudy();
  spec.set_parallelism(1);
  const std::string id = CreateStudy(**table, spec);
  absl::SleepFor(absl::Milliseconds(100));  // the thread's first pass is done
  // The fake is not thread-safe: change it only while the table's thread
  // waits (it took its first pass and sleeps until woken).
  const std::string job = Get(**table, id).trials(0).job_id();
  jobs_.Validate(job, 1, 0.7);
  jobs_.Complete(job);
  (*table)->Wake();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Get(**table, id).trials_size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  v1::StudyStatus status = Get(**table, id);
  ASSERT_EQ(status.trials_size(), 2);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_COMPLETED);
}

TEST_F(StudyTableTest, StudiesSurviveARestartWithoutRunningATrialTwice) {
  const std::string dir =
      absl::StrCat(testing::TempDir(), "/study_restart_", getpid());
  std::filesystem::remove_all(dir);
  v1::StudySpec spec = BaseStudy();
  spec.set_trials(3);
  std::string id;
  std::vector<std::string> running;
  {
    auto table = NewTable(dir);
    id = CreateStudy(*table, spec);
    v1::StudyStatus status = Get(*table, id);
    jobs_.Validate(status.trials(0).job_id(), 1, 0.6);
    jobs_.Complete(status.trials(0).job_id());
    table->Refresh();
    status = Get(*table, id);
    ASSERT_EQ(status.trials_size(), 3);
    running = {status.trials(1).job_id(), status.trials(2).job_id()};
    jobs_.Validate(running[0], 1, 0.65);
    table->Refresh();
  }
  // The master dies. The third trial's job exists, but suppose the study
  // file did not get its id: the restart finds the job by its name.
  {
    v1::StudyFile file;
    const std::string path = absl::StrCat(dir, "/studies/", id, "/study.pb");
    ASSERT_TRUE(file.ParseFromString(ReadWholeFile(path).value()));
    file.mutable_status()->mutable_trials(2)->clear_job_id();
    file.mutable_status()->mutable_trials(2)->clear_job_ids();
    ASSERT_TRUE(WriteFileAtomically(path, file.SerializeAsString()).ok());
  }
  const size_t jobs_before = jobs_.jobs.size();
  auto table = NewTable(dir);
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 3);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_COMPLETED);
  EXPECT_EQ(status.trials(1).job_id(), running[0]);
  EXPECT_EQ(status.trials(1).intermediate_size(), 1);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(2).job_id(), running[1]);
  EXPECT_EQ(jobs_.jobs.size(), jobs_before);  // nothing submitted twice
  for (const std::string& job : running) {
    jobs_.Validate(job, 1, 0.7);
    jobs_.Complete(job);
  }
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.state(), v1::STUDY_STATE_COMPLETED);
  // A later study continues the numbering.
  EXPECT_EQ(CreateStudy(*table, spec), "s-2");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mpilearn::opt

namespace mpilearn::opt {
namespace {

// A study of one parameter that matters (the learning rate; batch size does
// not): accuracy 1 - (log10(lr) + 2.3)^2 / 10, best at lr = 10^-2.3.
double LrAccuracy(double lr) {
  const double x = std::log10(lr) + 2.3;
  return 1 - x * x / 10;
}

class WarmStartTest : public StudyTableTest {
 protected:
  v1::StudySpec TpeStudy(uint64_t seed, int trials) {
    v1::StudySpec spec = BaseStudy();
    spec.set_sampler("tpe");
    spec.set_seed(seed);
    spec.set_trials(trials);
    spec.set_parallelism(1);
    return spec;
  }

  // Runs study `id` to its end, one trial at a time, each trial's job
  // reporting LrAccuracy at epoch 1 and completing. The trials' values in
  // order.
  std::vector<double> Run(StudyTable& table, const std::string& id) {
    for (int pass = 0; pass < 10000; ++pass) {
      const v1::StudyStatus status = Get(table, id);
      if (status.state() != v1::STUDY_STATE_RUNNING) break;
      for (const v1::Trial& trial : status.trials()) {
        if (trial.job_id().empty() ||
            jobs_.jobs.at(trial.job_id()).state() == v1::JOB_STATE_COMPLETED) {
          continue;
        }
        jobs_.Validate(trial.job_id(), 1,
                       LrAccuracy(trial.params().at("optimizer.learning_rate").number_value()));
        jobs_.Complete(trial.job_id());
      }
      table.Refresh();
    }
    std::vector<double> values;
    const v1::StudyStatus ended = Get(table, id);
    for (const v1::Trial& trial : ended.trials()) values.push_back(trial.value());
    return values;
  }

  // Trials until the first value at or above `target` (values.size() + 1
  // when none reaches it).
  static int TrialsTo(const std::vector<double>& values, double target) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] >= target) return static_cast<int>(i) + 1;
    }
    return static_cast<int>(values.size()) + 1;
  }
};

TEST_F(WarmStartTest, EnqueuedConfigurationsRunFirst) {
  auto table = NewTable();
  v1::StudySpec spec = TpeStudy(1, 4);
  for (const auto& [lr, batch] : {std::pair<double, double>{0.01, 32}, {0.001, 64}}) {
    google::protobuf::Struct* enqueued = spec.add_enqueue();
    (*enqueued->mutable_fields())["optimizer.learning_rate"].set_number_value(lr);
    (*enqueued->mutable_fields())["batch_size"].set_number_value(batch);
  }
  const std::string id = CreateStudy(*table, spec);
  Run(*table, id);
  const v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 4);
  EXPECT_EQ(status.trials(0).params().at("optimizer.learning_rate").number_value(), 0.01);
  EXPECT_EQ(status.trials(0).params().at("batch_size").number_value(), 32);
  EXPECT_EQ(status.trials(1).params().at("optimizer.learning_rate").number_value(), 0.001);
  EXPECT_EQ(jobs_.jobs.at(status.trials(1).job_id()).spec().batch_size(), 64);

  // A configuration outside the space, or more than the budget, is refused.
  (*spec.mutable_enqueue(1)->mutable_fields())["batch_size"].set_number_value(20);
  v1::CreateStudyRequest request;
  *request.mutable_spec() = spec;
  absl::StatusOr<v1::CreateStudyResponse> refused = table->CreateStudy(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("enqueue[1]"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("off the step"));
  spec.set_trials(1);
  *request.mutable_spec() = spec;
  EXPECT_THAT(std::string(table->CreateStudy(request).status().message()),
              HasSubstr("2 configurations for a budget of 1 trials"));
}

TEST_F(WarmStartTest, SeededTrialsAreObservationsNotTrials) {
  auto table = NewTable();
  const std::string source = CreateStudy(*table, TpeStudy(7, 6));
  Run(*table, source);
  v1::StudySpec spec = TpeStudy(8, 3);
  spec.set_warm_start_from(source);
  const size_t submitted = jobs_.jobs.size();
  const std::string id = CreateStudy(*table, spec);
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.seeded_size(), 6);
  EXPECT_EQ(status.seeded(0).number(), -6);
  EXPECT_EQ(status.seeded(5).number(), -1);
  EXPECT_THAT(status.seeded(0).message(), HasSubstr("seeded from study " + source + " trial 0"));
  EXPECT_TRUE(status.seeded(0).job_id().empty());
  Run(*table, id);
  status = Get(*table, id);
  // Only the new study's own trials were trained and count in its budget.
  EXPECT_EQ(status.trials_size(), 3);
  EXPECT_EQ(jobs_.jobs.size(), submitted + 3);
  EXPECT_EQ(status.trials_created(), 3);
  ASSERT_TRUE(status.has_best_trial());
  EXPECT_GE(status.best_trial(), 0);

  spec.set_warm_start_from("s-99");
  v1::CreateStudyRequest request;
  *request.mutable_spec() = spec;
  EXPECT_THAT(std::string(table->CreateStudy(request).status().message()),
              HasSubstr("warm_start_from"));
}

// Over 8 seeds, a study seeded with an earlier study's 15 trials reaches
// a value the cold study takes several trials to reach in fewer new ones
// on average (TPE skips its random start-up and models the seeded trials).
TEST_F(WarmStartTest, AWarmStudyReachesTheTargetInFewerNewTrials) {
  constexpr double kTarget = 0.995;  // |log10(lr) + 2.3| <= 0.22
  constexpr int kSeeds = 8;
  double cold_total = 0;
  double warm_total = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    auto table = NewTable();
    const std::string cold = CreateStudy(*table, TpeStudy(seed, 30));
    cold_total += TrialsTo(Run(*table, cold), kTarget);
    const std::string earlier = CreateStudy(*table, TpeStudy(seed + 100, 15));
    Run(*table, earlier);
    v1::StudySpec warm_spec = TpeStudy(seed, 30);
    warm_spec.set_warm_start_from(earlier);
    const std::string warm = CreateStudy(*table, warm_spec);
    warm_total += TrialsTo(Run(*table, warm), kTarget);
  }
  const double cold_mean = cold_total / kSeeds;
  const double warm_mean = warm_total / kSeeds;
  std::printf("trials to val_accuracy >= %.3f over %d seeds: cold %.2f, warm-started %.2f\n",
              kTarget, kSeeds, cold_mean, warm_mean);
  EXPECT_LT(warm_mean, cold_mean);
}

}  // namespace
}  // namespace mpilearn::opt

namespace mpilearn::opt {
namespace {

// Two objectives over a width and a learning rate: accuracy up, parameter
// count down (a wider model is more accurate and larger).
TEST_F(StudyTableTest, TwoObjectivesGiveTheBruteForceParetoFront) {
  auto table = NewTable();
  v1::StudySpec spec = BaseStudy();
  spec.clear_parameters();
  v1::ParameterSpec* width = spec.add_parameters();
  width->set_path("model.hidden");
  for (int w : {16, 32, 64, 128, 256}) {
    width->mutable_categorical()->add_choices()->mutable_list_value()->add_values()
        ->set_number_value(w);
  }
  v1::ParameterSpec* lr = spec.add_parameters();
  lr->set_path("optimizer.learning_rate");
  lr->mutable_real()->set_low(1e-4);
  lr->mutable_real()->set_high(1e-1);
  lr->mutable_real()->set_log(true);
  spec.clear_objective();
  spec.add_objectives()->set_metric("val_accuracy");
  spec.add_objectives()->set_metric("parameters");
  spec.clear_sampler();
  spec.set_trials(24);
  spec.set_parallelism(4);
  const std::string id = CreateStudy(*table, spec);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Get(*table, id).spec().sampler(), "nsga2");
  EXPECT_EQ(Get(*table, id).spec().objectives(1).direction(), "minimize");
  for (int pass = 0; pass < 100 && Get(*table, id).state() == v1::STUDY_STATE_RUNNING; ++pass) {
    const v1::StudyStatus status = Get(*table, id);
    for (const v1::Trial& trial : status.trials()) {
      if (trial.job_id().empty() ||
          jobs_.jobs.at(trial.job_id()).state() == v1::JOB_STATE_COMPLETED) {
        continue;
      }
      const double w = trial.params().at("model.hidden").list_value().values(0).number_value();
      const double rate = trial.params().at("optimizer.learning_rate").number_value();
      const double x = std::log10(rate) + 2.5;
      jobs_.Validate(trial.job_id(), 1, 0.9 - 0.2 / std::sqrt(w) - 0.02 * x * x);
      jobs_.jobs.at(trial.job_id()).set_parameters(static_cast<uint64_t>(785 * w + 10 * w + 10));
      jobs_.Complete(trial.job_id());
    }
    table->Refresh();
  }
  const v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.state(), v1::STUDY_STATE_COMPLETED);
  EXPECT_FALSE(status.has_best_trial());
  // The front by brute force, from the trials' own recorded values.
  std::vector<int> expected;
  for (const v1::Trial& a : status.trials()) {
    ASSERT_EQ(a.values_size(), 2) << a.number();
    bool dominated = false;
    for (const v1::Trial& b : status.trials()) {
      const bool no_worse = b.values(0) >= a.values(0) && b.values(1) <= a.values(1);
      const bool better = b.values(0) > a.values(0) || b.values(1) < a.values(1);
      dominated = dominated || (no_worse && better);
    }
    if (!dominated) expected.push_back(a.number());
  }
  EXPECT_EQ(std::vector<int>(status.pareto_front().begin(), status.pareto_front().end()),
            expected);
  EXPECT_GE(expected.size(), 2u);  // a trade-off, not one best trial

  // Bad specs name the field.
  const std::vector<std::pair<std::function<void(v1::StudySpec&)>, std::string>> bad = {
      {[](v1::StudySpec& s) { s.mutable_objectives()->RemoveLast(); }, "objectives"},
      {[](v1::StudySpec& s) { s.mutable_objective()->set_metric("val_loss"); },
       "objective or objectives, not both"},
      {[](v1::StudySpec& s) { s.set_sampler("tpe"); }, "tpe takes one objective"},
      {[](v1::StudySpec& s) { s.mutable_nsga2()->set_population_size(1); },
       "nsga2.population_size"},
      {[](v1::StudySpec& s) { s.mutable_nsga2()->set_mutation_prob(1.5); }, "nsga2.mutation_prob"},
      {[](v1::StudySpec& s) { s.mutable_pruner()->set_name("asha"); }, "pruning is off"},
      {[](v1::StudySpec& s) { s.set_target(0.9); }, "target"},
      {[](v1::StudySpec& s) { s.mutable_objectives(0)->set_metric("parameters"); },
       "at least one metric the jobs report"},
      {[](v1::StudySpec& s) { s.mutable_objectives(1)->set_metric("val_mae"); },
       "objectives[1].metric"},
  };
  for (const auto& [change, part] : bad) {
    v1::StudySpec broken = spec;
    change(broken);
    v1::CreateStudyRequest request;
    *request.mutable_spec() = broken;
    const absl::Status refused = table->CreateStudy(request).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << part;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(part));
  }
}

}  // namespace
}  // namespace mpilearn::opt
