#include "server/core/snapshot_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mpilearn::server {

SnapshotHub::~SnapshotHub() {
  absl::MutexLock lock(&mu_);
  CHECK(subscribers_.empty())
      << "SnapshotHub destroyed with " << subscribers_.size()
      << " live subscription(s); release them first";
}

void SnapshotHub::OnUpdateApplied(const std::string& job_id,
                                  const v1::JobSpec& spec,
                                  const AppliedUpdate& update) {
  const int64_t every = spec.snapshots().every_updates();
  if (every <= 0 ||
      update.updates_applied % static_cast<uint64_t>(every) != 0) {
    return;
  }
  Publish(job_id, spec, update.weights, update.epochs_done);
}

void SnapshotHub::OnEpochEnd(
    const std::string& job_id, const v1::JobSpec& spec,
    const std::shared_ptr<const WeightsSnapshot>& weights, int epochs_done) {
  if (spec.snapshots().has_at_epoch_end() && !spec.snapshots().at_epoch_end()) {
    return;
  }
  Publish(job_id, spec, weights, epochs_done);
}

void SnapshotHub::Publish(const std::string& job_id, const v1::JobSpec& spec,
                          std::shared_ptr<const WeightsSnapshot> weights,
                          int epoch) {
  if (weights == nullptr) return;
  const uint64_t version = weights->header.version();
  absl::MutexLock lock(&mu_);
  JobEntry& job = jobs_[job_id];
  if (job.ended) return;
  if (job.last_version == version) {
    // Published already (an update count multiple that also ended an
    // epoch): where still undelivered, it takes the newer epoch count.
    for (auto& [subscription, subscriber] : subscribers_) {
      auto slot = subscriber.slots.find(job_id);
      if (slot == subscriber.slots.end() || slot->second.pending == nullptr ||
          slot->second.pending->weights->header.version() != version) {
        continue;
      }
      auto refreshed = std::make_shared<Published>(*slot->second.pending);
      refreshed->epoch = std::max(refreshed->epoch, epoch);
      slot->second.pending = std::move(refreshed);
    }
    return;
  }
  job.last_version = version;
  if (job.spec == nullptr) job.spec = std::make_shared<const v1::JobSpec>(spec);
  ++job.counters.published;

  std::shared_ptr<Published> published;
  for (auto& [subscription, subscriber] : subscribers_) {
    if (!subscriber.Follows(job_id)) continue;
    if (published == nullptr) {
      published = std::make_shared<Published>();
      published->job_id = job_id;
      published->spec = job.spec;
      published->weights = weights;
      published->epoch = epoch;
      published->sequence = next_sequence_++;
    }
    Slot& slot = subscriber.slots[job_id];
    if (slot.pending != nullptr) {
      ++slot.skipped;
      ++job.counters.skipped;
    }
    slot.pending = published;
    subscription->wake_.Signal();
  }
  VLOG(1) << "job " << job_id << ": published snapshot v" << version
          << " (epoch " << epoch << ")";
}

void SnapshotHub::OnJobEnded(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  // An entry is made even for a job never published, so that a late call
  // publishes nothing.
  JobEntry& job = jobs_[job_id];
  job.ended = true;
  job.spec.reset();
  for (auto& [subscription, subscriber] : subscribers_) {
    auto slot = subscriber.slots.find(job_id);
    if (slot != subscriber.slots.end() && slot->second.pending == nullptr) {
      subscriber.slots.erase(slot);
    }
  }
}

void SnapshotHub::OnJobDeleted(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  for (auto& [subscription, subscriber] : subscribers_) {
    subscriber.slots.erase(job_id);
  }
}

std::shared_ptr<SnapshotHub::Subscription> SnapshotHub::Subscribe(
    const std::vector<std::string>& job_ids, const std::string& label) {
  // The constructor is private to the hub, hence no make_shared.
  std::shared_ptr<Subscription> subscription(new Subscription(*this, label));
  absl::MutexLock lock(&mu_);
  if (!closed_) {
    subscribers_[subscription.get()].job_ids =
        std::set<std::string>(job_ids.begin(), job_ids.end());
  }
  LOG(INFO) << "snapshot subscriber '" << label << "' "
            << (closed_ ? "refused (shutting down)" : "subscribed") << " to "
            << (job_ids.empty() ? "every job"
                                : absl::StrCat(job_ids.size(), " job(s)"));
  return subscription;
}

void SnapshotHub::Unsubscribe(Subscription& subscription) {
  absl::MutexLock lock(&mu_);
  RemoveLocked(subscription);
}

void SnapshotHub::RemoveLocked(const Subscription& subscription) {
  if (subscribers_.erase(&subscription) > 0) {
    LOG(INFO) << "snapshot subscriber '" << subscription.label_
              << "' unsubscribed";
  }
  subscription.wake_.SignalAll();
}

void SnapshotHub::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  while (!subscribers_.empty()) RemoveLocked(*subscribers_.begin()->first);
}

SnapshotHub::JobCounters SnapshotHub::Counters(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? JobCounters() : it->second.counters;
}

bool SnapshotHub::Subscribed(const Subscription& subscription) const {
  absl::MutexLock lock(&mu_);
  return subscribers_.count(&subscription) > 0;
}

std::optional<SnapshotHub::Delivery> SnapshotHub::Next(
    const Subscription& subscription, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  bool timed_out = false;
  while (true) {
    auto found = subscribers_.find(&subscription);
    if (found == subscribers_.end()) return std::nullopt;  // closed
    std::map<std::string, Slot>& slots = found->second.slots;
    // The oldest publication among the jobs with one waiting.
    auto oldest = slots.end();
    for (auto it = slots.begin(); it != slots.end(); ++it) {
      if (it->second.pending == nullptr) continue;
      if (oldest == slots.end() ||
          it->second.pending->sequence < oldest->second.pending->sequence) {
        oldest = it;
      }
    }
    if (oldest != slots.end()) {
      const Published& published = *oldest->second.pending;
      Delivery delivery;
      delivery.job_id = published.job_id;
      delivery.spec = published.spec;
      delivery.weights = published.weights;
      delivery.epoch = published.epoch;
      delivery.skipped = oldest->second.skipped;
      oldest->second.pending.reset();
      oldest->second.skipped = 0;
      auto job = jobs_.find(delivery.job_id);
      if (job != jobs_.end() && job->second.ended) slots.erase(oldest);
      return delivery;
    }
    if (timed_out) return std::nullopt;
    timed_out = subscription.wake_.WaitWithDeadline(&mu_, deadline);
  }
}

SnapshotHub::Subscription::~Subscription() { hub_.Unsubscribe(*this); }

void SnapshotHub::FillCounters(v1::JobStatus& status) const {
  const JobCounters counters = Counters(status.job_id());
  status.set_snapshots_published(counters.published);
  status.set_snapshots_skipped(counters.skipped);
}

}  // namespace mpilearn::server
