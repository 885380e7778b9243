#include "common/shard/sharded_connection.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::shard {
namespace {

// `status` with "shard S: " before its message, its payloads (the error
// reason the exchange acts on) kept.
absl::Status OfShard(int shard, const absl::Status& status) {
  absl::Status named(status.code(), absl::StrCat("shard ", shard, ": ", status.message()));
  status.ForEachPayload([&named](absl::string_view type_url, const absl::Cord& payload) {
    named.SetPayload(type_url, payload);
  });
  return named;
}

template <typename T>
std::vector<absl::Span<T>> AsVector(absl::Span<const absl::Span<T>> spans) {
  return std::vector<absl::Span<T>>(spans.begin(), spans.end());
}

template <typename T>
std::vector<int64_t> Sizes(absl::Span<const absl::Span<T>> spans) {
  std::vector<int64_t> sizes;
  sizes.reserve(spans.size());
  for (const absl::Span<T>& span : spans) sizes.push_back(static_cast<int64_t>(span.size()));
  return sizes;
}

}  // namespace

std::string SliceName(const std::string& name, const TensorRange& range) {
  return absl::StrCat(name, "[", range.begin, ":", range.end, "]");
}

bool ParseSliceName(const std::string& slice, std::string* name, int64_t* begin,
                    int64_t* end) {
  const size_t open = slice.rfind('[');
  const size_t colon = slice.rfind(':');
  if (open == std::string::npos || colon == std::string::npos || colon < open ||
      slice.back() != ']') {
    return false;
  }
  *name = slice.substr(0, open);
  return absl::SimpleAtoi(slice.substr(open + 1, colon - open - 1), begin) &&
         absl::SimpleAtoi(slice.substr(colon + 1, slice.size() - colon - 2), end) &&
         *begin >= 0 && *begin < *end;
}

v1::TensorSetHeader SliceHeader(const v1::TensorSetHeader& whole, const Placement& placement,
                                int shard) {
  v1::TensorSetHeader slice = whole;
  slice.clear_tensors();
  for (const TensorRange& range : placement.shards[shard]) {
    const v1::TensorInfo& info = whole.tensors(range.tensor);
    v1::TensorInfo* piece = slice.add_tensors();
    piece->set_name(SliceName(info.name(), range));
    piece->set_dtype(info.dtype());
    piece->add_shape(range.size());
    piece->set_buffer(info.buffer());
    piece->mutable_slice_of()->set_index(range.tensor);
    *piece->mutable_slice_of()->mutable_shape() = info.shape();
  }
  return slice;
}

ShardedConnection::ShardedConnection(MasterConnection& lead,
                                     std::vector<MasterConnection*> shards,
                                     Placement placement)
    : lead_(lead), shards_(std::move(shards)) {
  absl::MutexLock lock(&mu_);
  placement_ = std::move(placement);
  newest_.assign(shards_.size(), 0);
  versions_[0] = newest_;
}

ShardedConnection::ShardedConnection(MasterConnection& lead,
                                     std::vector<MasterConnection*> shards,
                                     int64_t split_elements, GroupInfo group,
                                     std::vector<std::unique_ptr<MasterConnection>> owned)
    : lead_(lead),
      shards_(std::move(shards)),
      owned_(std::move(owned)),
      split_elements_(split_elements),
      group_(std::move(group)) {
  absl::MutexLock lock(&mu_);
  newest_.assign(shards_.size(), 0);
  versions_[0] = newest_;
}

std::optional<Placement> ShardedConnection::placement() const {
  absl::MutexLock lock(&mu_);
  return placement_;
}

absl::StatusOr<const Placement*> ShardedConnection::PlacementFor(
    const std::vector<int64_t>& sizes) {
  absl::MutexLock lock(&mu_);
  if (!placement_.has_value()) {
    absl::StatusOr<Placement> placed =
        PlaceTensors(sizes, static_cast<int>(shards_.size()), split_elements_);
    if (!placed.ok()) return placed.status();
    placement_ = *std::move(placed);
  }
  // Set once, never changed: callers read it without the lock.
  return &*placement_;
}

absl::Status ShardedConnection::RegisterOnShards(const std::string& job_id,
                                                 const std::string& group_id) {
  if (!group_.has_value()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (registered_group_ == group_id) return absl::OkStatus();
  }
  MPILEARN_RETURN_IF_ERROR(OnEveryShard([&](int s) -> absl::Status {
    v1::RegisterGroupRequest request;
    request.set_job_id(job_id);
    request.set_group_id(group_id);
    request.set_ranks(group_->ranks);
    request.set_host(group_->host);
    request.set_heartbeat_seconds(group_->heartbeat_seconds);
    return shards_[s]->RegisterGroup(request).status();
  }));
  absl::MutexLock lock(&mu_);
  registered_group_ = group_id;
  return absl::OkStatus();
}

void ShardedConnection::LeaveShards(const v1::LeaveRequest& request,
                                    std::optional<absl::Duration> timeout) {
  // A shard's slice does not end with a group: the group just goes.
  v1::LeaveRequest plain;
  plain.set_job_id(request.job_id());
  plain.set_group_id(request.group_id());
  const absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    return (timeout.has_value() ? shards_[s]->LeaveWithin(plain, *timeout)
                                : shards_[s]->Leave(plain))
        .status();
  });
  if (!status.ok()) LOG(WARNING) << "leaving the shards: " << status;
}

absl::Status ShardedConnection::NoteLostGroup(const std::string& group_id,
                                              absl::Status status) {
  if (!status.ok() && ReasonOf(status) == v1::ERROR_REASON_GROUP_UNKNOWN) {
    absl::MutexLock lock(&mu_);
    lost_group_ = group_id;
    lost_status_ = status;
  }
  return status;
}

absl::StatusOr<v1::NextDataUnitResponse> ShardedConnection::NextDataUnit(
    const v1::NextDataUnitRequest& request) {
  absl::Status lost;
  {
    absl::MutexLock lock(&mu_);
    if (!lost_group_.empty() && lost_group_ == request.group_id()) lost = lost_status_;
  }
  if (lost.ok()) return lead_.NextDataUnit(request);
  // A plain leave (an error would fail the job): its units go back.
  LOG(WARNING) << "group " << request.group_id() << ": " << lost.message()
               << "; leaving the lead to register again";
  v1::LeaveRequest leave;
  leave.set_job_id(request.job_id());
  leave.set_group_id(request.group_id());
  (void)Leave(leave);
  return lost;
}

absl::StatusOr<v1::JobState> ShardedConnection::Leave(const v1::LeaveRequest& request) {
  absl::StatusOr<v1::JobState> state = lead_.Leave(request);
  LeaveShards(request, std::nullopt);
  return state;
}

absl::StatusOr<v1::JobState> ShardedConnection::LeaveWithin(const v1::LeaveRequest& request,
                                                            absl::Duration timeout) {
  absl::StatusOr<v1::JobState> state = lead_.LeaveWithin(request, timeout);
  LeaveShards(request, timeout);
  return state;
}

absl::StatusOr<v1::JobState> ShardedConnection::Heartbeat(const v1::HeartbeatRequest& request,
                                                          absl::Duration timeout) {
  v1::HeartbeatRequest plain;
  plain.set_job_id(request.job_id());
  plain.set_group_id(request.group_id());
  std::future<absl::Status> shards = std::async(std::launch::async, [&] {
    return OnEveryShard([&](int s) { return shards_[s]->Heartbeat(plain, timeout).status(); });
  });
  absl::StatusOr<v1::JobState> state = lead_.Heartbeat(request, timeout);
  const absl::Status shard_status = shards.get();
  if (!shard_status.ok()) LOG(WARNING) << "heartbeat: " << shard_status;
  return state;
}

template <typename Call>
absl::Status ShardedConnection::OnEveryShard(const Call& call) {
  const int k = static_cast<int>(shards_.size());
  std::vector<std::future<absl::Status>> others;
  for (int s = 0; s + 1 < k; ++s) {
    others.push_back(std::async(std::launch::async, [&call, s] { return call(s); }));
  }
  const absl::Status last = call(k - 1);
  absl::Status result = absl::OkStatus();
  for (int s = 0; s + 1 < k; ++s) {
    const absl::Status status = others[s].get();
    if (result.ok() && !status.ok()) result = OfShard(s, status);
  }
  if (result.ok() && !last.ok()) result = OfShard(k - 1, last);
  return result;
}

uint64_t ShardedConnection::Remember(const std::vector<uint64_t>& versions) {
  const uint64_t sum = std::accumulate(versions.begin(), versions.end(), uint64_t{0});
  absl::MutexLock lock(&mu_);
  for (size_t s = 0; s < versions.size(); ++s) newest_[s] = std::max(newest_[s], versions[s]);
  versions_[sum] = versions;
  while (versions_.size() > kRememberedVersions) versions_.erase(versions_.begin());
  return sum;
}

std::vector<uint64_t> ShardedConnection::BaseVersions(uint64_t version) {
  absl::MutexLock lock(&mu_);
  const auto found = versions_.find(version);
  return found != versions_.end() ? found->second : newest_;
}

absl::StatusOr<bool> ShardedConnection::InitWeights(
    const std::string& job_id, const std::string& group_id, const v1::TensorSetHeader& header,
    absl::Span<const absl::Span<const float>> values) {
  MPILEARN_ASSIGN_OR_RETURN(const Placement* placement, PlacementFor(Sizes(values)));
  absl::StatusOr<std::vector<std::vector<absl::Span<const float>>>> slices =
      SliceViews(*placement, AsVector(values));
  if (!slices.ok()) return slices.status();
  MPILEARN_RETURN_IF_ERROR(RegisterOnShards(job_id, group_id));
  std::vector<char> accepted(shards_.size(), 0);
  absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    absl::StatusOr<bool> taken = shards_[s]->InitWeights(
        job_id, group_id, SliceHeader(header, *placement, s), (*slices)[s]);
    if (!taken.ok()) return taken.status();
    accepted[s] = *taken ? 1 : 0;
    return absl::OkStatus();
  });
  if (!status.ok()) return NoteLostGroup(group_id, status);
  const size_t taken = std::count(accepted.begin(), accepted.end(), 1);
  if (taken != 0 && taken != accepted.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(taken, " of ", accepted.size(),
                     " shards took this group's initial weights and the others another "
                     "group's: the shards' weights do not come from one model"));
  }
  return taken != 0;
}

absl::StatusOr<uint64_t> ShardedConnection::PushGradient(
    const v1::PushGradientRequest::Header& header,
    absl::Span<const absl::Span<const float>> gradient,
    absl::Span<const absl::Span<float>> weights) {
  MPILEARN_ASSIGN_OR_RETURN(const Placement* placement, PlacementFor(Sizes(gradient)));
  absl::StatusOr<std::vector<std::vector<absl::Span<const float>>>> payload =
      SliceViews(*placement, AsVector(gradient));
  if (!payload.ok()) return payload.status();
  absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> reply =
      SliceViews(*placement, AsVector(weights));
  if (!reply.ok()) return reply.status();
  const std::vector<uint64_t> base = BaseVersions(header.gradient().version());
  // Each shard clips its slice by the whole update's norm (trainable
  // tensors only, as the master counts it).
  double squares = 0.0;
  for (size_t t = 0; t < gradient.size(); ++t) {
    if (static_cast<int>(t) < header.gradient().tensors_size() &&
        header.gradient().tensors(static_cast<int>(t)).buffer()) {
      continue;
    }
    for (const float g : gradient[t]) squares += static_cast<double>(g) * g;
  }
  const double norm = std::sqrt(squares);
  std::vector<uint64_t> versions(shards_.size(), 0);
  const absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    v1::PushGradientRequest::Header piece = header;
    *piece.mutable_gradient() = SliceHeader(header.gradient(), *placement, s);
    piece.mutable_gradient()->set_version(base[s]);
    piece.set_update_norm(norm);
    absl::StatusOr<uint64_t> version = shards_[s]->PushGradient(piece, (*payload)[s], (*reply)[s]);
    if (!version.ok()) return version.status();
    versions[s] = *version;
    return absl::OkStatus();
  });
  if (!status.ok()) return NoteLostGroup(header.group_id(), status);
  return Remember(versions);
}

absl::StatusOr<uint64_t> ShardedConnection::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  MPILEARN_ASSIGN_OR_RETURN(const Placement* placement, PlacementFor(Sizes(weights)));
  absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> slices =
      SliceViews(*placement, AsVector(weights));
  if (!slices.ok()) return slices.status();
  std::vector<uint64_t> versions(shards_.size(), 0);
  const absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    absl::StatusOr<uint64_t> version = shards_[s]->PullWeights(job_id, group_id, (*slices)[s]);
    if (!version.ok()) return version.status();
    versions[s] = *version;
    return absl::OkStatus();
  });
  if (!status.ok()) return NoteLostGroup(group_id, status);
  return Remember(versions);
}

void ShardedConnection::UseWireFormat(const v1::ExchangeSpec& exchange) {
  lead_.UseWireFormat(exchange);
  for (MasterConnection* shard : shards_) shard->UseWireFormat(exchange);
}

}  // namespace mpilearn::shard
