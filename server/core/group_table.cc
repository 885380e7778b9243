#include "server/core/group_table.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/error_reason.h"

namespace mpilearn::server {

bool AppliedSequences::Contains(uint64_t sequence) const {
  if (sequence == 0 || sequence > highest_) return false;
  const uint64_t below = highest_ - sequence;
  return below >= 64 || ((bits_ >> below) & 1) != 0;
}

void AppliedSequences::Add(uint64_t sequence) {
  if (sequence == 0) return;
  if (sequence > highest_) {
    const uint64_t shift = sequence - highest_;
    bits_ = shift >= 64 ? 0 : bits_ << shift;
    bits_ |= 1;
    highest_ = sequence;
  } else if (highest_ - sequence < 64) {
    bits_ |= uint64_t{1} << (highest_ - sequence);
  }
}

std::vector<int64_t> GroupTable::Group::ReleaseUnits() {
  std::vector<int64_t> units;
  for (int64_t* unit : {&held_unit, &reserved_unit}) {
    if (*unit != kNoUnit) units.push_back(*unit);
    *unit = kNoUnit;
  }
  return units;
}

absl::StatusOr<GroupTable::Liveness> GroupTable::CheckHeartbeat(
    double heartbeat_seconds, absl::Duration group_timeout) {
  Liveness liveness;
  liveness.lost_after = group_timeout;
  if (heartbeat_seconds == 0) return liveness;
  // The upper bound forgives rounding: 10.0 / 3 fits a 10 s timeout.
  if (!std::isfinite(heartbeat_seconds) ||
      heartbeat_seconds < absl::ToDoubleSeconds(kMinHeartbeat) ||
      heartbeat_seconds * kMissedHeartbeats >
          absl::ToDoubleSeconds(group_timeout) * (1 + 1e-9)) {
    // Rounded down to the millisecond, so the bound named is allowed.
    const absl::Duration longest =
        absl::Trunc(group_timeout / kMissedHeartbeats, absl::Milliseconds(1));
    return InvalidRequestError(absl::StrCat(
        "heartbeat_seconds ", heartbeat_seconds, " is out of range: give 0 "
        "(no heartbeat) or between ", absl::FormatDuration(kMinHeartbeat),
        " and ", absl::FormatDuration(longest), " (1/", kMissedHeartbeats,
        " of this master's --group_timeout_s ",
        absl::ToDoubleSeconds(group_timeout),
        "); set mpilearn-worker --heartbeat_s accordingly"));
  }
  liveness.heartbeat = absl::Seconds(heartbeat_seconds);
  liveness.lost_after = kMissedHeartbeats * liveness.heartbeat;
  return liveness;
}

void GroupTable::Add(const std::string& group_id, int ranks,
                     const std::string& host, absl::Time now,
                     Liveness liveness) {
  Group& group = groups_[group_id];
  group.ranks = ranks;
  group.host = host;
  group.last_seen = now;
  group.alive = true;
  group.liveness = liveness;
}

absl::Status GroupTable::Touch(const std::string& group_id, absl::Time now,
                               const v1::GroupTelemetry* telemetry) {
  auto it = groups_.find(group_id);
  if (it == groups_.end()) {
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "group '", EchoPrefix(group_id),
                          "' is not registered with job ",
                          job_id_, "; call RegisterGroup first")),
                      v1::ERROR_REASON_GROUP_UNKNOWN);
  }
  if (!it->second.alive) {
    return GroupUnknownError(absl::StrCat(
        "group ", EchoPrefix(group_id), " of job ", job_id_,
        " was declared lost or has left; restart the group to rejoin"));
  }
  it->second.last_seen = now;
  if (telemetry != nullptr) it->second.telemetry = *telemetry;
  return absl::OkStatus();
}

absl::StatusOr<GroupTable::Group*> GroupTable::Active(
    const std::string& group_id) {
  auto it = groups_.find(group_id);
  if (it == groups_.end() || !it->second.alive) {
    return GroupUnknownError(
        absl::StrCat("group ", EchoPrefix(group_id),
                     " is not an active group of job ",
                     job_id_, "; restart the group to rejoin"));
  }
  return &it->second;
}

absl::StatusOr<GroupTable::Group*> GroupTable::Registered(
    const std::string& group_id) {
  Group* group = Find(group_id);
  if (group == nullptr) {
    return WithReason(
        absl::NotFoundError(absl::StrCat(
            "group '", EchoPrefix(group_id), "' is not registered with job ",
            job_id_)),
        v1::ERROR_REASON_GROUP_UNKNOWN);
  }
  return group;
}

GroupTable::Group* GroupTable::Find(const std::string& group_id) {
  auto it = groups_.find(group_id);
  return it == groups_.end() ? nullptr : &it->second;
}

int GroupTable::Live() const {
  int live = 0;
  for (const auto& entry : groups_) live += entry.second.alive ? 1 : 0;
  return live;
}

std::vector<std::string> GroupTable::LiveIds() const {
  std::vector<std::string> ids;
  for (const auto& [id, group] : groups_) {
    if (group.alive) ids.push_back(id);
  }
  return ids;
}

std::vector<std::string> GroupTable::ReapLost(absl::Time now,
                                              absl::Duration timeout) {
  std::vector<std::string> lost;
  for (auto& [group_id, group] : groups_) {
    if (group.alive && now - group.last_seen > LostAfter(group, timeout)) {
      group.alive = false;
      lost.push_back(group_id);
    }
  }
  return lost;
}

absl::Duration GroupTable::LostAfter(const Group& group,
                                     absl::Duration timeout) {
  return group.liveness.lost_after > absl::ZeroDuration()
             ? group.liveness.lost_after
             : timeout;
}

std::string GroupTable::LostAfterText(const Group& group,
                                      absl::Duration timeout) {
  const std::string silent = absl::FormatDuration(LostAfter(group, timeout));
  if (group.liveness.heartbeat > absl::ZeroDuration()) {
    return absl::StrCat("after ", kMissedHeartbeats, " missed heartbeats (",
                        silent, " without contact)");
  }
  return absl::StrCat("after ", silent, " without contact");
}

void GroupTable::FillStatus(absl::Time now, v1::JobStatus* status) const {
  for (const auto& [group_id, group] : groups_) {
    v1::GroupInfo* info = status->add_groups();
    info->set_group_id(group_id);
    info->set_ranks(group.ranks);
    info->set_host(group.host);
    info->set_alive(group.alive);
    info->set_seconds_since_seen(absl::ToDoubleSeconds(now - group.last_seen));
    info->set_units_completed(group.units_completed);
    info->set_samples_trained(group.samples_trained);
    info->set_updates_applied(group.updates_applied);
    info->set_heartbeat_seconds(absl::ToDoubleSeconds(group.liveness.heartbeat));
    info->set_lost_after_seconds(
        absl::ToDoubleSeconds(group.liveness.lost_after));
    if (group.telemetry.has_value()) *info->mutable_telemetry() = *group.telemetry;
  }
}

}  // namespace mpilearn::server
