// MasterCore's limits (MasterLimits) at the core level, without a network:
// each refusal is RESOURCE_EXHAUSTED with ERROR_REASON_LIMIT and names its
// flag, comes before anything is allocated or stored, and leaves the core
// serving. The same attacks against the running master are in
// tests/bad_input_test.cc.
#include "server/core/master_core.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

// The caller of the limits' tests: the core does not tell callers apart.
const Caller kCaller;

v1::JobSpec SgdSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  return spec;
}

void ExpectLimit(const absl::Status& status, const std::string& flag) {
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_LIMIT) << status;
  EXPECT_NE(status.message().find(flag), std::string::npos) << status;
}

class MasterCoreLimitsTest : public ::testing::Test {
 protected:
  void Start(const MasterLimits& limits) {
    MasterCore::Options options;
    options.registry.state_dir =
        std::string(std::getenv("TEST_TMPDIR")) + "/" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options.registry.resume_jobs = false;
    options.limits = limits;
    auto core = MasterCore::Create(options);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(core).value();
  }

  void TearDown() override {
    if (core_ != nullptr) core_->CloseSnapshots();
  }

  // A queued job (of a TorchScript model: no size known at submit) and a
  // group registered with it.
  void JobAndGroup() {
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = SgdSpec();
    submit.mutable_spec()->mutable_model()->set_torchscript("model.pt");
    job_id_ = core_->SubmitJob(submit).value().job_id();
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id_);
    request.set_ranks(1);
    group_id_ = core_->RegisterGroup(kCaller, request).value().group_id();
  }

  v1::InitWeightsRequest::Header InitHeader(
      const std::vector<std::vector<int64_t>>& shapes,
      v1::DType dtype = v1::DTYPE_FLOAT32) const {
    v1::InitWeightsRequest::Header header;
    header.set_job_id(job_id_);
    header.set_group_id(group_id_);
    std::vector<std::string> names;
    for (size_t i = 0; i < shapes.size(); ++i) {
      names.push_back("t" + std::to_string(i));
    }
    *header.mutable_weights() = MakeFloat32Header(0, names, shapes);
    SetWireDType(header.mutable_weights(), dtype);
    return header;
  }

  std::unique_ptr<MasterCore> core_;
  std::string job_id_, group_id_;
};

// The bound is on the fp32 bytes the master decodes into, whatever the wire
// dtype: 300 bf16 values are 600 wire bytes but 1200 as fp32.
TEST_F(MasterCoreLimitsTest, InitWeightsAreBoundedAsFp32) {
  MasterLimits limits;
  limits.max_model_bytes = 1000;
  limits.max_tensors_per_set = 3;
  Start(limits);
  JobAndGroup();
  EXPECT_TRUE(core_->BeginInitWeights(kCaller, InitHeader({{250}})).ok());
  ExpectLimit(core_->BeginInitWeights(kCaller, InitHeader({{251}})).status(),
              "--max_model_mib");
  ExpectLimit(
      core_->BeginInitWeights(kCaller, InitHeader({{300}}, v1::DTYPE_BFLOAT16))
          .status(),
      "--max_model_mib");
  // Sizes whose byte count would wrap around 2^64.
  ExpectLimit(core_
                  ->BeginInitWeights(kCaller, InitHeader({{int64_t{1} << 62},
                                                          {int64_t{1} << 62}}))
                  .status(),
              "--max_model_mib");
  ExpectLimit(core_->BeginInitWeights(kCaller, InitHeader({{1}, {1}, {1}, {1}}))
                  .status(),
              "--max_tensors_per_set");
  // Only a group of the job may offer weights.
  v1::InitWeightsRequest::Header stranger = InitHeader({{1}});
  stranger.set_group_id("g-404");
  EXPECT_EQ(ReasonOf(core_->BeginInitWeights(kCaller, stranger).status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);
}

// The spec is normalized once, at the core's SubmitJob: a bad field is
// refused there, naming it, and no job is queued.
TEST_F(MasterCoreLimitsTest, InvalidSpecIsRejectedWithFieldName) {
  Start(MasterLimits());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  submit.mutable_spec()->set_epochs(-3);
  const absl::Status refused = core_->SubmitJob(submit).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("epochs"), std::string::npos) << refused;
  EXPECT_TRUE(core_->ListJobPage(v1::ListJobsRequest()).value().jobs().empty());
}

// A warm start's source is checked at submit: a job the master holds, a
// file it can open.
TEST_F(MasterCoreLimitsTest, WarmStartSourcesAreCheckedAtSubmit) {
  Start(MasterLimits());
  JobAndGroup();
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->mutable_data()->set_train_images("a");
  submit.mutable_spec()->mutable_data()->set_train_labels("b");
  submit.mutable_spec()->mutable_warm_start()->set_job_id("job-000999");
  absl::Status refused = core_->SubmitJob(submit).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("warm_start.job_id: no job job-000999"), std::string::npos)
      << refused;
  submit.mutable_spec()->mutable_warm_start()->set_job_id(job_id_);
  EXPECT_TRUE(core_->SubmitJob(submit).ok());
  submit.mutable_spec()->mutable_warm_start()->Clear();
  submit.mutable_spec()->mutable_warm_start()->set_checkpoint("/nonexistent/ckpt.pb");
  refused = core_->SubmitJob(submit).status();
  EXPECT_NE(refused.message().find("the master cannot read '/nonexistent/ckpt.pb'"),
            std::string::npos)
      << refused;
}

TEST_F(MasterCoreLimitsTest, SpecModelIsBoundedAtSubmit) {
  MasterLimits limits;
  limits.max_model_bytes = 5 << 20;  // 1.3 M parameters
  Start(limits);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  submit.mutable_spec()->mutable_model()->add_hidden(1024);
  submit.mutable_spec()->mutable_model()->add_hidden(1024);
  EXPECT_TRUE(core_->SubmitJob(submit).ok());  // 1.05 M with 1 input
  submit.mutable_spec()->mutable_model()->add_hidden(1024);
  const absl::Status big = core_->SubmitJob(submit).status();
  ExpectLimit(big, "--max_model_mib");
  EXPECT_NE(big.message().find("2102273 parameters"), std::string::npos) << big;
  // A TorchScript model's size is known only to the workers.
  submit.mutable_spec()->mutable_model()->Clear();
  submit.mutable_spec()->mutable_model()->set_torchscript("model.pt");
  EXPECT_TRUE(core_->SubmitJob(submit).ok());
}

TEST_F(MasterCoreLimitsTest, SubscriptionsAreBoundedAndReleased) {
  MasterLimits limits;
  limits.max_subscriptions = 2;
  Start(limits);
  v1::SubscribeSnapshotsRequest request;
  auto first = core_->SubscribeSnapshots(kCaller, request, "a");
  auto second = core_->SubscribeSnapshots(kCaller, request, "b");
  ASSERT_TRUE(first.ok() && second.ok());
  ExpectLimit(core_->SubscribeSnapshots(kCaller, request, "c").status(),
              "--max_subscriptions");
  first->reset();  // the stream ended
  EXPECT_TRUE(core_->SubscribeSnapshots(kCaller, request, "d").ok());
}

TEST_F(MasterCoreLimitsTest, StoredStringsAreBoundedAndErrorsSanitized) {
  MasterLimits limits;
  limits.max_string_bytes = 100;
  Start(limits);
  JobAndGroup();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  request.set_host(std::string(101, 'h'));
  ExpectLimit(core_->RegisterGroup(kCaller, request).status(),
              "--max_string_bytes");
  v1::ReportValidationRequest report;
  report.set_job_id(job_id_);
  (*report.mutable_record()->mutable_metrics())[std::string(200, 'm')] = 1.0;
  ExpectLimit(core_->ReportValidation(kCaller, report).status(),
              "--max_string_bytes");
  v1::SubscribeSnapshotsRequest subscribe;
  subscribe.set_subscriber("pool\nv-1");
  EXPECT_EQ(core_->SubscribeSnapshots(kCaller, subscribe, "x").status().code(),
            absl::StatusCode::kInvalidArgument);

  v1::LeaveRequest leave;
  leave.set_job_id(job_id_);
  leave.set_group_id(group_id_);
  leave.set_error("line 1\nline 2" + std::string(1000, 'e'));
  ASSERT_TRUE(core_->Leave(kCaller, leave).ok());
  v1::GetJobStatusRequest get;
  get.set_job_id(job_id_);
  const v1::JobStatus status = core_->GetJobStatus(get).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(status.message().find("line 1\\nline 2"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("...[1013 bytes]"), std::string::npos)
      << status.message();
}

// Over the reply bound the listing drops the specs' file lists first, then
// the oldest ended jobs, then the oldest others.
TEST_F(MasterCoreLimitsTest, ListingIsBounded) {
  MasterLimits limits;
  limits.max_list_bytes = 20000;
  Start(limits);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  submit.mutable_spec()->mutable_data()->clear_train_images();
  submit.mutable_spec()->mutable_data()->clear_train_labels();
  for (int f = 0; f < 20; ++f) {
    submit.mutable_spec()->mutable_data()->add_train_files(
        std::string(1000, 'f') + std::to_string(f));
  }
  for (int j = 0; j < 3; ++j) ASSERT_TRUE(core_->SubmitJob(submit).ok());
  v1::ListJobsResponse listed = core_->ListJobs(v1::ListJobsRequest());
  ASSERT_EQ(listed.jobs_size(), 3);
  EXPECT_LE(listed.ByteSizeLong(), 20000u);
  for (const v1::JobStatus& job : listed.jobs()) {
    EXPECT_EQ(job.spec().data().train_files_size(), 0);
  }
  // Within the bound, nothing is left out.
  submit.mutable_spec()->mutable_data()->mutable_train_files()->DeleteSubrange(
      1, 19);
  Start(MasterLimits());
  ASSERT_TRUE(core_->SubmitJob(submit).ok());
  listed = core_->ListJobs(v1::ListJobsRequest());
  EXPECT_EQ(listed.jobs(listed.jobs_size() - 1).spec().data().train_files_size(),
            1);
  // Far over the bound: the oldest are left out, the newest kept.
  limits.max_list_bytes = 1500;
  Start(limits);
  submit.mutable_spec()->set_name("first");
  ASSERT_TRUE(core_->SubmitJob(submit).ok());
  submit.mutable_spec()->set_name("second");
  ASSERT_TRUE(core_->SubmitJob(submit).ok());
  listed = core_->ListJobs(v1::ListJobsRequest());
  ASSERT_GE(listed.jobs_size(), 1);
  EXPECT_LT(listed.jobs_size(), 2 + 3 + 1);
  EXPECT_EQ(listed.jobs(listed.jobs_size() - 1).spec().name(), "second");
  EXPECT_LE(listed.ByteSizeLong(), 1500u);
  // A lookup by name (how MPI Opt finds a trial's job) is not bounded by
  // the reply: it finds jobs the listing left out.
  for (const std::string name : {"first", "second"}) {
    const std::optional<std::string> id = core_->FindJobByName(name);
    ASSERT_TRUE(id.has_value()) << name;
    v1::GetJobStatusRequest request;
    request.set_job_id(*id);
    EXPECT_EQ(core_->GetJobStatus(request)->spec().name(), name);
  }
  EXPECT_FALSE(core_->FindJobByName("third").has_value());
}

// With check_callers, the core binds each group to the caller that
// registered it and decides who may act for it and report validations.
class MasterCoreCallersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MasterCore::Options options;
    options.registry.state_dir =
        std::string(std::getenv("TEST_TMPDIR")) + "/callers-" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options.registry.resume_jobs = false;
    options.check_callers = true;
    core_ = MasterCore::Create(options).value();
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = SgdSpec();
    submit.mutable_spec()->mutable_model()->set_torchscript("model.pt");
    job_id_ = core_->SubmitJob(submit).value().job_id();
  }
  void TearDown() override { core_->CloseSnapshots(); }

  absl::StatusOr<v1::RegisterGroupResponse> Register(const Caller& caller) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id_);
    request.set_ranks(1);
    return core_->RegisterGroup(caller, request);
  }
  absl::Status Heartbeat(const Caller& caller, const std::string& group_id) {
    v1::HeartbeatRequest request;
    request.set_job_id(job_id_);
    request.set_group_id(group_id);
    return core_->Heartbeat(caller, request).status();
  }
  absl::Status Report(const Caller& caller) {
    v1::ReportValidationRequest request;
    request.set_job_id(job_id_);
    request.mutable_record()->set_val_loss(0.5);
    request.mutable_record()->set_source("pool");
    return core_->ReportValidation(caller, request).status();
  }

  const Caller rack1_{"rack1", Role::kWorker};
  const Caller rack2_{"rack2", Role::kWorker};
  const Caller alice_{"alice", Role::kAdmin};
  std::unique_ptr<MasterCore> core_;
  std::string job_id_;
};

TEST_F(MasterCoreCallersTest, GroupsBelongToTheirCaller) {
  const std::string group = Register(rack1_).value().group_id();
  EXPECT_TRUE(Heartbeat(rack1_, group).ok());
  for (const Caller& other : {rack2_, alice_}) {
    const absl::Status refused = Heartbeat(other, group);
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_PERMISSION);
  }
  v1::NextDataUnitRequest next;
  next.set_job_id(job_id_);
  next.set_group_id(group);
  EXPECT_EQ(core_->NextDataUnit(rack2_, next).status().code(),
            absl::StatusCode::kPermissionDenied);
  v1::PullWeightsRequest pull;
  pull.set_job_id(job_id_);
  pull.set_group_id(group);
  EXPECT_EQ(core_->PullWeights(rack2_, pull).status().code(),
            absl::StatusCode::kPermissionDenied);

  v1::LeaveRequest leave;
  leave.set_job_id(job_id_);
  leave.set_group_id(group);
  EXPECT_EQ(core_->Leave(rack2_, leave).status().code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(core_->Leave(rack1_, leave).ok());
  // Left: unbound, so no caller may name it any more.
  EXPECT_EQ(ReasonOf(Heartbeat(rack1_, group)), v1::ERROR_REASON_GROUP_UNKNOWN);
}

TEST_F(MasterCoreCallersTest, ValidationsNeedASubscriptionOrAGroup) {
  EXPECT_EQ(ReasonOf(Report(rack1_)), v1::ERROR_REASON_PERMISSION);
  EXPECT_TRUE(Report(alice_).ok());
  {
    v1::SubscribeSnapshotsRequest subscribe;
    subscribe.add_job_ids(job_id_);
    auto subscription = core_->SubscribeSnapshots(rack1_, subscribe, "pool");
    ASSERT_TRUE(subscription.ok()) << subscription.status();
    EXPECT_TRUE(Report(rack1_).ok());
    EXPECT_EQ(ReasonOf(Report(rack2_)), v1::ERROR_REASON_PERMISSION);
  }
  // The stream ended with its subscription.
  EXPECT_EQ(ReasonOf(Report(rack1_)), v1::ERROR_REASON_PERMISSION);
  // The job's own group reports in-band.
  ASSERT_TRUE(Register(rack2_).ok());
  EXPECT_TRUE(Report(rack2_).ok());
}

TEST(MasterCoreCallersOffTest, WithoutCheckingAnyCallerActsForAnyGroup) {
  MasterCore::Options options;
  options.registry.state_dir =
      std::string(std::getenv("TEST_TMPDIR")) + "/callers-off";
  options.registry.resume_jobs = false;
  std::unique_ptr<MasterCore> core = MasterCore::Create(options).value();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SgdSpec();
  submit.mutable_spec()->mutable_model()->set_torchscript("model.pt");
  const std::string job_id = core->SubmitJob(submit).value().job_id();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  const std::string group =
      core->RegisterGroup(Caller{"rack1", Role::kWorker}, request)
          .value()
          .group_id();
  v1::HeartbeatRequest beat;
  beat.set_job_id(job_id);
  beat.set_group_id(group);
  EXPECT_TRUE(core->Heartbeat(Caller{"rack2", Role::kWorker}, beat).ok());
  v1::ReportValidationRequest report;
  report.set_job_id(job_id);
  report.mutable_record()->set_val_loss(0.5);
  EXPECT_TRUE(
      core->ReportValidation(Caller{"rack2", Role::kWorker}, report).ok());
  core->CloseSnapshots();
}

}  // namespace
}  // namespace mpilearn::server
