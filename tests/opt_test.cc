// MPI Opt end to end: a study of Fashion-MNIST trials on a real master,
// served by two real `mpirun ... mpilearn-worker --serve` groups, with TPE
// and ASHA pruning. The master is SIGKILLed mid-study and restarted on the
// same state directory; the study completes with every trial accounted for
// and no trial's job run twice (docs/opt.md, "Restarts"). A study of two
// objectives over real training, whose front is checked by brute force. And
// a 3-fold study, each trial three real jobs holding out a third each, whose
// values are the means of its jobs' values.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/client/master_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/study.grpc.pb.h"
#include "tests/study_helpers.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

// A log-scaled learning-rate parameter of [low, high].
void AddLearningRate(v1::StudySpec& spec, double low, double high) {
  v1::ParameterSpec* lr = spec.add_parameters();
  lr->set_path("optimizer.learning_rate");
  lr->mutable_real()->set_low(low);
  lr->mutable_real()->set_high(high);
  lr->mutable_real()->set_log(true);
}

v1::StudySpec FashionMnistStudy() {
  v1::StudySpec spec;
  spec.set_name("e2e");
  v1::JobSpec& base = *spec.mutable_base();
  base = FashionMnistSubset("downpour", 3000, 4);
  base.mutable_checkpoint()->set_every_updates(20);
  AddLearningRate(spec, 3e-4, 3e-2);
  v1::ParameterSpec* batch = spec.add_parameters();
  batch->set_path("batch_size");
  batch->mutable_int_()->set_low(32);
  batch->mutable_int_()->set_high(128);
  batch->mutable_int_()->set_step(32);
  v1::ParameterSpec* hidden = spec.add_parameters();
  hidden->set_path("model.hidden");
  for (const std::vector<int>& widths :
       std::vector<std::vector<int>>{{64}, {256, 128}}) {
    google::protobuf::ListValue* list = hidden->mutable_categorical()
                                            ->add_choices()
                                            ->mutable_list_value();
    for (int width : widths) list->add_values()->set_number_value(width);
  }
  spec.set_sampler("tpe");
  spec.mutable_tpe()->set_startup_trials(4);
  spec.set_trials(8);
  spec.set_parallelism(2);
  spec.mutable_pruner()->set_name("asha");
  spec.mutable_pruner()->set_min_resource(1);
  spec.mutable_pruner()->set_reduction_factor(2);
  spec.set_seed(3);
  return spec;
}

int Ended(const v1::StudyStatus& status) {
  int ended = 0;
  for (const v1::Trial& trial : status.trials()) {
    ended += trial.state() != v1::TRIAL_STATE_QUEUED &&
             trial.state() != v1::TRIAL_STATE_RUNNING;
  }
  return ended;
}

// Two serving groups of one rank each train the study's trials until it
// ends (at most 300 s); `done` is the study then, `logs` the groups' logs.
struct Served {
  std::vector<std::unique_ptr<ChildProcess>> groups;
  absl::StatusOr<v1::StudyStatus> done;
  std::string logs;
};

Served ServeUntilEnded(const std::string& address, const std::string& dir,
                       v1::Studies::Stub& stub, const std::string& id) {
  Served served;
  for (int g = 0; g < 2; ++g) {
    auto group = StartWorkers(1, address,
                              {"--serve", "--threads=1", "--exit_when_idle_s=10",
                               "--progress=off"},
                              absl::StrCat(dir, "/group-", g, ".log"));
    if (!group.ok()) {
      served.done = group.status();
      return served;
    }
    served.groups.push_back(std::move(group).value());
  }
  served.done = WaitForStudy(stub, id, absl::Seconds(300), [](const v1::StudyStatus& s) {
    return s.state() != v1::STUDY_STATE_RUNNING;
  });
  for (auto& group : served.groups) absl::StrAppend(&served.logs, group->Log(), "\n----\n");
  return served;
}

TEST(OptTest, StudyWithPruningSurvivesAMasterKill) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("opt_test");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Studies::NewStub(channel);

  absl::StatusOr<std::string> created = CreateStudy(*stub, FashionMnistStudy());
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = *created;

  // Two groups of one rank each, serving whatever the queue holds.
  std::vector<std::unique_ptr<ChildProcess>> groups;
  for (int g = 0; g < 2; ++g) {
    auto group = StartWorkers(1, address,
                              {"--serve", "--threads=1",
                               "--reconnect_timeout_s=60",
                               "--exit_when_idle_s=20", "--progress=off"},
                              absl::StrCat(dir, "/group-", g, ".log"));
    ASSERT_TRUE(group.ok()) << group.status();
    groups.push_back(std::move(group).value());
  }
  auto logs = [&] {
    std::string all;
    for (auto& group : groups) absl::StrAppend(&all, group->Log(), "\n----\n");
    return all;
  };

  // Mid-study: some trials ended, others in flight.
  auto before = WaitForStudy(*stub, id, absl::Seconds(240),
                             [](const v1::StudyStatus& s) {
                               return Ended(s) >= 3 && s.trials_running() > 0;
                             });
  ASSERT_TRUE(before.ok()) << before.status() << logs();
  ASSERT_EQ(kill((*master)->process().pid(), SIGKILL), 0);
  ASSERT_TRUE((*master)->process().Wait(absl::Seconds(10)).has_value());
  const std::string port = address.substr(address.rfind(':') + 1);
  auto restarted = MasterProcess::Start(dir, {"--listen=127.0.0.1:" + port});
  ASSERT_TRUE(restarted.ok()) << restarted.status();

  auto done = WaitForStudy(*stub, id, absl::Seconds(400),
                           [](const v1::StudyStatus& s) {
                             return s.state() != v1::STUDY_STATE_RUNNING;
                           });
  ASSERT_TRUE(done.ok()) << done.status() << logs();
  EXPECT_EQ(done->state(), v1::STUDY_STATE_COMPLETED) << done->message();
  ASSERT_EQ(done->trials_size(), 8);

  // Every trial ended with a value, none lost; ASHA pruned some.
  int pruned = 0;
  for (const v1::Trial& trial : done->trials()) {
    EXPECT_TRUE(trial.state() == v1::TRIAL_STATE_COMPLETED ||
                trial.state() == v1::TRIAL_STATE_PRUNED)
        << trial.DebugString();
    EXPECT_TRUE(trial.has_value()) << trial.DebugString();
    EXPECT_EQ(trial.retries(), 0) << trial.DebugString();
    pruned += trial.state() == v1::TRIAL_STATE_PRUNED;
    if (trial.state() == v1::TRIAL_STATE_COMPLETED) {
      EXPECT_EQ(trial.epochs_done(), 4) << trial.DebugString();
    }
  }
  EXPECT_GE(pruned, 1);
  // A configuration above a stated accuracy (4 epochs on 3,000 images).
  ASSERT_TRUE(done->has_best_value());
  EXPECT_GE(done->best_value(), 0.75);

  // No trial ran twice: the master holds exactly one job per trial, and it
  // is the trial's.
  auto client = MasterClient::Connect(address).value();
  const std::vector<v1::JobStatus> jobs = client->ListJobs().value();
  std::map<std::string, std::string> job_of_name;
  for (const v1::JobStatus& job : jobs) {
    if (!absl::StartsWith(job.spec().name(), id + "/")) continue;
    EXPECT_TRUE(job_of_name.emplace(job.spec().name(), job.job_id()).second)
        << "two jobs named " << job.spec().name();
  }
  ASSERT_EQ(job_of_name.size(), 8u);
  for (const v1::Trial& trial : done->trials()) {
    ASSERT_EQ(trial.job_ids_size(), 1) << trial.DebugString();
    EXPECT_EQ(job_of_name[absl::StrCat(id, "/trial-", trial.number())],
              trial.job_id());
  }

  for (auto& group : groups) {
    const std::optional<int> code = group->Wait(absl::Seconds(120));
    EXPECT_EQ(code.value_or(-1), 0) << logs();
  }
}

// Two objectives over real training (docs/opt.md, "Several objectives"):
// accuracy up, parameter count down, over the MLP's width and the learning
// rate. Every trial records both values as its job reported them, and the
// study's front is the brute-force front of its own trials.
TEST(OptTest, TwoObjectivesOverRealTrainingGiveTheParetoFront) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("opt_front");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  auto stub = v1::Studies::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  v1::StudySpec spec;
  spec.set_name("front");
  *spec.mutable_base() = FashionMnistSubset("downpour", 4000, 2);
  v1::ParameterSpec* hidden = spec.add_parameters();
  hidden->set_path("model.hidden");
  for (int width : {8, 32, 128}) {
    hidden->mutable_categorical()->add_choices()->mutable_list_value()->add_values()
        ->set_number_value(width);
  }
  AddLearningRate(spec, 1e-3, 1e-2);
  spec.add_objectives()->set_metric("val_accuracy");
  spec.add_objectives()->set_metric("parameters");
  spec.set_trials(6);
  spec.set_parallelism(2);
  absl::StatusOr<std::string> created = CreateStudy(*stub, spec);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = *created;

  Served served = ServeUntilEnded(address, dir, *stub, id);
  const std::string& logs = served.logs;
  ASSERT_TRUE(served.done.ok()) << served.done.status() << logs;
  const absl::StatusOr<v1::StudyStatus>& done = served.done;
  ASSERT_EQ(done->state(), v1::STUDY_STATE_COMPLETED) << done->message();
  EXPECT_EQ(done->spec().sampler(), "nsga2");
  EXPECT_FALSE(done->has_best_trial());

  auto client = MasterClient::Connect(address).value();
  std::vector<int> front;
  for (const v1::Trial& a : done->trials()) {
    ASSERT_EQ(a.state(), v1::TRIAL_STATE_COMPLETED) << a.DebugString();
    ASSERT_EQ(a.values_size(), 2) << a.DebugString();
    // The values are the job's: its last validation's accuracy and its
    // parameter count (784 w + w + 10 w + 10 for one hidden layer of w).
    const v1::JobStatus job = client->GetJobStatus(a.job_id()).value();
    ASSERT_GT(job.validations_size(), 0);
    EXPECT_EQ(a.values(0), job.validations(job.validations_size() - 1).val_accuracy());
    const double w = a.params().at("model.hidden").list_value().values(0).number_value();
    EXPECT_EQ(a.values(1), 795 * w + 10);
    EXPECT_EQ(static_cast<double>(job.parameters()), a.values(1));
    bool dominated = false;
    for (const v1::Trial& b : done->trials()) {
      dominated = dominated || (b.values(0) >= a.values(0) && b.values(1) <= a.values(1) &&
                                (b.values(0) > a.values(0) || b.values(1) < a.values(1)));
    }
    if (!dominated) front.push_back(a.number());
  }
  EXPECT_EQ(std::vector<int>(done->pareto_front().begin(), done->pareto_front().end()), front);
  for (auto& group : served.groups) {
    EXPECT_EQ(group->Wait(absl::Seconds(120)).value_or(-1), 0) << logs;
  }
}

TEST(OptTest, AThreeFoldStudyScoresTheMeanOfItsJobs) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("opt_folds");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  auto stub = v1::Studies::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  v1::StudySpec spec;
  spec.set_name("folds");
  *spec.mutable_base() = FashionMnistSubset("downpour", 4500, 2);
  spec.mutable_base()->mutable_data()->clear_validation_count();  // the folds choose
  AddLearningRate(spec, 1e-3, 1e-2);
  spec.set_sampler("random");
  spec.set_folds(3);
  spec.set_trials(2);
  spec.set_parallelism(1);
  absl::StatusOr<std::string> created = CreateStudy(*stub, spec);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = *created;

  Served served = ServeUntilEnded(address, dir, *stub, id);
  const std::string& logs = served.logs;
  ASSERT_TRUE(served.done.ok()) << served.done.status() << logs;
  const absl::StatusOr<v1::StudyStatus>& done = served.done;
  ASSERT_EQ(done->state(), v1::STUDY_STATE_COMPLETED) << done->message();
  ASSERT_EQ(done->trials_size(), 2);

  auto client = MasterClient::Connect(address).value();
  for (const v1::Trial& trial : done->trials()) {
    ASSERT_EQ(trial.state(), v1::TRIAL_STATE_COMPLETED) << trial.DebugString();
    ASSERT_EQ(trial.folds_size(), 3);
    // Each fold's value read back from its own job: the best validation
    // accuracy of its epochs, on its own 1,500 held-out images (it trains on
    // the other 3,000).
    std::vector<double> values;
    for (int i = 0; i < 3; ++i) {
      const v1::JobStatus job = client->GetJobStatus(trial.folds(i).job_id()).value();
      EXPECT_EQ(job.spec().name(), absl::StrCat(id, "/trial-", trial.number(), "/fold-", i));
      EXPECT_EQ(job.spec().data().folds(), 3);
      EXPECT_EQ(job.spec().data().fold(), i);
      EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED);
      EXPECT_EQ(job.samples_per_epoch(), 3000u);  // two of the three blocks
      double best = -1;
      for (const v1::ValidationRecord& record : job.validations()) {
        if (record.epoch() < 1) continue;
        best = std::max(best, record.val_accuracy());
      }
      EXPECT_GT(best, 0.6) << "fold " << i << " did not learn";
      EXPECT_EQ(trial.folds(i).value(), best);
      values.push_back(best);
    }
    const double mean = (values[0] + values[1] + values[2]) / 3;
    double squares = 0;
    for (double v : values) squares += (v - mean) * (v - mean);
    EXPECT_DOUBLE_EQ(trial.value(), mean);
    EXPECT_NEAR(trial.value_spread(), std::sqrt(squares / 3), 1e-12);
  }
  for (auto& group : served.groups) {
    EXPECT_EQ(group->Wait(absl::Seconds(120)).value_or(-1), 0) << logs;
  }
}

}  // namespace
}  // namespace mpilearn::testing
