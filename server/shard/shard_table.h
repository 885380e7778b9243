// The lead master's table of its parameter shards (docs/sharding.md): the
// shards that report to it (ShardSync), which jobs are placed on which
// shards, and what each shard last said of its slices.
//
//   ShardTable table({.shards_per_job = 2});
//   ShardTable::Orders orders = table.Sync(request, now, absl::Seconds(1));
//   absl::StatusOr<v1::ShardPlacement> placed = table.Place("job-000001", 0, now);
//   MPILEARN_RETURN_IF_ERROR(table.AwaitSlices("job-000001", absl::Seconds(10)));
//
// A job is placed once, when its first group registers, on the live shards
// holding the fewest placed jobs (the lowest address on ties), and keeps
// that placement for its life. When a shard reports a slice loaded from a
// checkpoint (a restart), the other shards are ordered to roll their slices
// back to the newest checkpoint version every shard holds, at or below the
// one it loaded, so the job's slices are one state again. A shard is live while it synced within
// Options::lost_after. After a lead restart the table starts empty and
// rebuilds each placement from the shards' reports (every slice names its
// shard index and count), so a job goes on with the shards that hold its
// slices.
//
// Threading: thread-safe; one mutex. Sync and AwaitSlices wait on it (with
// a deadline), so a shard's long poll answers as soon as a placement gives
// it something new.
#ifndef MPILEARN_SERVER_SHARD_SHARD_TABLE_H_
#define MPILEARN_SERVER_SHARD_SHARD_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {

class ShardTable {
 public:
  struct Options {
    // A shard silent for this long is given no new job and is shown as
    // silent in JobStatus.shards.
    absl::Duration lost_after = absl::Seconds(10);
    // mpilearn-master --shards_per_job: shards a job is spread over; 0:
    // every live shard.
    int shards_per_job = 0;
    // mpilearn-master --min_shards: a job is placed only once this many
    // shards are live (Place is UNAVAILABLE until then), so a lead started
    // with its shards never gives a job to itself for want of them.
    int min_shards = 0;
    // ShardPlacement.split_elements handed to the groups (0: the default).
    int64_t split_elements = 0;
  };

  explicit ShardTable(Options options);

  ShardTable(const ShardTable&) = delete;
  ShardTable& operator=(const ShardTable&) = delete;

  // What a shard must do after its report.
  struct Orders {
    // Slices placed on it: job id and which slice.
    std::vector<std::pair<std::string, v1::ShardSlice>> hold;
    // Slices it reported that are not placed on it (a job placed again
    // elsewhere, or forgotten): to stop.
    std::vector<std::string> unplaced;
    // Slices the lead wants sent now (WantSlices): job id and request.
    std::vector<std::pair<std::string, uint64_t>> send;
    // Slices to roll back to their checkpoint of a version (the job's
    // restore set, after another shard restarted): job id and version.
    std::vector<std::pair<std::string, uint64_t>> restore;
  };

  // Records a shard's report (its address, its slices) and returns its
  // orders. When nothing is placed on it that it does not report yet,
  // waits up to `wait` for a placement that gives it a slice. A reported
  // slice of a job with no complete placement is adopted (see the file
  // comment) when `adoptable(job_id)` says the job goes on (called under
  // the table's lock: it must not call the table); only such a job's
  // slices are rolled back after a shard's restart.
  Orders Sync(const v1::ShardSyncRequest& request, absl::Time now, absl::Duration wait,
              const std::function<bool(const std::string&)>& adoptable)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The job's placement, made now when it has none: on min(live shards,
  // Options::shards_per_job, `max_shards`) shards (0 means no bound for
  // either). A placement without addresses: no live shard, the job's
  // weights stay on the lead. UNAVAILABLE while a placement rebuilt from
  // the shards' reports is still missing a shard, or fewer than
  // Options::min_shards are live.
  absl::StatusOr<v1::ShardPlacement> Place(const std::string& job_id, int max_shards,
                                           absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // OK when Place would place the job now or has placed it; Place's
  // UNAVAILABLE while fewer than Options::min_shards are live. Lets a lead
  // refuse a group before registering it.
  absl::Status ReadyToPlace(const std::string& job_id, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every shard of the job's placement reported holding its
  // slice. UNAVAILABLE naming the missing shards after `timeout`;
  // NOT_FOUND for a job not placed.
  absl::Status AwaitSlices(const std::string& job_id, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The job's placement, if it has one with every shard known.
  std::optional<v1::ShardPlacement> PlacementOf(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Each shard's slice of the job as last reported (address and shard
  // index set even before a report), for JobStatus.shards; empty for a job
  // not placed.
  std::vector<v1::ShardSliceStatus> SlicesOf(const std::string& job_id,
                                             absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

  // The newest weight version of which every shard of the job's placement
  // reports a checkpoint (ShardSliceStatus.checkpoint_versions): the set
  // that restores together. 0 when there is none (or no placement).
  uint64_t SetVersion(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Asks every shard of the job's placement to send its slice under
  // `request` (a whole-model view; SliceGather collects them): each shard's
  // next sync, or its long poll now, carries the order once. NOT_FOUND for
  // a job without a complete placement.
  absl::Status WantSlices(const std::string& job_id, uint64_t request) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the job's placement (a deleted job): its shards are told to stop
  // their slices.
  void Forget(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs with a complete placement on shards.
  std::vector<std::string> PlacedJobs() const ABSL_LOCKS_EXCLUDED(mu_);

  // Shards that synced within Options::lost_after.
  int LiveShards(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Shard {
    absl::Time last_seen;
    // Its slices as last reported, by job id.
    std::map<std::string, v1::ShardSliceStatus> slices;
  };
  struct JobPlacement {
    // Shard i's address; empty while a rebuilt placement misses shard i.
    std::vector<std::string> addresses;
    // The newest WantSlices request, and the newest handed to each shard
    // (by address).
    uint64_t wanted = 0;
    std::map<std::string, uint64_t> sent;
    // Per shard index: the restore token it last reported (unset until its
    // first report to this lead, which is taken as it is).
    std::vector<std::optional<uint64_t>> tokens;
    // A roll-back under way (`restore` > 0): to that version, for the
    // shards whose pending[i] is set, done when shard i reports a token
    // other than ordered_token[i] (it loaded a checkpoint since).
    uint64_t restore = 0;
    std::vector<bool> pending;
    std::vector<uint64_t> ordered_token;
    bool complete() const;
  };

  bool LiveLocked(const Shard& shard, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int LiveCountLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE: `job_id` waits for --min_shards, `live` being live.
  absl::Status MinShardsError(const std::string& job_id, int live) const;
  // Whether `address` has a slice placed on it that it did not report, or
  // a slice wanted that it was not asked for yet.
  bool HasNewOrderLocked(const std::string& address) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes shard `index`'s report of the job's slice: a new restore token
  // (the shard restarted from a checkpoint) starts a roll-back of the other
  // shards to the restore set at or below the version it loaded; a new
  // token from a shard ordered to roll back ends its order.
  void NoteRestoreLocked(const std::string& job_id, JobPlacement& placement, size_t index,
                         const v1::ShardSliceStatus& slice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetVersion's newest common version, at most `at_most`.
  uint64_t SetVersionLocked(const std::string& job_id, uint64_t at_most) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shards of the job's placement that do not report its slice.
  std::vector<std::string> MissingLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Shard> shards_ ABSL_GUARDED_BY(mu_);  // by address
  std::map<std::string, JobPlacement> placements_ ABSL_GUARDED_BY(mu_);  // by job id
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_SHARD_SHARD_TABLE_H_
