// Sharing one master end to end (server/sched/queue_order.h): the real
// mpilearn-master with a tokens file (owners alice and bob, a worker token)
// on a loopback port, real `mpirun ... mpilearn-worker --serve` groups.
//
//   - fair share: alice's study queues four trials at once, then bob
//     submits one job; bob's job is second in the queue (not fifth, as
//     first come first served would have it), an admin's job of a higher
//     priority goes first, and one serving group starts bob's job before
//     alice's last trial;
//   - group limits: with --max_groups_per_owner=1 and alice holding a group,
//     a group registering for her other job by id is refused
//     (RESOURCE_EXHAUSTED, LIMIT) and two serving groups leave that job
//     queued (with a note naming the limit) while they train bob's; alice
//     never holds two groups (her mpilearn_owner_groups, scraped
//     throughout);
//   - wall-time limits: a trial's job and a plain job with max_wall_seconds
//     end FAILED naming the limit, the trial is not retried, and the
//     serving group goes on and ends cleanly.
//
// Every assertion is about order and state, never about how long training
// takes: jobs that must outlive their limit are slowed by a sleep per
// batch (a floor whatever the machine's speed).
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/client/client_security.h"
#include "common/client/master_client.h"
#include "common/error_reason.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/study.grpc.pb.h"
#include "tests/http_client.h"
#include "tests/study_helpers.h"
#include "tests/test_process.h"

namespace mpilearn::testing {
namespace {

constexpr char kAdminToken[] = "sched-admin-token-0123456789";
constexpr char kAliceToken[] = "sched-alice-token-0123456789";
constexpr char kBobToken[] = "sched-bob-token-0123456789ab";
constexpr char kWorkerToken[] = "sched-worker-token-012345678";

// A master with the tokens above (alice, bob: owners; ops: admin; rack:
// worker) and `flags`; `dir` gets the tokens files.
absl::StatusOr<std::unique_ptr<MasterProcess>> StartMaster(
    const std::string& dir, std::vector<std::string> flags = {}) {
  WriteFileOrDie(dir + "/tokens.txt",
                 absl::StrCat("admin  ops   ", kAdminToken, "\n",
                              "owner  alice ", kAliceToken, "\n",
                              "owner  bob   ", kBobToken, "\n",
                              "worker rack  ", kWorkerToken, "\n"));
  WriteFileOrDie(dir + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
  flags.push_back("--tokens_file=" + dir + "/tokens.txt");
  return MasterProcess::Start(dir + "/state", flags);
}

std::unique_ptr<MasterClient> Client(const std::string& address,
                                     const std::string& token) {
  MasterClient::Options options;
  options.security.token = token;
  options.rpc_timeout = absl::Seconds(20);
  auto client = MasterClient::Connect(address, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::unique_ptr<v1::Studies::Stub> Studies(const std::string& address,
                                           const std::string& token) {
  ClientSecurity security;
  security.token = token;
  auto channel = CreateMasterChannel(address, security, grpc::ChannelArguments());
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? v1::Studies::NewStub(*channel) : nullptr;
}

// One rank serving the queue under the worker token, ending once nothing
// was queued for `idle_s`.
absl::StatusOr<std::unique_ptr<ChildProcess>> ServingGroup(
    const std::string& address, const std::string& dir, const std::string& name,
    int idle_s, std::vector<std::string> flags = {}) {
  flags.insert(flags.end(), {"--serve", "--threads=1", "--progress=off",
                             absl::StrCat("--exit_when_idle_s=", idle_s),
                             "--reconnect_timeout_s=30",
                             "--token_file=" + dir + "/worker.token"});
  return StartWorkers(1, address, flags, absl::StrCat(dir, "/", name, ".log"));
}

bool Ended(const v1::JobStatus& status) {
  return status.state() != v1::JOB_STATE_QUEUED &&
         status.state() != v1::JOB_STATE_RUNNING;
}

// A study of `trials` trials of `base`, all queued at once.
v1::StudySpec StudyOf(const v1::JobSpec& base, int trials) {
  v1::StudySpec spec = LearningRateStudy(base, trials, /*parallelism=*/trials);
  spec.set_name("sched");
  spec.set_seed(5);
  return spec;
}

// What a serving group left: the study's and a job's ends, and how the
// group ended (on its own, idle).
struct Served {
  v1::StudyStatus study;
  v1::JobStatus job;
  int exit_code = -1;
  std::string log;
};

// Waits for `study` to end, then `job_id`, then `group` to exit (each
// within minutes); DEADLINE_EXCEEDED with the group's output otherwise.
absl::StatusOr<Served> WaitForServed(v1::Studies::Stub& studies, const std::string& study,
                                     MasterClient& client, const std::string& job_id,
                                     ChildProcess& group) {
  auto failed = [&](const absl::Status& status) {
    return absl::DeadlineExceededError(
        absl::StrCat(status.message(), "\ngroup output:\n", group.Log()));
  };
  absl::StatusOr<v1::StudyStatus> done =
      WaitForStudy(studies, study, absl::Seconds(300), [](const v1::StudyStatus& s) {
        return s.state() != v1::STUDY_STATE_RUNNING;
      });
  if (!done.ok()) return failed(done.status());
  absl::StatusOr<v1::JobStatus> job = WaitForStatus(client, job_id, absl::Seconds(180), Ended);
  if (!job.ok()) return failed(job.status());
  const std::optional<int> exit_code = group.Wait(absl::Seconds(120));
  if (!exit_code.has_value()) return failed(absl::DeadlineExceededError("the group did not end"));
  return Served{*std::move(done), *std::move(job), *exit_code, group.Log()};
}

// Each trial's job id, by trial number, once all `trials` have one.
absl::StatusOr<std::vector<std::string>> TrialJobs(v1::Studies::Stub& stub,
                                                   const std::string& study,
                                                   int trials) {
  absl::StatusOr<v1::StudyStatus> status =
      WaitForStudy(stub, study, absl::Seconds(60), [&](const v1::StudyStatus& s) {
        if (s.trials_size() < trials) return false;
        for (const v1::Trial& trial : s.trials()) {
          if (trial.job_id().empty()) return false;
        }
        return true;
      });
  if (!status.ok()) return status.status();
  std::vector<std::string> jobs;
  for (const v1::Trial& trial : status->trials()) jobs.push_back(trial.job_id());
  return jobs;
}

// Every QUEUED job's queue_position, by job id, as ListJobs gives them.
std::map<std::string, int> Positions(MasterClient& client) {
  std::map<std::string, int> positions;
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs({v1::JOB_STATE_QUEUED});
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  if (!jobs.ok()) return positions;
  for (const v1::JobStatus& job : *jobs) positions[job.job_id()] = job.queue_position();
  return positions;
}

int PositionOf(MasterClient& client, const std::string& job_id) {
  absl::StatusOr<v1::JobStatus> status = client.GetJobStatus(job_id);
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() ? status->queue_position() : -1;
}

TEST(SchedulingTest, FairShareTakesBobsJobBetweenAlicesTrials) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("sched_fair");
  auto master = StartMaster(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  std::unique_ptr<MasterClient> admin = Client(address, kAdminToken);
  std::unique_ptr<MasterClient> bob = Client(address, kBobToken);
  std::unique_ptr<v1::Studies::Stub> studies = Studies(address, kAliceToken);
  ASSERT_TRUE(admin && bob && studies);

  // Tiny jobs: 500 training images, one epoch.
  const v1::JobSpec tiny = FashionMnistSubset("downpour", 2500, 1);
  constexpr int kTrials = 4;
  absl::StatusOr<std::string> study = CreateStudy(*studies, StudyOf(tiny, kTrials));
  ASSERT_TRUE(study.ok()) << study.status();
  absl::StatusOr<std::vector<std::string>> trials = TrialJobs(*studies, *study, kTrials);
  ASSERT_TRUE(trials.ok()) << trials.status();
  absl::StatusOr<std::string> bobs = bob->SubmitJob(tiny);
  ASSERT_TRUE(bobs.ok()) << bobs.status();

  // Submitted last, bob's job is next after alice's first trial: alice's
  // study then holds a group, bob none.
  std::map<std::string, int> positions = Positions(*admin);
  ASSERT_EQ(positions.size(), static_cast<size_t>(kTrials + 1));
  EXPECT_EQ(positions[(*trials)[0]], 1);
  EXPECT_EQ(positions[*bobs], 2);
  std::set<int> places;
  for (const auto& [job, position] : positions) places.insert(position);
  EXPECT_EQ(places, (std::set<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(PositionOf(*bob, *bobs), 2);

  // A higher priority goes before fair share; once it is gone the order
  // is as it was.
  v1::JobSpec urgent = tiny;
  urgent.set_priority(10);
  absl::StatusOr<std::string> urgents = admin->SubmitJob(urgent);
  ASSERT_TRUE(urgents.ok()) << urgents.status();
  EXPECT_EQ(PositionOf(*admin, *urgents), 1);
  EXPECT_EQ(PositionOf(*admin, (*trials)[0]), 2);
  EXPECT_EQ(PositionOf(*admin, *bobs), 3);
  ASSERT_TRUE(admin->CancelJob(*urgents, "test").ok());
  EXPECT_EQ(PositionOf(*admin, *bobs), 2);

  // One group takes the jobs one at a time. Each job holds it for at
  // least 16 batches x 150 ms (a floor, whatever the machine), longer than
  // the master's tick (at most 1 s) that adds the groups held to each
  // owner's recent use: shorter jobs would leave alice's use unseen.
  auto group = ServingGroup(address, dir, "group", 5, {"--slowdown_ms_per_batch=150"});
  ASSERT_TRUE(group.ok()) << group.status();
  absl::StatusOr<Served> served = WaitForServed(*studies, *study, *bob, *bobs, **group);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->exit_code, 0) << served->log;
  const v1::JobStatus& bobs_end = served->job;
  EXPECT_EQ(bobs_end.state(), v1::JOB_STATE_COMPLETED) << bobs_end.message();
  ASSERT_GT(bobs_end.started_unix_seconds(), 0);
  EXPECT_EQ(served->study.state(), v1::STUDY_STATE_COMPLETED) << served->study.message();
  // Alice's first trial went first; at least one of hers started after
  // bob's (first come first served would have started all four before).
  std::vector<double> starts;
  for (const std::string& job_id : *trials) {
    absl::StatusOr<v1::JobStatus> status = admin->GetJobStatus(job_id);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
    ASSERT_GT(status->started_unix_seconds(), 0) << job_id;
    starts.push_back(status->started_unix_seconds());
  }
  EXPECT_LT(starts[0], bobs_end.started_unix_seconds());
  int after_bob = 0;
  for (double start : starts) after_bob += start > bobs_end.started_unix_seconds();
  EXPECT_GE(after_bob, 1) << "bob's job started after all of alice's trials\n"
                          << served->log;
}

// A metrics scrape's value of `series` (a full series name with labels);
// nullopt when absent.
std::optional<double> MetricValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return std::nullopt;
}

// Scrapes the master's mpilearn_owner_groups for `owner` every 100 ms on
// its own thread until destroyed; keeps the highest value seen.
class OwnerGroupsWatch {
 public:
  OwnerGroupsWatch(int metrics_port, const std::string& owner)
      : series_(absl::StrCat("mpilearn_owner_groups{owner=\"", owner, "\"}")),
        thread_([this, metrics_port] {
          while (!stop_.load()) {
            absl::StatusOr<HttpResponse> scrape = HttpGet(metrics_port, "/metrics");
            if (scrape.ok() && scrape->status == 200) {
              const std::optional<double> value = MetricValue(scrape->body, series_);
              if (value.has_value()) {
                ++scrapes_;
                double seen = most_.load();
                while (*value > seen && !most_.compare_exchange_weak(seen, *value)) {
                }
              }
            }
            absl::SleepFor(absl::Milliseconds(100));
          }
        }) {}
  ~OwnerGroupsWatch() {
    stop_.store(true);
    thread_.join();
  }
  double most() const { return most_.load(); }
  int scrapes() const { return scrapes_.load(); }

 private:
  const std::string series_;
  std::atomic<bool> stop_{false};
  std::atomic<double> most_{0};
  std::atomic<int> scrapes_{0};
  std::thread thread_;  // last: starts once the rest is set
};

TEST(SchedulingTest, AnOwnerHoldsNoMoreGroupsThanItsLimit) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("sched_limits");
  // The group this test registers itself promises no heartbeat: a long
  // group timeout keeps it live for the whole test.
  auto master = StartMaster(dir, {"--max_groups_per_owner=1", "--group_timeout_s=600"});
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  absl::StatusOr<int> metrics_port = (*master)->MetricsPort();
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  std::unique_ptr<MasterClient> alice = Client(address, kAliceToken);
  std::unique_ptr<MasterClient> bob = Client(address, kBobToken);
  std::unique_ptr<MasterClient> rack = Client(address, kWorkerToken);
  ASSERT_TRUE(alice && bob && rack);
  OwnerGroupsWatch watch(*metrics_port, "alice");

  const v1::JobSpec tiny = FashionMnistSubset("downpour", 2500, 1);
  absl::StatusOr<std::string> held = alice->SubmitJob(tiny);
  absl::StatusOr<std::string> waiting = alice->SubmitJob(tiny);
  absl::StatusOr<std::string> bobs = bob->SubmitJob(tiny);
  ASSERT_TRUE(held.ok() && waiting.ok() && bobs.ok());

  // Alice's first job gets a group (this test's, by job id): she holds her
  // limit.
  v1::RegisterGroupRequest registration;
  registration.set_job_id(*held);
  registration.set_ranks(1);
  registration.set_host("holder");
  absl::StatusOr<v1::RegisterGroupResponse> holder = rack->RegisterGroup(registration);
  ASSERT_TRUE(holder.ok()) << holder.status();

  // A group for her other job, named by id, is refused.
  registration.set_job_id(*waiting);
  const absl::Status refused = rack->RegisterGroup(registration).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(ReasonOf(refused), v1::ERROR_REASON_LIMIT) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "owner 'alice' may hold 1 group(s)"))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--max_groups_per_owner")) << refused;
  // In the queue it waits behind bob's, saying why.
  absl::StatusOr<v1::JobStatus> status = bob->GetJobStatus(*waiting);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status->queue_position(), 2);
  EXPECT_TRUE(absl::StrContains(status->queue_note(), "--max_groups_per_owner"))
      << status->queue_note();
  status = bob->GetJobStatus(*bobs);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->queue_position(), 1);
  EXPECT_EQ(status->queue_note(), "");

  // Two serving groups: one trains bob's job; neither takes alice's while
  // she holds her limit.
  std::vector<std::unique_ptr<ChildProcess>> groups;
  for (int g = 0; g < 2; ++g) {
    auto group = ServingGroup(address, dir, absl::StrCat("group-", g), 20);
    ASSERT_TRUE(group.ok()) << group.status();
    groups.push_back(*std::move(group));
  }
  auto logs = [&] {
    std::string all;
    for (auto& group : groups) absl::StrAppend(&all, group->Log(), "\n----\n");
    return all;
  };
  absl::StatusOr<v1::JobStatus> bobs_end =
      WaitForStatus(*bob, *bobs, absl::Seconds(180), Ended);
  ASSERT_TRUE(bobs_end.ok()) << bobs_end.status() << "\n" << logs();
  EXPECT_EQ(bobs_end->state(), v1::JOB_STATE_COMPLETED) << bobs_end->message();
  status = alice->GetJobStatus(*waiting);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_QUEUED) << logs();
  EXPECT_EQ(status->started_unix_seconds(), 0);
  EXPECT_EQ(status->queue_position(), 1);
  EXPECT_TRUE(absl::StrContains(status->queue_note(), "--max_groups_per_owner"))
      << status->queue_note();

  // Once her group is gone, a serving group takes her other job.
  ASSERT_TRUE(alice->CancelJob(*held, "test").ok());
  v1::LeaveRequest leave;
  leave.set_job_id(*held);
  leave.set_group_id(holder->group_id());
  ASSERT_TRUE(rack->Leave(leave).ok());
  absl::StatusOr<v1::JobStatus> waiting_end =
      WaitForStatus(*alice, *waiting, absl::Seconds(180), Ended);
  ASSERT_TRUE(waiting_end.ok()) << waiting_end.status() << "\n" << logs();
  EXPECT_EQ(waiting_end->state(), v1::JOB_STATE_COMPLETED) << waiting_end->message();
  for (auto& group : groups) {
    const std::optional<int> code = group->Wait(absl::Seconds(120));
    ASSERT_TRUE(code.has_value()) << logs();
    EXPECT_EQ(*code, 0) << logs();
  }
  // Scraped throughout: alice held her one group, never two.
  EXPECT_GT(watch.scrapes(), 0);
  EXPECT_EQ(watch.most(), 1);
}

TEST(SchedulingTest, JobsPastTheirWallTimeFailAndTrialsAreNotRetried) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string dir = NewTempDir("sched_wall");
  auto master = StartMaster(dir);
  ASSERT_TRUE(master.ok()) << master.status();
  const std::string address = (*master)->address();
  std::unique_ptr<MasterClient> alice = Client(address, kAliceToken);
  std::unique_ptr<v1::Studies::Stub> studies = Studies(address, kAliceToken);
  ASSERT_TRUE(alice && studies);

  // 20 epochs of 63 batches, each batch followed by a 100 ms sleep (the
  // group's --slowdown_ms_per_batch): over two minutes whatever the
  // machine, against a limit of 3 s.
  v1::JobSpec slow = FashionMnistSubset("downpour", 4000, 20);
  slow.set_max_wall_seconds(3);
  v1::StudySpec spec = StudyOf(slow, 1);
  spec.set_max_retries(2);
  absl::StatusOr<std::string> study = CreateStudy(*studies, spec);
  ASSERT_TRUE(study.ok()) << study.status();
  absl::StatusOr<std::vector<std::string>> trials = TrialJobs(*studies, *study, 1);
  ASSERT_TRUE(trials.ok()) << trials.status();
  absl::StatusOr<std::string> plain = alice->SubmitJob(slow);
  ASSERT_TRUE(plain.ok()) << plain.status();

  auto group = ServingGroup(address, dir, "group", 5, {"--slowdown_ms_per_batch=100"});
  ASSERT_TRUE(group.ok()) << group.status();
  absl::StatusOr<Served> served = WaitForServed(*studies, *study, *alice, *plain, **group);
  ASSERT_TRUE(served.ok()) << served.status();
  // The group went on past both and ended when idle.
  EXPECT_EQ(served->exit_code, 0) << served->log;
  EXPECT_TRUE(absl::StrContains(served->log, "ending after 2 job(s)")) << served->log;

  // Both jobs failed by their limit.
  absl::StatusOr<v1::JobStatus> trial_end = alice->GetJobStatus((*trials)[0]);
  ASSERT_TRUE(trial_end.ok()) << trial_end.status();
  for (const v1::JobStatus& job : {*trial_end, served->job}) {
    SCOPED_TRACE(job.job_id());
    EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.message();
    EXPECT_TRUE(absl::StrContains(job.message(), "max_wall_seconds")) << job.message();
    EXPECT_TRUE(absl::StartsWith(job.stop_reason(), "wall-time limit")) << job.stop_reason();
    EXPECT_GT(job.started_unix_seconds(), 0);
  }
  // The trial failed once, for good: no retry despite max_retries.
  ASSERT_EQ(served->study.trials_size(), 1);
  const v1::Trial& trial = served->study.trials(0);
  EXPECT_EQ(trial.state(), v1::TRIAL_STATE_FAILED) << trial.DebugString();
  EXPECT_EQ(trial.retries(), 0) << trial.DebugString();
  EXPECT_EQ(trial.job_ids_size(), 1) << trial.DebugString();
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = alice->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 2u);
}

}  // namespace
}  // namespace mpilearn::testing
