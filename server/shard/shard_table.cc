#include "server/shard/shard_table.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace mpilearn::server {

bool ShardTable::JobPlacement::complete() const {
  return std::none_of(addresses.begin(), addresses.end(),
                      [](const std::string& address) { return address.empty(); });
}

ShardTable::ShardTable(Options options) : options_(std::move(options)) {}

absl::Status ShardTable::MinShardsError(const std::string& job_id, int live) const {
  return absl::UnavailableError(absl::StrCat(
      "job ", job_id, " waits for parameter shards: ", live, " of the ", options_.min_shards,
      " this lead needs (--min_shards) are live; start mpilearn-master --shard_of pointing at "
      "this lead"));
}

bool ShardTable::LiveLocked(const Shard& shard, absl::Time now) const {
  return now - shard.last_seen <= options_.lost_after;
}

int ShardTable::LiveCountLocked(absl::Time now) const {
  int live = 0;
  for (const auto& [address, shard] : shards_) live += LiveLocked(shard, now) ? 1 : 0;
  return live;
}

bool ShardTable::HasNewOrderLocked(const std::string& address) const {
  const auto shard = shards_.find(address);
  for (const auto& [job_id, placement] : placements_) {
    for (const std::string& placed : placement.addresses) {
      if (placed != address) continue;
      if (shard == shards_.end() || shard->second.slices.count(job_id) == 0) return true;
      const auto sent = placement.sent.find(address);
      if (placement.wanted > (sent == placement.sent.end() ? 0 : sent->second)) return true;
    }
    if (placement.restore == 0) continue;
    for (size_t s = 0; s < placement.addresses.size() && s < placement.pending.size(); ++s) {
      if (placement.addresses[s] == address && placement.pending[s]) return true;
    }
  }
  return false;
}

uint64_t ShardTable::SetVersionLocked(const std::string& job_id, uint64_t at_most) const {
  const auto placement = placements_.find(job_id);
  if (placement == placements_.end() || placement->second.addresses.empty()) return 0;
  std::vector<uint64_t> common;
  bool first = true;
  for (const std::string& address : placement->second.addresses) {
    const auto shard = shards_.find(address);
    if (shard == shards_.end()) return 0;
    const auto slice = shard->second.slices.find(job_id);
    if (slice == shard->second.slices.end()) return 0;
    std::vector<uint64_t> versions(slice->second.checkpoint_versions().begin(),
                                   slice->second.checkpoint_versions().end());
    std::sort(versions.begin(), versions.end());
    if (first) {
      common = std::move(versions);
      first = false;
      continue;
    }
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), versions.begin(), versions.end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  for (auto it = common.rbegin(); it != common.rend(); ++it) {
    if (*it <= at_most) return *it;
  }
  return 0;
}

void ShardTable::NoteRestoreLocked(const std::string& job_id, JobPlacement& placement,
                                   size_t index, const v1::ShardSliceStatus& slice) {
  const size_t count = placement.addresses.size();
  if (placement.tokens.size() != count) {
    placement.tokens.assign(count, std::nullopt);
    placement.pending.assign(count, false);
    placement.ordered_token.assign(count, 0);
    placement.restore = 0;
  }
  std::optional<uint64_t>& known = placement.tokens[index];
  const bool changed = known.has_value() && *known != slice.restore_token();
  known = slice.restore_token();
  if (!changed) return;
  if (placement.restore > 0 && placement.pending[index] &&
      slice.restore_token() != placement.ordered_token[index] &&
      slice.restored_version() == placement.restore) {
    placement.pending[index] = false;
    if (std::none_of(placement.pending.begin(), placement.pending.end(),
                     [](bool pending) { return pending; })) {
      LOG(INFO) << "job " << job_id << ": every slice is back at version " << placement.restore;
      placement.restore = 0;
    }
    return;
  }
  // The shard loaded its slice from a checkpoint nobody ordered: it restarted.
  if (slice.restored_version() == 0) return;
  const uint64_t target = SetVersionLocked(job_id, slice.restored_version());
  if (target == 0) {
    LOG(WARNING) << "job " << job_id << ": shard " << index << " restarted from its checkpoint "
                 << "of version " << slice.restored_version() << ", and no version at or below "
                 << "it has a checkpoint on every shard: the slices go on from different "
                 << "versions (set checkpoint.every_updates so that they have)";
    placement.restore = 0;
    placement.pending.assign(count, false);
    return;
  }
  placement.restore = target;
  for (size_t s = 0; s < count; ++s) {
    placement.pending[s] = !(s == index && slice.restored_version() == target);
    placement.ordered_token[s] = placement.tokens[s].value_or(0);
  }
  LOG(INFO) << "job " << job_id << ": shard " << index << " restarted from its checkpoint of "
            << "version " << slice.restored_version() << "; rolling the job's slices back to "
            << "version " << target << ", the newest every shard holds";
}

std::vector<std::string> ShardTable::MissingLocked(const std::string& job_id) const {
  std::vector<std::string> missing;
  const auto placement = placements_.find(job_id);
  if (placement == placements_.end()) return missing;
  for (size_t s = 0; s < placement->second.addresses.size(); ++s) {
    const std::string& address = placement->second.addresses[s];
    const auto shard = shards_.find(address);
    if (address.empty() || shard == shards_.end() || shard->second.slices.count(job_id) == 0) {
      missing.push_back(absl::StrCat(s, " (", address.empty() ? "unknown" : address, ")"));
    }
  }
  return missing;
}

ShardTable::Orders ShardTable::Sync(
    const v1::ShardSyncRequest& request, absl::Time now, absl::Duration wait,
    const std::function<bool(const std::string&)>& adoptable) {
  const std::string& address = request.address();
  absl::MutexLock lock(&mu_);
  Shard& shard = shards_[address];
  shard.last_seen = now;
  shard.slices.clear();
  for (const v1::ShardSliceStatus& slice : request.slices()) {
    shard.slices[slice.job_id()] = slice;
    // A slice of a job the table has no (complete) placement for: the lead
    // restarted. Adopt it, if the job is one to go on.
    const auto placed = placements_.find(slice.job_id());
    if ((placed == placements_.end() || !placed->second.complete()) &&
        slice.shards() >= 1 && slice.shard() >= 0 && slice.shard() < slice.shards() &&
        adoptable(slice.job_id())) {
      JobPlacement& placement = placements_[slice.job_id()];
      if (placement.addresses.empty()) {
        placement.addresses.resize(static_cast<size_t>(slice.shards()));
      }
      const size_t index = static_cast<size_t>(slice.shard());
      if (placement.addresses.size() == static_cast<size_t>(slice.shards()) &&
          placement.addresses[index].empty()) {
        placement.addresses[index] = address;
        if (placement.complete()) {
          LOG(INFO) << "job " << slice.job_id() << ": placement on " << slice.shards()
                    << " shard(s) rebuilt from their reports";
        }
      }
    }
  }
  for (const v1::ShardSliceStatus& slice : request.slices()) {
    const auto placed = placements_.find(slice.job_id());
    if (placed == placements_.end() || !placed->second.complete()) continue;
    // A job that ended on the lead rolls nothing back.
    if (!adoptable(slice.job_id())) {
      placed->second.restore = 0;
      continue;
    }
    const size_t index = static_cast<size_t>(slice.shard());
    if (slice.shard() >= 0 && index < placed->second.addresses.size() &&
        placed->second.addresses[index] == address) {
      NoteRestoreLocked(slice.job_id(), placed->second, index, slice);
    }
  }
  // A long poll: answer when a placement gives this shard a slice it does
  // not hold yet, or after `wait`.
  auto has_order = [this, &address]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasNewOrderLocked(address);
  };
  if (!has_order()) {
    mu_.AwaitWithTimeout(absl::Condition(&has_order), wait);
  }
  Orders orders;
  for (auto& [job_id, placement] : placements_) {
    for (size_t s = 0; s < placement.addresses.size(); ++s) {
      if (placement.addresses[s] != address) continue;
      v1::ShardSlice slice;
      slice.set_shard(static_cast<int>(s));
      slice.set_shards(static_cast<int>(placement.addresses.size()));
      orders.hold.emplace_back(job_id, slice);
      uint64_t& sent = placement.sent[address];
      if (placement.wanted > sent) {
        sent = placement.wanted;
        orders.send.emplace_back(job_id, placement.wanted);
      }
      if (placement.restore > 0 && s < placement.pending.size() && placement.pending[s]) {
        if (adoptable(job_id)) {
          orders.restore.emplace_back(job_id, placement.restore);
        } else {
          placement.restore = 0;  // it ended meanwhile
        }
      }
    }
  }
  for (const auto& [job_id, slice] : shards_[address].slices) {
    const auto placement = placements_.find(job_id);
    const bool placed_here =
        placement != placements_.end() &&
        static_cast<size_t>(slice.shard()) < placement->second.addresses.size() &&
        placement->second.addresses[static_cast<size_t>(slice.shard())] == address;
    if (!placed_here) orders.unplaced.push_back(job_id);
  }
  return orders;
}

absl::StatusOr<v1::ShardPlacement> ShardTable::Place(const std::string& job_id,
                                                     int max_shards, absl::Time now) {
  absl::MutexLock lock(&mu_);
  v1::ShardPlacement result;
  result.set_split_elements(options_.split_elements);
  const auto found = placements_.find(job_id);
  if (found != placements_.end()) {
    if (!found->second.complete()) {
      return absl::UnavailableError(absl::StrCat(
          "job ", job_id, " was sharded before the lead restarted and shards ",
          absl::StrJoin(MissingLocked(job_id), ", "),
          " have not reported their slices yet; the group retries"));
    }
    for (const std::string& address : found->second.addresses) result.add_addresses(address);
    return result;
  }
  // Live shards, those holding the fewest placed jobs first.
  std::map<std::string, int> load;
  for (const auto& [address, shard] : shards_) {
    if (LiveLocked(shard, now)) load[address] = 0;
  }
  for (const auto& [id, placement] : placements_) {
    for (const std::string& address : placement.addresses) {
      const auto it = load.find(address);
      if (it != load.end()) ++it->second;
    }
  }
  if (static_cast<int>(load.size()) < options_.min_shards) {
    return MinShardsError(job_id, static_cast<int>(load.size()));
  }
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [address, jobs] : load) order.emplace_back(jobs, address);
  std::sort(order.begin(), order.end());
  size_t count = order.size();
  if (options_.shards_per_job > 0) count = std::min(count, size_t(options_.shards_per_job));
  if (max_shards > 0) count = std::min(count, size_t(max_shards));
  // Recorded even when empty: a job that started on the lead stays there.
  JobPlacement& placement = placements_[job_id];
  for (size_t s = 0; s < count; ++s) {
    placement.addresses.push_back(order[s].second);
    result.add_addresses(order[s].second);
  }
  return result;
}

absl::Status ShardTable::ReadyToPlace(const std::string& job_id, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (placements_.count(job_id) > 0 || options_.min_shards == 0) return absl::OkStatus();
  const int live = LiveCountLocked(now);
  if (live >= options_.min_shards) return absl::OkStatus();
  return MinShardsError(job_id, live);
}

absl::Status ShardTable::AwaitSlices(const std::string& job_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (placements_.count(job_id) == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not placed on shards"));
  }
  auto all_hold = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return MissingLocked(job_id).empty();
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&all_hold), timeout)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "job ", job_id, ": shards ", absl::StrJoin(MissingLocked(job_id), ", "),
      " did not take their slices within ", absl::FormatDuration(timeout),
      "; are those mpilearn-master --shard_of processes running and reaching this lead?"));
}

std::optional<v1::ShardPlacement> ShardTable::PlacementOf(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const auto found = placements_.find(job_id);
  if (found == placements_.end() || !found->second.complete()) return std::nullopt;
  v1::ShardPlacement result;
  result.set_split_elements(options_.split_elements);
  for (const std::string& address : found->second.addresses) result.add_addresses(address);
  return result;
}

std::vector<v1::ShardSliceStatus> ShardTable::SlicesOf(const std::string& job_id,
                                                       absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ShardSliceStatus> slices;
  const auto placement = placements_.find(job_id);
  if (placement == placements_.end()) return slices;
  const int count = static_cast<int>(placement->second.addresses.size());
  for (int s = 0; s < count; ++s) {
    const std::string& address = placement->second.addresses[static_cast<size_t>(s)];
    v1::ShardSliceStatus slice;
    const auto shard = shards_.find(address);
    if (shard != shards_.end()) {
      const auto reported = shard->second.slices.find(job_id);
      if (reported != shard->second.slices.end()) slice = reported->second;
      slice.set_seconds_since_seen(absl::ToDoubleSeconds(now - shard->second.last_seen));
    }
    slice.set_job_id(job_id);
    slice.set_shard(s);
    slice.set_shards(count);
    slice.set_address(address);
    slices.push_back(std::move(slice));
  }
  return slices;
}

uint64_t ShardTable::SetVersion(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  return SetVersionLocked(job_id, UINT64_MAX);
}

absl::Status ShardTable::WantSlices(const std::string& job_id, uint64_t request) {
  absl::MutexLock lock(&mu_);
  const auto found = placements_.find(job_id);
  if (found == placements_.end() || !found->second.complete() ||
      found->second.addresses.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not placed on shards"));
  }
  found->second.wanted = std::max(found->second.wanted, request);
  return absl::OkStatus();
}

void ShardTable::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  placements_.erase(job_id);
}

std::vector<std::string> ShardTable::PlacedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [job_id, placement] : placements_) {
    if (!placement.addresses.empty() && placement.complete()) jobs.push_back(job_id);
  }
  return jobs;
}

int ShardTable::LiveShards(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return LiveCountLocked(now);
}

}  // namespace mpilearn::server
