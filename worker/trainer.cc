#include "worker/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "worker/model.h"

namespace mpilearn::worker {
namespace {

// Wall-clock seconds since `start`.
double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

std::vector<absl::Span<const float>> ConstViews(
    const std::vector<absl::Span<float>>& views) {
  return std::vector<absl::Span<const float>>(views.begin(), views.end());
}

// Per-tensor views into `flat`, laid out like `params`.
std::vector<absl::Span<float>> ViewsLike(const std::vector<torch::Tensor>& params,
                                         std::vector<float>& flat) {
  std::vector<absl::Span<float>> views;
  size_t offset = 0;
  for (const torch::Tensor& p : params) {
    views.emplace_back(flat.data() + offset, p.numel());
    offset += p.numel();
  }
  return views;
}

// This process's CPU time (user + system), in seconds.
double ProcessCpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0.0;
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// This process's resident memory now, in bytes (0 if unknown).
double ResidentBytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0.0;
  unsigned long long size = 0, resident = 0;
  const bool read = std::fscanf(statm, "%llu %llu", &size, &resident) == 2;
  std::fclose(statm);
  if (!read) return 0.0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Broadcasts the leader's outcome: every rank returns the leader's status
// (non-leaders as ABORTED: they stop on the leader's word).
absl::Status BroadcastLeaderStatus(Collectives& group, const absl::Status& status) {
  std::string message = status.ok() ? "" : std::string(status.message());
  group.Broadcast(&message, 0);
  if (message.empty()) return absl::OkStatus();
  if (group.rank() == 0) return status;
  return absl::AbortedError("the leader failed: " + message);
}

}  // namespace

bool IsGroupUnknown(const absl::Status& status) {
  // Non-leader ranks see the leader's message inside an ABORTED status.
  const bool code_fits = status.code() == absl::StatusCode::kNotFound ||
                         status.code() == absl::StatusCode::kFailedPrecondition ||
                         status.code() == absl::StatusCode::kAborted;
  return code_fits && (absl::StrContains(status.message(), "RegisterGroup first") ||
                       absl::StrContains(status.message(), "is not an active group") ||
                       absl::StrContains(status.message(), "was declared lost"));
}

namespace {

bool IsStaleRejection(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         absl::StrContains(status.message(), "stale update");
}

}  // namespace

Trainer::Trainer(Collectives& group, MasterConnection& master,
                 v1::RegisterGroupResponse registration, DatasetSplits data,
                 TrainerOptions options)
    : group_(group),
      master_(master),
      registration_(std::move(registration)),
      spec_(registration_.spec()),
      data_(std::move(data)),
      options_(options),
      trace_(options.trace) {
  if (leader() && options_.progress.mode != ProgressMode::kOff) {
    progress_ = std::make_unique<ProgressReporter>(options_.progress);
  }
}

absl::Status Trainer::AgreeOnLeaderStatus(const absl::Status& status) {
  absl::Status agreed = BroadcastLeaderStatus(group_, status);
  if (!agreed.ok()) failed_together_ = true;
  return agreed;
}

std::array<double, 6> Trainer::OwnTelemetry() const {
  return {times_.data,         times_.compute, times_.master,
          times_.mpi,          ProcessCpuSeconds(), ResidentBytes()};
}

void Trainer::SetTelemetry(const double* figures) {
  telemetry_.set_data_seconds(figures[0]);
  telemetry_.set_compute_seconds(figures[1]);
  telemetry_.set_master_seconds(figures[2]);
  telemetry_.set_mpi_seconds(figures[3]);
  telemetry_.set_cpu_seconds(figures[4]);
  telemetry_.set_resident_bytes(static_cast<uint64_t>(figures[5]));
}

absl::Status Trainer::BuildModelAndInitWeights() {
  // Same seed on every rank and every group: the initial weights are a
  // function of the job alone.
  torch::manual_seed(spec_.seed());
  const auto sizes = data_.train.images.sizes();
  MPILEARN_ASSIGN_OR_RETURN(
      model_, BuildModel(spec_.model(), sizes[1], sizes[2], sizes[3],
                         data_.num_classes));
  params_ = ModelParameters(model_);
  const std::vector<std::string> names = ModelParameterNames(model_);
  std::vector<std::vector<int64_t>> shapes;
  size_t total = 0;
  for (torch::Tensor& p : params_) {
    TORCH_CHECK(p.is_contiguous() && p.scalar_type() == torch::kFloat32);
    shapes.emplace_back(p.sizes().begin(), p.sizes().end());
    param_views_.emplace_back(p.data_ptr<float>(), p.numel());
    total += p.numel();
  }
  layout_ = MakeFloat32Header(0, names, shapes);
  grad_.assign(total, 0.0f);
  grad_views_ = ViewsLike(params_, grad_);
  scratch_.assign(total, 0.0f);
  scratch_views_ = ViewsLike(params_, scratch_);

  if (algorithm() == "easgd") {
    const v1::OptimizerSpec& local = spec_.easgd().worker_optimizer();
    local_optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(local.learning_rate())
                     .momentum(local.momentum())
                     .nesterov(local.nesterov())
                     .weight_decay(local.weight_decay()));
  }

  if (leader() && !registration_.weights_initialized()) {
    MPILEARN_ASSIGN_OR_RETURN(
        bool accepted,
        master_.InitWeights(registration_.job_id(), registration_.group_id(),
                            layout_, ConstViews(param_views_)));
    LOG(INFO) << "[rank 0] initial weights "
              << (accepted ? "installed on the master"
                           : "from another group are used");
  }
  MPILEARN_RETURN_IF_ERROR(SyncToMasterWeights());
  if (algorithm() == "gem") {
    // GEM's "stale" copy starts at the weights every rank starts from, so
    // the first update sees no central-variable movement.
    gem_moment_.assign(total, 0.0f);
    for (size_t i = 0; i < param_views_.size(); ++i) {
      std::copy(param_views_[i].begin(), param_views_[i].end(),
                scratch_views_[i].begin());
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::SyncToMasterWeights() {
  absl::Status pulled = absl::OkStatus();
  if (leader()) {
    TraceSpan span(trace_, "pull", "master");
    absl::StatusOr<uint64_t> version = master_.PullWeights(
        registration_.job_id(), registration_.group_id(), param_views_);
    if (version.ok()) {
      version_ = *version;
      span.Arg("version", static_cast<int64_t>(version_));
    } else {
      pulled = version.status();
    }
  }
  {
    TraceSpan span(trace_, "broadcast", "mpi");
    MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(pulled));
    for (absl::Span<float> view : param_views_) group_.Broadcast(view, 0);
  }
  TraceSpan span(trace_, "allreduce", "mpi");
  std::vector<double> version = {leader() ? static_cast<double>(version_) : 0.0};
  group_.AllreduceSum(absl::MakeSpan(version));
  version_ = static_cast<uint64_t>(version[0]);
  return absl::OkStatus();
}

void Trainer::TakeGradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    float* dest = grad_views_[i].data();
    if (grad.defined()) {
      std::memcpy(dest, grad.data_ptr<float>(), grad_views_[i].size() * sizeof(float));
      grad.zero_();
    } else {
      std::memset(dest, 0, grad_views_[i].size() * sizeof(float));
    }
  }
}

absl::Status Trainer::Push(v1::UpdateKind kind,
                           absl::Span<const absl::Span<const float>> payload,
                           absl::Span<const absl::Span<float>> reply,
                           double samples) {
  const absl::Time start = absl::Now();
  TraceSpan span(trace_, "push", "master");
  span.Arg("samples", static_cast<int64_t>(samples));
  span.Arg("version", static_cast<int64_t>(version_));
  v1::PushGradientRequest::Header header;
  header.set_job_id(registration_.job_id());
  header.set_group_id(registration_.group_id());
  header.set_rank(group_.rank());
  *header.mutable_gradient() = layout_;
  header.mutable_gradient()->set_version(version_);
  header.set_samples(static_cast<uint64_t>(samples));
  header.set_kind(kind);
  absl::StatusOr<uint64_t> version = master_.PushGradient(header, payload, reply);
  if (!version.ok() && IsStaleRejection(version.status())) {
    // Dropped as too stale: continue from the newest weights.
    ++stale_dropped_;
    span.Arg("stale", 1);
    VLOG(1) << "[rank " << group_.rank() << "] " << version.status().message();
    TraceSpan pull(trace_, "pull", "master");
    version = master_.PullWeights(registration_.job_id(),
                                  registration_.group_id(), reply);
  }
  times_.master += SecondsSince(start);
  span.End();
  if (!version.ok() && IsGroupUnknown(version.status())) {
    // The master no longer knows this group (it restarted, or declared the
    // group lost). Drop the update; the leader's next data-unit request
    // fails the same way, and the whole group re-registers together.
    VLOG(1) << "[rank " << group_.rank() << "] " << version.status().message();
    return absl::OkStatus();
  }
  if (!version.ok()) return version.status();
  version_ = *version;
  return absl::OkStatus();
}

absl::Status Trainer::Exchange(double samples) {
  const std::string& algo = algorithm();
  if (algo == "easgd") {
    // Local steps were taken batch by batch; now the elastic exchange:
    // the master moves the centre c toward x and returns c as it was,
    // and x moves toward it by the same force.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < param_views_.size(); ++i) {
      std::copy(param_views_[i].begin(), param_views_[i].end(),
                grad_views_[i].begin());
    }
    MPILEARN_RETURN_IF_ERROR(Push(v1::UPDATE_KIND_ELASTIC, ConstViews(grad_views_),
                                  scratch_views_, samples));
    const float alpha = static_cast<float>(spec_.easgd().alpha());
    for (size_t i = 0; i < param_views_.size(); ++i) {
      float* x = param_views_[i].data();
      const float* c = scratch_views_[i].data();
      for (size_t k = 0; k < param_views_[i].size(); ++k) x[k] -= alpha * (x[k] - c[k]);
    }
    return absl::OkStatus();
  }

  TakeGradients();
  if (algo == "sync") {
    // Sum of gradient sums and of sample counts over the group, then the
    // mean; the leader pushes it and everyone takes the returned weights.
    absl::Time start = absl::Now();
    {
      TraceSpan span(trace_, "allreduce", "mpi");
      group_.AllreduceSum(absl::MakeSpan(grad_));
      std::vector<double> count = {samples};
      group_.AllreduceSum(absl::MakeSpan(count));
      samples = count[0];
    }
    times_.mpi += SecondsSince(start);
    if (samples <= 0) return absl::OkStatus();
    const float scale = static_cast<float>(1.0 / samples);
    for (float& g : grad_) g *= scale;
    absl::Status pushed = absl::OkStatus();
    if (leader()) {
      pushed = Push(v1::UPDATE_KIND_GRADIENT, ConstViews(grad_views_),
                    param_views_, samples);
    }
    start = absl::Now();
    TraceSpan span(trace_, "broadcast", "mpi");
    MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(pushed));
    for (absl::Span<float> view : param_views_) group_.Broadcast(view, 0);
    times_.mpi += SecondsSince(start);
    return absl::OkStatus();
  }

  if (samples <= 0) return absl::OkStatus();
  const float scale = static_cast<float>(1.0 / samples);
  for (float& g : grad_) g *= scale;
  if (algo == "gem") {
    // mpi_learn's GEM: the local update u = -lr * g feeds the rank's
    // momentum proxy; the central variable's movement since the last
    // exchange is measured against it, and u is scaled elementwise by
    // pi = clip((kappa |moment| - |centre movement|) / |u|, 0, 5).
    const float lr = static_cast<float>(spec_.gem().learning_rate());
    const float momentum = static_cast<float>(spec_.gem().momentum());
    const float kappa = static_cast<float>(spec_.gem().kappa());
    constexpr float kEpsilon = 1e-12f;
    size_t offset = 0;
    for (size_t i = 0; i < param_views_.size(); ++i) {
      const float* w = param_views_[i].data();
      float* stale = scratch_views_[i].data();
      float* g = grad_views_[i].data();
      float* m = gem_moment_.data() + offset;
      for (size_t k = 0; k < param_views_[i].size(); ++k) {
        const float u = -lr * g[k];
        m[k] = momentum * m[k] + u;
        const float centre_moved = w[k] - stale[k];
        stale[k] = w[k];
        float pi = (kappa * std::fabs(m[k]) - std::fabs(centre_moved)) /
                   std::fabs(u + kEpsilon);
        pi = std::min(5.0f, std::max(0.0f, pi));
        g[k] = u * pi;  // the delta the master adds
      }
      offset += param_views_[i].size();
    }
    return Push(v1::UPDATE_KIND_DELTA, ConstViews(grad_views_), param_views_,
                samples);
  }
  return Push(v1::UPDATE_KIND_GRADIENT, ConstViews(grad_views_), param_views_,
              samples);
}

const torch::Tensor& Trainer::EpochOrder(int epoch) {
  auto it = orders_.find(epoch);
  if (it == orders_.end()) {
    // Only the current and the next epoch are ever in use.
    while (orders_.size() > 2) orders_.erase(orders_.begin());
    it = orders_
             .emplace(epoch, torch::randperm(
                                 data_.train.size(),
                                 torch::make_generator<at::CPUGeneratorImpl>(
                                     spec_.seed() * 1000003 +
                                     static_cast<uint64_t>(epoch))))
             .first;
  }
  return it->second;
}

absl::StatusOr<v1::CompletedUnit> Trainer::TrainUnit(const v1::DataUnit& unit) {
  const int rank = group_.rank();
  const int world = group_.size();
  const int64_t n = unit.end() - unit.begin();
  const int64_t batch = spec_.batch_size();
  // Shards differ by at most one sample; every rank runs as many steps as
  // the largest shard needs, so the sync collectives always pair up.
  const int64_t largest_shard = (n + world - 1) / world;
  const int64_t steps = (largest_shard + batch - 1) / batch;
  torch::Tensor mine = EpochOrder(unit.epoch())
                           .slice(0, unit.begin() + n * rank / world,
                                  unit.begin() + n * (rank + 1) / world);
  const bool local_steps = algorithm() == "easgd";
  double loss_sum = 0.0;
  double window_samples = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    absl::Time t = absl::Now();
    const int64_t begin = std::min(step * batch, mine.size(0));
    const int64_t end = std::min(begin + batch, mine.size(0));
    if (end > begin) {
      torch::Tensor x, y;
      {
        TraceSpan span(trace_, "data_load", "data");
        torch::Tensor index = mine.slice(0, begin, end);
        x = data_.train.images.index_select(0, index);
        y = data_.train.labels.index_select(0, index);
      }
      times_.data += SecondsSince(t);
      t = absl::Now();
      {
        TraceSpan span(trace_, "forward_backward", "compute");
        // Summed (not averaged) loss: gradients of several batches and
        // ranks add up, and Exchange divides by the sample count once.
        torch::Tensor loss = SummedCrossEntropy(model_->forward(x), y);
        loss.backward();
        loss_sum += loss.item<double>();
      }
      window_samples += static_cast<double>(end - begin);
      if (local_steps) {
        // EASGD's local optimizer steps on the batch mean.
        TraceSpan span(trace_, "local_step", "compute");
        torch::NoGradGuard no_grad;
        for (torch::Tensor& p : params_) {
          if (p.grad().defined()) p.mutable_grad().div_(static_cast<double>(end - begin));
        }
        local_optimizer_->step();
        local_optimizer_->zero_grad();
      }
      times_.compute += SecondsSince(t);
    }
    if (options_.slowdown_ms_per_batch > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(options_.slowdown_ms_per_batch));
    }
    if ((step + 1) % spec_.sync_every() == 0 || step + 1 == steps) {
      MPILEARN_RETURN_IF_ERROR(Exchange(window_samples));
      window_samples = 0.0;
    }
  }
  // The unit's loss and samples, and (riding along, for the leader's
  // telemetry) every rank's cumulative figures.
  double totals[8] = {loss_sum, static_cast<double>(mine.size(0))};
  const std::array<double, 6> own = OwnTelemetry();
  std::copy(own.begin(), own.end(), totals + 2);
  const absl::Time t = absl::Now();
  {
    TraceSpan span(trace_, "allreduce", "mpi");
    group_.AllreduceSum(absl::MakeSpan(totals, 8));
  }
  times_.mpi += SecondsSince(t);
  SetTelemetry(totals + 2);
  have_group_telemetry_ = true;
  v1::CompletedUnit completed;
  completed.set_unit_id(unit.unit_id());
  completed.set_loss_sum(totals[0]);
  completed.set_samples(static_cast<uint64_t>(totals[1]));
  return completed;
}

absl::StatusOr<v1::NextDataUnitResponse> Trainer::NextUnit(
    const std::vector<v1::CompletedUnit>& completed) {
  std::string payload;
  absl::Status asked = absl::OkStatus();
  if (leader()) {
    v1::NextDataUnitRequest request;
    request.set_job_id(registration_.job_id());
    request.set_group_id(registration_.group_id());
    request.set_train_samples(data_.train.size());
    for (const v1::CompletedUnit& unit : completed) *request.add_completed() = unit;
    if (!have_group_telemetry_) {
      // No unit trained yet: the leader's own figures.
      const std::array<double, 6> own = OwnTelemetry();
      SetTelemetry(own.data());
    }
    *request.mutable_telemetry() = telemetry_;
    request.mutable_telemetry()->set_wall_seconds(SecondsSince(run_start_));
    const absl::Time start = absl::Now();
    TraceSpan span(trace_, "next_unit", "master");
    absl::StatusOr<v1::NextDataUnitResponse> response = master_.NextDataUnit(request);
    span.End();
    times_.master += SecondsSince(start);
    if (response.ok()) {
      payload = response->SerializeAsString();
      if (progress_ != nullptr) progress_->Update(response->progress());
    } else {
      asked = response.status();
    }
  }
  {
    // Non-leaders wait here while the leader asks the master.
    TraceSpan span(leader() ? nullptr : trace_, "wait", "wait");
    MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(asked));
    group_.Broadcast(&payload, 0);
  }
  v1::NextDataUnitResponse response;
  if (!response.ParseFromString(payload)) {
    return absl::InternalError("could not decode the broadcast data unit");
  }
  return response;
}

Evaluation Trainer::Evaluate(const Dataset& data) {
  model_->eval();
  const Evaluation result = EvaluateShard(
      group_, model_,
      data.size() > 0 ? Shard(data, group_.rank(), group_.size()) : Dataset(),
      options_.eval_batch_size);
  model_->train();
  return result;
}

absl::Status Trainer::ValidateEpoch(int epoch) {
  const absl::Time start = absl::Now();
  TraceSpan span(trace_, "validation", "eval");
  span.Arg("epoch", epoch + 1);
  // Without in-band validation a validation pool validates the master's
  // snapshots; the group only prints the master's record of the epoch.
  const bool inband = !spec_.has_inband_validation() || spec_.inband_validation();
  Evaluation validation;
  if (inband) {
    // Validate the master's newest weights (other groups and ranks may have
    // moved them since this rank's last exchange). EASGD ranks keep their
    // own weights between exchanges, so theirs are put back afterwards.
    std::vector<float> own;
    if (algorithm() == "easgd") {
      for (const auto& view : param_views_) own.insert(own.end(), view.begin(), view.end());
    }
    MPILEARN_RETURN_IF_ERROR(SyncToMasterWeights());
    validation = Evaluate(data_.validation);
    if (!own.empty()) {
      size_t offset = 0;
      for (auto& view : param_views_) {
        std::copy(own.begin() + offset, own.begin() + offset + view.size(), view.begin());
        offset += view.size();
      }
    }
  }

  absl::Status reported = absl::OkStatus();
  if (leader()) {
    absl::StatusOr<v1::JobState> state = v1::JOB_STATE_RUNNING;
    if (inband) {
      v1::ReportEpochRequest report;
      report.set_job_id(registration_.job_id());
      v1::EpochRecord* record = report.mutable_record();
      record->set_epoch(epoch + 1);
      record->set_val_loss(validation.loss);
      record->set_val_accuracy(validation.accuracy);
      record->set_group_id(registration_.group_id());
      state = master_.ReportEpoch(report);
    }
    absl::StatusOr<v1::JobStatus> status =
        state.ok() ? master_.GetJobStatus(registration_.job_id())
                   : absl::StatusOr<v1::JobStatus>(state.status());
    if (!status.ok()) {
      reported = status.status();
    } else if (options_.print_epochs) {
      v1::EpochRecord merged;
      for (const v1::EpochRecord& r : status->history()) {
        if (r.epoch() == epoch + 1) merged = r;
      }
      const double total = times_.total();
      auto share = [&](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
      const std::string val =
          inband ? absl::StrFormat("val_loss=%.4f  val_acc=%.4f", validation.loss,
                                   validation.accuracy)
                 : std::string("validation by pool");
      if (progress_ != nullptr) progress_->ClearLine();
      std::printf(
          "epoch %d/%d  train_loss=%.4f  %s  samples/s=%.0f  elapsed=%.1fs  "
          "[group %s: data %.0f%% compute %.0f%% master %.0f%% mpi %.0f%%]\n",
          epoch + 1, spec_.epochs(), merged.train_loss(), val.c_str(),
          merged.samples_per_second(), SecondsSince(run_start_),
          registration_.group_id().c_str(), share(times_.data),
          share(times_.compute), share(times_.master), share(times_.mpi));
      std::fflush(stdout);
    }
  }
  validation_seconds_ += SecondsSince(start);
  return AgreeOnLeaderStatus(reported);
}

absl::StatusOr<TrainResult> Trainer::Run() {
  run_start_ = absl::Now();
  failed_together_ = false;
  absl::StatusOr<TrainResult> result = RunLoop();
  // The run's output ends on a clean line (the caller prints next).
  if (progress_ != nullptr) progress_->Finish();
  return result;
}

absl::StatusOr<TrainResult> Trainer::RunLoop() {
  MPILEARN_RETURN_IF_ERROR(BuildModelAndInitWeights());
  model_->train();

  TrainResult result;
  std::vector<v1::CompletedUnit> completed;
  while (true) {
    MPILEARN_ASSIGN_OR_RETURN(v1::NextDataUnitResponse next, NextUnit(completed));
    completed.clear();
    for (int epoch : next.finished_epochs()) {
      MPILEARN_RETURN_IF_ERROR(ValidateEpoch(epoch));
      ++result.epochs_reported;
    }
    if (next.action() == v1::NextDataUnitResponse::DONE) {
      if (next.finish()) {
        TraceSpan span(trace_, "test", "eval");
        MPILEARN_RETURN_IF_ERROR(SyncToMasterWeights());
        result.finished_job = true;
        result.test = Evaluate(data_.test);
      }
      break;
    }
    if (next.action() == v1::NextDataUnitResponse::WAIT) {
      TraceSpan span(trace_, "wait", "wait");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (next.action() != v1::NextDataUnitResponse::TRAIN) {
      return absl::InternalError(absl::StrCat("unexpected action ",
                                              static_cast<int>(next.action()),
                                              " from the master's data queue"));
    }
    const absl::Time unit_start = absl::Now();
    MPILEARN_ASSIGN_OR_RETURN(v1::CompletedUnit done, TrainUnit(next.unit()));
    result.train_seconds += SecondsSince(unit_start);
    result.units += 1;
    result.samples += static_cast<int64_t>(done.samples());
    completed.push_back(done);
  }

  // Group-wide figures: every rank's step times (as of now, not the last
  // unit's telemetry) and stale drops summed.
  double totals[5] = {times_.data, times_.compute, times_.master, times_.mpi,
                      static_cast<double>(stale_dropped_)};
  {
    TraceSpan span(trace_, "allreduce", "mpi");
    group_.AllreduceSum(absl::MakeSpan(totals, 5));
  }
  result.times = {totals[0], totals[1], totals[2], totals[3]};
  result.stale_dropped = static_cast<uint64_t>(totals[4]);
  result.seconds = SecondsSince(run_start_);
  result.validation_seconds = validation_seconds_;
  result.samples_per_second =
      result.train_seconds > 0 ? result.samples / result.train_seconds : 0.0;
  result.samples_per_second_per_rank = result.samples_per_second / group_.size();
  return result;
}

}  // namespace mpilearn::worker
