// Bad input against the running master: each case gets a clear gRPC status
// (or, for the worker, a message and a non-zero exit), and the master keeps
// serving its other jobs throughout. The attacks of issue 15 (memory bombs,
// unbounded strings, forged log lines, huge ids) are refused by the
// master's limits (server/core/master_core.h MasterLimits) before it takes
// memory for them: its resident memory is read from /proc to show it.
// Over 500 lines: one battery against one master, each case short.
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/spec/job_spec.h"
#include "common/tensor_codec.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.grpc.pb.h"
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
                                const std::vector<std::vector<float>>& grads,
                                double update_norm = 0.0) {
    v1::PushGradientRequest::Header header;
    header.set_job_id(job_id_);
    header.set_group_id(group_id_);
    *header.mutable_gradient() = layout;
    header.set_samples(1);
    header.set_update_norm(update_norm);
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

// The resident memory of process `pid` in bytes (VmRSS), or -1.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, " kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(rest, &kib)) return kib * 1024;
  }
  return -1;
}

// Sends one InitWeights header (and no tensor bytes) through the generated
// stub, as any client could, and returns the master's answer.
absl::Status SendInitWeightsHeader(
    MasterClient& client, const v1::InitWeightsRequest::Header& header) {
  ClientContext context;
  v1::InitWeightsResponse response;
  auto writer = client.stub().InitWeights(&context, &response);
  v1::InitWeightsRequest request;
  *request.mutable_header() = header;
  writer->Write(request);
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

// A header of `tensors` tensors of `elements` values each, in `dtype`.
v1::InitWeightsRequest::Header BombHeader(const std::string& job_id,
                                          const std::string& group_id,
                                          int tensors, int64_t elements,
                                          v1::DType dtype) {
  v1::InitWeightsRequest::Header header;
  header.set_job_id(job_id);
  header.set_group_id(group_id);
  for (int t = 0; t < tensors; ++t) {
    v1::TensorInfo* info = header.mutable_weights()->add_tensors();
    info->set_name("t" + std::to_string(t));
    info->set_dtype(dtype);
    info->add_shape(elements);
  }
  return header;
}

void ExpectLimit(const absl::Status& status, const std::string& flag) {
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_LIMIT) << status;
  EXPECT_NE(status.message().find(flag), std::string::npos)
      << "message '" << status.message() << "' should name " << flag;
}

// Headers that announce more than --max_model_mib (512 MiB by default) are
// refused from the header alone: 10^9 floats (4 GB), 10^12 floats (once
// UNKNOWN), 100 tensors of 10^8 floats (once 24 GB until the kernel killed
// the master), and 2 x 10^8 bf16 values (400 MB on the wire, under the
// limit, but 800 MB as the fp32 the master decodes them into).
// The master's resident memory does not grow by the announced sizes, and it
// still installs the real weights afterwards.
TEST_F(BadInputTest, InitWeightsMemoryBombsAreRefusedBeforeAllocating) {
  job_id_ = client_->SubmitJob(SgdSpec()).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  group_id_ = client_->RegisterGroup(request).value().group_id();
  const pid_t pid = master_->process().pid();
  const int64_t rss_before = ResidentBytes(pid);
  ASSERT_GT(rss_before, 0);
  struct Bomb {
    int tensors;
    int64_t elements;
    v1::DType dtype;
  };
  for (const Bomb& bomb : {Bomb{1, 1000000000, v1::DTYPE_FLOAT32},
                           Bomb{1, 1000000000000, v1::DTYPE_FLOAT32},
                           Bomb{100, 100000000, v1::DTYPE_FLOAT32},
                           Bomb{1, 200000000, v1::DTYPE_BFLOAT16}}) {
    SCOPED_TRACE(absl::StrCat(bomb.tensors, " x ", bomb.elements));
    ExpectLimit(SendInitWeightsHeader(
                    *client_, BombHeader(job_id_, group_id_, bomb.tensors,
                                         bomb.elements, bomb.dtype)),
                "--max_model_mib");
  }
  // A stranger (no registered group) is refused before any sizing.
  const absl::Status stranger = SendInitWeightsHeader(
      *client_,
      BombHeader(job_id_, "g-999999", 1, 1000000000, v1::DTYPE_FLOAT32));
  EXPECT_EQ(ReasonOf(stranger), v1::ERROR_REASON_GROUP_UNKNOWN) << stranger;
  const int64_t rss_after = ResidentBytes(pid);
  std::cout << "master RSS " << (rss_before >> 20) << " MiB before the bombs, "
            << (rss_after >> 20) << " MiB after\n";
  EXPECT_LT(rss_after - rss_before, int64_t{200} << 20)
      << "master RSS " << rss_before << " -> " << rss_after;
  weights_ = {std::vector<float>(12, 1.0f), std::vector<float>(3, 1.0f)};
  EXPECT_TRUE(client_
                  ->InitWeights(job_id_, group_id_, Header(0),
                                {weights_[0], weights_[1]})
                  .value());
}

TEST_F(BadInputTest, TooManyTensorsInOneSetAreRefused) {
  job_id_ = client_->SubmitJob(SgdSpec()).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  group_id_ = client_->RegisterGroup(request).value().group_id();
  ExpectLimit(SendInitWeightsHeader(
                  *client_, BombHeader(job_id_, group_id_, 70000, 1,
                                       v1::DTYPE_FLOAT32)),
              "--max_tensors_per_set");
}

// hidden [1048576, 1048576] is 4.4 TB of weights: refused at submit,
// naming the size and the limit, instead of failing a worker later.
TEST_F(BadInputTest, HugeModelSpecIsRefusedAtSubmit) {
  v1::JobSpec spec = SgdSpec();
  spec.mutable_model()->add_hidden(1048576);
  spec.mutable_model()->add_hidden(1048576);
  const size_t jobs_before = client_->ListJobs()->size();
  const absl::Status status = client_->SubmitJob(spec).status();
  ExpectLimit(status, "--max_model_mib");
  EXPECT_NE(status.message().find("1099515822081 parameters"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("TiB"), std::string::npos) << status;
  EXPECT_EQ(client_->ListJobs()->size(), jobs_before);
}

// Strings the master would store are bounded (--max_string_bytes, 4096 by
// default) and may not hold control characters; the master's log gets no
// forged line.
TEST_F(BadInputTest, LongOrControlStringsAreRefused) {
  v1::JobSpec spec = SgdSpec();
  spec.set_name(std::string(1 << 20, 'n'));
  ExpectLimit(client_->SubmitJob(spec).status(), "--max_string_bytes");
  spec = SgdSpec();
  spec.set_name("name\n[FORGED] master log line");
  ExpectError(client_->SubmitJob(spec).status(),
              absl::StatusCode::kInvalidArgument, "spec.name holds a control");

  job_id_ = client_->SubmitJob(SgdSpec()).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  request.set_host("node7\nE1231 00:00:00 FORGED-HOST-LINE");
  ExpectError(client_->RegisterGroup(request).status(),
              absl::StatusCode::kInvalidArgument, "host holds a control");
  request.set_host(std::string(5000, 'h'));
  ExpectLimit(client_->RegisterGroup(request).status(), "--max_string_bytes");
  request.set_host("node7");
  group_id_ = client_->RegisterGroup(request).value().group_id();

  v1::ReportValidationRequest report;
  report.set_job_id(job_id_);
  report.mutable_record()->set_source(std::string(1 << 20, 's'));
  ExpectLimit(client_->ReportValidation(report).status(), "--max_string_bytes");
  const std::string log = master_->process().Log();
  EXPECT_EQ(log.find("[FORGED]"), std::string::npos);
  EXPECT_EQ(log.find("FORGED-HOST"), std::string::npos);
}

// A group's error is never refused: the job fails with it, kept to one line
// and cut to the string limit.
TEST_F(BadInputTest, LongMultilineGroupErrorIsKeptBounded) {
  job_id_ = client_->SubmitJob(SgdSpec()).value();
  v1::RegisterGroupRequest request;
  request.set_job_id(job_id_);
  request.set_ranks(1);
  group_id_ = client_->RegisterGroup(request).value().group_id();
  v1::LeaveRequest leave;
  leave.set_job_id(job_id_);
  leave.set_group_id(group_id_);
  leave.set_error("out of memory\nE1231 FORGED-ERROR-LINE" +
                  std::string(1 << 20, 'e'));
  ASSERT_TRUE(client_->Leave(leave).ok());
  const v1::JobStatus status = client_->GetJobStatus(job_id_).value();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(status.message().find("out of memory\\nE1231"), std::string::npos)
      << status.message().substr(0, 200);
  EXPECT_LT(status.message().size(), 4096u + 200u);
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
  EXPECT_EQ(master_->process().Log().find("\nE1231 FORGED"), std::string::npos);
}

// An unknown id of a megabyte: NOT_FOUND with a short prefix of it, not a
// reply a default client cannot read.
TEST_F(BadInputTest, HugeUnknownJobIdIsNotFoundWithAShortEcho) {
  const absl::Status status =
      client_->GetJobStatus(std::string(1 << 20, 'x')).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status.code();
  EXPECT_LT(status.message().size(), 300u);
  EXPECT_NE(status.message().find("[1048576 bytes]"), std::string::npos)
      << status.message();
}

// The raw tensor methods parse request bytes themselves: bytes that are no
// valid message get INVALID_ARGUMENT from the master, never UNKNOWN or a
// crash. (A typed method's unparsable request is refused by the gRPC
// library itself, with INTERNAL.)
TEST_F(BadInputTest, MalformedRawBytesAreInvalidArgument) {
  auto channel = grpc::CreateChannel(master_->address(),
                                     grpc::InsecureChannelCredentials());
  const std::vector<std::string> payloads = {
      std::string("\xff\xff\xff\xff", 4),          // a tag that never ends
      std::string("\x0a\xff\xff\xff\x0f", 5),  // header overruns
      std::string("\x12\x08\x1a\x10" "ab", 6),  // chunk overruns
      std::string("\x0a\x03\x0a\x01", 4),          // a truncated header
      std::string("\x0b", 1),                      // wire type 3 (groups)
  };
  for (const char* method : {"/mpilearn.v1.Master/PushGradient",
                             "/mpilearn.v1.Master/PullWeights",
                             "/mpilearn.v1.Master/SubscribeSnapshots"}) {
    grpc::internal::RpcMethod rpc(method,
                                  grpc::internal::RpcMethod::BIDI_STREAMING,
                                  channel);
    for (size_t i = 0; i < payloads.size(); ++i) {
      SCOPED_TRACE(absl::StrCat(method, " payload ", i));
      ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(30));
      using Stream =
          grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
      std::unique_ptr<Stream> stream(
          grpc::internal::ClientReaderWriterFactory<
              grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), rpc,
                                                          &context));
      grpc::Slice slice(payloads[i].data(), payloads[i].size());
      grpc::ByteBuffer message(&slice, 1);
      stream->Write(message);
      stream->WritesDone();
      grpc::ByteBuffer reply;
      while (stream->Read(&reply)) {
      }
      const grpc::Status status = stream->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << status.error_message();
    }
  }
}

// One connection may hold at most --max_streams_per_connection calls open:
// with both of its two taken by snapshot streams (which never end by
// themselves), a third call on it waits, while another connection is
// served; once one stream ends, the waiting call goes through.
TEST(StreamLimitTest, OneConnectionHoldsAtMostItsStreams) {
  const std::string dir = NewTempDir("stream_limit");
  auto master = MasterProcess::Start(dir, {"--max_streams_per_connection=2"});
  ASSERT_TRUE(master.ok()) << master.status();
  auto channel = grpc::CreateChannel((*master)->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Master::NewStub(channel);
  auto list = [&](v1::Master::Stub& s, int seconds) {
    ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(seconds));
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    return s.ListJobs(&context, request, &response).error_code();
  };
  // Connected, with the master's settings (the limit) received.
  ASSERT_EQ(list(*stub, 30), grpc::StatusCode::OK);

  ClientContext contexts[2];
  std::unique_ptr<grpc::ClientReader<v1::SnapshotPart>> streams[2];
  for (int i = 0; i < 2; ++i) {
    v1::SubscribeSnapshotsRequest request;
    request.set_subscriber(absl::StrCat("stream-limit-", i));
    streams[i] = stub->SubscribeSnapshots(&contexts[i], request);
  }
  // Both streams are open on the master before the third call is made: it
  // answers each with initial metadata once subscribed.
  for (int i = 0; i < 2; ++i) {
    streams[i]->WaitForInitialMetadata();
    EXPECT_EQ(contexts[i].GetServerInitialMetadata().count("mpilearn-subscribed"),
              1u);
  }

  EXPECT_EQ(list(*stub, 2), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "a third call was served on a connection limited to 2 streams";
  grpc::ChannelArguments separate;  // a connection of its own
  separate.SetInt("mpilearn.test.connection", 2);
  auto other = v1::Master::NewStub(grpc::CreateCustomChannel(
      (*master)->address(), grpc::InsecureChannelCredentials(), separate));
  EXPECT_EQ(list(*other, 30), grpc::StatusCode::OK);

  contexts[0].TryCancel();
  v1::SnapshotPart part;
  while (streams[0]->Read(&part)) {
  }
  EXPECT_EQ(streams[0]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(list(*stub, 30), grpc::StatusCode::OK);
  contexts[1].TryCancel();
  while (streams[1]->Read(&part)) {
  }
  (void)streams[1]->Finish();
}

// Three jobs whose specs list 3.6 MB of file paths each: the listing stays
// under 4 MiB (the file lists are left out of it), so every client can read
// it, and every job is still in it.
TEST_F(BadInputTest, ListingStaysReadableWithHugeSpecs) {
  for (int j = 0; j < 3; ++j) {
    v1::JobSpec spec = SgdSpec();
    spec.mutable_data()->clear_train_images();
    spec.mutable_data()->clear_train_labels();
    for (int f = 0; f < 900; ++f) {
      spec.mutable_data()->add_train_files(
          absl::StrCat(std::string(4000, 'p'), "/", j, "-", f, ".h5"));
    }
    ASSERT_TRUE(client_->SubmitJob(spec).ok());
  }
  ClientContext context;
  v1::ListJobsResponse listed;
  ASSERT_TRUE(
      client_->stub().ListJobs(&context, v1::ListJobsRequest(), &listed).ok());
  EXPECT_LT(listed.ByteSizeLong(), size_t{4} << 20);
  int with_files = 0;
  for (const v1::JobStatus& job : listed.jobs()) {
    with_files += job.spec().data().train_files_size() > 0 ? 1 : 0;
  }
  EXPECT_EQ(with_files, 0);
  EXPECT_GE(listed.jobs_size(), 3);
}

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
  // A whole-update norm (a shard's slice) that is no norm.
  for (const double norm : {-1.0, std::nan(""), HUGE_VAL}) {
    ExpectError(Push(Header(0), {std::vector<float>(12), std::vector<float>(3)}, norm)
                    .status(),
                absl::StatusCode::kInvalidArgument, "update_norm must be a finite number");
  }
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
