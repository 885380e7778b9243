#include "server/job.h"

#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

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
  auto job = std::make_unique<Job>("job-1", SpecWith(optimizer));
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
  auto job = std::make_unique<Job>("job-1", spec);
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

  auto restored = std::make_unique<Job>("job-2", spec);
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
  auto fresh = std::make_unique<Job>("job-3", spec);
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
    job_ = std::make_unique<Job>("job-1", QueueSpec(epochs, unit_size));
    for (const std::string& group : groups) {
      ASSERT_TRUE(job_->AddGroup(group, 1, "test", now_).ok());
    }
  }

  std::unique_ptr<Job> job_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

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

}  // namespace
}  // namespace mpilearn::server

