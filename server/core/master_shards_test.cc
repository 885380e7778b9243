// A lead core and two shard cores in one process, their syncs carried by
// the test (ShardSync on the lead, ServeSliceOrders on the shard, as the
// shard's agent does over gRPC): a job is placed on the shards when its
// first group registers, the group registers on each shard under the lead's
// id, the lead shows the slices, gathers them into the whole model for a
// pull, and the slices stop when the lead's job ends. The refusals of a
// shard's and a lead's misuse come first.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/master_core.h"

namespace mpilearn::server {
namespace {

const Caller kCaller;

v1::JobSpec SgdSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_model()->set_torchscript("model.pt");
  return spec;
}

std::unique_ptr<MasterCore> NewCore(const std::string& name, const std::string& shard_of,
                                    int min_shards = 0, bool resume = false) {
  MasterCore::Options options;
  options.shard_table.min_shards = min_shards;
  options.registry.state_dir = absl::StrCat(
      std::getenv("TEST_TMPDIR"), "/",
      ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", name);
  options.registry.resume_jobs = resume;
  options.shard_of = shard_of;
  absl::StatusOr<std::unique_ptr<MasterCore>> core = MasterCore::Create(options);
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? *std::move(core) : nullptr;
}

class MasterShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lead_ = NewCore("lead", "");
    for (int s = 0; s < 2; ++s) shards_.push_back(NewCore(absl::StrCat("shard", s), "lead:1"));
  }
  void TearDown() override {
    lead_->CloseSnapshots();
    for (auto& shard : shards_) shard->CloseSnapshots();
  }

  static std::string Address(int s) { return absl::StrCat("shard", s, ":7070"); }

  // One round of shard `s`'s agent: report, then carry out the orders.
  void Sync(int s, absl::Duration wait = absl::ZeroDuration()) {
    v1::ShardSyncRequest request;
    request.set_address(Address(s));
    request.set_wait_seconds(absl::ToDoubleSeconds(wait));
    for (v1::ShardSliceStatus& slice : shards_[s]->SliceReports()) {
      *request.add_slices() = std::move(slice);
    }
    absl::StatusOr<v1::ShardSyncResponse> orders = lead_->ShardSync(request, wait);
    ASSERT_TRUE(orders.ok()) << orders.status();
    ASSERT_TRUE(shards_[s]->ServeSliceOrders(*orders).ok());
    // Slices the lead wants, sent as the agent's ReportSlice does.
    for (const v1::SliceWanted& wanted : orders->send()) {
      MasterCore::SliceForLead slice = shards_[s]->SliceFor(wanted);
      slice.header.set_address(Address(s));
      absl::StatusOr<PendingTensors> pending = lead_->BeginSliceReport(slice.header);
      ASSERT_TRUE(pending.ok()) << pending.status();
      if (slice.weights != nullptr) {
        std::vector<absl::Span<const float>> spans;
        for (const std::vector<float>& v : slice.weights->values) spans.emplace_back(v);
        ASSERT_TRUE(pending->CopyFrom(spans).ok());
      }
      ASSERT_TRUE(lead_->CommitSliceReport(*std::move(pending)).ok());
    }
  }

  // `call` in a thread while the shards' agents sync (long polls, so each
  // round returns as soon as there is an order); its answer.
  template <typename Call>
  auto WhileSyncing(const Call& call) {
    decltype(call()) answer = absl::UnknownError("not called");
    std::atomic<bool> answered{false};
    std::thread caller([&] {
      answer = call();
      answered = true;
    });
    // A bound, not a schedule.
    for (int round = 0; round < 100 && !answered; ++round) {
      for (int s = 0; s < 2; ++s) Sync(s, absl::Milliseconds(200));
    }
    caller.join();
    return answer;
  }

  std::string Submit(v1::JobSpec spec = SgdSpec()) {
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = std::move(spec);
    return lead_->SubmitJob(submit).value().job_id();
  }

  // Shard `s`'s slice header of the model "w" (2 x 3): elements 3s..3s+2.
  static v1::TensorSetHeader SliceHeader(int s, uint64_t version) {
    v1::TensorSetHeader header = MakeFloat32Header(
        version, {absl::StrCat("w[", 3 * s, ":", 3 * s + 3, "]")}, {{3}});
    v1::SliceOf* of = header.mutable_tensors(0)->mutable_slice_of();
    of->set_index(0);
    of->add_shape(2);
    of->add_shape(3);
    return header;
  }

  // The group registers on shard `s` and gives it its slice's initial
  // weights, 3s+1 .. 3s+3.
  void InitSlice(int s, const std::string& job_id, const std::string& group_id) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_ranks(1);
    absl::StatusOr<v1::RegisterGroupResponse> on_shard = shards_[s]->RegisterGroup(kCaller, request);
    ASSERT_TRUE(on_shard.ok()) << on_shard.status();
    EXPECT_EQ(on_shard->group_id(), group_id);
    v1::InitWeightsRequest::Header header;
    header.set_job_id(job_id);
    header.set_group_id(group_id);
    *header.mutable_weights() = SliceHeader(s, 0);
    absl::StatusOr<PendingTensors> pending = shards_[s]->BeginInitWeights(kCaller, header);
    ASSERT_TRUE(pending.ok()) << pending.status();
    const std::vector<float> values = {3.0f * s + 1, 3.0f * s + 2, 3.0f * s + 3};
    const std::vector<absl::Span<const float>> spans = {values};
    ASSERT_TRUE(pending->CopyFrom(spans).ok());
    ASSERT_TRUE(shards_[s]->CommitInitWeights(*std::move(pending)).ok());
  }

  // The group's update number `sequence` to shard `s`'s slice (gradient
  // `sequence` times 0.5, 1, 2), computed on `version`.
  absl::Status Push(int s, const std::string& job_id, const std::string& group_id,
                    uint64_t sequence, uint64_t version) {
    v1::PushGradientRequest::Header header;
    header.set_job_id(job_id);
    header.set_group_id(group_id);
    header.set_sequence(sequence);
    header.set_samples(1);
    *header.mutable_gradient() = SliceHeader(s, version);
    absl::StatusOr<PendingTensors> pending = shards_[s]->BeginPush(kCaller, header);
    if (!pending.ok()) return pending.status();
    const float k = static_cast<float>(sequence);
    const std::vector<float> values = {0.5f * k, 1.0f * k, 2.0f * k};
    const std::vector<absl::Span<const float>> spans = {values};
    if (absl::Status copied = pending->CopyFrom(spans); !copied.ok()) return copied;
    return shards_[s]->CommitPush(*std::move(pending)).status();
  }

  // Shard `s`'s slice weights of the job, as a group would pull them.
  std::vector<float> SliceWeights(int s, const std::string& job_id) {
    v1::PullWeightsRequest pull;
    pull.set_job_id(job_id);
    absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> weights =
        shards_[s]->PullWeights(kCaller, pull);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? (*weights)->values[0] : std::vector<float>{};
  }

  // Registers a group of the job with the lead while the shards sync (the
  // registration waits for the shards' slices: their agents' next syncs
  // bring the orders).
  absl::StatusOr<v1::RegisterGroupResponse> RegisterWhileSyncing(const std::string& job_id) {
    return WhileSyncing([&] {
      v1::RegisterGroupRequest request;
      request.set_job_id(job_id);
      request.set_ranks(1);
      request.set_host("node7");
      return lead_->RegisterGroup(kCaller, request);
    });
  }

  // The same, for a job to be placed on both shards: the group's id.
  std::string RegisterOnShards(const std::string& job_id) {
    absl::StatusOr<v1::RegisterGroupResponse> registered = RegisterWhileSyncing(job_id);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return "";
    EXPECT_EQ(registered->shards().addresses_size(), 2);
    return registered->group_id();
  }

  std::unique_ptr<MasterCore> lead_;
  std::vector<std::unique_ptr<MasterCore>> shards_;
};

TEST_F(MasterShardsTest, AShardTakesGroupsOnlyUnderTheLeadsIds) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  const absl::Status refused = shards_[0]->SubmitJob(submit).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("submit jobs to the lead"), std::string::npos) << refused;

  v1::RegisterGroupRequest request;
  request.set_ranks(1);
  absl::Status status = shards_[0]->RegisterGroup(kCaller, request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("register with the lead"), std::string::npos) << status;
  request.set_job_id("job-000001");
  request.set_group_id("g-1");
  EXPECT_EQ(shards_[0]->RegisterGroup(kCaller, request).status().code(),
            absl::StatusCode::kNotFound);
  // A lead (any master not a shard) names its groups itself.
  const std::string job_id = Submit();
  request.set_job_id(job_id);
  status = lead_->RegisterGroup(kCaller, request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("group_id"), std::string::npos) << status;
  // Slices go to a lead, and only when it asked for them.
  v1::ReportSliceRequest::Header slice;
  slice.set_job_id(job_id);
  slice.set_request(1);
  EXPECT_EQ(shards_[0]->BeginSliceReport(slice).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PendingTensors> unasked = lead_->BeginSliceReport(slice);
  ASSERT_TRUE(unasked.ok()) << unasked.status();
  EXPECT_EQ(lead_->CommitSliceReport(*std::move(unasked)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MasterShardsTest, TheLeadRefusesSlicesInASpecAndBadReports) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  submit.mutable_spec()->mutable_slice()->set_shards(2);
  const absl::Status sliced = lead_->SubmitJob(submit).status();
  EXPECT_EQ(sliced.code(), absl::StatusCode::kInvalidArgument) << sliced;
  EXPECT_NE(sliced.message().find("slice"), std::string::npos) << sliced;
  submit.mutable_spec()->clear_slice();
  submit.mutable_spec()->set_max_shards(65);
  const absl::Status too_many = lead_->SubmitJob(submit).status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_NE(too_many.message().find("max_shards"), std::string::npos) << too_many;

  v1::ShardSyncRequest request;
  EXPECT_EQ(lead_->ShardSync(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);  // no address
  request.set_address("shard:1");
  request.set_wait_seconds(11);
  EXPECT_EQ(lead_->ShardSync(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.set_wait_seconds(0);
  for (int i = 0; i <= 10000; ++i) request.add_slices()->set_job_id("job-000001");
  EXPECT_EQ(lead_->ShardSync(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A shard does not sync with a shard.
  request.clear_slices();
  EXPECT_EQ(shards_[0]->ShardSync(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The lead still serves.
  EXPECT_TRUE(lead_->ShardSync(request, absl::ZeroDuration()).ok());
}

TEST_F(MasterShardsTest, AJobLivesOnItsShardsFromItsFirstGroupToItsEnd) {
  Sync(0);
  Sync(1);
  const std::string job_id = Submit();
  absl::StatusOr<v1::RegisterGroupResponse> registered = RegisterWhileSyncing(job_id);
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_EQ(registered->shards().addresses_size(), 2);
  EXPECT_EQ(registered->shards().addresses(0), Address(0));
  EXPECT_EQ(registered->shards().addresses(1), Address(1));
  EXPECT_FALSE(registered->weights_initialized());

  // Each shard holds its slice of the job, under the lead's job id, and
  // takes the group under the lead's group id; the slice's weights: 3
  // values of the 6 of "w" (shape 2 x 3) on each.
  for (int s = 0; s < 2; ++s) {
    const std::vector<v1::ShardSliceStatus> slices = shards_[s]->SliceReports();
    ASSERT_EQ(slices.size(), 1u);
    EXPECT_EQ(slices[0].job_id(), job_id);
    EXPECT_EQ(slices[0].shard(), s);
    EXPECT_EQ(slices[0].shards(), 2);
    InitSlice(s, job_id, registered->group_id());
  }

  // The lead has none of the weights: a pull gathers the shards' slices
  // and joins them into the whole model.
  v1::PullWeightsRequest pull;
  pull.set_job_id(job_id);
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> pulled =
      WhileSyncing([&] { return lead_->PullWeights(kCaller, pull); });
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ((*pulled)->header.tensors_size(), 1);
  EXPECT_EQ((*pulled)->header.tensors(0).name(), "w");
  ASSERT_EQ((*pulled)->header.tensors(0).shape_size(), 2);
  EXPECT_EQ((*pulled)->header.tensors(0).shape(1), 3);
  EXPECT_EQ((*pulled)->values[0], (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // A validation pool may follow the job (its snapshots are gathered the
  // same way at epoch ends).
  v1::SubscribeSnapshotsRequest subscribe;
  subscribe.add_job_ids(job_id);
  EXPECT_TRUE(lead_->SubscribeSnapshots(kCaller, subscribe, "pool").ok());
  // Its status shows each shard's slice as last reported, and the sums.
  for (int s = 0; s < 2; ++s) Sync(s);
  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job_id);
  absl::StatusOr<v1::JobStatus> status = lead_->GetJobStatus(status_request);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->shards_size(), 2);
  EXPECT_EQ(status->shards(1).address(), Address(1));
  EXPECT_EQ(status->shards(1).parameters(), 3u);
  EXPECT_EQ(status->shards(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status->parameters(), 6u);

  // The lead's job ends: each shard's next sync stops its slice.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  ASSERT_TRUE(lead_->CancelJob(cancel).ok());
  for (int s = 0; s < 2; ++s) {
    Sync(s);
    const std::vector<v1::ShardSliceStatus> slices = shards_[s]->SliceReports();
    ASSERT_EQ(slices.size(), 1u);
    EXPECT_EQ(slices[0].state(), v1::JOB_STATE_COMPLETED);
  }
}

// --min_shards: a group of a job that waits for shards is refused before it
// joins, so its retries leave the job queued with no group.
TEST_F(MasterShardsTest, AJobWaitingForShardsRefusesGroupsBeforeTheyJoin) {
  lead_->CloseSnapshots();
  lead_ = NewCore("lead-min", "", /*min_shards=*/2);
  const std::string job_id = Submit();
  Sync(0);
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  for (int retry = 0; retry < 3; ++retry) {
    const absl::Status waiting = lead_->RegisterGroup(kCaller, request).status();
    EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable) << waiting;
    EXPECT_NE(waiting.message().find("1 of the 2"), std::string::npos) << waiting;
  }
  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job_id);
  absl::StatusOr<v1::JobStatus> status = lead_->GetJobStatus(status_request);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status->groups_size(), 0);
}

TEST_F(MasterShardsTest, WithoutLiveShardsAJobStaysOnTheLead) {
  const std::string job_id = Submit();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  absl::StatusOr<v1::RegisterGroupResponse> registered = lead_->RegisterGroup(kCaller, request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_FALSE(registered->has_shards());
  // A shard that comes later takes only new jobs.
  Sync(0);
  registered = lead_->RegisterGroup(kCaller, request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_FALSE(registered->has_shards());
  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job_id);
  EXPECT_EQ(lead_->GetJobStatus(status_request)->shards_size(), 0);
}

// Shard 0 dies after version 4 and comes back from its checkpoint of it,
// while shard 1 went on to version 6: the lead orders shard 1 back to its
// own checkpoint of version 4 (the newest every shard holds), so the two
// slices are one state of the model again, and the groups register anew.
TEST_F(MasterShardsTest, AShardRestartedFromACheckpointRollsTheOthersBack) {
  Sync(0);
  Sync(1);
  v1::JobSpec spec = SgdSpec();
  spec.mutable_checkpoint()->set_every_updates(2);
  spec.mutable_checkpoint()->set_keep(10);
  const std::string job_id = Submit(spec);
  const std::string group = RegisterOnShards(job_id);
  ASSERT_FALSE(group.empty());
  for (int s = 0; s < 2; ++s) InitSlice(s, job_id, group);
  std::vector<float> at_4;
  for (uint64_t k = 1; k <= 4; ++k) {
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(Push(s, job_id, group, k, k - 1).ok());
    if (k == 4) at_4 = SliceWeights(1, job_id);
  }
  for (uint64_t k = 5; k <= 6; ++k) ASSERT_TRUE(Push(1, job_id, group, k, k - 1).ok());
  for (int s = 0; s < 2; ++s) Sync(s);
  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job_id);
  EXPECT_EQ(lead_->GetJobStatus(status_request)->shard_set_version(), 4u);
  ASSERT_EQ(shards_[1]->SliceReports()[0].checkpoint_versions_size(), 3);
  EXPECT_EQ(shards_[1]->SliceReports()[0].checkpoint_versions(0), 6u);
  EXPECT_NE(SliceWeights(1, job_id), at_4);

  // Shard 0 restarts on its state directory: its slice is back at 4.
  shards_[0]->CloseSnapshots();
  shards_[0].reset();
  shards_[0] = NewCore("shard0", "lead:1", 0, /*resume=*/true);
  ASSERT_NE(shards_[0], nullptr);
  const v1::ShardSliceStatus restarted = shards_[0]->SliceReports().at(0);
  EXPECT_EQ(restarted.version(), 4u);
  EXPECT_EQ(restarted.restored_version(), 4u);
  EXPECT_NE(restarted.restore_token(), 0u);
  const uint64_t shard1_token = shards_[1]->SliceReports()[0].restore_token();
  Sync(0);  // the lead notices the restart
  Sync(1);  // and shard 1 rolls back
  const v1::ShardSliceStatus rolled = shards_[1]->SliceReports().at(0);
  EXPECT_EQ(rolled.version(), 4u);
  EXPECT_EQ(rolled.restored_version(), 4u);
  EXPECT_NE(rolled.restore_token(), shard1_token);
  EXPECT_EQ(SliceWeights(1, job_id), at_4);
  // Its checkpoints past 4 are gone, so a restart never loads them.
  ASSERT_EQ(rolled.checkpoint_versions_size(), 2);
  EXPECT_EQ(rolled.checkpoint_versions(0), 4u);
  // The group's next call on either shard is GROUP_UNKNOWN: it registers
  // again (a new id) and pulls the weights.
  for (int s = 0; s < 2; ++s) {
    const absl::Status refused = Push(s, job_id, group, 7, 4);
    EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_GROUP_UNKNOWN) << s << ": " << refused;
  }
  // Done: more syncs order nothing more, and training goes on from 4.
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < 2; ++s) Sync(s);
  }
  EXPECT_EQ(shards_[1]->SliceReports()[0].restore_token(), rolled.restore_token());
  for (int s = 0; s < 2; ++s) {
    InitSlice(s, job_id, "g-again");
    ASSERT_TRUE(Push(s, job_id, "g-again", 1, 4).ok());
    EXPECT_EQ(shards_[s]->SliceReports()[0].version(), 5u);
  }
}

// The lead's first report of a slice loaded from a checkpoint (the lead
// restarted, or the shard did while the lead was down) starts nothing: only
// a change of token seen by this lead is a restart.
TEST_F(MasterShardsTest, ALeadTakesTheTokensOfItsFirstReportsAsTheyAre) {
  Sync(0);
  Sync(1);
  v1::JobSpec spec = SgdSpec();
  spec.mutable_checkpoint()->set_every_updates(2);
  const std::string job_id = Submit(spec);
  const std::string group = RegisterOnShards(job_id);
  ASSERT_FALSE(group.empty());
  for (int s = 0; s < 2; ++s) InitSlice(s, job_id, group);
  for (uint64_t k = 1; k <= 2; ++k) ASSERT_TRUE(Push(0, job_id, group, k, k - 1).ok());
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(Push(1, job_id, group, k, k - 1).ok());
  shards_[0]->CloseSnapshots();
  shards_[0].reset();
  shards_[0] = NewCore("shard0", "lead:1", 0, /*resume=*/true);
  ASSERT_NE(shards_[0], nullptr);
  // A lead that never saw the slice's earlier token: its own restart.
  lead_->CloseSnapshots();
  lead_.reset();
  lead_ = NewCore("lead", "", 0, /*resume=*/true);
  ASSERT_NE(lead_, nullptr);
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < 2; ++s) Sync(s);
  }
  EXPECT_EQ(shards_[1]->SliceReports()[0].version(), 3u);
  EXPECT_EQ(shards_[1]->SliceReports()[0].restored_version(), 0u);
}

}  // namespace
}  // namespace mpilearn::server
