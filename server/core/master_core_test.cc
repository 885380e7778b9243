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
    group_id_ = core_->RegisterGroup(request).value().group_id();
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
  EXPECT_TRUE(core_->BeginInitWeights(InitHeader({{250}})).ok());
  ExpectLimit(core_->BeginInitWeights(InitHeader({{251}})).status(),
              "--max_model_mib");
  ExpectLimit(
      core_->BeginInitWeights(InitHeader({{300}}, v1::DTYPE_BFLOAT16)).status(),
      "--max_model_mib");
  // Sizes whose byte count would wrap around 2^64.
  ExpectLimit(core_->BeginInitWeights(
                  InitHeader({{int64_t{1} << 62}, {int64_t{1} << 62}}))
                  .status(),
              "--max_model_mib");
  ExpectLimit(core_->BeginInitWeights(InitHeader({{1}, {1}, {1}, {1}})).status(),
              "--max_tensors_per_set");
  // Only a group of the job may offer weights.
  v1::InitWeightsRequest::Header stranger = InitHeader({{1}});
  stranger.set_group_id("g-404");
  EXPECT_EQ(ReasonOf(core_->BeginInitWeights(stranger).status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);
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
  auto first = core_->SubscribeSnapshots(request, "a");
  auto second = core_->SubscribeSnapshots(request, "b");
  ASSERT_TRUE(first.ok() && second.ok());
  ExpectLimit(core_->SubscribeSnapshots(request, "c").status(),
              "--max_subscriptions");
  first->reset();  // the stream ended
  EXPECT_TRUE(core_->SubscribeSnapshots(request, "d").ok());
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
  ExpectLimit(core_->RegisterGroup(request).status(), "--max_string_bytes");
  v1::ReportValidationRequest report;
  report.set_job_id(job_id_);
  (*report.mutable_record()->mutable_metrics())[std::string(200, 'm')] = 1.0;
  ExpectLimit(core_->ReportValidation(report).status(), "--max_string_bytes");
  v1::SubscribeSnapshotsRequest subscribe;
  subscribe.set_subscriber("pool\nv-1");
  EXPECT_EQ(core_->SubscribeSnapshots(subscribe, "x").status().code(),
            absl::StatusCode::kInvalidArgument);

  v1::LeaveRequest leave;
  leave.set_job_id(job_id_);
  leave.set_group_id(group_id_);
  leave.set_error("line 1\nline 2" + std::string(1000, 'e'));
  ASSERT_TRUE(core_->Leave(leave).ok());
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

}  // namespace
}  // namespace mpilearn::server
