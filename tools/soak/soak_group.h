// One simulated worker group for the soak (tools/soak/soak_load.h): a group's
// leader speaking the Master protocol through its own MasterClient, with
// random finite weights and a small fixed update instead of a model, and
// no data files (the master hands out units by sample counts alone).
//
//   SimGroup group(client, stats, MlpLayout(32), /*seed=*/1);
//   MPILEARN_ASSIGN_OR_RETURN(auto registered, group.Register(job_id));
//   MPILEARN_RETURN_IF_ERROR(group.Init());
//   MPILEARN_ASSIGN_OR_RETURN(auto outcome, group.Train(stop, 2048, INT_MAX));
//   group.Leave(outcome.finish);
//
// Every call records its outcome in the RpcStats given, as expected or not
// (see Push).
#ifndef MPILEARN_TOOLS_SOAK_SOAK_GROUP_H_
#define MPILEARN_TOOLS_SOAK_SOAK_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/client/client_security.h"
#include "common/client/master_client.h"
#include "proto/mpilearn.pb.h"
#include "tools/soak/soak_stats.h"

namespace mpilearn {
namespace soak {

// Pushes per data unit: a job's batch_size is its unit size / this.
inline constexpr int kPushesPerUnit = 2;

// The status of a call's result.
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// The refusals the soak expects in places (by code and reason).
bool IsStale(const absl::Status& status);       // ABORTED STALE_UPDATE
bool IsJobEnded(const absl::Status& status);    // FAILED_PRECONDITION JOB_ENDED
bool IsJobUnknown(const absl::Status& status);  // NOT_FOUND JOB_UNKNOWN

// A client with a TCP connection of its own (as a separate worker process
// has), connected within 10 s; each call's deadline is `rpc_timeout`.
absl::StatusOr<std::unique_ptr<MasterClient>> ConnectOwnChannel(
    const std::string& address, const ClientSecurity& security,
    absl::Duration rpc_timeout);

// The tensors of a job's weights, as a worker would build them.
struct Layout {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
};

// mpilearn-worker's MLP for 8x8 inputs and 10 classes with one hidden
// layer: fc1.weight [hidden, 64], fc1.bias, out.weight [10, hidden],
// out.bias.
Layout MlpLayout(int hidden);

// A spec the master accepts for such a model: training files that are
// never opened, `epochs` of units of `unit_samples`, kPushesPerUnit pushes
// per unit, Adam at lr 1e-3; downpour gets max_staleness 1.
v1::JobSpec JobSpecFor(const std::string& name, const std::string& algorithm,
                       int hidden, int epochs, int64_t unit_samples);

// Thread-compatible: one thread drives a SimGroup; `stats` is shared.
class SimGroup {
 public:
  // `seed` draws the update the group pushes (normal, sd 1e-3).
  SimGroup(std::unique_ptr<MasterClient> client, RpcStats& stats,
           const Layout& layout, uint32_t seed);

  MasterClient& client() { return *client_; }
  RpcStats& stats() { return stats_; }
  // Pushes the master applied since Register.
  uint64_t applied() const { return applied_; }

  // Joins `job_id` as a new group (one rank, heartbeat period 5 s) and
  // prepares the push header for the job's algorithm.
  absl::StatusOr<v1::RegisterGroupResponse> Register(const std::string& job_id);
  // Offers random finite weights (uniform in [-0.1, 0.1]); a refusal to
  // take them is a failed check (the first group's must be taken).
  absl::Status Init();
  absl::Status Pull();
  // One push of the update on the weights the group holds. A stale refusal
  // is expected: the group pulls and goes on, as the worker does. With
  // `after_cancel` the job was just cancelled: the push must come back
  // with the weights the group has (dropped, not applied); being applied
  // is a failed check.
  absl::Status Push(bool after_cancel = false);
  absl::Status Heartbeat();
  // ReportEpoch of `epoch` (1-based) with made-up validation figures.
  absl::Status ReportEpoch(int epoch);
  // Leave, completed or not; returns the job's state.
  absl::StatusOr<v1::JobState> Leave(bool completed);

  struct Outcome {
    bool done = false;     // the queue said DONE
    bool finish = false;   // ... and this group is to finish the job
    bool holding = false;  // stopped at max_units, holding an untrained unit
    int units = 0;         // units trained
  };

  // Asks for units (the group sees `train_samples` samples) and trains them
  // (kPushesPerUnit pushes, a pull and a heartbeat per unit) until the
  // queue says DONE, `stop` is set (checked before each request), or
  // `max_units` are trained and another is handed out (held, untrained).
  // Reports each epoch the group finishes (PullWeights + ReportEpoch), as a
  // worker with in-band validation does. Returns the first unexpected error.
  absl::StatusOr<Outcome> Train(const std::atomic<bool>& stop,
                                int64_t train_samples, int max_units);

 private:
  std::unique_ptr<MasterClient> client_;
  RpcStats& stats_;
  const Layout layout_;
  // The job's weights as last received, and the update pushed each time.
  std::vector<std::vector<float>> weights_;
  std::vector<std::vector<float>> update_;
  std::vector<absl::Span<float>> weight_spans_;
  std::vector<absl::Span<const float>> update_spans_;
  std::string job_id_;
  std::string group_id_;
  v1::PushGradientRequest::Header header_;
  uint64_t version_ = 0;  // of weights_
  uint64_t applied_ = 0;
};

// Cancels `job_id` (an already ended job's refusal is expected), then
// deletes it: cleans up a job that was not finished.
void CancelAndDelete(MasterClient& client, RpcStats& stats,
                     const std::string& job_id);

}  // namespace soak
}  // namespace mpilearn

#endif  // MPILEARN_TOOLS_SOAK_SOAK_GROUP_H_
