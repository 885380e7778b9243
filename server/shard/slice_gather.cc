#include "server/shard/slice_gather.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/shard/placement.h"
#include "common/shard/sharded_connection.h"

namespace mpilearn::server {
namespace {

// What a slice says of tensor `index` of the whole layout.
struct WholeTensor {
  const v1::TensorInfo* first = nullptr;  // the first slice naming it
  std::string name;
};

bool SameShape(const v1::TensorInfo& a, const v1::TensorInfo& b) {
  return std::equal(a.slice_of().shape().begin(), a.slice_of().shape().end(),
                    b.slice_of().shape().begin(), b.slice_of().shape().end());
}

}  // namespace

absl::StatusOr<WeightsSnapshot> JoinSlices(std::vector<ShardSliceWeights> slices) {
  if (slices.empty()) return absl::InvalidArgumentError("no slices to join");
  // Each whole tensor has at least one range, so the layout has at most as
  // many tensors as the slices together: a bound before anything is sized.
  size_t ranges = 0;
  int64_t received = 0;
  for (const ShardSliceWeights& slice : slices) {
    ranges += static_cast<size_t>(slice.header.tensors_size());
    if (slice.values.size() != static_cast<size_t>(slice.header.tensors_size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", slice.shard, " sent ", slice.values.size(), " tensors for a header of ",
          slice.header.tensors_size()));
    }
    for (const std::vector<float>& v : slice.values) received += static_cast<int64_t>(v.size());
  }
  std::map<int, WholeTensor> whole;
  shard::Placement placement;
  placement.shards.resize(slices.size());
  for (size_t s = 0; s < slices.size(); ++s) {
    const ShardSliceWeights& slice = slices[s];
    for (int t = 0; t < slice.header.tensors_size(); ++t) {
      const v1::TensorInfo& info = slice.header.tensors(t);
      std::string name;
      shard::TensorRange range;
      if (!info.has_slice_of() ||
          !shard::ParseSliceName(info.name(), &name, &range.begin, &range.end)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", slice.shard, "'s tensor '", info.name(),
            "' is not a slice of the job's layout (NAME[BEGIN:END] with slice_of): was the "
            "slice made by a group of an older version? Run the job again"));
      }
      range.tensor = info.slice_of().index();
      if (range.tensor < 0 || static_cast<size_t>(range.tensor) >= ranges) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", slice.shard, "'s slice '", info.name(), "' names tensor ", range.tensor,
            " of a layout of at most ", ranges));
      }
      if (static_cast<int64_t>(slice.values[t].size()) != range.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", slice.shard, "'s slice '", info.name(), "' holds ",
            slice.values[t].size(), " values"));
      }
      WholeTensor& tensor = whole[range.tensor];
      if (tensor.first == nullptr) {
        tensor.first = &info;
        tensor.name = name;
      } else if (tensor.name != name || !SameShape(*tensor.first, info) ||
                 tensor.first->buffer() != info.buffer()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", slice.shard, "'s slice '", info.name(), "' disagrees with slice '",
            tensor.first->name(), "' on tensor ", range.tensor, "'s name, shape or kind"));
      }
      placement.shards[s].push_back(range);
    }
  }
  // Every tensor of the layout, 0 to the last, is in some slice.
  for (int index = 0; index < static_cast<int>(whole.size()); ++index) {
    if (whole.count(index) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the shards' slices do not make the whole model: tensor ", index,
          " is in no slice, though tensor ", whole.rbegin()->first, " is"));
    }
  }
  // Sizes from the shapes, each bounded by what arrived.
  std::vector<int64_t> sizes(whole.size(), 0);
  for (const auto& [index, tensor] : whole) {
    int64_t size = 1;
    for (const int64_t dim : tensor.first->slice_of().shape()) {
      if (dim < 0 || (dim > 0 && size > received / dim)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", tensor.name, "' has a shape larger than the slices sent"));
      }
      size *= dim;
    }
    sizes[static_cast<size_t>(index)] = size;
  }
  if (absl::Status covers = shard::CheckCovers(placement, sizes); !covers.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shards' slices do not make the whole model: ", covers.message()));
  }
  WeightsSnapshot joined;
  joined.header.mutable_input_shape()->CopyFrom(slices[0].header.input_shape());
  joined.header.set_outputs(slices[0].header.outputs());
  joined.header.mutable_inputs()->CopyFrom(slices[0].header.inputs());
  uint64_t version = 0;
  for (const ShardSliceWeights& slice : slices) version += slice.header.version();
  joined.header.set_version(version);
  std::vector<absl::Span<float>> tensors;
  joined.values.resize(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    const WholeTensor& tensor = whole.at(static_cast<int>(t));
    v1::TensorInfo* info = joined.header.add_tensors();
    info->set_name(tensor.name);
    info->set_dtype(v1::DTYPE_FLOAT32);
    *info->mutable_shape() = tensor.first->slice_of().shape();
    info->set_buffer(tensor.first->buffer());
    joined.values[t].resize(static_cast<size_t>(sizes[t]));
    tensors.push_back(absl::MakeSpan(joined.values[t]));
  }
  absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> views =
      shard::SliceViews(placement, tensors);
  if (!views.ok()) return views.status();
  for (size_t s = 0; s < slices.size(); ++s) {
    for (size_t r = 0; r < (*views)[s].size(); ++r) {
      std::copy(slices[s].values[r].begin(), slices[s].values[r].end(), (*views)[s][r].begin());
    }
  }
  return joined;
}

SliceGather::Ticket SliceGather::Begin(const std::string& job_id,
                                      const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Pending>& pending = pending_[job_id];
  if (pending == nullptr || pending->outcome.has_value()) {
    pending = std::make_shared<Pending>();
    pending->request = ++last_request_;
    pending->addresses = addresses;
    pending->slices.resize(addresses.size());
    if (closed_) pending->outcome = absl::CancelledError("the master is shutting down");
  }
  Ticket ticket;
  ticket.request_ = pending->request;
  ticket.job_id_ = job_id;
  ticket.pending_ = pending;
  return ticket;
}

void SliceGather::EndLocked(const std::string& job_id, const std::shared_ptr<Pending>& pending) {
  const auto current = pending_.find(job_id);
  if (current != pending_.end() && current->second == pending) pending_.erase(current);
}

absl::Status SliceGather::Deliver(const std::string& job_id, uint64_t request,
                                  ShardSliceWeights slice, const std::string& error) {
  absl::MutexLock lock(&mu_);
  const auto found = pending_.find(job_id);
  if (found == pending_.end() || found->second->request != request ||
      found->second->outcome.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, ": the lead no longer waits for slices of request ", request,
        " (it ended or timed out)"));
  }
  Pending& pending = *found->second;
  if (slice.shard < 0 || static_cast<size_t>(slice.shard) >= pending.addresses.size() ||
      pending.addresses[static_cast<size_t>(slice.shard)] != slice.address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", job_id, ": no shard ", slice.shard, " at ", slice.address,
        " in the job's placement (", absl::StrJoin(pending.addresses, ", "), ")"));
  }
  std::optional<ShardSliceWeights>& place = pending.slices[static_cast<size_t>(slice.shard)];
  if (place.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": shard ", slice.shard, " sent its slice twice"));
  }
  if (!error.empty()) {
    pending.outcome = absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, ": shard ", slice.shard, " (", slice.address,
                     ") sends no slice: ", error));
    pending_.erase(found);
    return absl::OkStatus();
  }
  place = std::move(slice);
  ++pending.received;
  return absl::OkStatus();
}

absl::StatusOr<SliceGather::Gathered> SliceGather::Await(const Ticket& ticket,
                                                         absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const std::string& job_id = ticket.job_id_;
  const std::shared_ptr<Pending>& pending = ticket.pending_;
  if (pending == nullptr) return absl::InvalidArgumentError("an empty gather ticket");
  auto ready = [this, &pending]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || pending->outcome.has_value() ||
           (!pending->joining && pending->received == pending->slices.size());
  };
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const bool answered = mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (pending->outcome.has_value()) return *pending->outcome;
    if (closed_) return absl::CancelledError("the master is shutting down");
    if (!answered) break;
    // Every slice is here: this waiter joins them, outside the lock.
    pending->joining = true;
    std::vector<ShardSliceWeights> slices;
    for (std::optional<ShardSliceWeights>& slice : pending->slices) {
      slices.push_back(*std::move(slice));
    }
    uint64_t oldest = UINT64_MAX;
    uint64_t newest = 0;
    for (const ShardSliceWeights& slice : slices) {
      oldest = std::min<uint64_t>(oldest, slice.header.version());
      newest = std::max<uint64_t>(newest, slice.header.version());
    }
    mu_.Unlock();
    absl::StatusOr<WeightsSnapshot> joined = JoinSlices(std::move(slices));
    mu_.Lock();
    if (joined.ok()) {
      Gathered gathered;
      gathered.weights = std::make_shared<WeightsSnapshot>(*std::move(joined));
      gathered.oldest_slice = oldest;
      gathered.newest_slice = newest;
      pending->outcome = std::move(gathered);
    } else {
      pending->outcome = joined.status();
    }
    EndLocked(job_id, pending);
    return *pending->outcome;
  }
  // Timed out. Another waiter joining the slices finishes soon: its outcome.
  if (pending->joining) {
    auto joined = [this, &pending]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || pending->outcome.has_value();
    };
    mu_.Await(absl::Condition(&joined));
    if (pending->outcome.has_value()) return *pending->outcome;
    return absl::CancelledError("the master is shutting down");
  }
  // Else the gather ends for every waiter, naming who did not answer.
  std::vector<std::string> missing;
  for (size_t s = 0; s < pending->slices.size(); ++s) {
    if (!pending->slices[s].has_value()) {
      missing.push_back(absl::StrCat(s, " (", pending->addresses[s], ")"));
    }
  }
  pending->outcome = absl::UnavailableError(absl::StrCat(
      "job ", job_id, ": shards ", absl::StrJoin(missing, ", "), " did not send their slices within ",
      absl::FormatDuration(timeout),
      "; are they running and syncing with this lead? (mpilearnctl status shows when each "
      "last reported)"));
  EndLocked(job_id, pending);
  return *pending->outcome;
}

void SliceGather::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace mpilearn::server
