#include "server/core/caller_bindings.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"

namespace mpilearn::server {
namespace {

// Error messages quote at most this much of an id from a request.
constexpr size_t kMaxQuoted = 64;
// BindGroup drops idle bindings once more than this many are bound.
constexpr size_t kSweepAbove = 1024;

std::string Quoted(absl::string_view text) {
  if (text.size() <= kMaxQuoted) return absl::StrCat("'", text, "'");
  return absl::StrCat("'", text.substr(0, kMaxQuoted), "...'");
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kOwner:
      return "owner";
    case Role::kWorker:
      return "worker";
    case Role::kReader:
      return "reader";
  }
  return "unknown";
}

absl::Status PermissionError(absl::string_view message) {
  return WithReason(absl::PermissionDeniedError(message),
                    v1::ERROR_REASON_PERMISSION);
}

namespace {

// "owner 'alice'" or, for jobs from before owners were kept, "no owner".
std::string OwnerText(const std::string& owner) {
  return owner.empty() ? std::string("no owner") : absl::StrCat("owner '", owner, "'");
}

}  // namespace

absl::Status CheckManages(const Caller& caller, const std::string& owner,
                          absl::string_view what) {
  if (caller.role == Role::kAdmin ||
      (caller.role == Role::kOwner && !owner.empty() && caller.name == owner)) {
    return absl::OkStatus();
  }
  return PermissionError(absl::StrCat(
      what, " has ", OwnerText(owner), "; token '", caller.name, "' (role ",
      RoleName(caller.role),
      ") may change only its own jobs and studies (rule \"owners manage their own\"; "
      "an admin token may change any)"));
}

bool Scoped(const Caller& caller) {
  return caller.role == Role::kOwner || (caller.role != Role::kAdmin && !caller.owners.empty());
}

bool MayTrain(const Caller& caller, const std::string& owner) {
  if (!Scoped(caller)) return true;
  if (caller.role == Role::kOwner && !owner.empty() && owner == caller.name) return true;
  return std::find(caller.owners.begin(), caller.owners.end(), owner) != caller.owners.end();
}

absl::Status CheckTrains(const Caller& caller, const std::string& owner,
                         absl::string_view what) {
  if (MayTrain(caller, owner)) return absl::OkStatus();
  std::string allowed = caller.role == Role::kOwner ? absl::StrCat("'", caller.name, "'") : "";
  for (const std::string& name : caller.owners) {
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", "'", name, "'");
  }
  return PermissionError(absl::StrCat(
      what, " has ", OwnerText(owner), "; token '", caller.name,
      "' trains and reads only the jobs of ", allowed,
      " (rule \"tokens train the owners they serve\": owners= in the tokens file)"));
}

absl::Status CheckSubmission(const Caller& caller, std::string* owner, int priority,
                             absl::string_view what) {
  if (owner->empty()) *owner = caller.name;
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  if (*owner != caller.name) {
    return PermissionError(absl::StrCat(
        what, ": owner '", *owner, "' is not token '", caller.name,
        "'; only an admin submits for another owner (rule \"jobs belong to their "
        "submitter\"): leave owner out"));
  }
  if (priority > caller.max_priority) {
    return PermissionError(absl::StrCat(
        what, ": priority ", priority, " is above token '", caller.name, "''s max_priority ",
        caller.max_priority, " (rule \"jobs belong to their submitter\"; an admin raises "
        "max_priority= in the tokens file)"));
  }
  return absl::OkStatus();
}

CallerBindings::CallerBindings(bool enabled, absl::Duration group_timeout,
                               std::function<absl::Time()> clock)
    : enabled_(enabled),
      group_timeout_(group_timeout),
      clock_(std::move(clock)) {}

absl::Status CallerBindings::BindGroup(const std::string& group_id,
                                       const std::string& job_id,
                                       const Caller& caller) {
  if (!enabled()) return absl::OkStatus();
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  // Groups lost without leaving (their ranks died) leave bindings behind:
  // sweep them once there are more than a few.
  if (groups_.size() >= kSweepAbove) DropIdleLocked(now);
  // Group ids are never reused; should one be, its old binding goes.
  if (auto it = groups_.find(group_id); it != groups_.end()) {
    EraseBindingLocked(it);
  }
  if (groups_.size() >= kMaxBoundGroups) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "the master has ", groups_.size(),
            " active worker groups, its most; wait for some to leave")),
        v1::ERROR_REASON_LIMIT);
  }
  groups_[group_id] = Binding{caller.name, job_id, now};
  owned_[caller.name][job_id].insert(group_id);
  return absl::OkStatus();
}

absl::Status CallerBindings::CheckGroup(absl::string_view group_id,
                                        const Caller& caller) {
  if (!enabled()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const auto it = groups_.find(group_id);
  if (it == groups_.end()) {
    return GroupUnknownError(absl::StrCat(
        "group ", Quoted(group_id),
        " is not registered with this master (lost, left, or from before a "
        "restart): register again"));
  }
  if (it->second.name != caller.name) {
    return PermissionError(absl::StrCat(
        "group ", Quoted(group_id), " was registered by another token than '",
        caller.name, "'"));
  }
  it->second.last_used = clock_();
  return absl::OkStatus();
}

void CallerBindings::UnbindGroup(absl::string_view group_id) {
  if (!enabled()) return;
  absl::MutexLock lock(&mu_);
  const auto it = groups_.find(group_id);
  if (it != groups_.end()) EraseBindingLocked(it);
}

void CallerBindings::EraseBindingLocked(
    absl::flat_hash_map<std::string, Binding>::iterator it) {
  const auto owner = owned_.find(it->second.name);
  if (owner != owned_.end()) {
    const auto job = owner->second.find(it->second.job_id);
    if (job != owner->second.end()) {
      job->second.erase(it->first);
      if (job->second.empty()) owner->second.erase(job);
    }
    if (owner->second.empty()) owned_.erase(owner);
  }
  groups_.erase(it);
}

CallerBindings::Subscription CallerBindings::RecordSubscription(
    const Caller& caller, const std::vector<std::string>& job_ids) {
  Subscription subscription;
  if (!enabled()) return subscription;
  // Distinct ids: a request may name a job twice.
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& id : job_ids) {
    if (seen.insert(id).second) subscription.job_ids_.push_back(id);
  }
  subscription.name_ = caller.name;
  subscription.bindings_ = this;
  absl::MutexLock lock(&mu_);
  Following& following = following_[caller.name];
  if (subscription.job_ids_.empty()) ++following.all_jobs;
  for (const std::string& id : subscription.job_ids_) ++following.jobs[id];
  return subscription;
}

void CallerBindings::ReleaseSubscription(
    const std::string& name, const std::vector<std::string>& job_ids) {
  absl::MutexLock lock(&mu_);
  const auto it = following_.find(name);
  if (it == following_.end()) return;
  Following& following = it->second;
  if (job_ids.empty()) --following.all_jobs;
  for (const std::string& id : job_ids) {
    const auto job = following.jobs.find(id);
    if (job != following.jobs.end() && --job->second <= 0) {
      following.jobs.erase(job);
    }
  }
  if (following.all_jobs <= 0 && following.jobs.empty()) following_.erase(it);
}

absl::Status CallerBindings::CheckValidation(absl::string_view job_id,
                                             const Caller& caller) const {
  if (!enabled() || caller.role >= Role::kAdmin) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    const auto following = following_.find(caller.name);
    if (following != following_.end() &&
        (following->second.all_jobs > 0 ||
         following->second.jobs.contains(job_id))) {
      return absl::OkStatus();
    }
    const auto owner = owned_.find(caller.name);
    if (owner != owned_.end()) {
      const auto job = owner->second.find(job_id);
      if (job != owner->second.end()) {
        const absl::Time cutoff = clock_() - 2 * group_timeout_;
        for (const std::string& group_id : job->second) {
          const auto binding = groups_.find(group_id);
          if (binding != groups_.end() && binding->second.last_used >= cutoff) {
            return absl::OkStatus();
          }
        }
      }
    }
  }
  return PermissionError(absl::StrCat(
      "ReportValidation for job ", Quoted(job_id), ": token '", caller.name,
      "' neither follows this job with an open SubscribeSnapshots stream nor "
      "owns a live group registered for it; report from the validation pool "
      "that received the snapshot, with the token it subscribed with, or "
      "from the job's own group"));
}

size_t CallerBindings::subscribed_names() const {
  absl::MutexLock lock(&mu_);
  return following_.size();
}

CallerBindings::Subscription::Subscription(Subscription&& other) noexcept
    : bindings_(std::exchange(other.bindings_, nullptr)),
      name_(std::move(other.name_)),
      job_ids_(std::move(other.job_ids_)) {}

CallerBindings::Subscription& CallerBindings::Subscription::operator=(
    Subscription&& other) noexcept {
  if (this != &other) {
    Release();
    bindings_ = std::exchange(other.bindings_, nullptr);
    name_ = std::move(other.name_);
    job_ids_ = std::move(other.job_ids_);
  }
  return *this;
}

CallerBindings::Subscription::~Subscription() { Release(); }

void CallerBindings::Subscription::Release() {
  if (bindings_ == nullptr) return;
  bindings_->ReleaseSubscription(name_, job_ids_);
  bindings_ = nullptr;
}

size_t CallerBindings::bound_groups() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

void CallerBindings::DropIdleLocked(absl::Time now) {
  const absl::Time cutoff = now - 2 * group_timeout_;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.last_used < cutoff) {
      EraseBindingLocked(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace mpilearn::server
