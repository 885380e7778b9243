// End to end, how jobs end and leave (issue 15, "Jobs end cleanly"): a job
// that a real `mpirun` group trains is cancelled mid-run (the group leaves,
// the job is CANCELLED, its weights still come back from disk) and then
// deleted; and 200 jobs with weights, cancelled and deleted, leave the
// master's resident memory where it was (bounds on memory, not timing).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

// VmRSS of `pid` in bytes, from /proc/PID/status; -1 if unreadable.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) {
      return kib * 1024;
    }
  }
  return -1;
}

TEST(LifecycleTest, CancelRunningJobThenDeleteIt) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const std::string dir = NewTempDir("lifecycle_cancel");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  // Long enough that it is still training when cancelled.
  auto job_id =
      (*client)->SubmitJob(FashionMnistSubset("downpour", 12000, 50));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(2, (*master)->address(),
                              {"--job_id=" + *job_id, "--threads=1"},
                              dir + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();
  auto training = WaitForStatus(
      **client, *job_id, absl::Seconds(120),
      [](const v1::JobStatus& s) { return s.updates_applied() >= 20; });
  ASSERT_TRUE(training.ok()) << training.status() << "\n" << (*workers)->Log();
  ASSERT_EQ(training->state(), v1::JOB_STATE_RUNNING);

  // Deleting a running job is refused with the way out.
  const absl::Status running = (*client)->DeleteJob(*job_id);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition) << running;
  EXPECT_NE(running.message().find("mpilearnctl cancel"), std::string::npos)
      << running;

  auto cancelled = (*client)->CancelJob(*job_id, "lifecycle test");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_NE(cancelled->message().find("lifecycle test"), std::string::npos);

  // Its pushes come back with the last weights, its next data-unit request
  // says DONE, and it leaves cleanly.
  const std::optional<int> exit_code = (*workers)->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit_code.has_value())
      << "workers still running 120 s after the cancel:\n" << (*workers)->Log();
  EXPECT_EQ(*exit_code, 0) << (*workers)->Log();

  auto status = (*client)->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_GT(status->version(), 0u);
  EXPECT_EQ(status->checkpoint_version(), status->version());
  // Cancelling again is refused: it has ended.
  EXPECT_EQ((*client)->CancelJob(*job_id, "").status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE((*client)->DeleteJob(*job_id).ok());
  EXPECT_EQ((*client)->GetJobStatus(*job_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs/" + *job_id));
  auto listed = (*client)->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

TEST(LifecycleTest, CancelledAndDeletedJobsGiveTheirMemoryBack) {
  constexpr int kJobs = 200;
  constexpr int kWarmUp = 20;
  // 1 MiB of weights per job: 200 jobs kept would hold 200 MiB.
  constexpr int64_t kParameters = 256 * 1024;
  constexpr int64_t kSlack = int64_t{50} << 20;
  const std::string dir = NewTempDir("lifecycle_memory");
  auto master = MasterProcess::Start(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = MasterClient::Connect((*master)->address());
  ASSERT_TRUE(client.ok()) << client.status();
  const pid_t pid = (*master)->process().pid();

  v1::JobSpec spec;
  spec.mutable_model()->set_torchscript("model.pt");
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("adam");
  const std::vector<float> values(kParameters, 0.25f);
  const absl::Span<const float> tensors[] = {values};
  int64_t baseline = -1;
  for (int i = 0; i < kJobs; ++i) {
    if (i == kWarmUp) baseline = ResidentBytes(pid);
    auto job_id = (*client)->SubmitJob(spec);
    ASSERT_TRUE(job_id.ok()) << job_id.status();
    v1::RegisterGroupRequest request;
    request.set_job_id(*job_id);
    request.set_ranks(1);
    request.set_host("lifecycle-test");
    auto group = (*client)->RegisterGroup(request);
    ASSERT_TRUE(group.ok()) << group.status();
    auto taken = (*client)->InitWeights(
        *job_id, group->group_id(),
        MakeFloat32Header(0, {"w"}, {{kParameters}}), tensors);
    ASSERT_TRUE(taken.ok()) << taken.status();
    ASSERT_TRUE(*taken);
    auto cancelled = (*client)->CancelJob(*job_id, "memory test");
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    if (i == 0) {
      // Its weights are no longer in memory but still come from disk.
      std::vector<float> pulled(kParameters, 0.0f);
      const absl::Span<float> into[] = {absl::MakeSpan(pulled)};
      auto version = (*client)->PullWeights(*job_id, "", into);
      ASSERT_TRUE(version.ok()) << version.status();
      EXPECT_EQ(pulled, values);
    }
    ASSERT_TRUE((*client)->DeleteJob(*job_id).ok());
  }
  const int64_t end = ResidentBytes(pid);
  RecordProperty("rss_after_warm_up_bytes", std::to_string(baseline));
  RecordProperty("rss_at_end_bytes", std::to_string(end));
  ASSERT_GT(baseline, 0);
  EXPECT_LE(end, baseline + kSlack)
      << "master RSS after " << kWarmUp << " jobs: " << baseline
      << " bytes; after " << kJobs << ": " << end;
  auto listed = (*client)->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  std::error_code ec;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir + "/jobs", ec),
                          std::filesystem::directory_iterator()),
            1)  // last_job_number alone
      << ec.message();
}

}  // namespace
}  // namespace mpilearn::testing
