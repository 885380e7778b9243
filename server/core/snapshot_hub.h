// Publishes jobs' weight snapshots to subscribers (validation pools) without
// ever making the update path wait for them.
//
//   SnapshotHub hub;                      // a JobRegistry observer
//   auto subscription = hub.Subscribe({"job-000001"}, "pool v-1");
//   while (auto delivery = subscription->Next(absl::Seconds(1))) {
//     Validate(delivery->job_id, *delivery->spec, *delivery->weights);
//   }
//   hub.Unsubscribe(*subscription);
//
// Which snapshots are published comes from the job's SnapshotSpec:
// OnUpdateApplied publishes when `snapshots.every_updates` > 0 and the
// job's update count is a multiple of it; OnEpochEnd publishes unless
// `snapshots.at_epoch_end` is false (absent means true). A snapshot already
// published (the same weight version) is not published again; a still
// undelivered copy only takes the newer epoch count.
//
// Each subscriber has one "latest" slot per job. Publishing replaces the
// slot's snapshot (a shared_ptr, no copy of the weights); if the slot still
// held an undelivered one, that one is skipped: counted for the subscriber
// (reported with its next delivery of the job) and for the job. A slow
// subscriber therefore always gets the newest snapshot, never a backlog, and
// costs the publisher a map lookup per subscriber.
//
// When a job ends, it takes no more snapshots and empty slots are dropped;
// a snapshot still waiting in a slot (typically the final epoch's) is still
// delivered, after which the slot goes too.
//
// Threading: thread-safe. Publishing (the JobObserver calls) takes the
// hub's mutex for a few map operations and never waits on a subscriber.
// Each Subscription has one consumer thread calling Next. Subscriptions must
// be released (or at least unsubscribed) before the hub is destroyed.
#ifndef MPILEARN_SERVER_CORE_SNAPSHOT_HUB_H_
#define MPILEARN_SERVER_CORE_SNAPSHOT_HUB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"
#include "server/core/job_observer.h"

namespace mpilearn::server {

class SnapshotHub final : public JobObserver {
 public:
  // One snapshot handed to a subscriber.
  struct Delivery {
    std::string job_id;
    std::shared_ptr<const v1::JobSpec> spec;  // the job's normalized spec
    std::shared_ptr<const WeightsSnapshot> weights;  // version in the header
    int epoch = 0;  // epochs finished when the weights were taken
    // Snapshots of this job published since this subscriber's previous
    // delivery of it and replaced before it asked (never delivered).
    uint64_t skipped = 0;
  };

  // Per job, since the master started.
  struct JobCounters {
    uint64_t published = 0;
    uint64_t skipped = 0;  // summed over subscribers
  };

  class Subscription;

  SnapshotHub() = default;
  SnapshotHub(const SnapshotHub&) = delete;
  SnapshotHub& operator=(const SnapshotHub&) = delete;
  ~SnapshotHub() override;

  // JobObserver: publish per the job's SnapshotSpec; never blocks.
  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec& spec,
                       const AppliedUpdate& update) override;
  void OnEpochEnd(const std::string& job_id, const v1::JobSpec& spec,
                  const std::shared_ptr<const WeightsSnapshot>& weights,
                  int epochs_done) override;
  void OnJobEnded(const std::string& job_id) override;
  void OnJobDeleted(const std::string& job_id) override;

  // A subscriber to the snapshots of `job_ids` (empty: every job, including
  // jobs submitted later) published from now on. `label` names it in logs.
  // After Close(), the subscription starts closed.
  std::shared_ptr<Subscription> Subscribe(const std::vector<std::string>& job_ids,
                                          const std::string& label);

  // Stops the subscription's deliveries and wakes its Next, which then
  // returns nullopt. Idempotent; also done by the Subscription's destructor.
  void Unsubscribe(Subscription& subscription) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every subscription, present and future (server shutdown).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  JobCounters Counters(const std::string& job_id) const;
  // Sets status.snapshots_published / snapshots_skipped from Counters (for
  // GetJobStatus, ListJobs and the metrics).
  void FillCounters(v1::JobStatus& status) const;

 private:
  // One published snapshot, shared by every slot that holds it.
  struct Published {
    std::string job_id;
    std::shared_ptr<const v1::JobSpec> spec;
    std::shared_ptr<const WeightsSnapshot> weights;
    int epoch = 0;
    uint64_t sequence = 0;  // hub-wide publication order
  };

  struct JobEntry {
    // Set at the job's first publication; a job's spec never changes.
    std::shared_ptr<const v1::JobSpec> spec;
    JobCounters counters;
    bool ended = false;
    // Version of the last publication, to publish each version once.
    std::optional<uint64_t> last_version;
  };

  // A subscriber's slot for one job.
  struct Slot {
    std::shared_ptr<const Published> pending;  // null once delivered
    uint64_t skipped = 0;  // replaced undelivered since the last delivery
  };

  struct Subscriber {
    std::set<std::string> job_ids;  // empty: every job
    std::map<std::string, Slot> slots;
    bool Follows(const std::string& job_id) const {
      return job_ids.empty() || job_ids.count(job_id) > 0;
    }
  };

  void Publish(const std::string& job_id, const v1::JobSpec& spec,
               std::shared_ptr<const WeightsSnapshot> weights, int epoch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Subscription::Next and closed().
  std::optional<Delivery> Next(const Subscription& subscription,
                               absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  bool Subscribed(const Subscription& subscription) const ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `subscription` from subscribers_ and wakes it.
  void RemoveLocked(const Subscription& subscription) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  // Live subscriptions; each removes itself (Unsubscribe) before it dies.
  // A subscription not in here is closed.
  std::map<const Subscription*, Subscriber> subscribers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A subscriber's handle. Its slots live in the hub, under the hub's mutex.
class SnapshotHub::Subscription {
 public:
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  ~Subscription();

  // Waits up to `timeout` for an undelivered snapshot and returns it (the
  // one published longest ago when several jobs have one); nullopt on
  // timeout or once closed. One consumer thread only.
  std::optional<Delivery> Next(absl::Duration timeout) {
    return hub_.Next(*this, timeout);
  }

  // Unsubscribed, or the hub closed: Next returns nullopt at once.
  bool closed() const { return !hub_.Subscribed(*this); }

  const std::string& label() const { return label_; }

 private:
  friend class SnapshotHub;

  Subscription(SnapshotHub& hub, std::string label)
      : hub_(hub), label_(std::move(label)) {}

  SnapshotHub& hub_;
  const std::string label_;
  mutable absl::CondVar wake_;  // with hub_.mu_: signalled on publication and close
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_SNAPSHOT_HUB_H_
