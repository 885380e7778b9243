#include "server/core/update_admission.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

using Floats = std::vector<std::vector<float>>;

// A job of `algorithm` with adam on the master.
v1::JobSpec Spec(const std::string& algorithm) {
  v1::JobSpec spec;
  spec.set_algorithm(algorithm);
  spec.mutable_optimizer()->set_name("adam");
  return spec;
}

// Tensors of 7 and 3 values from `seed` on, in steps of a quarter.
Floats Values(int seed) {
  Floats out = {std::vector<float>(7), std::vector<float>(3)};
  float x = 0.25f * static_cast<float>(seed);
  for (auto& tensor : out) {
    for (float& v : tensor) v = (x += 0.25f);
  }
  return out;
}

TEST(UpdateAdmissionTest, StalenessScaleIsInverseOnlyWhenAsked) {
  v1::JobSpec spec = Spec("downpour");
  for (uint64_t s : {0, 1, 2, 7}) EXPECT_EQ(StalenessScale(JobConfig::FromNormalized(spec), s), 1.0f);
  spec.set_staleness_scaling("inverse");
  EXPECT_EQ(StalenessScale(JobConfig::FromNormalized(spec), 0), 1.0f);
  EXPECT_EQ(StalenessScale(JobConfig::FromNormalized(spec), 1), 1.0f);
  EXPECT_EQ(StalenessScale(JobConfig::FromNormalized(spec), 2), 0.5f);
  EXPECT_FLOAT_EQ(StalenessScale(JobConfig::FromNormalized(spec), 7), static_cast<float>(1.0 / 7.0));
}

GradientUpdate UpdateOf(v1::UpdateKind kind, Floats values) {
  GradientUpdate update;
  update.kind = kind;
  update.values = std::move(values);
  return update;
}

TEST(UpdateAdmissionTest, BadUpdatesAreInvalidRequests) {
  WeightsSnapshot weights;
  weights.header = MakeFloat32Header(0, {"w", "b"}, {{7}, {3}});
  weights.values = Values(4);
  const v1::JobSpec gem = Spec("gem");
  EXPECT_TRUE(
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, Values(5)), -1, JobConfig::FromNormalized(gem), "job-1",
                  weights)
          .ok());
  Floats short_tensor = Values(5);
  short_tensor[1].pop_back();
  const absl::Status checks[] = {
      // Not the kind gem takes.
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_GRADIENT, Values(5)), -1, JobConfig::FromNormalized(gem),
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, {Values(5)[0]}), -1, JobConfig::FromNormalized(gem),
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, short_tensor), -1, JobConfig::FromNormalized(gem),
                  "job-1", weights),
      CheckUpdate(UpdateOf(v1::UPDATE_KIND_DELTA, Values(5)), 1, JobConfig::FromNormalized(gem), "job-1",
                  weights),
  };
  for (const absl::Status& status : checks) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_INVALID_REQUEST) << status;
  }
  EXPECT_NE(checks[3].message().find("'b'"), std::string::npos);
}

TEST(UpdateAdmissionTest, StalenessBeyondTheBoundIsAStaleUpdate) {
  v1::JobSpec spec = Spec("downpour");
  EXPECT_EQ(StalenessOf(JobConfig::FromNormalized(spec), 3, 10).value(), 7u);  // no bound
  EXPECT_EQ(StalenessOf(JobConfig::FromNormalized(spec), 12, 10).value(), 0u);
  spec.set_max_staleness(2);
  EXPECT_EQ(StalenessOf(JobConfig::FromNormalized(spec), 8, 10).value(), 2u);
  const absl::Status stale = StalenessOf(JobConfig::FromNormalized(spec), 7, 10).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(stale), v1::ERROR_REASON_STALE_UPDATE);
}

TEST(UpdateAdmissionTest, InitialWeightsAreChecked) {
  const v1::TensorSetHeader header =
      MakeFloat32Header(0, {"w", "b"}, {{7}, {3}});
  auto sizes = CheckInitialWeights(header, Values(7));
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<size_t>{7, 3}));
  Floats bad = Values(7);
  bad[0][3] = std::nanf("");
  EXPECT_EQ(ReasonOf(CheckInitialWeights(header, bad).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(CheckInitialWeights(header, {Values(7)[0]}).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_EQ(ReasonOf(CheckInitialWeights(v1::TensorSetHeader(), {}).status()),
            v1::ERROR_REASON_INVALID_REQUEST);
}

// The scan behind admission and the guard: the first non-finite tensor, the
// largest magnitude, the sums of squares for clipping.
TEST(UpdateAdmissionTest, ScanFindsNonFiniteMaximumAndSquares) {
  Floats values = {{1.0f, -3.5f, 2.0f}, {0.5f, 0.25f}};
  UpdateScan scan = ScanUpdate(values, /*squares=*/true);
  EXPECT_EQ(scan.non_finite, -1);
  EXPECT_EQ(scan.max_abs, 3.5);
  ASSERT_EQ(scan.sum_squares.size(), 2u);
  EXPECT_DOUBLE_EQ(scan.sum_squares[0], 1.0 + 12.25 + 4.0);
  EXPECT_DOUBLE_EQ(scan.sum_squares[1], 0.25 + 0.0625);
  EXPECT_TRUE(ScanUpdate(values, false).sum_squares.empty());
  values[1][1] = std::nanf("");
  EXPECT_EQ(ScanUpdate(values, true).non_finite, 1);
}

// AdmitUpdate: CheckUpdate's refusals first, then staleness (a stale
// refusal, which the job counts), then the scale: staleness times clipping.
TEST(UpdateAdmissionTest, AdmitChecksThenStalenessThenScale) {
  WeightsSnapshot weights;
  weights.header = MakeFloat32Header(10, {"w", "b"}, {{7}, {3}});
  weights.values = Values(4);
  v1::JobSpec spec = Spec("downpour");
  spec.set_max_staleness(4);
  spec.set_staleness_scaling("inverse");

  GradientUpdate update = UpdateOf(v1::UPDATE_KIND_GRADIENT, Values(5));
  update.base_version = 8;
  UpdateScan scan = ScanUpdate(update.values, ClipsGradients(JobConfig::FromNormalized(spec)));
  absl::StatusOr<Admission> admitted =
      AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->staleness, 2u);
  EXPECT_EQ(admitted->scale, 0.5f);
  EXPECT_EQ(admitted->max_update, scan.max_abs);

  update.base_version = 5;  // staleness 5 > 4
  const absl::Status stale =
      AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(IsStaleRefusal(stale));
  // A bad update is refused as such even when it is stale too.
  update.kind = v1::UPDATE_KIND_DELTA;
  const absl::Status bad =
      AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights).status();
  EXPECT_EQ(ReasonOf(bad), v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_FALSE(IsStaleRefusal(bad));

  // Clipping multiplies in: a norm of 100 clipped to 1.
  update.kind = v1::UPDATE_KIND_GRADIENT;
  update.base_version = 10;
  update.values = {std::vector<float>(7, 0.0f), std::vector<float>(3, 0.0f)};
  update.values[0][0] = 100.0f;
  spec.mutable_optimizer()->set_clip_grad_norm(1.0);
  scan = ScanUpdate(update.values, ClipsGradients(JobConfig::FromNormalized(spec)));
  admitted = AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_FLOAT_EQ(admitted->scale, static_cast<float>(1.0 / (100.0 + 1e-6)));
  // A slice of a larger update (a shard's) is clipped by the whole norm;
  // a claimed norm below what arrived changes nothing.
  update.update_norm = 400.0;
  admitted = AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_FLOAT_EQ(admitted->scale, static_cast<float>(1.0 / (400.0 + 1e-6)));
  update.update_norm = 3.0;
  admitted = AdmitUpdate(update, scan, JobConfig::FromNormalized(spec), "job-1", weights);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_FLOAT_EQ(admitted->scale, static_cast<float>(1.0 / (100.0 + 1e-6)));
}

TEST(UpdateAdmissionTest, AlreadyAppliedFollowsTheRanksSequence) {
  std::map<int, AppliedSequences> applied;
  for (const uint64_t sequence : {1u, 2u, 3u, 4u, 5u}) applied[0].Add(sequence);
  applied[1].Add(2);
  GradientUpdate update;
  update.rank = 0;
  for (const uint64_t seen : {1u, 4u, 5u}) {
    update.sequence = seen;
    EXPECT_TRUE(AlreadyApplied(update, applied)) << seen;
  }
  update.sequence = 6;
  EXPECT_FALSE(AlreadyApplied(update, applied));
  update.sequence = 0;  // untracked
  EXPECT_FALSE(AlreadyApplied(update, applied));
  update.rank = 2;  // no push of its own yet
  update.sequence = 1;
  EXPECT_FALSE(AlreadyApplied(update, applied));
  update.rank = 1;  // only 2 applied: 1 is still to come
  EXPECT_FALSE(AlreadyApplied(update, applied));
}

// Several updates in flight land out of order: each is applied once, and
// one overtaken by a newer push is still applied when it arrives.
TEST(UpdateAdmissionTest, AppliedSequencesTakeUpdatesOutOfOrder) {
  AppliedSequences applied;
  applied.Add(1);
  applied.Add(3);  // 2 is still on its way
  EXPECT_TRUE(applied.Contains(1));
  EXPECT_FALSE(applied.Contains(2));
  EXPECT_TRUE(applied.Contains(3));
  applied.Add(2);
  EXPECT_TRUE(applied.Contains(2));
  EXPECT_FALSE(applied.Contains(4));
  // A jump of the window: what fell out of it counts as applied, what
  // stays in it is remembered exactly.
  applied.Add(100);
  EXPECT_TRUE(applied.Contains(3));  // 97 below: beyond the window
  EXPECT_FALSE(applied.Contains(99));
  EXPECT_FALSE(applied.Contains(37));  // 63 below: inside, never added
  applied.Add(37);
  EXPECT_TRUE(applied.Contains(37));
  applied.Add(200);
  EXPECT_TRUE(applied.Contains(100));  // out of the window now
  EXPECT_FALSE(applied.Contains(199));
  EXPECT_FALSE(applied.Contains(0));  // untracked
}

}  // namespace
}  // namespace mpilearn::server
