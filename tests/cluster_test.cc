// Training across hosts: network namespaces as hosts (NetnsCluster), the
// real master on one, a real `mpirun` group whose two ranks are on two
// others, and faults on the links between them; a validation pool and a
// Prometheus on hosts of their own.
//
// The undisturbed run and each fault run train the same job (sync, MLP,
// Fashion-MNIST subset, fixed seed); a fault run must complete within a
// point of the undisturbed run's test accuracy.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/master_client.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "tools/cluster/netns_cluster.h"
#include "tests/prometheus_server.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

using tools::NetnsCluster;

constexpr int64_t kTrainLimit = 12000;  // 10,000 train + 2,000 validation
constexpr int kEpochs = 2;
constexpr double kMinAccuracy = 0.75;
constexpr char kAdminToken[] = "cluster-admin-token-0123456789";
constexpr char kWorkerToken[] = "cluster-worker-token-0123456789";
constexpr char kMetricsToken[] = "cluster-metrics-token-0123456789";

// Host 0 runs the master; a group's two ranks run on hosts 1 and 2, a second
// group's on hosts 3 and 4.
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    absl::StatusOr<std::unique_ptr<NetnsCluster>> cluster = NetnsCluster::Create(5);
    if (!cluster.ok()) {
      GTEST_SKIP() << "no network namespaces on this machine: " << cluster.status();
    }
    cluster_ = *std::move(cluster);
    dir_ = NewTempDir("cluster");
    // TLS with a certificate for the master's own address, and tokens: what
    // a master reachable from other hosts needs.
    const absl::Status made =
        MakeCertificates(dir_, "IP:" + cluster_->address(0));
    ASSERT_TRUE(made.ok()) << made;
    WriteFileOrDie(dir_ + "/tokens.txt", absl::StrCat("admin  test  ", kAdminToken,
                                                      "\nworker hosts ", kWorkerToken,
                                                      "\n"));
    WriteFileOrDie(dir_ + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
    WriteFileOrDie(dir_ + "/metrics.token", absl::StrCat(kMetricsToken, "\n"));
    // A group is declared lost after 10 s without a heartbeat.
    auto master = MasterProcess::StartOn(
        cluster_->address(0), cluster_->InHost(0, {}), dir_ + "/state",
        {"--group_timeout_s=10", "--tls_cert=" + dir_ + "/server.pem",
         "--tls_key=" + dir_ + "/server.key", "--tokens_file=" + dir_ + "/tokens.txt",
         // Metrics on the master's address, for a Prometheus on another host.
         "--metrics_listen=" + cluster_->address(0) + ":0",
         "--metrics_token_file=" + dir_ + "/metrics.token"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    MasterClient::Options options;
    options.security.tls_ca = dir_ + "/ca.pem";
    options.security.token = kAdminToken;
    auto client = MasterClient::Connect(master_->address(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Submits the job and starts the group on hosts 1 and 2.
  std::unique_ptr<ChildProcess> StartJob(const std::string& name) {
    auto job_id = client_->SubmitJob(FashionMnistSubset("sync", kTrainLimit, kEpochs));
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return nullptr;
    job_id_ = *job_id;
    return StartGroup(name, {1, 2});
  }

  // A group of the job with one rank on each of `hosts` (`extra` flags for
  // the workers: a validation pool's).
  std::unique_ptr<ChildProcess> StartGroup(const std::string& name,
                                           const std::vector<int>& hosts,
                                           const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--threads=1", "--tls_ca=" + dir_ + "/ca.pem",
                                      "--token_file=" + dir_ + "/worker.token"};
    if (extra.empty()) flags.push_back("--job_id=" + job_id_);
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto workers = StartWorkers(static_cast<int>(hosts.size()), master_->address(),
                                flags,
                                absl::StrCat(dir_, "/", name, ".log"),
                                cluster_->MpirunArgs(hosts));
    EXPECT_TRUE(workers.ok()) << workers.status();
    return workers.ok() ? *std::move(workers) : nullptr;
  }

  // Waits for the group to end and checks the job completed and trained.
  v1::JobStatus ExpectCompleted(ChildProcess& workers) {
    const std::optional<int> exit_code = workers.Wait(absl::Seconds(300));
    EXPECT_TRUE(exit_code.has_value()) << "workers did not finish in 300 s:\n"
                                       << workers.Log();
    EXPECT_EQ(exit_code.value_or(-1), 0) << workers.Log();
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job_id_);
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return {};
    EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
    EXPECT_TRUE(status->has_test_accuracy());
    EXPECT_GE(status->test_accuracy(), kMinAccuracy) << workers.Log();
    // Every training sample is used once per epoch, faults or not.
    EXPECT_EQ(status->samples_trained(),
              static_cast<uint64_t>((kTrainLimit - 2000) * kEpochs));
    return *status;
  }

  // Waits until the job has applied `updates` updates.
  void WaitForUpdates(uint64_t updates) {
    absl::StatusOr<v1::JobStatus> status = WaitForStatus(
        *client_, job_id_, absl::Seconds(120), [&](const v1::JobStatus& s) {
          return s.updates_applied() >= updates || s.state() == v1::JOB_STATE_COMPLETED;
        });
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_NE(status->state(), v1::JOB_STATE_COMPLETED)
        << "the job ended before the fault; train longer";
  }

  std::unique_ptr<NetnsCluster> cluster_;  // torn down last
  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::unique_ptr<MasterClient> client_;
  std::string job_id_;
};

// The undisturbed run, then a run in which a rank's host loses its link for
// 4 s mid-training and one in which the master's host does: each completes
// every sample within a point of the undisturbed accuracy.
TEST_F(ClusterTest, GroupAcrossHostsTrainsAndRidesOutLinkCuts) {
  std::unique_ptr<ChildProcess> workers = StartJob("undisturbed");
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus undisturbed = ExpectCompleted(*workers);
  // The ranks really ran on hosts 1 and 2: mpirun launched them through the
  // namespace agent, into those hosts' namespaces.
  const std::string launches = ReadFileOrDie(cluster_->agent_log());
  EXPECT_NE(launches.find(cluster_->name(1)), std::string::npos) << launches;
  EXPECT_NE(launches.find(cluster_->name(2)), std::string::npos) << launches;

  for (const int host : {1, 0}) {
    SCOPED_TRACE(host == 0 ? "the master's link cut" : "a rank's link cut");
    workers = StartJob(absl::StrCat("cut_host", host));
    ASSERT_NE(workers, nullptr);
    WaitForUpdates(50);
    ASSERT_TRUE(cluster_->SetLinkUp(host, false).ok());
    absl::SleepFor(absl::Seconds(4));
    ASSERT_TRUE(cluster_->SetLinkUp(host, true).ok());
    // The cut hit a job in training: it had not ended when the link came
    // back (RUNNING, or QUEUED when the master declared the group lost
    // meanwhile and the group has yet to register again).
    absl::StatusOr<v1::JobStatus> after = client_->GetJobStatus(job_id_);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(after->state() == v1::JOB_STATE_RUNNING ||
                after->state() == v1::JOB_STATE_QUEUED)
        << v1::JobState_Name(after->state());
    const v1::JobStatus cut = ExpectCompleted(*workers);
    EXPECT_NEAR(cut.test_accuracy(), undisturbed.test_accuracy(), 0.01);
    std::printf("link of host %d cut for 4 s: test_accuracy=%.4f (undisturbed %.4f)\n",
                host, cut.test_accuracy(), undisturbed.test_accuracy());
  }
}

// Two groups train one job; the second group's leader host is cut off for
// good. The master declares that group lost within its bound, hands its
// unit to the other group, and the job completes every sample there.
TEST_F(ClusterTest, GroupCutOffForGoodIsLostAndTheOtherGroupFinishes) {
  std::unique_ptr<ChildProcess> first = StartJob("first");
  ASSERT_NE(first, nullptr);
  std::unique_ptr<ChildProcess> second = StartGroup("second", {3, 4});
  ASSERT_NE(second, nullptr);
  // Both groups registered and the job is training.
  absl::StatusOr<v1::JobStatus> both = WaitForStatus(
      *client_, job_id_, absl::Seconds(120), [](const v1::JobStatus& s) {
        return (s.groups_size() == 2 && s.updates_applied() >= 20) ||
               s.state() == v1::JOB_STATE_COMPLETED;
      });
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->state(), v1::JOB_STATE_RUNNING) << "the job ended before the fault";
  std::string cut_group;
  double lost_after = 0;
  // The second group's leader printed its group id when it registered.
  const std::string second_log = second->Log();
  for (const v1::GroupInfo& group : both->groups()) {
    if (second_log.find("group " + group.group_id() + " with") != std::string::npos) {
      cut_group = group.group_id();
      lost_after = group.lost_after_seconds();
    }
  }
  ASSERT_FALSE(cut_group.empty()) << "no group id in the second group's output:\n"
                                  << second_log;
  ASSERT_GT(lost_after, 0);
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(cluster_->SetLinkUp(3, false).ok());
  // Declared lost within its bound (plus the master's reaper period and
  // polling; nothing here depends on the machine's speed).
  absl::StatusOr<v1::JobStatus> lost = WaitForStatus(
      *client_, job_id_, absl::Seconds(lost_after + 30), [&](const v1::JobStatus& s) {
        for (const v1::GroupInfo& group : s.groups()) {
          if (group.group_id() == cut_group) return !group.alive();
        }
        return true;  // gone from the list
      });
  ASSERT_TRUE(lost.ok()) << lost.status();
  const double lost_in = absl::ToDoubleSeconds(absl::Now() - cut);
  EXPECT_LE(lost_in, lost_after + 10) << "lost_after_seconds " << lost_after;
  const v1::JobStatus done = ExpectCompleted(*first);
  EXPECT_GE(done.units_requeued(), 1u);
  std::printf("group %s cut off for good: declared lost after %.1f s (bound %.1f s), "
              "test_accuracy=%.4f\n",
              cut_group.c_str(), lost_in, lost_after,
              done.test_accuracy());
  second->Stop(absl::Seconds(2));
}

// A rank's host goes away (every process on it killed, then its link
// down): its group ends, the job goes back to the queue keeping its
// progress, and a group on two other hosts finishes it.
TEST_F(ClusterTest, RankHostGoneEndsItsGroupAndAnotherFinishes) {
  std::unique_ptr<ChildProcess> workers = StartJob("host_gone");
  ASSERT_NE(workers, nullptr);
  WaitForUpdates(50);
  // Host 2 runs the second rank and its mpirun daemon: processes this test
  // started, through mpirun and the namespace agent.
  ASSERT_TRUE(cluster_->KillHostProcesses(2).ok());
  ASSERT_TRUE(cluster_->SetLinkUp(2, false).ok());
  const absl::Time gone = absl::Now();
  // The group ends: mpirun sees its daemon on host 2 vanish and ends the
  // job's ranks (a bound generous enough for a loaded machine: 120 s).
  const std::optional<int> exit_code = workers->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit_code.has_value()) << "the group outlived its host by 120 s:\n"
                                     << workers->Log();
  EXPECT_NE(*exit_code, 0);
  const double ended_in = absl::ToDoubleSeconds(absl::Now() - gone);
  absl::StatusOr<v1::JobStatus> queued = WaitForStatus(
      *client_, job_id_, absl::Seconds(60),
      [](const v1::JobStatus& s) { return s.state() == v1::JOB_STATE_QUEUED; });
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_GT(queued->updates_applied(), 0u);  // its progress is kept
  std::unique_ptr<ChildProcess> next = StartGroup("after_host_gone", {3, 4});
  ASSERT_NE(next, nullptr);
  const v1::JobStatus done = ExpectCompleted(*next);
  std::printf("host 2 gone: its group ended after %.1f s; a group on hosts 3 and 4 "
              "finished the job, test_accuracy=%.4f\n",
              ended_in, done.test_accuracy());
}

// Every piece on a host of its own: a validation pool on host 3 validates
// the snapshots the master publishes while a group on hosts 1 and 2 trains,
// and a real Prometheus on host 4 scrapes the master's metrics over the
// bridge with the metrics token.
TEST_F(ClusterTest, ValidationPoolAndPrometheusOnOtherHosts) {
  if (access(kPrometheus, X_OK) != 0) GTEST_SKIP() << kPrometheus << " is not installed";
  absl::StatusOr<int> metrics_port = master_->MetricsPort();
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  auto prometheus = PrometheusServer::Start(
      dir_,
      {PrometheusServer::ScrapeJob("mpilearn",
                                   absl::StrCat(cluster_->address(0), ":", *metrics_port),
                                   dir_ + "/metrics.token")},
      {cluster_->address(4), cluster_->InHost(4, {})});
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();

  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  spec.mutable_snapshots()->set_every_updates(50);
  spec.set_inband_validation(false);
  auto job_id = client_->SubmitJob(spec);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  job_id_ = *job_id;
  std::unique_ptr<ChildProcess> pool =
      StartGroup("pool", {3}, {"--role=validate", "--jobs=" + job_id_,
                               "--pool_label=remote", "--exit_when_idle_s=10"});
  ASSERT_NE(pool, nullptr);
  // One mpirun at a time: the pool subscribes before training starts.
  ASSERT_TRUE(WaitForLog(*pool, "waiting for snapshots", absl::Seconds(120))) << pool->Log();
  std::unique_ptr<ChildProcess> group = StartGroup("group", {1, 2});
  ASSERT_NE(group, nullptr);
  const v1::JobStatus done = ExpectCompleted(*group);
  // The pool on host 3 reported validations of published snapshots.
  int from_pool = 0;
  for (const v1::ValidationRecord& record : done.validations()) {
    if (record.source().find("remote") != std::string::npos) ++from_pool;
  }
  EXPECT_GT(from_pool, 0) << done.ShortDebugString() << "\n" << pool->Log();

  // Prometheus on host 4 scraped the master across the bridge: the job's
  // update counter reached what the master reports.
  const std::string query =
      absl::StrCat("max(mpilearn_job_updates_applied_total{job_id=\"", job_id_, "\"})");
  absl::StatusOr<double> seen = absl::NotFoundError("not asked yet");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    seen = (*prometheus)->Instant(query);
    if (seen.ok() && *seen == static_cast<double>(done.updates_applied())) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_TRUE(seen.ok()) << seen.status() << "\n" << (*prometheus)->process().Log();
  EXPECT_EQ(*seen, static_cast<double>(done.updates_applied()))
      << (*prometheus)->process().Log();
  std::printf("pool on host 3: %d validations; Prometheus on host 4 saw %llu updates\n",
              from_pool, static_cast<unsigned long long>(done.updates_applied()));
}

}  // namespace
}  // namespace mpilearn::testing
