// Job's data queue with file-list data (file_rows) and read-ahead
// (read_ahead, next_unit): groups training every unit once, giving back
// what they hold, refusals, and a checkpoint round trip. The queue's own
// cases are in data_queue_test and file_units_test.
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/job.h"

namespace mpilearn::server {
namespace {

// 4 files of 10, 0, 7 and 5 rows in units of 4: 3 + 0 + 2 + 2 = 7 units per
// epoch, 22 rows.
const std::vector<int64_t> kRows = {10, 0, 7, 5};
constexpr int64_t kUnitsPerEpoch = 7;

v1::JobSpec FileSpec(int epochs) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_epochs(epochs);
  spec.set_data_unit_size(4);
  spec.set_seed(9);
  return spec;
}

// One group's side: completes the unit it trains, asks for the next, and
// keeps what the answer reserved for it.
struct Client {
  std::string group_id;
  bool read_ahead = true;
  std::optional<v1::DataUnit> held;
  std::optional<v1::DataUnit> reserved;

  v1::NextDataUnitRequest Request() const {
    v1::NextDataUnitRequest request;
    request.set_job_id("job-1");
    request.set_group_id(group_id);
    int64_t samples = 0;
    for (int64_t rows : kRows) samples += rows;
    request.set_train_samples(samples);
    request.mutable_file_rows()->Add(kRows.begin(), kRows.end());
    request.set_read_ahead(read_ahead);
    if (held.has_value()) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(held->unit_id());
      done->set_samples(static_cast<uint64_t>(held->end() - held->begin()));
      done->set_loss_sum(static_cast<double>(done->samples()));
    }
    return request;
  }

  absl::StatusOr<v1::NextDataUnitResponse> Ask(Job& job, absl::Time now) {
    auto response = job.NextDataUnit(Request(), now);
    if (!response.ok()) return response;
    held.reset();
    if (response->action() == v1::NextDataUnitResponse::TRAIN) {
      // What was reserved is what is trained next.
      if (reserved.has_value()) {
        EXPECT_EQ(response->unit().unit_id(), reserved->unit_id());
      }
      held = response->unit();
    } else {
      EXPECT_FALSE(reserved.has_value()) << group_id << " lost a reservation";
    }
    reserved.reset();
    if (response->has_next_unit()) {
      EXPECT_TRUE(read_ahead);
      EXPECT_EQ(response->action(), v1::NextDataUnitResponse::TRAIN);
      reserved = response->next_unit();
    }
    return response;
  }
};

class JobDataUnitsTest : public ::testing::Test {
 protected:
  void MakeJob(int epochs, const std::vector<std::string>& groups) {
    job_ = std::make_unique<Job>("job-1", JobConfig::FromNormalized(FileSpec(epochs)));
    for (const std::string& group : groups) {
      ASSERT_TRUE(job_->AddGroup(group, 1, "test", now_).ok());
    }
  }

  std::unique_ptr<Job> job_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

// Two read-ahead groups alternate over 3 epochs: every row of every file is
// trained exactly once per epoch (checked against the set of all (file,
// row) pairs), every unit id once, no unit spans two files, reservations
// are used, and the epochs finish in order.
TEST_F(JobDataUnitsTest, TwoReadAheadGroupsTrainEveryUnitOnce) {
  constexpr int kEpochs = 3;
  MakeJob(kEpochs, {"a", "b"});
  std::vector<Client> clients = {{"a"}, {"b"}};
  std::set<std::pair<int32_t, int64_t>> all_rows;
  for (size_t f = 0; f < kRows.size(); ++f) {
    for (int64_t r = 0; r < kRows[f]; ++r) {
      all_rows.emplace(static_cast<int32_t>(f), r);
    }
  }
  std::vector<std::set<std::pair<int32_t, int64_t>>> trained(kEpochs);
  std::set<int64_t> ids;
  std::vector<int32_t> finished;
  int reservations = 0;
  std::set<std::string> done;
  for (int turn = 0; done.size() < 2 && turn < 200; ++turn) {
    Client& client = clients[static_cast<size_t>(turn % 2)];
    if (done.count(client.group_id) != 0) continue;
    // What the client completes with this request.
    const std::optional<v1::DataUnit> completing = client.held;
    now_ += absl::Seconds(1);
    auto response = client.Ask(*job_, now_);
    ASSERT_TRUE(response.ok()) << response.status();
    if (completing.has_value()) {
      const v1::DataUnit& unit = *completing;
      EXPECT_TRUE(ids.insert(unit.unit_id()).second) << unit.unit_id();
      ASSERT_LE(unit.end(), kRows[static_cast<size_t>(unit.file())]);
      for (int64_t row = unit.begin(); row < unit.end(); ++row) {
        EXPECT_TRUE(trained[static_cast<size_t>(unit.epoch())]
                        .emplace(unit.file(), row)
                        .second);
      }
    }
    finished.insert(finished.end(), response->finished_epochs().begin(),
                    response->finished_epochs().end());
    if (response->has_next_unit()) ++reservations;
    if (response->action() == v1::NextDataUnitResponse::DONE) {
      done.insert(client.group_id);
    }
  }
  ASSERT_EQ(done.size(), 2u);
  for (int e = 0; e < kEpochs; ++e) EXPECT_EQ(trained[e], all_rows);
  EXPECT_EQ(ids.size(), static_cast<size_t>(kEpochs * kUnitsPerEpoch));
  EXPECT_EQ(finished, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_GT(reservations, 0);
  const v1::JobStatus status = job_->Status(true, now_);
  ASSERT_EQ(status.history_size(), kEpochs);
  for (const v1::EpochRecord& record : status.history()) {
    EXPECT_EQ(record.samples(), 22u);
  }
  EXPECT_EQ(status.units_requeued(), 0u);
}

// One read-ahead group alone: each answer reserves the next slot until none
// is left; the last unit comes without next_unit, then DONE with finish.
TEST_F(JobDataUnitsTest, ReservationIsTrainedNextAndRunsOut) {
  MakeJob(1, {"a"});
  Client a{"a"};
  for (int64_t slot = 0; slot < kUnitsPerEpoch; ++slot) {
    auto response = a.Ask(*job_, now_);
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_EQ(response->action(), v1::NextDataUnitResponse::TRAIN);
    EXPECT_EQ(response->unit().unit_id(), slot);
    EXPECT_EQ(response->has_next_unit(), slot + 1 < kUnitsPerEpoch);
    if (response->has_next_unit()) {
      EXPECT_EQ(response->next_unit().unit_id(), slot + 1);
    }
  }
  auto end = a.Ask(*job_, now_);
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(end->finish());
}

// A group that stops asking for read-ahead still trains the unit reserved
// for it, and is reserved nothing more.
TEST_F(JobDataUnitsTest, RequestWithoutReadAheadTrainsTheReservation) {
  MakeJob(1, {"a"});
  Client a{"a"};
  auto first = a.Ask(*job_, now_);
  ASSERT_TRUE(first->has_next_unit());
  a.read_ahead = false;
  auto second = a.Ask(*job_, now_);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->unit().unit_id(), first->next_unit().unit_id());
  EXPECT_FALSE(second->has_next_unit());
  auto third = a.Ask(*job_, now_);
  EXPECT_EQ(third->unit().unit_id(), 2);
  EXPECT_FALSE(third->has_next_unit());
}

// A group that leaves gives back both the unit it trains and the one
// reserved for it, and another group gets them, held one first, before any
// fresh unit; a lost group does the same.
TEST_F(JobDataUnitsTest, LeavingOrLostGroupGivesBackBothUnits) {
  MakeJob(1, {"a", "b", "c"});
  Client a{"a"};
  Client b{"b", /*read_ahead=*/false};
  Client c{"c"};
  auto a_first = a.Ask(*job_, now_);  // trains 0, reserves 1
  ASSERT_EQ(a_first->unit().unit_id(), 0);
  ASSERT_EQ(a_first->next_unit().unit_id(), 1);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 2);
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("a");
  ASSERT_TRUE(job_->Leave(leave).ok());
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 0);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 1);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 3);
  EXPECT_EQ(job_->Status(false, now_).units_requeued(), 2u);

  // c reserves 5 while training 4, then falls silent and is declared lost.
  auto c_first = c.Ask(*job_, now_);
  ASSERT_EQ(c_first->unit().unit_id(), 4);
  ASSERT_EQ(c_first->next_unit().unit_id(), 5);
  ASSERT_TRUE(job_->Touch("b", now_ + absl::Seconds(20)).ok());
  EXPECT_EQ(job_->ReapLostGroups(now_ + absl::Seconds(20), absl::Seconds(10)),
            1);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 4);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 5);
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 6);
  auto end = b.Ask(*job_, now_);
  EXPECT_EQ(end->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(end->finish());
  EXPECT_EQ(job_->Status(true, now_).history(0).samples(), 22u);
}

// A group reading other files is refused and changes nothing.
TEST_F(JobDataUnitsTest, AnotherFileListIsRefused) {
  MakeJob(1, {"a", "b"});
  Client a{"a"};
  ASSERT_TRUE(a.Ask(*job_, now_).ok());
  Client b{"b"};
  v1::NextDataUnitRequest other = b.Request();
  other.set_file_rows(0, 9);
  other.set_file_rows(1, 1);
  const auto refused = job_->NextDataUnit(other, now_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused.status()), v1::ERROR_REASON_JOB_STATE);
  other.clear_file_rows();
  EXPECT_EQ(ReasonOf(job_->NextDataUnit(other, now_).status()),
            v1::ERROR_REASON_JOB_STATE);
  // Units 0 and 1 are a's; b gets the next.
  EXPECT_EQ(b.Ask(*job_, now_)->unit().unit_id(), 2);
}

// A checkpoint taken while a read-ahead group holds two units keeps the
// file list; the resumed job hands both out again, to the same rows.
TEST_F(JobDataUnitsTest, CheckpointRoundTripKeepsFileUnits) {
  MakeJob(2, {"a"});
  ASSERT_TRUE(
      job_->InitWeights(MakeFloat32Header(0, {"w"}, {{2}}), {{1.0f, 2.0f}})
          .value());
  Client a{"a"};
  ASSERT_TRUE(a.Ask(*job_, now_).ok());
  const v1::DataUnit held = a.Ask(*job_, now_)->unit();  // 0 done
  const v1::DataUnit reserved = *a.reserved;
  auto file = job_->SaveCheckpoint(now_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(std::vector<int64_t>(file->queue().file_rows().begin(),
                                 file->queue().file_rows().end()),
            kRows);

  Job resumed("job-1", JobConfig::FromNormalized(FileSpec(2)));
  ASSERT_TRUE(resumed.Resume(*file).ok());
  ASSERT_TRUE(resumed.AddGroup("b", 1, "test", now_).ok());
  Client b{"b", /*read_ahead=*/true};
  auto again = b.Ask(resumed, now_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->unit().SerializeAsString(), held.SerializeAsString());
  EXPECT_EQ(again->next_unit().SerializeAsString(),
            reserved.SerializeAsString());
  EXPECT_EQ(resumed.Status(false, now_).units_requeued(), 2u);
}

// A lead's checkpoint of a sharded job: the job holds no weights, the
// checkpoint the ones gathered from the shards; resumed, the job gets its
// units back but no weights (they stay on the shards).
TEST_F(JobDataUnitsTest, CheckpointOfWeightsOnShardsKeepsUnitsNotWeights) {
  MakeJob(2, {"a"});
  Client a{"a"};
  ASSERT_TRUE(a.Ask(*job_, now_).ok());
  const v1::DataUnit held = a.Ask(*job_, now_)->unit();  // 0 done
  EXPECT_FALSE(job_->SaveCheckpoint(now_).ok());         // no weights here
  auto gathered = std::make_shared<WeightsSnapshot>();
  gathered->header = MakeFloat32Header(6, {"w"}, {{2}});
  gathered->values = {{1.0f, 2.0f}};
  EXPECT_FALSE(job_->CheckpointDue(CheckpointTrigger::kChanges, now_));
  EXPECT_TRUE(job_->CheckpointDue(CheckpointTrigger::kChanges, now_, 6));
  auto file = job_->SaveCheckpoint(now_, gathered);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->weights_on_shards());
  EXPECT_EQ(file->weights().header().version(), 6u);
  EXPECT_EQ(file->optimizer_state().header().tensors_size(), 0);

  Job resumed("job-1", JobConfig::FromNormalized(FileSpec(2)));
  ASSERT_TRUE(resumed.Resume(*file).ok());
  EXPECT_FALSE(resumed.Weights().ok());
  ASSERT_TRUE(resumed.AddGroup("b", 1, "test", now_).ok());
  Client b{"b", /*read_ahead=*/false};
  auto again = b.Ask(resumed, now_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->unit().SerializeAsString(), held.SerializeAsString());

  // A job with weights of its own takes no gathered ones.
  Job own("job-2", JobConfig::FromNormalized(FileSpec(2)));
  ASSERT_TRUE(own.InitWeights(MakeFloat32Header(0, {"w"}, {{2}}), {{1.0f, 2.0f}}).value());
  EXPECT_EQ(own.SaveCheckpoint(now_, gathered).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mpilearn::server
