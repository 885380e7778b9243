#include "worker/mpi_group.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/error_reason.h"

namespace mpilearn::worker {
namespace {

MPI_Comm Comm(void* comm) { return static_cast<MPI_Comm>(comm); }

// MPI counts are int; large buffers go in int-sized pieces.
template <typename T, typename Fn>
void InPieces(absl::Span<T> values, Fn fn) {
  constexpr size_t kMax = INT_MAX / 2;
  for (size_t offset = 0; offset < values.size(); offset += kMax) {
    fn(values.data() + offset,
       static_cast<int>(std::min(kMax, values.size() - offset)));
  }
}

// Waits for a non-blocking collective without holding a core. Open MPI's
// blocking collectives spin in opal_progress until the peers arrive; on a
// node running more processes than cores (ranks plus the master, or ranks
// plus their data threads) the spinning rank takes the CPU that the rank
// it waits for, or the master serving it, needs. Here the wait spins only
// briefly (most collectives between ranks in step finish within
// microseconds), then tests between short sleeps that grow to 200 us:
// MPI_Test drives the transfer's progress, so a large message still moves
// in the gaps, at a cost of a few microseconds per wake-up.
void Wait(MPI_Request* request) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kMaxSleep = std::chrono::microseconds(200);
  int done = 0;
  const Clock::time_point start = Clock::now();
  auto sleep = std::chrono::microseconds(10);
  while (true) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (Clock::now() - start < kSpin) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiGroup>> MpiGroup::Init(int* argc,
                                                         char*** argv) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
      std::getenv("PMI_SIZE") == nullptr && std::getenv("PMIX_RANK") == nullptr) {
    if (std::getenv("SLURM_STEP_ID") != nullptr) {
      // A plain srun starts N copies that know nothing of each other.
      return absl::FailedPreconditionError(
          "mpilearn-worker was started by srun without an MPI plugin: start the "
          "group with `srun --mpi=pmix mpilearn-worker ...` or with mpirun inside "
          "the allocation (deploy/slurm_group.sbatch, deploy/slurm_train.sbatch)");
    }
    return absl::FailedPreconditionError(
        "mpilearn-worker must be started by mpirun, e.g. "
        "`mpirun -np 2 mpilearn-worker --master HOST:PORT` (-np 1 works too)");
  }
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI provides thread level ", provided,
        " but mpilearn-worker needs MPI_THREAD_FUNNELED; use an MPI built "
        "with thread support"));
  }
  auto group = std::unique_ptr<MpiGroup>(new MpiGroup());
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  group->comm_ = dup;
  MPI_Comm_rank(dup, &group->rank_);
  MPI_Comm_size(dup, &group->size_);
  // Started by srun directly: the step's task count must be the world's,
  // else srun's MPI plugin did not connect the tasks (each is a singleton).
  if (const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
      tasks != nullptr && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
      std::atoi(tasks) != group->size_) {
    const std::string message = absl::StrCat(
        "srun started ", tasks, " tasks but each sees an MPI world of ", group->size_,
        ": srun's --mpi plugin does not match this Open MPI; use `srun --mpi=pmix` "
        "(`srun --mpi=list` shows the plugins) or mpirun inside the allocation");
    return absl::FailedPreconditionError(message);
  }
  MPI_Comm local;
  MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, group->rank_, MPI_INFO_NULL,
                      &local);
  MPI_Comm_size(local, &group->local_size_);
  MPI_Comm_rank(local, &group->local_rank_);
  MPI_Comm_free(&local);
  return group;
}

MpiGroup::~MpiGroup() {
  MPI_Comm comm = Comm(comm_);
  MPI_Comm_free(&comm);
  MPI_Finalize();
}

// Every collective below is the non-blocking one plus Wait (see there).

void MpiGroup::Broadcast(std::string* bytes, int root) {
  unsigned long long size = bytes->size();
  MPI_Request request;
  MPI_Ibcast(&size, 1, MPI_UNSIGNED_LONG_LONG, root, Comm(comm_), &request);
  Wait(&request);
  bytes->resize(size);
  InPieces(absl::MakeSpan(bytes->data(), bytes->size()), [&](char* p, int n) {
    MPI_Request piece;
    MPI_Ibcast(p, n, MPI_CHAR, root, Comm(comm_), &piece);
    Wait(&piece);
  });
}

void MpiGroup::Broadcast(absl::Span<float> values, int root) {
  InPieces(values, [&](float* p, int n) {
    MPI_Request request;
    MPI_Ibcast(p, n, MPI_FLOAT, root, Comm(comm_), &request);
    Wait(&request);
  });
}

void MpiGroup::AllreduceSum(absl::Span<float> values) {
  InPieces(values, [&](float* p, int n) {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, Comm(comm_), &request);
    Wait(&request);
  });
}

void MpiGroup::AllreduceSum(absl::Span<double> values) {
  InPieces(values, [&](double* p, int n) {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_DOUBLE, MPI_SUM, Comm(comm_), &request);
    Wait(&request);
  });
}

void MpiGroup::Barrier() {
  MPI_Request request;
  MPI_Ibarrier(Comm(comm_), &request);
  Wait(&request);
}

std::vector<std::string> MpiGroup::GatherStrings(const std::string& mine,
                                                 int root) {
  // Every rank learns every length, so all ranks plan the same rounds.
  const unsigned long long my_length = mine.size();
  std::vector<unsigned long long> lengths(size_);
  MPI_Allgather(&my_length, 1, MPI_UNSIGNED_LONG_LONG, lengths.data(), 1,
                MPI_UNSIGNED_LONG_LONG, Comm(comm_));
  const unsigned long long longest =
      *std::max_element(lengths.begin(), lengths.end());
  // Each round takes up to `piece` bytes from every rank, so one round's
  // counts and displacements stay within int (one round in practice).
  const unsigned long long piece = std::min<unsigned long long>(
      size_t{1} << 30, std::max(1, INT_MAX / size_));
  const bool is_root = rank_ == root;
  std::vector<std::string> gathered(is_root ? size_ : 0);
  std::vector<int> counts(size_), displacements(size_);
  std::string buffer;
  for (unsigned long long offset = 0; offset < longest; offset += piece) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      const unsigned long long left = lengths[r] > offset ? lengths[r] - offset : 0;
      counts[r] = static_cast<int>(std::min(piece, left));
      displacements[r] = total;
      total += counts[r];
    }
    if (is_root) buffer.resize(total);
    MPI_Gatherv(mine.data() + std::min<size_t>(offset, mine.size()), counts[rank_],
                MPI_CHAR, is_root ? buffer.data() : nullptr, counts.data(),
                displacements.data(), MPI_CHAR, root, Comm(comm_));
    if (is_root) {
      for (int r = 0; r < size_; ++r) {
        gathered[r].append(buffer, displacements[r], counts[r]);
      }
    }
  }
  return gathered;
}

absl::Status BroadcastStatus(Collectives& group, const absl::Status& status,
                             int root) {
  // On the wire: empty for OK, else "<code> <reason> <message>".
  std::string wire;
  if (group.rank() == root && !status.ok()) {
    wire = absl::StrCat(static_cast<int>(status.code()), " ",
                        static_cast<int>(ReasonOf(status)), " ", status.message());
  }
  group.Broadcast(&wire, root);
  if (wire.empty()) return absl::OkStatus();
  if (group.rank() == root) return status;
  absl::string_view rest = wire;
  int fields[2] = {static_cast<int>(absl::StatusCode::kUnknown),
                   v1::ERROR_REASON_UNSPECIFIED};
  for (int& field : fields) {
    const size_t space = rest.find(' ');
    if (space == absl::string_view::npos ||
        !absl::SimpleAtoi(rest.substr(0, space), &field)) {
      return absl::InternalError(absl::StrCat(
          "could not decode the leader's broadcast status: ", wire));
    }
    rest.remove_prefix(space + 1);
  }
  // The root's status was an error, so its code is never OK here.
  const absl::StatusCode code = fields[0] == 0
                                    ? absl::StatusCode::kUnknown
                                    : static_cast<absl::StatusCode>(fields[0]);
  absl::Status received(code, absl::StrCat("the leader failed: ", rest));
  if (fields[1] != v1::ERROR_REASON_UNSPECIFIED &&
      v1::ErrorReason_IsValid(fields[1])) {
    received = WithReason(std::move(received),
                          static_cast<v1::ErrorReason>(fields[1]));
  }
  return received;
}

void SingleProcessGroup::Abort(int exit_code) { std::_Exit(exit_code); }

void MpiGroup::Abort(int exit_code) {
  MPI_Abort(Comm(comm_), exit_code);
  std::_Exit(exit_code);
}

}  // namespace mpilearn::worker
