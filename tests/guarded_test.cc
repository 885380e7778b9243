// Guarded weights and failing groups, against a running master (issue 15):
//   - a push that would make an Adam job's state Inf is refused over gRPC
//     with ERROR_REASON_UPDATE_REJECTED and counted, the weights unchanged;
//   - a worker that cannot allocate its model (a spec that got past the
//     master's size limit) leaves with the error and the job FAILs with it;
//   - a group whose model does not fit the layout another client installed
//     first fails fast, naming both sizes, instead of blocking in a pull.
#include <sys/resource.h>

#include <optional>
#include <string>
#include <vector>

#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

class GuardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewTempDir("guarded");
    // A model limit far above the default, so the huge model reaches the
    // worker (the case of a spec that got past the master).
    auto master = MasterProcess::Start(dir_, {"--max_model_mib=1073741824"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    auto client = MasterClient::Connect(master_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Runs one rank on `job_id` until it exits (at most `timeout`).
  std::pair<std::optional<int>, std::string> RunWorker(
      const std::string& job_id, absl::Duration timeout) {
    auto workers =
        StartWorkers(1, master_->address(), {"--job_id=" + job_id, "--threads=1"},
                     dir_ + "/worker-" + job_id + ".log");
    EXPECT_TRUE(workers.ok()) << workers.status();
    if (!workers.ok()) return {std::nullopt, ""};
    std::optional<int> code = (*workers)->Wait(timeout);
    return {code, (*workers)->Log()};
  }

  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::unique_ptr<MasterClient> client_;
};

TEST_F(GuardedTest, OverflowingPushIsRefusedAndCounted) {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("unused-images.gz");
  spec.mutable_data()->set_train_labels("unused-labels.gz");
  spec.mutable_optimizer()->set_name("adam");
  const std::string job_id = client_->SubmitJob(spec).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  const std::string group_id = client_->RegisterGroup(request).value().group_id();
  const v1::TensorSetHeader layout = MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}});
  std::vector<std::vector<float>> weights = {std::vector<float>(12, 0.5f),
                                             std::vector<float>(3, 0.5f)};
  ASSERT_TRUE(client_->InitWeights(job_id, group_id, layout,
                                   {weights[0], weights[1]})
                  .value());

  v1::PushGradientRequest::Header header;
  header.set_job_id(job_id);
  header.set_group_id(group_id);
  *header.mutable_gradient() = layout;
  header.set_samples(1);
  // One 3e38 gradient: Adam's second moment overflows to Inf.
  const std::vector<std::vector<float>> huge = {std::vector<float>(12, 3e38f),
                                                std::vector<float>(3, 3e38f)};
  std::vector<std::vector<float>> reply = weights;
  const absl::Status refused =
      client_
          ->PushGradient(header, {huge[0], huge[1]},
                         {absl::MakeSpan(reply[0]), absl::MakeSpan(reply[1])})
          .status();
  EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_UPDATE_REJECTED) << refused;
  EXPECT_NE(refused.message().find("clip_grad_norm"), std::string::npos)
      << refused;
  const v1::JobStatus status = client_->GetJobStatus(job_id).value();
  EXPECT_EQ(status.updates_rejected(), 1u);
  EXPECT_EQ(status.version(), 0u);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  std::vector<std::vector<float>> pulled = {std::vector<float>(12),
                                            std::vector<float>(3)};
  ASSERT_TRUE(client_
                  ->PullWeights(job_id, group_id,
                                {absl::MakeSpan(pulled[0]), absl::MakeSpan(pulled[1])})
                  .ok());
  EXPECT_EQ(pulled, weights);
}

// A model within the master's limit (raised here) and the worker's own
// 2^31-parameter bound, 8 GB of weights, on a worker whose address space
// is limited to 6 GB: LibTorch's allocation fails on the worker, which
// leaves with the error; the job FAILs with it instead of staying RUNNING.
TEST_F(GuardedTest, WorkerThatCannotAllocateItsModelFailsTheJob) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  v1::JobSpec spec = FashionMnistSubset("downpour", 3000, 1);
  spec.mutable_model()->add_hidden(45000);
  spec.mutable_model()->add_hidden(45000);
  const absl::StatusOr<std::string> job_id = client_->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  // The limit is inherited by mpirun and the rank, then lifted here again.
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = rlim_t{6} << 30;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limited), 0);
  auto workers =
      StartWorkers(1, master_->address(), {"--job_id=" + *job_id, "--threads=1"},
                   dir_ + "/worker-alloc.log");
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  ASSERT_TRUE(workers.ok()) << workers.status();
  const std::optional<int> code = (*workers)->Wait(absl::Seconds(120));
  const std::string log = (*workers)->Log();
  ASSERT_TRUE(code.has_value()) << "the worker did not exit:\n" << log;
  EXPECT_NE(*code, 0) << log;
  EXPECT_EQ(log.find("terminate called"), std::string::npos) << log;
  const v1::JobStatus status = client_->GetJobStatus(*job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED) << status.message();
  EXPECT_NE(status.message().find("build the"), std::string::npos)
      << status.message();
}

// Another client registers first and installs a bogus layout (15 values);
// the real group fails at once, naming both sizes, instead of blocking in
// its pull until the 120 s deadline.
TEST_F(GuardedTest, GroupThatCannotUseTheInstalledLayoutFailsFast) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const v1::JobSpec spec = FashionMnistSubset("downpour", 3000, 1);
  const std::string job_id = client_->SubmitJob(spec).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id);
  request.set_ranks(1);
  const std::string bogus = client_->RegisterGroup(request).value().group_id();
  const std::vector<std::vector<float>> values = {std::vector<float>(12, 0.5f),
                                                  std::vector<float>(3, 0.5f)};
  ASSERT_TRUE(client_
                  ->InitWeights(job_id, bogus,
                                MakeFloat32Header(0, {"w", "b"}, {{4, 3}, {3}}),
                                {values[0], values[1]})
                  .value());

  const auto [code, log] = RunWorker(job_id, absl::Seconds(100));
  ASSERT_TRUE(code.has_value()) << "the worker did not exit:\n" << log;
  EXPECT_NE(*code, 0) << log;
  const v1::JobStatus status = client_->GetJobStatus(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED) << status.message();
  EXPECT_NE(status.message().find("another layout: they hold 15 values"),
            std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace mpilearn::testing
