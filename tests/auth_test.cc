// TLS and tokens end to end (docs/security.md): the real mpilearn-master
// with --tls_cert/--tls_key and a --tokens_file, certificates made at test
// time with the openssl CLI.
//
//   - every RPC of the Master and Studies services, found in the proto's
//     descriptors (so an RPC added later is covered too), is refused
//     without a token and with an unknown one (UNAUTHENTICATED), and with a
//     token whose role is too low (PERMISSION_DENIED), each with
//     ERROR_REASON_PERMISSION;
//   - a plaintext client cannot talk to the TLS port; with mutual TLS a
//     client without a certificate is refused;
//   - one worker token cannot act for another's group;
//   - two owners (alice, bob) change only their own jobs and studies, an
//     admin anyone's; submissions take the submitter as owner and respect
//     its max_priority; a worker token with owners=alice trains and reads
//     only alice's jobs; GetServerInfo names the caller;
//   - a worker token reports validations only for jobs it follows with an
//     open SubscribeSnapshots stream or trains with a live group, and a
//     real validation pool (mpirun, --tls_ca, its own --token_file) gets
//     its reports recorded;
//   - a non-loopback metrics endpoint needs --metrics_token_file (or
//     --insecure), and a bad metrics token file stops the start;
//   - a real group (mpirun, --tls_ca, --token_file) trains a job to the end.
//
// Over 500 lines because the cases share one TLS master and its
// certificates (made once per suite, which takes seconds); splitting them
// into files would make each start its own.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/client/client_security.h"
#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/version.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.grpc.pb.h"
#include "proto/study.grpc.pb.h"
#include "tests/study_helpers.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

constexpr char kAdminToken[] = "admin-token-0123456789abcdef";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";
constexpr char kOtherWorkerToken[] = "other-worker-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789abcdef";
constexpr char kAliceToken[] = "alice-owner-token-0123456789";
constexpr char kBobToken[] = "bob-owner-token-0123456789ab";
// A worker token that trains alice's jobs only (owners=alice).
constexpr char kAliceWorkerToken[] = "alice-rack-token-0123456789";

enum class Role { kReader = 1, kWorker = 2, kOwner = 3, kAdmin = 4 };

// The role each RPC needs, as docs/security.md documents it (an RPC not
// listed: admin).
Role Needs(const std::string& method) {
  static const std::set<std::string> kOwner = {
      "SubmitJob", "CancelJob", "DeleteJob", "CreateStudy", "CancelStudy",
      "CancelTrial", "AskTrial", "TellTrial"};
  static const std::set<std::string> kWorker = {
      "RegisterGroup", "InitWeights", "PushGradient",  "PullWeights",
      "NextDataUnit",  "ReportEpoch", "Heartbeat",     "Leave",
      "SubscribeSnapshots", "ReportValidation"};
  static const std::set<std::string> kReader = {
      "GetJobStatus", "ListJobs", "GetStudy", "ListStudies", "WatchStudy",
      "GetServerInfo"};
  if (kOwner.count(method) > 0) return Role::kOwner;
  if (kWorker.count(method) > 0) return Role::kWorker;
  if (kReader.count(method) > 0) return Role::kReader;
  return Role::kAdmin;
}

class AuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(NewTempDir("auth"));
    const absl::Status made =
        MakeCertificates(*dir_, "IP:127.0.0.1,DNS:localhost");
    ASSERT_TRUE(made.ok()) << made;
    WriteFileOrDie(*dir_ + "/tokens.txt",
                   absl::StrCat("# role name token [options]\n",
                                "admin  ops   ", kAdminToken, "\n",
                                "owner  alice ", kAliceToken, "\n",
                                "owner  bob   ", kBobToken, " max_priority=5\n",
                                "worker rack1 ", kWorkerToken, "\n",
                                "worker rack2 ", kOtherWorkerToken, "\n",
                                "worker alice-rack ", kAliceWorkerToken,
                                " owners=alice\n",
                                "reader dash  ", kReaderToken, "\n"));
    WriteFileOrDie(*dir_ + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
    auto master = MasterProcess::Start(
        *dir_ + "/state", {"--tls_cert=" + *dir_ + "/server.pem",
                           "--tls_key=" + *dir_ + "/server.key",
                           "--tokens_file=" + *dir_ + "/tokens.txt"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = master->release();
  }
  static void TearDownTestSuite() {
    delete master_;  // stops it
    master_ = nullptr;
    delete dir_;
  }

  void SetUp() override {
    ASSERT_NE(master_, nullptr) << "the TLS master did not start";
  }

  static ClientSecurity Tls(const std::string& token) {
    ClientSecurity security;
    security.tls_ca = *dir_ + "/ca.pem";
    security.token = token;
    return security;
  }

  static std::shared_ptr<grpc::Channel> Channel(const ClientSecurity& security) {
    auto channel = CreateMasterChannel(master_->address(), security,
                                       grpc::ChannelArguments());
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? *channel : nullptr;
  }

  static std::unique_ptr<MasterClient> Client(const std::string& token) {
    MasterClient::Options options;
    options.security = Tls(token);
    options.rpc_timeout = absl::Seconds(20);
    auto client = MasterClient::Connect(master_->address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static std::string* dir_;
  static MasterProcess* master_;
};

std::string* AuthTest::dir_ = nullptr;
MasterProcess* AuthTest::master_ = nullptr;

// Calls `path` ("/mpilearn.v1.Master/SubmitJob") with one empty request
// message, whatever its kind (a stream on the wire carries unary calls
// too), and returns the call's status.
absl::Status CallWithEmptyRequest(grpc::Channel& channel, const std::string& path) {
  grpc::internal::RpcMethod method(path.c_str(),
                                   grpc::internal::RpcMethod::BIDI_STREAMING);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(&channel, method,
                                                         &context));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  stream->Write(request);
  stream->WritesDone();
  grpc::ByteBuffer reply;
  while (stream->Read(&reply)) {
  }
  return FromGrpcStatus(stream->Finish());
}

// Every method of both services, as "/package.Service/Method" with its
// short name.
std::vector<std::pair<std::string, std::string>> AllMethods() {
  // Loads both files' descriptors into the generated pool.
  (void)v1::SubmitJobRequest::descriptor();
  (void)v1::CreateStudyRequest::descriptor();
  std::vector<std::pair<std::string, std::string>> methods;
  for (const char* name : {"mpilearn.v1.Master", "mpilearn.v1.Studies"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      methods.emplace_back(
          absl::StrCat("/", name, "/", service->method(i)->name()),
          service->method(i)->name());
    }
  }
  return methods;
}

TEST_F(AuthTest, EveryRpcRefusesMissingUnknownAndTooLowTokens) {
  const auto methods = AllMethods();
  ASSERT_GE(methods.size(), 20u);
  std::shared_ptr<grpc::Channel> no_token = Channel(Tls(""));
  std::shared_ptr<grpc::Channel> unknown = Channel(Tls("not-a-token-of-this-master"));
  std::shared_ptr<grpc::Channel> reader = Channel(Tls(kReaderToken));
  std::shared_ptr<grpc::Channel> worker = Channel(Tls(kWorkerToken));
  std::shared_ptr<grpc::Channel> owner = Channel(Tls(kAliceToken));
  int denied_by_role = 0;
  for (const auto& [path, name] : methods) {
    SCOPED_TRACE(path);
    absl::Status status = CallWithEmptyRequest(*no_token, path);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
    status = CallWithEmptyRequest(*unknown, path);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
    const Role needed = Needs(name);
    if (needed > Role::kReader) {
      status = CallWithEmptyRequest(*reader, path);
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
      EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
      ++denied_by_role;
    }
    if (needed > Role::kWorker) {
      status = CallWithEmptyRequest(*worker, path);
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
      EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
      ++denied_by_role;
    }
    if (needed > Role::kOwner) {
      status = CallWithEmptyRequest(*owner, path);
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
      EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
      ++denied_by_role;
    }
  }
  EXPECT_GT(denied_by_role, 10);

  // The right roles get through (roles nest: admin > owner > worker >
  // reader).
  EXPECT_TRUE(Client(kReaderToken)->ListJobs().ok());
  EXPECT_TRUE(Client(kWorkerToken)->ListJobs().ok());
  EXPECT_TRUE(Client(kAliceToken)->ListJobs().ok());
  EXPECT_TRUE(Client(kAdminToken)->ListJobs().ok());
}

TEST_F(AuthTest, PlaintextClientCannotTalkToTheTlsPort) {
  ClientSecurity plaintext;
  plaintext.token = kAdminToken;
  MasterClient::Options options;
  options.security = plaintext;
  options.connect_timeout = absl::Seconds(3);
  auto client = MasterClient::Connect(master_->address(), options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  // A call on a channel that never connected fails the same way.
  auto channel = CreateMasterChannel(master_->address(), plaintext,
                                     grpc::ChannelArguments());
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(CallWithEmptyRequest(**channel, "/mpilearn.v1.Master/ListJobs").code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(AuthTest, MutualTlsRefusesAClientWithoutCertificate) {
  auto master = MasterProcess::Start(
      *dir_ + "/mtls-state", {"--tls_cert=" + *dir_ + "/server.pem",
                              "--tls_key=" + *dir_ + "/server.key",
                              "--tls_client_ca=" + *dir_ + "/ca.pem",
                              "--tokens_file=" + *dir_ + "/tokens.txt"});
  ASSERT_TRUE(master.ok()) << master.status();
  MasterClient::Options options;
  options.connect_timeout = absl::Seconds(3);
  options.security = Tls(kReaderToken);
  auto refused = MasterClient::Connect((*master)->address(), options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  options.security.tls_cert = *dir_ + "/client.pem";
  options.security.tls_key = *dir_ + "/client.key";
  auto accepted = MasterClient::Connect((*master)->address(), options);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE((*accepted)->ListJobs().ok());
  // The token is still checked under mutual TLS.
  options.security.token = "";
  auto no_token = MasterClient::Connect((*master)->address(), options);
  ASSERT_TRUE(no_token.ok()) << no_token.status();
  EXPECT_EQ((*no_token)->ListJobs().status().code(),
            absl::StatusCode::kUnauthenticated);
}

// A one-tensor layout and values for the group calls that carry tensors.
v1::TensorSetHeader OneTensor() {
  v1::TensorSetHeader header;
  v1::TensorInfo* tensor = header.add_tensors();
  tensor->set_name("w");
  tensor->set_dtype(v1::DTYPE_FLOAT32);
  tensor->add_shape(4);
  return header;
}

TEST_F(AuthTest, OneTokenCannotActForAnotherTokensGroup) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> admin = Client(kAdminToken);
  std::unique_ptr<MasterClient> owner = Client(kWorkerToken);
  std::unique_ptr<MasterClient> other = Client(kOtherWorkerToken);
  ASSERT_TRUE(admin && owner && other);
  absl::StatusOr<std::string> job_id =
      admin->SubmitJob(FashionMnistSubset("downpour", 2000, 1));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  v1::RegisterGroupRequest registration;
  registration.set_job_id(*job_id);
  registration.set_ranks(1);
  registration.set_host("owner-host");
  absl::StatusOr<v1::RegisterGroupResponse> group =
      owner->RegisterGroup(registration);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string& group_id = group->group_id();

  auto expect_denied = [](const absl::Status& status, const char* what) {
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied)
        << what << ": " << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION) << what;
  };
  std::vector<float> values(4, 0.5f);
  std::vector<absl::Span<const float>> spans = {values};
  std::vector<float> out(4);
  std::vector<absl::Span<float>> out_spans = {absl::MakeSpan(out)};
  for (MasterClient* intruder : {other.get(), admin.get()}) {
    expect_denied(intruder->InitWeights(*job_id, group_id, OneTensor(), spans)
                      .status(),
                  "InitWeights");
    v1::PushGradientRequest::Header push;
    push.set_job_id(*job_id);
    push.set_group_id(group_id);
    *push.mutable_gradient() = OneTensor();
    push.set_samples(1);
    expect_denied(intruder->PushGradient(push, spans, out_spans).status(),
                  "PushGradient");
    expect_denied(intruder->PullWeights(*job_id, group_id, out_spans).status(),
                  "PullWeights");
    v1::NextDataUnitRequest next;
    next.set_job_id(*job_id);
    next.set_group_id(group_id);
    expect_denied(intruder->NextDataUnit(next).status(), "NextDataUnit");
    v1::ReportEpochRequest epoch;
    epoch.set_job_id(*job_id);
    epoch.mutable_record()->set_group_id(group_id);
    epoch.mutable_record()->set_epoch(1);
    expect_denied(intruder->ReportEpoch(epoch).status(), "ReportEpoch");
    expect_denied(intruder->Heartbeat(*job_id, group_id).status(), "Heartbeat");
    v1::LeaveRequest leave;
    leave.set_job_id(*job_id);
    leave.set_group_id(group_id);
    leave.set_error("hijacked");
    expect_denied(intruder->Leave(leave).status(), "Leave");
  }
  // The job did not fail, and the owner still acts for its group.
  absl::StatusOr<v1::JobStatus> status = admin->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(status->state(), v1::JOB_STATE_FAILED) << status->message();
  EXPECT_TRUE(owner->Heartbeat(*job_id, group_id).ok());
  v1::LeaveRequest leave;
  leave.set_job_id(*job_id);
  leave.set_group_id(group_id);
  leave.set_error("test over");
  EXPECT_TRUE(owner->Leave(leave).ok());
  // Once it left, the group is unknown (to its owner too).
  EXPECT_EQ(ReasonOf(owner->Heartbeat(*job_id, group_id).status()),
            v1::ERROR_REASON_GROUP_UNKNOWN);
}

// A validation report as a pool sends it.
v1::ReportValidationRequest Validation(const std::string& job_id) {
  v1::ReportValidationRequest request;
  request.set_job_id(job_id);
  request.mutable_record()->set_val_loss(1.0);
  request.mutable_record()->set_val_accuracy(0.5);
  request.mutable_record()->set_samples(10);
  request.mutable_record()->set_source("pool test");
  return request;
}

void ExpectReportDenied(MasterClient& client, const std::string& job_id,
                        const char* why) {
  const absl::Status status = client.ReportValidation(Validation(job_id)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied)
      << why << ": " << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION) << why;
  // The message says what would allow the report.
  EXPECT_NE(status.message().find("SubscribeSnapshots"), std::string::npos)
      << status;
}

// Subscribes `client` to `job_ids` (empty: every job).
std::unique_ptr<SnapshotStream> Subscribe(MasterClient& client,
                                          const std::vector<std::string>& job_ids) {
  v1::SubscribeSnapshotsRequest request;
  for (const std::string& id : job_ids) request.add_job_ids(id);
  request.set_subscriber("auth test");
  absl::StatusOr<std::unique_ptr<SnapshotStream>> stream =
      client.SubscribeSnapshots(request);
  EXPECT_TRUE(stream.ok()) << stream.status();
  return stream.ok() ? *std::move(stream) : nullptr;
}

// Once a stream is cancelled the master notices within about a second;
// waits (up to 30 s) until `client`'s reports for `job_id` are refused.
absl::Status WaitUntilReportsRefused(MasterClient& client,
                                     const std::string& job_id) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    const absl::Status status =
        client.ReportValidation(Validation(job_id)).status();
    if (status.code() == absl::StatusCode::kPermissionDenied) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "reports still allowed 30 s after the stream ended: ",
          status.ToString()));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

TEST_F(AuthTest, ValidationReportsNeedASubscriptionOrAGroupOfTheJob) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> admin = Client(kAdminToken);
  std::unique_ptr<MasterClient> pool = Client(kWorkerToken);
  std::unique_ptr<MasterClient> other = Client(kOtherWorkerToken);
  ASSERT_TRUE(admin && pool && other);
  absl::StatusOr<std::string> job_a =
      admin->SubmitJob(FashionMnistSubset("downpour", 2000, 1));
  absl::StatusOr<std::string> job_b =
      admin->SubmitJob(FashionMnistSubset("downpour", 2000, 1));
  ASSERT_TRUE(job_a.ok()) << job_a.status();
  ASSERT_TRUE(job_b.ok()) << job_b.status();

  // A worker token that only knows the job id cannot report.
  ExpectReportDenied(*pool, *job_a, "no subscription");
  // Admins may, as before.
  EXPECT_TRUE(admin->ReportValidation(Validation(*job_a)).ok());

  // Subscribed to A: reports for A are taken, for B not, and the other
  // worker token does not share the right.
  std::unique_ptr<SnapshotStream> stream = Subscribe(*pool, {*job_a});
  ASSERT_NE(stream, nullptr);
  absl::StatusOr<v1::JobState> state =
      pool->ReportValidation(Validation(*job_a));
  EXPECT_TRUE(state.ok()) << state.status();
  ExpectReportDenied(*pool, *job_b, "subscribed to another job");
  ExpectReportDenied(*other, *job_a, "another token's subscription");
  // Once the stream ended, the right ends too.
  stream->Cancel();
  EXPECT_TRUE(WaitUntilReportsRefused(*pool, *job_a).ok());
  ExpectReportDenied(*pool, *job_a, "after the stream ended");

  // A stream following every job allows reports for each.
  stream = Subscribe(*pool, {});
  ASSERT_NE(stream, nullptr);
  EXPECT_TRUE(pool->ReportValidation(Validation(*job_a)).ok());
  EXPECT_TRUE(pool->ReportValidation(Validation(*job_b)).ok());
  stream->Cancel();
  EXPECT_TRUE(WaitUntilReportsRefused(*pool, *job_b).ok());

  // A token owning a live group of the job reports for it (in-band
  // validation), not for other jobs; once the group left, no more.
  v1::RegisterGroupRequest registration;
  registration.set_job_id(*job_b);
  registration.set_ranks(1);
  registration.set_host("validating-host");
  absl::StatusOr<v1::RegisterGroupResponse> group =
      other->RegisterGroup(registration);
  ASSERT_TRUE(group.ok()) << group.status();
  state = other->ReportValidation(Validation(*job_b));
  EXPECT_TRUE(state.ok()) << state.status();
  ExpectReportDenied(*other, *job_a, "a group of another job");
  ExpectReportDenied(*pool, *job_b, "another token's group");
  v1::LeaveRequest leave;
  leave.set_job_id(*job_b);
  leave.set_group_id(group->group_id());
  leave.set_error("test over");
  ASSERT_TRUE(other->Leave(leave).ok());
  ExpectReportDenied(*other, *job_b, "after the group left");

  // The reports that got through are in the jobs' histories (how many
  // depends on how soon the master noticed a cancelled stream, as
  // WaitUntilReportsRefused reports until refused).
  absl::StatusOr<v1::JobStatus> status_a = admin->GetJobStatus(*job_a);
  absl::StatusOr<v1::JobStatus> status_b = admin->GetJobStatus(*job_b);
  ASSERT_TRUE(status_a.ok() && status_b.ok());
  EXPECT_GE(status_a->validations_size(), 3);  // admin, A, every job
  EXPECT_GE(status_b->validations_size(), 2);  // every job, the group
}

TEST_F(AuthTest, GroupTrainsAJobOverTlsWithTokens) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> admin = Client(kAdminToken);
  ASSERT_NE(admin, nullptr);
  absl::StatusOr<std::string> job_id =
      admin->SubmitJob(FashionMnistSubset("downpour", 4000, 1));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto workers = StartWorkers(
      2, master_->address(),
      {"--job_id=" + *job_id, "--threads=1", "--tls_ca=" + *dir_ + "/ca.pem",
       "--token_file=" + *dir_ + "/worker.token"},
      *dir_ + "/workers.log");
  ASSERT_TRUE(workers.ok()) << workers.status();
  const std::optional<int> exit_code = (*workers)->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit_code.has_value()) << "workers did not finish in 120 s:\n"
                                     << (*workers)->Log();
  EXPECT_EQ(*exit_code, 0) << (*workers)->Log();
  absl::StatusOr<v1::JobStatus> status = admin->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
  EXPECT_EQ(status->samples_trained(), 2000u);  // 4000 less 2000 validation
  EXPECT_GT(status->updates_applied(), 0u);
}

TEST_F(AuthTest, ValidationPoolReportsUnderItsOwnToken) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> admin = Client(kAdminToken);
  ASSERT_NE(admin, nullptr);
  v1::JobSpec spec = FashionMnistSubset("downpour", 4000, 1);
  spec.mutable_snapshots()->set_every_updates(20);
  spec.set_inband_validation(false);
  absl::StatusOr<std::string> job_id = admin->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  // The pool's token is not the group's: it reports through its own
  // subscription.
  WriteFileOrDie(*dir_ + "/pool.token", absl::StrCat(kOtherWorkerToken, "\n"));
  auto pool = StartWorkers(
      1, master_->address(),
      {"--role=validate", "--jobs=" + *job_id, "--pool_label=tls",
       "--exit_when_idle_s=10", "--threads=1", "--tls_ca=" + *dir_ + "/ca.pem",
       "--token_file=" + *dir_ + "/pool.token"},
      *dir_ + "/pool.log");
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_TRUE(WaitForLog(**pool, "waiting for snapshots", absl::Seconds(120)))
      << (*pool)->Log();
  auto group = StartWorkers(
      1, master_->address(),
      {"--job_id=" + *job_id, "--threads=1", "--slowdown_ms_per_batch=5",
       "--tls_ca=" + *dir_ + "/ca.pem", "--token_file=" + *dir_ + "/worker.token"},
      *dir_ + "/pool-group.log");
  ASSERT_TRUE(group.ok()) << group.status();
  const std::optional<int> group_exit = (*group)->Wait(absl::Seconds(180));
  ASSERT_TRUE(group_exit.has_value()) << (*group)->Log();
  EXPECT_EQ(*group_exit, 0) << (*group)->Log();
  const std::optional<int> pool_exit = (*pool)->Wait(absl::Seconds(120));
  ASSERT_TRUE(pool_exit.has_value()) << "pool did not exit when idle:\n"
                                     << (*pool)->Log();
  EXPECT_EQ(*pool_exit, 0) << (*pool)->Log();
  EXPECT_EQ((*pool)->Log().find("not recorded"), std::string::npos)
      << (*pool)->Log();
  absl::StatusOr<v1::JobStatus> status = admin->GetJobStatus(*job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  int from_pool = 0;
  for (const v1::ValidationRecord& record : status->validations()) {
    if (record.source() == "pool tls") ++from_pool;
  }
  EXPECT_GT(from_pool, 0) << (*pool)->Log();
}

// A refusal by one of the ownership rules (server/core/caller_bindings.h):
// PERMISSION_DENIED, ERROR_REASON_PERMISSION, the rule named.
void ExpectRuleRefusal(const absl::Status& status, const std::string& rule,
                       const std::string& what) {
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied)
      << what << ": " << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION) << what << ": " << status;
  EXPECT_NE(status.message().find("rule \"" + rule + "\""), std::string::npos)
      << what << ": " << status;
}

// One unary call of the Studies service with a 20 s deadline; its status
// with the master's reason.
template <typename Request, typename Response>
absl::Status StudyCall(
    v1::Studies::Stub& stub,
    grpc::Status (v1::Studies::Stub::*method)(grpc::ClientContext*, const Request&,
                                              Response*),
    const Request& request, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return FromGrpcStatus((stub.*method)(&context, request, response));
}

// GetServerInfo as `token`.
absl::StatusOr<v1::ServerInfo> ServerInfoOf(MasterClient& client) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ServerInfo info;
  const grpc::Status status =
      client.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  if (!status.ok()) return FromGrpcStatus(status);
  return info;
}

TEST_F(AuthTest, GetServerInfoNamesTheCaller) {
  struct Case {
    const char* token;
    const char* name;
    const char* role;
  };
  for (const Case& c : {Case{kAdminToken, "ops", "admin"},
                        Case{kAliceToken, "alice", "owner"},
                        Case{kAliceWorkerToken, "alice-rack", "worker"},
                        Case{kReaderToken, "dash", "reader"}}) {
    std::unique_ptr<MasterClient> client = Client(c.token);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::ServerInfo> info = ServerInfoOf(*client);
    ASSERT_TRUE(info.ok()) << c.name << ": " << info.status();
    EXPECT_EQ(info->caller(), c.name);
    EXPECT_EQ(info->role(), c.role);
    EXPECT_EQ(info->version(), kMpiLearnVersion);
  }
}

TEST_F(AuthTest, OwnersChangeOnlyTheirOwnJobs) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> admin = Client(kAdminToken);
  std::unique_ptr<MasterClient> alice = Client(kAliceToken);
  std::unique_ptr<MasterClient> bob = Client(kBobToken);
  ASSERT_TRUE(admin && alice && bob);
  const v1::JobSpec spec = FashionMnistSubset("downpour", 2500, 1);
  absl::StatusOr<std::string> alices = alice->SubmitJob(spec);
  ASSERT_TRUE(alices.ok()) << alices.status();
  absl::StatusOr<std::string> bobs = bob->SubmitJob(spec);
  ASSERT_TRUE(bobs.ok()) << bobs.status();

  // A job belongs to the token that submitted it.
  absl::StatusOr<v1::JobStatus> status = admin->GetJobStatus(*alices);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->spec().owner(), "alice");
  status = alice->GetJobStatus(*bobs);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->spec().owner(), "bob");

  // Bob can neither cancel nor delete alice's job.
  constexpr char kManage[] = "owners manage their own";
  ExpectRuleRefusal(bob->CancelJob(*alices, "not mine").status(), kManage,
                    "bob cancels alice's job");
  ExpectRuleRefusal(bob->DeleteJob(*alices), kManage, "bob deletes alice's job");
  status = admin->GetJobStatus(*alices);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_QUEUED);

  // Submissions: no other owner's name, no priority above max_priority
  // (bob's is 5, alice's the default 0); admins may do both.
  constexpr char kSubmitter[] = "jobs belong to their submitter";
  v1::JobSpec as_alice = spec;
  as_alice.set_owner("alice");
  ExpectRuleRefusal(bob->SubmitJob(as_alice).status(), kSubmitter,
                    "bob submits as alice");
  v1::JobSpec urgent = spec;
  urgent.set_priority(6);
  ExpectRuleRefusal(bob->SubmitJob(urgent).status(), kSubmitter,
                    "bob above his max_priority");
  urgent.set_priority(1);
  ExpectRuleRefusal(alice->SubmitJob(urgent).status(), kSubmitter,
                    "alice above her max_priority");
  urgent.set_priority(5);
  absl::StatusOr<std::string> bobs_urgent = bob->SubmitJob(urgent);
  ASSERT_TRUE(bobs_urgent.ok()) << bobs_urgent.status();
  absl::StatusOr<std::string> for_alice = admin->SubmitJob(as_alice);
  ASSERT_TRUE(for_alice.ok()) << for_alice.status();
  status = admin->GetJobStatus(*for_alice);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->spec().owner(), "alice");
  // The study field is MPI Opt's own, whoever submits.
  v1::JobSpec with_study = spec;
  with_study.set_study("s-1");
  for (MasterClient* client : {admin.get(), alice.get()}) {
    const absl::Status refused = client->SubmitJob(with_study).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  }

  // Owners cancel and delete their own; an admin anyone's.
  absl::StatusOr<v1::JobStatus> cancelled = alice->CancelJob(*alices, "mine");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  ExpectRuleRefusal(bob->DeleteJob(*alices), kManage,
                    "bob deletes alice's ended job");
  EXPECT_TRUE(alice->DeleteJob(*alices).ok());
  cancelled = admin->CancelJob(*bobs, "admin");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(bob->CancelJob(*bobs_urgent, "mine").ok());
  EXPECT_TRUE(alice->CancelJob(*for_alice, "mine").ok());
}

TEST_F(AuthTest, AWorkerTokenTrainsOnlyTheOwnersItServes) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  std::unique_ptr<MasterClient> alice = Client(kAliceToken);
  std::unique_ptr<MasterClient> bob = Client(kBobToken);
  std::unique_ptr<MasterClient> rack = Client(kAliceWorkerToken);
  ASSERT_TRUE(alice && bob && rack);
  const v1::JobSpec spec = FashionMnistSubset("downpour", 2500, 1);
  absl::StatusOr<std::string> alices = alice->SubmitJob(spec);
  ASSERT_TRUE(alices.ok()) << alices.status();
  absl::StatusOr<std::string> bobs = bob->SubmitJob(spec);
  ASSERT_TRUE(bobs.ok()) << bobs.status();

  constexpr char kServe[] = "tokens train the owners they serve";
  v1::RegisterGroupRequest registration;
  registration.set_job_id(*bobs);
  registration.set_ranks(1);
  registration.set_host("alice-rack-host");
  ExpectRuleRefusal(rack->RegisterGroup(registration).status(), kServe,
                    "RegisterGroup for bob's job");
  std::vector<float> out(4);
  std::vector<absl::Span<float>> out_spans = {absl::MakeSpan(out)};
  ExpectRuleRefusal(rack->PullWeights(*bobs, "", out_spans).status(), kServe,
                    "PullWeights of bob's job");
  v1::SubscribeSnapshotsRequest subscribe;
  subscribe.set_subscriber("auth test");
  subscribe.add_job_ids(*bobs);
  ExpectRuleRefusal(rack->SubscribeSnapshots(subscribe).status(), kServe,
                    "SubscribeSnapshots of bob's job");
  subscribe.clear_job_ids();
  ExpectRuleRefusal(rack->SubscribeSnapshots(subscribe).status(), kServe,
                    "SubscribeSnapshots of every job");
  // Alice's own job it follows and trains.
  subscribe.add_job_ids(*alices);
  absl::StatusOr<std::unique_ptr<SnapshotStream>> stream =
      rack->SubscribeSnapshots(subscribe);
  ASSERT_TRUE(stream.ok()) << stream.status();
  (*stream)->Cancel();
  registration.set_job_id(*alices);
  absl::StatusOr<v1::RegisterGroupResponse> group = rack->RegisterGroup(registration);
  ASSERT_TRUE(group.ok()) << group.status();
  v1::LeaveRequest leave;  // no error: the job goes on
  leave.set_job_id(*alices);
  leave.set_group_id(group->group_id());
  EXPECT_TRUE(rack->Leave(leave).ok());
  EXPECT_TRUE(alice->CancelJob(*alices, "test over").ok());
  // Asking for any queued job, it is never given bob's (nor the admin's
  // of the other cases): only alice's, or none.
  registration.clear_job_id();
  group = rack->RegisterGroup(registration);
  if (group.ok()) {
    absl::StatusOr<v1::JobStatus> taken = alice->GetJobStatus(group->job_id());
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->spec().owner(), "alice") << group->job_id();
    leave.set_job_id(group->job_id());
    leave.set_group_id(group->group_id());
    EXPECT_TRUE(rack->Leave(leave).ok());
    EXPECT_TRUE(alice->CancelJob(group->job_id(), "test over").ok());
  } else {
    EXPECT_EQ(ReasonOf(group.status()), v1::ERROR_REASON_NO_QUEUED_JOB) << group.status();
  }
  absl::StatusOr<v1::JobStatus> still = bob->GetJobStatus(*bobs);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(bob->CancelJob(*bobs, "test over").ok());
}

TEST_F(AuthTest, OwnersChangeOnlyTheirOwnStudies) {
  if (!HaveFashionMnist()) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  auto alice = v1::Studies::NewStub(Channel(Tls(kAliceToken)));
  auto bob = v1::Studies::NewStub(Channel(Tls(kBobToken)));
  auto admin = v1::Studies::NewStub(Channel(Tls(kAdminToken)));
  v1::CreateStudyRequest create;
  v1::StudySpec& spec = *create.mutable_spec();
  spec = LearningRateStudy(FashionMnistSubset("downpour", 2500, 1), /*trials=*/4,
                           /*parallelism=*/1);
  spec.set_name("alice's");
  spec.set_sampler("external");  // trials only from AskTrial
  v1::CreateStudyResponse created;
  ASSERT_TRUE(StudyCall(*alice, &v1::Studies::Stub::CreateStudy, create, &created).ok());
  const std::string id = created.study_id();
  EXPECT_EQ(created.spec().base().owner(), "alice");

  constexpr char kManage[] = "owners manage their own";
  // Bob cannot create a study in alice's name.
  v1::CreateStudyRequest as_alice = create;
  as_alice.mutable_spec()->mutable_base()->set_owner("alice");
  v1::CreateStudyResponse not_created;
  ExpectRuleRefusal(
      StudyCall(*bob, &v1::Studies::Stub::CreateStudy, as_alice, &not_created),
      "jobs belong to their submitter", "bob creates a study as alice");
  as_alice.mutable_spec()->mutable_base()->clear_owner();
  as_alice.mutable_spec()->mutable_base()->set_study("s-9");
  EXPECT_EQ(StudyCall(*alice, &v1::Studies::Stub::CreateStudy, as_alice, &not_created)
                .code(),
            absl::StatusCode::kInvalidArgument);

  // Alice asks for a trial; bob may neither ask, tell, cancel a trial nor
  // cancel the study.
  v1::AskTrialRequest ask;
  ask.set_study_id(id);
  (*ask.mutable_params())["optimizer.learning_rate"].set_number_value(0.01);
  v1::Trial trial;
  ExpectRuleRefusal(StudyCall(*bob, &v1::Studies::Stub::AskTrial, ask, &trial),
                    kManage, "bob asks alice's study");
  const absl::Status asked = StudyCall(*alice, &v1::Studies::Stub::AskTrial, ask, &trial);
  ASSERT_TRUE(asked.ok()) << asked;
  v1::TellTrialRequest tell;
  tell.set_study_id(id);
  tell.set_trial(trial.number());
  tell.set_state(v1::TRIAL_STATE_COMPLETED);
  tell.set_value(0.5);
  v1::Trial told;
  ExpectRuleRefusal(StudyCall(*bob, &v1::Studies::Stub::TellTrial, tell, &told), kManage,
                    "bob tells alice's study");
  v1::CancelTrialRequest cancel_trial;
  cancel_trial.set_study_id(id);
  cancel_trial.set_trial(trial.number());
  ExpectRuleRefusal(
      StudyCall(*bob, &v1::Studies::Stub::CancelTrial, cancel_trial, &told), kManage,
      "bob cancels alice's trial");
  v1::CancelStudyRequest cancel;
  cancel.set_study_id(id);
  cancel.set_reason("bob's");
  v1::StudyStatus study;
  ExpectRuleRefusal(StudyCall(*bob, &v1::Studies::Stub::CancelStudy, cancel, &study),
                    kManage, "bob cancels alice's study");
  // The trial's job is alice's too.
  std::unique_ptr<MasterClient> reader = Client(kReaderToken);
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<v1::JobStatus> job = reader->GetJobStatus(trial.job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().owner(), "alice");
  EXPECT_EQ(job->spec().study(), id);
  ExpectRuleRefusal(Client(kBobToken)->CancelJob(trial.job_id(), "bob's").status(),
                    kManage, "bob cancels alice's trial job");

  // Alice tells and cancels her own; an admin cancels anyone's.
  const absl::Status told_ok = StudyCall(*alice, &v1::Studies::Stub::TellTrial, tell, &told);
  EXPECT_TRUE(told_ok.ok()) << told_ok;
  cancel.set_reason("alice's");
  const absl::Status cancelled =
      StudyCall(*alice, &v1::Studies::Stub::CancelStudy, cancel, &study);
  ASSERT_TRUE(cancelled.ok()) << cancelled;
  EXPECT_EQ(study.state(), v1::STUDY_STATE_CANCELLED);
  v1::CreateStudyResponse bobs_study;
  ASSERT_TRUE(StudyCall(*bob, &v1::Studies::Stub::CreateStudy, create, &bobs_study).ok());
  cancel.set_study_id(bobs_study.study_id());
  const absl::Status by_admin =
      StudyCall(*admin, &v1::Studies::Stub::CancelStudy, cancel, &study);
  ASSERT_TRUE(by_admin.ok()) << by_admin;
  EXPECT_EQ(study.state(), v1::STUDY_STATE_CANCELLED);
}

TEST_F(AuthTest, MasterRefusesBadSecuritySettingsAtStart) {
  const std::string master = Runfile("server/mpilearn-master");
  struct Case {
    std::vector<std::string> flags;
    const char* expected;
  };
  WriteFileOrDie(*dir_ + "/bad_tokens.txt",
                 "admin alice aaaaaaaaaaaaaaaaaaaa\nroot bob bbbbbbbbbbbbbbbbbbbb\n");
  WriteFileOrDie(*dir_ + "/short.token", "abc\n");
  WriteFileOrDie(*dir_ + "/control.token", "0123456789abcdef\x07\n");
  WriteFileOrDie(*dir_ + "/metrics.token", "0123456789abcdef0123\n");
  const std::vector<Case> cases = {
      {{"--listen=0.0.0.0:0"}, "--insecure"},
      // The metrics endpoint: not on every interface without a token.
      {{"--metrics_listen=0.0.0.0:0"},
       "refusing to serve metrics on '0.0.0.0:0' (not loopback) without "
       "--metrics_token_file"},
      {{"--metrics_listen=127.0.0.1:0,0.0.0.0:0"}, "--metrics_token_file"},
      {{"--metrics_listen=7071"}, "--metrics_token_file"},
      {{"--metrics_listen=127.0.0.1:0", "--metrics_token_file=/nonexistent.token"},
       "--metrics_token_file: '/nonexistent.token' cannot be read"},
      {{"--metrics_listen=127.0.0.1:0",
        "--metrics_token_file=" + *dir_ + "/short.token"},
       "short.token' holds a token of 3 characters"},
      {{"--metrics_listen=127.0.0.1:0",
        "--metrics_token_file=" + *dir_ + "/control.token"},
       "control.token' holds a character outside printable ASCII"},
      {{"--tls_cert=" + *dir_ + "/server.pem"}, "both --tls_cert and --tls_key"},
      {{"--tls_cert=" + *dir_ + "/server.pem", "--tls_key=/nonexistent.key"},
       "--tls_key: cannot read '/nonexistent.key'"},
      {{"--tls_cert=" + *dir_ + "/server.pem",
        "--tls_key=" + *dir_ + "/client.key"},
       "is not the key of the certificate"},
      {{"--tokens_file=" + *dir_ + "/bad_tokens.txt"},
       "bad_tokens.txt:2: unknown role 'root'"},
  };
  int i = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv = {master, "--listen=127.0.0.1:0",
                                     "--metrics_listen=",
                                     "--state_dir=" + *dir_ + "/bad-state"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const std::string log = absl::StrCat(*dir_, "/bad-", i++, ".log");
    auto process = ChildProcess::Start(argv, log);
    ASSERT_TRUE(process.ok()) << process.status();
    const std::optional<int> exit_code = (*process)->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit_code.has_value()) << "still running with " << c.expected;
    EXPECT_NE(*exit_code, 0);
    EXPECT_NE((*process)->Log().find(c.expected), std::string::npos)
        << (*process)->Log();
  }
  // --insecure serves metrics on every interface without a token, as it
  // does the gRPC port; so does a token.
  for (const std::string& allow :
       {std::string("--insecure"),
        "--metrics_token_file=" + *dir_ + "/metrics.token"}) {
    auto master = MasterProcess::Start(
        *dir_ + "/open-metrics-state", {"--metrics_listen=0.0.0.0:0", allow});
    ASSERT_TRUE(master.ok()) << allow << ": " << master.status();
    EXPECT_TRUE((*master)->MetricsPort().ok()) << allow;
  }
}

}  // namespace
}  // namespace mpilearn::testing
