// JobRegistry without a network: jobs, groups, the queue of jobs,
// persistence, checkpoints and restart, validations and stop rules, metrics.
// Over ~500 lines because restart and checkpoint scenarios each need a few
// dozen lines of set-up (state directory, jobs, groups, updates) to prove
// what survives; each test stands alone.
#include "server/core/job_registry.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "common/trace.h"
#include "google/protobuf/util/json_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/job_observer.h"
#include "server/core/job_tracer.h"

namespace mpilearn::server {
namespace {

using ::testing::HasSubstr;

// The spec normalized, as MasterCore::SubmitJob hands it to the registry.
JobConfig Normalized(const v1::JobSpec& spec) {
  return JobConfig::Create(spec).value();
}

v1::JobSpec SgdSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.5);
  return spec;
}

// Counts the weights the registry hands its observers (the snapshot hub's
// calls).
class CountingSink : public JobObserver {
 public:
  void OnUpdateApplied(const std::string&, const v1::JobSpec&,
                       const AppliedUpdate& update) override {
    ++updates;
    last_version = update.weights->header.version();
    last_updates_applied = update.updates_applied;
  }
  void OnEpochEnd(const std::string&, const v1::JobSpec&,
                  const std::shared_ptr<const WeightsSnapshot>&,
                  int epochs_done) override {
    epoch_ends.push_back(epochs_done);
  }
  void OnJobEnded(const std::string& job_id) override {
    ended.push_back(job_id);
  }

  int updates = 0;
  uint64_t last_version = 0;
  uint64_t last_updates_applied = 0;
  std::vector<int> epoch_ends;
  std::vector<std::string> ended;
};

// Records what the registry tells its metrics.
class RecordingMetrics : public JobObserver {
 public:
  struct Observed {
    std::string job_id;
    AppliedUpdate update;
  };
  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec&,
                       const AppliedUpdate& update) override {
    observed.push_back({job_id, update});
  }
  std::vector<Observed> observed;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = std::string(getenv("TEST_TMPDIR")) + "/" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(state_dir_);
    registry_ = MakeRegistry();
  }

  std::unique_ptr<JobRegistry> MakeRegistry(int max_queued_jobs = 0) {
    JobRegistry::Options options;
    options.max_queued_jobs = max_queued_jobs;
    options.state_dir = state_dir_;
    options.group_timeout = absl::Seconds(10);
    options.clock = [this] { return now_; };
    options.observers = {&metrics_, &tracer_, &sink_};
    auto registry = JobRegistry::Create(options);
    EXPECT_TRUE(registry.ok()) << registry.status();
    return std::move(registry).value();
  }

  v1::RegisterGroupResponse Register(const std::string& job_id) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(2);
    request.set_host("test");
    auto response = registry_->RegisterGroup(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  }

  // Weights w = [1, 2, 3] (shape {3}) and b = [10] (shape {1}).
  void InitWeights(const std::string& job_id, const std::string& group_id) {
    auto response = registry_->InitWeights(
        job_id, group_id, MakeFloat32Header(0, {"w", "b"}, {{3}, {1}}),
        {{1, 2, 3}, {10}});
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->accepted());
  }

  // Completes `completed` (a loss of 0.5 per sample) and asks for the next
  // data unit.
  absl::StatusOr<v1::NextDataUnitResponse> NextUnit(
      const std::string& job_id, const std::string& group_id,
      int64_t train_samples, const std::vector<v1::DataUnit>& completed) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_train_samples(train_samples);
    for (const v1::DataUnit& unit : completed) {
      v1::CompletedUnit* done = request.add_completed();
      done->set_unit_id(unit.unit_id());
      done->set_samples(static_cast<uint64_t>(unit.end() - unit.begin()));
      done->set_loss_sum(0.5 * static_cast<double>(done->samples()));
    }
    return registry_->NextDataUnit(request);
  }

  // Pushes gradient g = [s, -s, 2s], [s] from the group at the job's
  // current version; returns the new weights.
  std::vector<std::vector<float>> Push(const std::string& job_id,
                                       const std::string& group_id, float s) {
    auto job = registry_->FindJob(job_id).value();
    GradientUpdate update;
    update.group_id = group_id;
    update.base_version = job->Weights().value()->header.version();
    update.values = {{s, -s, 2 * s}, {s}};
    auto weights = registry_->ApplyGradient(*job, update);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? (*weights)->values : std::vector<std::vector<float>>{};
  }

  std::string CheckpointDir(const std::string& job_id) const {
    return state_dir_ + "/jobs/" + job_id + "/checkpoints";
  }

  // File names in the job's checkpoint directory, sorted.
  std::vector<std::string> CheckpointFiles(const std::string& job_id) const {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry :
         std::filesystem::directory_iterator(CheckpointDir(job_id), ec)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  CountingSink sink_;
  RecordingMetrics metrics_;
  std::unique_ptr<TraceRecorder> trace_ =
      TraceRecorder::InMemory(/*pid=*/0, "mpilearn-master");
  JobTracer tracer_{*trace_};
  std::string state_dir_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobRegistryTest, GradientUpdatesWeightsAndVersion) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const auto group = Register(job_id);
  EXPECT_FALSE(group.weights_initialized());
  EXPECT_EQ(group.spec().epochs(), 5);  // defaults filled in
  InitWeights(job_id, group.group_id());

  // A second group's offer is declined: the first one wins.
  const auto late = Register(job_id);
  EXPECT_TRUE(late.weights_initialized());
  auto declined = registry_->InitWeights(
      job_id, late.group_id(), MakeFloat32Header(0, {"w", "b"}, {{3}, {1}}),
      {{0, 0, 0}, {0}});
  ASSERT_TRUE(declined.ok());
  EXPECT_FALSE(declined->accepted());

  auto job = registry_->FindJob(job_id).value();
  GradientUpdate update;
  update.group_id = group.group_id();
  update.samples = 64;
  update.values = {{1, -1, 0.5f}, {2}};
  auto weights = registry_->ApplyGradient(*job, update);
  ASSERT_TRUE(weights.ok()) << weights.status();
  // Plain SGD: w - 0.5 * g.
  EXPECT_EQ((*weights)->values[0], (std::vector<float>{0.5f, 2.5f, 2.75f}));
  EXPECT_EQ((*weights)->values[1], (std::vector<float>{9}));
  EXPECT_EQ((*weights)->header.version(), 1u);

  // The snapshot handed out stays as it was after the next update.
  auto second = registry_->ApplyGradient(*job, update);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*weights)->values[1], (std::vector<float>{9}));
  EXPECT_EQ((*second)->values[1], (std::vector<float>{8}));

  auto status = registry_->Status(job_id).value();
  EXPECT_EQ(status.updates_applied(), 2u);
  // Samples are counted from completed data units, not from pushes.
  EXPECT_EQ(status.samples_trained(), 0u);
  ASSERT_EQ(status.groups_size(), 2);
  EXPECT_EQ(status.groups(0).group_id(), group.group_id());
  EXPECT_EQ(status.groups(0).updates_applied(), 2u);
  EXPECT_EQ(status.groups(1).updates_applied(), 0u);
  EXPECT_EQ(status.version(), 2u);
  EXPECT_EQ(status.parameters(), 4u);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobRegistryTest, UnknownJobAndEmptyQueueAreNotFound) {
  v1::RegisterGroupRequest request;
  request.set_ranks(1);
  auto none = registry_->RegisterGroup(request);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("mpilearnctl submit"), std::string::npos);

  request.set_job_id("job-999999");
  auto unknown = registry_->RegisterGroup(request);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Status("nope").status().code(),
            absl::StatusCode::kNotFound);
}

// --max_queued_jobs counts QUEUED jobs only: once a group takes one, the
// next submit is accepted again.
TEST_F(JobRegistryTest, QueuedJobsAreBounded) {
  registry_ = MakeRegistry(/*max_queued_jobs=*/2);
  const std::string first = registry_->Submit(Normalized(SgdSpec())).value();
  ASSERT_TRUE(registry_->Submit(Normalized(SgdSpec())).ok());
  const absl::Status full = registry_->Submit(Normalized(SgdSpec())).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(ReasonOf(full), v1::ERROR_REASON_LIMIT);
  EXPECT_NE(full.message().find("--max_queued_jobs"), std::string::npos) << full;
  EXPECT_EQ(registry_->List().size(), 2u);
  EXPECT_EQ(Register("").job_id(), first);  // RUNNING now
  EXPECT_TRUE(registry_->Submit(Normalized(SgdSpec())).ok());
}

// An unknown id of a megabyte is NOT_FOUND with a short echo of it.
TEST_F(JobRegistryTest, UnknownIdsAreEchoedBounded) {
  const std::string huge(1 << 20, 'j');
  const absl::Status unknown = registry_->Status(huge).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(unknown.message().size(), 300u) << unknown.message().substr(0, 300);
  EXPECT_NE(unknown.message().find("[1048576 bytes]"), std::string::npos);
  const std::string job = registry_->Submit(Normalized(SgdSpec())).value();
  const absl::Status group =
      registry_->Heartbeat(job, std::string(1 << 20, 'g')).status();
  EXPECT_EQ(ReasonOf(group), v1::ERROR_REASON_GROUP_UNKNOWN);
  EXPECT_LT(group.message().size(), 300u) << group.message().substr(0, 300);
}

TEST_F(JobRegistryTest, QueueHandsOutOldestQueuedJob) {
  const std::string first = registry_->Submit(Normalized(SgdSpec())).value();
  const std::string second = registry_->Submit(Normalized(SgdSpec())).value();
  EXPECT_EQ(Register("").job_id(), first);
  EXPECT_EQ(Register("").job_id(), second);
}

TEST_F(JobRegistryTest, LostGroupRequeuesJobKeepingWeights) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const auto group = Register(job_id);
  InitWeights(job_id, group.group_id());
  now_ += absl::Seconds(5);
  EXPECT_EQ(registry_->ReapLostGroups(), 0);
  now_ += absl::Seconds(11);
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  EXPECT_EQ(registry_->Status(job_id)->state(), v1::JOB_STATE_QUEUED);

  // The lost group is told to restart; a new group continues the job.
  auto job = registry_->FindJob(job_id).value();
  GradientUpdate update;
  update.group_id = group.group_id();
  update.values = {{0, 0, 0}, {0}};
  EXPECT_EQ(registry_->ApplyGradient(*job, update).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto next = Register("");
  EXPECT_EQ(next.job_id(), job_id);
  EXPECT_TRUE(next.weights_initialized());
}

// A lead's sharded job: its checkpoints hold the weights gathered from its
// shards, no optimizer state; a completed one leaves them in weights.pb, and
// they are what the job's ended weights read back (adam here, whose own
// checkpoints would need its moments).
TEST_F(JobRegistryTest, CheckpointsOfWeightsOnShards) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_optimizer()->set_name("adam");
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const auto group = Register(job_id);
  auto gathered = std::make_shared<WeightsSnapshot>();
  gathered->header = MakeFloat32Header(7, {"w", "b"}, {{3}, {1}});
  gathered->values = {{1, 2, 3}, {10}};
  // Nothing changed yet: a periodic checkpoint is not due.
  auto unit = NextUnit(job_id, group.group_id(), 1000, {});
  ASSERT_TRUE(unit.ok()) << unit.status();
  ASSERT_TRUE(registry_->CheckpointFromShards(job_id, gathered, /*final=*/false).ok());
  auto done = NextUnit(job_id, group.group_id(), 1000, {unit->unit()});
  ASSERT_TRUE(done.ok()) << done.status();
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group.group_id());
  leave.set_completed(true);
  leave.set_test_loss(0.5);
  ASSERT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  ASSERT_TRUE(registry_->CheckpointFromShards(job_id, gathered, /*final=*/true).ok());
  EXPECT_TRUE(std::filesystem::exists(state_dir_ + "/jobs/" + job_id + "/weights.pb"));
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ended =
      registry_->EndedWeights(*registry_->FindJob(job_id).value());
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ((*ended)->header.version(), 7u);
  EXPECT_EQ((*ended)->values, gathered->values);
  // A restarted registry loads the job from that checkpoint, without
  // weights of its own.
  registry_ = MakeRegistry();
  const v1::JobStatus reloaded = registry_->Status(job_id).value();
  EXPECT_EQ(reloaded.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(reloaded.checkpoint_version(), 7u);
}

TEST_F(JobRegistryTest, CompletionWritesHistoryAndWeights) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const auto group = Register(job_id);
  InitWeights(job_id, group.group_id());
  v1::EpochRecord record;
  record.set_epoch(1);
  record.set_val_accuracy(0.75);
  record.set_group_id(group.group_id());
  // The epoch is not finished before its data units are.
  EXPECT_EQ(registry_->ReportEpoch(job_id, record).status().code(),
            absl::StatusCode::kNotFound);
  auto unit = NextUnit(job_id, group.group_id(), 1000, {});
  ASSERT_TRUE(unit.ok()) << unit.status();
  ASSERT_EQ(unit->action(), v1::NextDataUnitResponse::TRAIN);
  auto done = NextUnit(job_id, group.group_id(), 1000, {unit->unit()});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(done->finish());
  EXPECT_EQ(done->finished_epochs_size(), 1);
  ASSERT_TRUE(registry_->ReportEpoch(job_id, record).ok());

  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group.group_id());
  leave.set_completed(true);
  leave.set_test_accuracy(0.8);
  leave.set_test_loss(0.5);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);

  const std::string dir = state_dir_ + "/jobs/" + job_id;
  EXPECT_TRUE(std::filesystem::exists(dir + "/spec.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/weights.pb"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer.pb"));
  std::ifstream history(dir + "/history.json");
  std::string text((std::istreambuf_iterator<char>(history)),
                   std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("JOB_STATE_COMPLETED"), std::string::npos);
  // The epoch's record, merged with the group's validation, is appended to
  // records.jsonl, after the master's own record of it.
  const std::string records = ReadFile(dir + "/records.jsonl");
  EXPECT_NE(records.find("{\"epoch\":{\"epoch\":1,"), std::string::npos)
      << records;
  EXPECT_NE(records.find("\"val_accuracy\":0.75"), std::string::npos)
      << records;

  // A finished job takes no new group.
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  EXPECT_EQ(registry_->RegisterGroup(request).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A restarted master does not reuse the id.
  registry_ = MakeRegistry();
  EXPECT_NE(registry_->Submit(Normalized(SgdSpec())).value(), job_id);
}

TEST_F(JobRegistryTest, LostGroupCannotFailTheJobItWasRemovedFrom) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const auto paused = Register(job_id);
  now_ += absl::Seconds(11);
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  const auto successor = Register("");
  ASSERT_EQ(successor.job_id(), job_id);

  // The paused group wakes up, finds itself lost and reports an error.
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(paused.group_id());
  leave.set_error("group was declared lost");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_RUNNING);

  // The successor completes it; a late error after that changes nothing.
  leave.set_group_id(successor.group_id());
  leave.clear_error();
  leave.set_completed(true);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  leave.set_completed(false);
  leave.set_error("late failure");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
}

TEST_F(JobRegistryTest, GroupErrorFailsJobWithMessage) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const auto group = Register(job_id);
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group.group_id());
  leave.set_error("data.train_images: cannot open 'x'");
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_FAILED);
  EXPECT_NE(registry_->Status(job_id)->message().find("cannot open"),
            std::string::npos);
}

// A group lost in the middle of an epoch: the unit it held goes back to the
// queue and to the group still training, and the epoch still covers every
// sample once.
TEST_F(JobRegistryTest, LostGroupsUnitGoesToTheOtherGroup) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  spec.set_data_unit_size(100);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string a = Register(job_id).group_id();
  const std::string b = Register(job_id).group_id();
  constexpr int64_t kSamples = 450;  // 5 units, the last of 50

  auto held_a = NextUnit(job_id, a, kSamples, {}).value();
  auto held_b = NextUnit(job_id, b, kSamples, {}).value();
  ASSERT_EQ(held_b.action(), v1::NextDataUnitResponse::TRAIN);
  const int64_t lost_unit = held_b.unit().unit_id();
  EXPECT_EQ(lost_unit, 1);
  // a keeps working; b goes silent past the group timeout (10 s).
  for (int i = 0; i < 2; ++i) {
    now_ += absl::Seconds(6);
    held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  }
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.units_requeued(), 1u);

  // The lost group is refused; its unit is a's next.
  EXPECT_EQ(NextUnit(job_id, b, kSamples, {held_b.unit()}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  ASSERT_EQ(held_a.action(), v1::NextDataUnitResponse::TRAIN);
  EXPECT_EQ(held_a.unit().unit_id(), lost_unit);
  EXPECT_EQ(held_a.unit().begin(), 100);
  EXPECT_EQ(held_a.unit().end(), 200);
  held_a = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  EXPECT_EQ(held_a.unit().end(), kSamples);
  auto last = NextUnit(job_id, a, kSamples, {held_a.unit()}).value();
  EXPECT_EQ(last.action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(last.finish());
  ASSERT_EQ(last.finished_epochs_size(), 1);

  status = registry_->Status(job_id).value();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).samples(), static_cast<uint64_t>(kSamples));
  EXPECT_DOUBLE_EQ(status.history(0).train_loss(), 0.5);
  EXPECT_EQ(status.samples_trained(), static_cast<uint64_t>(kSamples));
  EXPECT_EQ(status.units_requeued(), 1u);
  EXPECT_EQ(status.epochs_done(), 1);
  for (const v1::GroupInfo& group : status.groups()) {
    EXPECT_EQ(group.units_completed(), group.group_id() == a ? 5u : 0u);
    EXPECT_EQ(group.samples_trained(),
              group.group_id() == a ? static_cast<uint64_t>(kSamples) : 0u);
  }
  // The finished epoch is already on disk.
  std::ifstream history(state_dir_ + "/jobs/" + job_id + "/history.json");
  std::string text((std::istreambuf_iterator<char>(history)),
                   std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"units_requeued\": \"1\""), std::string::npos) << text;
  const std::string records =
      ReadFile(state_dir_ + "/jobs/" + job_id + "/records.jsonl");
  EXPECT_NE(records.find("{\"epoch\":{\"epoch\":1,\"train_loss\":0.5,"),
            std::string::npos)
      << records;
}

TEST_F(JobRegistryTest, NextDataUnitNeedsARegisteredGroup) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  EXPECT_EQ(NextUnit(job_id, "g-99", 100, {}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(NextUnit("job-999999", "g-1", 100, {}).status().code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Checkpoints, restart, validations.

// The checkpoint file format itself (trailer, CRC, truncation) is tested
// in common/checkpoint_file_test.cc; JobStore only forwards to it.

// A master restarted on the same state directory resumes the job from its
// checkpoint: QUEUED, the old group unknown, the unit that was in flight
// handed out again and the completed one not, and the next update
// bit-identical to the one the first master applied after the checkpoint.
TEST_F(JobRegistryTest, RestartResumesQueueAndUpdatesExactly) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_epochs(1);
  spec.set_data_unit_size(100);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string g1 = Register(job_id).group_id();
  InitWeights(job_id, g1);
  constexpr int64_t kSamples = 450;  // 5 units, the last of 50
  auto unit = NextUnit(job_id, g1, kSamples, {}).value();
  ASSERT_EQ(unit.unit().unit_id(), 0);
  Push(job_id, g1, 0.5f);
  Push(job_id, g1, -0.25f);
  unit = NextUnit(job_id, g1, kSamples, {unit.unit()}).value();
  ASSERT_EQ(unit.unit().unit_id(), 1);
  Push(job_id, g1, 1.0f);
  now_ += absl::Seconds(3);
  registry_->CheckpointAll();
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"ckpt-000000000003.pb"}));
  EXPECT_EQ(registry_->Status(job_id)->checkpoint_version(), 3u);
  const std::vector<std::vector<float>> uninterrupted = Push(job_id, g1, 0.75f);

  registry_ = MakeRegistry();
  v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.version(), 3u);
  EXPECT_EQ(status.updates_applied(), 3u);
  EXPECT_EQ(status.samples_trained(), 100u);
  EXPECT_EQ(status.units_requeued(), 1u);
  EXPECT_EQ(status.checkpoint_version(), 3u);
  EXPECT_EQ(status.groups_size(), 0);
  // The previous master's group must register again.
  EXPECT_EQ(NextUnit(job_id, g1, kSamples, {unit.unit()}).status().code(),
            absl::StatusCode::kNotFound);
  const auto g2 = Register("");
  EXPECT_EQ(g2.job_id(), job_id);
  EXPECT_TRUE(g2.weights_initialized());
  EXPECT_EQ(g2.group_id(), "g-2");  // ids continue after the saved ones
  EXPECT_EQ(Push(job_id, g2.group_id(), 0.75f), uninterrupted);
  std::vector<int64_t> handed_out;
  for (auto next = NextUnit(job_id, g2.group_id(), kSamples, {}).value();
       next.action() == v1::NextDataUnitResponse::TRAIN;
       next = NextUnit(job_id, g2.group_id(), kSamples, {next.unit()}).value()) {
    handed_out.push_back(next.unit().unit_id());
  }
  EXPECT_EQ(handed_out, (std::vector<int64_t>{1, 2, 3, 4}));
  status = registry_->Status(job_id).value();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).samples(), static_cast<uint64_t>(kSamples));
  EXPECT_EQ(status.samples_trained(), static_cast<uint64_t>(kSamples));
}

// A damaged newest checkpoint and a truncated one before it are skipped
// (and renamed *.corrupt); the job resumes from the one before them. With
// none usable it restarts from its spec.
TEST_F(JobRegistryTest, CorruptOrTruncatedCheckpointFallsBackToPrevious) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);
  std::vector<std::vector<std::vector<float>>> weights;
  for (int i = 1; i <= 3; ++i) {
    weights.push_back(Push(job_id, group, 0.5f * static_cast<float>(i)));
    registry_->CheckpointAll();
  }
  const std::string dir = CheckpointDir(job_id) + "/";
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"ckpt-000000000001.pb",
                                      "ckpt-000000000002.pb",
                                      "ckpt-000000000003.pb"}));
  std::string newest = ReadFile(dir + "ckpt-000000000003.pb");
  newest[newest.size() / 3] ^= 0x01;
  WriteFile(dir + "ckpt-000000000003.pb", newest);
  const std::string middle = ReadFile(dir + "ckpt-000000000002.pb");
  WriteFile(dir + "ckpt-000000000002.pb", middle.substr(0, middle.size() / 2));
  // A write the crash interrupted leaves a temporary file; it goes.
  WriteFile(dir + "ckpt-000000000004.pb.tmp.77.0", middle);

  registry_ = MakeRegistry();
  EXPECT_EQ(registry_->Status(job_id)->version(), 1u);
  auto job = registry_->FindJob(job_id).value();
  EXPECT_EQ(job->Weights().value()->values, weights[0]);
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"ckpt-000000000001.pb",
                                      "ckpt-000000000002.pb.corrupt",
                                      "ckpt-000000000003.pb.corrupt"}));

  std::string oldest = ReadFile(dir + "ckpt-000000000001.pb");
  oldest.back() = 'X';  // the trailer's magic
  WriteFile(dir + "ckpt-000000000001.pb", oldest);
  registry_ = MakeRegistry();
  const v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.updates_applied(), 0u);
  EXPECT_FALSE(Register(job_id).weights_initialized());
}

// every_updates checkpoints on the pushing thread; keep bounds the files.
TEST_F(JobRegistryTest, EveryUpdatesCheckpointsKeepTheNewest) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_checkpoint()->set_every_updates(2);
  spec.mutable_checkpoint()->set_keep(2);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);
  Push(job_id, group, 1.0f);
  EXPECT_TRUE(CheckpointFiles(job_id).empty());
  for (int i = 0; i < 6; ++i) Push(job_id, group, 1.0f);
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"ckpt-000000000004.pb",
                                      "ckpt-000000000006.pb"}));
  EXPECT_EQ(registry_->Status(job_id)->checkpoint_version(), 6u);
  EXPECT_EQ(sink_.updates, 7);
  EXPECT_EQ(sink_.last_version, 7u);
  EXPECT_EQ(sink_.last_updates_applied, 7u);
}

// every_seconds checkpoints come from Tick, only for a job that changed.
TEST_F(JobRegistryTest, TickWritesTimeBasedCheckpoints) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_checkpoint()->set_every_seconds(30);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = Register(job_id).group_id();
  registry_->Tick();  // no weights yet
  EXPECT_TRUE(CheckpointFiles(job_id).empty());
  InitWeights(job_id, group);
  registry_->Tick();
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"ckpt-000000000000.pb"}));
  Push(job_id, group, 1.0f);
  now_ += absl::Seconds(9);
  registry_->Tick();
  EXPECT_EQ(CheckpointFiles(job_id).size(), 1u);
  now_ += absl::Seconds(21);
  registry_->Tick();
  EXPECT_EQ(CheckpointFiles(job_id).back(), "ckpt-000000000001.pb");
  now_ += absl::Seconds(60);
  registry_->Tick();  // nothing changed; and the group is lost (timeout 10 s)
  EXPECT_EQ(CheckpointFiles(job_id).size(), 2u);
  EXPECT_EQ(registry_->Status(job_id)->state(), v1::JOB_STATE_QUEUED);
}

// best.pb holds the checkpoint taken when the best validation arrived.
TEST_F(JobRegistryTest, BestCheckpointFollowsImprovements) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);
  const std::string best = CheckpointDir(job_id) + "/best.pb";
  auto report = [&](double val_loss) {
    v1::ValidationRecord record;
    record.set_version(registry_->Status(job_id)->version());
    record.set_val_loss(val_loss);
    record.set_val_accuracy(0.5);
    record.set_source("pool v-1");
    return registry_->ReportValidation(job_id, record);
  };
  Push(job_id, group, 1.0f);
  EXPECT_EQ(report(0.5).value(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(JobStore::ReadCheckpoint(best)->weights().header().version(), 1u);
  Push(job_id, group, 1.0f);
  ASSERT_TRUE(report(0.75).ok());  // worse: best.pb stays
  EXPECT_EQ(JobStore::ReadCheckpoint(best)->weights().header().version(), 1u);
  Push(job_id, group, 1.0f);
  ASSERT_TRUE(report(0.25).ok());
  auto file = JobStore::ReadCheckpoint(best);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->weights().header().version(), 3u);
  EXPECT_DOUBLE_EQ(file->status().best_metric_value(), 0.25);
  EXPECT_EQ(file->status().validations_size(), 3);
  const v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_DOUBLE_EQ(status.best_metric_value(), 0.25);
  EXPECT_EQ(status.validations(1).source(), "pool v-1");
  EXPECT_EQ(registry_->ReportValidation("job-999999", v1::ValidationRecord())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// Reports whose values are out of range are refused naming the field, and
// leave the job's validations and best value as they were.
TEST_F(JobRegistryTest, BadValidationRecordsAreRefusedAndLeaveTheBest) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);
  Push(job_id, group, 1.0f);
  const uint64_t version = registry_->Status(job_id)->version();
  v1::ValidationRecord good;
  good.set_version(version);
  good.set_val_loss(0.5);
  good.set_val_accuracy(0.75);
  good.set_samples(100);
  good.set_source("pool v-1");
  (*good.mutable_metrics())["val_loss"] = 0.5;
  (*good.mutable_metrics())["val_accuracy"] = 0.75;
  ASSERT_TRUE(registry_->ReportValidation(job_id, good).ok());
  ASSERT_DOUBLE_EQ(registry_->Status(job_id)->best_metric_value(), 0.5);

  struct Bad {
    std::function<void(v1::ValidationRecord&)> change;
    std::string field;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Bad> bad = {
      {[&](v1::ValidationRecord& r) { r.set_val_loss(nan); }, "record.val_loss is nan"},
      {[](v1::ValidationRecord& r) { r.set_val_loss(-1e308); }, "record.val_loss is -1e+308"},
      {[](v1::ValidationRecord& r) { r.set_val_loss(0.01 / 0.0); }, "record.val_loss is inf"},
      {[](v1::ValidationRecord& r) { r.set_val_accuracy(17); },
       "record.val_accuracy is 17; it must be in [0, 1]"},
      {[](v1::ValidationRecord& r) { (*r.mutable_metrics())["val_mae"] = -1; },
       "record.metrics[val_mae] is -1; it must be >= 0"},
      {[](v1::ValidationRecord& r) { (*r.mutable_metrics())["val_kind_auc"] = 1.5; },
       "record.metrics[val_kind_auc] is 1.5"},
      {[](v1::ValidationRecord& r) { (*r.mutable_metrics())["loss"] = 0.1; },
       "record.metrics: 'loss' is not a validation metric's name"},
      {[](v1::ValidationRecord& r) { r.set_samples(-3); }, "record.samples is -3"},
      {[&](v1::ValidationRecord& r) { r.set_version(version + 5); },
       absl::StrCat("record.version: ", version + 5, " is ahead of the job's weights")},
  };
  for (const Bad& b : bad) {
    v1::ValidationRecord record = good;
    record.set_val_loss(0.01);  // would be a new best
    (*record.mutable_metrics())["val_loss"] = 0.01;
    b.change(record);
    const auto state = registry_->ReportValidation(job_id, record);
    EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument) << b.field;
    EXPECT_THAT(std::string(state.status().message()), HasSubstr(b.field));
    const v1::JobStatus status = registry_->Status(job_id).value();
    EXPECT_DOUBLE_EQ(status.best_metric_value(), 0.5) << b.field;
    EXPECT_EQ(status.validations_size(), 1) << b.field;
  }
  // An epoch report alike.
  v1::EpochRecord epoch;
  epoch.set_epoch(1);
  epoch.set_group_id(group);
  epoch.set_val_loss(nan);
  EXPECT_THAT(std::string(registry_->ReportEpoch(job_id, epoch).status().message()),
              HasSubstr("record.val_loss is nan"));
  epoch.set_val_loss(0.01);
  epoch.set_epoch(0);
  EXPECT_THAT(std::string(registry_->ReportEpoch(job_id, epoch).status().message()),
              HasSubstr("record.epoch is 0; it must be >= 1"));
  EXPECT_DOUBLE_EQ(registry_->Status(job_id)->best_metric_value(), 0.5);
  EXPECT_EQ(registry_->Status(job_id)->validations_size(), 1);
}

// In-band validation (ReportEpoch) reaching the target ends the job: the
// sink hears of it, a group finishes the job and its test result is kept,
// and the end is on disk.
TEST_F(JobRegistryTest, TargetReachedAtEpochEndCompletesJob) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(3);
  spec.set_data_unit_size(100);
  spec.mutable_target()->set_value(0.7);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string a = Register(job_id).group_id();
  const std::string b = Register(job_id).group_id();
  InitWeights(job_id, a);
  auto held_a = NextUnit(job_id, a, 200, {}).value();
  auto held_b = NextUnit(job_id, b, 200, {}).value();
  Push(job_id, a, 1.0f);
  held_a = NextUnit(job_id, a, 200, {held_a.unit()}).value();
  ASSERT_EQ(held_a.unit().epoch(), 1);
  held_b = NextUnit(job_id, b, 200, {held_b.unit()}).value();
  ASSERT_EQ(held_b.finished_epochs_size(), 1);
  EXPECT_EQ(sink_.epoch_ends, (std::vector<int>{1}));

  v1::EpochRecord record;
  record.set_epoch(1);
  record.set_group_id(b);
  record.set_val_loss(0.5);
  record.set_val_accuracy(0.75);
  EXPECT_EQ(registry_->ReportEpoch(job_id, record).value(),
            v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(sink_.ended, (std::vector<std::string>{job_id}));
  v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.stop_reason(), "target reached: val_accuracy 0.75 > 0.7");
  ASSERT_EQ(status.validations_size(), 1);
  EXPECT_EQ(status.validations(0).source(), "group " + b);
  EXPECT_EQ(status.validations(0).version(), 1u);
  EXPECT_EQ(status.validations(0).epoch(), 1);
  EXPECT_DOUBLE_EQ(status.validations(0).unix_seconds(), 1000.0);
  EXPECT_TRUE(std::filesystem::exists(state_dir_ + "/jobs/" + job_id +
                                      "/weights.pb"));
  EXPECT_EQ(CheckpointFiles(job_id),
            (std::vector<std::string>{"best.pb", "ckpt-000000000001.pb"}));

  // a's push in flight is answered, not applied; a finishes, b leaves.
  EXPECT_EQ(Push(job_id, a, 5.0f), registry_->FindJob(job_id).value()
                                       ->Weights()
                                       .value()
                                       ->values);
  EXPECT_EQ(sink_.updates, 1);
  auto finish = NextUnit(job_id, a, 200, {held_a.unit()}).value();
  EXPECT_EQ(finish.action(), v1::NextDataUnitResponse::DONE);
  EXPECT_TRUE(finish.finish());
  auto done = NextUnit(job_id, b, 200, {held_b.unit()}).value();
  EXPECT_FALSE(done.finish());
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(b);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  leave.set_group_id(a);
  leave.set_completed(true);
  leave.set_test_loss(0.6);
  leave.set_test_accuracy(0.72);
  EXPECT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(sink_.ended.size(), 1u);

  // The end, with the test result, survives a restart.
  registry_ = MakeRegistry();
  status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(status.test_accuracy(), 0.72);
  EXPECT_EQ(status.stop_reason(), "target reached: val_accuracy 0.75 > 0.7");
  EXPECT_EQ(status.version(), 1u);
  EXPECT_EQ(status.epochs_done(), 1);
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  EXPECT_EQ(registry_->RegisterGroup(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Jobs that ended, with or without a checkpoint (a failed job never got
// weights; one from before checkpoints existed has only its history), come
// back as they ended; a queued one stays queued; new ids continue.
TEST_F(JobRegistryTest, EndedJobsLoadAsTheyEnded) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string done_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = Register(done_id).group_id();
  InitWeights(done_id, group);
  Push(done_id, group, 1.0f);
  auto unit = NextUnit(done_id, group, 50, {}).value();
  ASSERT_TRUE(NextUnit(done_id, group, 50, {unit.unit()}).value().finish());
  v1::LeaveRequest leave;
  leave.set_job_id(done_id);
  leave.set_group_id(group);
  leave.set_completed(true);
  leave.set_test_accuracy(0.8);
  ASSERT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);

  const std::string failed_id = registry_->Submit(Normalized(SgdSpec())).value();
  leave.set_job_id(failed_id);
  leave.set_group_id(Register(failed_id).group_id());
  leave.set_completed(false);
  leave.set_error("cannot open data");
  ASSERT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_FAILED);
  const std::string queued_id = registry_->Submit(Normalized(SgdSpec())).value();

  // As if written before checkpoints existed.
  std::filesystem::remove_all(CheckpointDir(done_id));
  registry_ = MakeRegistry();
  ASSERT_EQ(registry_->List().size(), 3u);
  const v1::JobStatus done = registry_->Status(done_id).value();
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(done.test_accuracy(), 0.8);
  EXPECT_EQ(done.version(), 1u);
  EXPECT_EQ(done.parameters(), 4u);
  EXPECT_EQ(done.history_size(), 1);
  const v1::JobStatus failed = registry_->Status(failed_id).value();
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed.message().find("cannot open data"), std::string::npos);
  EXPECT_EQ(registry_->Status(queued_id)->state(), v1::JOB_STATE_QUEUED);
  const auto next = Register("");
  EXPECT_EQ(next.job_id(), queued_id);
  EXPECT_EQ(next.group_id(), "g-3");
  EXPECT_EQ(registry_->Submit(Normalized(SgdSpec())).value(), "job-000004");
}

// Each applied update reaches the metrics with its staleness and labels,
// and the trace gets an "apply" event (version, staleness) per update and a
// "checkpoint" event per checkpoint; refused updates report nothing.
TEST_F(JobRegistryTest, AppliedUpdatesReachMetricsAndTrace) {
  v1::JobSpec spec = SgdSpec();
  spec.set_max_staleness(2);
  spec.mutable_checkpoint()->set_every_updates(3);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);
  auto job = registry_->FindJob(job_id).value();
  trace_->TakeEvents();  // the process name

  // Bases 0, 0, 1, 0: staleness 0, 1, 1, then 3 > 2 is refused.
  const uint64_t bases[] = {0, 0, 1, 0};
  for (uint64_t base : bases) {
    GradientUpdate update;
    update.group_id = group;
    update.base_version = base;
    update.values = {{1, 1, 1}, {1}};
    registry_->ApplyGradient(*job, update).IgnoreError();
  }
  ASSERT_EQ(metrics_.observed.size(), 3u);
  const uint64_t staleness[] = {0, 1, 1};
  for (size_t i = 0; i < 3; ++i) {
    const RecordingMetrics::Observed& seen = metrics_.observed[i];
    EXPECT_EQ(seen.job_id, job_id);
    EXPECT_EQ(seen.update.staleness, staleness[i]);
    EXPECT_GE(seen.update.apply_seconds(), 0.0);
    EXPECT_EQ(seen.update.device, "cpu");
    EXPECT_EQ(seen.update.optimizer, "sgd");
  }
  EXPECT_EQ(registry_->Status(job_id)->stale_rejected(), 1u);

  const std::string events = trace_->TakeEvents();
  EXPECT_TRUE(absl::StrContains(
      events, R"("name":"apply","cat":"master")"))
      << events;
  EXPECT_TRUE(absl::StrContains(events, R"("args":{"version":2,"staleness":1})"))
      << events;
  EXPECT_TRUE(absl::StrContains(events, R"("args":{"version":3,"staleness":1})"))
      << events;
  EXPECT_FALSE(absl::StrContains(events, R"("staleness":3)")) << events;
  // every_updates 3: one checkpoint, at version 3.
  EXPECT_TRUE(absl::StrContains(
      events, R"("name":"checkpoint","cat":"master")"))
      << events;
  EXPECT_TRUE(absl::StrContains(events, R"("args":{"version":3}})")) << events;
}

// Heartbeats keep the group's telemetry; ListForMetrics has it, the latest
// validation and the validation count; NextDataUnit answers carry progress.
TEST_F(JobRegistryTest, TelemetryProgressAndMetricsView) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(2);
  spec.set_data_unit_size(10);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = Register(job_id).group_id();
  InitWeights(job_id, group);

  v1::GroupTelemetry telemetry;
  telemetry.set_compute_seconds(12.5);
  telemetry.set_resident_bytes(1 << 20);
  ASSERT_TRUE(registry_->Heartbeat(job_id, group, &telemetry).ok());
  ASSERT_TRUE(registry_->Heartbeat(job_id, group).ok());  // keeps it

  auto first = NextUnit(job_id, group, 20, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->progress().epochs(), 2);
  EXPECT_EQ(first->progress().samples_per_epoch(), 20u);
  auto second = NextUnit(job_id, group, 20, {first->unit()});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->progress().samples_trained(), 10u);
  EXPECT_DOUBLE_EQ(second->progress().train_loss(), 0.5);  // NextUnit's loss

  for (int i = 1; i <= 2; ++i) {
    v1::ValidationRecord record;  // of the initial weights (version 0)
    record.set_val_accuracy(0.25 * i);
    ASSERT_TRUE(registry_->ReportValidation(job_id, record).ok());
  }
  const std::vector<JobMetricsView> views = registry_->ListForMetrics();
  ASSERT_EQ(views.size(), 1u);
  const JobMetricsView& view = views[0];
  EXPECT_EQ(view.status.job_id(), job_id);
  EXPECT_EQ(view.validations, 2u);
  ASSERT_EQ(view.status.validations_size(), 1);
  EXPECT_DOUBLE_EQ(view.status.validations(0).val_accuracy(), 0.5);
  EXPECT_EQ(view.status.history_size(), 0);
  EXPECT_DOUBLE_EQ(view.status.train_loss(), 0.5);
  EXPECT_EQ(view.status.samples_per_epoch(), 20u);
  ASSERT_EQ(view.status.groups_size(), 1);
  EXPECT_DOUBLE_EQ(view.status.groups(0).telemetry().compute_seconds(), 12.5);
  EXPECT_EQ(view.status.groups(0).telemetry().resident_bytes(), 1u << 20);
  // List() stays as it was: no validations.
  EXPECT_EQ(registry_->List()[0].validations_size(), 0);
}

}  // namespace
}  // namespace mpilearn::server

namespace mpilearn::server {
namespace {

TEST_F(JobRegistryTest, ErrorsCarryReasons) {
  v1::RegisterGroupRequest request;
  request.set_ranks(1);
  EXPECT_EQ(ReasonOf(registry_->RegisterGroup(request).status()),
            v1::ERROR_REASON_NO_QUEUED_JOB);
  request.set_job_id("job-999999");
  EXPECT_EQ(ReasonOf(registry_->RegisterGroup(request).status()),
            v1::ERROR_REASON_JOB_UNKNOWN);
  const absl::Status unknown = registry_->Status("nope").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(unknown), v1::ERROR_REASON_JOB_UNKNOWN);
  EXPECT_EQ(ReasonOf(registry_->FindJob("nope").status()),
            v1::ERROR_REASON_JOB_UNKNOWN);
  request.set_ranks(0);
  EXPECT_EQ(ReasonOf(registry_->RegisterGroup(request).status()),
            v1::ERROR_REASON_INVALID_REQUEST);

  // A job's own refusals pass through the registry with their reasons.
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  const v1::RegisterGroupResponse group = Register(job_id);
  InitWeights(job_id, group.group_id());
  v1::NextDataUnitRequest next;
  next.set_job_id(job_id);
  next.set_group_id("g-404");
  next.set_train_samples(8);
  const absl::Status group_unknown = registry_->NextDataUnit(next).status();
  EXPECT_EQ(group_unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(group_unknown), v1::ERROR_REASON_GROUP_UNKNOWN);
}

}  // namespace
}  // namespace mpilearn::server

namespace mpilearn::server {
namespace {

// With the fixture's 10 s group timeout: a group promising a 1 s heartbeat
// is lost after 3 s without contact, and the job's message names that
// limit; a group promising none is lost only after the 10 s.
TEST_F(JobRegistryTest, HeartbeatGroupIsLostAfterThreeMissedHeartbeats) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(2);
  request.set_host("test");
  request.set_heartbeat_seconds(1.0);
  const v1::RegisterGroupResponse beating =
      registry_->RegisterGroup(request).value();
  request.set_heartbeat_seconds(0);
  const v1::RegisterGroupResponse silent =
      registry_->RegisterGroup(request).value();

  v1::JobStatus status = registry_->Status(job_id).value();
  ASSERT_EQ(status.groups_size(), 2);
  EXPECT_DOUBLE_EQ(status.groups(0).heartbeat_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(status.groups(0).lost_after_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(status.groups(1).heartbeat_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(status.groups(1).lost_after_seconds(), 10.0);

  // A heartbeat is contact: 2.5 s later the clock starts again.
  now_ += absl::Seconds(2.5);
  ASSERT_TRUE(registry_->Heartbeat(job_id, beating.group_id()).ok());
  now_ += absl::Seconds(3);
  EXPECT_EQ(registry_->ReapLostGroups(), 0);
  now_ += absl::Seconds(0.5);  // 3.5 s after the heartbeat
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  status = registry_->Status(job_id).value();
  EXPECT_FALSE(status.groups(0).alive());
  EXPECT_TRUE(status.groups(1).alive());
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);  // the other serves it
  EXPECT_EQ(status.message(),
            "group " + beating.group_id() +
                " lost after 3 missed heartbeats (3s without contact)");
  // The lost group's heartbeat is refused: it must register again.
  EXPECT_EQ(ReasonOf(registry_->Heartbeat(job_id, beating.group_id()).status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);

  now_ += absl::Seconds(4.5);  // 10.5 s after registering
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.message(),
            "group " + silent.group_id() + " lost after 10s without contact");
}

// A heartbeat the master cannot honour is refused before anything changes:
// the job stays QUEUED with no group and no group id is used up.
TEST_F(JobRegistryTest, BadHeartbeatIsRefusedAndChangesNothing) {
  const std::string job_id = registry_->Submit(Normalized(SgdSpec())).value();
  v1::RegisterGroupRequest request;
  request.set_ranks(1);
  request.set_host("test");
  // 10 s timeout: at most 3.33 s; at least 0.1 s; finite.
  for (const double bad : {3.5, 0.01, -2.0, std::nan(""), HUGE_VAL}) {
    for (const std::string& named : {std::string(), job_id}) {
      request.set_job_id(named);
      request.set_heartbeat_seconds(bad);
      const absl::Status refused = registry_->RegisterGroup(request).status();
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_INVALID_REQUEST) << bad;
      EXPECT_NE(refused.message().find("--heartbeat_s"), std::string::npos)
          << refused.message();
    }
  }
  const v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.groups_size(), 0);
  // The first group accepted gets the first id.
  request.set_job_id("");
  request.set_heartbeat_seconds(10.0 / 3);
  const v1::RegisterGroupResponse group = registry_->RegisterGroup(request).value();
  EXPECT_EQ(group.job_id(), job_id);
  EXPECT_EQ(group.group_id(), "g-1");
}

}  // namespace
}  // namespace mpilearn::server

// ---------------------------------------------------------------------------
// Durable completion: records that cannot be written are retried until they
// are, status says so meanwhile, and an ended job never comes back QUEUED.
// The faults are real: a path the store writes is replaced by a file or a
// directory of the same name (chmod does not stop root).

namespace mpilearn::server {
namespace {

class DurableCompletionTest : public JobRegistryTest {
 protected:
  std::string JobDir(const std::string& job_id) const {
    return state_dir_ + "/jobs/" + job_id;
  }

  // Replaces `path` (a directory) by a regular file until Restore.
  void BreakDirectory(const std::string& path) {
    std::filesystem::rename(path, path + ".away");
    WriteFile(path, "not a directory\n");
  }
  void RestoreDirectory(const std::string& path) {
    std::filesystem::remove(path);
    std::filesystem::rename(path + ".away", path);
  }

  // A 1-epoch job trained to its last unit by one group: the next Leave
  // completes it. Returns the group id.
  std::string TrainToTheEnd(const std::string& job_id) {
    const std::string group = Register(job_id).group_id();
    InitWeights(job_id, group);
    Push(job_id, group, 1.0f);
    Push(job_id, group, 0.5f);
    auto unit = NextUnit(job_id, group, 50, {}).value();
    EXPECT_TRUE(NextUnit(job_id, group, 50, {unit.unit()}).value().finish());
    return group;
  }

  absl::StatusOr<v1::JobState> Complete(const std::string& job_id,
                                        const std::string& group) {
    v1::LeaveRequest leave;
    leave.set_job_id(job_id);
    leave.set_group_id(group);
    leave.set_completed(true);
    leave.set_test_accuracy(0.8);
    leave.set_test_loss(0.4);
    return registry_->Leave(leave);
  }

  void Validate(const std::string& job_id, uint64_t version, double loss) {
    v1::ValidationRecord record;
    record.set_version(version);
    record.set_val_loss(loss);
    record.set_source("pool v-1");
    ASSERT_TRUE(registry_->ReportValidation(job_id, record).ok());
  }
};

TEST_F(DurableCompletionTest, UnwrittenRecordsAreRetriedUntilWritten) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  Validate(job_id, 2, 0.5);

  // The job's directory becomes a file: nothing of the job can be written.
  BreakDirectory(JobDir(job_id));
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  Validate(job_id, 2, 0.6);  // appended to nothing: records.jsonl pending
  v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_NE(status.storage_error().find(
                "final checkpoint, history.json and records.jsonl not "
                "written since 1970-01-01 00:16:40 UTC: "),
            std::string::npos)
      << status.storage_error();
  EXPECT_TRUE(absl::EndsWith(status.storage_error(), "; retrying"));
  EXPECT_EQ(registry_->List()[0].storage_error(), status.storage_error());
  bool more = false;
  EXPECT_EQ(registry_->ListPage(0, {}, 10, &more)[0].status.storage_error(),
            status.storage_error());
  // The final checkpoint needs the tensors: kept.
  EXPECT_TRUE(registry_->FindJob(job_id).value()->Weights().ok());

  // Still broken: the retries fail, the message stays (same cause, same
  // start), the tensors stay.
  for (int i = 0; i < 3; ++i) {
    now_ += absl::Seconds(40);
    registry_->Tick();
  }
  EXPECT_EQ(registry_->Status(job_id)->storage_error(), status.storage_error());
  EXPECT_TRUE(registry_->FindJob(job_id).value()->Weights().ok());

  // Writable again: the next due retry writes everything and releases the
  // tensors as a normal end would.
  RestoreDirectory(JobDir(job_id));
  now_ += absl::Seconds(40);
  registry_->Tick();
  status = registry_->Status(job_id).value();
  EXPECT_EQ(status.storage_error(), "");
  EXPECT_EQ(status.checkpoint_version(), 2u);
  EXPECT_EQ(ReasonOf(registry_->FindJob(job_id).value()->Weights().status()),
            v1::ERROR_REASON_JOB_ENDED);
  EXPECT_TRUE(std::filesystem::exists(JobDir(job_id) + "/weights.pb"));
  EXPECT_TRUE(std::filesystem::exists(JobDir(job_id) + "/optimizer.pb"));
  EXPECT_NE(ReadFile(JobDir(job_id) + "/history.json")
                .find("JOB_STATE_COMPLETED"),
            std::string::npos);

  // A restart finds everything: completion, test result, final version,
  // both validations (the one reported during the fault too).
  registry_ = MakeRegistry();
  const v1::JobStatus resumed = registry_->Status(job_id).value();
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(resumed.test_accuracy(), 0.8);
  EXPECT_EQ(resumed.version(), 2u);
  EXPECT_EQ(resumed.history_size(), 1);
  ASSERT_EQ(resumed.validations_size(), 2);
  EXPECT_DOUBLE_EQ(resumed.validations(1).val_loss(), 0.6);
  EXPECT_EQ(resumed.storage_error(), "");
  EXPECT_EQ(registry_->EndedWeights(*registry_->FindJob(job_id).value())
                .value()
                ->header.version(),
            2u);
}

// weights.pb and optimizer.pb are retried from the final checkpoint, also
// once the job's own tensors are gone.
TEST_F(DurableCompletionTest, FinalWeightsAreRetriedAfterRelease) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  // weights.pb is a directory: the rename over it fails.
  std::filesystem::create_directories(JobDir(job_id) + "/weights.pb");
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_NE(registry_->Status(job_id)->storage_error().find(
                "final weights.pb and optimizer.pb not written"),
            std::string::npos)
      << registry_->Status(job_id)->storage_error();
  // The final checkpoint is on disk: the job's tensors went.
  EXPECT_FALSE(registry_->FindJob(job_id).value()->Weights().ok());
  std::filesystem::remove(JobDir(job_id) + "/weights.pb");
  now_ += absl::Seconds(2);
  registry_->Tick();
  EXPECT_EQ(registry_->Status(job_id)->storage_error(), "");
  v1::TensorSet weights;
  ASSERT_TRUE(weights.ParseFromString(ReadFile(JobDir(job_id) + "/weights.pb")));
  EXPECT_EQ(weights.header().version(), 2u);
}

// history.json written before the end (the write at the end failed, then
// the master died) while the final checkpoint says COMPLETED: the
// checkpoint's word wins, and history.json is brought up to date.
TEST_F(DurableCompletionTest, StaleHistoryAndCompletedCheckpointStayCompleted) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  const std::string history = JobDir(job_id) + "/history.json";
  const std::string stale = ReadFile(history);
  ASSERT_NE(stale.find("JOB_STATE_RUNNING"), std::string::npos);
  // history.json is a directory: the atomic rename over it fails.
  std::filesystem::remove(history);
  std::filesystem::create_directories(history);
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_NE(registry_->Status(job_id)->storage_error().find(
                "history.json not written"),
            std::string::npos);
  // The master dies with the stale history.json on disk.
  std::filesystem::remove(history);
  WriteFile(history, stale);
  registry_ = MakeRegistry();
  const v1::JobStatus resumed = registry_->Status(job_id).value();
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(resumed.test_accuracy(), 0.8);
  EXPECT_EQ(resumed.version(), 2u);
  EXPECT_EQ(resumed.storage_error(), "");
  EXPECT_NE(ReadFile(history).find("JOB_STATE_COMPLETED"), std::string::npos);
  // Its tensors are not kept (the checkpoint holds them).
  EXPECT_FALSE(registry_->FindJob(job_id).value()->Weights().ok());
}

// The reverse: history.json says COMPLETED but the final checkpoint was
// never written (its directory was a file) and the master died; the newest
// checkpoint on disk is from before the end. The job stays COMPLETED.
TEST_F(DurableCompletionTest, CompletedHistoryAndOlderCheckpointStayCompleted) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  spec.mutable_checkpoint()->set_every_updates(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  ASSERT_EQ(CheckpointFiles(job_id).back(), "ckpt-000000000002.pb");
  BreakDirectory(CheckpointDir(job_id));
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  EXPECT_NE(registry_->Status(job_id)->storage_error().find(
                "final checkpoint not written"),
            std::string::npos)
      << registry_->Status(job_id)->storage_error();
  RestoreDirectory(CheckpointDir(job_id));  // the old, RUNNING checkpoint
  registry_ = MakeRegistry();
  const v1::JobStatus resumed = registry_->Status(job_id).value();
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(resumed.test_accuracy(), 0.8);
  EXPECT_EQ(resumed.version(), 2u);
}

// A state directory of a master before records.jsonl (history.json with
// both lists, no records.jsonl) loads with its lists, is rewritten in the
// new form at once, and loads the same again (no record counted twice).
TEST_F(DurableCompletionTest, LegacyHistoryIsMigrated) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  for (int i = 0; i < 3; ++i) Validate(job_id, 2, 1.0 + i);
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  const v1::JobStatus full = registry_->Status(job_id).value();
  ASSERT_EQ(full.validations_size(), 3);
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(full, &json, options).ok());
  WriteFile(JobDir(job_id) + "/history.json", json);
  std::filesystem::remove(JobDir(job_id) + "/records.jsonl");
  for (int restart = 0; restart < 2; ++restart) {
    registry_ = MakeRegistry();
    const v1::JobStatus loaded = registry_->Status(job_id).value();
    EXPECT_EQ(loaded.state(), v1::JOB_STATE_COMPLETED);
    ASSERT_EQ(loaded.validations_size(), 3) << restart;
    ASSERT_EQ(loaded.history_size(), 1) << restart;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(loaded.validations(i).SerializeAsString(),
                full.validations(i).SerializeAsString());
    }
    EXPECT_EQ(ReadFile(JobDir(job_id) + "/records.jsonl").substr(0, 15),
              "{\"reset\":true}\n");
    EXPECT_NE(ReadFile(JobDir(job_id) + "/history.json")
                  .find("\"validations\": []"),
              std::string::npos);
  }
}

// A clean shutdown (CheckpointAll) tries pending writes at once, without
// waiting for the backoff.
TEST_F(DurableCompletionTest, ShutdownTriesPendingWritesOnceMore) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  BreakDirectory(JobDir(job_id));
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  registry_->CheckpointAll();  // still broken: logged as lost
  EXPECT_NE(registry_->Status(job_id)->storage_error(), "");
  RestoreDirectory(JobDir(job_id));
  registry_->Tick();  // the clock has not moved: no retry due yet
  EXPECT_NE(registry_->Status(job_id)->storage_error(), "");
  registry_->CheckpointAll();
  EXPECT_EQ(registry_->Status(job_id)->storage_error(), "");
  registry_ = MakeRegistry();
  EXPECT_EQ(registry_->Status(job_id)->state(), v1::JOB_STATE_COMPLETED);
  EXPECT_DOUBLE_EQ(registry_->Status(job_id)->test_accuracy(), 0.8);
}

// Validations reported at once from several threads (pools) are appended
// in the order the job recorded them: a restart reads back the same list,
// in the same order.
TEST_F(DurableCompletionTest, ConcurrentValidationsKeepTheJobsOrder) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  std::vector<std::thread> pools;
  for (int t = 0; t < 4; ++t) {
    pools.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        v1::ValidationRecord record;
        record.set_samples(1000 * t + i);  // tells the records apart
        record.set_val_loss(1.0 + t + i);
        record.set_source(absl::StrCat("pool v-", t));
        EXPECT_TRUE(registry_->ReportValidation(job_id, record).ok());
      }
    });
  }
  for (std::thread& pool : pools) pool.join();
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  const v1::JobStatus before = registry_->Status(job_id).value();
  ASSERT_EQ(before.validations_size(), 200);
  registry_ = MakeRegistry();
  const v1::JobStatus after = registry_->Status(job_id).value();
  ASSERT_EQ(after.validations_size(), 200);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(after.validations(i).samples(), before.validations(i).samples())
        << i;
  }
}

// A pool's validations are appended, not rewritten: after many, a restart
// (from the job's checkpoint) and an ended job's reload see every one.
TEST_F(DurableCompletionTest, ValidationsAreAppendedAndReadBack) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group = TrainToTheEnd(job_id);
  for (int i = 0; i < 50; ++i) Validate(job_id, 2, 1.0 + i);
  const std::string history_before = ReadFile(JobDir(job_id) + "/history.json");
  for (int i = 50; i < 100; ++i) Validate(job_id, 2, 1.0 + i);
  // Validations that do not improve leave history.json as it was.
  EXPECT_EQ(ReadFile(JobDir(job_id) + "/history.json"), history_before);
  const std::string records = ReadFile(JobDir(job_id) + "/records.jsonl");
  EXPECT_EQ(std::count(records.begin(), records.end(), '\n'), 101) << records;
  ASSERT_EQ(Complete(job_id, group).value(), v1::JOB_STATE_COMPLETED);
  const v1::JobStatus before = registry_->Status(job_id).value();
  registry_ = MakeRegistry();
  const v1::JobStatus after = registry_->Status(job_id).value();
  ASSERT_EQ(after.validations_size(), 100);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(after.validations(i).SerializeAsString(),
              before.validations(i).SerializeAsString());
  }
  ASSERT_EQ(after.history_size(), 1);
  EXPECT_EQ(after.history(0).SerializeAsString(),
            before.history(0).SerializeAsString());
}

// Warm starts (spec.warm_start): a job starts from another job's weights,
// from its checkpoint file or from a weights file; the first group's layout
// must match, naming the first difference; the optimizer state comes along
// only when asked for, and then the next update is the source's next one.
TEST_F(JobRegistryTest, WarmStartsFromAJobOrAFileWithTheSameLayout) {
  v1::JobSpec adam = SgdSpec();
  adam.mutable_optimizer()->set_name("adam");
  adam.mutable_optimizer()->set_learning_rate(0.1);
  const std::string source = registry_->Submit(Normalized(adam)).value();
  const std::string source_group = Register(source).group_id();
  InitWeights(source, source_group);
  for (float s : {1.0f, -0.5f, 2.0f}) Push(source, source_group, s);
  const std::vector<std::vector<float>> trained =
      registry_->FindJob(source).value()->Weights().value()->values;

  // Starts `spec` warm: the group offers zeros in `layout`; what it gets.
  auto start = [&](v1::JobSpec spec, const v1::TensorSetHeader& layout,
                   std::vector<std::vector<float>> offered)
      -> std::pair<std::string, absl::StatusOr<v1::InitWeightsResponse>> {
    const std::string id = registry_->Submit(Normalized(spec)).value();
    const std::string group = Register(id).group_id();
    return {id, registry_->InitWeights(id, group, layout, std::move(offered))};
  };
  const v1::TensorSetHeader layout = MakeFloat32Header(0, {"w", "b"}, {{3}, {1}});
  v1::JobSpec from_job = adam;
  from_job.mutable_warm_start()->set_job_id(source);
  auto [fresh, answer] = start(from_job, layout, {{0, 0, 0}, {0}});
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->accepted());  // the group pulls the source's weights
  EXPECT_EQ(answer->version(), 0u);
  EXPECT_EQ(registry_->FindJob(fresh).value()->Weights().value()->values, trained);

  // With the optimizer state, the next update is the one the source would
  // make; with a fresh optimizer (Adam's first step) it is not.
  from_job.mutable_warm_start()->set_optimizer_state(true);
  auto [stateful, with_state] = start(from_job, layout, {{0, 0, 0}, {0}});
  ASSERT_TRUE(with_state.ok()) << with_state.status();
  const std::string stateful_group = Register(stateful).group_id();
  const std::string fresh_group = Register(fresh).group_id();
  const auto next = Push(source, source_group, 0.25f);
  EXPECT_EQ(Push(stateful, stateful_group, 0.25f), next);
  EXPECT_NE(Push(fresh, fresh_group, 0.25f), next);

  // Another model: refused naming the first difference; no weights taken.
  auto [other, refused] =
      start(from_job, MakeFloat32Header(0, {"w", "b"}, {{4}, {1}}), {{0, 0, 0, 0}, {0}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      refused.status().message(),
      "tensor 0 is 'w' [3] in job " + source + "'s weights but 'w' [4] in this job's model"))
      << refused.status();
  EXPECT_FALSE(registry_->FindJob(other).value()->Weights().ok());
  auto [fewer, short_model] = start(from_job, MakeFloat32Header(0, {"w"}, {{3}}), {{0, 0, 0}});
  EXPECT_TRUE(absl::StrContains(short_model.status().message(),
                                "holds 2 tensors but this job's model 1"))
      << short_model.status();

  // From the source's checkpoint file, and from a bare weights file.
  registry_->CheckpointAll();
  const std::vector<std::string> files = CheckpointFiles(source);
  ASSERT_FALSE(files.empty());
  v1::JobSpec from_file = adam;
  from_file.mutable_warm_start()->set_checkpoint(CheckpointDir(source) + "/" + files.back());
  auto [from_checkpoint, read] = start(from_file, layout, {{0, 0, 0}, {0}});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(registry_->FindJob(from_checkpoint).value()->Weights().value()->values.size(), 2u);
  const std::string weights_pb = state_dir_ + "/weights_for_warm_start.pb";
  WriteFile(weights_pb, ToTensorSet(layout, {{7, 8, 9}, {-1}}).SerializeAsString());
  from_file.mutable_warm_start()->set_checkpoint(weights_pb);
  auto [from_weights, read_weights] = start(from_file, layout, {{0, 0, 0}, {0}});
  ASSERT_TRUE(read_weights.ok()) << read_weights.status();
  EXPECT_EQ(registry_->FindJob(from_weights).value()->Weights().value()->values,
            (std::vector<std::vector<float>>{{7, 8, 9}, {-1}}));
  // A weights file has no optimizer state to bring.
  from_file.mutable_warm_start()->set_optimizer_state(true);
  EXPECT_FALSE(start(from_file, layout, {{0, 0, 0}, {0}}).second.ok());
  // Neither a checkpoint nor weights, and a missing file.
  WriteFile(weights_pb, "junk");
  from_file.mutable_warm_start()->set_optimizer_state(false);
  EXPECT_EQ(start(from_file, layout, {{0, 0, 0}, {0}}).second.status().code(),
            absl::StatusCode::kDataLoss);
  from_file.mutable_warm_start()->set_checkpoint(state_dir_ + "/missing.pb");
  EXPECT_EQ(start(from_file, layout, {{0, 0, 0}, {0}}).second.status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mpilearn::server
