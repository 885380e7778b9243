#include "worker/trainer.h"

#include <cstdio>
#include <cstring>

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

}  // namespace

Trainer::Trainer(Collectives& group, MasterClient& master,
                 v1::RegisterGroupResponse registration, DatasetSplits data,
                 TrainerOptions options)
    : group_(group),
      master_(master),
      registration_(std::move(registration)),
      spec_(registration_.spec()),
      data_(std::move(data)),
      options_(options) {}

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
  size_t offset = 0;
  for (const torch::Tensor& p : params_) {
    grad_views_.emplace_back(grad_.data() + offset, p.numel());
    offset += p.numel();
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
  return SyncToMasterWeights();
}

absl::Status Trainer::SyncToMasterWeights() {
  // The leader's status decides for everyone: broadcast it first so no
  // rank waits in a collective the leader never enters.
  absl::Status pulled = absl::OkStatus();
  if (leader()) {
    absl::StatusOr<uint64_t> version = master_.PullWeights(
        registration_.job_id(), registration_.group_id(), param_views_);
    if (version.ok()) {
      version_ = *version;
    } else {
      pulled = version.status();
    }
  }
  std::string message = pulled.ok() ? "" : std::string(pulled.message());
  group_.Broadcast(&message, 0);
  if (!message.empty()) {
    return leader() ? pulled : absl::AbortedError("the leader failed: " + message);
  }
  for (absl::Span<float> view : param_views_) group_.Broadcast(view, 0);
  std::vector<double> version = {static_cast<double>(version_)};
  group_.AllreduceSum(absl::MakeSpan(version));  // only rank 0's is non-zero
  version_ = leader() ? version_ : static_cast<uint64_t>(version[0]);
  return absl::OkStatus();
}

void Trainer::TakeGradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    float* dest = const_cast<float*>(grad_views_[i].data());
    if (grad.defined()) {
      std::memcpy(dest, grad.data_ptr<float>(), grad_views_[i].size() * sizeof(float));
      grad.zero_();
    } else {
      std::memset(dest, 0, grad_views_[i].size() * sizeof(float));
    }
  }
}

absl::Status Trainer::Exchange(double samples, StepTimes& times) {
  absl::Time start = absl::Now();
  TakeGradients();
  const bool sync = spec_.algorithm() == "sync";
  if (sync) {
    // Sum of gradient sums and of sample counts, then the mean.
    group_.AllreduceSum(absl::MakeSpan(grad_));
    std::vector<double> count = {samples};
    group_.AllreduceSum(absl::MakeSpan(count));
    samples = count[0];
    times.mpi += SecondsSince(start);
  }
  if (samples <= 0) return absl::OkStatus();
  const float scale = static_cast<float>(1.0 / samples);
  for (float& g : grad_) g *= scale;

  if (!sync || leader()) {
    start = absl::Now();
    v1::PushGradientRequest::Header header;
    header.set_job_id(registration_.job_id());
    header.set_group_id(registration_.group_id());
    header.set_rank(group_.rank());
    *header.mutable_gradient() = layout_;
    header.mutable_gradient()->set_version(version_);
    header.set_samples(static_cast<uint64_t>(samples));
    absl::StatusOr<uint64_t> version =
        master_.PushGradient(header, grad_views_, param_views_);
    times.master += SecondsSince(start);
    if (!version.ok()) {
      if (!sync) return version.status();
      // Tell the other ranks before they wait for weights forever.
      std::string message(version.status().message());
      group_.Broadcast(&message, 0);
      return version.status();
    }
    version_ = *version;
  }
  if (sync) {
    start = absl::Now();
    std::string message;
    group_.Broadcast(&message, 0);  // empty: the push succeeded
    if (!message.empty()) return absl::AbortedError("the leader failed: " + message);
    for (absl::Span<float> view : param_views_) group_.Broadcast(view, 0);
    times.mpi += SecondsSince(start);
  }
  return absl::OkStatus();
}

Evaluation Trainer::Evaluate(const Dataset& data) {
  torch::NoGradGuard no_grad;
  model_->eval();
  double sums[3] = {0, 0, 0};  // loss sum, correct, samples
  if (data.size() > 0) {
    const Dataset mine = Shard(data, group_.rank(), group_.size());
    for (int64_t begin = 0; begin < mine.size();
         begin += options_.eval_batch_size) {
      const int64_t end = std::min(mine.size(), begin + options_.eval_batch_size);
      torch::Tensor x = mine.images.slice(0, begin, end);
      torch::Tensor y = mine.labels.slice(0, begin, end);
      torch::Tensor logits = model_->forward(x);
      sums[0] += torch::nn::functional::cross_entropy(
                     logits, y,
                     torch::nn::functional::CrossEntropyFuncOptions().reduction(
                         torch::kSum))
                     .item<double>();
      sums[1] += logits.argmax(1).eq(y).sum().item<double>();
      sums[2] += static_cast<double>(end - begin);
    }
  }
  model_->train();
  group_.AllreduceSum(absl::MakeSpan(sums, 3));
  Evaluation result;
  result.samples = static_cast<int64_t>(sums[2]);
  if (sums[2] > 0) {
    result.loss = sums[0] / sums[2];
    result.accuracy = sums[1] / sums[2];
  }
  return result;
}

absl::StatusOr<TrainResult> Trainer::Run() {
  const absl::Time run_start = absl::Now();
  MPILEARN_RETURN_IF_ERROR(BuildModelAndInitWeights());
  model_->train();

  const int rank = group_.rank();
  const int world = group_.size();
  const int64_t n = data_.train.size();
  const int64_t batch = spec_.batch_size();
  // Shards differ by at most one sample; every rank runs as many steps as
  // the largest shard needs, so the sync collectives always pair up.
  const int64_t largest_shard = (n + world - 1) / world;
  const int64_t steps = (largest_shard + batch - 1) / batch;
  const int64_t shard_begin = n * rank / world;
  const int64_t shard_end = n * (rank + 1) / world;

  TrainResult result;
  double train_seconds = 0.0;
  int64_t trained_samples = 0;
  for (int epoch = registration_.epochs_done(); epoch < spec_.epochs(); ++epoch) {
    const absl::Time epoch_start = absl::Now();
    StepTimes times;
    torch::Tensor order = torch::randperm(
        n, torch::make_generator<at::CPUGeneratorImpl>(
               spec_.seed() * 1000003 + static_cast<uint64_t>(epoch)));
    torch::Tensor mine = order.slice(0, shard_begin, shard_end);
    double loss_sum = 0.0;
    double window_samples = 0.0;
    for (int64_t step = 0; step < steps; ++step) {
      absl::Time t = absl::Now();
      const int64_t begin = std::min(step * batch, mine.size(0));
      const int64_t end = std::min(begin + batch, mine.size(0));
      if (end > begin) {
        torch::Tensor index = mine.slice(0, begin, end);
        torch::Tensor x = data_.train.images.index_select(0, index);
        torch::Tensor y = data_.train.labels.index_select(0, index);
        times.data += SecondsSince(t);
        t = absl::Now();
        // Summed (not averaged) loss: gradients of several batches and
        // ranks add up, and Exchange divides by the sample count once.
        torch::Tensor loss = torch::nn::functional::cross_entropy(
            model_->forward(x), y,
            torch::nn::functional::CrossEntropyFuncOptions().reduction(
                torch::kSum));
        loss.backward();
        loss_sum += loss.item<double>();
        window_samples += static_cast<double>(end - begin);
        times.compute += SecondsSince(t);
      }
      if ((step + 1) % spec_.sync_every() == 0 || step + 1 == steps) {
        MPILEARN_RETURN_IF_ERROR(Exchange(window_samples, times));
        window_samples = 0.0;
      }
    }
    const double epoch_train_seconds = SecondsSince(epoch_start);
    train_seconds += epoch_train_seconds;

    // Downpour ranks end the epoch on different weights: agree on the
    // master's newest before validating.
    if (spec_.algorithm() != "sync") {
      absl::Time t = absl::Now();
      group_.Barrier();
      times.mpi += SecondsSince(t);
      MPILEARN_RETURN_IF_ERROR(SyncToMasterWeights());
    }
    double train[2] = {loss_sum, static_cast<double>(mine.size(0))};
    group_.AllreduceSum(absl::MakeSpan(train, 2));
    trained_samples += static_cast<int64_t>(train[1]);
    const Evaluation validation = Evaluate(data_.validation);
    result.validation = validation;
    result.epochs_trained = epoch + 1;

    v1::EpochRecord record;
    record.set_epoch(epoch + 1);
    record.set_train_loss(train[1] > 0 ? train[0] / train[1] : 0.0);
    record.set_val_loss(validation.loss);
    record.set_val_accuracy(validation.accuracy);
    record.set_wall_seconds(SecondsSince(epoch_start));
    record.set_samples(static_cast<uint64_t>(train[1]));
    record.set_samples_per_second(train[1] / epoch_train_seconds);
    record.set_group_id(registration_.group_id());
    std::string stop;  // non-empty: the leader says stop, with the reason
    if (leader()) {
      v1::ReportEpochRequest report;
      report.set_job_id(registration_.job_id());
      *report.mutable_record() = record;
      absl::StatusOr<v1::JobState> state = master_.ReportEpoch(report);
      if (!state.ok()) {
        stop = std::string(state.status().message());
      } else if (*state != v1::JOB_STATE_RUNNING) {
        stop = absl::StrCat("the master reports the job as ",
                            v1::JobState_Name(*state));
      }
      if (options_.print_epochs) {
        const double step_total =
            times.data + times.compute + times.master + times.mpi;
        auto share = [&](double s) {
          return step_total > 0 ? 100.0 * s / step_total : 0.0;
        };
        std::printf(
            "epoch %d/%d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  "
            "samples/s=%.0f (%.0f per rank)  elapsed=%.1fs  "
            "[data %.0f%% compute %.0f%% master %.0f%% mpi %.0f%%]\n",
            epoch + 1, spec_.epochs(), record.train_loss(), validation.loss,
            validation.accuracy, record.samples_per_second(),
            record.samples_per_second() / world, SecondsSince(run_start),
            share(times.data), share(times.compute), share(times.master),
            share(times.mpi));
        std::fflush(stdout);
      }
    }
    group_.Broadcast(&stop, 0);
    if (!stop.empty()) return absl::AbortedError(stop);
  }

  result.test = Evaluate(data_.test);
  result.seconds = SecondsSince(run_start);
  result.samples_per_second =
      train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0;
  result.samples_per_second_per_rank = result.samples_per_second / world;
  return result;
}

}  // namespace mpilearn::worker
