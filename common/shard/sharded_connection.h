// The group's side of a sharded parameter service: a MasterConnection whose
// weight calls (InitWeights, PushGradient, PullWeights) go to K shards at
// once, each with its slice of every tensor set (a Placement), and whose
// other calls (registration, data units, epochs, leaving) go to the lead.
// The trainer and its exchanges work on it unchanged: every algorithm's rule
// is elementwise, so applying it slice by slice on the shards is applying
// it to the whole model.
//
//   ShardedConnection connection(lead, {&shard0, &shard1}, placement);
//   connection.PushGradient(header, gradient, weights);  // both in parallel
//
// Versions. Each shard numbers its own weights. A reply's version, as the
// callers see it, is the sum of the shards' versions in that reply; the
// connection remembers which shard versions make up each version it handed
// out (the last kRememberedVersions), so a push computed on a version is
// sent to every shard with that shard's own base version, and each shard
// judges staleness on its slice. A version it no longer remembers is sent
// with each shard's newest version seen.
//
// Slices. A shard's tensor set lists the ranges it holds, in the
// placement's order, as tensors named "NAME[BEGIN:END]" of shape {END -
// BEGIN}, with the tensor's dtype and buffer flag, and the whole tensor's
// index and shape (TensorInfo.slice_of), so a lead can join the slices
// into the whole model (server/shard/slice_gather.h). Every slice of a push
// carries the whole update's norm (Header.update_norm), so a shard clips
// (optimizer.clip_grad_norm) as one master clipping the whole would.
//
// A group's registration on the shards. The lead names the group; the
// group registers on every shard under that id (RegisterGroupRequest.
// group_id) before it offers its initial weights, which every group of a
// sharded job does (a shard that has weights already says so, and the
// group pulls them). Heartbeats and leaving go to the lead and to every
// shard (to a shard without the test results: a slice ends when the lead's
// job ends).
//
// Threading: thread-safe as far as the connections it holds are; concurrent
// PushGradient calls (updates in flight) share only the version table and
// the placement, under a lock.
#ifndef MPILEARN_COMMON_SHARD_SHARDED_CONNECTION_H_
#define MPILEARN_COMMON_SHARD_SHARDED_CONNECTION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/client/master_connection.h"
#include "common/shard/placement.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::shard {

// A slice tensor's name: "NAME[BEGIN:END]" for `range` of tensor `name`;
// ParseSliceName reads one back (false for any other name, or an empty
// range).
std::string SliceName(const std::string& name, const TensorRange& range);
bool ParseSliceName(const std::string& slice, std::string* name, int64_t* begin,
                    int64_t* end);

// The layout `whole` as shard `shard` of `placement` holds it (see the
// file comment), version and the rest copied.
v1::TensorSetHeader SliceHeader(const v1::TensorSetHeader& whole, const Placement& placement,
                                int shard);

class ShardedConnection final : public MasterConnection {
 public:
  static constexpr size_t kRememberedVersions = 64;

  // What a group tells each shard when it registers there.
  struct GroupInfo {
    int ranks = 1;
    std::string host;
    double heartbeat_seconds = 0;
  };

  // Not owned; all must outlive this. `shards` has one connection per shard
  // of `placement`. The group is not registered on the shards (tests).
  ShardedConnection(MasterConnection& lead, std::vector<MasterConnection*> shards,
                    Placement placement);
  // The placement is computed from the first tensor set's sizes
  // (PlaceTensors with `split_elements`), and `group` registers on every
  // shard before InitWeights. `owned` (may be empty) are kept alive with
  // this connection.
  ShardedConnection(MasterConnection& lead, std::vector<MasterConnection*> shards,
                    int64_t split_elements, GroupInfo group,
                    std::vector<std::unique_ptr<MasterConnection>> owned = {});

  // The placement, once known (at construction, or from the first tensor
  // set).
  std::optional<Placement> placement() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<bool> InitWeights(const std::string& job_id, const std::string& group_id,
                                   const v1::TensorSetHeader& header,
                                   absl::Span<const absl::Span<const float>> values) override;
  absl::StatusOr<uint64_t> PushGradient(const v1::PushGradientRequest::Header& header,
                                        absl::Span<const absl::Span<const float>> gradient,
                                        absl::Span<const absl::Span<float>> weights) override;
  absl::StatusOr<uint64_t> PullWeights(const std::string& job_id, const std::string& group_id,
                                       absl::Span<const absl::Span<float>> weights) override;
  void UseWireFormat(const v1::ExchangeSpec& exchange) override;

  // The lead's.
  absl::StatusOr<std::string> SubmitJob(const v1::JobSpec& spec) override {
    return lead_.SubmitJob(spec);
  }
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest& request) override {
    return lead_.RegisterGroup(request);
  }
  // The lead's, unless a shard no longer knows the group (it restarted):
  // then the group leaves the lead (its units go back to the queue) and
  // the answer is the shard's GROUP_UNKNOWN, so the whole group registers
  // again as it does when its master forgot it.
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest& request) override;
  absl::StatusOr<v1::JobState> ReportEpoch(const v1::ReportEpochRequest& request) override {
    return lead_.ReportEpoch(request);
  }
  // The lead's answer; every shard is told too (see the file comment).
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest& request) override;
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& job_id) override {
    return lead_.GetJobStatus(job_id);
  }
  // The lead's answer; the shards hear of the group too (their answers
  // only logged: a push finds out what a shard thinks of the group).
  absl::StatusOr<v1::JobState> Heartbeat(const v1::HeartbeatRequest& request,
                                         absl::Duration timeout) override;
  absl::StatusOr<v1::JobState> LeaveWithin(const v1::LeaveRequest& request,
                                           absl::Duration timeout) override;

 private:
  // `call(s)` for every shard s at once (the last in this thread); the
  // first shard's error, else OK.
  template <typename Call>
  absl::Status OnEveryShard(const Call& call);
  // The placement for tensors of `sizes`: the one given, or computed now
  // from them (and kept; never changed once set).
  absl::StatusOr<const Placement*> PlacementFor(const std::vector<int64_t>& sizes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Registers the group on every shard (GroupInfo), once per group id.
  absl::Status RegisterOnShards(const std::string& job_id, const std::string& group_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Tells every shard the group left (no test results), within `timeout`
  // when given; errors logged.
  void LeaveShards(const v1::LeaveRequest& request, std::optional<absl::Duration> timeout);
  // Notes a shard's GROUP_UNKNOWN for `group_id` (see NextDataUnit);
  // returns `status`.
  absl::Status NoteLostGroup(const std::string& group_id, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers the shard versions of a reply; returns their sum.
  uint64_t Remember(const std::vector<uint64_t>& versions) ABSL_LOCKS_EXCLUDED(mu_);
  // The shard versions behind `version` (see the file comment).
  std::vector<uint64_t> BaseVersions(uint64_t version) ABSL_LOCKS_EXCLUDED(mu_);

  MasterConnection& lead_;
  const std::vector<MasterConnection*> shards_;
  const std::vector<std::unique_ptr<MasterConnection>> owned_;
  const int64_t split_elements_ = 0;
  // Set: register the group on the shards.
  const std::optional<GroupInfo> group_;

  mutable absl::Mutex mu_;
  std::optional<Placement> placement_ ABSL_GUARDED_BY(mu_);
  // The group id registered on the shards.
  std::string registered_group_ ABSL_GUARDED_BY(mu_);
  // A group some shard answered GROUP_UNKNOWN for, and that answer.
  std::string lost_group_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_status_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<uint64_t>> versions_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> newest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::shard

#endif  // MPILEARN_COMMON_SHARD_SHARDED_CONNECTION_H_
