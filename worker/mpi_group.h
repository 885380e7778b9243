// The collectives a training group uses inside itself, and their MPI
// implementation.
//
//   absl::StatusOr<std::unique_ptr<MpiGroup>> group = MpiGroup::Init(&argc, &argv);
//   (*group)->AllreduceSum(absl::MakeSpan(gradient));
//   MPILEARN_RETURN_IF_ERROR(BroadcastStatus(**group, leader_status, 0));
//
// MpiGroup checks the thread level MPI provides, works on a duplicate of
// MPI_COMM_WORLD so it never collides with other MPI users in the process,
// and finalizes MPI when destroyed. Threading: MPI_THREAD_FUNNELED; every
// call comes from the thread that called Init.
#ifndef MPILEARN_WORKER_MPI_GROUP_H_
#define MPILEARN_WORKER_MPI_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mpilearn::worker {

// What the trainer needs from its group; a seam so tests can fake MPI.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Replaces `bytes` on every rank with root's.
  virtual void Broadcast(std::string* bytes, int root) = 0;
  virtual void Broadcast(absl::Span<float> values, int root) = 0;
  // Element-wise sum over ranks, result on every rank.
  virtual void AllreduceSum(absl::Span<float> values) = 0;
  virtual void AllreduceSum(absl::Span<double> values) = 0;
  virtual void Barrier() = 0;
  // Collects every rank's `mine` on `root`: root gets them in rank order,
  // the other ranks an empty vector. Strings of any length (sent in pieces
  // when they exceed MPI's int counts).
  virtual std::vector<std::string> GatherStrings(const std::string& mine,
                                                 int root) = 0;
  // Ends every process of the group (after a fatal error on one rank).
  [[noreturn]] virtual void Abort(int exit_code) = 0;
};

// A group of one process without MPI: the local baseline mode.
class SingleProcessGroup final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Broadcast(std::string*, int) override {}
  void Broadcast(absl::Span<float>, int) override {}
  void AllreduceSum(absl::Span<float>) override {}
  void AllreduceSum(absl::Span<double>) override {}
  void Barrier() override {}
  std::vector<std::string> GatherStrings(const std::string& mine, int) override {
    return {mine};
  }
  [[noreturn]] void Abort(int exit_code) override;
};

// Broadcasts `root`'s `status` (the other ranks' argument is ignored) and
// returns it on every rank: code, error reason (common/error_reason.h) and
// message, so every rank decides on the root's outcome the same way. The
// root gets its own status back unchanged; the others get its code and
// reason with the message prefixed "the leader failed: ". A collective:
// every rank of the group calls it.
absl::Status BroadcastStatus(Collectives& group, const absl::Status& status,
                             int root);

class MpiGroup final : public Collectives {
 public:
  // Initializes MPI. FAILED_PRECONDITION when the process was not started by
  // mpirun or MPI lacks MPI_THREAD_FUNNELED.
  static absl::StatusOr<std::unique_ptr<MpiGroup>> Init(int* argc, char*** argv);

  ~MpiGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Ranks of this group on this node (for sharing its cores).
  int local_size() const { return local_size_; }
  // This rank's index among them (for picking a GPU).
  int local_rank() const { return local_rank_; }

  void Broadcast(std::string* bytes, int root) override;
  void Broadcast(absl::Span<float> values, int root) override;
  void AllreduceSum(absl::Span<float> values) override;
  void AllreduceSum(absl::Span<double> values) override;
  void Barrier() override;
  std::vector<std::string> GatherStrings(const std::string& mine,
                                         int root) override;
  [[noreturn]] void Abort(int exit_code) override;

 private:
  MpiGroup() = default;

  void* comm_ = nullptr;  // MPI_Comm, opaque here to keep mpi.h out
  int rank_ = 0;
  int size_ = 1;
  int local_size_ = 1;
  int local_rank_ = 0;
};

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_MPI_GROUP_H_
