#include "server/core/store/job_checkpoint.h"

#include <memory>
#include <string>
#include <vector>

#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

using Floats = std::vector<std::vector<float>>;

v1::JobSpec Spec(const std::string& algorithm, const std::string& optimizer) {
  v1::JobSpec spec;
  spec.set_algorithm(algorithm);
  spec.mutable_optimizer()->set_name(optimizer);
  spec.mutable_optimizer()->set_learning_rate(0.01);
  if (optimizer == "sgd") spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_easgd()->set_alpha(0.5);
  return spec;
}

WeightsSnapshot Weights() {
  WeightsSnapshot weights;
  weights.header = MakeFloat32Header(0, {"w", "b"}, {{2, 2}, {1}});
  weights.values = {{0.5f, -1.0f, 2.0f, 0.25f}, {3.0f}};
  return weights;
}

Floats Gradient(float s) { return {{s, -s, 2 * s, 0.5f * s}, {-s}}; }

std::unique_ptr<UpdateRule> NewRule(const v1::JobSpec& spec) {
  return UpdateRule::Create(spec, {4, 1}, EngineOptions()).value();
}

class JobCheckpointRoundTrip : public ::testing::TestWithParam<std::string> {};

// Encode after three steps, decode, and a fourth step of the decoded rule
// is bit-identical to that of the rule that never stopped.
TEST_P(JobCheckpointRoundTrip, DecodedRuleContinuesExactly) {
  const v1::JobSpec spec = Spec("downpour", GetParam());
  WeightsSnapshot weights = Weights();
  std::unique_ptr<UpdateRule> rule = NewRule(spec);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(rule->Apply(weights.values, Gradient(0.1f * step), 1.0f).ok());
  }
  weights.header.set_version(3);
  auto saved = EncodeJobCheckpoint(weights, *rule, /*updates_applied=*/3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->optimizer_state.header().version(), 3u);  // steps

  auto decoded = DecodeJobCheckpoint(*saved, spec, EngineOptions(), "job-1");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->weights.header.version(), 3u);
  EXPECT_EQ(decoded->weights.values, weights.values);
  ASSERT_NE(decoded->rule->optimizer(), nullptr);
  EXPECT_EQ(decoded->rule->optimizer()->steps(), 3);

  ASSERT_TRUE(rule->Apply(weights.values, Gradient(-0.7f), 1.0f).ok());
  ASSERT_TRUE(
      decoded->rule->Apply(decoded->weights.values, Gradient(-0.7f), 1.0f).ok());
  EXPECT_EQ(decoded->weights.values, weights.values);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, JobCheckpointRoundTrip,
                         ::testing::Values("sgd", "adam", "rmsprop", "adagrad"));

TEST(JobCheckpointTest, RulesWithoutOptimizerStoreUpdateCount) {
  for (const char* algorithm : {"easgd", "gem"}) {
    const v1::JobSpec spec = Spec(algorithm, "adam");
    auto saved = EncodeJobCheckpoint(Weights(), *NewRule(spec), 17);
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->optimizer_state.header().version(), 17u);
    EXPECT_EQ(saved->optimizer_state.header().tensors_size(), 0);
    auto decoded = DecodeJobCheckpoint(*saved, spec, EngineOptions(), "job-1");
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->rule->kind(), UpdateKindOf(AlgorithmOf(spec)));
    EXPECT_EQ(decoded->weights.values, Weights().values);
  }
}

TEST(JobCheckpointTest, StateThatDoesNotFitIsAnInternalError) {
  // Adam's state decoded for sgd with momentum: the buffers differ.
  auto adam = EncodeJobCheckpoint(Weights(), *NewRule(Spec("sync", "adam")), 0);
  ASSERT_TRUE(adam.ok());
  auto as_sgd = DecodeJobCheckpoint(*adam, Spec("sync", "sgd"), EngineOptions(),
                                    "job-1");
  EXPECT_EQ(as_sgd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(as_sgd.status()), v1::ERROR_REASON_INTERNAL);

  // Optimizer state for a job whose algorithm keeps none on the master.
  auto as_easgd = DecodeJobCheckpoint(*adam, Spec("easgd", "adam"),
                                      EngineOptions(), "job-1");
  EXPECT_EQ(as_easgd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(as_easgd.status().message().find("job-1"), std::string::npos);
  EXPECT_EQ(ReasonOf(as_easgd.status()), v1::ERROR_REASON_INTERNAL);
}

TEST(JobCheckpointTest, FileCarriesEveryPartAndGivesTheTensorsBack) {
  const v1::JobSpec spec = Spec("gem", "adam");
  auto tensors = EncodeJobCheckpoint(Weights(), *NewRule(spec), 5);
  ASSERT_TRUE(tensors.ok());
  v1::JobStatus status;
  status.set_job_id("job-1");
  v1::CheckpointQueue queue;
  queue.set_train_samples(60);
  UpdateStats stats;
  stats.Applied(2);
  stats.Applied(4);
  v1::JobCheckpointFile file =
      MakeCheckpointFile(status, *tensors, queue, stats, absl::FromUnixSeconds(77));
  EXPECT_EQ(file.status().job_id(), "job-1");
  EXPECT_EQ(file.queue().train_samples(), 60);
  EXPECT_EQ(file.staleness_sum(), 6u);
  EXPECT_EQ(file.staleness_count(), 2u);
  EXPECT_DOUBLE_EQ(file.created_unix_seconds(), 77.0);

  const JobCheckpoint back = TakeCheckpointTensors(file);
  auto decoded = DecodeJobCheckpoint(back, spec, EngineOptions(), "job-1");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->weights.values, Weights().values);
}

TEST(CheckpointScheduleTest, DueByUpdatesSecondsAndChanges) {
  v1::CheckpointSpec spec;
  spec.set_every_updates(10);
  spec.set_every_seconds(60);
  CheckpointSchedule schedule(spec);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kChanges, 0, false, t0));
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kUpdates, 9, false, t0));
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kUpdates, 10, false, t0));
  schedule.Changed();
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kChanges, 0, false, t0));
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kSeconds, 0, false, t0));
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kSeconds, 0, /*ended=*/true, t0));

  schedule.Taken(10, t0);
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kChanges, 10, false, t0));
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kUpdates, 19, false, t0));
  schedule.Changed(3);
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kSeconds, 10, false,
                            t0 + absl::Seconds(59)));
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kSeconds, 10, false,
                           t0 + absl::Seconds(60)));
  EXPECT_EQ(schedule.written_version(), 0u);
  schedule.Written(10);
  EXPECT_EQ(schedule.written_version(), 10u);
  schedule.Resumed(30);
  EXPECT_EQ(schedule.written_version(), 30u);
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kChanges, 30, false, t0));
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kUpdates, 40, false, t0));
}

// Update checkpoints stay on the grid of multiples of every_updates when a
// timed one came in between (what lets shards' checkpoints line up).
TEST(CheckpointScheduleTest, UpdatesTriggerOnTheGridOfMultiples) {
  v1::CheckpointSpec spec;
  spec.set_every_updates(10);
  spec.set_every_seconds(60);
  CheckpointSchedule schedule(spec);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  schedule.Taken(13, t0);  // a timed checkpoint between 10 and 20
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kUpdates, 19, false, t0));
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kUpdates, 20, false, t0));
  schedule.Taken(20, t0);
  EXPECT_FALSE(schedule.Due(CheckpointTrigger::kUpdates, 29, false, t0));
  // A version that jumped past a multiple (several updates at once).
  EXPECT_TRUE(schedule.Due(CheckpointTrigger::kUpdates, 31, false, t0));
}

}  // namespace
}  // namespace mpilearn::server
