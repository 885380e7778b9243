// DataQueue's cases: units, epochs and records, refusals, checkpoints, file
// units and bad data. Over ~500 lines because each of those is a scenario of
// a few requests.
#include "server/core/data_queue.h"

#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(2, 4)));
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
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(3, 5)));
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
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(1, 4)));
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

  DataQueue unnormalized("job-2", JobConfig::FromNormalized(Spec(0, 4)));
  EXPECT_EQ(ReasonOf(unnormalized.Check(Request(10, {}), DataQueue::kNoUnit)),
            v1::ERROR_REASON_JOB_STATE);
}

TEST(DataQueueTest, EpochReportMergesValidationOnly) {
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(2, 10)));
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
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(2, 4)));
  Worker a{queue};
  Worker b{queue};
  a.Step(10, kStart);                     // a holds unit 0
  b.Step(10, kStart);                     // b holds unit 1
  a.Step(10, kStart + absl::Seconds(1));  // 0 done, a holds unit 2
  v1::JobStatus status;
  queue.FillStatus(/*with_history=*/true, &status);
  const v1::CheckpointQueue saved = queue.Save();

  DataQueue resumed("job-1", JobConfig::FromNormalized(Spec(2, 4)));
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
  DataQueue refused("job-1", JobConfig::FromNormalized(Spec(2, 4)));
  const absl::Status status_broken = refused.Resume(broken, status);
  EXPECT_EQ(status_broken.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReasonOf(status_broken), v1::ERROR_REASON_INTERNAL);
}

// ---------------------------------------------------------------------------
// File-list data (file_rows).

v1::JobSpec FileSpec(int epochs, int unit_size, uint64_t seed) {
  v1::JobSpec spec = Spec(epochs, unit_size);
  spec.set_seed(seed);
  return spec;
}

// Request(...) of a group reading files with `rows` rows each.
v1::NextDataUnitRequest FileRequest(const std::vector<int64_t>& rows,
                                    const std::vector<v1::DataUnit>& units) {
  int64_t samples = 0;
  for (int64_t r : rows) samples += r;
  v1::NextDataUnitRequest request = Request(samples, units);
  request.mutable_file_rows()->Add(rows.begin(), rows.end());
  return request;
}

// Every unit of the queue by id: file, begin, end.
std::vector<std::tuple<int32_t, int64_t, int64_t>> Mapping(
    const DataQueue& queue, int64_t units) {
  std::vector<std::tuple<int32_t, int64_t, int64_t>> out;
  for (int64_t id = 0; id < units; ++id) {
    const v1::DataUnit unit = queue.Unit(id);
    out.emplace_back(unit.file(), unit.begin(), unit.end());
  }
  return out;
}

// Files of 10, 0, 7, 0 and 3 rows in units of 4: 3 + 0 + 2 + 0 + 1 = 6
// units per epoch. One group trains 3 epochs: each epoch's units cover every
// row of every file exactly once (checked against the set of all (file, row)
// pairs), no unit spans two files, the epochs' orders differ, and the
// records count every row.
TEST(DataQueueFileTest, UnitsCoverEveryRowOfEveryFileOncePerEpoch) {
  const std::vector<int64_t> rows = {10, 0, 7, 0, 3};
  std::set<std::pair<int32_t, int64_t>> all_rows;
  for (size_t f = 0; f < rows.size(); ++f) {
    for (int64_t r = 0; r < rows[f]; ++r) {
      all_rows.emplace(static_cast<int32_t>(f), r);
    }
  }
  DataQueue queue("job-1", JobConfig::FromNormalized(FileSpec(3, 4, /*seed=*/5)));
  google::protobuf::RepeatedField<int32_t> finished;
  int64_t held = DataQueue::kNoUnit;
  std::vector<std::set<std::pair<int32_t, int64_t>>> covered(3);
  std::vector<std::vector<std::pair<int32_t, int64_t>>> order(3);
  for (int step = 0; step < 100 && !queue.done(); ++step) {
    std::vector<v1::DataUnit> done;
    if (held != DataQueue::kNoUnit) done.push_back(queue.Unit(held));
    const v1::NextDataUnitRequest request = FileRequest(rows, done);
    ASSERT_TRUE(queue.Check(request, held).ok());
    queue.Accept(request, kStart, 0, &finished);
    held = queue.done() ? DataQueue::kNoUnit : queue.HandOut(kStart);
    if (held == DataQueue::kNoUnit) continue;
    const v1::DataUnit unit = queue.Unit(held);
    EXPECT_EQ(unit.unit_id(), held);
    ASSERT_GE(unit.file(), 0);
    ASSERT_LT(unit.file(), 5);
    EXPECT_LT(unit.begin(), unit.end());
    EXPECT_LE(unit.end(), rows[static_cast<size_t>(unit.file())]);
    EXPECT_LE(unit.end() - unit.begin(), 4);
    order[static_cast<size_t>(unit.epoch())].emplace_back(unit.file(),
                                                          unit.begin());
    for (int64_t row = unit.begin(); row < unit.end(); ++row) {
      EXPECT_TRUE(covered[static_cast<size_t>(unit.epoch())]
                      .emplace(unit.file(), row)
                      .second)
          << "row " << row << " of file " << unit.file() << " twice";
    }
  }
  ASSERT_TRUE(queue.done());
  for (int e = 0; e < 3; ++e) EXPECT_EQ(covered[e], all_rows) << "epoch " << e;
  EXPECT_NE(order[0], order[1]);
  EXPECT_NE(order[1], order[2]);
  EXPECT_EQ(std::vector<int32_t>(finished.begin(), finished.end()),
            (std::vector<int32_t>{0, 1, 2}));
  for (const v1::EpochRecord& record : queue.history()) {
    EXPECT_EQ(record.samples(), 20u);
  }
  EXPECT_EQ(queue.Progress().samples_per_epoch(), 20u);
}

// The mapping of ids to rows depends on the seed alone: a second queue with
// the same seed maps every id the same way, one with another seed does not.
TEST(DataQueueFileTest, SameSeedSameOrder) {
  const std::vector<int64_t> rows = {9, 30, 0, 14};
  google::protobuf::RepeatedField<int32_t> finished;
  DataQueue a("job-1", JobConfig::FromNormalized(FileSpec(4, 5, 11)));
  DataQueue b("job-1", JobConfig::FromNormalized(FileSpec(4, 5, 11)));
  DataQueue c("job-1", JobConfig::FromNormalized(FileSpec(4, 5, 12)));
  for (DataQueue* queue : {&a, &b, &c}) {
    ASSERT_TRUE(queue->Check(FileRequest(rows, {}), DataQueue::kNoUnit).ok());
    queue->Accept(FileRequest(rows, {}), kStart, 0, &finished);
  }
  // 2 + 6 + 0 + 3 units per epoch, 4 epochs, read in a scattered order.
  const int64_t units = 4 * 11;
  EXPECT_EQ(a.Unit(units - 1).epoch(), 3);
  EXPECT_EQ(Mapping(a, units), Mapping(b, units));
  EXPECT_NE(Mapping(a, units), Mapping(c, units));
}

TEST(DataQueueFileTest, BadOrMismatchedFileListsAreRefused) {
  DataQueue queue("job-1", JobConfig::FromNormalized(FileSpec(1, 4, 1)));
  const auto expect = [](const absl::Status& status, absl::StatusCode code,
                         v1::ErrorReason reason, const std::string& text) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_EQ(ReasonOf(status), reason) << status;
    EXPECT_NE(status.message().find(text), std::string::npos) << status;
  };
  // Bounded before anything else: one file too many.
  std::vector<int64_t> many(FileUnits::kMaxFiles + 1, 0);
  many[0] = 8;
  expect(queue.Check(FileRequest(many, {}), DataQueue::kNoUnit),
         absl::StatusCode::kInvalidArgument, v1::ERROR_REASON_INVALID_REQUEST,
         "at most 1000000");
  expect(queue.Check(FileRequest({-1, 9}, {}), DataQueue::kNoUnit),
         absl::StatusCode::kInvalidArgument, v1::ERROR_REASON_INVALID_REQUEST,
         ">= 0");
  v1::NextDataUnitRequest bad_sum = FileRequest({4, 4}, {});
  bad_sum.set_train_samples(9);
  expect(queue.Check(bad_sum, DataQueue::kNoUnit),
         absl::StatusCode::kInvalidArgument, v1::ERROR_REASON_INVALID_REQUEST,
         "sum to 8 but train_samples is 9");
  bad_sum.set_train_samples(7);
  expect(queue.Check(bad_sum, DataQueue::kNoUnit),
         absl::StatusCode::kInvalidArgument, v1::ERROR_REASON_INVALID_REQUEST,
         "more than train_samples 7");
  // One-row units of more rows than an epoch's order may hold.
  DataQueue fine("job-1", JobConfig::FromNormalized(FileSpec(1, 1, 1)));
  expect(fine.Check(FileRequest({FileUnits::kMaxUnitsPerEpoch, 1}, {}),
                    DataQueue::kNoUnit),
         absl::StatusCode::kInvalidArgument, v1::ERROR_REASON_INVALID_REQUEST,
         "raise data_unit_size");

  google::protobuf::RepeatedField<int32_t> finished;
  ASSERT_TRUE(queue.Check(FileRequest({5, 0, 3}, {}), DataQueue::kNoUnit).ok());
  queue.Accept(FileRequest({5, 0, 3}, {}), kStart, 0, &finished);
  EXPECT_TRUE(queue.Check(FileRequest({5, 0, 3}, {}), DataQueue::kNoUnit).ok());
  expect(queue.Check(FileRequest({5, 3, 0}, {}), DataQueue::kNoUnit),
         absl::StatusCode::kFailedPrecondition, v1::ERROR_REASON_JOB_STATE,
         "gives 3 rows for file 1 (of 3) but job job-1 has 0");
  expect(queue.Check(FileRequest({5, 3}, {}), DataQueue::kNoUnit),
         absl::StatusCode::kFailedPrecondition, v1::ERROR_REASON_JOB_STATE,
         "has 2 files but job job-1 has 3");
  expect(queue.Check(Request(8, {}), DataQueue::kNoUnit),
         absl::StatusCode::kFailedPrecondition, v1::ERROR_REASON_JOB_STATE,
         "has 0 files but job job-1 has 3");
  // Another total is the train_samples mismatch, as without files.
  expect(queue.Check(FileRequest({5, 0, 4}, {}), DataQueue::kNoUnit),
         absl::StatusCode::kFailedPrecondition, v1::ERROR_REASON_JOB_STATE,
         "sees 9 samples but job job-1 has 8");

  // A queue fixed without files refuses a list.
  DataQueue plain("job-2", JobConfig::FromNormalized(FileSpec(1, 4, 1)));
  plain.Accept(Request(8, {}), kStart, 0, &finished);
  expect(plain.Check(FileRequest({8}, {}), DataQueue::kNoUnit),
         absl::StatusCode::kFailedPrecondition, v1::ERROR_REASON_JOB_STATE,
         "has 1 files but job job-2 has none");
}

// Save with a unit completed and two in flight; the resumed queue keeps the
// file list, maps every id to the same rows and hands the in-flight units
// out again before fresh ones. A list that does not sum to train_samples is
// data loss.
TEST(DataQueueFileTest, ResumeKeepsFileListAndMapping) {
  const std::vector<int64_t> rows = {6, 0, 11};
  DataQueue queue("job-1", JobConfig::FromNormalized(FileSpec(2, 4, 3)));
  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(FileRequest(rows, {}), kStart, 0, &finished);
  const int64_t first = queue.HandOut(kStart);
  const int64_t second = queue.HandOut(kStart);
  const int64_t third = queue.HandOut(kStart);
  queue.Accept(FileRequest(rows, {queue.Unit(first)}), kStart, 0, &finished);
  v1::JobStatus status;
  queue.FillStatus(/*with_history=*/true, &status);
  const v1::CheckpointQueue saved = queue.Save();
  EXPECT_EQ(std::vector<int64_t>(saved.file_rows().begin(),
                                 saved.file_rows().end()),
            rows);

  DataQueue resumed("job-1", JobConfig::FromNormalized(FileSpec(2, 4, 3)));
  ASSERT_TRUE(resumed.Resume(saved, status).ok());
  const int64_t units = 2 * (2 + 0 + 3);
  EXPECT_EQ(Mapping(resumed, units), Mapping(queue, units));
  EXPECT_EQ(resumed.HandOut(kStart), second);
  EXPECT_EQ(resumed.HandOut(kStart), third);
  EXPECT_EQ(resumed.HandOut(kStart), 3);  // fresh
  EXPECT_EQ(resumed.Progress().samples_trained(),
            static_cast<uint64_t>(queue.Unit(first).end() -
                                  queue.Unit(first).begin()));
  EXPECT_FALSE(
      resumed.Check(Request(17, {}), DataQueue::kNoUnit).ok());  // no list
  EXPECT_TRUE(resumed.Check(FileRequest(rows, {}), DataQueue::kNoUnit).ok());

  v1::CheckpointQueue broken = saved;
  broken.set_file_rows(2, 10);
  DataQueue refused("job-1", JobConfig::FromNormalized(FileSpec(2, 4, 3)));
  const absl::Status status_broken = refused.Resume(broken, status);
  EXPECT_EQ(status_broken.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReasonOf(status_broken), v1::ERROR_REASON_INTERNAL);
}

// ---------------------------------------------------------------------------
// Bad data: skipped rows and failed units.

// 10 samples in units of 4 (4, 4, 2), one epoch, bad_values "skip": a unit
// may report rows skipped as long as trained + skipped is its size; the
// epoch completes when its units do and its record counts the rows trained.
TEST(DataQueueBadDataTest, SkippedRowsAreCountedWhenTheSpecSkips) {
  v1::JobSpec spec = Spec(1, 4);
  spec.mutable_data()->set_bad_values("skip");
  DataQueue queue("job-1", JobConfig::FromNormalized(spec));
  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(Request(10, {}), kStart, 0, &finished);
  const int64_t unit = queue.HandOut(kStart);  // [0, 4)

  v1::NextDataUnitRequest skipping = Request(10, {queue.Unit(unit)});
  skipping.mutable_completed(0)->set_samples(3);
  skipping.mutable_completed(0)->set_skipped(1);
  ASSERT_TRUE(queue.Check(skipping, unit).ok());
  // Trained + skipped other than the unit's 4 rows, either way, and a skip
  // count larger than the unit (which must not wrap around).
  for (const auto& [samples, skipped] :
       std::vector<std::pair<uint64_t, uint64_t>>{
           {3, 2}, {2, 1}, {4, 1}, {~uint64_t{0}, 5}}) {
    v1::NextDataUnitRequest wrong = skipping;
    wrong.mutable_completed(0)->set_samples(samples);
    wrong.mutable_completed(0)->set_skipped(skipped);
    const absl::Status refused = queue.Check(wrong, unit);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_INVALID_REQUEST);
    EXPECT_NE(refused.message().find(absl::StrCat(
                  "covers 4 samples but group g reports ", samples,
                  " trained and ", skipped, " skipped")),
              std::string::npos)
        << refused.message();
  }

  const DataQueue::Completed completed =
      queue.Accept(skipping, kStart + absl::Seconds(1), 0, &finished);
  EXPECT_EQ(completed.samples, 3u);
  EXPECT_EQ(completed.skipped, 1u);
  // The other two units: one trains whole, one skips both its rows.
  const int64_t second = queue.HandOut(kStart);
  const int64_t third = queue.HandOut(kStart);
  v1::NextDataUnitRequest rest = Request(10, {queue.Unit(second)});
  ASSERT_TRUE(queue.Check(rest, second).ok());
  queue.Accept(rest, kStart + absl::Seconds(2), 0, &finished);
  v1::NextDataUnitRequest all_skipped = Request(10, {queue.Unit(third)});
  all_skipped.mutable_completed(0)->set_samples(0);
  all_skipped.mutable_completed(0)->set_skipped(2);
  ASSERT_TRUE(queue.Check(all_skipped, third).ok());
  queue.Accept(all_skipped, kStart + absl::Seconds(2), 0, &finished);

  EXPECT_TRUE(queue.done());
  ASSERT_EQ(queue.history().size(), 1u);
  EXPECT_EQ(queue.history()[0].samples(), 7u);  // 3 + 4 + 0
  v1::JobStatus status;
  queue.FillStatus(false, &status);
  EXPECT_EQ(status.samples_trained(), 7u);
  EXPECT_EQ(status.samples_skipped(), 3u);  // 1 + 0 + 2
}

// Without bad_values "skip" (the default "fail", or unset) a unit may skip
// nothing, even when trained + skipped is its size.
TEST(DataQueueBadDataTest, SkippedRowsAreRefusedUnlessTheSpecSkips) {
  for (const char* policy : {"fail", ""}) {
    v1::JobSpec spec = Spec(1, 4);
    spec.mutable_data()->set_bad_values(policy);
    DataQueue queue("job-1", JobConfig::FromNormalized(spec));
    google::protobuf::RepeatedField<int32_t> finished;
    queue.Accept(Request(10, {}), kStart, 0, &finished);
    const int64_t unit = queue.HandOut(kStart);
    v1::NextDataUnitRequest skipping = Request(10, {queue.Unit(unit)});
    skipping.mutable_completed(0)->set_samples(3);
    skipping.mutable_completed(0)->set_skipped(1);
    const absl::Status refused = queue.Check(skipping, unit);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << policy;
    EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_INVALID_REQUEST);
    EXPECT_NE(refused.message().find("data.bad_values is not 'skip'"),
              std::string::npos)
        << refused.message();
    EXPECT_TRUE(queue.Check(Request(10, {queue.Unit(unit)}), unit).ok());
  }
}

// Each unit's failures are counted apart; the one reaching
// max_unit_failures is exhausted. A checkpoint keeps the job-wide count,
// the last error and the skipped rows (through the status) and the
// per-unit counts (CheckpointQueue.unit_failures).
TEST(DataQueueBadDataTest, UnitFailuresAreCountedPerUnitAndInAll) {
  v1::JobSpec spec = Spec(1, 4);
  spec.mutable_data()->set_bad_values("skip");
  spec.mutable_data()->set_max_unit_failures(2);
  DataQueue queue("job-1", JobConfig::FromNormalized(spec));
  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(Request(10, {}), kStart, 0, &finished);
  const int64_t a = queue.HandOut(kStart);
  const int64_t b = queue.HandOut(kStart);
  EXPECT_EQ(queue.Describe(a), "unit 0");

  DataQueue::Failure failure = queue.UnitFailed(a, "bad row 3");
  EXPECT_EQ(failure.unit_failures, 1);
  EXPECT_FALSE(failure.exhausted);
  failure = queue.UnitFailed(b, "bad row 5");
  EXPECT_EQ(failure.unit_failures, 1);
  EXPECT_FALSE(failure.exhausted);
  v1::JobStatus status;
  queue.FillStatus(/*with_history=*/true, &status);
  EXPECT_EQ(status.unit_failures(), 2u);
  EXPECT_EQ(status.last_data_error(), "bad row 5");

  const v1::CheckpointQueue saved = queue.Save();
  status.set_samples_skipped(6);
  DataQueue resumed("job-1", JobConfig::FromNormalized(spec));
  ASSERT_TRUE(resumed.Resume(saved, status).ok());
  v1::JobStatus after;
  resumed.FillStatus(false, &after);
  EXPECT_EQ(after.unit_failures(), 2u);
  EXPECT_EQ(after.last_data_error(), "bad row 5");
  EXPECT_EQ(after.samples_skipped(), 6u);
  // A restart goes on counting: unit a's second failure exhausts it.
  failure = resumed.UnitFailed(a, "again");
  EXPECT_EQ(failure.unit_failures, 2);
  EXPECT_TRUE(failure.exhausted);
  // A saved count for a unit past the job's units is refused.
  v1::CheckpointQueue broken = saved;
  (*broken.mutable_unit_failures())[1000] = 1;
  DataQueue refused("job-1", JobConfig::FromNormalized(spec));
  EXPECT_EQ(refused.Resume(broken, status).code(), absl::StatusCode::kDataLoss);

  failure = queue.UnitFailed(a, "bad row 3 again");
  EXPECT_EQ(failure.unit_failures, 2);
  EXPECT_TRUE(failure.exhausted);

  DataQueue ended("job-1", JobConfig::FromNormalized(spec));
  ended.ResumeEnded(status);
  v1::JobStatus ended_status;
  ended.FillStatus(false, &ended_status);
  EXPECT_EQ(ended_status.unit_failures(), 2u);
  EXPECT_EQ(ended_status.samples_skipped(), 6u);
  EXPECT_EQ(ended_status.last_data_error(), "bad row 5");
}

// An unset max_unit_failures (a spec that was not normalized) is 3.
TEST(DataQueueBadDataTest, MaxUnitFailuresDefaultsToThree) {
  DataQueue queue("job-1", JobConfig::FromNormalized(Spec(1, 4)));
  EXPECT_EQ(queue.max_unit_failures(), 3);
}

TEST(DataQueueBadDataTest, FileUnitsAreDescribedByFileAndRows) {
  DataQueue queue("job-1", JobConfig::FromNormalized(FileSpec(1, 4, 3)));
  google::protobuf::RepeatedField<int32_t> finished;
  queue.Accept(FileRequest({6}, {}), kStart, 0, &finished);
  const v1::DataUnit unit = queue.Unit(queue.HandOut(kStart));
  EXPECT_EQ(queue.Describe(unit.unit_id()),
            absl::StrCat("unit ", unit.unit_id(), " (file 0 rows [",
                         unit.begin(), ", ", unit.end(), "))"));
}

// Errors of at most kMaxDataErrorBytes are kept whole; longer ones are cut
// to that many bytes with "...", never inside a UTF-8 character.
TEST(DataQueueBadDataTest, LongErrorsAreCutOnCharacterBoundaries) {
  constexpr size_t kMax = DataQueue::kMaxDataErrorBytes;
  const std::string fits(kMax, 'x');
  EXPECT_EQ(DataQueue::BoundDataError(fits), fits);
  EXPECT_EQ(DataQueue::BoundDataError(""), "");

  const std::string ascii(kMax + 1, 'y');
  EXPECT_EQ(DataQueue::BoundDataError(ascii),
            std::string(kMax - 3, 'y') + "...");

  // U+00E9 is 2 bytes: the 1021-byte cut falls inside one and backs up.
  std::string two_byte;
  for (int i = 0; i < 600; ++i) two_byte += "\xC3\xA9";
  const std::string cut_two = DataQueue::BoundDataError(two_byte);
  EXPECT_EQ(cut_two, two_byte.substr(0, kMax - 4) + "...");

  // U+1F600 is 4 bytes; after "ab" they start at 2 + 4k. The cut at 1021
  // backs up to 1018, the start of the 255th.
  std::string four_byte = "ab";
  for (int i = 0; i < 300; ++i) four_byte += "\xF0\x9F\x98\x80";
  const std::string cut_four = DataQueue::BoundDataError(four_byte);
  EXPECT_EQ(cut_four, four_byte.substr(0, 2 + 4 * 254) + "...");
  EXPECT_LE(cut_four.size(), kMax);
}

}  // namespace
}  // namespace mpilearn::server
