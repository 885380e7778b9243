// Which queued job a group takes next when it asks for work without naming
// one, and the order `mpilearnctl queue` shows (docs/scheduling.md):
//
//   1. a higher JobSpec.priority first;
//   2. then the owner with the least use per share: (groups its jobs hold
//      now + its recent use) / its share, where recent use is the number of
//      groups it held, averaged with exponentially decaying weights
//      (OwnerUsage), and the share is share= in the tokens file (1 unless
//      it says);
//   3. then the owner served least recently (a group taking one of its jobs
//      is a service), so owners of equal use take turns even when their
//      jobs are too short to show in the average;
//   4. then, within one owner, the study (or lone job) with the least use
//      and then the least recently served the same way, so that a study's
//      many trials take turns with the owner's other work;
//   5. then submission order.
//
// A job whose owner (or study) holds as many groups as its limit allows
// (SchedulingPolicy) is not taken; it is listed after the others with a
// note saying which limit holds it.
//
//   SchedulingPolicy policy;            // from the tokens file and flags
//   std::vector<QueueEntry> jobs = ...;  // every job: queued ones and those
//                                        // holding groups
//   std::vector<QueuePlace> order = OrderQueue(jobs, usage, policy);
//
// Pure functions over plain values; OwnerUsage is not thread-safe (the
// registry guards it).
#ifndef MPILEARN_SERVER_SCHED_QUEUE_ORDER_H_
#define MPILEARN_SERVER_SCHED_QUEUE_ORDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace mpilearn::server {

// What the tokens file says about one owner (a token's name).
struct OwnerPolicy {
  // Fair-share weight (share=): an owner of share 2 gets twice the groups
  // of an owner of share 1 when both have work waiting.
  double share = 1.0;
  // Groups its jobs may hold at once (max_groups=); 0: the master's
  // --max_groups_per_owner.
  int max_groups = 0;
};

struct SchedulingPolicy {
  // By owner name; owners not listed get OwnerPolicy{}.
  absl::flat_hash_map<std::string, OwnerPolicy> owners;
  // --max_groups_per_owner and --max_groups_per_study; 0: no bound.
  int max_groups_per_owner = 0;
  int max_groups_per_study = 0;
  // How fast recent use is forgotten (--fair_share_half_life_s).
  absl::Duration half_life = absl::Hours(1);

  double ShareOf(const std::string& owner) const;
  // The owner's group limit: its max_groups, else max_groups_per_owner.
  int GroupLimitOf(const std::string& owner) const;
};

// One job as the order sees it.
struct QueueEntry {
  std::string job_id;
  int64_t number = 0;  // submission order
  std::string owner;
  std::string study;  // empty: a job of no study
  int priority = 0;
  bool queued = false;  // QUEUED: a candidate; else it only holds groups
  int groups = 0;       // live groups it holds now
};

// The unit fair share compares within an owner: its study, or the job
// itself for a job of no study.
std::string ShareUnit(const QueueEntry& job);

// Recent use: each owner's and each unit's number of groups averaged over
// time with exponentially decaying weights. Advance it as time passes
// (the registry's Tick); entries that decayed to nothing are dropped.
class OwnerUsage {
 public:
  // Moves the averages from the last call to `now` with the groups `jobs`
  // hold now.
  void Advance(const std::vector<QueueEntry>& jobs, absl::Time now,
               absl::Duration half_life);
  double Owner(const std::string& owner) const;
  double Unit(const std::string& unit) const;

  // A group took (or joined) `job`: its owner and unit are the most
  // recently served now.
  void Served(const QueueEntry& job);
  // When the owner or unit was last served: larger is more recent, 0 never.
  int64_t OwnerServed(const std::string& owner) const;
  int64_t UnitServed(const std::string& unit) const;

 private:
  absl::Time last_ = absl::InfinitePast();
  absl::flat_hash_map<std::string, double> owners_;
  absl::flat_hash_map<std::string, double> units_;
  int64_t services_ = 0;
  absl::flat_hash_map<std::string, int64_t> owner_served_;
  absl::flat_hash_map<std::string, int64_t> unit_served_;
};

// A queued job's place.
struct QueuePlace {
  size_t index = 0;  // into the entries given to OrderQueue
  // Empty when a group may take it; otherwise the limit that holds it
  // back ("owner alice holds 2 groups, its limit (max_groups=2)").
  std::string note;
};

// The queued entries of `jobs` in the order groups would take them now, one
// group each: after each pick the picked job's owner and unit count one
// group more and are the most recently served. Held-back jobs follow the
// others, in the same order, each with its note. With `most`, only the
// first `most` jobs a group may take (a group's pick: 1, in one pass), or
// the held-back ones when none may be taken. O(queued^2) for a whole order.
std::vector<QueuePlace> OrderQueue(const std::vector<QueueEntry>& jobs,
                                   const OwnerUsage& usage,
                                   const SchedulingPolicy& policy,
                                   size_t most = SIZE_MAX);

// Why a group may not join `job` now given what `jobs` hold ("" when it
// may): its owner's or its study's group limit.
std::string LimitNote(const QueueEntry& job, const std::vector<QueueEntry>& jobs,
                      const SchedulingPolicy& policy);

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_SCHED_QUEUE_ORDER_H_
