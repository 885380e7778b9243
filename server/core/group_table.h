// The groups serving one job: who they are, when each was last heard from
// (liveness), what each last reported (telemetry), the data unit each holds
// and what each did (per-group counters, shown in JobStatus.groups).
//
// A group is added by RegisterGroup and stays in the table for the job's
// life; it stops being alive when it leaves or is declared lost (silent for
// longer than the group timeout), and never comes back to life under the
// same id: it registers again and gets a new one.
//
//   GroupTable groups(job_id);
//   groups.Add("g-1", ranks, host, now);
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

class GroupTable {
 public:
  // No data unit held (DataQueue::kNoUnit).
  static constexpr int64_t kNoUnit = -1;

  struct Group {
    int ranks = 0;
    std::string host;
    absl::Time last_seen;
    bool alive = true;
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
    // Per rank, the sequence number of its last applied update
    // (PushGradientRequest.Header.sequence): a push numbered at or below
    // it is a retry or a late duplicate and is not applied again.
    std::map<int, uint64_t> last_sequence;
    // As the group last reported it (NextDataUnit, Heartbeat).
    std::optional<v1::GroupTelemetry> telemetry;

    // The units the group holds, held then reserved (the order they were
    // handed out), which it no longer does: both become kNoUnit.
    std::vector<int64_t> ReleaseUnits();
  };

  // The groups of job `job_id` (named in messages).
  explicit GroupTable(std::string job_id) : job_id_(std::move(job_id)) {}

  // Adds (or revives) group `group_id`, seen at `now`.
  void Add(const std::string& group_id, int ranks, const std::string& host,
           absl::Time now);

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

  // Declares the groups silent for longer than `timeout` at `now` lost (not
  // alive) and returns their ids in id order. Their units are left for the
  // caller to give back (Group::ReleaseUnits).
  std::vector<std::string> ReapLost(absl::Time now, absl::Duration timeout);

  // Adds one GroupInfo per group, in id order, to `status`.
  void FillStatus(absl::Time now, v1::JobStatus* status) const;

 private:
  const std::string job_id_;
  std::map<std::string, Group> groups_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_GROUP_TABLE_H_
