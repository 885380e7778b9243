// A master for tests: holds one job's weights in memory, applies every push
// by a simple rule, and records what it was sent.
//
//   FakeMaster master({/*learning_rate=*/0.1f, /*alpha=*/0.5f});
//   master.SetWeights({{1, 2}, {3}});             // one vector per tensor
//   ... exchange pushes through `master` ...
//   EXPECT_EQ(master.pushes()[0].header.kind(), v1::UPDATE_KIND_GRADIENT);
//
// The rules, by the push's kind:
//   GRADIENT: plain SGD, w -= learning_rate * g (no momentum: a test of the
//             gradient's scale sees it directly);
//   ELASTIC:  the payload is the rank's weights x; the centre c moves to
//             c + alpha (x - c), and the reply is c as it was;
//   DELTA:    w += delta.
// Every successful push bumps the version; the reply of a GRADIENT or DELTA
// push is the new weights. A status set with FailNextPush is returned by the
// next push instead (the weights unchanged). HoldPushes keeps pushes at a
// gate until the test lets them through (a rank's updates in flight). Heartbeat and LeaveWithin are
// recorded (heartbeats(), leaves()); a heartbeat answers RUNNING (or the
// status set with FailHeartbeats), a LeaveWithin QUEUED. Only the calls a training rank makes are implemented;
// the others return UNIMPLEMENTED.
//
// Threading: thread-safe (ranks of a FakeGroup push from their own threads).
#ifndef MPILEARN_WORKER_FAKE_MASTER_H_
#define MPILEARN_WORKER_FAKE_MASTER_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/client/master_connection.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::worker {

class FakeMaster final : public MasterConnection {
 public:
  struct Rules {
    float learning_rate = 0.1f;  // GRADIENT pushes
    float alpha = 0.5f;          // ELASTIC pushes
  };

  // One recorded push: its header and payload, one vector per tensor.
  struct Push {
    v1::PushGradientRequest::Header header;
    std::vector<std::vector<float>> payload;
  };

  explicit FakeMaster(Rules rules) : rules_(rules) {}

  void SetWeights(std::vector<std::vector<float>> weights) {
    absl::MutexLock lock(&mu_);
    weights_ = std::move(weights);
  }
  std::vector<std::vector<float>> weights() const {
    absl::MutexLock lock(&mu_);
    return weights_;
  }
  uint64_t version() const {
    absl::MutexLock lock(&mu_);
    return version_;
  }
  std::vector<Push> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  // The next push fails with `status` (recorded, not applied).
  void FailNextPush(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_next_push_ = std::move(status);
  }
  // Pushes wait at a gate from now on, and pass it one per
  // LetPushesThrough, in the order they arrived; StopHolding opens it.
  void HoldPushes() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  void LetPushesThrough(int n) {
    absl::MutexLock lock(&mu_);
    allowed_ += n;
  }
  void StopHolding() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  // Blocks until `n` pushes wait at the gate.
  void AwaitPushesWaiting(int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return waiting_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  int pushes_waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }
  int pulls() const {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<v1::LeaveRequest> leaves() const {
    absl::MutexLock lock(&mu_);
    return leaves_;
  }
  // Heartbeats fail with `status` from now on (recorded all the same); OK
  // makes them succeed again.
  void FailHeartbeats(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_heartbeats_ = std::move(status);
  }
  // Blocks until `n` heartbeats have been recorded.
  void AwaitHeartbeats(size_t n) const {
    absl::MutexLock lock(&mu_);
    // Evaluated by Await with mu_ held.
    auto enough = [this, n]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return heartbeats_.size() >= n;
    };
    mu_.Await(absl::Condition(&enough));
  }

  absl::StatusOr<v1::JobState> Heartbeat(const v1::HeartbeatRequest& request,
                                         absl::Duration /*timeout*/) override {
    absl::MutexLock lock(&mu_);
    heartbeats_.push_back(request);
    if (!fail_heartbeats_.ok()) return fail_heartbeats_;
    return v1::JOB_STATE_RUNNING;
  }
  absl::StatusOr<v1::JobState> LeaveWithin(const v1::LeaveRequest& request,
                                           absl::Duration /*timeout*/) override {
    absl::MutexLock lock(&mu_);
    leaves_.push_back(request);
    return v1::JOB_STATE_QUEUED;
  }

  absl::StatusOr<uint64_t> PushGradient(
      const v1::PushGradientRequest::Header& header,
      absl::Span<const absl::Span<const float>> gradient,
      absl::Span<const absl::Span<float>> weights) override {
    absl::MutexLock lock(&mu_);
    const uint64_t ticket = arrived_++;
    ++waiting_;
    auto may_pass = [this, ticket]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return ticket == passed_ && (!hold_ || allowed_ > 0);
    };
    mu_.Await(absl::Condition(&may_pass));
    --waiting_;
    ++passed_;
    if (hold_) --allowed_;
    Push push{header, {}};
    for (absl::Span<const float> tensor : gradient) {
      push.payload.emplace_back(tensor.begin(), tensor.end());
    }
    pushes_.push_back(push);
    if (!fail_next_push_.ok()) {
      absl::Status failed = std::move(fail_next_push_);
      fail_next_push_ = absl::OkStatus();
      return failed;
    }
    if (gradient.size() != weights_.size() || weights.size() != weights_.size()) {
      return absl::InvalidArgumentError("push does not fit the weights");
    }
    for (size_t i = 0; i < weights_.size(); ++i) {
      std::vector<float>& w = weights_[i];
      const absl::Span<const float> g = gradient[i];
      if (g.size() != w.size() || weights[i].size() != w.size()) {
        return absl::InvalidArgumentError("push does not fit the weights");
      }
      for (size_t k = 0; k < w.size(); ++k) {
        switch (header.kind()) {
          case v1::UPDATE_KIND_ELASTIC:
            weights[i][k] = w[k];  // the centre as it was
            w[k] += rules_.alpha * (g[k] - w[k]);
            break;
          case v1::UPDATE_KIND_DELTA:
            w[k] += g[k];
            break;
          default:
            w[k] -= rules_.learning_rate * g[k];
            break;
        }
      }
      if (header.kind() != v1::UPDATE_KIND_ELASTIC) {
        std::copy(w.begin(), w.end(), weights[i].begin());
      }
    }
    return ++version_;
  }

  absl::StatusOr<uint64_t> PullWeights(
      const std::string& /*job_id*/, const std::string& /*group_id*/,
      absl::Span<const absl::Span<float>> weights) override {
    absl::MutexLock lock(&mu_);
    ++pulls_;
    if (weights.size() != weights_.size()) {
      return absl::InvalidArgumentError("pull does not fit the weights");
    }
    for (size_t i = 0; i < weights_.size(); ++i) {
      if (weights[i].size() != weights_[i].size()) {
        return absl::InvalidArgumentError("pull does not fit the weights");
      }
      std::copy(weights_[i].begin(), weights_[i].end(), weights[i].begin());
    }
    return version_;
  }

  absl::StatusOr<std::string> SubmitJob(const v1::JobSpec&) override {
    return absl::UnimplementedError("FakeMaster: SubmitJob");
  }
  absl::StatusOr<v1::RegisterGroupResponse> RegisterGroup(
      const v1::RegisterGroupRequest&) override {
    return absl::UnimplementedError("FakeMaster: RegisterGroup");
  }
  absl::StatusOr<bool> InitWeights(const std::string&, const std::string&,
                                   const v1::TensorSetHeader&,
                                   absl::Span<const absl::Span<const float>>) override {
    return absl::UnimplementedError("FakeMaster: InitWeights");
  }
  absl::StatusOr<v1::NextDataUnitResponse> NextDataUnit(
      const v1::NextDataUnitRequest&) override {
    return absl::UnimplementedError("FakeMaster: NextDataUnit");
  }
  absl::StatusOr<v1::JobState> ReportEpoch(const v1::ReportEpochRequest&) override {
    return absl::UnimplementedError("FakeMaster: ReportEpoch");
  }
  absl::StatusOr<v1::JobState> Leave(const v1::LeaveRequest&) override {
    return absl::UnimplementedError("FakeMaster: Leave");
  }
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string&) override {
    return absl::UnimplementedError("FakeMaster: GetJobStatus");
  }

 private:
  const Rules rules_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<float>> weights_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Push> pushes_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_next_push_ ABSL_GUARDED_BY(mu_);
  int pulls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::LeaveRequest> leaves_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_heartbeats_ ABSL_GUARDED_BY(mu_);
  // The push gate: arrival tickets, pushes through, waiting at it.
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int allowed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t passed_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_FAKE_MASTER_H_
