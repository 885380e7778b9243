// The lead's whole-model view of a sharded job (docs/sharding.md, "Whole-
// model views"): when a PullWeights or a snapshot for validation pools
// needs the job's weights, the lead asks each of its shards for its slice
// (ShardTable::WantSlices; the shard answers with ReportSlice) and this
// class collects the slices and joins them into the job's layout.
//
//   SliceGather::Ticket ticket = gather.Begin(job_id, {"10.0.0.2:7071", "10.0.0.3:7071"});
//   MPILEARN_RETURN_IF_ERROR(table.WantSlices(job_id, ticket.request()));
//   // ... ReportSlice calls: gather.Deliver(job_id, request, slice) ...
//   absl::StatusOr<SliceGather::Gathered> whole = gather.Await(ticket, timeout);
//
// One gather per job is under way at a time: a second Begin while one is
// joins it. A gather ends when its last slice arrives (the joined model is
// kept for its waiters), when a shard sends an error instead of its slice,
// or when a waiter's timeout passes (UNAVAILABLE naming the shards that
// did not answer); a slice for a gather that ended is refused.
//
// Threading: thread-safe; one mutex. Await blocks; the join itself runs
// outside the lock.
#ifndef MPILEARN_SERVER_SHARD_SLICE_GATHER_H_
#define MPILEARN_SERVER_SHARD_SLICE_GATHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/mpilearn.pb.h"
#include "server/core/job_values.h"

namespace mpilearn::server {

// One shard's slice: its tensors "NAME[BEGIN:END]", each with slice_of set
// (common/shard/sharded_connection.h), as fp32 values.
struct ShardSliceWeights {
  int shard = 0;
  std::string address;
  v1::TensorSetHeader header;
  std::vector<std::vector<float>> values;
};

// Joins the slices of every shard of a placement into the whole layout:
// tensor i named, shaped and flagged as slice_of says, its elements copied
// from the ranges; the version is the sum of the slices' versions (as
// ShardedConnection counts a sharded job's versions), input_shape and
// outputs the first slice's. INVALID_ARGUMENT naming the first tensor that
// is not a slice, disagrees with another slice on its whole tensor, or is
// not covered exactly once.
absl::StatusOr<WeightsSnapshot> JoinSlices(std::vector<ShardSliceWeights> slices);

class SliceGather {
 private:
  struct Pending;

 public:
  struct Gathered {
    std::shared_ptr<const WeightsSnapshot> weights;
    // The slices' versions (updates each applied): equal when every shard
    // had applied the same updates when it read its slice.
    uint64_t oldest_slice = 0;
    uint64_t newest_slice = 0;
  };

  SliceGather() = default;
  SliceGather(const SliceGather&) = delete;
  SliceGather& operator=(const SliceGather&) = delete;

  // A gather begun: its request number (never 0) goes to the shards.
  class Ticket {
   public:
    uint64_t request() const { return request_; }

   private:
    friend class SliceGather;
    uint64_t request_ = 0;
    std::string job_id_;
    std::shared_ptr<Pending> pending_;
  };

  // Starts gathering the job's slices from the shards at `addresses`
  // (index = shard index), or joins the gather under way.
  Ticket Begin(const std::string& job_id, const std::vector<std::string>& addresses)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A shard's slice for `request`, or (`error` not empty) why it sends
  // none, which ends the gather with FAILED_PRECONDITION naming the shard.
  // FAILED_PRECONDITION when no such gather is under way (it ended, or
  // timed out); INVALID_ARGUMENT for a shard index or address that is not
  // the placement's, or a slice sent twice.
  absl::Status Deliver(const std::string& job_id, uint64_t request, ShardSliceWeights slice,
                       const std::string& error = "") ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` for the gather's slices and returns them joined.
  // UNAVAILABLE naming the shards that did not answer in time; a shard's
  // error; JoinSlices' errors. CANCELLED after Close.
  absl::StatusOr<Gathered> Await(const Ticket& ticket, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every wait (shutdown); Begin's gathers then fail at once.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Erases the job's entry if it is still `pending`.
  void EndLocked(const std::string& job_id, const std::shared_ptr<Pending>& pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Pending {
    uint64_t request = 0;
    std::vector<std::string> addresses;
    std::vector<std::optional<ShardSliceWeights>> slices;
    size_t received = 0;
    // Set when the gather ended: its outcome for every waiter.
    std::optional<absl::StatusOr<Gathered>> outcome;
    // A waiter is joining the slices (outside the lock).
    bool joining = false;
  };

  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex mu_;
  uint64_t last_request_ ABSL_GUARDED_BY(mu_) = 0;
  // Gathers under way, by job id.
  std::map<std::string, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_SHARD_SLICE_GATHER_H_
