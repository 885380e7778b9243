#include "common/shard/sharded_connection.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

}  // namespace

v1::TensorSetHeader SliceHeader(const v1::TensorSetHeader& whole, const Placement& placement,
                                int shard) {
  v1::TensorSetHeader slice = whole;
  slice.clear_tensors();
  for (const TensorRange& range : placement.shards[shard]) {
    const v1::TensorInfo& info = whole.tensors(range.tensor);
    v1::TensorInfo* piece = slice.add_tensors();
    piece->set_name(absl::StrCat(info.name(), "[", range.begin, ":", range.end, "]"));
    piece->set_dtype(info.dtype());
    piece->add_shape(range.size());
    piece->set_buffer(info.buffer());
  }
  return slice;
}

ShardedConnection::ShardedConnection(MasterConnection& lead,
                                     std::vector<MasterConnection*> shards,
                                     Placement placement)
    : lead_(lead), shards_(std::move(shards)), placement_(std::move(placement)) {
  absl::MutexLock lock(&mu_);
  newest_.assign(shards_.size(), 0);
  versions_[0] = newest_;
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
  absl::StatusOr<std::vector<std::vector<absl::Span<const float>>>> slices =
      SliceViews(placement_, AsVector(values));
  if (!slices.ok()) return slices.status();
  std::vector<char> accepted(shards_.size(), 0);
  absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    absl::StatusOr<bool> taken = shards_[s]->InitWeights(
        job_id, group_id, SliceHeader(header, placement_, s), (*slices)[s]);
    if (!taken.ok()) return taken.status();
    accepted[s] = *taken ? 1 : 0;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
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
  absl::StatusOr<std::vector<std::vector<absl::Span<const float>>>> payload =
      SliceViews(placement_, AsVector(gradient));
  if (!payload.ok()) return payload.status();
  absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> reply =
      SliceViews(placement_, AsVector(weights));
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
    *piece.mutable_gradient() = SliceHeader(header.gradient(), placement_, s);
    piece.mutable_gradient()->set_version(base[s]);
    piece.set_update_norm(norm);
    absl::StatusOr<uint64_t> version = shards_[s]->PushGradient(piece, (*payload)[s], (*reply)[s]);
    if (!version.ok()) return version.status();
    versions[s] = *version;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return Remember(versions);
}

absl::StatusOr<uint64_t> ShardedConnection::PullWeights(
    const std::string& job_id, const std::string& group_id,
    absl::Span<const absl::Span<float>> weights) {
  absl::StatusOr<std::vector<std::vector<absl::Span<float>>>> slices =
      SliceViews(placement_, AsVector(weights));
  if (!slices.ok()) return slices.status();
  std::vector<uint64_t> versions(shards_.size(), 0);
  const absl::Status status = OnEveryShard([&](int s) -> absl::Status {
    absl::StatusOr<uint64_t> version = shards_[s]->PullWeights(job_id, group_id, (*slices)[s]);
    if (!version.ok()) return version.status();
    versions[s] = *version;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return Remember(versions);
}

void ShardedConnection::UseWireFormat(const v1::ExchangeSpec& exchange) {
  lead_.UseWireFormat(exchange);
  for (MasterConnection* shard : shards_) shard->UseWireFormat(exchange);
}

}  // namespace mpilearn::shard
