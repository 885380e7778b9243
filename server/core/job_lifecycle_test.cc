// How jobs end and leave (issue 15, "Jobs end cleanly"), without a network:
// CancelJob and DeleteJob, ended jobs releasing their tensors (and reading
// them back from disk), a restart that loads ended jobs from their record,
// and ListJobs' pages, state filter and reply bound.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/core/job_registry.h"
#include "server/core/master_core.h"

namespace mpilearn::server {
namespace {

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

std::string TestDir() {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

class JobLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = TestDir();
    std::filesystem::remove_all(state_dir_);
    registry_ = MakeRegistry();
  }

  std::unique_ptr<JobRegistry> MakeRegistry() {
    JobRegistry::Options options;
    options.state_dir = state_dir_;
    options.group_timeout = absl::Seconds(10);
    options.clock = [this] { return now_; };
    auto registry = JobRegistry::Create(options);
    EXPECT_TRUE(registry.ok()) << registry.status();
    return std::move(registry).value();
  }

  std::string Submit() { return registry_->Submit(Normalized(SgdSpec())).value(); }

  // Registers a group with the job and installs w = [1, 2, 3], b = [10].
  std::string StartGroup(const std::string& job_id) {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(1);
    request.set_host("test");
    const std::string group_id =
        registry_->RegisterGroup(request).value().group_id();
    auto init = registry_->InitWeights(
        job_id, group_id, MakeFloat32Header(0, {"w", "b"}, {{3}, {1}}),
        {{1, 2, 3}, {10}});
    EXPECT_TRUE(init.ok()) << init.status();
    return group_id;
  }

  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Push(
      const std::string& job_id, const std::string& group_id) {
    auto job = registry_->FindJob(job_id).value();
    GradientUpdate update;
    update.group_id = group_id;
    update.base_version = job->Status(false, absl::Now()).version();
    update.values = {{1, -1, 2}, {1}};
    return registry_->ApplyGradient(*job, update);
  }

  absl::StatusOr<v1::NextDataUnitResponse> NextUnit(
      const std::string& job_id, const std::string& group_id) {
    v1::NextDataUnitRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_train_samples(1000);
    return registry_->NextDataUnit(request);
  }

  std::string JobDir(const std::string& job_id) const {
    return state_dir_ + "/jobs/" + job_id;
  }

  std::string state_dir_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobLifecycleTest, CancelRunningJobEndsItsGroupsAndReleasesMemory) {
  const std::string job_id = Submit();
  const std::string group_id = StartGroup(job_id);
  auto unit = NextUnit(job_id, group_id);
  ASSERT_TRUE(unit.ok()) << unit.status();
  ASSERT_EQ(unit->action(), v1::NextDataUnitResponse::TRAIN);
  ASSERT_TRUE(Push(job_id, group_id).ok());  // w = [0.5, 2.5, 2], b = [9.5]

  ASSERT_TRUE(registry_->Cancel(job_id, "operator's call").ok());
  const v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_NE(status.message().find("operator's call"), std::string::npos)
      << status.message();
  // The record keeps what the tensors said.
  EXPECT_EQ(status.version(), 1u);
  EXPECT_EQ(status.parameters(), 4u);
  EXPECT_EQ(status.checkpoint_version(), 1u);

  // A push still under way is dropped: the reply is the last weights, not
  // an error, so every rank of the group ends its unit and hears DONE
  // (nobody finishes a cancelled job) at the next NextDataUnit.
  const auto pushed = Push(job_id, group_id);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ((*pushed)->header.version(), 1u);
  EXPECT_EQ((*pushed)->values[0], (std::vector<float>{0.5f, 2.5f, 2.0f}));
  EXPECT_EQ(registry_->Status(job_id).value().version(), 1u);
  auto done = NextUnit(job_id, group_id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->action(), v1::NextDataUnitResponse::DONE);
  EXPECT_FALSE(done->finish());

  // Its tensors stay while the group is live, and go when it leaves; they
  // come back from its checkpoint.
  auto job = registry_->FindJob(job_id).value();
  EXPECT_FALSE(job->MemoryReleased());
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group_id);
  ASSERT_TRUE(registry_->Leave(leave).ok());
  EXPECT_TRUE(job->MemoryReleased());
  EXPECT_EQ(ReasonOf(job->Weights().status()), v1::ERROR_REASON_JOB_ENDED);
  EXPECT_FALSE(std::filesystem::is_empty(JobDir(job_id) + "/checkpoints"));
  auto from_disk = registry_->EndedWeights(*job);
  ASSERT_TRUE(from_disk.ok()) << from_disk.status();
  EXPECT_EQ((*from_disk)->header.version(), 1u);
  EXPECT_EQ((*from_disk)->values[0], (std::vector<float>{0.5f, 2.5f, 2.0f}));
  EXPECT_EQ((*from_disk)->values[1], (std::vector<float>{9.5f}));

  // Ended is ended.
  const absl::Status again = registry_->Cancel(job_id, "");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(again), v1::ERROR_REASON_JOB_ENDED);
}

// A group that dies under an ended job (it never leaves) does not keep the
// job's tensors: once it is declared lost they go, as when it leaves.
TEST_F(JobLifecycleTest, LostGroupOfAnEndedJobReleasesItsTensors) {
  const std::string job_id = Submit();
  const std::string group_id = StartGroup(job_id);
  ASSERT_TRUE(Push(job_id, group_id).ok());
  ASSERT_TRUE(registry_->Cancel(job_id, "").ok());
  auto job = registry_->FindJob(job_id).value();
  EXPECT_FALSE(job->MemoryReleased());  // the group is live
  now_ += absl::Seconds(5);
  EXPECT_EQ(registry_->ReapLostGroups(), 0);
  EXPECT_FALSE(job->MemoryReleased());
  now_ += absl::Seconds(6);  // 11 s without contact, over the 10 s limit
  EXPECT_EQ(registry_->ReapLostGroups(), 1);
  EXPECT_TRUE(job->MemoryReleased());
  auto from_disk = registry_->EndedWeights(*job);
  ASSERT_TRUE(from_disk.ok()) << from_disk.status();
  EXPECT_EQ((*from_disk)->header.version(), 1u);
  EXPECT_EQ(registry_->Status(job_id).value().state(),
            v1::JOB_STATE_CANCELLED);
}

TEST_F(JobLifecycleTest, CancelQueuedJobWithoutWeights) {
  const std::string job_id = Submit();
  ASSERT_TRUE(registry_->Cancel(job_id, "").ok());
  const v1::JobStatus status = registry_->Status(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(status.message(), "cancelled");
  // A cancelled job takes no group and no weights.
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  EXPECT_EQ(registry_->RegisterGroup(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobLifecycleTest, CompletedJobReleasesMemory) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(1);
  const std::string job_id = registry_->Submit(Normalized(spec)).value();
  const std::string group_id = StartGroup(job_id);
  ASSERT_TRUE(Push(job_id, group_id).ok());
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group_id);
  leave.set_completed(true);
  ASSERT_EQ(registry_->Leave(leave).value(), v1::JOB_STATE_COMPLETED);
  auto job = registry_->FindJob(job_id).value();
  EXPECT_TRUE(job->MemoryReleased());
  EXPECT_TRUE(std::filesystem::exists(JobDir(job_id) + "/weights.pb"));
  EXPECT_EQ(registry_->Status(job_id).value().version(), 1u);
}

TEST_F(JobLifecycleTest, DeleteRemovesEndedJobsOnly) {
  const std::string job_id = Submit();
  const std::string group_id = StartGroup(job_id);
  ASSERT_TRUE(Push(job_id, group_id).ok());

  const absl::Status running = registry_->Delete(job_id);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(running.message().find("mpilearnctl cancel " + job_id),
            std::string::npos)
      << running;
  EXPECT_TRUE(std::filesystem::exists(JobDir(job_id)));

  ASSERT_TRUE(registry_->Cancel(job_id, "done with it").ok());
  ASSERT_TRUE(registry_->Delete(job_id).ok());
  EXPECT_FALSE(std::filesystem::exists(JobDir(job_id)));
  EXPECT_EQ(registry_->FindJob(job_id).status().code(),
            absl::StatusCode::kNotFound);
  const absl::Status twice = registry_->Delete(job_id);
  EXPECT_EQ(twice.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(twice), v1::ERROR_REASON_JOB_UNKNOWN);
  // An unknown id comes back bounded.
  const absl::Status unknown = registry_->Delete(std::string(1 << 20, 'x'));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(unknown.message().size(), 1024u);
  bool more = true;
  EXPECT_TRUE(registry_->ListPage(0, {}, 100, &more).empty());

  // A restarted master neither loads it nor reuses its id.
  registry_ = MakeRegistry();
  EXPECT_EQ(registry_->FindJob(job_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_NE(Submit(), job_id);
}

TEST_F(JobLifecycleTest, RestartLoadsEndedJobsWithoutTheirTensors) {
  const std::string ended_id = Submit();
  const std::string group_id = StartGroup(ended_id);
  ASSERT_TRUE(Push(ended_id, group_id).ok());
  ASSERT_TRUE(registry_->Cancel(ended_id, "restart test").ok());
  const std::string live_id = Submit();
  const std::string live_group = StartGroup(live_id);
  ASSERT_TRUE(Push(live_id, live_group).ok());
  registry_->CheckpointAll();

  registry_ = MakeRegistry();
  auto ended = registry_->FindJob(ended_id).value();
  EXPECT_TRUE(ended->MemoryReleased());
  const v1::JobStatus status = registry_->Status(ended_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(status.version(), 1u);
  EXPECT_EQ(status.parameters(), 4u);
  EXPECT_NE(status.message().find("restart test"), std::string::npos);
  // Its weights are still there, on disk.
  auto from_disk = registry_->EndedWeights(*ended);
  ASSERT_TRUE(from_disk.ok()) << from_disk.status();
  EXPECT_EQ((*from_disk)->values[1], (std::vector<float>{9.5f}));
  // A job that had not ended resumes with its tensors.
  auto live = registry_->FindJob(live_id).value();
  EXPECT_FALSE(live->MemoryReleased());
  ASSERT_TRUE(live->Weights().ok());
  EXPECT_EQ(live->Weights().value()->header.version(), 1u);
}

// ListJobs through MasterCore: pages, filter, tokens and the reply bound.
class ListJobsTest : public ::testing::Test {
 protected:
  void Start(uint64_t max_list_bytes = uint64_t{3} << 20) {
    MasterCore::Options options;
    options.registry.state_dir = TestDir();
    std::filesystem::remove_all(options.registry.state_dir);
    options.limits.max_list_bytes = max_list_bytes;
    core_ = MasterCore::Create(options).value();
  }
  void TearDown() override {
    if (core_ != nullptr) core_->CloseSnapshots();
  }

  std::string Submit(const std::string& name = "") {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = SgdSpec();
    request.mutable_spec()->set_name(name);
    auto response = core_->SubmitJob(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response->job_id();
  }

  // Follows every page; returns the ids in order and adds up left_out.
  std::vector<std::string> AllPages(v1::ListJobsRequest request,
                                    uint32_t* left_out = nullptr,
                                    int* pages = nullptr) {
    std::vector<std::string> ids;
    for (int page = 0; page < 1000; ++page) {
      auto response = core_->ListJobPage(request);
      EXPECT_TRUE(response.ok()) << response.status();
      if (!response.ok()) break;
      for (const v1::JobStatus& job : response->jobs()) {
        ids.push_back(job.job_id());
      }
      if (left_out != nullptr) *left_out += response->left_out();
      if (pages != nullptr) ++*pages;
      if (response->next_page_token().empty()) break;
      request.set_page_token(response->next_page_token());
    }
    return ids;
  }

  std::unique_ptr<MasterCore> core_;
};

TEST_F(ListJobsTest, PagesCoverEveryJobOnceAndFilterByState) {
  Start();
  std::vector<std::string> all;
  std::vector<std::string> cancelled;
  for (int i = 0; i < 25; ++i) {
    all.push_back(Submit());
    if (i % 3 == 0) {
      v1::CancelJobRequest cancel;
      cancel.set_job_id(all.back());
      cancel.set_reason("filter test");
      auto status = core_->CancelJob(cancel);
      ASSERT_TRUE(status.ok()) << status.status();
      EXPECT_EQ(status->state(), v1::JOB_STATE_CANCELLED);
      cancelled.push_back(all.back());
    }
  }
  v1::ListJobsRequest request;
  request.set_page_size(7);
  int pages = 0;
  EXPECT_EQ(AllPages(request, nullptr, &pages), all);
  EXPECT_EQ(pages, 4);  // 7 + 7 + 7 + 4

  // The default page holds all 25.
  auto first = core_->ListJobPage(v1::ListJobsRequest());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->jobs_size(), 25);
  EXPECT_TRUE(first->next_page_token().empty());

  request.add_states(v1::JOB_STATE_CANCELLED);
  request.set_page_size(2);
  EXPECT_EQ(AllPages(request), cancelled);
  request.clear_states();
  request.add_states(v1::JOB_STATE_QUEUED);
  EXPECT_EQ(AllPages(request).size(), all.size() - cancelled.size());

  // Deleted jobs leave the list; a token still works across a deletion.
  request.Clear();
  request.set_page_size(3);
  auto page = core_->ListJobPage(request).value();
  ASSERT_EQ(page.jobs_size(), 3);
  v1::DeleteJobRequest remove;
  remove.set_job_id(cancelled[1]);  // the 4th job: on the next page
  ASSERT_TRUE(core_->DeleteJob(remove).ok());
  request.set_page_token(page.next_page_token());
  auto next = core_->ListJobPage(request).value();
  ASSERT_EQ(next.jobs_size(), 3);
  EXPECT_EQ(next.jobs(0).job_id(), all[4]);
}

TEST_F(ListJobsTest, MalformedTokensAreInvalidArgument) {
  Start();
  Submit();
  const std::vector<std::string> tokens = {"abc", "-1", "007", " 3", "12x",
                                           std::string(1 << 16, '9')};
  for (const std::string& token : tokens) {
    v1::ListJobsRequest request;
    request.set_page_token(token);
    const auto response = core_->ListJobPage(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument)
        << token.substr(0, 20);
    EXPECT_EQ(ReasonOf(response.status()), v1::ERROR_REASON_INVALID_REQUEST);
    EXPECT_LT(response.status().message().size(), 1024u);
  }
  // A token past the last job is an empty last page.
  v1::ListJobsRequest past;
  past.set_page_token("999999");
  auto response = core_->ListJobPage(past);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->jobs_size(), 0);
  EXPECT_TRUE(response->next_page_token().empty());
}

TEST_F(ListJobsTest, ReplyBoundEndsPagesEarlyInsteadOfDroppingJobs) {
  // Room for about two jobs with 1,200-byte names per reply.
  constexpr uint64_t kBound = 4000;
  Start(kBound);
  std::vector<std::string> listed;
  for (int i = 0; i < 7; ++i) listed.push_back(Submit(std::string(1200, 'a' + i)));
  // Too large to list on its own: left out, still in GetJobStatus.
  const std::string huge = Submit(std::string(4090, 'z'));
  listed.push_back(Submit("small"));

  v1::ListJobsRequest request;
  uint32_t left_out = 0;
  int pages = 0;
  EXPECT_EQ(AllPages(request, &left_out, &pages), listed);
  EXPECT_EQ(left_out, 1u);
  EXPECT_GE(pages, 4);
  request.set_page_size(1000);
  for (auto response = core_->ListJobPage(request); response.ok();) {
    EXPECT_LE(response->ByteSizeLong(), kBound);
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
    response = core_->ListJobPage(request);
  }
  v1::GetJobStatusRequest status;
  status.set_job_id(huge);
  EXPECT_TRUE(core_->GetJobStatus(status).ok());
}

}  // namespace
}  // namespace mpilearn::server
