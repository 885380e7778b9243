// MasterCore's ownership rules at the core level (caller_bindings.h's
// CheckManages, CheckTrains, CheckSubmission applied to each call), and the
// queue order in job statuses. The same rules over gRPC with real tokens
// are in tests/auth_test.cc.
#include <cstdlib>
#include <memory>
#include <string>

#include "common/error_reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/master_core.h"

namespace mpilearn::server {
namespace {

using ::testing::HasSubstr;

Caller Token(const std::string& name, Role role, std::vector<std::string> owners = {}) {
  Caller caller;
  caller.name = name;
  caller.role = role;
  caller.owners = std::move(owners);
  return caller;
}

void ExpectDenied(const absl::Status& status, const std::string& rule) {
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
  EXPECT_THAT(std::string(status.message()), HasSubstr(rule));
}

class MasterCoreOwnersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MasterCore::Options options;
    options.registry.state_dir =
        std::string(std::getenv("TEST_TMPDIR")) + "/" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options.registry.resume_jobs = false;
    options.check_callers = true;
    core_ = MasterCore::Create(options).value();
  }
  void TearDown() override { core_->CloseSnapshots(); }

  absl::StatusOr<std::string> Submit(const Caller& caller, const std::string& owner = "",
                                     int priority = 0) {
    v1::SubmitJobRequest submit;
    submit.mutable_spec()->mutable_data()->set_train_images("images.gz");
    submit.mutable_spec()->mutable_data()->set_train_labels("labels.gz");
    submit.mutable_spec()->set_owner(owner);
    submit.mutable_spec()->set_priority(priority);
    absl::StatusOr<v1::SubmitJobResponse> response = core_->SubmitJob(caller, submit);
    if (!response.ok()) return response.status();
    return response->job_id();
  }

  absl::StatusOr<v1::RegisterGroupResponse> Register(const Caller& caller,
                                                     const std::string& job_id = "") {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_ranks(1);
    return core_->RegisterGroup(caller, request);
  }

  v1::JobStatus Status(const std::string& job_id) {
    v1::GetJobStatusRequest request;
    request.set_job_id(job_id);
    return core_->GetJobStatus(request).value();
  }

  const Caller alice_ = Token("alice", Role::kOwner);
  const Caller bob_ = Token("bob", Role::kOwner);
  const Caller ops_ = Token("ops", Role::kAdmin);
  const Caller alices_rack_ = Token("rack", Role::kWorker, {"alice"});
  std::unique_ptr<MasterCore> core_;
};

TEST_F(MasterCoreOwnersTest, AJobBelongsToItsSubmitter) {
  const std::string job = Submit(alice_).value();
  EXPECT_EQ(Status(job).spec().owner(), "alice");
  ExpectDenied(Submit(bob_, "alice").status(), "jobs belong to their submitter");
  ExpectDenied(Submit(bob_, "", /*priority=*/1).status(), "max_priority 0");
  // An admin submits for another owner, at any priority.
  const std::string for_bob = Submit(ops_, "bob", 50).value();
  EXPECT_EQ(Status(for_bob).spec().owner(), "bob");
  EXPECT_EQ(Status(for_bob).spec().priority(), 50);
}

TEST_F(MasterCoreOwnersTest, OnlyTheOwnerOrAnAdminCancelsAndDeletes) {
  const std::string job = Submit(alice_).value();
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  ExpectDenied(core_->CancelJob(bob_, cancel).status(), "owners manage their own");
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(core_->CancelJob(alice_, cancel).value().state(), v1::JOB_STATE_CANCELLED);
  v1::DeleteJobRequest remove;
  remove.set_job_id(job);
  ExpectDenied(core_->DeleteJob(bob_, remove).status(), "owners manage their own");
  EXPECT_TRUE(core_->DeleteJob(ops_, remove).ok());
  // An unknown job is NOT_FOUND, not a permission question.
  EXPECT_EQ(core_->CancelJob(bob_, cancel).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MasterCoreOwnersTest, ScopedTokensTrainAndReadOnlyTheirOwnersJobs) {
  const std::string bobs = Submit(bob_).value();
  const std::string alices = Submit(alice_).value();
  ExpectDenied(Register(alices_rack_, bobs).status(), "tokens train the owners they serve");
  ExpectDenied(Register(alice_, bobs).status(), "tokens train the owners they serve");
  // Without a job id the group passes over Bob's older job.
  EXPECT_EQ(Register(alices_rack_).value().job_id(), alices);
  v1::PullWeightsRequest pull;
  pull.set_job_id(bobs);
  ExpectDenied(core_->PullWeights(alices_rack_, pull).status(), "tokens train the owners");
  v1::SubscribeSnapshotsRequest follow;
  follow.add_job_ids(bobs);
  ExpectDenied(core_->SubscribeSnapshots(alices_rack_, follow, "pool").status(),
               "tokens train the owners");
  v1::SubscribeSnapshotsRequest every;
  ExpectDenied(core_->SubscribeSnapshots(alices_rack_, every, "pool").status(),
               "must name the jobs");
  follow.set_job_ids(0, alices);
  EXPECT_TRUE(core_->SubscribeSnapshots(alices_rack_, follow, "pool").ok());
  // An unscoped worker token trains anyone's.
  EXPECT_EQ(Register(Token("any", Role::kWorker)).value().job_id(), bobs);
}

TEST_F(MasterCoreOwnersTest, StatusesShowTheQueueOrder) {
  const std::string a1 = Submit(alice_).value();
  const std::string a2 = Submit(alice_).value();
  const std::string b1 = Submit(bob_).value();
  EXPECT_EQ(Status(a1).queue_position(), 1);
  EXPECT_EQ(Status(b1).queue_position(), 2);
  EXPECT_EQ(Status(a2).queue_position(), 3);
  ASSERT_TRUE(Register(ops_).ok());  // takes a1
  EXPECT_EQ(Status(a1).queue_position(), 0);  // RUNNING
  const v1::ListJobsResponse listed = core_->ListJobs(v1::ListJobsRequest());
  ASSERT_EQ(listed.jobs_size(), 3);
  EXPECT_EQ(listed.jobs(0).queue_position(), 0);
  EXPECT_EQ(listed.jobs(1).queue_position(), 2);  // a2: Bob's turn first
  EXPECT_EQ(listed.jobs(2).queue_position(), 1);
}

}  // namespace
}  // namespace mpilearn::server
