// Bad input against the running master: each case gets a clear gRPC status
// (or, for the worker, a message and a non-zero exit), and the master keeps
// serving its other jobs throughout.
#include <cmath>
#include <limits>
#include <string>

#include "common/job_spec.h"
#include "common/master_client.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

using ::grpc::ClientContext;

// A tiny two-tensor model the tests push gradients for: w [4, 3], b [3].
const std::vector<std::string> kNames = {"w", "b"};
const std::vector<std::vector<int64_t>> kShapes = {{4, 3}, {3}};

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(NewTempDir("bad_input"));
    auto master = MasterProcess::Start(*dir_);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = master->release();
  }

  static void TearDownTestSuite() {
    delete master_;
    master_ = nullptr;
    delete dir_;
  }

  void SetUp() override {
    ASSERT_NE(master_, nullptr);
    auto client = MasterClient::Connect(master_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(client).value();
  }

  void TearDown() override {
    // Whatever the case sent, the master process is still up and answers.
    EXPECT_FALSE(master_->process().Wait(absl::ZeroDuration()).has_value())
        << master_->process().Log();
    EXPECT_TRUE(client_->ListJobs().ok());
  }

  v1::JobSpec SgdSpec() {
    v1::JobSpec spec;
    spec.mutable_data()->set_train_images("unused-images.gz");
    spec.mutable_data()->set_train_labels("unused-labels.gz");
    spec.mutable_optimizer()->set_name("sgd");
    spec.mutable_optimizer()->set_learning_rate(0.5);
    return spec;
  }

  // A job with weights installed and a registered group, ready for pushes.
  void MakeJobWithWeights() {
    job_id_ = client_->SubmitJob(SgdSpec()).value();
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id_);
    request.set_ranks(1);
    group_id_ = client_->RegisterGroup(request).value().group_id();
    weights_ = {std::vector<float>(12, 1.0f), std::vector<float>(3, 1.0f)};
    ASSERT_TRUE(client_
                    ->InitWeights(job_id_, group_id_, Header(0),
                                  {weights_[0], weights_[1]})
                    .value());
  }

  v1::TensorSetHeader Header(uint64_t version) const {
    return MakeFloat32Header(version, kNames, kShapes);
  }

  absl::StatusOr<uint64_t> Push(const v1::TensorSetHeader& layout,
                                const std::vector<std::vector<float>>& grads) {
    v1::PushGradientRequest::Header header;
    header.set_job_id(job_id_);
    header.set_group_id(group_id_);
    *header.mutable_gradient() = layout;
    header.set_samples(1);
    std::vector<absl::Span<const float>> views(grads.begin(), grads.end());
    return client_->PushGradient(
        header, views, {absl::MakeSpan(weights_[0]), absl::MakeSpan(weights_[1])});
  }

  static void ExpectError(const absl::Status& status, absl::StatusCode code,
                          const std::string& mention) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(status.message().find(mention), std::string::npos)
        << "message '" << status.message() << "' should mention '" << mention
        << "'";
  }

  // Runs a one-rank group on `job_id` to completion; returns exit code + log.
  std::pair<int, std::string> RunWorker(const std::vector<std::string>& flags,
                                        const std::string& name) {
    auto workers = StartWorkers(1, master_->address(), flags,
                                *dir_ + "/" + name + ".log");
    EXPECT_TRUE(workers.ok());
    std::optional<int> code = (*workers)->Wait(absl::Seconds(120));
    return {code.value_or(-1), (*workers)->Log()};
  }

  static std::string* dir_;
  static MasterProcess* master_;
  std::unique_ptr<MasterClient> client_;
  std::string job_id_, group_id_;
  std::vector<std::vector<float>> weights_;
};

std::string* BadInputTest::dir_ = nullptr;
MasterProcess* BadInputTest::master_ = nullptr;

TEST_F(BadInputTest, ValidGradientIsAppliedAsTheReferenceSays) {
  MakeJobWithWeights();
  // SGD with lr 0.5 on weights of 1: 1 - 0.5 * g.
  auto version = Push(Header(0), {std::vector<float>(12, 0.5f),
                                  std::vector<float>(3, -2.0f)});
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  EXPECT_FLOAT_EQ(weights_[0][5], 0.75f);
  EXPECT_FLOAT_EQ(weights_[1][2], 2.0f);
}

TEST_F(BadInputTest, UnknownJobIdIsNotFoundEverywhere) {
  ExpectError(client_->GetJobStatus("job-424242").status(),
              absl::StatusCode::kNotFound, "unknown job 'job-424242'");
  v1::RegisterGroupRequest request;
  request.set_job_id("job-424242");
  request.set_ranks(1);
  ExpectError(client_->RegisterGroup(request).status(),
              absl::StatusCode::kNotFound, "mpilearnctl list");
  std::vector<float> w(12), b(3);
  ExpectError(client_->PullWeights("job-424242", "", {absl::MakeSpan(w), absl::MakeSpan(b)})
                  .status(),
              absl::StatusCode::kNotFound, "unknown job");
  job_id_ = "job-424242";
  weights_ = {w, b};
  ExpectError(Push(Header(0), {w, b}).status(), absl::StatusCode::kNotFound,
              "unknown job");
}

TEST_F(BadInputTest, MalformedAndOutOfRangeSpecsAreRejected) {
  v1::JobSpec spec = SgdSpec();
  spec.set_epochs(0);
  ExpectError(client_->SubmitJob(spec).status(),
              absl::StatusCode::kInvalidArgument, "epochs");
  spec = SgdSpec();
  spec.mutable_model()->set_name("resnet9000");
  ExpectError(client_->SubmitJob(spec).status(),
              absl::StatusCode::kInvalidArgument, "model.name");
  spec = SgdSpec();
  spec.mutable_optimizer()->set_learning_rate(std::nan(""));
  ExpectError(client_->SubmitJob(spec).status(),
              absl::StatusCode::kInvalidArgument, "optimizer.learning_rate");
  spec = SgdSpec();
  spec.mutable_data()->clear_train_labels();
  ExpectError(client_->SubmitJob(spec).status(),
              absl::StatusCode::kInvalidArgument, "data.train_labels");
}

TEST_F(BadInputTest, GradientOfWrongLengthIsRejectedAndWeightsKept) {
  MakeJobWithWeights();
  v1::TensorSetHeader wrong_shape = MakeFloat32Header(0, kNames, {{4, 2}, {3}});
  ExpectError(Push(wrong_shape, {std::vector<float>(8), std::vector<float>(3)})
                  .status(),
              absl::StatusCode::kInvalidArgument, "shape");
  v1::TensorSetHeader one_tensor = MakeFloat32Header(0, {"w"}, {{4, 3}});
  ExpectError(Push(one_tensor, {std::vector<float>(12)}).status(),
              absl::StatusCode::kInvalidArgument, "expected 2 tensors");
  // Header says [4, 3] but fewer bytes arrive.
  ExpectError(Push(Header(0), {std::vector<float>(11), std::vector<float>(3)})
                  .status(),
              absl::StatusCode::kInvalidArgument, "incomplete");
  auto status = client_->GetJobStatus(job_id_).value();
  EXPECT_EQ(status.updates_applied(), 0u);
  EXPECT_EQ(status.version(), 0u);
  // The same job still takes a correct gradient.
  EXPECT_TRUE(Push(Header(0), {std::vector<float>(12), std::vector<float>(3)}).ok());
}

// A header whose tensors name no wire dtype (UNSPECIFIED, or a number the
// protocol does not define) is refused before any tensor byte is read. The
// C++ client always names one, so this goes through the generated stub as
// another client would. fp16 and bf16 are wire dtypes (see
// master_service_test's ReducedPrecisionPushAndReply).
TEST_F(BadInputTest, GradientOfWrongDtypeIsRejected) {
  MakeJobWithWeights();
  for (int dtype : {static_cast<int>(v1::DTYPE_UNSPECIFIED), 77}) {
    SCOPED_TRACE(dtype);
    ClientContext context;
    auto stream = client_->stub().PushGradient(&context);
    v1::PushGradientRequest request;
    v1::PushGradientRequest::Header* header = request.mutable_header();
    header->set_job_id(job_id_);
    header->set_group_id(group_id_);
    *header->mutable_gradient() = Header(0);
    header->mutable_gradient()->mutable_tensors(1)->set_dtype(
        static_cast<v1::DType>(dtype));
    stream->Write(request);
    stream->WritesDone();
    v1::WeightsPart part;
    EXPECT_FALSE(stream->Read(&part));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("tensor 'b': dtype"), std::string::npos)
        << status.error_message();
  }
}

TEST_F(BadInputTest, NonFiniteGradientIsRejectedBeforeTouchingWeights) {
  MakeJobWithWeights();
  std::vector<float> w(12, 0.1f);
  w[7] = std::numeric_limits<float>::quiet_NaN();
  ExpectError(Push(Header(0), {w, std::vector<float>(3)}).status(),
              absl::StatusCode::kInvalidArgument, "NaN");
  std::vector<float> pulled_w(12), pulled_b(3);
  ASSERT_TRUE(client_
                  ->PullWeights(job_id_, group_id_,
                                {absl::MakeSpan(pulled_w), absl::MakeSpan(pulled_b)})
                  .ok());
  EXPECT_EQ(pulled_w, std::vector<float>(12, 1.0f));
}

TEST_F(BadInputTest, StreamWithoutHeaderIsRejected) {
  MakeJobWithWeights();
  ClientContext context;
  auto stream = client_->stub().PushGradient(&context);
  v1::PushGradientRequest chunk_first;
  chunk_first.mutable_chunk()->set_data("abcd");
  stream->Write(chunk_first);
  stream->WritesDone();
  v1::WeightsPart part;
  EXPECT_FALSE(stream->Read(&part));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("header"), std::string::npos);
}

TEST_F(BadInputTest, PushBeforeInitWeightsIsFailedPrecondition) {
  job_id_ = client_->SubmitJob(SgdSpec()).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  group_id_ = client_->RegisterGroup(request).value().group_id();
  weights_ = {std::vector<float>(12), std::vector<float>(3)};
  ExpectError(Push(Header(0), weights_).status(),
              absl::StatusCode::kFailedPrecondition, "InitWeights");
}

TEST_F(BadInputTest, MissingDataFileFailsJobWithMessage) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_data()->set_train_images(*dir_ + "/no-such-images.gz");
  const std::string job_id = client_->SubmitJob(spec).value();
  auto [code, log] = RunWorker({"--job_id=" + job_id}, "missing_data");
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("data.train_images"), std::string::npos) << log;
  EXPECT_NE(log.find("no-such-images.gz"), std::string::npos) << log;
  auto status = client_->GetJobStatus(job_id).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(status.message().find("data.train_images"), std::string::npos)
      << status.message();
}

TEST_F(BadInputTest, CorruptDataFileFailsJobWithMessage) {
  const std::string corrupt = *dir_ + "/corrupt-images.gz";
  WriteFileOrDie(corrupt, "this is not an IDX file at all");
  v1::JobSpec spec = SgdSpec();
  spec.mutable_data()->set_train_images(corrupt);
  const std::string job_id = client_->SubmitJob(spec).value();
  auto [code, log] = RunWorker({"--job_id=" + job_id}, "corrupt_data");
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("data.train_images"), std::string::npos) << log;
  EXPECT_EQ(client_->GetJobStatus(job_id)->state(), v1::JOB_STATE_FAILED);
}

TEST_F(BadInputTest, WorkerRejectsBadSpecFileBeforeSubmitting) {
  const std::string spec_path = *dir_ + "/bad_model.json";
  WriteFileOrDie(spec_path, R"({"model": {"name": "resnet"},
      "data": {"train_images": "a", "train_labels": "b"}})");
  const size_t jobs_before = client_->ListJobs()->size();
  auto [code, log] = RunWorker({"--job=" + spec_path}, "bad_model");
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("model.name: unknown model 'resnet'"), std::string::npos)
      << log;
  EXPECT_EQ(client_->ListJobs()->size(), jobs_before);
}

}  // namespace
}  // namespace mpilearn::testing
