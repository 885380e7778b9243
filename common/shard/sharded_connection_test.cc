// What the sharded connection adds over its shards: slice layouts, each
// shard's own base version, errors named by shard with their reason kept,
// and agreement on initial weights. The rules applied slice by slice are
// checked against the whole-model reference in worker/exchange_test.
#include "common/shard/sharded_connection.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_reason.h"
#include "gtest/gtest.h"

namespace mpilearn::shard {
namespace {

// A shard that answers pushes and pulls with a version it is told, fills
// replies with its index, and records the headers it was sent.
class ScriptedShard final : public MasterConnection {
 public:
  explicit ScriptedShard(float fill) : fill_(fill) {}

  void Answer(uint64_t version, absl::Status status = absl::OkStatus(), bool take = true) {
    absl::MutexLock lock(&mu_);
    version_ = version;
    status_ = std::move(status);
    take_ = take;
  }
  std::vector<v1::PushGradientRequest::Header> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  v1::TensorSetHeader init_header() const {
    absl::MutexLock lock(&mu_);
    return init_header_;
  }

  absl::StatusOr<bool> InitWeights(const std::string&, const std::string&,
                                   const v1::TensorSetHeader& header,
                                   absl::Span<const absl::Span<const float>>) override {
    absl::MutexLock lock(&mu_);
    init_header_ = header;
    if (!status_.ok()) return status_;
    return take_;
  }
  absl::StatusOr<uint64_t> PushGradient(const v1::PushGradientRequest::Header& header,
                                        absl::Span<const absl::Span<const float>>,
                                        absl::Span<const absl::Span<float>> weights) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back(header);
    if (!status_.ok()) return status_;
    for (absl::Span<float> w : weights) std::fill(w.begin(), w.end(), fill_);
    return version_;
  }
  absl::StatusOr<uint64_t> PullWeights(const std::string&, const std::string&,
                                       absl::Span<const absl::Span<float>> weights) override {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    for (absl::Span<float> w : weights) std::fill(w.begin(), w.end(), fill_);
    return version_;
  }
  absl::StatusOr<std::string> SubmitJob(const v1::JobSpec&) override { return "job-lead"; }
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat("register ", request.job_id(), " ", request.group_id(), " ",
                                  request.ranks(), " ", request.host()));
    return v1::RegisterGroupResponse();
  }
  std::vector<std::string> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest&) override {
    return v1::NextDataUnitResponse();
  }
  absl::StatusOr<v1::JobState> ReportEpoch(const v1::ReportEpochRequest&) override {
    return v1::JOB_STATE_RUNNING;
  }
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat("leave ", request.group_id(),
                                  request.completed() ? " completed" : "",
                                  request.has_test_loss() ? " with test loss" : ""));
    return v1::JOB_STATE_COMPLETED;
  }
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string&) override {
    return v1::JobStatus();
  }
  absl::StatusOr<v1::JobState> Heartbeat(const v1::HeartbeatRequest& request,
                                         absl::Duration) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat("heartbeat ", request.group_id()));
    return v1::JOB_STATE_RUNNING;
  }

 private:
  const float fill_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool take_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<v1::PushGradientRequest::Header> pushes_ ABSL_GUARDED_BY(mu_);
  v1::TensorSetHeader init_header_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

v1::TensorSetHeader Layout() {
  v1::TensorSetHeader header;
  v1::TensorInfo* weight = header.add_tensors();
  weight->set_name("fc.weight");
  weight->add_shape(2);
  weight->add_shape(3);
  v1::TensorInfo* mean = header.add_tensors();
  mean->set_name("bn.running_mean");
  mean->add_shape(2);
  mean->set_buffer(true);
  return header;
}

// Two shards over a 6-element weight (split in ranges of 3) and a
// 2-element buffer.
struct Rig {
  Rig()
      : lead(-1), shard0(0), shard1(1),
        connection(lead, {&shard0, &shard1}, *PlaceTensors({6, 2}, 2, 3)) {}
  std::vector<float> weight = std::vector<float>(6, -9), mean = std::vector<float>(2, -9);
  std::vector<absl::Span<float>> Spans() { return {absl::MakeSpan(weight), absl::MakeSpan(mean)}; }
  absl::StatusOr<uint64_t> Push(uint64_t base) {
    v1::PushGradientRequest::Header header;
    *header.mutable_gradient() = Layout();
    header.mutable_gradient()->set_version(base);
    std::vector<float> g(6, 0.5f), b(2, 0.5f);
    const std::vector<absl::Span<const float>> gradient = {g, b};
    const std::vector<absl::Span<float>> reply = Spans();
    return connection.PushGradient(header, gradient, reply);
  }
  ScriptedShard lead, shard0, shard1;
  ShardedConnection connection;
};

TEST(ShardedConnectionTest, SliceHeadersNameTheirRanges) {
  const Placement placement = *PlaceTensors({6, 2}, 2, 3);
  std::vector<std::string> names;
  for (int s = 0; s < 2; ++s) {
    const v1::TensorSetHeader slice = SliceHeader(Layout(), placement, s);
    for (const v1::TensorInfo& info : slice.tensors()) {
      names.push_back(info.name());
      ASSERT_EQ(info.shape_size(), 1);
      EXPECT_EQ(info.buffer(), info.name().rfind("bn.", 0) == 0) << info.name();
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"bn.running_mean[0:2]", "fc.weight[0:3]",
                                             "fc.weight[3:6]"}));
  // Read back as written; anything else is no slice.
  std::string name;
  int64_t begin = 0, end = 0;
  ASSERT_TRUE(ParseSliceName("fc.weight[3:6]", &name, &begin, &end));
  EXPECT_EQ(name, "fc.weight");
  EXPECT_EQ(begin, 3);
  EXPECT_EQ(end, 6);
  for (const char* other : {"fc.weight", "fc.weight[3:3]", "fc.weight[6:3]", "w[-1:2]",
                            "w[1:2", "w[a:2]", "w]1:2["}) {
    EXPECT_FALSE(ParseSliceName(other, &name, &begin, &end)) << other;
  }
}

TEST(ShardedConnectionTest, EachShardGetsItsOwnBaseVersion) {
  Rig rig;
  rig.shard0.Answer(3);
  rig.shard1.Answer(5);
  absl::StatusOr<uint64_t> first = rig.Push(0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 8u);  // 3 + 5
  // Every element of the reply came from the shard that holds it.
  const std::optional<Placement> placement = rig.connection.placement();
  ASSERT_TRUE(placement.has_value());
  for (int s = 0; s < 2; ++s) {
    for (const TensorRange& r : placement->shards[s]) {
      const std::vector<float>& t = r.tensor == 0 ? rig.weight : rig.mean;
      for (int64_t i = r.begin; i < r.end; ++i) EXPECT_EQ(t[i], s);
    }
  }
  rig.shard0.Answer(4);
  rig.shard1.Answer(9);
  ASSERT_TRUE(rig.Push(*first).ok());  // computed on version 8: bases 3 and 5
  ASSERT_TRUE(rig.Push(12345).ok());   // unknown: each shard's newest, 4 and 9
  const std::vector<v1::PushGradientRequest::Header> on0 = rig.shard0.pushes();
  const std::vector<v1::PushGradientRequest::Header> on1 = rig.shard1.pushes();
  ASSERT_EQ(on0.size(), 3u);
  ASSERT_EQ(on1.size(), 3u);
  EXPECT_EQ(on0[0].gradient().version(), 0u);
  EXPECT_EQ(on0[1].gradient().version(), 3u);
  EXPECT_EQ(on1[1].gradient().version(), 5u);
  EXPECT_EQ(on0[2].gradient().version(), 4u);
  EXPECT_EQ(on1[2].gradient().version(), 9u);
  // Every slice carries the whole update's norm over its trainable tensors:
  // six 0.5s of fc.weight (the buffer's two do not count).
  for (const auto& pushes : {on0, on1}) {
    for (const v1::PushGradientRequest::Header& push : pushes) {
      EXPECT_DOUBLE_EQ(push.update_norm(), std::sqrt(6 * 0.25));
    }
  }
}

TEST(ShardedConnectionTest, AShardsErrorNamesItAndKeepsItsReason) {
  Rig rig;
  absl::Status stale = absl::AbortedError("stale update");
  stale.SetPayload("type.mpilearn/reason", absl::Cord("stale"));
  rig.shard1.Answer(1, stale);
  const absl::StatusOr<uint64_t> pushed = rig.Push(0);
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(pushed.status().message(), "shard 1: stale update");
  EXPECT_EQ(pushed.status().GetPayload("type.mpilearn/reason"), absl::Cord("stale"));
}

TEST(ShardedConnectionTest, InitialWeightsMustBeTakenByAllShardsOrNone) {
  Rig rig;
  const std::vector<absl::Span<float>> spans = rig.Spans();
  const std::vector<absl::Span<const float>> values(spans.begin(), spans.end());
  absl::StatusOr<bool> taken = rig.connection.InitWeights("job", "g", Layout(), values);
  ASSERT_TRUE(taken.ok());
  EXPECT_TRUE(*taken);
  EXPECT_EQ(rig.shard0.init_header().tensors(0).name(), "fc.weight[0:3]");
  rig.shard0.Answer(0, absl::OkStatus(), /*take=*/false);
  rig.shard1.Answer(0, absl::OkStatus(), /*take=*/false);
  taken = rig.connection.InitWeights("job", "g", Layout(), values);
  ASSERT_TRUE(taken.ok());
  EXPECT_FALSE(*taken);
  rig.shard1.Answer(0, absl::OkStatus(), /*take=*/true);
  taken = rig.connection.InitWeights("job", "g", Layout(), values);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShardedConnectionTest, OtherCallsGoToTheLead) {
  Rig rig;
  EXPECT_EQ(*rig.connection.SubmitJob(v1::JobSpec()), "job-lead");
  EXPECT_EQ(*rig.connection.Leave(v1::LeaveRequest()), v1::JOB_STATE_COMPLETED);
  // A layout the placement was not made for is refused before any call.
  std::vector<float> short_weight(5);
  const std::vector<absl::Span<float>> wrong = {absl::MakeSpan(short_weight)};
  EXPECT_EQ(rig.connection.PullWeights("job", "g", wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mpilearn::shard

namespace mpilearn::shard {
namespace {

// As the worker builds it: the placement comes from the first tensor set,
// the group registers on every shard (once per group id) before its first
// InitWeights, and heartbeats and leaving reach every shard, a shard never
// hearing the job completed.
TEST(ShardedConnectionTest, AGroupRegistersOnEveryShardAndLeavesThemAll) {
  ScriptedShard lead(-1), shard0(0), shard1(1);
  ShardedConnection connection(lead, {&shard0, &shard1}, /*split_elements=*/3,
                               {.ranks = 2, .host = "node7", .heartbeat_seconds = 2});
  EXPECT_FALSE(connection.placement().has_value());
  std::vector<float> weight(6, 1), mean(2, 0);
  const std::vector<absl::Span<const float>> values = {weight, mean};
  for (int twice = 0; twice < 2; ++twice) {
    ASSERT_TRUE(connection.InitWeights("job-1", "g-4", Layout(), values).ok());
  }
  const std::optional<Placement> placement = connection.placement();
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ(placement->total(), 8);
  EXPECT_EQ(placement->shards.size(), 2u);
  v1::HeartbeatRequest beat;
  beat.set_job_id("job-1");
  beat.set_group_id("g-4");
  ASSERT_TRUE(connection.Heartbeat(beat, absl::Seconds(1)).ok());
  v1::LeaveRequest leave;
  leave.set_job_id("job-1");
  leave.set_group_id("g-4");
  leave.set_completed(true);
  leave.set_test_loss(0.5);
  ASSERT_EQ(*connection.Leave(leave), v1::JOB_STATE_COMPLETED);
  for (const ScriptedShard* shard : {&shard0, &shard1}) {
    EXPECT_EQ(shard->calls(), (std::vector<std::string>{"register job-1 g-4 2 node7",
                                                        "heartbeat g-4", "leave g-4"}));
  }
  EXPECT_EQ(lead.calls(), (std::vector<std::string>{"heartbeat g-4",
                                                    "leave g-4 completed with test loss"}));
}

// A shard that restarted no longer knows the group while the lead does:
// the group's next data-unit request leaves the lead and fails as the
// shard's push did, so the group registers again instead of training on
// with one slice frozen.
TEST(ShardedConnectionTest, AGroupAShardForgotLeavesAtItsNextDataUnit) {
  Rig rig;
  v1::NextDataUnitRequest next;
  next.set_job_id("job-1");
  next.set_group_id("g-1");
  ASSERT_TRUE(rig.connection.NextDataUnit(next).ok());
  rig.shard1.Answer(7, WithReason(absl::NotFoundError("group 'g-1' is not registered"),
                                  v1::ERROR_REASON_GROUP_UNKNOWN));
  v1::PushGradientRequest::Header header;
  header.set_job_id("job-1");
  header.set_group_id("g-1");
  *header.mutable_gradient() = Layout();
  std::vector<float> g(6, 0.5f), b(2, 0.5f);
  const std::vector<absl::Span<const float>> gradient = {g, b};
  const absl::Status pushed = rig.connection.PushGradient(header, gradient, rig.Spans()).status();
  EXPECT_EQ(ReasonOf(pushed), v1::ERROR_REASON_GROUP_UNKNOWN) << pushed;
  EXPECT_TRUE(rig.lead.calls().empty());
  const absl::Status asked = rig.connection.NextDataUnit(next).status();
  EXPECT_EQ(ReasonOf(asked), v1::ERROR_REASON_GROUP_UNKNOWN) << asked;
  EXPECT_NE(asked.message().find("shard 1"), std::string::npos) << asked;
  EXPECT_EQ(rig.lead.calls(), std::vector<std::string>{"leave g-1"});
  // Another group (the same group registered again) is not refused.
  next.set_group_id("g-2");
  EXPECT_TRUE(rig.connection.NextDataUnit(next).ok());
}

}  // namespace
}  // namespace mpilearn::shard
