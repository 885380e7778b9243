// How a training rank's updates reach the master: one Exchange per job
// algorithm, chosen once from the spec, behind one interface. The trainer
// (worker/trainer.h) runs the batches; the exchange decides what happens
// after each batch and at the end of each window of `sync_every` batches.
//
//   ExchangeContext context(group, master, job_id, group_id, trace);
//   AttachParameters(context, ModelParameters(model), names);
//   MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<Exchange> exchange,
//                             MakeExchange(spec, context));
//   ... pull the master's weights into context.weights ...
//   MPILEARN_RETURN_IF_ERROR(exchange->Start());
//   for each batch of a window:
//     SummedLoss(batch).backward();          // gradients add up
//     exchange->AfterBatch(batch_samples);
//   MPILEARN_RETURN_IF_ERROR(exchange->EndWindow(window_samples));
//
// The algorithms (v1::Algorithm):
//   downpour: each rank pushes its window's mean gradient and continues
//             from the weights the master returns, without waiting for the
//             other ranks (with exchange.updates_in_flight N > 1, up to N
//             pushes are out while it computes on the weights it has);
//   sync:     the ranks sum their gradients and sample counts (allreduce),
//             the leader pushes the mean over the group's samples and
//             broadcasts the returned weights, so all ranks stay identical
//             (with updates_in_flight N > 1 the group computes on while up
//             to N of the leader's pushes are out);
//   easgd:    each rank takes local SGD steps batch by batch; at the window's
//             end it exchanges its weights x with the master's centre c: the
//             master moves c toward x and returns c as it was, and x moves
//             toward it by the same force, x -= alpha (x - c);
//   gem:      the local update u = -lr * mean gradient feeds the rank's
//             momentum proxy m = momentum m + u; the centre's movement since
//             the last exchange is measured against it, and u is scaled
//             elementwise by pi = clip((kappa |m| - |centre moved|) / |u|, 0, 5)
//             into the delta the master adds (mpi_learn's GEM).
// An update the master rejects as too stale (max_staleness) is dropped: the
// rank pulls the newest weights and goes on. An update for a group the master
// no longer knows is dropped too; the leader's next data-unit request fails
// the same way and the group registers again.
//
// Threading: an exchange and its context belong to one rank's training
// thread (the MPI thread); nothing here is shared between threads.
#ifndef MPILEARN_WORKER_EXCHANGE_H_
#define MPILEARN_WORKER_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/client/master_connection.h"
#include "common/trace.h"
#include "proto/mpilearn.pb.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {

// Wall-clock seconds since `start` (the step-time accounting's clock).
double SecondsSince(absl::Time start);

// The same views, read-only (what pushes take).
std::vector<absl::Span<const float>> ConstViews(
    const std::vector<absl::Span<float>>& views);

// Seconds spent in each part of training (one rank's, or summed over a
// group's ranks).
struct StepTimes {
  double data = 0, compute = 0, master = 0, mpi = 0;
  double total() const { return data + compute + master + mpi; }
};

// The rank's side of training that the trainer and its exchange share: the
// group and master it talks to, the model's parameters, and the figures the
// trainer reports. The trainer owns it; the exchange holds a reference for
// its whole life. Same thread as the exchange.
struct ExchangeContext {
  ExchangeContext(Collectives& group, MasterConnection& master,
                  std::string job_id, std::string group_id,
                  TraceRecorder* trace)
      : group(group),
        master(master),
        job_id(std::move(job_id)),
        group_id(std::move(group_id)),
        trace(trace) {}

  Collectives& group;
  MasterConnection& master;
  const std::string job_id;
  const std::string group_id;
  TraceRecorder* const trace;  // not owned; null: no tracing

  // The model's state (contiguous fp32, sharing the model's storage): its
  // trained parameters, then its buffers; views of every state tensor's
  // storage in the same order (what the master holds), and the job's layout
  // of them. Set once by AttachParameters.
  std::vector<torch::Tensor> params;  // the trained parameters only
  std::vector<absl::Span<float>> weights;  // parameters, then buffers
  v1::TensorSetHeader layout;
  // Every state tensor, as the model holds it.
  std::vector<torch::Tensor> state;
  // True when `weights` view host copies of `state` (a model on a GPU, or a
  // test of that path on the CPU); FromModel and ToModel copy between them.
  // False: `weights` view the state's own storage and both do nothing.
  bool mirrored = false;
  std::vector<std::vector<float>> host;  // the copies, when mirrored

  // Mirrored: the model's state into the host copies (before code reads
  // `weights`). The one place state leaves the device.
  void FromModel();
  // Mirrored: the host copies into the model's state (after code wrote
  // `weights`). The one place state reaches the device.
  void ToModel();

  // The master's weight version the parameters are based on.
  uint64_t version = 0;
  // Updates the master rejected as too stale.
  uint64_t stale_dropped = 0;
  // This rank's cumulative step times; exchanges add master and MPI time.
  StepTimes times;
  // Set when a status broadcast from the leader was an error: every rank
  // failed at the same point, so the ranks are still together.
  bool failed_together = false;
};

// Sets `context`'s state: `state` (contiguous fp32 tensors, named `names`
// in the job's layout) holds the trained parameters first and then
// `state.size() - num_parameters` buffers (marked TensorInfo.buffer in the
// layout), their views and the layout. State off the CPU is mirrored in
// host copies (taken now); `mirror` asks for that on the CPU too (tests).
void AttachParameters(ExchangeContext& context, std::vector<torch::Tensor> state,
                      const std::vector<std::string>& names,
                      size_t num_parameters, bool mirror = false);

// Broadcasts the leader's `status` to every rank (BroadcastStatus, keeping
// code and reason) and returns it; an error sets context.failed_together.
// A collective.
absl::Status AgreeOnLeaderStatus(ExchangeContext& context,
                                 const absl::Status& status);

// Every rank's `status` reaches the leader (GatherStrings); the first
// failing rank's code, reason-less message (prefixed "rank R: " unless it
// is the leader's) becomes the leader's status, which every rank then
// returns (AgreeOnLeaderStatus). For steps every rank does on its own
// (loading the model) that must end the same way on all. A collective.
absl::Status AgreeOnAllRanks(ExchangeContext& context, const absl::Status& status);

// What one push came to: the version of the weights written into its reply
// (or the error), whether it was refused as stale (the reply then holds the
// pulled newest weights), and its wall time.
struct PushOutcome {
  absl::StatusOr<uint64_t> version = 0;
  bool stale = false;
  double seconds = 0;
};

// The exchange with the master of PushUpdate, on `base_version`, changing
// nothing in `context`: a thread other than the rank's may run it while
// the rank goes on (downpour with updates in flight).
PushOutcome SendUpdate(const ExchangeContext& context, uint64_t base_version,
                       v1::UpdateKind kind,
                       absl::Span<const absl::Span<const float>> payload,
                       absl::Span<const absl::Span<float>> reply, double samples);

// Books `outcome` into `context` (version, stale drops), on the rank's
// thread: true when the reply holds weights to take, false when the master
// no longer knows the group (the update is dropped), or the error.
absl::StatusOr<bool> TakeOutcome(ExchangeContext& context, const PushOutcome& outcome);

// Pushes `payload` (gradient, weights or delta, per `kind`) computed on
// `samples` samples at context.version and writes the weights the master
// returns into `reply`, updating context.version. A stale rejection pulls
// the newest weights into `reply` instead (and counts the drop); a rejection
// because the master no longer knows the group drops the update and returns
// OK. Other errors are returned.
absl::Status PushUpdate(ExchangeContext& context, v1::UpdateKind kind,
                        absl::Span<const absl::Span<const float>> payload,
                        absl::Span<const absl::Span<float>> reply,
                        double samples);

// One algorithm's exchange. Call order: Start once, then any number of
// windows, each AfterBatch per non-empty batch (after its backward pass)
// and EndWindow once. Errors are the master's (or the leader's, for the
// collective algorithms), as statuses.
class Exchange {
 public:
  virtual ~Exchange() = default;
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  // Called once the parameters hold the weights every rank starts from (the
  // master's, after the first pull).
  virtual absl::Status Start() { return absl::OkStatus(); }

  // Called after a batch of `samples` samples has added its summed-loss
  // gradient to the parameters' gradients. By default nothing happens: the
  // gradients of the window's batches add up.
  virtual void AfterBatch(int64_t /*samples*/) {}

  // Ends a window of `samples` local samples (this rank's, since the last
  // exchange): sends the update and installs the weights it brings back
  // (Window, between context.FromModel() and context.ToModel()). The
  // parameters' gradients are zero afterwards.
  absl::Status EndWindow(double samples);

  // Waits for every update still on its way (downpour with
  // updates_in_flight > 1) and takes the weights the last one brought back;
  // the first error among them. The trainer calls it at the end of each
  // data unit, so a unit's updates are in before the unit counts as done.
  absl::Status Flush();

  // True when the rank's weights differ from the master's between exchanges
  // (easgd), so code that loads the master's weights for a while (epoch
  // validation) must put the rank's own back.
  virtual bool keeps_local_weights() const { return false; }

 protected:
  explicit Exchange(ExchangeContext& context) : context_(context) {}

  // The algorithm's window end, on host weights (`context_.weights` hold
  // the model's state on entry; what it writes there reaches the model).
  virtual absl::Status Window(double samples) = 0;

  // Updates still on their way, and Flush's work on host weights (as
  // Window's).
  virtual bool has_pending() const { return false; }
  virtual absl::Status Drain() { return absl::OkStatus(); }

  // Copies every parameter's gradient into `flat` (laid out as the weights;
  // zeros for a parameter without one) and zeroes the gradients. Buffers'
  // places are left as they are.
  void TakeGradients(std::vector<float>& flat);

  // Copies the buffers' current values into their places in `flat` (laid
  // out as the weights): every update carries them, and the master replaces
  // its buffers with them (docs/protocol.md, "Model buffers").
  void PutBuffers(std::vector<float>& flat) const;

  // Offset in a flat copy of the weights where the buffers begin.
  size_t buffers_offset() const;

  ExchangeContext& context_;
};

// The exchange for `spec`'s algorithm (AlgorithmOf), over `context`, whose
// parameters must be attached. INVALID_ARGUMENT for an unknown algorithm.
absl::StatusOr<std::unique_ptr<Exchange>> MakeExchange(const v1::JobSpec& spec,
                                                       ExchangeContext& context);

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_EXCHANGE_H_
