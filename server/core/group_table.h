// The groups serving one job: who they are, when each was last heard from
// (liveness), what each last reported (telemetry), the data unit each holds
// and what each did (per-group counters, shown in JobStatus.groups).
//
// A group is added by RegisterGroup and stays in the table for the job's
// life; it stops being alive when it leaves or is declared lost, and never
// comes back to life under the same id: it registers again and gets a new
// one.
//
// Liveness: a group that promised heartbeats (RegisterGroupRequest.
// heartbeat_seconds h > 0) is lost after kMissedHeartbeats * h without
// contact; one that promised none after the master's group timeout. Any
// call naming the group is contact (Touch, or a Job method setting
// last_seen), not only Heartbeat.
//
//   MPILEARN_ASSIGN_OR_RETURN(
//       GroupTable::Liveness liveness,
//       GroupTable::CheckHeartbeat(request.heartbeat_seconds(), timeout));
//   GroupTable groups(job_id);
//   groups.Add("g-1", ranks, host, now, liveness);
//   MPILEARN_ASSIGN_OR_RETURN(GroupTable::Group* group, groups.Active("g-1"));
//   for (const std::string& id : groups.ReapLost(now, timeout)) { ... }
//
// Errors carry ERROR_REASON_GROUP_UNKNOWN (common/error_reason.h).
//
// Threading: not thread-safe; a Job calls it under its own mutex.
#ifndef MPILEARN_SERVER_CORE_GROUP_TABLE_H_
#define MPILEARN_SERVER_CORE_GROUP_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

// The push sequence numbers (PushGradientRequest.Header.sequence) of one
// rank that the master applied: the highest, and which of the 63 below it.
// A rank with several updates in flight (ExchangeSpec.updates_in_flight)
// may land them out of order, and each is applied once; a retry of any of
// them (after a lost reply) is recognised. A sequence more than 63 below
// the highest counts as applied (ranks keep at most kMaxUpdatesInFlight
// out). Sequence 0 is never tracked.
class AppliedSequences {
 public:
  bool Contains(uint64_t sequence) const;
  void Add(uint64_t sequence);

 private:
  uint64_t highest_ = 0;
  uint64_t bits_ = 0;  // bit i: highest_ - i was applied
};

// How long a group may stay silent (GroupTable::Liveness).
struct GroupLiveness {
  // The period the group promised to call Heartbeat at; zero: none.
  absl::Duration heartbeat = absl::ZeroDuration();
  // Silent for longer than this: lost. Zero: the timeout ReapLost is given
  // (the master's group timeout).
  absl::Duration lost_after = absl::ZeroDuration();
};

class GroupTable {
 public:
  // No data unit held (DataQueue::kNoUnit).
  static constexpr int64_t kNoUnit = -1;
  // A group with a heartbeat is lost after this many periods without
  // contact.
  static constexpr int kMissedHeartbeats = 3;
  // The shortest heartbeat period a group may promise.
  static constexpr absl::Duration kMinHeartbeat = absl::Milliseconds(100);

  using Liveness = GroupLiveness;

  // The liveness of a group promising `heartbeat_seconds`
  // (RegisterGroupRequest.heartbeat_seconds) to a master whose group
  // timeout is `group_timeout`: 0 means no heartbeat (lost_after is
  // group_timeout); otherwise it must be finite and within [kMinHeartbeat,
  // group_timeout / kMissedHeartbeats], and the group is lost after
  // kMissedHeartbeats periods. INVALID_ARGUMENT
  // (ERROR_REASON_INVALID_REQUEST) naming the bounds otherwise.
  static absl::StatusOr<Liveness> CheckHeartbeat(double heartbeat_seconds,
                                                 absl::Duration group_timeout);

  struct Group {
    int ranks = 0;
    std::string host;
    absl::Time last_seen;
    bool alive = true;
    Liveness liveness;
    // The data unit this group trains now, or kNoUnit. Invariant: kNoUnit
    // once the group is not alive (the job gave its unit back first).
    int64_t held_unit = kNoUnit;
    // The unit reserved for it to train next (read-ahead), or kNoUnit; it
    // becomes held_unit at the group's next request. Invariant: kNoUnit
    // once the group is not alive, as held_unit.
    int64_t reserved_unit = kNoUnit;
    uint64_t units_completed = 0;
    uint64_t samples_trained = 0;
    uint64_t updates_applied = 0;
    // Per rank, the sequence numbers of its applied updates
    // (PushGradientRequest.Header.sequence): a push with one of them is a
    // retry or a late duplicate and is not applied again.
    std::map<int, AppliedSequences> applied_sequences;
    // As the group last reported it (NextDataUnit, Heartbeat).
    std::optional<v1::GroupTelemetry> telemetry;

    // The units the group holds, held then reserved (the order they were
    // handed out), which it no longer does: both become kNoUnit.
    std::vector<int64_t> ReleaseUnits();
  };

  // The groups of job `job_id` (named in messages).
  explicit GroupTable(std::string job_id) : job_id_(std::move(job_id)) {}

  // Adds (or revives) group `group_id`, seen at `now`, silent for at most
  // `liveness` (default: the timeout ReapLost is given).
  void Add(const std::string& group_id, int ranks, const std::string& host,
           absl::Time now, Liveness liveness = {});

  // Marks the group seen at `now` and, when given, keeps `telemetry` as
  // its latest. NOT_FOUND for a group never registered, FAILED_PRECONDITION
  // for one declared lost or gone (both ERROR_REASON_GROUP_UNKNOWN).
  absl::Status Touch(const std::string& group_id, absl::Time now,
                     const v1::GroupTelemetry* telemetry = nullptr);

  // The alive group `group_id`; FAILED_PRECONDITION
  // (ERROR_REASON_GROUP_UNKNOWN) for one unknown, lost or gone. The pointer
  // stays valid for the table's life.
  absl::StatusOr<Group*> Active(const std::string& group_id);

  // The group `group_id`, alive or not; NOT_FOUND
  // (ERROR_REASON_GROUP_UNKNOWN) for one never registered.
  absl::StatusOr<Group*> Registered(const std::string& group_id);

  // The group `group_id` if registered, else null.
  Group* Find(const std::string& group_id);

  // Groups alive.
  int Live() const;
  // Their ids, in id order.
  std::vector<std::string> LiveIds() const;

  // Declares lost (not alive) the groups silent at `now` for longer than
  // their Liveness::lost_after, or than `timeout` for a group without one,
  // and returns their ids in id order. Their units are left for the caller
  // to give back (Group::ReleaseUnits).
  std::vector<std::string> ReapLost(absl::Time now, absl::Duration timeout);

  // How group `group` is declared lost, for messages: "after 3 missed
  // heartbeats (6s without contact)" or "after 1m without contact", with
  // `timeout` for a group without its own limit.
  static std::string LostAfterText(const Group& group, absl::Duration timeout);

  // Adds one GroupInfo per group, in id order, to `status`
  // (lost_after_seconds is 0 for a group added without a limit of its own).
  void FillStatus(absl::Time now, v1::JobStatus* status) const;

 private:
  // The silence after which `group` is lost: its own limit, else `timeout`.
  static absl::Duration LostAfter(const Group& group, absl::Duration timeout);

  const std::string job_id_;
  std::map<std::string, Group> groups_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_GROUP_TABLE_H_
