// Job in isolation: update rules through the job, staleness, validation of
// updates, checkpoints and resume, the data queue, stop rules, reasons.
// Over ~500 lines because these are the job's end-to-end scenarios (the
// parts have their own short tests: data_queue_test, group_table_test,
// update_rule_test, job_checkpoint_test); each case stands alone.
#include "server/core/job.h"

#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

v1::JobSpec SpecWith(const std::string& optimizer) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_name(optimizer);
  spec.mutable_optimizer()->set_learning_rate(0.01);
  if (optimizer == "sgd") spec.mutable_optimizer()->set_momentum(0.9);
  return spec;
}

std::vector<std::vector<float>> Random(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<std::vector<float>> out = {std::vector<float>(12),
                                         std::vector<float>(3)};
  for (auto& v : out) {
    for (float& x : v) x = dist(rng);
  }
  return out;
}

// A job with weights installed and one registered group "g".
std::unique_ptr<Job> NewJob(const std::string& optimizer, bool init = true) {
  auto job = std::make_unique<Job>("job-1", JobConfig::FromNormalized(SpecWith(optimizer)));
  EXPECT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
  if (init) {
    EXPECT_TRUE(job->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                 Random(1))
                    .value());
  }
  return job;
}

GradientUpdate Update(uint32_t seed) {
  GradientUpdate update;
  update.group_id = "g";
  update.values = Random(seed);
  return update;
}

class JobCheckpointTest : public ::testing::TestWithParam<std::string> {};

// Checkpoint after 3 updates, restore into a fresh job, and the 4th update
// gives bit-identical weights to a job that never stopped: the optimizer
// state (moments, step count for bias correction) travels with the weights.
TEST_P(JobCheckpointTest, RestoredJobContinuesExactly) {
  auto uninterrupted = NewJob(GetParam());
  for (uint32_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(uninterrupted->ApplyGradient(Update(10 + step), absl::Now()).ok());
  }
  auto checkpoint = uninterrupted->Checkpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->weights.header().version(), 3u);
  EXPECT_EQ(checkpoint->optimizer_state.header().version(), 3u);  // steps

  auto restored = NewJob(GetParam(), /*init=*/false);
  ASSERT_TRUE(restored->Restore(*checkpoint).ok());
  auto a = uninterrupted->ApplyGradient(Update(99), absl::Now());
  auto b = restored->ApplyGradient(Update(99), absl::Now());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->values, (*b)->values);
  EXPECT_EQ((*a)->header.version(), (*b)->header.version());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, JobCheckpointTest,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop",
                                           "adadelta", "adagrad"));

TEST(JobCheckpointTest, StateNamesBufferAndTensor) {
  auto job = NewJob("adam");
  auto checkpoint = job->Checkpoint().value();
  const v1::TensorSetHeader& header = checkpoint.optimizer_state.header();
  ASSERT_EQ(header.tensors_size(), 4);
  EXPECT_EQ(header.tensors(0).name(), "exp_avg/w");
  EXPECT_EQ(header.tensors(3).name(), "exp_avg_sq/b");
}

TEST(JobCheckpointTest, MismatchedStateIsRejected) {
  auto adam = NewJob("adam");
  auto checkpoint = adam->Checkpoint().value();
  // An SGD-with-momentum job cannot take Adam's two moment buffers.
  auto sgd = NewJob("sgd", /*init=*/false);
  absl::Status status = sgd->Restore(checkpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("optimizer state holds 4 tensors"),
            std::string::npos)
      << status;
  // A job that already has weights refuses a restore.
  EXPECT_EQ(adam->Restore(checkpoint).code(),
            absl::StatusCode::kFailedPrecondition);
  // Truncated data is reported as data loss.
  checkpoint.optimizer_state.mutable_data(0)->resize(5);
  auto fresh = NewJob("adam", /*init=*/false);
  EXPECT_EQ(fresh->Restore(checkpoint).code(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------
// Updates by algorithm, staleness, NaN checks.

// A job with one group "g" and weights w = `w` (one tensor, shape {n}).
std::unique_ptr<Job> JobWithWeights(const v1::JobSpec& spec,
                                    const std::vector<float>& w) {
  auto job = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  EXPECT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
  EXPECT_TRUE(job->InitWeights(
                     MakeFloat32Header(0, {"w"},
                                       {{static_cast<int64_t>(w.size())}}),
                     {w})
                  .value());
  return job;
}

// Plain SGD (no momentum) with learning rate 0.5: w -= 0.5 * g.
v1::JobSpec PlainSgd() {
  v1::JobSpec spec;
  spec.set_algorithm("downpour");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.5);
  spec.mutable_optimizer()->set_momentum(0.0);
  return spec;
}

GradientUpdate UpdateOf(v1::UpdateKind kind, uint64_t base_version,
                        std::vector<float> values) {
  GradientUpdate update;
  update.group_id = "g";
  update.kind = kind;
  update.base_version = base_version;
  update.values = {std::move(values)};
  return update;
}

std::vector<float> CurrentWeights(const Job& job) {
  return job.Weights().value()->values[0];
}

std::vector<std::vector<float>> CurrentWeightsOf(const Job& job) {
  return job.Weights().value()->values;
}

// Buffers (TensorInfo.buffer) take the pushed value whatever the rule:
// here SGD steps the parameter and the buffer is replaced.
TEST(JobBufferTest, UpdatesReplaceBuffersAndStepParameters) {
  for (const std::string algorithm : {"downpour", "easgd", "gem"}) {
    SCOPED_TRACE(algorithm);
    v1::JobSpec spec = PlainSgd();
    spec.set_algorithm(algorithm);
    spec.mutable_easgd()->set_alpha(0.5);
    auto job = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
    ASSERT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
    v1::TensorSetHeader header =
        MakeFloat32Header(0, {"w", "bn.running_mean"}, {{2}, {2}});
    header.mutable_tensors(1)->set_buffer(true);
    ASSERT_TRUE(job->InitWeights(header, {{1.0f, 2.0f}, {0.0f, 0.0f}}).value());
    GradientUpdate update =
        UpdateOf(UpdateKindOf(AlgorithmOf(spec)), 0, {0.5f, -0.5f});
    update.values.push_back({3.0f, -4.0f});
    ASSERT_TRUE(job->ApplyGradient(update, absl::Now()).ok());
    const std::vector<std::vector<float>> weights = CurrentWeightsOf(*job);
    EXPECT_EQ(weights[1], (std::vector<float>{3.0f, -4.0f}));
    // The parameter follows the algorithm's rule: SGD w - 0.5 g, elastic
    // w + 0.5 (x - w), delta w + d.
    const std::vector<float> expected =
        algorithm == "downpour" ? std::vector<float>{0.75f, 2.25f}
        : algorithm == "easgd"  ? std::vector<float>{0.75f, 0.75f}
                                : std::vector<float>{1.5f, 1.5f};
    EXPECT_EQ(weights[0], expected);
  }
}

TEST(JobStalenessTest, BoundRejectsWithAbortedAndCounts) {
  v1::JobSpec spec = PlainSgd();
  spec.set_max_staleness(2);
  auto job = JobWithWeights(spec, {4, 8});
  // Staleness 0, 1, 2: all within the bound.
  for (uint64_t applied = 0; applied < 3; ++applied) {
    ASSERT_TRUE(job->ApplyGradient(
                       UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {0, 0}), absl::Now())
                    .ok());
  }
  // At version 3 a gradient on version 0 has staleness 3 > 2.
  auto stale = job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1, 1}),
                                  absl::Now());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stale.status().message(),
            "stale update: computed on weight version 0, the master is at 3 "
            "(staleness 3 > max_staleness 2); pull the weights and continue");
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{4, 8}));

  const v1::JobStatus status = job->Status(false, absl::Now());
  EXPECT_EQ(status.version(), 3u);
  EXPECT_EQ(status.updates_applied(), 3u);
  EXPECT_EQ(status.stale_rejected(), 1u);
  EXPECT_EQ(status.max_staleness_seen(), 2u);
  EXPECT_DOUBLE_EQ(status.mean_staleness(), 1.0);  // (0 + 1 + 2) / 3
  ASSERT_EQ(status.groups_size(), 1);
  EXPECT_EQ(status.groups(0).updates_applied(), 3u);
}

// With "inverse", a gradient of staleness 2 takes half a step.
TEST(JobStalenessTest, InverseScalingHalvesStepAtStalenessTwo) {
  v1::JobSpec spec = PlainSgd();
  spec.set_staleness_scaling("inverse");
  auto job = JobWithWeights(spec, {4, 8});
  const std::vector<double> g = {1, 2};
  std::vector<double> w = {4, 8};  // reference, in double
  auto step = [&](uint64_t base, double scale) {
    auto out = job->ApplyGradient(
        UpdateOf(v1::UPDATE_KIND_GRADIENT, base,
                 {static_cast<float>(g[0]), static_cast<float>(g[1])}),
        absl::Now());
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * scale * g[i];
    EXPECT_EQ((*out)->values[0],
              (std::vector<float>{static_cast<float>(w[0]),
                                  static_cast<float>(w[1])}));
  };
  step(0, 1.0);  // staleness 0: full step -> {3.5, 7}
  step(1, 1.0);  // staleness 0 -> {3, 6}
  step(0, 0.5);  // version 2, computed on 0: staleness 2 -> {2.75, 5.5}
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{2.75f, 5.5f}));
  step(2, 1.0);  // staleness 1: 1 / max(1, 1) = 1 -> {2.25, 4.5}
  const v1::JobStatus status = job->Status(false, absl::Now());
  EXPECT_EQ(status.max_staleness_seen(), 2u);
  EXPECT_DOUBLE_EQ(status.mean_staleness(), 0.75);  // (0 + 0 + 2 + 1) / 4
  EXPECT_EQ(status.stale_rejected(), 0u);
}

// EASGD: the centre c moves by alpha * (x - c); the reply is c before.
TEST(JobAlgorithmTest, ElasticMovesCentreAndRepliesOldCentre) {
  v1::JobSpec spec;
  spec.set_algorithm("easgd");
  spec.mutable_easgd()->set_alpha(0.25);
  auto job = JobWithWeights(spec, {1, 2, -4});
  auto reply = job->ApplyGradient(
      UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {3, 2, 0}), absl::Now());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ((*reply)->values[0], (std::vector<float>{1, 2, -4}));
  EXPECT_EQ((*reply)->header.version(), 0u);
  // 1 + 0.25 * (3 - 1) = 1.5;  2 + 0 = 2;  -4 + 0.25 * (0 + 4) = -3.
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{1.5f, 2, -3}));
  EXPECT_EQ(job->Weights().value()->header.version(), 1u);
  // The reply handed out is not touched by the next move.
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 1, {1.5f, 6, -3}),
                                 absl::Now())
                  .ok());
  EXPECT_EQ((*reply)->values[0], (std::vector<float>{1, 2, -4}));
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{1.5f, 3, -3}));
}

TEST(JobAlgorithmTest, ElasticAlphaScalesWithStaleness) {
  v1::JobSpec spec;
  spec.set_algorithm("easgd");
  spec.mutable_easgd()->set_alpha(0.5);
  spec.set_staleness_scaling("inverse");
  auto job = JobWithWeights(spec, {0});
  // Two moves with staleness 0 then 1 (scale 1): 0 -> 2 -> 3.
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {4}),
                                 absl::Now())
                  .ok());
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {4}),
                                 absl::Now())
                  .ok());
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{3}));
  // Staleness 2: alpha 0.5 / 2 = 0.25: 3 + 0.25 * (7 - 3) = 4.
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {7}),
                                 absl::Now())
                  .ok());
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{4}));
}

// GEM: the delta is added as is (scaled for staleness with "inverse").
// Replies are immutable snapshots; the job reuses a snapshot's memory only
// once nobody holds it. Held replies keep their values while later updates
// go on, and every update starts from the newest weights, whichever buffer
// it lands in (checked against a plain SGD sum kept here).
TEST(JobSnapshotTest, ReusedSnapshotsNeverChangeUnderTheirHolders) {
  auto job = JobWithWeights(PlainSgd(), {1, 2});
  std::vector<float> expected = {1, 2};
  std::vector<std::shared_ptr<const WeightsSnapshot>> held;
  std::vector<std::vector<float>> held_values;
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> gradient = {0.25f * step, -0.5f};
    GradientUpdate update =
        UpdateOf(v1::UPDATE_KIND_GRADIENT, static_cast<uint64_t>(step), gradient);
    // The update's buffers come from the job's pool, as a push's do.
    std::vector<std::vector<float>> buffers = job->TakeUpdateBuffers({2});
    buffers[0] = gradient;
    update.values = std::move(buffers);
    auto reply = job->ApplyGradient(update, absl::Now());
    ASSERT_TRUE(reply.ok()) << reply.status();
    job->ReturnUpdateBuffers(std::move(update.values));
    for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.5f * gradient[i];
    EXPECT_EQ((*reply)->values[0], expected) << "step " << step;
    // Hold every third reply for a while, drop the others at once.
    if (step % 3 == 0) {
      held.push_back(*reply);
      held_values.push_back((*reply)->values[0]);
    }
    if (held.size() > 2) {
      held.erase(held.begin());
      held_values.erase(held_values.begin());
    }
    for (size_t h = 0; h < held.size(); ++h) {
      EXPECT_EQ(held[h]->values[0], held_values[h]) << "step " << step;
    }
  }
}

// A push is applied once per (group, rank, sequence): a retry of the same
// number gets the current weights back and changes nothing; an older number
// arriving late (a rank's pushes in flight overtake each other) is applied
// once; another rank's numbers are its own.
TEST(JobSequenceTest, RetriedOrReorderedPushIsAppliedOnce) {
  auto job = JobWithWeights(PlainSgd(), {1, 2});
  auto push = [&](int rank, uint64_t sequence, std::vector<float> gradient) {
    GradientUpdate update = UpdateOf(v1::UPDATE_KIND_GRADIENT,
                                     job->Weights().value()->header.version(),
                                     std::move(gradient));
    update.rank = rank;
    update.sequence = sequence;
    AppliedUpdate applied;
    auto reply = job->ApplyGradient(update, absl::Now(), &applied);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return applied.applied;
  };
  EXPECT_TRUE(push(0, 1, {2, 2}));   // w = {0, 1}
  EXPECT_FALSE(push(0, 1, {2, 2}));  // the retry
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{0, 1}));
  EXPECT_TRUE(push(0, 3, {2, 0}));   // w = {-1, 1}
  EXPECT_TRUE(push(0, 2, {8, 8}));   // late, not applied yet: w = {-5, -3}
  EXPECT_FALSE(push(0, 2, {8, 8}));  // its retry
  EXPECT_FALSE(push(0, 3, {2, 0}));  // and 3's
  EXPECT_TRUE(push(1, 1, {0, 2}));   // rank 1 counts on its own: w = {-5, -4}
  EXPECT_TRUE(push(0, 0, {2, 2}));   // 0: not tracked, always applied
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{-6, -5}));
  EXPECT_EQ(job->Weights().value()->header.version(), 5u);
}

// A buffer set of another layout is not handed out for an update.
TEST(JobSnapshotTest, UpdateBuffersMatchTheAskedSizes) {
  auto job = JobWithWeights(PlainSgd(), {1, 2});
  job->ReturnUpdateBuffers({std::vector<float>(5)});
  std::vector<std::vector<float>> buffers = job->TakeUpdateBuffers({2, 3});
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].size(), 2u);
  EXPECT_EQ(buffers[1].size(), 3u);
  job->ReturnUpdateBuffers(std::move(buffers));
  std::vector<std::vector<float>> again = job->TakeUpdateBuffers({2, 3});
  EXPECT_EQ(again[1].size(), 3u);
}

TEST(JobAlgorithmTest, DeltaIsAdded) {
  v1::JobSpec spec;
  spec.set_algorithm("gem");
  spec.set_staleness_scaling("inverse");
  auto job = JobWithWeights(spec, {1, 2});
  auto reply = job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_DELTA, 0, {0.5f, -1}),
                                  absl::Now());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ((*reply)->values[0], (std::vector<float>{1.5f, 1}));
  EXPECT_EQ((*reply)->header.version(), 1u);
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_DELTA, 1, {1, 1}),
                                 absl::Now())
                  .ok());
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{2.5f, 2}));
  // Version 2, computed on 0: half the delta.
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_DELTA, 0, {1, -3}),
                                 absl::Now())
                  .ok());
  EXPECT_EQ(CurrentWeights(*job), (std::vector<float>{3, 0.5f}));
}

TEST(JobAlgorithmTest, WrongKindIsRejected) {
  auto downpour = JobWithWeights(PlainSgd(), {1});
  auto status = downpour
                    ->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {1}),
                                    absl::Now())
                    .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("UPDATE_KIND_ELASTIC"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("'downpour'"), std::string::npos) << status;

  v1::JobSpec gem;
  gem.set_algorithm("gem");
  auto job = JobWithWeights(gem, {1});
  status = job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1}),
                              absl::Now())
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("UPDATE_KIND_GRADIENT"), std::string::npos);
  EXPECT_NE(status.message().find("'gem' takes UPDATE_KIND_DELTA"),
            std::string::npos)
      << status;
  EXPECT_EQ(job->Status(false, absl::Now()).version(), 0u);
}

// A bad update changes nothing: not the weights, the optimizer's state, the
// version or the staleness statistics.
TEST(JobValidationTest, NanAndBadSizesAreRejectedBeforeAnyChange) {
  auto job = NewJob("adam");
  auto before = job->Checkpoint().value();

  GradientUpdate nan = Update(5);
  nan.values[1][2] = std::numeric_limits<float>::quiet_NaN();
  auto status = job->ApplyGradient(nan, absl::Now()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "gradient tensor 'b' contains NaN or Inf; lower the learning rate "
            "or check the loss for overflow");

  GradientUpdate inf = Update(5);
  inf.values[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(job->ApplyGradient(inf, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);

  GradientUpdate short_tensor = Update(5);
  short_tensor.values[0].pop_back();
  status = job->ApplyGradient(short_tensor, absl::Now()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("gradient tensor 'w' holds 11 values"),
            std::string::npos)
      << status;

  GradientUpdate missing = Update(5);
  missing.values.pop_back();
  EXPECT_EQ(job->ApplyGradient(missing, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto after = job->Checkpoint().value();
  EXPECT_EQ(after.weights.SerializeAsString(),
            before.weights.SerializeAsString());
  EXPECT_EQ(after.optimizer_state.SerializeAsString(),
            before.optimizer_state.SerializeAsString());
  const v1::JobStatus job_status = job->Status(false, absl::Now());
  EXPECT_EQ(job_status.version(), 0u);
  EXPECT_EQ(job_status.updates_applied(), 0u);
  EXPECT_EQ(job_status.mean_staleness(), 0.0);

  v1::JobSpec gem;
  gem.set_algorithm("gem");
  auto delta_job = JobWithWeights(gem, {1, 2});
  status = delta_job
               ->ApplyGradient(
                   UpdateOf(v1::UPDATE_KIND_DELTA, 0,
                            {1, -std::numeric_limits<float>::infinity()}),
                   absl::Now())
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("update tensor 'w' contains NaN or Inf"),
            std::string::npos)
      << status;
  EXPECT_EQ(CurrentWeights(*delta_job), (std::vector<float>{1, 2}));
}

TEST(JobValidationTest, InitialWeightsAreChecked) {
  auto job = NewJob("adam", /*init=*/false);
  std::vector<std::vector<float>> values = Random(1);
  values[0][3] = std::numeric_limits<float>::infinity();
  auto taken = job->InitWeights(
      MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}), values);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(taken.status().message().find(
                "initial weight tensor 'w' contains NaN or Inf"),
            std::string::npos)
      << taken.status();
  // Values that do not fit the header.
  taken = job->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {4}}),
                           Random(1));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(taken.status().message().find("initial weight tensor 'b'"),
            std::string::npos)
      << taken.status();
  EXPECT_EQ(job->Layout().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(job->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                               Random(1))
                  .value());
}

// easgd and gem have no master optimizer: the checkpoint's optimizer state
// holds no tensors and counts the updates applied.
TEST(JobCheckpointTest, ElasticJobCheckpointsWithoutOptimizerState) {
  v1::JobSpec spec;
  spec.set_algorithm("easgd");
  spec.mutable_easgd()->set_alpha(0.5);
  auto job = JobWithWeights(spec, {0, 2});
  ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 0, {2, 2}),
                                 absl::Now())
                  .ok());
  auto checkpoint = job->Checkpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->optimizer_state.header().tensors_size(), 0);
  EXPECT_EQ(checkpoint->optimizer_state.header().version(), 1u);

  auto restored = std::make_unique<Job>("job-2", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(restored->AddGroup("g", 1, "test", absl::Now()).ok());
  ASSERT_TRUE(restored->Restore(*checkpoint).ok());
  EXPECT_EQ(CurrentWeights(*restored), (std::vector<float>{1, 2}));
  auto a = job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 1, {3, 0}),
                              absl::Now());
  auto b = restored->ApplyGradient(UpdateOf(v1::UPDATE_KIND_ELASTIC, 1, {3, 0}),
                                   absl::Now());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(CurrentWeights(*job), CurrentWeights(*restored));

  // A master optimizer's state does not fit an easgd job.
  auto adam = NewJob("adam");
  auto fresh = std::make_unique<Job>("job-3", JobConfig::FromNormalized(spec));
  EXPECT_EQ(fresh->Restore(adam->Checkpoint().value()).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// The data queue.

constexpr absl::Duration kGroupTimeout = absl::Seconds(10);

// One group's side of the queue: completes the unit it holds (with a loss
// of `loss` per sample) and asks for the next.
struct QueueClient {
  std::string group_id;
  double loss = 1.0;
  std::optional<v1::DataUnit> held;

  absl::StatusOr<v1::NextDataUnitResponse> Ask(Job& job, int64_t train_samples,
                                               absl::Time now) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job.id());
    request.set_group_id(group_id);
    request.set_train_samples(train_samples);
    if (held.has_value()) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(held->unit_id());
      done->set_samples(static_cast<uint64_t>(held->end() - held->begin()));
      done->set_loss_sum(loss * static_cast<double>(done->samples()));
    }
    auto response = job.NextDataUnit(request, now);
    if (response.ok()) {
      held.reset();
      if (response->action() == v1::NextDataUnitResponse::TRAIN) {
        held = response->unit();
      }
    }
    return response;
  }
};

v1::JobSpec QueueSpec(int epochs, int64_t unit_size) {
  v1::JobSpec spec = SpecWith("sgd");
  spec.set_epochs(epochs);
  spec.set_data_unit_size(unit_size);
  return spec;
}

class JobQueueTest : public ::testing::Test {
 protected:
  void MakeJob(int epochs, int64_t unit_size,
               const std::vector<std::string>& groups) {
    job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(QueueSpec(epochs, unit_size)));
    for (const std::string& group : groups) {
      ASSERT_TRUE(job_->AddGroup(group, 1, "test", now_).ok());
    }
  }

  std::unique_ptr<Job> job_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

// A group that asks more often trains more units: the queue hands a unit to
// whoever asks, so the split follows the groups' speeds. "fast" asks three
// times for every time "slow" asks (what a 3x faster group does); the
// deterministic interleaving stands in for real speeds, so nothing here
// depends on the machine.
TEST_F(JobQueueTest, AFasterGroupTrainsMoreUnits) {
  constexpr int64_t kSamples = 1000;
  MakeJob(/*epochs=*/2, /*unit_size=*/50, {"fast", "slow"});
  QueueClient fast{"fast", 1.0, std::nullopt};
  QueueClient slow{"slow", 1.0, std::nullopt};
  std::map<std::string, int> units;
  std::set<std::string> done;
  for (int turn = 0; done.size() < 2 && turn < 1000; ++turn) {
    QueueClient& client = turn % 4 == 3 ? slow : fast;
    if (done.count(client.group_id)) continue;
    now_ += absl::Seconds(1);
    auto response = client.Ask(*job_, kSamples, now_);
    ASSERT_TRUE(response.ok()) << response.status();
    if (response->action() == v1::NextDataUnitResponse::TRAIN) {
      ++units[client.group_id];
    } else if (response->action() == v1::NextDataUnitResponse::DONE) {
      done.insert(client.group_id);
    }
  }
  ASSERT_EQ(done.size(), 2u);
  // 40 units in all (2 epochs of 20); the slow group asks for a quarter of
  // them while units remain.
  EXPECT_EQ(units["fast"] + units["slow"], 40);
  EXPECT_GE(units["fast"], 2 * units["slow"]);
  EXPECT_GT(units["slow"], 0);
  const v1::JobStatus status = job_->Status(false, now_);
  uint64_t fast_units = 0, slow_units = 0;
  for (const v1::GroupInfo& group : status.groups()) {
    if (group.group_id() == "fast") fast_units = group.units_completed();
    if (group.group_id() == "slow") slow_units = group.units_completed();
  }
  EXPECT_EQ(fast_units, static_cast<uint64_t>(units["fast"]));
  EXPECT_EQ(slow_units, static_cast<uint64_t>(units["slow"]));
}

// Two groups alternate over 3 epochs of 1000 samples in units of 64 (15 full
// units and one of 40 per epoch): every sample of every epoch is handed out
// and completed exactly once, the epochs' records come in order with the
// samples-weighted mean loss, and the group that completes the last unit
// finishes the job.
TEST_F(JobQueueTest, TwoGroupsShareEveryUnitOfEveryEpochOnce) {
  constexpr int64_t kSamples = 1000;
  constexpr int kEpochs = 3;
  MakeJob(kEpochs, 64, {"a", "b"});
  std::map<std::string, QueueClient> clients = {
      {"a", QueueClient{"a", 1.0, std::nullopt}},
      {"b", QueueClient{"b", 4.0, std::nullopt}}};
  std::set<int64_t> unit_ids;
  // covered[e][i]: times sample position i of epoch e was handed out.
  std::vector<std::vector<int>> covered(kEpochs, std::vector<int>(kSamples));
  // Per epoch: samples each group trained, for the reference loss.
  std::vector<std::map<std::string, int64_t>> trained(kEpochs);
  std::vector<int32_t> finished;
  std::map<std::string, v1::NextDataUnitResponse> last;
  std::set<std::string> done;
  for (int turn = 0; done.size() < 2 && turn < 1000; ++turn) {
    QueueClient& client = clients.at(turn % 2 == 0 ? "a" : "b");
    if (done.count(client.group_id)) continue;
    now_ += absl::Seconds(1);
    std::optional<v1::DataUnit> completing = client.held;
    const int32_t epochs_before = job_->Status(false, now_).epochs_done();
    auto response = client.Ask(*job_, kSamples, now_);
    ASSERT_TRUE(response.ok()) << response.status();
    if (completing.has_value()) {
      trained[completing->epoch()][client.group_id] +=
          completing->end() - completing->begin();
    }
    for (int32_t e : response->finished_epochs()) finished.push_back(e);
    if (response->action() == v1::NextDataUnitResponse::TRAIN) {
      const v1::DataUnit& unit = response->unit();
      EXPECT_TRUE(unit_ids.insert(unit.unit_id()).second) << unit.unit_id();
      EXPECT_EQ(unit.unit_id(), unit.epoch() * 16 + unit.begin() / 64);
      // At most one epoch ahead of the oldest unfinished one.
      EXPECT_LE(unit.epoch(), epochs_before + 1);
      for (int64_t i = unit.begin(); i < unit.end(); ++i) {
        ++covered[unit.epoch()][i];
      }
    } else if (response->action() == v1::NextDataUnitResponse::DONE) {
      done.insert(client.group_id);
      last[client.group_id] = *response;
    }
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(unit_ids.size(), 48u);
  for (int e = 0; e < kEpochs; ++e) {
    for (int64_t i = 0; i < kSamples; ++i) {
      ASSERT_EQ(covered[e][i], 1) << "epoch " << e << " sample " << i;
    }
  }
  EXPECT_EQ(finished, (std::vector<int32_t>{0, 1, 2}));
  // Exactly one group finishes the job: the one whose completion finished
  // the last epoch, which it was told along with finish.
  const bool a_finishes = last["a"].finish();
  EXPECT_NE(last["a"].finish(), last["b"].finish());
  const v1::NextDataUnitResponse& finisher = last[a_finishes ? "a" : "b"];
  ASSERT_EQ(finisher.finished_epochs_size(), 1);
  EXPECT_EQ(finisher.finished_epochs(0), 2);

  const v1::JobStatus status = job_->Status(true, now_);
  EXPECT_EQ(status.epochs_done(), kEpochs);
  EXPECT_EQ(status.samples_trained(), static_cast<uint64_t>(kEpochs * kSamples));
  ASSERT_EQ(status.history_size(), kEpochs);
  uint64_t units = 0;
  for (const v1::GroupInfo& group : status.groups()) {
    units += group.units_completed();
    EXPECT_GT(group.units_completed(), 0u);
  }
  EXPECT_EQ(units, 48u);
  for (int e = 0; e < kEpochs; ++e) {
    const v1::EpochRecord& record = status.history(e);
    EXPECT_EQ(record.epoch(), e + 1);
    EXPECT_EQ(record.samples(), static_cast<uint64_t>(kSamples));
    const double expected =
        (1.0 * trained[e]["a"] + 4.0 * trained[e]["b"]) / kSamples;
    EXPECT_NEAR(record.train_loss(), expected, 1e-12) << "epoch " << e + 1;
    EXPECT_GT(record.wall_seconds(), 0.0);
    EXPECT_DOUBLE_EQ(record.samples_per_second(),
                     kSamples / record.wall_seconds());
  }
  // The data is done: asking again gives DONE, finish only to the finisher.
  auto again = clients.at(a_finishes ? "b" : "a").Ask(*job_, kSamples, now_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_FALSE(again->finish());
}

// A group that asks three times as often trains about three times the units.
TEST_F(JobQueueTest, FasterGroupTrainsMoreUnits) {
  MakeJob(1, 10, {"fast", "slow"});
  QueueClient fast{"fast", 1.0, std::nullopt};
  QueueClient slow{"slow", 1.0, std::nullopt};
  int fast_units = 0;
  int slow_units = 0;
  for (int round = 0; round < 200; ++round) {
    QueueClient& client = round % 4 == 3 ? slow : fast;
    const bool completing = client.held.has_value();
    auto response = client.Ask(*job_, 1000, now_);
    ASSERT_TRUE(response.ok()) << response.status();
    if (completing) ++(&client == &fast ? fast_units : slow_units);
  }
  EXPECT_EQ(fast_units + slow_units, 100);
  EXPECT_NEAR(fast_units, 3 * slow_units, 4) << fast_units << " vs " << slow_units;
  const v1::JobStatus status = job_->Status(true, now_);
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).samples(), 1000u);
}

// Groups wait while every unit they may take is in flight elsewhere; the
// finisher leaving passes finishing on to the next group that asks.
TEST_F(JobQueueTest, WaitAndFinishReassignment) {
  MakeJob(1, 50, {"a", "b"});
  QueueClient a{"a", 1.0, std::nullopt};
  QueueClient b{"b", 3.0, std::nullopt};
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 0);
  EXPECT_EQ(b.Ask(*job_, 100, now_)->unit().unit_id(), 1);
  auto wait = a.Ask(*job_, 100, now_);
  ASSERT_TRUE(wait.ok());
  EXPECT_EQ(wait->action(), v1::NextDataUnitResponse::WAIT);
  EXPECT_TRUE(wait->finished_epochs().empty());

  auto last = b.Ask(*job_, 100, now_);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(last->finish());
  EXPECT_EQ(last->finished_epochs_size(), 1);
  // Asking again (a retried call) repeats the answer.
  EXPECT_TRUE(b.Ask(*job_, 100, now_)->finish());
  auto other = a.Ask(*job_, 100, now_);
  EXPECT_EQ(other->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_FALSE(other->finish());
  EXPECT_DOUBLE_EQ(job_->Status(true, now_).history(0).train_loss(), 2.0);

  // b leaves without completing the job: a is to finish it.
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("b");
  EXPECT_EQ(job_->Leave(leave).value(), v1::JOB_STATE_RUNNING);
  auto now_a = a.Ask(*job_, 100, now_);
  EXPECT_EQ(now_a->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(now_a->finish());

  // So does a third group if a is lost in turn.
  ASSERT_TRUE(job_->AddGroup("c", 1, "test", now_ + absl::Seconds(20)).ok());
  EXPECT_EQ(job_->ReapLostGroups(now_ + absl::Seconds(20), kGroupTimeout), 1);
  QueueClient c{"c", 1.0, std::nullopt};
  auto now_c = c.Ask(*job_, 100, now_ + absl::Seconds(20));
  EXPECT_TRUE(now_c->finish());
  leave.set_group_id("c");
  leave.set_completed(true);
  EXPECT_EQ(job_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
}

// A unit held by a group that leaves goes to the next group that asks.
TEST_F(JobQueueTest, LeavingGroupsUnitIsRequeued) {
  MakeJob(1, 30, {"a", "b"});
  QueueClient a{"a", 1.0, std::nullopt};
  QueueClient b{"b", 1.0, std::nullopt};
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 0);
  EXPECT_EQ(b.Ask(*job_, 100, now_)->unit().unit_id(), 1);
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("b");
  ASSERT_TRUE(job_->Leave(leave).ok());
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 1);  // requeued first
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 2);
  auto unit3 = a.Ask(*job_, 100, now_);
  EXPECT_EQ(unit3->unit().begin(), 90);
  EXPECT_EQ(unit3->unit().end(), 100);
  auto end = a.Ask(*job_, 100, now_);
  EXPECT_TRUE(end->finish());
  const v1::JobStatus status = job_->Status(true, now_);
  EXPECT_EQ(status.units_requeued(), 1u);
  EXPECT_EQ(status.history(0).samples(), 100u);
}

// A group that abandons the job (its rank was terminated from outside)
// gives its unit back at once and does not fail the job; the cause becomes
// the job's message, and the job is QUEUED once no group serves it.
TEST_F(JobQueueTest, AbandoningGroupRequeuesWithoutFailing) {
  MakeJob(1, 30, {"a", "b"});
  QueueClient a{"a", 1.0, std::nullopt};
  QueueClient b{"b", 1.0, std::nullopt};
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 0);
  EXPECT_EQ(b.Ask(*job_, 100, now_)->unit().unit_id(), 1);
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("b");
  leave.set_abandoned("rank terminated: signal 15");
  EXPECT_EQ(job_->Leave(leave).value(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job_->Status(false, now_).message(),
            "group b left without finishing: rank terminated: signal 15");
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 1);  // requeued first
  leave.set_group_id("a");
  EXPECT_EQ(job_->Leave(leave).value(), v1::JOB_STATE_QUEUED);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.units_requeued(), 2u);
  EXPECT_EQ(status.message(),
            "group a left without finishing: rank terminated: signal 15");
}

// Epoch e + 2 waits until epoch e is finished, even when e + 1 is all
// handed out.
TEST_F(JobQueueTest, AtMostOneEpochRunsAhead) {
  MakeJob(3, 10, {"slow", "fast"});
  QueueClient slow{"slow", 1.0, std::nullopt};
  QueueClient fast{"fast", 1.0, std::nullopt};
  EXPECT_EQ(slow.Ask(*job_, 20, now_)->unit().unit_id(), 0);
  EXPECT_EQ(fast.Ask(*job_, 20, now_)->unit().unit_id(), 1);
  EXPECT_EQ(fast.Ask(*job_, 20, now_)->unit().unit_id(), 2);  // epoch 1
  EXPECT_EQ(fast.Ask(*job_, 20, now_)->unit().unit_id(), 3);
  auto wait = fast.Ask(*job_, 20, now_);  // epoch 1 complete, 0 is not
  EXPECT_EQ(wait->action(), v1::NextDataUnitResponse::WAIT);
  EXPECT_TRUE(wait->finished_epochs().empty());
  EXPECT_EQ(job_->Status(false, now_).epochs_done(), 0);
  // The slow group's unit finishes epoch 0 and, with it, epoch 1.
  auto both = slow.Ask(*job_, 20, now_);
  EXPECT_EQ(both->finished_epochs_size(), 2);
  EXPECT_EQ(both->unit().unit_id(), 4);
  EXPECT_EQ(job_->Status(false, now_).epochs_done(), 2);
}

TEST_F(JobQueueTest, TrainSamplesMustAgree) {
  MakeJob(1, 10, {"a", "b"});
  QueueClient a{"a", 1.0, std::nullopt};
  QueueClient b{"b", 1.0, std::nullopt};
  auto none = a.Ask(*job_, 0, now_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("train_samples must be > 0"),
            std::string::npos);
  ASSERT_TRUE(a.Ask(*job_, 100, now_).ok());
  auto other = b.Ask(*job_, 99, now_);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.status().message(),
            "group b sees 99 samples but job job-1 has 100; do all groups read "
            "the same data files with the same train_limit?");
  // Once fixed, a request may leave it out.
  EXPECT_EQ(b.Ask(*job_, 0, now_)->unit().unit_id(), 1);
}

TEST_F(JobQueueTest, CompletingAUnitNotHeldIsRejected) {
  MakeJob(1, 10, {"a", "b"});
  QueueClient a{"a", 1.0, std::nullopt};
  ASSERT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 0);

  v1::NextDataUnitRequest request;
  request.set_job_id("job-1");
  request.set_group_id("b");
  request.set_train_samples(100);
  v1::CompletedUnit* done = request.add_completed();
  done->set_unit_id(0);
  done->set_samples(10);
  auto theirs = job_->NextDataUnit(request, now_);
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(theirs.status().message().find("lists unit 0 as completed but "
                                           "holds no unit"),
            std::string::npos)
      << theirs.status();

  request.set_group_id("a");
  done->set_unit_id(5);
  auto wrong = job_->NextDataUnit(request, now_);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("unit 5"), std::string::npos);

  done->set_unit_id(0);
  done->set_samples(9);
  auto short_count = job_->NextDataUnit(request, now_);
  EXPECT_EQ(short_count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_count.status().message().find("covers 10 samples"),
            std::string::npos);

  done->set_samples(10);
  *request.add_completed() = *done;  // listed twice
  EXPECT_EQ(job_->NextDataUnit(request, now_).status().code(),
            absl::StatusCode::kInvalidArgument);

  request.clear_completed();
  auto still = job_->NextDataUnit(request, now_);
  EXPECT_EQ(still.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(still.status().message(),
            "group a still holds unit 0; list it in completed");

  // None of it changed anything: a's proper request completes unit 0.
  EXPECT_EQ(job_->Status(false, now_).samples_trained(), 0u);
  EXPECT_EQ(a.Ask(*job_, 100, now_)->unit().unit_id(), 1);
  EXPECT_EQ(job_->Status(false, now_).samples_trained(), 10u);
}

// ReportEpoch merges the group's validation metrics into the master's
// record; the master's training figures stay.
TEST_F(JobQueueTest, RecordEpochMergesIntoFinishedEpoch) {
  MakeJob(2, 50, {"a"});
  QueueClient a{"a", 0.5, std::nullopt};
  v1::EpochRecord report;
  report.set_epoch(1);
  report.set_group_id("a");
  report.set_val_loss(0.25);
  report.set_val_accuracy(0.9);
  report.set_train_loss(123);
  report.set_samples(7);
  report.set_wall_seconds(99);
  EXPECT_EQ(job_->RecordEpoch(report, now_).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(a.Ask(*job_, 100, now_).ok());
  now_ += absl::Seconds(2);
  ASSERT_TRUE(a.Ask(*job_, 100, now_).ok());
  now_ += absl::Seconds(2);
  auto finished = a.Ask(*job_, 100, now_);
  ASSERT_EQ(finished->finished_epochs_size(), 1);
  EXPECT_EQ(finished->finished_epochs(0), 0);
  ASSERT_TRUE(job_->RecordEpoch(report, now_).ok());
  const v1::EpochRecord record = job_->Status(true, now_).history(0);
  EXPECT_EQ(record.epoch(), 1);
  EXPECT_EQ(record.group_id(), "a");
  EXPECT_DOUBLE_EQ(record.val_loss(), 0.25);
  EXPECT_DOUBLE_EQ(record.val_accuracy(), 0.9);
  EXPECT_DOUBLE_EQ(record.train_loss(), 0.5);
  EXPECT_EQ(record.samples(), 100u);
  EXPECT_DOUBLE_EQ(record.wall_seconds(), 4.0);
  EXPECT_DOUBLE_EQ(record.samples_per_second(), 25.0);
  report.set_epoch(2);
  EXPECT_EQ(job_->RecordEpoch(report, now_).code(), absl::StatusCode::kNotFound);
  report.set_epoch(0);
  EXPECT_EQ(job_->RecordEpoch(report, now_).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Validations and stop rules.

v1::ValidationRecord Validation(uint64_t version, double val_loss,
                                double val_accuracy) {
  v1::ValidationRecord record;
  record.set_version(version);
  record.set_val_loss(val_loss);
  record.set_val_accuracy(val_accuracy);
  record.set_source("pool v-1");
  return record;
}

// Feeds `values` of `metric` (the other metric fixed) as validations of
// versions 1, 2, ...; returns the 1-based index of the validation that
// stopped the job (0: none) and its stop reason.
std::pair<int, std::string> FirstStop(const v1::JobSpec& spec,
                                      const std::string& metric,
                                      const std::vector<double>& values) {
  Job job("job-1", JobConfig::FromNormalized(spec));
  for (size_t i = 0; i < values.size(); ++i) {
    const bool loss = metric == "val_loss";
    ValidationEffect effect;
    EXPECT_TRUE(job.RecordValidation(
                       Validation(i + 1, loss ? values[i] : 1.0,
                                  loss ? 0.5 : values[i]),
                       absl::FromUnixSeconds(100), &effect)
                    .ok());
    if (effect.stopped) {
      const v1::JobStatus status = job.Status(true, absl::FromUnixSeconds(100));
      EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
      EXPECT_EQ(status.validations_size(), static_cast<int>(i + 1));
      return {static_cast<int>(i + 1), status.stop_reason()};
    }
  }
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  return {0, ""};
}

v1::JobSpec EarlyStopping(const std::string& metric, int patience,
                          double min_delta, int smoothing) {
  v1::JobSpec spec = SpecWith("sgd");
  v1::EarlyStoppingSpec* stopping = spec.mutable_early_stopping();
  stopping->set_metric(metric);
  stopping->set_patience(patience);
  stopping->set_min_delta(min_delta);
  stopping->set_smoothing(smoothing);
  return spec;
}

// The same losses stop a job at the 4th validation without smoothing (best
// 0.5, then two worse) and at the 7th with a moving average over 2: the
// averages are 1, 0.75, 0.625, 0.6875, 0.5625, 0.625, 0.75 (worked out by
// hand).
TEST(JobStopRulesTest, PatienceCountsValidationsWithoutImprovement) {
  const std::vector<double> losses = {1.0, 0.5, 0.75, 0.625, 0.5, 0.75, 0.75};
  EXPECT_EQ(FirstStop(EarlyStopping("val_loss", 2, 0, 1), "val_loss", losses),
            std::make_pair(4, std::string("early stopping: val_loss did not "
                                          "improve by more than 0 for 2 "
                                          "validations (best 0.5 at version "
                                          "2)")));
  EXPECT_EQ(FirstStop(EarlyStopping("val_loss", 2, 0, 2), "val_loss", losses),
            std::make_pair(7, std::string("early stopping: val_loss averaged "
                                          "over 2 validations did not improve "
                                          "by more than 0 for 2 validations "
                                          "(best 0.5625 at version 5)")));
  // A value equal to the best is no improvement: with patience 3 the 5th
  // (0.5 again) stops the job, with patience 6 none does.
  EXPECT_EQ(FirstStop(EarlyStopping("val_loss", 3, 0, 1), "val_loss", losses)
                .first,
            5);
  EXPECT_EQ(FirstStop(EarlyStopping("val_loss", 6, 0, 1), "val_loss", losses)
                .first,
            0);
}

// Accuracy improves upwards; a gain of exactly min_delta is no improvement.
TEST(JobStopRulesTest, MinDeltaIsTheSmallestImprovement) {
  const std::vector<double> accuracies = {0.5, 0.75, 0.8125, 0.875, 0.9375};
  EXPECT_EQ(FirstStop(EarlyStopping("val_accuracy", 2, 0.125, 1),
                      "val_accuracy", accuracies),
            std::make_pair(4, std::string("early stopping: val_accuracy did "
                                          "not improve by more than 0.125 for "
                                          "2 validations (best 0.75 at "
                                          "version 2)")));
  EXPECT_EQ(FirstStop(EarlyStopping("val_accuracy", 2, 0, 1), "val_accuracy",
                      accuracies)
                .first,
            0);
  // Falling accuracy never improves on the first value.
  EXPECT_EQ(FirstStop(EarlyStopping("val_accuracy", 1, 0, 1), "val_accuracy",
                      {0.5, 0.25})
                .first,
            2);
}

TEST(JobStopRulesTest, TargetIsStrictForBothMetrics) {
  v1::JobSpec accuracy = SpecWith("sgd");
  accuracy.mutable_target()->set_metric("val_accuracy");
  accuracy.mutable_target()->set_value(0.9);
  EXPECT_EQ(FirstStop(accuracy, "val_accuracy", {0.85, 0.9, 0.90625, 0.95}),
            std::make_pair(
                3, std::string("target reached: val_accuracy 0.90625 > 0.9")));
  v1::JobSpec loss = SpecWith("sgd");
  loss.mutable_target()->set_metric("val_loss");
  loss.mutable_target()->set_value(0.25);
  EXPECT_EQ(FirstStop(loss, "val_loss", {0.3, 0.25, 0.125}),
            std::make_pair(3,
                           std::string("target reached: val_loss 0.125 < 0.25")));
  // A target without a value is off; NaN never reaches one.
  loss.mutable_target()->clear_value();
  EXPECT_EQ(FirstStop(loss, "val_loss", {0.0}).first, 0);
  accuracy.mutable_early_stopping()->set_patience(100);
  EXPECT_EQ(FirstStop(accuracy, "val_accuracy", {std::nan("")}).first, 0);
}

TEST(JobStopRulesTest, BestFollowsCheckpointBestMetric) {
  v1::JobSpec spec = SpecWith("sgd");
  Job by_loss("job-1", JobConfig::FromNormalized(spec));  // best_metric left out: val_loss
  const absl::Time now = absl::FromUnixSeconds(100);
  std::vector<bool> improved;
  for (const auto& [loss, accuracy] :
       std::vector<std::pair<double, double>>{{1.0, 0.5}, {0.5, 0.4},
                                              {0.75, 0.9}, {0.25, 0.6}}) {
    ValidationEffect effect;
    ASSERT_TRUE(by_loss
                    .RecordValidation(Validation(improved.size() + 1, loss,
                                                 accuracy),
                                      now, &effect)
                    .ok());
    improved.push_back(effect.best_improved);
    EXPECT_FALSE(effect.stopped);
  }
  EXPECT_EQ(improved, (std::vector<bool>{true, true, false, true}));
  const v1::JobStatus status = by_loss.Status(true, now);
  EXPECT_DOUBLE_EQ(status.best_metric_value(), 0.25);
  ASSERT_EQ(status.validations_size(), 4);
  EXPECT_EQ(status.validations(2).source(), "pool v-1");
  EXPECT_DOUBLE_EQ(status.validations(2).unix_seconds(), 100.0);
  EXPECT_FALSE(by_loss.Status(false, now).validations_size() > 0);

  spec.mutable_checkpoint()->set_best_metric("none");
  Job none("job-2", JobConfig::FromNormalized(spec));
  ValidationEffect effect;
  ASSERT_TRUE(none.RecordValidation(Validation(1, 1.0, 0.5), now, &effect).ok());
  EXPECT_FALSE(effect.best_improved);
  EXPECT_FALSE(none.Status(true, now).has_best_metric_value());
}

// A stop rule ends the job while groups still train: their pushes get the
// frozen weights back, the first group to ask is told to finish, and its
// Leave(completed) stores the test result.
TEST_F(JobQueueTest, StopRuleEndsJobAndOneGroupFinishesIt) {
  v1::JobSpec spec = QueueSpec(3, 10);
  spec.mutable_target()->set_value(0.5);
  job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(job_->AddGroup("g", 1, "test", now_).ok());
  ASSERT_TRUE(job_->AddGroup("b", 1, "test", now_).ok());
  ASSERT_TRUE(job_->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                Random(1))
                  .value());
  QueueClient g{"g", 1.0, std::nullopt};
  QueueClient b{"b", 1.0, std::nullopt};
  ASSERT_EQ(g.Ask(*job_, 100, now_)->action(), v1::NextDataUnitResponse::TRAIN);
  ASSERT_EQ(b.Ask(*job_, 100, now_)->action(), v1::NextDataUnitResponse::TRAIN);
  ASSERT_TRUE(job_->ApplyGradient(Update(5), now_).ok());

  ValidationEffect effect;
  ASSERT_TRUE(
      job_->RecordValidation(Validation(1, 0.4, 0.75), now_, &effect).ok());
  EXPECT_TRUE(effect.stopped);
  v1::JobStatus status = job_->Status(true, now_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.stop_reason(), "target reached: val_accuracy 0.75 > 0.5");

  const std::vector<std::vector<float>> frozen = CurrentWeightsOf(*job_);
  AppliedUpdate applied;
  auto reply = job_->ApplyGradient(Update(6), now_, &applied);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(applied.applied);
  EXPECT_EQ((*reply)->values, frozen);
  EXPECT_EQ((*reply)->header.version(), 1u);

  auto finish = g.Ask(*job_, 100, now_);
  ASSERT_TRUE(finish.ok()) << finish.status();
  EXPECT_EQ(finish->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(finish->finish());
  auto done = b.Ask(*job_, 100, now_);
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_FALSE(done->finish());

  // Later validations are recorded but stop nothing again.
  ASSERT_TRUE(
      job_->RecordValidation(Validation(1, 0.3, 0.8), now_, &effect).ok());
  EXPECT_FALSE(effect.stopped);

  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("b");
  LeaveEffect left;
  EXPECT_EQ(job_->Leave(leave, &left).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_FALSE(left.ended || left.test_result_recorded);
  leave.set_group_id("g");
  leave.set_completed(true);
  leave.set_test_loss(0.5);
  leave.set_test_accuracy(0.7);
  EXPECT_EQ(job_->Leave(leave, &left).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(left.test_result_recorded);
  EXPECT_FALSE(left.ended);
  status = job_->Status(true, now_);
  EXPECT_DOUBLE_EQ(status.test_accuracy(), 0.7);
  EXPECT_EQ(status.validations_size(), 2);
  EXPECT_EQ(status.stop_reason(), "target reached: val_accuracy 0.75 > 0.5");
  EXPECT_EQ(status.units_requeued(), 0u);
}

// Stop (MPI Opt's pruning) ends a running job like a stop rule: frozen
// weights and DONE to every group, but no group is told to finish (no test
// set for a stopped trial); an ended job cannot be stopped again.
TEST_F(JobQueueTest, StopEndsRunningJobLikeAStopRule) {
  job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(QueueSpec(3, 10)));
  ASSERT_TRUE(job_->AddGroup("g", 1, "test", now_).ok());
  ASSERT_TRUE(job_->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                Random(1))
                  .value());
  QueueClient g{"g", 1.0, std::nullopt};
  ASSERT_EQ(g.Ask(*job_, 100, now_)->action(), v1::NextDataUnitResponse::TRAIN);
  ASSERT_TRUE(job_->ApplyGradient(Update(5), now_).ok());

  ASSERT_TRUE(job_->Stop("pruned by study s-1 at epoch 1").ok());
  v1::JobStatus status = job_->Status(true, now_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.stop_reason(), "pruned by study s-1 at epoch 1");
  EXPECT_EQ(status.message(), "pruned by study s-1 at epoch 1");

  const std::vector<std::vector<float>> frozen = CurrentWeightsOf(*job_);
  AppliedUpdate applied;
  auto reply = job_->ApplyGradient(Update(6), now_, &applied);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(applied.applied);
  EXPECT_EQ((*reply)->values, frozen);

  auto done = g.Ask(*job_, 100, now_);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_FALSE(done->finish());

  const absl::Status again = job_->Stop("again");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(again), v1::ERROR_REASON_JOB_ENDED);
  EXPECT_EQ(job_->Status(false, now_).stop_reason(),
            "pruned by study s-1 at epoch 1");
}

// A regression job's test result: loss and the metrics by name, no
// accuracy; an ended job restored from its status keeps them.
TEST_F(JobQueueTest, RegressionTestMetricsAreKeptAndRestored) {
  v1::JobSpec spec = QueueSpec(1, 10);
  spec.set_loss("mse");
  job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(job_->AddGroup("g", 1, "test", now_).ok());
  ASSERT_TRUE(job_->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                Random(1))
                  .value());
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("g");
  leave.set_completed(true);
  leave.set_test_loss(0.25);
  (*leave.mutable_test_metrics())["test_mae"] = 0.4;
  (*leave.mutable_test_metrics())["test_mse"] = 0.125;
  EXPECT_EQ(job_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  const v1::JobStatus status = job_->Status(true, now_);
  EXPECT_DOUBLE_EQ(status.test_loss(), 0.25);
  EXPECT_FALSE(status.has_test_accuracy());
  EXPECT_DOUBLE_EQ(status.test_metrics().at("test_mae"), 0.4);
  EXPECT_DOUBLE_EQ(status.test_metrics().at("test_mse"), 0.125);

  Job restored("job-1", JobConfig::FromNormalized(spec));
  restored.ResumeEnded(status);
  const v1::JobStatus again = restored.Status(true, now_);
  EXPECT_FALSE(again.has_test_accuracy());
  EXPECT_DOUBLE_EQ(again.test_metrics().at("test_mse"), 0.125);
}

// ---------------------------------------------------------------------------
// Whole-job checkpoints.

// Two epochs of two units. Epoch 1 completes while unit 1 of epoch 0 is in
// flight; the checkpoint taken then resumes into a job that hands out unit 1
// (and nothing completed) again, records both epochs when it completes,
// and whose next update is bit-identical to the uninterrupted job's.
TEST_F(JobQueueTest, ResumedJobContinuesQueueAndUpdatesExactly) {
  v1::JobSpec spec = QueueSpec(2, 10);
  spec.mutable_optimizer()->set_name("adam");
  job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(job_->AddGroup("g", 1, "test", now_).ok());
  ASSERT_TRUE(job_->AddGroup("b", 1, "test", now_).ok());
  ASSERT_TRUE(job_->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                Random(1))
                  .value());
  QueueClient g{"g", 2.0, std::nullopt};
  QueueClient b{"b", 1.0, std::nullopt};
  EXPECT_EQ(g.Ask(*job_, 20, now_)->unit().unit_id(), 0);
  EXPECT_EQ(b.Ask(*job_, 20, now_)->unit().unit_id(), 1);
  for (uint32_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(job_->ApplyGradient(Update(20 + step), now_).ok());
  }
  now_ += absl::Seconds(1);
  EXPECT_EQ(g.Ask(*job_, 20, now_)->unit().unit_id(), 2);
  now_ += absl::Seconds(1);
  EXPECT_EQ(g.Ask(*job_, 20, now_)->unit().unit_id(), 3);
  now_ += absl::Seconds(1);
  auto wait = g.Ask(*job_, 20, now_);  // epoch 1 complete, epoch 0 is not
  ASSERT_EQ(wait->action(), v1::NextDataUnitResponse::WAIT);
  ASSERT_TRUE(job_->RecordValidation(Validation(3, 0.5, 0.5), now_).ok());

  EXPECT_TRUE(job_->CheckpointDue(CheckpointTrigger::kChanges, now_));
  auto file = job_->SaveCheckpoint(now_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(job_->CheckpointDue(CheckpointTrigger::kChanges, now_));
  EXPECT_EQ(file->weights().header().version(), 3u);
  EXPECT_EQ(file->queue().train_samples(), 20);
  EXPECT_EQ(file->queue().next_epoch(), 2);
  ASSERT_EQ(file->queue().open_epochs_size(), 2);
  EXPECT_EQ(file->queue().open_epochs(0).completed_units_size(), 1);
  EXPECT_EQ(file->queue().open_epochs(1).completed_units_size(), 2);
  EXPECT_DOUBLE_EQ(file->created_unix_seconds(), 1003.0);

  Job resumed("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(resumed.Resume(*file).ok());
  v1::JobStatus status = resumed.Status(true, now_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.version(), 3u);
  EXPECT_EQ(status.updates_applied(), 3u);
  EXPECT_EQ(status.samples_trained(), 30u);
  EXPECT_EQ(status.groups_size(), 0);
  EXPECT_EQ(status.units_requeued(), 1u);  // unit 1, in flight
  EXPECT_EQ(status.validations_size(), 1);
  EXPECT_EQ(status.checkpoint_version(), 3u);
  EXPECT_DOUBLE_EQ(status.best_metric_value(), 0.5);
  EXPECT_FALSE(resumed.CheckpointDue(CheckpointTrigger::kChanges, now_));

  // The old group is unknown; a new one gets unit 1, then both epochs end.
  EXPECT_EQ(resumed.Touch("b", now_).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(resumed.AddGroup("c", 1, "test", now_).ok());
  QueueClient c{"c", 4.0, std::nullopt};
  auto again = c.Ask(resumed, 20, now_);
  ASSERT_EQ(again->action(), v1::NextDataUnitResponse::TRAIN);
  EXPECT_EQ(again->unit().unit_id(), 1);
  now_ += absl::Seconds(1);
  auto last = c.Ask(resumed, 20, now_);
  EXPECT_EQ(last->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(last->finish());
  EXPECT_EQ(std::vector<int32_t>(last->finished_epochs().begin(),
                                 last->finished_epochs().end()),
            (std::vector<int32_t>{0, 1}));
  status = resumed.Status(true, now_);
  ASSERT_EQ(status.history_size(), 2);
  EXPECT_DOUBLE_EQ(status.history(0).train_loss(), (2.0 * 10 + 4.0 * 10) / 20);
  EXPECT_DOUBLE_EQ(status.history(1).train_loss(), 2.0);
  EXPECT_DOUBLE_EQ(status.history(1).wall_seconds(), 2.0);

  GradientUpdate next = Update(99);
  auto a_reply = job_->ApplyGradient(next, now_);
  next.group_id = "c";
  auto b_reply = resumed.ApplyGradient(next, now_);
  ASSERT_TRUE(a_reply.ok() && b_reply.ok()) << b_reply.status();
  EXPECT_EQ((*a_reply)->values, (*b_reply)->values);
  EXPECT_EQ((*b_reply)->header.version(), 4u);
}

TEST(JobCheckpointTest, InconsistentQueueIsRefused) {
  auto job = NewJob("sgd");
  v1::JobCheckpointFile file = job->SaveCheckpoint(absl::Now()).value();
  file.mutable_queue()->set_next_unit(7);  // no train_samples fixed
  Job resumed("job-1", JobConfig::FromNormalized(SpecWith("sgd")));
  EXPECT_EQ(resumed.Resume(file).code(), absl::StatusCode::kDataLoss);
}

TEST(JobCheckpointTest, CheckpointDueByUpdatesAndSeconds) {
  v1::JobSpec spec = SpecWith("sgd");
  spec.mutable_checkpoint()->set_every_updates(2);
  spec.mutable_checkpoint()->set_every_seconds(30);
  auto job = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(job->CheckpointDue(CheckpointTrigger::kSeconds, t0));  // no weights
  ASSERT_TRUE(job->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                               Random(1))
                  .value());
  EXPECT_TRUE(job->CheckpointDue(CheckpointTrigger::kSeconds, t0));
  ASSERT_TRUE(job->SaveCheckpoint(t0).ok());
  EXPECT_FALSE(job->CheckpointDue(CheckpointTrigger::kSeconds, t0));
  AppliedUpdate applied;
  ASSERT_TRUE(job->ApplyGradient(Update(1), t0, &applied).ok());
  EXPECT_TRUE(applied.applied);
  EXPECT_FALSE(applied.checkpoint_due);
  EXPECT_EQ(applied.updates_applied, 1u);
  ASSERT_TRUE(job->ApplyGradient(Update(2), t0, &applied).ok());
  EXPECT_TRUE(applied.checkpoint_due);
  EXPECT_TRUE(job->CheckpointDue(CheckpointTrigger::kUpdates, t0));
  // Changed, but only 29 s since the last checkpoint.
  EXPECT_FALSE(job->CheckpointDue(CheckpointTrigger::kSeconds,
                                  t0 + absl::Seconds(29)));
  EXPECT_TRUE(job->CheckpointDue(CheckpointTrigger::kSeconds,
                                 t0 + absl::Seconds(30)));
}

// ---------------------------------------------------------------------------
// Observability: what ApplyGradient reports, telemetry, train loss, progress.

// A known sequence of base versions gives known staleness values, each
// update's apply time is measured, and the labels name the device and the
// update rule.
TEST(JobObservabilityTest, AppliedUpdateCarriesStalenessTimeAndLabels) {
  // A large tensor, so that the step takes measurable time.
  auto job = JobWithWeights(PlainSgd(), std::vector<float>(1 << 20, 1.0f));
  const std::vector<float> gradient(1 << 20, 0.5f);
  // Versions before each update: 0, 1, 2, 3, 4; bases 0, 0, 2, 0, 4.
  const uint64_t bases[] = {0, 0, 2, 0, 4};
  const uint64_t expected[] = {0, 1, 0, 3, 0};
  for (int i = 0; i < 5; ++i) {
    AppliedUpdate applied;
    auto reply = job->ApplyGradient(
        UpdateOf(v1::UPDATE_KIND_GRADIENT, bases[i], gradient), absl::Now(),
        &applied);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(applied.applied);
    EXPECT_EQ(applied.staleness, expected[i]) << "update " << i;
    EXPECT_GT(applied.apply_seconds(), 0.0);
    EXPECT_LT(applied.apply_seconds(), 10.0);
    EXPECT_DOUBLE_EQ(applied.apply_seconds(),
                     absl::ToDoubleSeconds(applied.apply_end - applied.apply_start));
    EXPECT_EQ(applied.device, "cpu");
    EXPECT_EQ(applied.optimizer, "sgd");
    EXPECT_EQ(applied.weights->header.version(), static_cast<uint64_t>(i + 1));
  }
  EXPECT_EQ(job->Status(false, absl::Now()).max_staleness_seen(), 3u);

  // A refused update reports nothing applied.
  v1::JobSpec bounded = PlainSgd();
  bounded.set_max_staleness(1);
  auto strict = JobWithWeights(bounded, {1});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(strict->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1}),
                                      absl::Now())
                    .ok());
  }
  AppliedUpdate refused;
  EXPECT_FALSE(strict
                   ->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1}),
                                   absl::Now(), &refused)
                   .ok());
  EXPECT_FALSE(refused.applied);
}

TEST(JobObservabilityTest, UpdateRuleNamesOptimizerOrAlgorithm) {
  EXPECT_EQ(UpdateRuleName(PlainSgd()), "sgd");
  v1::JobSpec sync = SpecWith("adam");
  sync.set_algorithm("sync");
  EXPECT_EQ(UpdateRuleName(sync), "adam");
  for (const std::string algorithm : {"easgd", "gem"}) {
    v1::JobSpec spec = SpecWith("adam");
    spec.set_algorithm(algorithm);
    EXPECT_EQ(UpdateRuleName(spec), algorithm);
    auto job = JobWithWeights(spec, {1, 2});
    AppliedUpdate applied;
    ASSERT_TRUE(job->ApplyGradient(
                       UpdateOf(algorithm == "easgd" ? v1::UPDATE_KIND_ELASTIC
                                                     : v1::UPDATE_KIND_DELTA,
                                0, {1, 1}),
                       absl::Now(), &applied)
                    .ok());
    EXPECT_EQ(applied.optimizer, algorithm);
    EXPECT_GE(applied.apply_seconds(), 0.0);
  }
}

v1::GroupTelemetry Telemetry(double base) {
  v1::GroupTelemetry telemetry;
  telemetry.set_data_seconds(base + 1);
  telemetry.set_compute_seconds(base + 2);
  telemetry.set_master_seconds(base + 3);
  telemetry.set_mpi_seconds(base + 4);
  telemetry.set_cpu_seconds(base + 5);
  telemetry.set_resident_bytes(static_cast<uint64_t>(base) * 1000 + 6);
  telemetry.set_wall_seconds(base + 7);
  return telemetry;
}

bool SameTelemetry(const v1::GroupTelemetry& a, const v1::GroupTelemetry& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

// The latest telemetry of each group, from NextDataUnit and Touch
// (Heartbeat), is in Status; a refused request's is not kept.
TEST_F(JobQueueTest, GroupTelemetryIsKeptAndReported) {
  MakeJob(1, 10, {"a", "b"});
  v1::NextDataUnitRequest request;
  request.set_job_id("job-1");
  request.set_group_id("a");
  request.set_train_samples(100);
  *request.mutable_telemetry() = Telemetry(10);
  ASSERT_TRUE(job_->NextDataUnit(request, now_).ok());

  v1::JobStatus status = job_->Status(false, now_);
  ASSERT_EQ(status.groups_size(), 2);
  EXPECT_TRUE(status.groups(0).has_telemetry());
  EXPECT_TRUE(SameTelemetry(status.groups(0).telemetry(), Telemetry(10)));
  EXPECT_FALSE(status.groups(1).has_telemetry());  // b never sent any

  // Refused (a still holds its unit and does not list it): not kept.
  *request.mutable_telemetry() = Telemetry(20);
  EXPECT_FALSE(job_->NextDataUnit(request, now_).ok());
  EXPECT_TRUE(SameTelemetry(job_->Status(false, now_).groups(0).telemetry(),
                            Telemetry(10)));

  // A heartbeat's telemetry replaces it; one without leaves it.
  const v1::GroupTelemetry beat = Telemetry(30);
  ASSERT_TRUE(job_->Touch("a", now_, &beat).ok());
  ASSERT_TRUE(job_->Touch("a", now_).ok());
  status = job_->Status(false, now_);
  EXPECT_TRUE(SameTelemetry(status.groups(0).telemetry(), Telemetry(30)));
  // Checkpoints persist it with the status.
  ASSERT_TRUE(job_->InitWeights(MakeFloat32Header(0, {"w"}, {{1}}), {{1}}).ok());
  auto checkpoint = job_->SaveCheckpoint(now_);
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_TRUE(SameTelemetry(checkpoint->status().groups(0).telemetry(),
                            Telemetry(30)));
}

// train_loss is the mean loss of the units the most recent request that
// completed any completed; progress comes with every answer.
TEST_F(JobQueueTest, TrainLossAndProgress) {
  // 2 epochs of 250 samples in units of 100: units 0, 1, 2 (100, 100, 50
  // samples) in epoch 1, units 3, 4, 5 in epoch 2.
  MakeJob(2, 100, {"a", "b"});
  QueueClient a{"a", 0.75, std::nullopt};
  QueueClient b{"b", 2.5, std::nullopt};
  EXPECT_FALSE(job_->Status(false, now_).has_train_loss());
  EXPECT_EQ(job_->Status(false, now_).samples_per_epoch(), 0u);

  auto first = a.Ask(*job_, 250, now_);  // a gets unit 0
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->action(), v1::NextDataUnitResponse::TRAIN);
  EXPECT_EQ(first->progress().epochs(), 2);
  EXPECT_EQ(first->progress().epochs_done(), 0);
  EXPECT_EQ(first->progress().samples_trained(), 0u);
  EXPECT_EQ(first->progress().samples_per_epoch(), 250u);
  EXPECT_FALSE(first->progress().has_train_loss());
  EXPECT_EQ(job_->Status(false, now_).samples_per_epoch(), 250u);

  ASSERT_TRUE(b.Ask(*job_, 250, now_).ok());  // b gets unit 1
  // a completes unit 0 with a loss sum of 0.75 * 100 and gets unit 2.
  auto second = a.Ask(*job_, 250, now_);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->progress().samples_trained(), 100u);
  ASSERT_TRUE(second->progress().has_train_loss());
  EXPECT_DOUBLE_EQ(second->progress().train_loss(), 75.0 / 100.0);
  EXPECT_DOUBLE_EQ(job_->Status(false, now_).train_loss(), 0.75);

  // b completes unit 1 (loss sum 250) and gets unit 3 (epoch 2).
  auto third = b.Ask(*job_, 250, now_);
  ASSERT_TRUE(third.ok());
  EXPECT_DOUBLE_EQ(third->progress().train_loss(), 250.0 / 100.0);

  // a completes unit 2 (50 samples, loss sum 37.5), which ends epoch 1, and
  // gets unit 4.
  a.loss = 37.5 / 50.0;
  auto fourth = a.Ask(*job_, 250, now_);
  ASSERT_TRUE(fourth.ok());
  ASSERT_EQ(fourth->action(), v1::NextDataUnitResponse::TRAIN);
  EXPECT_EQ(fourth->finished_epochs_size(), 1);
  EXPECT_EQ(fourth->progress().epochs_done(), 1);
  EXPECT_EQ(fourth->progress().samples_trained(), 250u);
  EXPECT_DOUBLE_EQ(fourth->progress().train_loss(), 37.5 / 50.0);
  // The epoch's record keeps the epoch's own mean.
  EXPECT_DOUBLE_EQ(job_->Status(true, now_).history(0).train_loss(),
                   (75.0 + 250.0 + 37.5) / 250.0);

  a.loss = 1.0;
  auto fifth = a.Ask(*job_, 250, now_);  // completes unit 4, gets unit 5
  ASSERT_TRUE(fifth.ok());
  EXPECT_DOUBLE_EQ(fifth->progress().train_loss(), 1.0);
  a.loss = 3.0;
  auto wait = a.Ask(*job_, 250, now_);  // completes unit 5; b holds unit 3
  ASSERT_TRUE(wait.ok());
  ASSERT_EQ(wait->action(), v1::NextDataUnitResponse::WAIT);
  EXPECT_DOUBLE_EQ(wait->progress().train_loss(), 3.0);
  // A request that completes nothing leaves the loss as it was.
  auto idle = a.Ask(*job_, 250, now_);
  ASSERT_TRUE(idle.ok());
  EXPECT_EQ(idle->action(), v1::NextDataUnitResponse::WAIT);
  EXPECT_DOUBLE_EQ(idle->progress().train_loss(), 3.0);
  EXPECT_EQ(idle->progress().samples_trained(), 400u);

  // b completes the last unit: DONE, with the final progress.
  b.loss = 0.5;
  auto done = b.Ask(*job_, 250, now_);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_EQ(done->progress().epochs_done(), 2);
  EXPECT_EQ(done->progress().samples_trained(), 500u);
  EXPECT_DOUBLE_EQ(done->progress().train_loss(), 0.5);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_DOUBLE_EQ(status.train_loss(), 0.5);
  EXPECT_EQ(status.samples_per_epoch(), 250u);
}

// The metrics view carries the latest validation only, and the count.
TEST(JobObservabilityTest, MetricsViewHasLatestValidationAndCount) {
  Job job("job-1", JobConfig::FromNormalized(SpecWith("sgd")));
  JobMetricsView view = job.MetricsView(absl::Now());
  EXPECT_EQ(view.validations, 0u);
  EXPECT_EQ(view.status.validations_size(), 0);
  for (int i = 1; i <= 3; ++i) {
    v1::ValidationRecord record;
    record.set_version(static_cast<uint64_t>(i));
    record.set_val_loss(1.0 / i);
    record.set_val_accuracy(0.1 * i);
    ASSERT_TRUE(job.RecordValidation(record, absl::Now()).ok());
  }
  view = job.MetricsView(absl::Now());
  EXPECT_EQ(view.validations, 3u);
  ASSERT_EQ(view.status.validations_size(), 1);
  EXPECT_EQ(view.status.validations(0).version(), 3u);
  EXPECT_DOUBLE_EQ(view.status.validations(0).val_accuracy(), 0.1 * 3);
  EXPECT_EQ(view.status.history_size(), 0);
}

}  // namespace
}  // namespace mpilearn::server

namespace mpilearn::server {
namespace {

// Every refusal says why in a machine-readable reason (common/error_reason.h),
// with the status codes the job has always used.
TEST(JobErrorReasonTest, RefusalsCarryTheirReason) {
  v1::JobSpec spec = PlainSgd();
  spec.set_max_staleness(1);
  spec.set_epochs(1);
  spec.set_data_unit_size(4);

  auto fresh = std::make_unique<Job>("job-7", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(fresh->AddGroup("g", 1, "h", absl::Now()).ok());
  const absl::Status no_weights =
      fresh->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1, 1}),
                           absl::Now())
          .status();
  EXPECT_EQ(no_weights.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(no_weights), v1::ERROR_REASON_JOB_STATE);

  auto job = JobWithWeights(spec, {4, 8});
  // Group unknown: never registered (NOT_FOUND), not active
  // (FAILED_PRECONDITION).
  const absl::Status never = job->Touch("g-404", absl::Now());
  EXPECT_EQ(never.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(never), v1::ERROR_REASON_GROUP_UNKNOWN);
  GradientUpdate stranger = UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1, 1});
  stranger.group_id = "g-404";
  const absl::Status inactive =
      job->ApplyGradient(stranger, absl::Now()).status();
  EXPECT_EQ(inactive.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(inactive), v1::ERROR_REASON_GROUP_UNKNOWN);
  v1::LeaveRequest leave_unknown;
  leave_unknown.set_group_id("g-404");
  EXPECT_EQ(ReasonOf(job->Leave(leave_unknown).status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);

  // Invalid request: wrong kind, wrong layout.
  EXPECT_EQ(ReasonOf(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_DELTA, 0, {1, 1}),
                                        absl::Now())
                         .status()),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1}),
                                        absl::Now())
                         .status()),
            v1::ERROR_REASON_INVALID_REQUEST);

  // Stale.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {0, 0}),
                                   absl::Now())
                    .ok());
  }
  const absl::Status stale =
      job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 0, {1, 1}),
                         absl::Now())
          .status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(stale), v1::ERROR_REASON_STALE_UPDATE);

  // Queue mismatch.
  v1::NextDataUnitRequest request;
  request.set_group_id("g");
  request.set_train_samples(8);
  ASSERT_TRUE(job->NextDataUnit(request, absl::Now()).ok());
  v1::NextDataUnitRequest other = request;
  other.set_train_samples(9);
  other.add_completed()->set_unit_id(0);
  EXPECT_EQ(ReasonOf(job->NextDataUnit(other, absl::Now()).status()),
            v1::ERROR_REASON_JOB_STATE);

  // Ended: a second group leaves the job FAILED.
  ASSERT_TRUE(job->AddGroup("g2", 1, "h", absl::Now()).ok());
  v1::LeaveRequest fail;
  fail.set_group_id("g2");
  fail.set_error("out of memory");
  ASSERT_EQ(job->Leave(fail).value(), v1::JOB_STATE_FAILED);
  // A push of the group still training is answered with the frozen
  // weights, not refused (a refusal would end that rank alone); the whole
  // group hears the job ended at its next NextDataUnit.
  const std::vector<float> frozen = job->Weights().value()->values[0];
  AppliedUpdate applied;
  const auto after_end = job->ApplyGradient(UpdateOf(v1::UPDATE_KIND_GRADIENT, 2, {1, 1}),
                                            absl::Now(), &applied);
  ASSERT_TRUE(after_end.ok()) << after_end.status();
  EXPECT_FALSE(applied.applied);
  EXPECT_EQ((*after_end)->values[0], frozen);
  EXPECT_EQ(ReasonOf(job->NextDataUnit(request, absl::Now()).status()),
            v1::ERROR_REASON_JOB_ENDED);
  const absl::Status add_after_end =
      job->AddGroup("g3", 1, "h", absl::Now()).status();
  EXPECT_EQ(add_after_end.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(add_after_end), v1::ERROR_REASON_JOB_ENDED);
}

}  // namespace
}  // namespace mpilearn::server
