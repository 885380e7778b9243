#include "tools/soak/soak_load.h"

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/client/master_client.h"
#include "common/status_macros.h"
#include "proto/mpilearn.pb.h"
#include "tools/soak/soak_group.h"

namespace mpilearn {
namespace soak {
namespace {

constexpr const char* kAlgorithms[] = {"downpour", "sync", "easgd", "gem"};

absl::StatusOr<std::unique_ptr<MasterClient>> Connect(
    const LoadOptions& options) {
  return ConnectOwnChannel(options.address, options.security,
                           options.rpc_timeout);
}

void Backoff(const std::atomic<bool>& stop) {
  for (int i = 0; i < 10 && !stop.load(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace

// The groups that serve one job at a time; member 0 leads (submits,
// initializes, checks and deletes). Hand-offs go through `mu`.
struct GroupsLoad::Team {
  int index = 0;
  int size = 0;
  absl::Mutex mu;
  std::string job_id ABSL_GUARDED_BY(mu);
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // jobs handed to members
  int registered ABSL_GUARDED_BY(mu) =
      0;                             // groups done registering (ok or not)
  int left ABSL_GUARDED_BY(mu) = 0;  // groups done with the job
  bool finished ABSL_GUARDED_BY(mu) = false;  // some group left completed
  uint64_t applied ABSL_GUARDED_BY(mu) = 0;   // pushes applied, all groups
  bool closed ABSL_GUARDED_BY(mu) = false;    // the leader hands out no more
};

GroupsLoad::GroupsLoad(const LoadOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<GroupsLoad>> GroupsLoad::Start(
    const LoadOptions& options, RpcStats& stats) {
  std::unique_ptr<GroupsLoad> load(new GroupsLoad(options));
  const Layout layout = MlpLayout(kGroupHidden);
  std::vector<std::unique_ptr<SimGroup>> groups;
  for (int g = 0; g < options.groups; ++g) {
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<MasterClient> client,
                              Connect(options));
    groups.push_back(std::make_unique<SimGroup>(
        std::move(client), stats, layout, static_cast<uint32_t>(g + 1)));
  }
  // Teams of groups_per_job; the last one takes what is left.
  for (int first = 0; first < options.groups; first += options.groups_per_job) {
    auto team = std::make_unique<Team>();
    team->index = static_cast<int>(load->teams_.size());
    team->size = std::min(options.groups_per_job, options.groups - first);
    load->teams_.push_back(std::move(team));
  }
  GroupsLoad* self = load.get();
  for (int g = 0; g < options.groups; ++g) {
    Team* team = self->teams_[g / options.groups_per_job].get();
    const int member = g % options.groups_per_job;
    std::shared_ptr<SimGroup> group(std::move(groups[g]));
    self->threads_.emplace_back([self, team, member, group] {
      SimGroup& me = *group;
      MasterClient& client = me.client();
      RpcStats& stats = me.stats();
      if (member != 0) {
        uint64_t seen = 0;
        while (true) {
          std::string job_id;
          {
            absl::MutexLock lock(&team->mu);
            auto handed_out =
                [team, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(team->mu) {
                  return team->closed || team->generation > seen;
                };
            team->mu.Await(absl::Condition(&handed_out));
            if (team->generation == seen) return;  // closed
            seen = team->generation;
            job_id = team->job_id;
          }
          auto registered = me.Register(job_id);
          bool ready = registered.ok();
          if (ready && !registered->weights_initialized()) {
            stats.CheckFailed(absl::StrCat("job ", job_id,
                                           ": a second group "
                                           "registered before the weights"));
          }
          if (ready) ready = me.Pull().ok();
          {
            absl::MutexLock lock(&team->mu);
            ++team->registered;
          }
          bool finish = false;
          if (ready) {
            auto outcome = me.Train(self->stop_, kGroupTrainSamples, INT_MAX);
            finish = outcome.ok() && outcome->finish;
          }
          if (registered.ok()) (void)me.Leave(finish);
          absl::MutexLock lock(&team->mu);
          ++team->left;
          team->applied += me.applied();
          team->finished = team->finished || finish;
        }
      }
      // The team's leader.
      for (int n = 0; !self->stop_.load(); ++n) {
        const std::string algorithm = kAlgorithms[(team->index + n) % 4];
        const v1::JobSpec spec = JobSpecFor(
            absl::StrCat("soak-team", team->index, "-job", n, "-", algorithm),
            algorithm, kGroupHidden, kGroupEpochs, kGroupUnitSamples);
        auto job_id = client.SubmitJob(spec);
        stats.Record(Rpc::kSubmitJob, StatusOf(job_id));
        if (!job_id.ok()) {
          Backoff(self->stop_);
          continue;
        }
        auto registered = me.Register(*job_id);
        absl::Status ready = registered.status();
        if (ready.ok() && registered->weights_initialized()) {
          stats.CheckFailed(
              absl::StrCat("job ", *job_id, ": new job has weights already"));
        }
        if (ready.ok()) ready = me.Init();
        if (!ready.ok()) {
          if (registered.ok()) (void)me.Leave(false);
          CancelAndDelete(client, stats, *job_id);
          Backoff(self->stop_);
          continue;
        }
        {
          absl::MutexLock lock(&team->mu);
          team->job_id = *job_id;
          ++team->generation;
          team->registered = 1;
          team->left = 0;
          team->finished = false;
          team->applied = 0;
          auto all_registered = [team]()
                                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(team->mu) {
                                      return team->registered == team->size;
                                    };
          team->mu.Await(absl::Condition(&all_registered));
        }
        auto outcome = me.Train(self->stop_, kGroupTrainSamples, INT_MAX);
        const bool finish = outcome.ok() && outcome->finish;
        (void)me.Leave(finish);
        bool finished = false;
        uint64_t applied = 0;
        {
          absl::MutexLock lock(&team->mu);
          ++team->left;
          team->applied += me.applied();
          team->finished = team->finished || finish;
          auto all_left = [team]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(team->mu) {
            return team->left == team->size;
          };
          team->mu.Await(absl::Condition(&all_left));
          finished = team->finished;
          applied = team->applied;
        }
        if (!finished) {
          // Stopped (or failed) before the end: leave the master clean.
          CancelAndDelete(client, stats, *job_id);
          if (!outcome.ok()) Backoff(self->stop_);
          continue;
        }
        auto status = client.GetJobStatus(*job_id);
        stats.Record(Rpc::kGetJobStatus, StatusOf(status));
        if (status.ok()) {
          const uint64_t samples = kGroupEpochs * kGroupTrainSamples;
          if (status->state() != v1::JOB_STATE_COMPLETED ||
              status->updates_applied() != applied ||
              status->samples_trained() != samples ||
              status->epochs_done() != kGroupEpochs) {
            stats.CheckFailed(absl::StrCat(
                "job ", *job_id, " (", algorithm, "): state ",
                v1::JobState_Name(status->state()), ", updates_applied ",
                status->updates_applied(), ", samples_trained ",
                status->samples_trained(), ", epochs_done ",
                status->epochs_done(), "; the team saw ", applied,
                " pushes applied and expected ", samples, " samples in ",
                kGroupEpochs, " epochs, COMPLETED"));
          }
        }
        self->jobs_completed_.fetch_add(1);
        if (!self->options_.keep_ended) {
          const absl::Status deleted = client.DeleteJob(*job_id);
          stats.Record(Rpc::kDeleteJob, deleted);
        }
      }
      absl::MutexLock lock(&team->mu);
      team->closed = true;
    });
  }
  return load;
}

GroupsLoad::~GroupsLoad() { Stop(); }

void GroupsLoad::Stop() {
  stop_ = true;
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

absl::StatusOr<std::unique_ptr<ChurnLoad>> ChurnLoad::Start(
    const LoadOptions& options, RpcStats& stats) {
  std::unique_ptr<ChurnLoad> load(new ChurnLoad(options));
  const Layout layout = MlpLayout(kChurnHidden);
  const int threads = std::min(options.concurrency, std::max(options.jobs, 1));
  std::vector<std::shared_ptr<SimGroup>> groups;
  for (int t = 0; t < threads; ++t) {
    MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<MasterClient> client,
                              Connect(options));
    groups.push_back(std::make_shared<SimGroup>(
        std::move(client), stats, layout, static_cast<uint32_t>(1000 + t)));
  }
  ChurnLoad* self = load.get();
  self->running_ = threads;
  for (int t = 0; t < threads; ++t) {
    std::shared_ptr<SimGroup> group = groups[t];
    self->threads_.emplace_back([self, group] {
      SimGroup& me = *group;
      MasterClient& client = me.client();
      RpcStats& stats = me.stats();
      const std::atomic<bool> never{false};
      while (!self->stop_.load()) {
        const int index = self->next_job_.fetch_add(1);
        if (index >= self->options_.jobs) break;
        // 0: cancel while running; 1: leave, then cancel the re-queued
        // job; 2: train to the end and complete.
        const int ending = index % 3;
        auto job_id = client.SubmitJob(
            JobSpecFor(absl::StrCat("soak-churn-", index), "downpour",
                       kChurnHidden, 1, kChurnUnitSamples));
        stats.Record(Rpc::kSubmitJob, StatusOf(job_id));
        if (!job_id.ok()) continue;
        auto registered = me.Register(*job_id);
        absl::Status ok = registered.status();
        if (ok.ok()) ok = me.Init();
        absl::StatusOr<SimGroup::Outcome> outcome =
            ok.ok() ? me.Train(never, kChurnTrainSamples,
                               ending == 2 ? INT_MAX : kChurnUnitsBeforeEnd)
                    : absl::StatusOr<SimGroup::Outcome>(ok);
        if (!outcome.ok()) {
          if (registered.ok()) (void)me.Leave(false);
          CancelAndDelete(client, stats, *job_id);
          self->jobs_done_.fetch_add(1);
          continue;
        }
        auto cancel = [&](v1::JobState want) {
          auto cancelled = client.CancelJob(*job_id, "soak churn");
          stats.Record(Rpc::kCancelJob, StatusOf(cancelled));
          if (cancelled.ok() && cancelled->state() != want) {
            stats.CheckFailed(
                absl::StrCat("job ", *job_id, ": CancelJob left it ",
                             v1::JobState_Name(cancelled->state())));
          }
        };
        auto leave = [&](bool completed, v1::JobState want) {
          auto state = me.Leave(completed);
          if (state.ok() && *state != want) {
            stats.CheckFailed(
                absl::StrCat("job ", *job_id, ": Leave(completed=", completed,
                             ") left it ", v1::JobState_Name(*state),
                             ", expected ", v1::JobState_Name(want)));
          }
        };
        if (ending == 0) {
          if (!outcome->holding) {
            stats.CheckFailed(absl::StrCat("job ", *job_id,
                                           ": no unit held "
                                           "after ",
                                           kChurnUnitsBeforeEnd, " of 4"));
          }
          cancel(v1::JOB_STATE_CANCELLED);
          (void)me.Push(/*after_cancel=*/true);
          leave(false, v1::JOB_STATE_CANCELLED);
        } else if (ending == 1) {
          leave(false, v1::JOB_STATE_QUEUED);
          cancel(v1::JOB_STATE_CANCELLED);
        } else {
          if (!outcome->finish) {
            stats.CheckFailed(absl::StrCat("job ", *job_id,
                                           ": trained to "
                                           "DONE without finish"));
          }
          leave(true, v1::JOB_STATE_COMPLETED);
        }
        const absl::Status deleted = client.DeleteJob(*job_id);
        stats.Record(Rpc::kDeleteJob, deleted);
        auto gone = client.GetJobStatus(*job_id);
        stats.Record(Rpc::kGetJobStatus, StatusOf(gone),
                     IsJobUnknown(StatusOf(gone)));
        if (gone.ok() && deleted.ok()) {
          stats.CheckFailed(absl::StrCat("job ", *job_id,
                                         " is still listed after DeleteJob"));
        }
        self->jobs_done_.fetch_add(1);
      }
      self->running_.fetch_sub(1);
    });
  }
  return load;
}

ChurnLoad::~ChurnLoad() {
  Stop();
  Join();
}

void ChurnLoad::Join() {
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

}  // namespace soak
}  // namespace mpilearn
