// k-fold trials (StudySpec.folds) over the fake job queue: a trial is one job
// per fold, each holding out its fold; the trial's value is the mean of the
// folds' values (each what a one-job trial of that job would record) with
// their spread; the pruner sees the mean curve; a failed fold is retried
// alone, then fails the trial and stops its other folds; a restart finds a
// fold's job by its name.
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/opt/study_table.h"
#include "server/opt/study_test_fakes.h"

namespace mpilearn::opt {
namespace {

using ::testing::HasSubstr;

v1::StudySpec FoldStudy(int folds) {
  v1::StudySpec spec = BaseStudy();
  spec.set_folds(folds);
  spec.set_trials(2);
  spec.set_parallelism(1);
  return spec;
}

class StudyFoldsTest : public StudyTableFixture {
 protected:
  absl::StatusOr<std::string> Create(StudyTable& table, const v1::StudySpec& spec) {
    v1::CreateStudyRequest request;
    *request.mutable_spec() = spec;
    absl::StatusOr<v1::CreateStudyResponse> created = table.CreateStudy(request);
    if (!created.ok()) return created.status();
    return created->study_id();
  }
  // The jobs of trial `number`'s folds, by fold.
  std::vector<std::string> FoldJobs(StudyTable& table, const std::string& id, int number) {
    std::vector<std::string> ids;
    const v1::StudyStatus status = Get(table, id);
    for (const v1::TrialFold& fold : status.trials(number).folds()) {
      ids.push_back(fold.job_id());
    }
    return ids;
  }
};

TEST_F(StudyFoldsTest, BadFoldSpecsNameTheField) {
  auto table = NewTable();
  const std::vector<std::function<void(v1::StudySpec&)>> cases = {
      [](v1::StudySpec& s) { s.set_folds(1); },
      [](v1::StudySpec& s) { s.set_folds(21); },
      [](v1::StudySpec& s) { s.set_folds(-2); },
      [](v1::StudySpec& s) {
        s.mutable_base()->mutable_data()->set_validation_images("val-images.gz");
        s.mutable_base()->mutable_data()->set_validation_labels("val-labels.gz");
      },
      [](v1::StudySpec& s) { s.mutable_base()->mutable_data()->set_validation_count(500); },
      [](v1::StudySpec& s) { s.mutable_base()->mutable_data()->set_fold(1); },
  };
  for (const auto& mutate : cases) {
    v1::StudySpec spec = FoldStudy(3);
    mutate(spec);
    absl::StatusOr<std::string> created = Create(*table, spec);
    ASSERT_FALSE(created.ok()) << spec.ShortDebugString();
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(created.status().message()), HasSubstr("folds"));
  }
  EXPECT_TRUE(jobs_.jobs.empty());
}

TEST_F(StudyFoldsTest, ATrialIsOneJobPerFoldScoredByTheirMean) {
  auto table = NewTable();
  const std::string id = Create(*table, FoldStudy(3)).value();
  v1::StudyStatus status = Get(*table, id);
  ASSERT_EQ(status.trials_size(), 1);  // parallelism counts trials, not jobs
  ASSERT_EQ(status.trials(0).folds_size(), 3);
  const std::vector<std::string> folds = FoldJobs(*table, id, 0);
  ASSERT_EQ(jobs_.order, folds);
  for (int i = 0; i < 3; ++i) {
    const v1::JobSpec& job = jobs_.jobs.at(folds[i]).spec();
    EXPECT_EQ(job.name(), absl::StrCat(id, "/trial-0/fold-", i));
    EXPECT_EQ(job.data().folds(), 3);
    EXPECT_EQ(job.data().fold(), i);
    EXPECT_EQ(job.study(), id);
  }
  EXPECT_EQ(status.trials(0).job_id(), folds[0]);
  EXPECT_EQ(status.trials(0).job_ids_size(), 3);

  // Epoch 1 on every fold, epoch 2 on two of them.
  const double acc[3][2] = {{0.60, 0.72}, {0.70, 0.66}, {0.80, 0.0}};
  jobs_.Validate(folds[0], 1, acc[0][0]);
  jobs_.Validate(folds[1], 1, acc[1][0]);
  table->Refresh();
  status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_RUNNING);
  EXPECT_EQ(status.trials(0).intermediate_size(), 0);  // fold 2 has no epoch 1 yet
  EXPECT_FALSE(status.trials(0).has_value());
  jobs_.Validate(folds[2], 1, acc[2][0]);
  jobs_.Validate(folds[0], 2, acc[0][1]);
  jobs_.Validate(folds[1], 2, acc[1][1]);
  table->Refresh();
  status = Get(*table, id);
  const v1::Trial& running = status.trials(0);
  ASSERT_EQ(running.intermediate_size(), 1);  // epoch 2 is not every fold's yet
  EXPECT_EQ(running.intermediate(0).epoch(), 1);
  EXPECT_DOUBLE_EQ(running.intermediate(0).value(), (0.60 + 0.70 + 0.80) / 3);
  EXPECT_EQ(running.epochs_done(), 1);
  EXPECT_EQ(running.epochs_trained(), 5);

  for (const std::string& job : folds) jobs_.Complete(job);
  table->Refresh();
  status = Get(*table, id);
  const v1::Trial& done = status.trials(0);
  ASSERT_EQ(done.state(), v1::TRIAL_STATE_COMPLETED) << done.DebugString();
  // Each fold's value is its best epoch; the trial's their mean and spread.
  const double best[3] = {0.72, 0.70, 0.80};
  const double mean = (best[0] + best[1] + best[2]) / 3;
  double squares = 0;
  for (double b : best) squares += (b - mean) * (b - mean);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(done.folds(i).state(), v1::TRIAL_STATE_COMPLETED);
    EXPECT_DOUBLE_EQ(done.folds(i).value(), best[i]);
  }
  EXPECT_DOUBLE_EQ(done.value(), mean);
  EXPECT_DOUBLE_EQ(done.value_spread(), std::sqrt(squares / 3));
  EXPECT_THAT(done.message(), HasSubstr("mean of 3 folds"));
  EXPECT_EQ(status.best_trial(), 0);
  EXPECT_DOUBLE_EQ(status.best_value(), mean);
  // The next trial is three new jobs.
  ASSERT_EQ(status.trials_size(), 2);
  EXPECT_EQ(jobs_.jobs.size(), 6u);
  EXPECT_EQ(jobs_.jobs.at(FoldJobs(*table, id, 1)[2]).spec().name(),
            absl::StrCat(id, "/trial-1/fold-2"));
}

TEST_F(StudyFoldsTest, AFailedFoldIsRetriedAloneThenFailsTheTrial) {
  auto table = NewTable();
  v1::StudySpec spec = FoldStudy(3);
  spec.set_max_retries(1);
  const std::string id = Create(*table, spec).value();
  const std::vector<std::string> first = FoldJobs(*table, id, 0);
  for (const std::string& job : first) jobs_.Validate(job, 1, 0.6);
  jobs_.Fail(first[1], "rank 0: out of memory");
  table->Refresh();
  v1::StudyStatus status = Get(*table, id);
  const v1::Trial& retried = status.trials(0);
  EXPECT_EQ(retried.state(), v1::TRIAL_STATE_RUNNING);
  EXPECT_EQ(retried.retries(), 1);
  EXPECT_EQ(retried.folds(1).retries(), 1);
  EXPECT_EQ(retried.folds(1).state(), v1::TRIAL_STATE_QUEUED);
  EXPECT_FALSE(retried.folds(1).has_value());  // the failed attempt's value is gone
  EXPECT_FALSE(retried.has_value());
  EXPECT_EQ(retried.intermediate_size(), 0);
  const std::string again = retried.folds(1).job_id();
  EXPECT_EQ(jobs_.jobs.at(again).spec().name(), absl::StrCat(id, "/trial-0/fold-1/retry-1"));
  EXPECT_EQ(jobs_.jobs.at(again).spec().data().fold(), 1);
  // The other folds go on with their jobs.
  EXPECT_EQ(retried.folds(0).job_id(), first[0]);
  EXPECT_EQ(retried.folds(2).job_id(), first[2]);
  EXPECT_TRUE(jobs_.stopped.empty());
  EXPECT_EQ(retried.job_ids_size(), 4);

  jobs_.Fail(again, "rank 0: out of memory again");
  table->Refresh();
  status = Get(*table, id);
  const v1::Trial& failed = status.trials(0);
  EXPECT_EQ(failed.state(), v1::TRIAL_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("fold 1"));
  EXPECT_THAT(failed.message(), HasSubstr("out of memory again"));
  EXPECT_EQ(failed.folds(1).state(), v1::TRIAL_STATE_FAILED);
  EXPECT_EQ(failed.folds(0).state(), v1::TRIAL_STATE_CANCELLED);
  // The other folds' jobs are stopped.
  EXPECT_EQ(jobs_.stopped.count(first[0]), 1u);
  EXPECT_EQ(jobs_.stopped.count(first[2]), 1u);
  ASSERT_EQ(status.trials_size(), 2);  // the study goes on
}

TEST_F(StudyFoldsTest, ThePrunerJudgesTheMeanOfTheFolds) {
  auto table = NewTable();
  v1::StudySpec spec = FoldStudy(2);
  spec.set_parallelism(2);
  spec.mutable_pruner()->set_name("asha");
  spec.mutable_pruner()->set_reduction_factor(2);
  const std::string id = Create(*table, spec).value();
  const std::vector<std::string> a = FoldJobs(*table, id, 0);
  const std::vector<std::string> b = FoldJobs(*table, id, 1);
  // Trial 0's mean at rung 0 (epoch 1) is 0.85.
  jobs_.Validate(a[0], 1, 0.8);
  jobs_.Validate(a[1], 1, 0.9);
  table->Refresh();
  // Trial 1's first fold alone would beat it; no mean yet, no verdict.
  jobs_.Validate(b[0], 1, 0.95);
  table->Refresh();
  EXPECT_EQ(Get(*table, id).trials(1).state(), v1::TRIAL_STATE_RUNNING);
  EXPECT_TRUE(jobs_.stopped.empty());
  // Its mean is 0.725 < 0.85: pruned, both fold jobs stopped.
  jobs_.Validate(b[1], 1, 0.5);
  table->Refresh();
  const v1::StudyStatus status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_RUNNING);
  EXPECT_EQ(status.trials(1).state(), v1::TRIAL_STATE_PRUNED);
  EXPECT_DOUBLE_EQ(status.trials(1).intermediate(0).value(), 0.725);
  for (const std::string& job : b) {
    ASSERT_EQ(jobs_.stopped.count(job), 1u) << job;
    EXPECT_THAT(jobs_.stopped.at(job), HasSubstr("pruned by study"));
  }
  EXPECT_EQ(status.trials(1).folds(0).state(), v1::TRIAL_STATE_PRUNED);
}

TEST_F(StudyFoldsTest, SeveralObjectivesAreMeansToo) {
  auto table = NewTable();
  v1::StudySpec spec = FoldStudy(2);
  spec.set_sampler("random");
  spec.add_objectives()->set_metric("val_accuracy");
  spec.add_objectives()->set_metric("parameters");
  const std::string id = Create(*table, spec).value();
  const std::vector<std::string> folds = FoldJobs(*table, id, 0);
  jobs_.Validate(folds[0], 1, 0.6);
  jobs_.Validate(folds[1], 1, 0.8);
  for (const std::string& job : folds) {
    jobs_.jobs.at(job).set_parameters(1000);
    jobs_.Complete(job);
  }
  table->Refresh();
  const v1::StudyStatus status = Get(*table, id);
  const v1::Trial& done = status.trials(0);
  ASSERT_EQ(done.state(), v1::TRIAL_STATE_COMPLETED) << done.DebugString();
  ASSERT_EQ(done.values_size(), 2);
  EXPECT_DOUBLE_EQ(done.values(0), 0.7);
  EXPECT_DOUBLE_EQ(done.values_spread(0), 0.1);
  EXPECT_EQ(done.values(1), 1000);
  EXPECT_EQ(done.values_spread(1), 0);
  EXPECT_EQ(status.pareto_front_size(), 1);
}

TEST_F(StudyFoldsTest, ARestartFindsAFoldsJobByItsName) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/study_folds_restart_", getpid());
  std::filesystem::remove_all(dir);
  std::string id;
  std::vector<std::string> folds;
  {
    auto table = NewTable(dir);
    id = Create(*table, FoldStudy(3)).value();
    folds = FoldJobs(*table, id, 0);
    jobs_.Validate(folds[0], 1, 0.6);
    table->Refresh();
  }
  // The master died after submitting fold 2's job but before writing it.
  {
    v1::StudyFile file;
    const std::string path = absl::StrCat(dir, "/studies/", id, "/study.pb");
    ASSERT_TRUE(file.ParseFromString(ReadWholeFile(path).value()));
    file.mutable_status()->mutable_trials(0)->mutable_folds(2)->clear_job_id();
    ASSERT_TRUE(WriteFileAtomically(path, file.SerializeAsString()).ok());
  }
  const size_t jobs_before = jobs_.jobs.size();
  auto table = NewTable(dir);
  table->Refresh();
  EXPECT_EQ(FoldJobs(*table, id, 0), folds);
  EXPECT_EQ(jobs_.jobs.size(), jobs_before);  // nothing submitted twice
  for (const std::string& job : folds) {
    jobs_.Validate(job, 1, 0.7);
    jobs_.Complete(job);
  }
  table->Refresh();
  const v1::StudyStatus status = Get(*table, id);
  EXPECT_EQ(status.trials(0).state(), v1::TRIAL_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(status.trials(0).value(), 0.7);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mpilearn::opt
