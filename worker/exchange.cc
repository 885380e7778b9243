#include "worker/exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "worker/local_step.h"
#include "worker/master_errors.h"

namespace mpilearn::worker {

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

std::vector<absl::Span<const float>> ConstViews(
    const std::vector<absl::Span<float>>& views) {
  return std::vector<absl::Span<const float>>(views.begin(), views.end());
}

namespace {

// Per-tensor views into `flat` (sized to the weights), laid out like them.
std::vector<absl::Span<float>> ViewsLike(
    const std::vector<absl::Span<float>>& weights, std::vector<float>& flat) {
  std::vector<absl::Span<float>> views;
  size_t offset = 0;
  for (const absl::Span<float>& w : weights) {
    views.emplace_back(flat.data() + offset, w.size());
    offset += w.size();
  }
  return views;
}

size_t TotalSize(const std::vector<absl::Span<float>>& weights) {
  size_t total = 0;
  for (const absl::Span<float>& w : weights) total += w.size();
  return total;
}

// Multiplies the first `count` elements by 1 / samples.
void DivideBy(double samples, size_t count, std::vector<float>& flat) {
  const float scale = static_cast<float>(1.0 / samples);
  for (size_t i = 0; i < count; ++i) flat[i] *= scale;
}

// A rank's updates on their way to the master (exchange.updates_in_flight
// > 1), oldest first. Each has a slot: the gradient it carries and the
// weights it brings back, used again once the push is taken. A push runs in
// a thread of its own (SendUpdate); Take waits for the oldest and installs
// its weights. With sync, only the leader sends: the other ranks Count the
// same pushes, so every rank knows when the group takes one.
class PushPipeline {
 public:
  struct Slot {
    std::vector<float> grad;  // the window's gradient, flat
    std::vector<absl::Span<float>> grad_views;  // per tensor, into grad
    std::vector<float> reply;  // the weights the push brings back (depth > 1)
    std::vector<absl::Span<float>> reply_views;
  };

  PushPipeline(ExchangeContext& context, int depth)
      : context_(context), depth_(std::max(1, depth)) {
    const size_t size = TotalSize(context.weights);
    slots_.resize(depth_);
    for (Slot& slot : slots_) {
      slot.grad.assign(size, 0.0f);
      slot.grad_views = ViewsLike(context.weights, slot.grad);
      if (depth_ > 1) {  // one in flight: the reply goes straight to the weights
        slot.reply.assign(size, 0.0f);
        slot.reply_views = ViewsLike(context.weights, slot.reply);
      }
    }
  }
  // Waits for the pushes still out (their threads use the slots).
  ~PushPipeline() {
    for (Pending& push : pending_) {
      if (push.outcome.valid()) push.outcome.wait();
    }
  }

  int depth() const { return depth_; }
  size_t pending() const { return pending_.size(); }
  bool full() const { return pending_.size() >= static_cast<size_t>(depth_); }
  // The slot the next window fills (free: at most depth - 1 are out).
  Slot& next() { return slots_[next_]; }

  // Sends next()'s gradient, computed on the weights the rank has.
  void Send(double samples) {
    Slot& slot = slots_[next_];
    const uint64_t base = context_.version;
    pending_.push_back(
        {std::async(std::launch::async,
                    [this, &slot, base, samples] {
                      return SendUpdate(context_, base, v1::UPDATE_KIND_GRADIENT,
                                        ConstViews(slot.grad_views), slot.reply_views,
                                        samples);
                    }),
         next_});
    next_ = (next_ + 1) % depth_;
  }
  // A push another rank sent (sync's leader).
  void Count() {
    pending_.push_back({std::future<PushOutcome>(), next_});
    next_ = (next_ + 1) % depth_;
  }

  // Waits for the oldest push and installs the weights it brought back,
  // unless the rank has newer ones: pushes sent together may be applied in
  // either order, and the weights never go back to an older version. A
  // counted push installs nothing.
  absl::Status Take() {
    Pending push = std::move(pending_.front());
    pending_.pop_front();
    if (!push.outcome.valid()) return absl::OkStatus();
    const absl::Time start = absl::Now();
    const PushOutcome outcome = push.outcome.get();
    context_.times.master += SecondsSince(start);
    const uint64_t had = context_.version;
    if (outcome.version.ok() && *outcome.version <= had && had > 0) {
      if (outcome.stale) ++context_.stale_dropped;
      return absl::OkStatus();  // an older reply than the weights here
    }
    MPILEARN_ASSIGN_OR_RETURN(const bool applied, TakeOutcome(context_, outcome));
    if (applied) {
      const Slot& slot = slots_[push.slot];
      for (size_t t = 0; t < context_.weights.size(); ++t) {
        std::copy(slot.reply_views[t].begin(), slot.reply_views[t].end(),
                  context_.weights[t].begin());
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Pending {
    std::future<PushOutcome> outcome;  // not valid: counted, not sent here
    int slot;
  };

  ExchangeContext& context_;
  const int depth_;
  std::vector<Slot> slots_;
  int next_ = 0;
  // Last: destroyed first, so no push thread outlives the slots it uses.
  std::deque<Pending> pending_;
};

// downpour: every rank pushes its window's mean gradient on its own. With
// updates_in_flight N > 1 the rank goes on computing on the weights it has
// and waits only when N pushes are out, for the oldest, whose weights it
// then takes.
class DownpourExchange final : public Exchange {
 public:
  DownpourExchange(ExchangeContext& context, int in_flight)
      : Exchange(context), pushes_(context, in_flight) {}

  absl::Status Window(double samples) override {
    PushPipeline::Slot& slot = pushes_.next();
    TakeGradients(slot.grad);
    if (samples <= 0) return absl::OkStatus();
    DivideBy(samples, buffers_offset(), slot.grad);
    PutBuffers(slot.grad);
    if (pushes_.depth() == 1) {
      return PushUpdate(context_, v1::UPDATE_KIND_GRADIENT, ConstViews(slot.grad_views),
                        context_.weights, samples);
    }
    pushes_.Send(samples);
    while (pushes_.full()) MPILEARN_RETURN_IF_ERROR(pushes_.Take());
    return absl::OkStatus();
  }

  bool has_pending() const override { return pushes_.pending() > 0; }

  absl::Status Drain() override {
    absl::Status first = absl::OkStatus();
    while (pushes_.pending() > 0) {
      absl::Status taken = pushes_.Take();
      if (first.ok()) first = taken;
    }
    return first;
  }

 private:
  PushPipeline pushes_;
};

// sync: the group's gradient mean over its samples, pushed by the leader;
// every rank takes the leader's answer. With updates_in_flight N > 1 the
// leader's push runs while the group computes its next window on the
// weights it has (every rank the same ones); when N pushes are out the
// group takes the oldest: the leader waits for it, and every rank agrees on
// its outcome and receives its weights.
class SyncExchange final : public Exchange {
 public:
  SyncExchange(ExchangeContext& context, int in_flight)
      : Exchange(context), pushes_(context, in_flight) {}

  absl::Status Window(double samples) override {
    PushPipeline::Slot& slot = pushes_.next();
    std::vector<float>& grad = slot.grad;
    TakeGradients(grad);
    PutBuffers(grad);
    // Sum of gradient sums and of sample counts over the group, then the
    // mean (of the buffers: over the ranks); the leader pushes it and
    // everyone takes the returned weights.
    Collectives& group = context_.group;
    const absl::Time start = absl::Now();
    {
      TraceSpan span(context_.trace, "allreduce", "mpi");
      group.AllreduceSum(absl::MakeSpan(grad));
      std::vector<double> count = {samples};
      group.AllreduceSum(absl::MakeSpan(count));
      samples = count[0];
    }
    context_.times.mpi += SecondsSince(start);
    if (samples <= 0) return absl::OkStatus();
    DivideBy(samples, buffers_offset(), grad);
    const float ranks = static_cast<float>(group.size());
    for (size_t i = buffers_offset(); i < grad.size(); ++i) grad[i] /= ranks;
    if (pushes_.depth() == 1) {
      absl::Status pushed = absl::OkStatus();
      if (group.rank() == 0) {
        pushed = PushUpdate(context_, v1::UPDATE_KIND_GRADIENT, ConstViews(slot.grad_views),
                            context_.weights, samples);
      }
      return Share(pushed);
    }
    if (group.rank() == 0) {
      pushes_.Send(samples);
    } else {
      pushes_.Count();
    }
    while (pushes_.full()) MPILEARN_RETURN_IF_ERROR(TakeOne());
    return absl::OkStatus();
  }

  bool has_pending() const override { return pushes_.pending() > 0; }

  absl::Status Drain() override {
    while (pushes_.pending() > 0) MPILEARN_RETURN_IF_ERROR(TakeOne());
    return absl::OkStatus();
  }

 private:
  // The group takes its oldest push (a collective).
  absl::Status TakeOne() { return Share(pushes_.Take()); }

  // The leader's `status`, then its weights, to every rank (a collective).
  absl::Status Share(const absl::Status& status) {
    const absl::Time start = absl::Now();
    TraceSpan span(context_.trace, "broadcast", "mpi");
    MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(context_, status));
    for (absl::Span<float> view : context_.weights) context_.group.Broadcast(view, 0);
    context_.times.mpi += SecondsSince(start);
    return absl::OkStatus();
  }

  PushPipeline pushes_;
};

// easgd: local steps per batch (sgd or adam, easgd.worker_optimizer); the
// elastic exchange per window.
class ElasticExchange final : public Exchange {
 public:
  ElasticExchange(ExchangeContext& context, const v1::EasgdSpec& spec)
      : Exchange(context),
        alpha_(static_cast<float>(spec.alpha())),
        sent_(TotalSize(context.weights)),
        centre_(TotalSize(context.weights)) {
    sent_views_ = ViewsLike(context.weights, sent_);
    centre_views_ = ViewsLike(context.weights, centre_);
    const v1::OptimizerSpec& local = spec.worker_optimizer();
    if (local.name() == "adam") {
      local_optimizer_ = std::make_unique<torch::optim::Adam>(
          context.params, torch::optim::AdamOptions(local.learning_rate())
                              .betas(std::make_tuple(local.beta1(), local.beta2()))
                              .eps(local.epsilon())
                              .weight_decay(local.weight_decay()));
    } else {
      local_optimizer_ = std::make_unique<torch::optim::SGD>(
          context.params, torch::optim::SGDOptions(local.learning_rate())
                              .momentum(local.momentum())
                              .nesterov(local.nesterov())
                              .weight_decay(local.weight_decay()));
    }
  }

  void AfterBatch(int64_t samples) override {
    // The local optimizer steps on the batch's mean gradient.
    TraceSpan span(context_.trace, "local_step", "compute");
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : context_.params) {
      if (p.grad().defined()) p.mutable_grad().div_(static_cast<double>(samples));
    }
    local_optimizer_->step();
    local_optimizer_->zero_grad();
  }

  absl::Status Window(double samples) override {
    // The master moves the centre c toward x and returns c as it was, and
    // x moves toward it by the same force.
    const std::vector<absl::Span<float>>& x = context_.weights;
    for (size_t i = 0; i < x.size(); ++i) {
      std::copy(x[i].begin(), x[i].end(), sent_views_[i].begin());
    }
    MPILEARN_RETURN_IF_ERROR(PushUpdate(context_, v1::UPDATE_KIND_ELASTIC,
                                        ConstViews(sent_views_), centre_views_,
                                        samples));
    for (size_t i = 0; i < x.size(); ++i) {
      float* w = x[i].data();
      const float* c = centre_views_[i].data();
      for (size_t k = 0; k < x[i].size(); ++k) w[k] -= alpha_ * (w[k] - c[k]);
    }
    return absl::OkStatus();
  }

  bool keeps_local_weights() const override { return true; }

 private:
  const float alpha_;
  std::unique_ptr<torch::optim::Optimizer> local_optimizer_;
  // The weights sent (a copy: the reply may arrive while they are read) and
  // the centre received, flat with per-tensor views.
  std::vector<float> sent_;
  std::vector<absl::Span<float>> sent_views_;
  std::vector<float> centre_;
  std::vector<absl::Span<float>> centre_views_;
};

// gem: the local update scaled elementwise by gradient energy matching
// (Hermans and Louppe, 2018, as their reference worker computes it). The
// proxy is momentum SGD on this rank's gradients, m = momentum * m + u with
// u = -lr * g; the central variable should move no more than kappa * |m|
// between two of this rank's exchanges, all ranks together. The movement
// already seen since the previous exchange, dc (this rank's own last delta
// plus what the other ranks added), is subtracted from that budget and the
// rest is this rank's share: pi = clip((kappa |m| - |dc|) / |u|, 0, 5), and
// the delta pushed is pi * u. With gem.worker_optimizer, u is that
// optimizer's step on g instead (LocalStep). Unlike the reference, which pulls the centre
// just before it pushes, dc is read from the replies (the weights the rank
// holds), so the other ranks' part lags by one exchange; the rule is the
// same. Called from the rank's training thread only.
class GemExchange final : public Exchange {
 public:
  GemExchange(ExchangeContext& context, const v1::GemSpec& spec,
              std::optional<LocalStep> local_step)
      : Exchange(context),
        local_step_(std::move(local_step)),
        learning_rate_(static_cast<float>(spec.learning_rate())),
        momentum_(static_cast<float>(spec.momentum())),
        kappa_(static_cast<float>(spec.kappa())),
        delta_(TotalSize(context.weights)),
        moment_(TotalSize(context.weights)),
        last_centre_(TotalSize(context.weights)) {
    delta_views_ = ViewsLike(context.weights, delta_);
  }

  absl::Status Start() override {
    // The last centre starts at the weights every rank starts from, so the
    // first update sees no central-variable movement.
    std::fill(moment_.begin(), moment_.end(), 0.0f);
    size_t offset = 0;
    for (const absl::Span<float>& w : context_.weights) {
      std::copy(w.begin(), w.end(), last_centre_.begin() + offset);
      offset += w.size();
    }
    return absl::OkStatus();
  }

  absl::Status Window(double samples) override {
    TakeGradients(delta_);
    if (samples <= 0) return absl::OkStatus();
    DivideBy(samples, buffers_offset(), delta_);
    // delta_ holds the mean gradient g; it becomes the delta u * pi, with
    // u = -lr g. The parameters hold the centre as of the last exchange.
    // Buffers are not deltas: they carry their values.
    constexpr float kEpsilon = 1e-12f;
    if (local_step_.has_value()) local_step_->Begin();
    size_t offset = 0;
    for (size_t t = 0; t < context_.params.size(); ++t) {
      const absl::Span<float>& weights = context_.weights[t];
      const float* w = weights.data();
      float* g = delta_.data() + offset;
      float* m = moment_.data() + offset;
      float* last = last_centre_.data() + offset;
      // The rank's own optimizer turns g into its step u in place.
      if (local_step_.has_value()) {
        local_step_->Step(offset, weights, absl::MakeSpan(g, weights.size()));
      }
      for (size_t k = 0; k < weights.size(); ++k) {
        const float u = local_step_.has_value() ? g[k] : -learning_rate_ * g[k];
        m[k] = momentum_ * m[k] + u;
        const float centre_moved = w[k] - last[k];
        last[k] = w[k];
        float pi = (kappa_ * std::fabs(m[k]) - std::fabs(centre_moved)) /
                   std::fabs(u + kEpsilon);
        pi = std::min(5.0f, std::max(0.0f, pi));
        g[k] = u * pi;
      }
      offset += weights.size();
    }
    PutBuffers(delta_);
    return PushUpdate(context_, v1::UPDATE_KIND_DELTA, ConstViews(delta_views_),
                      context_.weights, samples);
  }

 private:
  std::optional<LocalStep> local_step_;
  const float learning_rate_;
  const float momentum_;
  const float kappa_;
  // Flat, laid out as the weights: the window's gradient, then the delta
  // (with per-tensor views); the momentum proxy; the centre as the last
  // exchange returned it.
  std::vector<float> delta_;
  std::vector<absl::Span<float>> delta_views_;
  std::vector<float> moment_;
  std::vector<float> last_centre_;
};

}  // namespace

void AttachParameters(ExchangeContext& context, std::vector<torch::Tensor> state,
                      const std::vector<std::string>& names,
                      size_t num_parameters, bool mirror) {
  TORCH_CHECK(num_parameters <= state.size() && names.size() == state.size());
  context.mirrored = mirror;
  for (const torch::Tensor& t : state) {
    TORCH_CHECK(t.is_contiguous() && t.scalar_type() == torch::kFloat32);
    if (!t.is_cpu()) context.mirrored = true;
  }
  context.weights.clear();
  context.host.clear();
  std::vector<std::vector<int64_t>> shapes;
  for (torch::Tensor& t : state) {
    shapes.emplace_back(t.sizes().begin(), t.sizes().end());
    if (context.mirrored) {
      context.host.emplace_back(static_cast<size_t>(t.numel()));
      context.weights.emplace_back(context.host.back());
    } else {
      context.weights.emplace_back(t.data_ptr<float>(), t.numel());
    }
  }
  context.layout = MakeFloat32Header(0, names, shapes);
  for (size_t i = num_parameters; i < state.size(); ++i) {
    context.layout.mutable_tensors(static_cast<int>(i))->set_buffer(true);
  }
  context.state = state;
  state.resize(num_parameters);
  context.params = std::move(state);
  context.FromModel();
}

void ExchangeContext::FromModel() {
  if (!mirrored) return;
  for (size_t i = 0; i < state.size(); ++i) {
    const torch::Tensor on_host = state[i].detach().to(torch::kCPU).contiguous();
    std::memcpy(weights[i].data(), on_host.data_ptr<float>(),
                weights[i].size() * sizeof(float));
  }
}

void ExchangeContext::ToModel() {
  if (!mirrored) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < state.size(); ++i) {
    state[i].copy_(torch::from_blob(weights[i].data(), state[i].sizes(),
                                    torch::kFloat32));
  }
}

absl::Status Exchange::EndWindow(double samples) {
  context_.FromModel();
  const absl::Status status = Window(samples);
  context_.ToModel();
  return status;
}

absl::Status Exchange::Flush() {
  if (!has_pending()) return absl::OkStatus();
  context_.FromModel();
  const absl::Status status = Drain();
  context_.ToModel();
  return status;
}

absl::Status AgreeOnLeaderStatus(ExchangeContext& context,
                                 const absl::Status& status) {
  absl::Status agreed = BroadcastStatus(context.group, status, 0);
  if (!agreed.ok()) context.failed_together = true;
  return agreed;
}

absl::Status AgreeOnAllRanks(ExchangeContext& context, const absl::Status& status) {
  std::string mine;
  if (!status.ok()) {
    mine = absl::StrCat(static_cast<int>(status.code()), " ", status.message());
  }
  const std::vector<std::string> all = context.group.GatherStrings(mine, 0);
  absl::Status first = absl::OkStatus();
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const size_t space = all[r].find(' ');
    int code = static_cast<int>(absl::StatusCode::kUnknown);
    if (space == std::string::npos || !absl::SimpleAtoi(all[r].substr(0, space), &code)) {
      code = static_cast<int>(absl::StatusCode::kUnknown);
    }
    const std::string message =
        space == std::string::npos ? all[r] : all[r].substr(space + 1);
    first = absl::Status(static_cast<absl::StatusCode>(code),
                         r == 0 ? message : absl::StrCat("rank ", r, ": ", message));
    break;
  }
  return AgreeOnLeaderStatus(context, first);
}

PushOutcome SendUpdate(const ExchangeContext& context, uint64_t base_version,
                       v1::UpdateKind kind,
                       absl::Span<const absl::Span<const float>> payload,
                       absl::Span<const absl::Span<float>> reply, double samples) {
  const absl::Time start = absl::Now();
  TraceSpan span(context.trace, "push", "master");
  span.Arg("samples", static_cast<int64_t>(samples));
  span.Arg("version", static_cast<int64_t>(base_version));
  v1::PushGradientRequest::Header header;
  header.set_job_id(context.job_id);
  header.set_group_id(context.group_id);
  header.set_rank(context.group.rank());
  *header.mutable_gradient() = context.layout;
  header.mutable_gradient()->set_version(base_version);
  header.set_samples(static_cast<uint64_t>(samples));
  header.set_kind(kind);
  PushOutcome outcome;
  outcome.version = context.master.PushGradient(header, payload, reply);
  outcome.stale = !outcome.version.ok() && IsStaleRejection(outcome.version.status());
  const bool refused = !outcome.version.ok() && IsUpdateRejected(outcome.version.status());
  if (outcome.stale || refused) {
    // Not applied (too stale, or it would have made the weights NaN/Inf):
    // continue from the newest weights. The master fails the job itself
    // after too many refusals in a row.
    if (outcome.stale) {
      span.Arg("stale", 1);
      VLOG(1) << "[rank " << context.group.rank() << "] "
              << outcome.version.status().message();
    } else {
      span.Arg("refused", 1);
      LOG(WARNING) << "[rank " << context.group.rank() << "] "
                   << outcome.version.status().message();
    }
    TraceSpan pull(context.trace, "pull", "master");
    outcome.version = context.master.PullWeights(context.job_id, context.group_id, reply);
  }
  outcome.seconds = SecondsSince(start);
  return outcome;
}

absl::StatusOr<bool> TakeOutcome(ExchangeContext& context, const PushOutcome& outcome) {
  if (outcome.stale) ++context.stale_dropped;
  if (!outcome.version.ok() && IsGroupUnknown(outcome.version.status())) {
    // The master no longer knows this group (it restarted, or declared the
    // group lost). Drop the update; the leader's next data-unit request
    // fails the same way, and the whole group re-registers together.
    VLOG(1) << "[rank " << context.group.rank() << "] "
            << outcome.version.status().message();
    return false;
  }
  if (!outcome.version.ok()) return outcome.version.status();
  context.version = *outcome.version;
  return true;
}

absl::Status PushUpdate(ExchangeContext& context, v1::UpdateKind kind,
                        absl::Span<const absl::Span<const float>> payload,
                        absl::Span<const absl::Span<float>> reply,
                        double samples) {
  const PushOutcome outcome =
      SendUpdate(context, context.version, kind, payload, reply, samples);
  context.times.master += outcome.seconds;
  return TakeOutcome(context, outcome).status();
}

void Exchange::TakeGradients(std::vector<float>& flat) {
  size_t offset = 0;
  for (torch::Tensor& p : context_.params) {
    torch::Tensor& grad = p.mutable_grad();
    const size_t n = static_cast<size_t>(p.numel());
    if (grad.defined()) {
      // The one place gradients leave the device.
      const torch::Tensor on_host =
          grad.is_cpu() ? grad.contiguous() : grad.to(torch::kCPU).contiguous();
      std::memcpy(flat.data() + offset, on_host.data_ptr<float>(), n * sizeof(float));
      grad.zero_();
    } else {
      std::memset(flat.data() + offset, 0, n * sizeof(float));
    }
    offset += n;
  }
}

size_t Exchange::buffers_offset() const {
  size_t offset = 0;
  for (size_t t = 0; t < context_.params.size(); ++t) {
    offset += context_.weights[t].size();
  }
  return offset;
}

void Exchange::PutBuffers(std::vector<float>& flat) const {
  size_t offset = buffers_offset();
  for (size_t t = context_.params.size(); t < context_.weights.size(); ++t) {
    const absl::Span<float> buffer = context_.weights[t];
    std::copy(buffer.begin(), buffer.end(), flat.begin() + offset);
    offset += buffer.size();
  }
}

absl::StatusOr<std::unique_ptr<Exchange>> MakeExchange(const v1::JobSpec& spec,
                                                       ExchangeContext& context) {
  const v1::Algorithm algorithm = AlgorithmOf(spec);
  switch (algorithm) {
    case v1::ALGORITHM_DOWNPOUR:
      return std::make_unique<DownpourExchange>(
          context, std::max(1, spec.exchange().updates_in_flight()));
    case v1::ALGORITHM_SYNC:
      return std::make_unique<SyncExchange>(
          context, std::max(1, spec.exchange().updates_in_flight()));
    case v1::ALGORITHM_EASGD:
      return std::make_unique<ElasticExchange>(context, spec.easgd());
    case v1::ALGORITHM_GEM: {
      std::optional<LocalStep> local_step;
      if (spec.gem().has_worker_optimizer()) {
        // Sized as gem's other flat buffers (the parameters come first).
        MPILEARN_ASSIGN_OR_RETURN(local_step, LocalStep::Create(spec.gem().worker_optimizer(),
                                                                TotalSize(context.weights)));
      }
      return std::make_unique<GemExchange>(context, spec.gem(), std::move(local_step));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown algorithm \"", spec.algorithm(),
                       "\": expected downpour, sync, easgd or gem"));
  }
}

}  // namespace mpilearn::worker
