#include "server/core/data_queue.h"

#include <set>
#include <string>
#include <vector>

#include "common/error_reason.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

v1::JobSpec Spec(int epochs, int unit_size) {
  v1::JobSpec spec;
  spec.set_epochs(epochs);
  spec.set_data_unit_size(unit_size);
  return spec;
}

// A request of group "g" that completes `units` (a loss of `loss` per
// sample).
v1::NextDataUnitRequest Request(int64_t train_samples,
                                const std::vector<v1::DataUnit>& units,
                                double loss = 0.5) {
  v1::NextDataUnitRequest request;
  request.set_group_id("g");
  request.set_train_samples(train_samples);
  for (const v1::DataUnit& unit : units) {
    v1::CompletedUnit* done = request.add_completed();
    done->set_unit_id(unit.unit_id());
    done->set_samples(static_cast<uint64_t>(unit.end() - unit.begin()));
    done->set_loss_sum(loss * static_cast<double>(done->samples()));
  }
  return request;
}

// Completes `held` (if any) and takes the next unit, as one group does.
struct Worker {
  DataQueue& queue;
  int64_t held = DataQueue::kNoUnit;
  google::protobuf::RepeatedField<int32_t> finished;

  void Step(int64_t train_samples, absl::Time now) {
    std::vector<v1::DataUnit> done;
    if (held != DataQueue::kNoUnit) done.push_back(queue.Unit(held));
    const v1::NextDataUnitRequest request = Request(train_samples, done);
    ASSERT_TRUE(queue.Check(request, held).ok());
    queue.Accept(request, now, /*updates_applied=*/7, &finished);
    held = queue.done() ? DataQueue::kNoUnit : queue.HandOut(now);
  }
};

// 10 samples in units of 4: units of 4, 4 and 2 per epoch, each handed out
// once, epochs recorded in order with the mean loss and the sample count.
TEST(DataQueueTest, UnitsCoverEveryEpochOnceAndRecordsAreWritten) {
  DataQueue queue("job-1", Spec(2, 4));
  Worker worker{queue};
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int i = 0; i < 7 && !queue.done(); ++i) {
    worker.Step(10, kStart + absl::Seconds(i));
    if (worker.held != DataQueue::kNoUnit) {
      const v1::DataUnit unit = queue.Unit(worker.held);
      ranges.emplace_back(unit.begin(), unit.end());
    }
  }
  ASSERT_TRUE(queue.done());
  EXPECT_EQ(ranges, (std::vector<std::pair<int64_t, int64_t>>{
                        {0, 4}, {4, 8}, {8, 10}, {0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(std::vector<int32_t>(worker.finished.begin(), worker.finished.end()),
            (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(queue.history().size(), 2u);
  for (const v1::EpochRecord& record : queue.history()) {
    EXPECT_EQ(record.samples(), 10u);
    EXPECT_DOUBLE_EQ(record.train_loss(), 0.5);
    EXPECT_EQ(record.updates_applied(), 7u);
  }
  EXPECT_EQ(queue.history()[0].epoch(), 1);
  // Epoch 1: first handed out at second 0, last unit completed at second 3.
  EXPECT_DOUBLE_EQ(queue.history()[0].wall_seconds(), 3.0);
  const v1::JobProgress progress = queue.Progress();
  EXPECT_EQ(progress.samples_trained(), 20u);
  EXPECT_EQ(progress.samples_per_epoch(), 10u);
  EXPECT_EQ(progress.epochs_done(), 2);
}

TEST(DataQueueTest, AtMostOneEpochRunsAheadAndGivenBackUnitsComeFirst) {
  DataQueue queue("job-1", Spec(3, 5));
  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(Request(10, {}), kStart, 0, &finished);  // 2 units per epoch
  std::vector<int64_t> out;
  for (int i = 0; i < 4; ++i) out.push_back(queue.HandOut(kStart));
  EXPECT_EQ(out, (std::vector<int64_t>{0, 1, 2, 3}));
  // Epoch 0 is unfinished, so epoch 2 must wait.
  EXPECT_EQ(queue.HandOut(kStart), DataQueue::kNoUnit);
  queue.GiveBack(1);
  EXPECT_EQ(queue.HandOut(kStart), 1);
  v1::JobStatus status;
  queue.FillStatus(false, &status);
  EXPECT_EQ(status.units_requeued(), 1u);
}

TEST(DataQueueTest, BadRequestsAreRefusedWithReasons) {
  DataQueue queue("job-1", Spec(1, 4));
  const absl::Status no_samples = queue.Check(Request(0, {}), DataQueue::kNoUnit);
  EXPECT_EQ(no_samples.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(no_samples), v1::ERROR_REASON_INVALID_REQUEST);

  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(Request(10, {}), kStart, 0, &finished);
  const int64_t unit = queue.HandOut(kStart);

  const absl::Status mismatch = queue.Check(Request(11, {}), DataQueue::kNoUnit);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(mismatch), v1::ERROR_REASON_JOB_STATE);

  const absl::Status not_listed = queue.Check(Request(10, {}), unit);
  EXPECT_EQ(ReasonOf(not_listed), v1::ERROR_REASON_INVALID_REQUEST);
  const absl::Status not_held =
      queue.Check(Request(10, {queue.Unit(unit)}), DataQueue::kNoUnit);
  EXPECT_EQ(ReasonOf(not_held), v1::ERROR_REASON_INVALID_REQUEST);
  v1::NextDataUnitRequest wrong_count = Request(10, {queue.Unit(unit)});
  wrong_count.mutable_completed(0)->set_samples(3);
  EXPECT_EQ(ReasonOf(queue.Check(wrong_count, unit)),
            v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_TRUE(queue.Check(Request(10, {queue.Unit(unit)}), unit).ok());

  DataQueue unnormalized("job-2", Spec(0, 4));
  EXPECT_EQ(ReasonOf(unnormalized.Check(Request(10, {}), DataQueue::kNoUnit)),
            v1::ERROR_REASON_JOB_STATE);
}

TEST(DataQueueTest, EpochReportMergesValidationOnly) {
  DataQueue queue("job-1", Spec(2, 10));
  Worker worker{queue};
  worker.Step(10, kStart);
  worker.Step(10, kStart + absl::Seconds(2));  // epoch 1 done
  v1::EpochRecord report;
  report.set_epoch(2);
  EXPECT_EQ(ReasonOf(queue.MergeEpochReport(report)), v1::ERROR_REASON_JOB_STATE);
  report.set_epoch(0);
  EXPECT_EQ(ReasonOf(queue.MergeEpochReport(report)),
            v1::ERROR_REASON_INVALID_REQUEST);
  report.set_epoch(1);
  report.set_val_accuracy(0.75);
  report.set_group_id("g");
  report.set_samples(999);  // the queue's own count is kept
  ASSERT_TRUE(queue.MergeEpochReport(report).ok());
  EXPECT_DOUBLE_EQ(queue.history()[0].val_accuracy(), 0.75);
  EXPECT_EQ(queue.history()[0].samples(), 10u);
}

// Save with one unit completed and one in flight; the resumed queue hands
// the in-flight unit out again, then continues where the saved one was.
TEST(DataQueueTest, ResumeHandsOutUnitsInFlightAgain) {
  DataQueue queue("job-1", Spec(2, 4));
  Worker a{queue};
  Worker b{queue};
  a.Step(10, kStart);                     // a holds unit 0
  b.Step(10, kStart);                     // b holds unit 1
  a.Step(10, kStart + absl::Seconds(1));  // 0 done, a holds unit 2
  v1::JobStatus status;
  queue.FillStatus(/*with_history=*/true, &status);
  const v1::CheckpointQueue saved = queue.Save();

  DataQueue resumed("job-1", Spec(2, 4));
  ASSERT_TRUE(resumed.Resume(saved, status).ok());
  EXPECT_EQ(resumed.HandOut(kStart), 1);  // in flight: b's
  EXPECT_EQ(resumed.HandOut(kStart), 2);  // in flight: a's
  EXPECT_EQ(resumed.HandOut(kStart), 3);  // fresh: epoch 1, unit 0
  EXPECT_EQ(resumed.Progress().samples_trained(), 4u);
  v1::JobStatus after;
  resumed.FillStatus(false, &after);
  EXPECT_EQ(after.units_requeued(), 2u);

  v1::CheckpointQueue broken = saved;
  broken.set_next_unit(99);
  DataQueue refused("job-1", Spec(2, 4));
  const absl::Status status_broken = refused.Resume(broken, status);
  EXPECT_EQ(status_broken.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReasonOf(status_broken), v1::ERROR_REASON_INTERNAL);
}

}  // namespace
}  // namespace mpilearn::server
