#include "worker/trainer.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"
#include "common/process_stats.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/model/job_model.h"

namespace mpilearn::worker {

Trainer::Trainer(Collectives& group, MasterConnection& master,
                 v1::RegisterGroupResponse registration, JobConfig config,
                 TrainingData data,
                 TrainerOptions options)
    : group_(group),
      master_(master),
      registration_(std::move(registration)),
      config_(std::move(config)),
      spec_(config_.spec()),
      data_(std::move(data)),
      options_(options),
      context_(group, master, registration_.job_id(), registration_.group_id(),
               options.trace),
      trace_(options.trace) {
  if (leader() && options_.progress.mode != ProgressMode::kOff) {
    progress_ = std::make_unique<ProgressReporter>(options_.progress);
  }
  if (data_.streamed()) {
    const FileSplits& files = *data_.files;
    prefetch_ = std::make_unique<UnitPrefetcher>(
        files.train, files.names, config_.skips_bad_values());
    validation_reader_ =
        std::make_unique<FileReader>(files.validation, files.names);
    test_reader_ = std::make_unique<FileReader>(files.test, files.names);
  }
}

std::array<double, 6> Trainer::OwnTelemetry() const {
  const StepTimes& times = context_.times;
  return {times.data, times.compute,       times.master,
          times.mpi,  ProcessCpuSeconds(), ProcessResidentBytes()};
}

void Trainer::SetTelemetry(const double* figures) {
  telemetry_.set_data_seconds(figures[0]);
  telemetry_.set_compute_seconds(figures[1]);
  telemetry_.set_master_seconds(figures[2]);
  telemetry_.set_mpi_seconds(figures[3]);
  telemetry_.set_cpu_seconds(figures[4]);
  telemetry_.set_resident_bytes(static_cast<uint64_t>(figures[5]));
}

namespace {

// The weights of the job `registration` names were installed by another
// client, whose layout this group may not be able to use: compare sizes
// before pulling, so a mismatch fails at once with both sides named
// (pulling weights of another layout fails only once the stream is read).
// The job's status says how many values the installed weights hold; a
// master that does not answer leaves the check to the pull.
absl::Status CheckMasterLayout(MasterConnection& master,
                               const v1::RegisterGroupResponse& registration,
                               const v1::TensorSetHeader& layout) {
  absl::StatusOr<v1::JobStatus> status =
      master.GetJobStatus(registration.job_id());
  if (!status.ok() || status->parameters() == 0) return absl::OkStatus();
  uint64_t values = 0;
  for (const v1::TensorInfo& info : layout.tensors()) {
    uint64_t count = 1;
    for (const int64_t d : info.shape()) count *= static_cast<uint64_t>(d);
    values += count;
  }
  if (status->parameters() == values) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", registration.job_id(),
      "'s weights on the master were installed by another client with "
      "another layout: they hold ", status->parameters(),
      " values, this group's model has ", values, " values in ",
      layout.tensors_size(),
      " tensors; every group of a job must build the same model (spec, data "
      "shape, TorchScript file)"));
}

}  // namespace

absl::Status Trainer::BuildModelAndInitWeights() {
  // Same seed on every rank and every group: the initial weights are a
  // function of the job alone.
  torch::manual_seed(spec_.seed());
  absl::StatusOr<JobModel> built = BuildJobModel(config_, data_.splits);
  absl::Status ready = built.status();
  if (built.ok()) {
    job_.emplace(*std::move(built));
    try {
      job_->model.To(options_.device);
      ready = Preflight(*job_, data_.splits.train, spec_.batch_size());
    } catch (const std::exception& e) {
      ready = absl::ResourceExhaustedError(
          absl::StrCat("cannot move the model to ", options_.device.str(), ": ",
                       ShortExceptionMessage(e)));
    }
  }
  MPILEARN_RETURN_IF_ERROR(AgreeOnAllRanks(context_, ready));
  // Every rank must hold the same layout (they all load the same model file,
  // unless nodes see different files under one path).
  const std::vector<std::string> layouts =
      group_.GatherStrings(job_->layout.SerializeAsString(), 0);
  absl::Status same = absl::OkStatus();
  for (size_t r = 1; r < layouts.size(); ++r) {
    if (layouts[r] != layouts[0]) {
      same = absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, "'s model differs from rank 0's (tensor names, shapes or "
          "input shape): every rank of a group must load the same model; is "
          "model.torchscript the same file on every node?"));
      break;
    }
  }
  MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(same));
  job_->model.SetTraining(true);
  AttachParameters(context_, job_->model.state(), job_->model.state_names(),
                   job_->model.num_parameters());
  context_.layout = job_->layout;
  MPILEARN_ASSIGN_OR_RETURN(exchange_, MakeExchange(spec_, context_));
  if (leader()) {
    LOG(INFO) << "[rank 0] model: " << job_->model.ParameterCount()
              << " parameters in " << job_->model.num_parameters()
              << " tensors, " << job_->model.state().size() - job_->model.num_parameters()
              << " buffers; loss " << job_->loss.name();
  }

  // Whether the master's weights were installed by another client (whose
  // layout is checked before pulling; see CheckMasterLayout).
  // A failed InitWeights goes through the same agreement: the other ranks
  // wait in it, and a leader that returned on its own would leave them in a
  // collective the rest of the group never joins (e.g. the group was
  // declared lost while loading, and the leader registers again).
  absl::Status layout = absl::OkStatus();
  if (leader()) {
    bool installed_here = false;
    if (!registration_.weights_initialized()) {
      absl::StatusOr<bool> installed =
          master_.InitWeights(registration_.job_id(), registration_.group_id(),
                              context_.layout, ConstViews(context_.weights));
      if (installed.ok()) {
        installed_here = *installed;
        LOG(INFO) << "[rank 0] initial weights "
                  << (installed_here ? "installed on the master"
                                     : "from another group are used");
      } else {
        layout = installed.status();
      }
    }
    if (layout.ok() && !installed_here) {
      layout = CheckMasterLayout(master_, registration_, context_.layout);
    }
  }
  MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(layout));
  absl::Status synced = SyncToMasterWeights();
  if (!synced.ok() && synced.code() == absl::StatusCode::kInvalidArgument) {
    // The master's weights do not fit this group's model.
    return absl::Status(
        synced.code(),
        absl::StrCat("this group's model does not match the weights job ",
                     registration_.job_id(),
                     " holds on the master: every group of a job must build "
                     "the same model (spec, data shape, TorchScript file): ",
                     synced.message()));
  }
  MPILEARN_RETURN_IF_ERROR(synced);
  return exchange_->Start();
}

absl::Status Trainer::SyncToMasterWeights() {
  absl::Status pulled = absl::OkStatus();
  if (leader()) {
    TraceSpan span(trace_, "pull", "master");
    absl::StatusOr<uint64_t> version = master_.PullWeights(
        registration_.job_id(), registration_.group_id(), context_.weights);
    if (version.ok()) {
      context_.version = *version;
      span.Arg("version", static_cast<int64_t>(context_.version));
    } else {
      pulled = version.status();
    }
  }
  {
    TraceSpan span(trace_, "broadcast", "mpi");
    MPILEARN_RETURN_IF_ERROR(AgreeOnLeaderStatus(pulled));
    for (absl::Span<float> view : context_.weights) group_.Broadcast(view, 0);
    context_.ToModel();
  }
  TraceSpan span(trace_, "allreduce", "mpi");
  std::vector<double> version = {leader() ? static_cast<double>(context_.version)
                                          : 0.0};
  group_.AllreduceSum(absl::MakeSpan(version));
  context_.version = static_cast<uint64_t>(version[0]);
  return absl::OkStatus();
}

const torch::Tensor& Trainer::EpochOrder(int epoch) {
  auto it = orders_.find(epoch);
  if (it == orders_.end()) {
    // Only the current and the next epoch are ever in use.
    while (orders_.size() > 2) orders_.erase(orders_.begin());
    it = orders_
             .emplace(epoch, torch::randperm(
                                 data_.splits.train.size(),
                                 torch::make_generator<at::CPUGeneratorImpl>(
                                     spec_.seed() * 1000003 +
                                     static_cast<uint64_t>(epoch))))
             .first;
  }
  return it->second;
}

RowRange Trainer::RankRows(const v1::DataUnit& unit) const {
  const int64_t n = unit.end() - unit.begin();
  const int rank = group_.rank();
  const int world = group_.size();
  RowRange range{unit.file(), unit.begin() + n * rank / world,
                 unit.begin() + n * (rank + 1) / world};
  if (!spec_.data().has_shuffle_within_unit() ||
      spec_.data().shuffle_within_unit()) {
    // Drawn from the job's seed, the unit and the rank: the same rows train
    // in the same order whichever group takes the unit (never 0: no shuffle).
    range.shuffle_seed = (spec_.seed() * 1000003 +
                          static_cast<uint64_t>(unit.unit_id()) * 7919 +
                          static_cast<uint64_t>(rank)) |
                         1;
  }
  return range;
}

absl::StatusOr<v1::CompletedUnit> Trainer::TrainUnit(const v1::DataUnit& unit,
                                                     const v1::DataUnit* next) {
  const int world = group_.size();
  const int64_t n = unit.end() - unit.begin();
  const int64_t batch = spec_.batch_size();
  // Shards differ by at most one sample; every rank runs as many steps as
  // the largest shard needs, so the sync collectives always pair up.
  const int64_t largest_shard = (n + world - 1) / world;
  const int64_t steps = (largest_shard + batch - 1) / batch;
  // This rank's rows: in memory, the whole set's `features`/`labels`
  // indexed by `order`, the share of the epoch's permutation; streamed, the
  // rows read (and shuffled) for this share, in batch order (`order`
  // undefined).
  torch::Tensor features, labels, order;
  int64_t skipped = 0;  // rows of this share left out (bad values)
  if (!data_.streamed()) {
    features = data_.splits.train.features;
    labels = data_.splits.train.labels;
    const RowRange mine = RankRows(unit);
    order = EpochOrder(unit.epoch()).slice(0, mine.begin, mine.end);
  } else {
    const RowRange mine = RankRows(unit);
    prefetch_->Prefetch(mine);
    if (next != nullptr) prefetch_->Prefetch(RankRows(*next));
    const absl::Time t = absl::Now();
    absl::StatusOr<DataRows> rows;
    {
      TraceSpan span(trace_, "data_load", "data");
      // Which rows this rank trained, for the trace (and the tests that
      // check every row is trained once per epoch).
      span.Arg("epoch", unit.epoch());
      span.Arg("file", mine.file);
      span.Arg("begin", mine.begin);
      span.Arg("end", mine.end);
      rows = prefetch_->Take(mine);
      if (unit_reads_failed_ < options_.fail_unit_reads) {
        ++unit_reads_failed_;
        rows = absl::DataLossError(absl::StrCat(
            "data.train_files: injected failure (--fail_unit_reads) reading "
            "rows [", mine.begin, ", ", mine.end, ") of file ", mine.file));
      }
    }
    context_.times.data += SecondsSince(t);
    absl::Status read = AgreeOnAllRanks(context_, rows.status());
    if (!read.ok()) {
      // The data's fault, not the group's: the master hands the unit to
      // another group (LeaveRequest.data_error).
      return WithReason(std::move(read), v1::ERROR_REASON_DATA);
    }
    // Read (and shuffled) on the prefetch thread: batches are slices.
    features = std::move(rows->features);
    labels = std::move(rows->labels);
    skipped = rows->skipped;
    data_.transform.Apply(&features);
  }
  const int64_t share = order.defined() ? order.size(0) : features.size(0);
  double loss_sum = 0.0;
  double window_samples = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    absl::Time t = absl::Now();
    const int64_t begin = std::min(step * batch, share);
    const int64_t end = std::min(begin + batch, share);
    if (end > begin) {
      torch::Tensor x, y;
      {
        TraceSpan span(trace_, "data_load", "data");
        if (order.defined()) {
          torch::Tensor index = order.slice(0, begin, end);
          x = features.index_select(0, index).to(options_.device);
          y = labels.index_select(0, index).to(options_.device);
        } else {
          x = features.slice(0, begin, end).to(options_.device);
          y = labels.slice(0, begin, end).to(options_.device);
        }
      }
      context_.times.data += SecondsSince(t);
      t = absl::Now();
      try {
        TraceSpan span(trace_, "forward_backward", "compute");
        // Summed (not averaged) loss: gradients of several batches and
        // ranks add up, and the exchange divides by the sample count once.
        torch::Tensor loss = job_->loss.Summed(job_->model.Forward(x), y);
        loss.backward();
        loss_sum += loss.item<double>();
      } catch (const std::exception& e) {
        // The first batch passed Preflight; this one did not.
        return absl::InternalError(absl::StrCat(
            "the model's forward/backward pass failed in epoch ",
            unit.epoch() + 1, ": ", ShortExceptionMessage(e)));
      }
      window_samples += static_cast<double>(end - begin);
      exchange_->AfterBatch(end - begin);  // easgd's local step
      context_.times.compute += SecondsSince(t);
    }
    if (options_.slowdown_ms_per_batch > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(options_.slowdown_ms_per_batch));
    }
    if ((step + 1) % spec_.sync_every() == 0 || step + 1 == steps) {
      MPILEARN_RETURN_IF_ERROR(exchange_->EndWindow(window_samples));
      window_samples = 0.0;
    }
  }
  // Updates still on their way (updates_in_flight > 1) land before the unit
  // counts as done.
  MPILEARN_RETURN_IF_ERROR(exchange_->Flush());
  // The unit's loss and samples, and (riding along, for the leader's
  // telemetry) every rank's cumulative figures.
  double totals[9] = {loss_sum, static_cast<double>(share),
                      static_cast<double>(skipped)};
  const std::array<double, 6> own = OwnTelemetry();
  std::copy(own.begin(), own.end(), totals + 3);
  const absl::Time t = absl::Now();
  {
    TraceSpan span(trace_, "allreduce", "mpi");
    group_.AllreduceSum(absl::MakeSpan(totals, 9));
  }
  context_.times.mpi += SecondsSince(t);
  SetTelemetry(totals + 3);
  have_group_telemetry_ = true;
  v1::CompletedUnit completed;
  completed.set_unit_id(unit.unit_id());
  completed.set_loss_sum(totals[0]);
  completed.set_samples(static_cast<uint64_t>(totals[1]));
  completed.set_skipped(static_cast<uint64_t>(totals[2]));
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
    request.set_train_samples(data_.train_samples());
    if (data_.streamed()) {
      for (int64_t rows : data_.files->train.rows) request.add_file_rows(rows);
      request.set_read_ahead(true);
    }
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
    context_.times.master += SecondsSince(start);
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

absl::StatusOr<Evaluation> Trainer::Evaluate(Split split) {
  job_->model.SetTraining(false);
  absl::StatusOr<Evaluation> result;
  if (!data_.streamed()) {
    const Dataset& data = split == Split::kValidation ? data_.splits.validation
                                                      : data_.splits.test;
    result = EvaluateShard(
        group_, job_->model, job_->loss,
        data.size() > 0 ? Shard(data, group_.rank(), group_.size()) : Dataset(),
        options_.eval_batch_size);
  } else {
    FileReader& reader =
        split == Split::kValidation ? *validation_reader_ : *test_reader_;
    const ShareRange share =
        ShareOf(reader.list().total_rows(), group_.rank(), group_.size());
    result = EvaluateShare(
        group_, job_->model, job_->loss, share.end - share.begin,
        [&](int64_t begin, int64_t end) -> absl::StatusOr<Dataset> {
          MPILEARN_ASSIGN_OR_RETURN(
              DataRows rows,
              reader.ReadRange(share.begin + begin, share.begin + end));
          Dataset batch;
          batch.features = std::move(rows.features);
          batch.labels = std::move(rows.labels);
          data_.transform.Apply(&batch.features);
          return batch;
        },
        options_.eval_batch_size);
  }
  job_->model.SetTraining(true);
  if (!result.ok()) context_.failed_together = true;  // every rank failed
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
    if (exchange_->keeps_local_weights()) {
      context_.FromModel();
      for (const auto& view : context_.weights) {
        own.insert(own.end(), view.begin(), view.end());
      }
    }
    MPILEARN_RETURN_IF_ERROR(SyncToMasterWeights());
    MPILEARN_ASSIGN_OR_RETURN(validation, Evaluate(Split::kValidation));
    if (!own.empty()) {
      size_t offset = 0;
      for (auto& view : context_.weights) {
        std::copy(own.begin() + offset, own.begin() + offset + view.size(), view.begin());
        offset += view.size();
      }
      context_.ToModel();
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
      for (const auto& [name, value] : validation.metrics) {
        (*record->mutable_metrics())[name] = value;
      }
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
      const StepTimes& times = context_.times;
      const double total = times.total();
      auto share = [&](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
      const std::string val =
          inband ? FormatMetrics(validation) : std::string("validation by pool");
      if (progress_ != nullptr) progress_->ClearLine();
      std::printf(
          "epoch %d/%d  train_loss=%.4f  %s  samples/s=%.0f  elapsed=%.1fs  "
          "[group %s: data %.0f%% compute %.0f%% master %.0f%% mpi %.0f%%]\n",
          epoch + 1, spec_.epochs(), merged.train_loss(), val.c_str(),
          merged.samples_per_second(), SecondsSince(run_start_),
          registration_.group_id().c_str(), share(times.data),
          share(times.compute), share(times.master), share(times.mpi));
      std::fflush(stdout);
    }
  }
  validation_seconds_ += SecondsSince(start);
  return AgreeOnLeaderStatus(reported);
}

absl::StatusOr<TrainResult> Trainer::Run() {
  run_start_ = absl::Now();
  context_.failed_together = false;
  absl::StatusOr<TrainResult> result = RunLoop();
  // The run's output ends on a clean line (the caller prints next).
  if (progress_ != nullptr) progress_->Finish();
  return result;
}

absl::StatusOr<TrainResult> Trainer::RunLoop() {
  MPILEARN_RETURN_IF_ERROR(BuildModelAndInitWeights());

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
        MPILEARN_ASSIGN_OR_RETURN(result.test, Evaluate(Split::kTest));
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
    MPILEARN_ASSIGN_OR_RETURN(
        v1::CompletedUnit done,
        TrainUnit(next.unit(), next.has_next_unit() ? &next.next_unit() : nullptr));
    result.train_seconds += SecondsSince(unit_start);
    result.units += 1;
    result.samples += static_cast<int64_t>(done.samples());
    completed.push_back(done);
  }

  // Group-wide figures: every rank's step times (as of now, not the last
  // unit's telemetry) and stale drops summed.
  const StepTimes& times = context_.times;
  double totals[5] = {times.data, times.compute, times.master, times.mpi,
                      static_cast<double>(context_.stale_dropped)};
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
