// The exact text mpilearn-opt prints for hand-built studies: the expected
// strings are written out column by column, so a change in alignment, in a
// number's format or in CSV quoting shows up as a diff.
#include "tools/cli/opt_format.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {
namespace {

using ::google::protobuf::Value;
using ::testing::HasSubstr;

Value Number(double x) {
  Value value;
  value.set_number_value(x);
  return value;
}

Value Text(const std::string& text) {
  Value value;
  value.set_string_value(text);
  return value;
}

Value List(const std::vector<Value>& items) {
  Value value;
  for (const Value& item : items) {
    *value.mutable_list_value()->add_values() = item;
  }
  return value;
}

v1::Trial MakeTrial(int number, v1::TrialState state, double lr, int batch,
                    const std::vector<Value>& hidden) {
  v1::Trial trial;
  trial.set_number(number);
  trial.set_state(state);
  (*trial.mutable_params())["optimizer.learning_rate"] = Number(lr);
  (*trial.mutable_params())["batch_size"] = Number(batch);
  (*trial.mutable_params())["model.hidden"] = List(hidden);
  trial.set_job_id(absl::StrFormat("job-%06d", number + 1));
  return trial;
}

void AddIntermediate(v1::Trial* trial,
                     const std::vector<std::pair<int, double>>& values) {
  for (const auto& [epoch, value] : values) {
    v1::IntermediateValue* record = trial->add_intermediate();
    record->set_epoch(epoch);
    record->set_value(value);
  }
}

// Four trials, one in each of the states a running study shows: trial 0
// completed (the best), 1 pruned, 2 running, 3 queued after a failure.
v1::StudyStatus MakeStudy() {
  v1::StudyStatus study;
  study.set_study_id("s-1");
  study.set_state(v1::STUDY_STATE_RUNNING);
  v1::StudySpec& spec = *study.mutable_spec();
  spec.set_name("fm");
  spec.add_parameters()->set_path("optimizer.learning_rate");
  spec.add_parameters()->set_path("batch_size");
  spec.add_parameters()->set_path("model.hidden");
  spec.mutable_objective()->set_metric("val_accuracy");
  spec.mutable_objective()->set_direction("maximize");
  spec.set_sampler("tpe");
  spec.mutable_pruner()->set_name("asha");
  spec.set_trials(8);

  v1::Trial& t0 = *study.add_trials() = MakeTrial(
      0, v1::TRIAL_STATE_COMPLETED, 0.0031234, 64, {Number(256), Number(128)});
  t0.set_value(0.8812);
  t0.set_epochs_done(4);
  t0.set_epochs_trained(4);
  AddIntermediate(&t0, {{1, 0.6}, {2, 0.75}, {3, 0.86}, {4, 0.8812}});

  v1::Trial& t1 = *study.add_trials() =
      MakeTrial(1, v1::TRIAL_STATE_PRUNED, 1e-5, 32, {Number(128)});
  t1.set_value(0.7);
  t1.set_epochs_done(1);
  t1.set_epochs_trained(1);
  t1.set_message("pruned at rung 0");
  AddIntermediate(&t1, {{1, 0.7}});

  v1::Trial& t2 = *study.add_trials() = MakeTrial(
      2, v1::TRIAL_STATE_RUNNING, 0.01, 128, {Number(512), Number(256)});
  t2.set_value(0.85);
  t2.set_epochs_done(2);
  t2.set_epochs_trained(2);
  AddIntermediate(&t2, {{1, 0.8}, {2, 0.85}});

  v1::Trial& t3 = *study.add_trials() =
      MakeTrial(3, v1::TRIAL_STATE_QUEUED, 0.02, 256, {Number(128)});
  t3.set_epochs_trained(1);  // its failed first attempt
  t3.set_retries(1);

  study.set_best_trial(0);
  study.set_best_value(0.8812);
  study.set_trials_running(2);
  study.set_epochs_trained(8);
  return study;
}

TEST(StateNameTest, DropsThePrefix) {
  EXPECT_EQ(TrialStateName(v1::TRIAL_STATE_PRUNED), "PRUNED");
  EXPECT_EQ(StudyStateName(v1::STUDY_STATE_CANCELLED), "CANCELLED");
}

TEST(ParamValueTest, CompactAndExact) {
  EXPECT_EQ(FormatParamValue(Number(64)), "64");
  EXPECT_EQ(FormatParamValue(Number(123456)), "123456");  // not 1.235e+05
  EXPECT_EQ(FormatParamValue(Number(-3)), "-3");
  EXPECT_EQ(FormatParamValue(Number(0.0031234)), "0.003123");
  EXPECT_EQ(FormatParamValue(Number(1e-5)), "1e-05");
  EXPECT_EQ(FormatParamValue(Number(1e20)), "1e+20");
  EXPECT_EQ(FormatParamValue(Number(0.5)), "0.5");
  EXPECT_EQ(FormatParamValue(Text("sync")), "sync");
  Value yes;
  yes.set_bool_value(true);
  EXPECT_EQ(FormatParamValue(yes), "true");
  Value null;
  null.set_null_value(google::protobuf::NULL_VALUE);
  EXPECT_EQ(FormatParamValue(null), "null");
  EXPECT_EQ(FormatParamValue(Value()), "-");
  EXPECT_EQ(FormatParamValue(List({Number(256), Number(128)})), "[256,128]");
  EXPECT_EQ(FormatParamValue(List({List({Number(1)}), Text("a")})), "[[1],a]");

  EXPECT_EQ(ExactParamValue(Number(0.0031234)), "0.0031234");
  EXPECT_EQ(ExactParamValue(Number(0.1)), "0.1");
  // 1/3 needs 16 digits to read back; check against strtod, not a string.
  const std::string third = ExactParamValue(Number(1.0 / 3));
  EXPECT_EQ(std::strtod(third.c_str(), nullptr), 1.0 / 3);
  EXPECT_EQ(third.size(), 18u);  // "0." and 16 digits
  EXPECT_EQ(ExactParamValue(Text("relu")), "relu");
  EXPECT_EQ(ExactParamValue(List({Text("a\"b"), Number(2.5)})),
            "[\"a\\\"b\",2.5]");
  EXPECT_EQ(ExactParamValue(Value()), "");
}

TEST(TrialParamsTest, ShortNamesUnlessTheyClash) {
  v1::StudyStatus study = MakeStudy();
  EXPECT_EQ(FormatTrialParams(study.trials(0), study),
            "learning_rate=0.003123 batch_size=64 hidden=[256,128]");
  // Two parameters ending in "dropout": both by their full paths.
  study.add_trials()->set_number(4);
  v1::Trial& trial = *study.mutable_trials(4);
  (*trial.mutable_params())["model.dropout"] = Number(0.25);
  (*trial.mutable_params())["data.dropout"] = Number(0.5);
  (*trial.mutable_params())["batch_size"] = Number(32);
  EXPECT_EQ(FormatTrialParams(trial, study),
            "batch_size=32 data.dropout=0.5 model.dropout=0.25");
}

TEST(TrialTableTest, FixedColumns) {
  const v1::StudyStatus study = MakeStudy();
  EXPECT_EQ(
      FormatTrialTable(study),
      "TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS\n"
      "0      COMPLETED  4       0.8812      *     learning_rate=0.003123 batch_size=64 hidden=[256,128]\n"
      "1      PRUNED     1       0.7               learning_rate=1e-05 batch_size=32 hidden=[128]\n"
      "2      RUNNING    2       0.85              learning_rate=0.01 batch_size=128 hidden=[512,256]\n"
      "3      QUEUED     0       -                 learning_rate=0.02 batch_size=256 hidden=[128]\n");
  // No trials: the header alone; no parameters: no trailing blanks.
  v1::StudyStatus empty;
  EXPECT_EQ(FormatTrialTable(empty),
            "TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS\n");
  v1::StudyStatus bare;
  bare.add_trials()->set_state(v1::TRIAL_STATE_QUEUED);
  EXPECT_EQ(FormatTrialTable(bare),
            "TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS\n"
            "0      QUEUED     0       -\n");
}

TEST(TrialTableTest, RowLimitKeepsBestAndInFlight) {
  const v1::StudyStatus study = MakeStudy();
  // Two rows: the best, then the newest in flight (3); 1 and 2 hidden.
  EXPECT_EQ(
      FormatTrialTable(study, 2),
      "TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS\n"
      "0      COMPLETED  4       0.8812      *     learning_rate=0.003123 batch_size=64 hidden=[256,128]\n"
      "3      QUEUED     0       -                 learning_rate=0.02 batch_size=256 hidden=[128]\n"
      "(2 more trials not shown)\n");
  EXPECT_EQ(
      FormatTrialTable(study, 3),
      "TRIAL  STATE      EPOCHS  VALUE       BEST  PARAMS\n"
      "0      COMPLETED  4       0.8812      *     learning_rate=0.003123 batch_size=64 hidden=[256,128]\n"
      "2      RUNNING    2       0.85              learning_rate=0.01 batch_size=128 hidden=[512,256]\n"
      "3      QUEUED     0       -                 learning_rate=0.02 batch_size=256 hidden=[128]\n"
      "(1 more trial not shown)\n");
  EXPECT_EQ(FormatTrialTable(study, 4), FormatTrialTable(study));
}

TEST(StudySummaryTest, KeyValueBlockAndHeadline) {
  const v1::StudyStatus study = MakeStudy();
  EXPECT_EQ(FormatStudySummary(study),
            "study      s-1\n"
            "name       fm\n"
            "state      RUNNING\n"
            "objective  val_accuracy (maximize)\n"
            "sampler    tpe\n"
            "pruner     asha\n"
            "trials     4 of 8: 1 completed, 1 pruned, 1 running, 1 queued\n"
            "epochs     8 trained\n"
            "best       trial 0, value 0.8812\n");
  EXPECT_EQ(FormatStudyHeadline(study),
            "study s-1 (fm) RUNNING  trials 4/8, 2 running  best trial 0 "
            "value=0.8812");

  // Defaults: objective and sampler as the master fills them in.
  v1::StudyStatus bare;
  bare.set_study_id("s-2");
  bare.set_state(v1::STUDY_STATE_CANCELLED);
  bare.set_message("cancelled by user");
  bare.mutable_spec()->mutable_objective()->set_metric("val_loss");
  EXPECT_EQ(FormatStudySummary(bare),
            "study      s-2\n"
            "state      CANCELLED\n"
            "message    cancelled by user\n"
            "objective  val_loss (minimize)\n"
            "sampler    tpe\n"
            "pruner     none\n"
            "trials     0\n"
            "epochs     0 trained\n"
            "best       -\n");
  EXPECT_EQ(FormatStudyHeadline(bare),
            "study s-2 CANCELLED  trials 0, 0 running  best -");

  // A warm-started study says how.
  v1::StudyStatus warm = bare;
  warm.mutable_spec()->set_warm_start_from("s-1");
  warm.add_seeded()->set_number(-2);
  warm.add_seeded()->set_number(-1);
  warm.mutable_spec()->add_enqueue();
  EXPECT_NE(FormatStudySummary(warm).find("warm start  1 enqueued, 2 seeded from s-1\n"),
            std::string::npos)
      << FormatStudySummary(warm);
}

TEST(ParetoFrontTest, OneRowPerTrialOfTheFront) {
  v1::StudyStatus study;
  study.set_study_id("s-4");
  study.mutable_spec()->add_objectives()->set_metric("val_accuracy");
  study.mutable_spec()->mutable_objectives(0)->set_direction("maximize");
  study.mutable_spec()->add_objectives()->set_metric("parameters");
  study.mutable_spec()->mutable_objectives(1)->set_direction("minimize");
  study.mutable_spec()->add_parameters()->set_path("batch_size");
  EXPECT_EQ(FormatParetoFront(study), "study s-4: no completed trial yet, so no front\n");
  for (int n = 0; n < 3; ++n) {
    v1::Trial* trial = study.add_trials();
    trial->set_number(n);
    trial->set_job_id("job-" + std::to_string(n + 1));
    trial->add_values(0.8 + 0.05 * n);
    trial->add_values(1000 * (n + 1));
    (*trial->mutable_params())["batch_size"].set_number_value(32 * (n + 1));
  }
  study.add_pareto_front(0);
  study.add_pareto_front(2);
  EXPECT_EQ(FormatParetoFront(study),
            "TRIAL  VAL_ACCURACY (max)  PARAMETERS (min)  JOB    PARAMS\n"
            "0      0.8                 1000              job-1  batch_size=32\n"
            "2      0.9                 3000              job-3  batch_size=96\n");
}

TEST(StudyListTest, OneRowPerStudy) {
  std::vector<v1::StudyStatus> studies(2);
  studies[0] = MakeStudy();
  studies[0].clear_trials();  // ListStudies leaves them out
  studies[1].set_study_id("s-2");
  studies[1].set_state(v1::STUDY_STATE_COMPLETED);
  studies[1].mutable_spec()->set_sampler("random");
  EXPECT_EQ(FormatStudyList(studies),
            "STUDY  NAME  STATE      SAMPLER  BUDGET  RUNNING  BEST_TRIAL  "
            "BEST_VALUE  EPOCHS\n"
            "s-1    fm    RUNNING    tpe      8       2        0           "
            "0.8812      8\n"
            "s-2    -     COMPLETED  random   -       0        -           "
            "-           0\n");
}

TEST(TrialLineTest, EachState) {
  const v1::StudyStatus study = MakeStudy();
  EXPECT_EQ(FormatTrialLine(study.trials(0), study),
            "trial 0 COMPLETED at epoch 4 value=0.8812 [best] "
            "(learning_rate=0.003123 batch_size=64 hidden=[256,128])");
  EXPECT_EQ(FormatTrialLine(study.trials(1), study),
            "trial 1 PRUNED at epoch 1 value=0.7 (learning_rate=1e-05 "
            "batch_size=32 hidden=[128]): pruned at rung 0");
  EXPECT_EQ(FormatTrialLine(study.trials(2), study),
            "trial 2 RUNNING job job-000003 epoch 2 value=0.85 "
            "(learning_rate=0.01 batch_size=128 hidden=[512,256])");
  EXPECT_EQ(FormatTrialLine(study.trials(3), study),
            "trial 3 QUEUED job job-000004 (retry 1) (learning_rate=0.02 "
            "batch_size=256 hidden=[128])");
}

TEST(StudyEventTest, LinesPerKind) {
  const v1::StudyStatus study = MakeStudy();
  v1::StudyEvent event;
  event.set_kind(v1::StudyEvent::KIND_REPORTED);
  *event.mutable_trial() = study.trials(2);
  event.set_best_trial(2);  // the event's best, not the study's
  event.set_best_value(0.85);
  EXPECT_EQ(FormatStudyEvent(event, study),
            "trial 2 epoch 2 value=0.85 [best]");

  event.set_kind(v1::StudyEvent::KIND_ENDED);
  *event.mutable_trial() = study.trials(1);
  EXPECT_EQ(FormatStudyEvent(event, study),
            "trial 1 PRUNED at epoch 1 value=0.7 (learning_rate=1e-05 "
            "batch_size=32 hidden=[128]): pruned at rung 0");

  event.set_kind(v1::StudyEvent::KIND_SNAPSHOT);
  *event.mutable_trial() = study.trials(2);
  EXPECT_EQ(FormatStudyEvent(event, study),
            "trial 2 RUNNING job job-000003 epoch 2 value=0.85 [best] "
            "(learning_rate=0.01 batch_size=128 hidden=[512,256])");

  v1::StudyEvent ended;
  ended.set_kind(v1::StudyEvent::KIND_STUDY_ENDED);
  ended.set_study_state(v1::STUDY_STATE_COMPLETED);
  ended.set_message("trial budget spent");
  ended.set_best_trial(0);
  ended.set_best_value(0.8812);
  EXPECT_EQ(FormatStudyEvent(ended, study),
            "study s-1 COMPLETED: trial budget spent; best trial 0 "
            "value=0.8812");
}

TEST(ApplyStudyEventTest, KeepsTheViewInStep) {
  const v1::StudyStatus full = MakeStudy();
  v1::StudyStatus view = full;
  view.mutable_trials()->DeleteSubrange(2, 1);  // trials 0, 1, 3

  // Trial 2 arrives: inserted in number order; counts recomputed.
  v1::StudyEvent event;
  event.set_kind(v1::StudyEvent::KIND_STARTED);
  event.set_study_state(v1::STUDY_STATE_RUNNING);
  *event.mutable_trial() = full.trials(2);
  event.set_best_trial(0);
  event.set_best_value(0.8812);
  ApplyStudyEvent(event, &view);
  ASSERT_EQ(view.trials_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(view.trials(i).number(), i);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(view, full));

  // Trial 2 completes with a new best.
  event.set_kind(v1::StudyEvent::KIND_ENDED);
  event.mutable_trial()->set_state(v1::TRIAL_STATE_COMPLETED);
  event.mutable_trial()->set_value(0.9);
  event.mutable_trial()->set_epochs_trained(4);
  event.set_best_trial(2);
  event.set_best_value(0.9);
  ApplyStudyEvent(event, &view);
  EXPECT_EQ(view.trials_size(), 4);
  EXPECT_EQ(view.trials(2).state(), v1::TRIAL_STATE_COMPLETED);
  EXPECT_EQ(view.trials_running(), 1);   // trial 3 only
  EXPECT_EQ(view.epochs_trained(), 10);  // 4 + 1 + 4 + 1
  EXPECT_EQ(view.best_trial(), 2);
  EXPECT_EQ(view.best_value(), 0.9);

  v1::StudyEvent ended;
  ended.set_kind(v1::StudyEvent::KIND_STUDY_ENDED);
  ended.set_study_state(v1::STUDY_STATE_CANCELLED);
  ended.set_message("cancelled");
  ended.set_best_trial(2);
  ended.set_best_value(0.9);
  ended.set_unix_seconds(1700000000);
  ApplyStudyEvent(ended, &view);
  EXPECT_EQ(view.trials_size(), 4);
  EXPECT_EQ(view.state(), v1::STUDY_STATE_CANCELLED);
  EXPECT_EQ(view.message(), "cancelled");
  EXPECT_EQ(view.ended_unix_seconds(), 1700000000);
}

TEST(BestTrialTest, SummaryWithExactValues) {
  v1::StudyStatus study = MakeStudy();
  EXPECT_EQ(FindBestTrial(study), &study.trials(0));
  EXPECT_EQ(FormatBestTrial(study),
            "study      s-1\n"
            "trial      0 (COMPLETED, 4 epochs)\n"
            "value      0.8812\n"
            "objective  val_accuracy (maximize)\n"
            "job        job-000001\n"
            "params     optimizer.learning_rate=0.0031234 batch_size=64 "
            "model.hidden=[256,128]\n");
  study.clear_best_trial();
  EXPECT_EQ(FindBestTrial(study), nullptr);
  EXPECT_EQ(FormatBestTrial(study), "study s-1: no trial has a value yet\n");
}

// A k-fold study: trial 0 completed as the mean of three folds, trial 2
// runs its three fold jobs.
v1::StudyStatus MakeFoldStudy() {
  v1::StudyStatus study = MakeStudy();
  study.mutable_spec()->set_folds(3);
  for (int number : {0, 2}) {
    v1::Trial& trial = *study.mutable_trials(number);
    for (int i = 0; i < 3; ++i) {
      v1::TrialFold& fold = *trial.add_folds();
      fold.set_fold(i);
      fold.set_job_id(absl::StrCat("job-0001", number, i));
      fold.set_value(std::vector<double>{0.80, 0.81, 0.82}[i]);
    }
  }
  study.mutable_trials(0)->set_value(0.81);
  study.mutable_trials(0)->set_value_spread(0.0081650);
  return study;
}

TEST(FoldsTest, TrialsShowTheirFoldsJobsAndSpread) {
  const v1::StudyStatus study = MakeFoldStudy();
  EXPECT_EQ(FormatTrialLine(study.trials(0), study),
            "trial 0 COMPLETED at epoch 4 value=0.81 spread=0.008165 [best] "
            "(learning_rate=0.003123 batch_size=64 hidden=[256,128])");
  EXPECT_EQ(FormatTrialLine(study.trials(2), study),
            "trial 2 RUNNING jobs job-000120,job-000121,job-000122 epoch 2 value=0.85 "
            "(learning_rate=0.01 batch_size=128 hidden=[512,256])");
  EXPECT_EQ(FormatBestTrial(study),
            "study      s-1\n"
            "trial      0 (COMPLETED, 4 epochs)\n"
            "value      0.81\n"
            "objective  val_accuracy (maximize)\n"
            "folds      mean of 3: 0.8 0.81 0.82 (spread 0.008165)\n"
            "jobs       job-000100,job-000101,job-000102\n"
            "params     optimizer.learning_rate=0.0031234 batch_size=64 "
            "model.hidden=[256,128]\n");
  const std::string csv = FormatStudyCsv(study);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "number,state,value,value_spread,epochs_trained,retries,job_id,"
            "optimizer.learning_rate,batch_size,model.hidden,epoch_1,epoch_2,epoch_3,epoch_4");
  EXPECT_THAT(csv, HasSubstr("\n0,COMPLETED,0.81,0.008165,4,0,"
                             "\"job-000100,job-000101,job-000102\",0.0031234,"));
}

TEST(CsvTest, FieldsQuotedPerRfc4180) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField(""), "");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField("cr\r"), "\"cr\r\"");
}

TEST(CsvTest, OneRowPerTrial) {
  v1::StudyStatus study = MakeStudy();
  // A parameter outside the spec's list, whose value needs quoting.
  (*study.mutable_trials(0)->mutable_params())["data.note"] = Text("a,\"b\"");
  EXPECT_EQ(FormatStudyCsv(study),
            "number,state,value,epochs_trained,retries,job_id,"
            "optimizer.learning_rate,batch_size,model.hidden,data.note,"
            "epoch_1,epoch_2,epoch_3,epoch_4\n"
            "0,COMPLETED,0.8812,4,0,job-000001,0.0031234,64,\"[256,128]\","
            "\"a,\"\"b\"\"\",0.6,0.75,0.86,0.8812\n"
            "1,PRUNED,0.7,1,0,job-000002,1e-05,32,[128],,0.7,,,\n"
            "2,RUNNING,0.85,2,0,job-000003,0.01,128,\"[512,256]\",,0.8,0.85,,\n"
            "3,QUEUED,,1,1,job-000004,0.02,256,[128],,,,,\n");
  EXPECT_EQ(FormatStudyCsv(v1::StudyStatus()),
            "number,state,value,epochs_trained,retries,job_id\n");
}

TEST(JsonTest, ReadsBackAsTheSameStatus) {
  const v1::StudyStatus study = MakeStudy();
  absl::StatusOr<std::string> json = MessageToJson(study);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"study_id\": \"s-1\""));
  EXPECT_EQ(json->back(), '\n');
  v1::StudyStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, study));
}

}  // namespace
}  // namespace mpilearn::opt
