// An in-process group of N ranks for tests: each rank is a Collectives that
// runs on its own thread, and the collectives meet in shared memory, so code
// written for MPI runs unchanged with several real ranks.
//
//   FakeGroup group(3);
//   group.Run([&](Collectives& rank) {
//     std::vector<float> values = {float(rank.rank())};
//     rank.AllreduceSum(absl::MakeSpan(values));   // 0 + 1 + 2 on every rank
//   });
//
// Every collective is an all-gather of each rank's bytes underneath; sums
// are taken in rank order, so results are deterministic. As with MPI, every
// rank must make the same collectives in the same order (a mismatch blocks
// until the test's timeout). Threading: Run starts one thread per rank and
// joins them; a FakeRank is used only by its own thread.
#ifndef MPILEARN_WORKER_FAKE_COLLECTIVES_H_
#define MPILEARN_WORKER_FAKE_COLLECTIVES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "glog/logging.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

class FakeGroup {
 public:
  explicit FakeGroup(int size) : size_(size), slots_(size) {
    CHECK_GT(size, 0);
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  }

  int size() const { return size_; }

  // Rank `r`'s collectives (for tests that drive the threads themselves).
  Collectives& rank(int r) { return *ranks_[r]; }

  // Runs `body` for every rank, each on its own thread, and waits for all.
  void Run(const std::function<void(Collectives&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&body, this, r] { body(*ranks_[r]); });
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  class Rank final : public Collectives {
   public:
    Rank(FakeGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size_; }
    void Broadcast(std::string* bytes, int root) override {
      *bytes = group_.AllGather(rank_, *bytes)[root];
    }
    void Broadcast(absl::Span<float> values, int root) override {
      const std::string all = group_.AllGather(rank_, Bytes(values))[root];
      CHECK_EQ(all.size(), values.size() * sizeof(float));
      std::memcpy(values.data(), all.data(), all.size());
    }
    void AllreduceSum(absl::Span<float> values) override { Sum(values); }
    void AllreduceSum(absl::Span<double> values) override { Sum(values); }
    void Barrier() override { group_.AllGather(rank_, ""); }
    std::vector<std::string> GatherStrings(const std::string& mine,
                                           int root) override {
      std::vector<std::string> all = group_.AllGather(rank_, mine);
      if (rank_ != root) all.clear();
      return all;
    }
    [[noreturn]] void Abort(int exit_code) override {
      LOG(FATAL) << "rank " << rank_ << " aborted the fake group with exit code "
                 << exit_code;
    }

   private:
    template <typename T>
    static std::string Bytes(absl::Span<T> values) {
      return std::string(reinterpret_cast<const char*>(values.data()),
                         values.size() * sizeof(T));
    }
    // Element-wise sum over ranks, added in rank order.
    template <typename T>
    void Sum(absl::Span<T> values) {
      const std::vector<std::string> all = group_.AllGather(rank_, Bytes(values));
      std::vector<T> total(values.size(), T{0});
      for (const std::string& bytes : all) {
        CHECK_EQ(bytes.size(), values.size() * sizeof(T))
            << "ranks reduced buffers of different sizes";
        const T* theirs = reinterpret_cast<const T*>(bytes.data());
        for (size_t i = 0; i < total.size(); ++i) total[i] += theirs[i];
      }
      std::copy(total.begin(), total.end(), values.begin());
    }

    FakeGroup& group_;
    const int rank_;
  };

  // Every rank's `mine`, in rank order, once all ranks have called. A round
  // ends when every rank has taken the result; the next round's callers wait
  // for that.
  std::vector<std::string> AllGather(int rank, std::string mine) {
    absl::MutexLock lock(&mu_);
    while (releasing_) changed_.Wait(&mu_);
    slots_[rank] = std::move(mine);
    const uint64_t round = round_;
    if (++arrived_ == size_) {
      result_ = slots_;
      releasing_ = true;
      ++round_;
      changed_.SignalAll();
    } else {
      while (round_ == round) changed_.Wait(&mu_);
    }
    std::vector<std::string> out = result_;
    if (++departed_ == size_) {
      arrived_ = 0;
      departed_ = 0;
      releasing_ = false;
      changed_.SignalAll();
    }
    return out;
  }

  const int size_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  absl::Mutex mu_;
  absl::CondVar changed_;  // signalled when a round completes or ends
  std::vector<std::string> slots_ ABSL_GUARDED_BY(mu_);   // this round's
  std::vector<std::string> result_ ABSL_GUARDED_BY(mu_);  // last full round
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int departed_ ABSL_GUARDED_BY(mu_) = 0;
  // True from a round's completion until every rank has taken its result.
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_FAKE_COLLECTIVES_H_
