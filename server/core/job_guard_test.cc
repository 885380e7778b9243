// Guarded weights (Job::ApplyGradient): an update that would make the
// weights or the optimizer state NaN or Inf is refused and leaves the job
// exactly as it was; kMaxRejectedInARow refusals in a row fail the job;
// optimizer.clip_grad_norm scales gradients to a global L2 norm (checked
// against a double-precision reference).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/error_reason.h"
#include "common/spec/job_spec.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/job.h"

namespace mpilearn::server {
namespace {

constexpr int kGuardRuns = 3;  // normal updates before the bad one

v1::JobSpec Spec(const std::string& algorithm, const std::string& optimizer,
                 double learning_rate) {
  v1::JobSpec spec;
  spec.set_algorithm(algorithm);
  spec.mutable_optimizer()->set_name(optimizer);
  spec.mutable_optimizer()->set_learning_rate(learning_rate);
  spec.mutable_easgd()->set_alpha(0.5);
  return spec;
}

std::vector<std::vector<float>> Values(float base) {
  std::vector<std::vector<float>> values = {std::vector<float>(12),
                                            std::vector<float>(3)};
  float x = base;
  for (auto& tensor : values) {
    for (float& v : tensor) {
      v = x;
      x = -0.7f * x + 0.01f;
    }
  }
  return values;
}

std::vector<std::vector<float>> Filled(float value) {
  return {std::vector<float>(12, value), std::vector<float>(3, value)};
}

std::unique_ptr<Job> NewJob(const v1::JobSpec& spec) {
  auto job = std::make_unique<Job>("job-g", JobConfig::FromNormalized(spec));
  EXPECT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
  EXPECT_TRUE(job->InitWeights(MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                               Values(0.5f))
                  .value());
  return job;
}

GradientUpdate Update(const v1::JobSpec& spec,
                      std::vector<std::vector<float>> values) {
  GradientUpdate update;
  update.group_id = "g";
  update.kind = UpdateKindOf(AlgorithmOf(spec));
  update.values = std::move(values);
  return update;
}

// Weights and optimizer state, serialised: equal strings are equal bits.
std::string Bits(const Job& job) {
  JobCheckpoint checkpoint = job.Checkpoint().value();
  return checkpoint.weights.SerializeAsString() + "|" +
         checkpoint.optimizer_state.SerializeAsString();
}

bool AllFinite(const std::vector<std::vector<float>>& values) {
  for (const auto& tensor : values) {
    for (float v : tensor) {
      if (!std::isfinite(v)) return false;
    }
  }
  return true;
}

struct GuardCase {
  std::string name;
  std::string algorithm;
  std::string optimizer;
  double learning_rate;
  // The update that must be refused (after kGuardRuns normal ones).
  float bad_value;
  // Whether the bad update is refused only at its second push (the first
  // one stays finite: gem's c + delta, easgd's move).
  bool second_push;
};

class JobGuardTest : public ::testing::TestWithParam<GuardCase> {};

// The cases: SGD whose step lr * g overflows to -Inf; Adam whose
// v = (1 - beta2) g^2 overflows with one 3e38 gradient while the weights
// stay finite (m / Inf = 0), which froze the job for good; gem and easgd
// centres pushed past the fp32 range. Each refused update leaves weights
// and state bit for bit as they were; the next normal update gives exactly
// what a twin job that never saw the bad one gives.
TEST_P(JobGuardTest, RefusedUpdateLeavesJobUntouched) {
  const GuardCase& c = GetParam();
  const v1::JobSpec spec = Spec(c.algorithm, c.optimizer, c.learning_rate);
  auto job = NewJob(spec);
  auto twin = NewJob(spec);
  const auto normal = [&](int i) {
    return Update(spec, c.algorithm == "easgd" ? Values(0.3f + 0.1f * i)
                                               : Values(0.01f * (i + 1)));
  };
  for (int i = 0; i < kGuardRuns; ++i) {
    ASSERT_TRUE(job->ApplyGradient(normal(i), absl::Now()).ok());
    ASSERT_TRUE(twin->ApplyGradient(normal(i), absl::Now()).ok());
  }
  if (c.second_push) {
    // Accepted: still finite. The twin takes it too.
    ASSERT_TRUE(job->ApplyGradient(Update(spec, Filled(c.bad_value)), absl::Now()).ok());
    ASSERT_TRUE(twin->ApplyGradient(Update(spec, Filled(c.bad_value)), absl::Now()).ok());
  }
  const std::string before = Bits(*job);
  const uint64_t version = job->Status(false, absl::Now()).version();

  const float second = c.algorithm == "easgd" ? -c.bad_value : c.bad_value;
  const absl::Status refused =
      job->ApplyGradient(Update(spec, Filled(second)), absl::Now()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_UPDATE_REJECTED);
  EXPECT_NE(refused.message().find("learning_rate"), std::string::npos);
  EXPECT_NE(refused.message().find("clip_grad_norm"), std::string::npos);
  EXPECT_EQ(Bits(*job), before);
  const v1::JobStatus status = job->Status(false, absl::Now());
  EXPECT_EQ(status.updates_rejected(), 1u);
  EXPECT_EQ(status.version(), version);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(AllFinite(job->Weights().value()->values));

  // A normal update afterwards: exactly the twin's result.
  auto a = job->ApplyGradient(normal(7), absl::Now());
  auto b = twin->ApplyGradient(normal(7), absl::Now());
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(Bits(*job), Bits(*twin));
  EXPECT_TRUE(AllFinite(job->Weights().value()->values));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, JobGuardTest,
    ::testing::Values(
        // lr * 1e30 = 1e39: every weight would be -Inf.
        GuardCase{"sgd", "downpour", "sgd", 1e9, 1e30f, false},
        // One 3e38 gradient: v overflows, the weights stay finite.
        GuardCase{"adam", "downpour", "adam", 1e-3, 3e38f, false},
        GuardCase{"adamw", "sync", "adamw", 1e-3, 3e38f, false},
        GuardCase{"rmsprop", "downpour", "rmsprop", 1e-2, 3e38f, false},
        GuardCase{"adagrad", "downpour", "adagrad", 1e-2, 3e38f, false},
        GuardCase{"adadelta", "downpour", "adadelta", 1.0, 3e38f, false},
        // 3e38 + 3e38 overflows.
        GuardCase{"gem", "gem", "sgd", 1e-2, 3e38f, true},
        // c ~ 0.5 * 3e38, then x = -3e38: x - c overflows.
        GuardCase{"easgd", "easgd", "sgd", 1e-2, 3e38f, true}),
    [](const ::testing::TestParamInfo<GuardCase>& info) {
      return info.param.name;
    });

// Normal training takes the fast path: after the first (tracked, undoable)
// update, each update is applied in place to the snapshot nobody else
// holds, without the copy an undoable update makes.
TEST(JobGuardTest, NormalUpdatesAreAppliedInPlace) {
  for (const std::string optimizer :
       {"sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta"}) {
    for (const std::string algorithm : {"downpour", "gem"}) {
      if (algorithm == "gem" && optimizer != "sgd") continue;
      SCOPED_TRACE(optimizer + " " + algorithm);
      const v1::JobSpec spec = Spec(algorithm, optimizer, 1e-3);
      auto job = NewJob(spec);
      const WeightsSnapshot* previous = nullptr;
      for (int i = 0; i < 300; ++i) {
        const WeightsSnapshot* current =
            job->ApplyGradient(Update(spec, Values(3.0f)), absl::Now())
                .value()
                .get();  // the reply is released at once
        if (i >= 2) {
          EXPECT_EQ(current, previous) << "update " << i;
        }
        previous = current;
      }
    }
  }
}

// Refusals in a row fail the job after kMaxRejectedInARow; an applied
// update in between starts the count again.
TEST(JobGuardTest, RefusalsInARowFailTheJob) {
  const v1::JobSpec spec = Spec("downpour", "adam", 1e-3);
  auto job = NewJob(spec);
  const auto bad = [&] { return Update(spec, Filled(3e38f)); };
  for (int i = 0; i < Job::kMaxRejectedInARow - 1; ++i) {
    ASSERT_EQ(ReasonOf(job->ApplyGradient(bad(), absl::Now()).status()),
              v1::ERROR_REASON_UPDATE_REJECTED);
  }
  ASSERT_TRUE(job->ApplyGradient(Update(spec, Values(0.1f)), absl::Now()).ok());
  for (int i = 0; i < Job::kMaxRejectedInARow - 1; ++i) {
    ASSERT_EQ(ReasonOf(job->ApplyGradient(bad(), absl::Now()).status()),
              v1::ERROR_REASON_UPDATE_REJECTED);
  }
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  const std::string before = Bits(*job);

  const absl::Status last = job->ApplyGradient(bad(), absl::Now()).status();
  EXPECT_EQ(ReasonOf(last), v1::ERROR_REASON_UPDATE_REJECTED);
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  const v1::JobStatus status = job->Status(false, absl::Now());
  EXPECT_EQ(status.updates_rejected(),
            2u * Job::kMaxRejectedInARow - 1);
  EXPECT_NE(status.message().find("10 updates in a row were refused"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("lower optimizer.learning_rate"),
            std::string::npos);
  EXPECT_EQ(last.message(), status.message());
  EXPECT_EQ(Bits(*job), before);  // the last one was not applied either
  // The job takes no more updates: a push gets the weights back unapplied.
  AppliedUpdate applied;
  ASSERT_TRUE(job->ApplyGradient(Update(spec, Values(0.1f)), absl::Now(), &applied).ok());
  EXPECT_FALSE(applied.applied);
  EXPECT_EQ(Bits(*job), before);
}

// The count survives a checkpoint (JobStatus.updates_rejected).
TEST(JobGuardTest, RejectedCountIsCheckpointed) {
  const v1::JobSpec spec = Spec("downpour", "sgd", 1e9);
  auto job = NewJob(spec);
  ASSERT_FALSE(job->ApplyGradient(Update(spec, Filled(1e30f)), absl::Now()).ok());
  v1::JobCheckpointFile file = job->SaveCheckpoint(absl::Now()).value();
  Job resumed("job-g", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(resumed.Resume(file).ok());
  EXPECT_EQ(resumed.Status(false, absl::Now()).updates_rejected(), 1u);
}

// clip_grad_norm against a double-precision reference: the norm is over
// the trainable tensors only (the buffer's values are running statistics,
// not gradient), the coefficient PyTorch's clip / (norm + 1e-6), applied
// when below 1.
TEST(JobClipTest, ScalesGradientToTheNormLikePyTorch) {
  for (const double clip : {0.5, 1.0, 100.0}) {
    v1::JobSpec spec = Spec("downpour", "sgd", 0.1);
    spec.mutable_optimizer()->set_clip_grad_norm(clip);
    ASSERT_TRUE(NormalizeOptimizerSpec(spec.mutable_optimizer()).ok());
    auto job = std::make_unique<Job>("job-c", JobConfig::FromNormalized(spec));
    ASSERT_TRUE(job->AddGroup("g", 1, "test", absl::Now()).ok());
    v1::TensorSetHeader header = MakeFloat32Header(0, {"w", "rm"}, {{4, 3}, {3}});
    header.mutable_tensors(1)->set_buffer(true);
    const std::vector<std::vector<float>> initial = Values(0.5f);
    ASSERT_TRUE(job->InitWeights(header, initial).value());

    const std::vector<std::vector<float>> gradient = Values(1.7f);
    auto reply = job->ApplyGradient(Update(spec, gradient), absl::Now());
    ASSERT_TRUE(reply.ok()) << reply.status();

    double sum = 0.0;
    for (float g : gradient[0]) sum += static_cast<double>(g) * g;
    const double norm = std::sqrt(sum);
    const double coefficient = std::min(1.0, clip / (norm + 1e-6));
    const std::vector<std::vector<float>>& got = (*reply)->values;
    for (size_t i = 0; i < gradient[0].size(); ++i) {
      const double want = initial[0][i] - 0.1 * coefficient * gradient[0][i];
      EXPECT_NEAR(got[0][i], want, 1e-6 * (1.0 + std::fabs(want)))
          << "clip " << clip << " element " << i;
    }
    EXPECT_EQ(got[1], gradient[1]);  // the buffer takes the update's values
    // The clipped step's own norm is the clip (when it clips).
    double step = 0.0;
    for (size_t i = 0; i < gradient[0].size(); ++i) {
      const double d = (static_cast<double>(initial[0][i]) - got[0][i]) / 0.1;
      step += d * d;
    }
    EXPECT_NEAR(std::sqrt(step), std::min(norm, clip), 1e-5 * norm);
  }
}

TEST(JobClipTest, SpecValidatesClipGradNorm) {
  for (const double bad : {-1.0, std::nan(""), double{INFINITY}}) {
    v1::JobSpec spec = Spec("downpour", "sgd", 0.1);
    spec.mutable_optimizer()->set_clip_grad_norm(bad);
    const absl::Status status = NormalizeOptimizerSpec(spec.mutable_optimizer());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("optimizer.clip_grad_norm"),
              std::string::npos)
        << status;
  }
  v1::JobSpec off = Spec("downpour", "sgd", 0.1);
  off.mutable_optimizer()->set_clip_grad_norm(0.0);
  EXPECT_TRUE(NormalizeOptimizerSpec(off.mutable_optimizer()).ok());
  EXPECT_FALSE(ClipsGradients(JobConfig::FromNormalized(off)));
}

}  // namespace
}  // namespace mpilearn::server
