#include "server/job.h"

#include <random>

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

}  // namespace
}  // namespace mpilearn::server
