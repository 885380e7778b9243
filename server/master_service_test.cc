// The gRPC service over an in-process channel: the real MasterServiceImpl on
// a real grpc::Server, driven by the real MasterClient, with no port. Checks
// that the adapter moves tensors both ways intact, that errors arrive with
// their code and their machine-readable reason, and that the service and
// the core agree (a pull touches the group; a refused push changes nothing).
#include "server/master_service.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "common/tensor_codec.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/core/master_core.h"

namespace mpilearn::server {
namespace {

v1::JobSpec SgdSpec() {
  v1::JobSpec spec;
  spec.mutable_data()->set_train_images("images.gz");
  spec.mutable_data()->set_train_labels("labels.gz");
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.5);
  spec.set_max_staleness(1);
  return spec;
}

class MasterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MasterCore::Options options;
    options.registry.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                                 ::testing::UnitTest::GetInstance()
                                     ->current_test_info()
                                     ->name();
    options.registry.resume_jobs = false;
    auto core = MasterCore::Create(options);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(core).value();
    service_ = std::make_unique<MasterServiceImpl>(*core_);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    MasterClient::Options client_options;
    client_options.rpc_timeout = absl::Seconds(30);
    client_ = MasterClient::ForChannel(
        server_->InProcessChannel(grpc::ChannelArguments()), "in-process",
        client_options);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    if (core_ != nullptr) core_->CloseSnapshots();
  }

  // Submits SgdSpec, registers a group and installs `initial` as the
  // weights of two tensors "w" {2} and "b" {3}.
  void StartJob(const std::vector<std::vector<float>>& initial) {
    auto job = client_->SubmitJob(SgdSpec());
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = *job;
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id_);
    request.set_ranks(1);
    auto group = client_->RegisterGroup(request);
    ASSERT_TRUE(group.ok()) << group.status();
    group_id_ = group->group_id();
    layout_ = MakeFloat32Header(0, {"w", "b"}, {{2}, {3}});
    auto accepted = client_->InitWeights(
        job_id_, group_id_, layout_,
        {absl::MakeConstSpan(initial[0]), absl::MakeConstSpan(initial[1])});
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    ASSERT_TRUE(*accepted);
  }

  absl::StatusOr<uint64_t> Push(uint64_t base_version,
                                const std::vector<std::vector<float>>& gradient,
                                std::vector<std::vector<float>>& reply) {
    v1::PushGradientRequest::Header header;
    header.set_job_id(job_id_);
    header.set_group_id(group_id_);
    header.set_kind(v1::UPDATE_KIND_GRADIENT);
    *header.mutable_gradient() = layout_;
    header.mutable_gradient()->set_version(base_version);
    reply.assign({std::vector<float>(2), std::vector<float>(3)});
    return client_->PushGradient(
        header, {absl::MakeConstSpan(gradient[0]), absl::MakeConstSpan(gradient[1])},
        {absl::MakeSpan(reply[0]), absl::MakeSpan(reply[1])});
  }

  std::unique_ptr<MasterCore> core_;
  std::unique_ptr<MasterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MasterClient> client_;
  std::string job_id_, group_id_;
  v1::TensorSetHeader layout_;
};

TEST_F(MasterServiceTest, PushAppliesSgdAndReturnsTheNewWeights) {
  StartJob({{1.0f, -2.0f}, {0.5f, 0.25f, 4.0f}});
  std::vector<std::vector<float>> reply;
  auto version = Push(0, {{2.0f, 4.0f}, {-1.0f, 0.0f, 8.0f}}, reply);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  // w - lr * g with lr 0.5, computed by hand.
  EXPECT_EQ(reply[0], (std::vector<float>{0.0f, -4.0f}));
  EXPECT_EQ(reply[1], (std::vector<float>{1.0f, 0.25f, 0.0f}));

  std::vector<float> w(2), b(3);
  auto pulled = client_->PullWeights(job_id_, group_id_,
                                     {absl::MakeSpan(w), absl::MakeSpan(b)});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(*pulled, 1u);
  EXPECT_EQ(w, reply[0]);
  EXPECT_EQ(b, reply[1]);
}

// A push sent again with the same sequence number (what the client's retry
// does after a lost reply) is applied once; the repeat gets the current
// weights back.
TEST_F(MasterServiceTest, RetriedPushIsAppliedOnce) {
  StartJob({{1.0f, -2.0f}, {0.5f, 0.25f, 4.0f}});
  v1::PushGradientRequest::Header header;
  header.set_job_id(job_id_);
  header.set_group_id(group_id_);
  header.set_kind(v1::UPDATE_KIND_GRADIENT);
  *header.mutable_gradient() = layout_;
  header.set_sequence(7);
  const std::vector<float> gw = {2.0f, 4.0f}, gb = {-1.0f, 0.0f, 8.0f};
  std::vector<float> w(2), b(3);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto version = client_->PushGradient(header, {absl::MakeConstSpan(gw), absl::MakeConstSpan(gb)},
                                         {absl::MakeSpan(w), absl::MakeSpan(b)});
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, 1u) << "attempt " << attempt;
    EXPECT_EQ(w, (std::vector<float>{0.0f, -4.0f}));
  }
  // A new number is a new update.
  header.set_sequence(8);
  header.mutable_gradient()->set_version(1);
  auto version = client_->PushGradient(header, {absl::MakeConstSpan(gw), absl::MakeConstSpan(gb)},
                                       {absl::MakeSpan(w), absl::MakeSpan(b)});
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 2u);
  EXPECT_EQ(w, (std::vector<float>{-1.0f, -6.0f}));
}

// Reduced-precision exchange through the real service and client: the
// master applies the decoded gradient to fp32 weights and sends them back
// rounded to the wire dtype; a pull in fp32 sees the master's exact weights.
// The expected values are computed here from the codec's own round trip
// (itself checked against an exhaustive reference in tensor_codec_test).
TEST_F(MasterServiceTest, ReducedPrecisionPushAndReply) {
  for (v1::DType dtype : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const std::vector<std::vector<float>> initial = {{1.001f, -2.003f},
                                                     {0.5f, 0.257f, 4.01f}};
    StartJob(initial);
    v1::ExchangeSpec wire;
    wire.set_update_dtype(dtype);
    wire.set_weights_dtype(dtype);
    wire.set_error_feedback(false);
    client_->UseWireFormat(wire);
    const std::vector<std::vector<float>> gradient = {{0.3333f, 4.1f}, {-1.7f, 0.01f, 8.3f}};
    std::vector<std::vector<float>> reply;
    auto version = Push(0, gradient, reply);
    ASSERT_TRUE(version.ok()) << version.status();
    auto round = [dtype](float x) {
      char wire_bytes[2];
      EncodeFloats(absl::MakeConstSpan(&x, 1), dtype, wire_bytes);
      float y;
      DecodeFloats(absl::MakeConstSpan(wire_bytes, 2), dtype, &y);
      return y;
    };
    wire.set_weights_dtype(v1::DTYPE_FLOAT32);
    client_->UseWireFormat(wire);
    std::vector<float> w(2), b(3);
    ASSERT_TRUE(client_->PullWeights(job_id_, group_id_,
                                     {absl::MakeSpan(w), absl::MakeSpan(b)})
                    .ok());
    const std::vector<float>* exact[2] = {&w, &b};
    for (size_t t = 0; t < 2; ++t) {
      for (size_t i = 0; i < initial[t].size(); ++i) {
        // SGD, lr 0.5, on the decoded gradient, in fp32 on the master.
        const float expected = initial[t][i] - 0.5f * round(gradient[t][i]);
        EXPECT_EQ((*exact[t])[i], expected) << t << " " << i;
        EXPECT_EQ(reply[t][i], round(expected)) << t << " " << i;
      }
    }
    client_->UseWireFormat(v1::ExchangeSpec());
  }
}

TEST_F(MasterServiceTest, ErrorsArriveWithCodeAndReason) {
  StartJob({{1.0f, 2.0f}, {3.0f, 4.0f, 5.0f}});
  std::vector<std::vector<float>> reply;

  // Unknown job.
  auto status = client_->GetJobStatus("job-999999");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(status.status()), v1::ERROR_REASON_JOB_UNKNOWN);

  // NaN gradient: refused, the weights do not move.
  auto nan = Push(0, {{std::nanf(""), 0.0f}, {0.0f, 0.0f, 0.0f}}, reply);
  ASSERT_FALSE(nan.ok());
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(nan.status()), v1::ERROR_REASON_INVALID_REQUEST);

  // Stale: two updates on version 0 move the master to 2; a third computed
  // on 0 has staleness 2 > max_staleness 1.
  ASSERT_TRUE(Push(0, {{0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}}, reply).ok());
  ASSERT_TRUE(Push(0, {{0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}}, reply).ok());
  auto stale = Push(0, {{1.0f, 1.0f}, {1.0f, 1.0f, 1.0f}}, reply);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(stale.status()), v1::ERROR_REASON_STALE_UPDATE);

  // A group the job does not know, on a pull: the service touches the group
  // exactly as the local mode does.
  std::vector<float> w(2), b(3);
  auto pulled = client_->PullWeights(job_id_, "g-424242",
                                     {absl::MakeSpan(w), absl::MakeSpan(b)});
  ASSERT_FALSE(pulled.ok());
  EXPECT_EQ(ReasonOf(pulled.status()), v1::ERROR_REASON_GROUP_UNKNOWN);

  // The refused updates changed nothing: two applied zero gradients.
  auto job = client_->GetJobStatus(job_id_);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->version(), 2u);
  EXPECT_EQ(job->updates_applied(), 2u);
  EXPECT_EQ(job->stale_rejected(), 1u);
}

// A job resumed without weights (the master died before its first
// checkpoint): a push from a group of the previous master hears
// GROUP_UNKNOWN, which makes a worker register again and install the
// weights; a registered group's push hears that the job has no weights.
TEST_F(MasterServiceTest, PushToAJobWithoutWeightsTellsAnUnknownGroupToRegister) {
  auto job = client_->SubmitJob(SgdSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  job_id_ = *job;
  layout_ = MakeFloat32Header(0, {"w", "b"}, {{2}, {3}});
  std::vector<std::vector<float>> reply;
  group_id_ = "g-424242";
  auto unknown = Push(0, {{0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}}, reply);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(ReasonOf(unknown.status()), v1::ERROR_REASON_GROUP_UNKNOWN)
      << unknown.status();

  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  auto group = client_->RegisterGroup(request);
  ASSERT_TRUE(group.ok()) << group.status();
  group_id_ = group->group_id();
  auto no_weights = Push(0, {{0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}}, reply);
  ASSERT_FALSE(no_weights.ok());
  EXPECT_EQ(ReasonOf(no_weights.status()), v1::ERROR_REASON_JOB_STATE)
      << no_weights.status();
}

TEST_F(MasterServiceTest, LayoutMismatchIsRefusedBeforeAnyTensorArrives) {
  StartJob({{1.0f, 2.0f}, {3.0f, 4.0f, 5.0f}});
  layout_ = MakeFloat32Header(0, {"w", "b"}, {{2}, {4}});
  std::vector<std::vector<float>> reply;
  v1::PushGradientRequest::Header header;
  header.set_job_id(job_id_);
  header.set_group_id(group_id_);
  *header.mutable_gradient() = layout_;
  std::vector<float> g0(2), g1(4), r0(2), r1(4);
  auto pushed = client_->PushGradient(
      header, {absl::MakeConstSpan(g0), absl::MakeConstSpan(g1)},
      {absl::MakeSpan(r0), absl::MakeSpan(r1)});
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(pushed.status()), v1::ERROR_REASON_INVALID_REQUEST);
}

}  // namespace
}  // namespace mpilearn::server
