// A job's learning-rate schedule drives its optimizer: each update steps
// the weights by the scheduled rate (plain SGD, so the step is the rate
// times the gradient, checked against rates written out by hand), the
// status shows the rate of the next update, a plateau lowers it after its
// patience, a schedule by epochs moves at epoch ends and is in the
// history, and a job resumed from a checkpoint goes on with the same rate.
// The schedules themselves are checked against PyTorch in
// common/schedule/lr_schedule_test.
#include <cmath>
#include <memory>
#include <vector>

#include "common/spec/job_config.h"
#include "common/spec/job_spec.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/job.h"

namespace mpilearn::server {
namespace {

constexpr double kBase = 0.1;

std::unique_ptr<Job> NewJob(v1::JobSpec spec) {
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(kBase);
  spec.mutable_data()->set_train_images("i.gz");
  spec.mutable_data()->set_train_labels("l.gz");
  EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
  auto job = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  EXPECT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
  EXPECT_TRUE(job->InitWeights(MakeFloat32Header(0, {"w"}, {{1}}), {{0.0f}}).value());
  return job;
}

// One update of gradient 1: returns how far the weight moved.
double Step(Job& job) {
  const float before = job.Weights().value()->values[0][0];
  GradientUpdate update;
  update.group_id = "g";
  update.base_version = job.Weights().value()->header.version();
  update.values = {{1.0f}};
  EXPECT_TRUE(job.ApplyGradient(update, absl::Now()).ok());
  return static_cast<double>(before) - job.Weights().value()->values[0][0];
}

TEST(JobScheduleTest, EachUpdateStepsByTheScheduledRate) {
  v1::JobSpec spec;
  v1::LrScheduleSpec* schedule = spec.mutable_optimizer()->mutable_schedule();
  schedule->set_name("step");
  schedule->set_step_size(3);
  schedule->set_gamma(0.5);
  schedule->set_warmup(4);
  schedule->set_warmup_start_factor(0.25);
  std::unique_ptr<Job> job = NewJob(spec);
  for (int k = 0; k < 12; ++k) {
    // Warm-up from 0.25 * base over 4 updates, then halved every 3.
    const double want =
        k < 4 ? kBase * (0.25 + 0.75 * k / 4.0) : kBase * std::pow(0.5, (k - 4) / 3);
    EXPECT_NEAR(job->Status(false, absl::Now()).learning_rate(), want, 1e-12) << "update " << k;
    const double moved = Step(*job);
    // The weight is fp32: the step is the rate to about 1e-7 of the weight.
    EXPECT_NEAR(moved, want, 1e-6) << "update " << k;
  }
}

TEST(JobScheduleTest, APlateauLowersTheRateAndAResumedJobKeepsIt) {
  v1::JobSpec spec;
  v1::LrScheduleSpec* schedule = spec.mutable_optimizer()->mutable_schedule();
  schedule->set_name("plateau");
  schedule->set_patience(2);
  schedule->set_factor(0.5);
  std::unique_ptr<Job> job = NewJob(spec);
  // Improving, then three validations without improvement: more than the
  // patience of 2, so the rate halves.
  const std::vector<double> losses = {0.9, 0.8, 0.8, 0.81, 0.8};
  for (size_t i = 0; i < losses.size(); ++i) {
    v1::ValidationRecord record;
    record.set_version(i);
    record.set_val_loss(losses[i]);
    record.set_source("pool");
    ValidationEffect effect;
    ASSERT_TRUE(job->RecordValidation(record, absl::Now(), &effect).ok());
    const double want = i < 4 ? kBase : kBase / 2;
    EXPECT_DOUBLE_EQ(job->Status(false, absl::Now()).learning_rate(), want) << "validation " << i;
  }
  EXPECT_NEAR(Step(*job), kBase / 2, 1e-6);
  // The validations are in the checkpoint: the resumed job's plateau is
  // where it was.
  absl::StatusOr<v1::JobCheckpointFile> file = job->SaveCheckpoint(absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  Job resumed("job-1", job->config());
  ASSERT_TRUE(resumed.Resume(*file).ok());
  EXPECT_DOUBLE_EQ(resumed.Status(false, absl::Now()).learning_rate(), kBase / 2);
}

// Unit "epochs": the rate changes when an epoch's last unit completes, and
// each epoch's record keeps the rate its updates used.
TEST(JobScheduleTest, AnEpochScheduleMovesAtEpochEndsAndIsInTheHistory) {
  v1::JobSpec spec;
  v1::LrScheduleSpec* schedule = spec.mutable_optimizer()->mutable_schedule();
  schedule->set_name("step");
  schedule->set_unit("epochs");
  schedule->set_step_size(1);
  schedule->set_gamma(0.5);
  spec.set_epochs(3);
  spec.set_data_unit_size(8);  // one unit per epoch of 8 samples
  std::unique_ptr<Job> job = NewJob(spec);
  v1::NextDataUnitRequest request;
  request.set_job_id("job-1");
  request.set_group_id("g");
  request.set_train_samples(8);
  for (int epoch = 0; epoch < 3; ++epoch) {
    absl::StatusOr<v1::NextDataUnitResponse> next = job->NextDataUnit(request, absl::Now());
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_EQ(next->action(), v1::NextDataUnitResponse::TRAIN);
    const double want = kBase * std::pow(0.5, epoch);
    EXPECT_NEAR(Step(*job), want, 1e-6) << "epoch " << epoch;
    EXPECT_NEAR(Step(*job), want, 1e-6) << "epoch " << epoch;
    request.clear_completed();
    v1::CompletedUnit* done = request.add_completed();
    done->set_unit_id(next->unit().unit_id());
    done->set_samples(8);
    done->set_loss_sum(8);
  }
  ASSERT_TRUE(job->NextDataUnit(request, absl::Now()).ok());
  const v1::JobStatus status = job->Status(/*with_history=*/true, absl::Now());
  ASSERT_EQ(status.history_size(), 3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_DOUBLE_EQ(status.history(epoch).learning_rate(), kBase * std::pow(0.5, epoch));
  }
  EXPECT_DOUBLE_EQ(status.learning_rate(), kBase / 8);
}

}  // namespace
}  // namespace mpilearn::server
