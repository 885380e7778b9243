#include "server/sched/queue_order.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mpilearn::server {
namespace {

// Averages below this are dropped (a group held for a second, an hour's
// half-life ago and a week further back).
constexpr double kForgotten = 1e-9;

// A map's value for `key`, 0 when it has none.
template <typename Value>
Value ValueOr0(const absl::flat_hash_map<std::string, Value>& map, const std::string& key) {
  const auto it = map.find(key);
  return it == map.end() ? Value{0} : it->second;
}

// Live groups by owner, by unit and by study.
struct Counts {
  absl::flat_hash_map<std::string, int> owners;
  absl::flat_hash_map<std::string, int> units;
  absl::flat_hash_map<std::string, int> studies;

  explicit Counts(const std::vector<QueueEntry>& jobs) {
    for (const QueueEntry& job : jobs) {
      if (job.groups <= 0) continue;
      Add(job, job.groups);
    }
  }
  void Add(const QueueEntry& job, int groups) {
    owners[job.owner] += groups;
    units[ShareUnit(job)] += groups;
    if (!job.study.empty()) studies[job.study] += groups;
  }
};

std::string NoteFor(const QueueEntry& job, const Counts& counts,
                    const SchedulingPolicy& policy) {
  const int owner_limit = policy.GroupLimitOf(job.owner);
  if (owner_limit > 0 && ValueOr0(counts.owners, job.owner) >= owner_limit) {
    const auto it = policy.owners.find(job.owner);
    const bool own = it != policy.owners.end() && it->second.max_groups > 0;
    return absl::StrCat("owner '", job.owner, "' may hold ", owner_limit,
                        " group(s) at once (",
                        own ? absl::StrCat("max_groups=", owner_limit,
                                           " in the tokens file")
                            : std::string("mpilearn-master --max_groups_per_owner"),
                        ")");
  }
  if (!job.study.empty() && policy.max_groups_per_study > 0 &&
      ValueOr0(counts.studies, job.study) >= policy.max_groups_per_study) {
    return absl::StrCat("study ", job.study, " may hold ", policy.max_groups_per_study,
                        " group(s) at once (mpilearn-master --max_groups_per_study)");
  }
  return "";
}

}  // namespace

double SchedulingPolicy::ShareOf(const std::string& owner) const {
  const auto it = owners.find(owner);
  return it == owners.end() ? 1.0 : it->second.share;
}

int SchedulingPolicy::GroupLimitOf(const std::string& owner) const {
  const auto it = owners.find(owner);
  if (it != owners.end() && it->second.max_groups > 0) return it->second.max_groups;
  return max_groups_per_owner;
}

std::string ShareUnit(const QueueEntry& job) {
  return job.study.empty() ? absl::StrCat("job ", job.job_id)
                           : absl::StrCat("study ", job.study);
}

void OwnerUsage::Advance(const std::vector<QueueEntry>& jobs, absl::Time now,
                         absl::Duration half_life) {
  if (last_ == absl::InfinitePast() || now <= last_) {
    if (last_ == absl::InfinitePast()) last_ = now;
    return;
  }
  const double elapsed = absl::ToDoubleSeconds(now - last_);
  last_ = now;
  const double half = std::max(1e-3, absl::ToDoubleSeconds(half_life));
  // The weight of what the averages held before: 2^(-elapsed / half-life).
  const double keep = std::exp2(-elapsed / half);
  const Counts counts(jobs);
  auto move = [&](absl::flat_hash_map<std::string, double>& averages,
                  const absl::flat_hash_map<std::string, int>& now_held) {
    for (auto& [name, average] : averages) average *= keep;
    for (const auto& [name, groups] : now_held) {
      averages[name] += (1.0 - keep) * groups;
    }
    absl::erase_if(averages, [](const auto& entry) { return entry.second < kForgotten; });
  };
  move(owners_, counts.owners);
  move(units_, counts.units);
}

double OwnerUsage::Owner(const std::string& owner) const { return ValueOr0(owners_, owner); }

double OwnerUsage::Unit(const std::string& unit) const { return ValueOr0(units_, unit); }

void OwnerUsage::Served(const QueueEntry& job) {
  ++services_;
  owner_served_[job.owner] = services_;
  unit_served_[ShareUnit(job)] = services_;
}

int64_t OwnerUsage::OwnerServed(const std::string& owner) const {
  return ValueOr0(owner_served_, owner);
}

int64_t OwnerUsage::UnitServed(const std::string& unit) const {
  return ValueOr0(unit_served_, unit);
}

std::vector<QueuePlace> OrderQueue(const std::vector<QueueEntry>& jobs,
                                   const OwnerUsage& recorded,
                                   const SchedulingPolicy& policy, size_t most) {
  // Each pick is served in the simulation, as a group taking it would be.
  OwnerUsage usage = recorded;
  Counts counts(jobs);
  std::vector<size_t> waiting;
  std::vector<std::string> units(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].queued) continue;
    waiting.push_back(i);
    units[i] = ShareUnit(jobs[i]);
  }
  // Smaller is taken first.
  using Key = std::tuple<int, double, int64_t, double, int64_t, int64_t>;
  auto key = [&](size_t i) -> Key {
    const QueueEntry& job = jobs[i];
    const double owner_use =
        (ValueOr0(counts.owners, job.owner) + usage.Owner(job.owner)) /
        policy.ShareOf(job.owner);
    const double unit_use = ValueOr0(counts.units, units[i]) + usage.Unit(units[i]);
    return {-job.priority, owner_use, usage.OwnerServed(job.owner), unit_use,
            usage.UnitServed(units[i]), job.number};
  };
  std::vector<QueuePlace> order;
  order.reserve(std::min(waiting.size(), most));
  while (!waiting.empty() && order.size() < most) {
    size_t best = waiting.size();
    Key best_key;
    for (size_t w = 0; w < waiting.size(); ++w) {
      if (!NoteFor(jobs[waiting[w]], counts, policy).empty()) continue;
      Key candidate = key(waiting[w]);
      if (best == waiting.size() || candidate < best_key) {
        best = w;
        best_key = candidate;
      }
    }
    if (best == waiting.size()) break;  // every one left is held back
    const size_t picked = waiting[best];
    order.push_back(QueuePlace{picked, ""});
    counts.Add(jobs[picked], 1);
    usage.Served(jobs[picked]);
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(best));
  }
  if (!order.empty() && order.size() >= most) return order;
  std::vector<std::pair<Key, size_t>> held;
  held.reserve(waiting.size());
  for (size_t i : waiting) held.emplace_back(key(i), i);
  std::sort(held.begin(), held.end());
  for (const auto& [unused, i] : held) {
    order.push_back(QueuePlace{i, NoteFor(jobs[i], counts, policy)});
  }
  return order;
}

std::string LimitNote(const QueueEntry& job, const std::vector<QueueEntry>& jobs,
                      const SchedulingPolicy& policy) {
  return NoteFor(job, Counts(jobs), policy);
}

}  // namespace mpilearn::server
