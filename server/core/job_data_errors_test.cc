// Job's handling of bad data: rows skipped for bad values
// (CompletedUnit.skipped with data.bad_values "skip") and groups that leave
// with a data error (LeaveRequest.data_error): the unit goes to another
// group, and the job fails only when one unit has failed
// data.max_unit_failures times or no other group is left to retry it. The
// queue's own cases are in data_queue_test.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/job.h"

namespace mpilearn::server {
namespace {

// 4 files of 10, 0, 7 and 5 rows in units of 4: 3 + 0 + 2 + 2 = 7 units per
// epoch (every one at least 1 row), 22 rows.
const std::vector<int64_t> kRows = {10, 0, 7, 5};
constexpr int64_t kRowsTotal = 22;
constexpr int64_t kUnitsPerEpoch = 7;

v1::JobSpec FileSpec(const std::string& bad_values, int max_unit_failures) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_epochs(1);
  spec.set_data_unit_size(4);
  spec.set_seed(9);
  spec.mutable_data()->set_bad_values(bad_values);
  spec.mutable_data()->set_max_unit_failures(max_unit_failures);
  return spec;
}

// One group's side: completes the unit it trains (skipping `skip` of its
// rows) and asks for the next.
struct Client {
  std::string group_id;
  bool read_ahead = false;
  uint64_t skip = 0;
  std::optional<v1::DataUnit> held;

  v1::NextDataUnitRequest Request() const {
    v1::NextDataUnitRequest request;
    request.set_job_id("job-1");
    request.set_group_id(group_id);
    request.set_train_samples(kRowsTotal);
    request.mutable_file_rows()->Add(kRows.begin(), kRows.end());
    request.set_read_ahead(read_ahead);
    if (held.has_value()) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(held->unit_id());
      done->set_samples(static_cast<uint64_t>(held->end() - held->begin()) -
                        skip);
      done->set_skipped(skip);
      done->set_loss_sum(static_cast<double>(done->samples()));
    }
    return request;
  }

  // The unit id trained now, or -1 (WAIT, DONE, an error).
  int64_t Ask(Job& job, absl::Time now) {
    auto response = job.NextDataUnit(Request(), now);
    if (!response.ok()) return -1;
    held.reset();
    if (response->action() != v1::NextDataUnitResponse::TRAIN) return -1;
    held = response->unit();
    return held->unit_id();
  }
};

v1::LeaveRequest DataErrorLeave(const std::string& group_id,
                                const std::string& error) {
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id(group_id);
  leave.set_error(error);
  leave.set_data_error(true);
  return leave;
}

// "unit U (file F rows [B, E))", as the master names a file unit.
std::string Describe(const v1::DataUnit& unit) {
  return absl::StrCat("unit ", unit.unit_id(), " (file ", unit.file(),
                      " rows [", unit.begin(), ", ", unit.end(), "))");
}

class JobDataErrorsTest : public ::testing::Test {
 protected:
  void MakeJob(const v1::JobSpec& spec,
               const std::vector<std::string>& groups) {
    job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(spec));
    for (const std::string& group : groups) {
      ASSERT_TRUE(job_->AddGroup(group, 1, "test", now_).ok());
    }
  }

  std::unique_ptr<Job> job_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

// Every unit skips one row: the epoch still completes, its record and
// samples_trained count the rows trained, samples_skipped the rest.
TEST_F(JobDataErrorsTest, SkippedRowsAreCountedAndTheEpochCompletes) {
  MakeJob(FileSpec("skip", 3), {"a"});
  Client a{"a", /*read_ahead=*/true, /*skip=*/1};
  for (int64_t slot = 0; slot < kUnitsPerEpoch; ++slot) {
    ASSERT_EQ(a.Ask(*job_, now_), slot);
  }
  auto end = job_->NextDataUnit(a.Request(), now_);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(end->finish());
  const v1::JobStatus status = job_->Status(/*with_history=*/true, now_);
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).samples(),
            static_cast<uint64_t>(kRowsTotal - kUnitsPerEpoch));
  EXPECT_EQ(status.samples_trained(),
            static_cast<uint64_t>(kRowsTotal - kUnitsPerEpoch));
  EXPECT_EQ(status.samples_skipped(), static_cast<uint64_t>(kUnitsPerEpoch));
  EXPECT_EQ(status.groups(0).samples_trained(),
            static_cast<uint64_t>(kRowsTotal - kUnitsPerEpoch));
}

// With bad_values "fail" a completion that skips rows is refused and
// changes nothing.
TEST_F(JobDataErrorsTest, SkippedRowsAreRefusedWhenTheSpecFails) {
  MakeJob(FileSpec("fail", 3), {"a"});
  Client a{"a"};
  ASSERT_EQ(a.Ask(*job_, now_), 0);
  a.skip = 1;
  const auto refused = job_->NextDataUnit(a.Request(), now_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(refused.status()), v1::ERROR_REASON_INVALID_REQUEST);
  a.skip = 0;
  EXPECT_EQ(a.Ask(*job_, now_), 1);
  EXPECT_EQ(job_->Status(false, now_).samples_skipped(), 0u);
}

// A group that cannot read its unit leaves with a data error while another
// group trains: the job stays RUNNING, the failure and its error are in the
// status, and the other group gets the failed unit (then the one reserved
// for the leaver) before any fresh unit.
TEST_F(JobDataErrorsTest, DataErrorHandsTheUnitToAnotherGroup) {
  MakeJob(FileSpec("fail", 3), {"a", "b"});
  Client a{"a", /*read_ahead=*/true};
  Client b{"b"};
  auto first = job_->NextDataUnit(a.Request(), now_);  // trains 0, reserves 1
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->unit().unit_id(), 0);
  ASSERT_EQ(first->next_unit().unit_id(), 1);
  ASSERT_EQ(b.Ask(*job_, now_), 2);

  const std::string error = "rank 0: NaN in train file 0 row 2";
  LeaveEffect effect;
  auto state = job_->Leave(DataErrorLeave("a", error), &effect);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(effect.ended);
  v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.unit_failures(), 1u);
  EXPECT_EQ(status.last_data_error(), error);
  EXPECT_EQ(status.units_requeued(), 2u);
  EXPECT_NE(status.message().find(absl::StrCat(
                "group a could not train ", Describe(first->unit()),
                " (failure 1 of 3 allowed)")),
            std::string::npos)
      << status.message();

  EXPECT_EQ(b.Ask(*job_, now_), 0);  // the failed unit
  EXPECT_EQ(b.Ask(*job_, now_), 1);  // a's reservation
  EXPECT_EQ(b.Ask(*job_, now_), 3);  // fresh
}

// The same unit failing max_unit_failures times (in two groups) fails the
// job with a message naming the unit and the last error, though a third
// group is still there.
TEST_F(JobDataErrorsTest, UnitFailingMaxTimesFailsTheJob) {
  MakeJob(FileSpec("fail", 2), {"a", "b", "c"});
  Client a{"a"};
  Client b{"b"};
  Client c{"c"};
  ASSERT_EQ(a.Ask(*job_, now_), 0);
  const v1::DataUnit failing = *a.held;
  ASSERT_EQ(b.Ask(*job_, now_), 1);
  ASSERT_EQ(c.Ask(*job_, now_), 2);
  ASSERT_EQ(job_->Leave(DataErrorLeave("a", "cannot read file 0")).value(),
            v1::JOB_STATE_RUNNING);
  ASSERT_EQ(b.Ask(*job_, now_), 0);

  LeaveEffect effect;
  auto state =
      job_->Leave(DataErrorLeave("b", "cannot read file 0 again"), &effect);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(effect.ended);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.message(), absl::StrCat(Describe(failing),
                                           " failed 2 times: "
                                           "cannot read file 0 again"));
  EXPECT_EQ(status.unit_failures(), 2u);
  EXPECT_EQ(status.last_data_error(), "cannot read file 0 again");
  const auto refused = job_->NextDataUnit(c.Request(), now_);
  EXPECT_EQ(ReasonOf(refused.status()), v1::ERROR_REASON_JOB_ENDED);
}

// A data error from the only group left fails the job: nobody can retry.
TEST_F(JobDataErrorsTest, DataErrorOfTheOnlyGroupFailsTheJob) {
  MakeJob(FileSpec("fail", 3), {"a", "b"});
  Client a{"a"};
  ASSERT_EQ(a.Ask(*job_, now_), 0);
  v1::LeaveRequest gone;
  gone.set_job_id("job-1");
  gone.set_group_id("b");
  ASSERT_EQ(job_->Leave(gone).value(), v1::JOB_STATE_RUNNING);

  LeaveEffect effect;
  ASSERT_EQ(job_->Leave(DataErrorLeave("a", "bad file"), &effect).value(),
            v1::JOB_STATE_FAILED);
  EXPECT_TRUE(effect.ended);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.message(),
            "group a failed: bad file (no other group serves the job to "
            "retry unit 0)");
  EXPECT_EQ(status.unit_failures(), 1u);
  EXPECT_EQ(status.last_data_error(), "bad file");
}

// A data error from a group that holds no unit fails the job at once, as
// any error does; data_error without an error is an ordinary leave.
TEST_F(JobDataErrorsTest, DataErrorWithoutAUnitFailsAtOnce) {
  MakeJob(FileSpec("fail", 3), {"a", "b", "c"});
  Client c{"c"};
  ASSERT_EQ(c.Ask(*job_, now_), 0);
  ASSERT_EQ(job_->Leave(DataErrorLeave("a", "")).value(),
            v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job_->Status(false, now_).unit_failures(), 0u);

  LeaveEffect effect;
  ASSERT_EQ(job_->Leave(DataErrorLeave("b", "cannot open file 3"), &effect)
                .value(),
            v1::JOB_STATE_FAILED);
  EXPECT_TRUE(effect.ended);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.message(), "group b failed: cannot open file 3");
  EXPECT_EQ(status.unit_failures(), 0u);
  EXPECT_EQ(status.last_data_error(), "");
}

// A long error is kept to DataQueue::kMaxDataErrorBytes in last_data_error
// and in the job's message.
TEST_F(JobDataErrorsTest, LongErrorIsBounded) {
  MakeJob(FileSpec("fail", 3), {"a", "b"});
  Client a{"a"};
  ASSERT_EQ(a.Ask(*job_, now_), 0);
  const std::string error(10000, 'e');
  ASSERT_EQ(job_->Leave(DataErrorLeave("a", error)).value(),
            v1::JOB_STATE_RUNNING);
  const std::string kept = job_->Status(false, now_).last_data_error();
  EXPECT_EQ(kept, error.substr(0, DataQueue::kMaxDataErrorBytes - 3) + "...");

  Client b{"b"};
  ASSERT_EQ(b.Ask(*job_, now_), 0);
  ASSERT_EQ(job_->Leave(DataErrorLeave("b", error)).value(),
            v1::JOB_STATE_FAILED);
  const v1::JobStatus status = job_->Status(false, now_);
  EXPECT_EQ(status.last_data_error(), kept);
  EXPECT_EQ(status.message(),
            absl::StrCat("group b failed: ", kept,
                         " (no other group serves the job to retry unit 0)"));
}

// A checkpoint keeps the skipped rows, the failure count and the last
// error; the resumed job hands the failed unit out again.
TEST_F(JobDataErrorsTest, CheckpointKeepsTheCounters) {
  MakeJob(FileSpec("skip", 3), {"a", "b"});
  ASSERT_TRUE(
      job_->InitWeights(MakeFloat32Header(0, {"w"}, {{2}}), {{1.0f, 2.0f}})
          .value());
  Client a{"a", /*read_ahead=*/false, /*skip=*/1};
  Client b{"b"};
  ASSERT_EQ(a.Ask(*job_, now_), 0);
  const uint64_t rows = static_cast<uint64_t>(a.held->end() - a.held->begin());
  ASSERT_EQ(a.Ask(*job_, now_), 1);  // 0 done, 1 of its rows skipped
  ASSERT_EQ(b.Ask(*job_, now_), 2);
  ASSERT_EQ(job_->Leave(DataErrorLeave("a", "bad row")).value(),
            v1::JOB_STATE_RUNNING);
  auto file = job_->SaveCheckpoint(now_);
  ASSERT_TRUE(file.ok()) << file.status();

  Job resumed("job-1", JobConfig::FromNormalized(FileSpec("skip", 3)));
  ASSERT_TRUE(resumed.Resume(*file).ok());
  const v1::JobStatus status = resumed.Status(false, now_);
  EXPECT_EQ(status.samples_skipped(), 1u);
  EXPECT_EQ(status.samples_trained(), rows - 1);
  EXPECT_EQ(status.unit_failures(), 1u);
  EXPECT_EQ(status.last_data_error(), "bad row");
  ASSERT_TRUE(resumed.AddGroup("c", 1, "test", now_).ok());
  Client c{"c"};
  EXPECT_EQ(c.Ask(resumed, now_), 1);  // a's failed unit, first given back
}

}  // namespace
}  // namespace mpilearn::server
