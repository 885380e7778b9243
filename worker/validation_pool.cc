#include "worker/validation_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"
#include "common/spec/job_config.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "worker/model/job_model.h"
#include "worker/data/training_data.h"

namespace mpilearn::worker {
namespace {

// How often the leader's helper thread looks at the stop flag.
constexpr absl::Duration kStopPollPeriod = absl::Milliseconds(100);

// True on every rank if `ok` holds on every rank.
bool AllRanksOk(Collectives& group, bool ok) {
  double failed[1] = {ok ? 0.0 : 1.0};
  group.AllreduceSum(absl::MakeSpan(failed, 1));
  return failed[0] == 0;
}

}  // namespace

ValidationPool::ValidationPool(Collectives& group, MasterClient* master,
                               ValidationPoolOptions options)
    : group_(group),
      master_(master),
      options_(std::move(options)),
      tag_(absl::StrCat("[pool ", options_.label, " rank ", group.rank(), "/",
                        group.size(), "] ")) {
  CHECK(group_.rank() != 0 || master_ != nullptr)
      << "the pool's leader needs a master connection";
}

ValidationPool::~ValidationPool() = default;

void ValidationPool::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  wake_.SignalAll();
}

void ValidationPool::WatchForStop() {
  absl::MutexLock lock(&mu_);
  while (!finished_) {
    const bool flagged = options_.stop_requested != nullptr &&
                         options_.stop_requested->load();
    const absl::Time now = absl::Now();
    const absl::Time idle_deadline = waiting_since_ + options_.exit_when_idle;
    if (stop_ || flagged || now >= idle_deadline) {
      if (!stop_ && !flagged) {
        LOG(INFO) << tag_ << "no snapshot for "
                  << absl::FormatDuration(options_.exit_when_idle)
                  << "; stopping";
      } else {
        LOG(INFO) << tag_ << "asked to stop";
      }
      stop_ = true;
      if (stream_ != nullptr) stream_->Cancel();
      return;
    }
    absl::Time deadline = std::min(idle_deadline, now + kStopPollPeriod);
    wake_.WaitWithDeadline(&mu_, deadline);
  }
}

std::string ValidationPool::NextMessage(std::vector<std::vector<float>>* weights) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return "S";
    waiting_since_ = absl::Now();
    wake_.SignalAll();
  }
  std::string message;
  while (message.empty()) {
    std::shared_ptr<SnapshotStream> stream;
    {
      absl::MutexLock lock(&mu_);
      stream = stream_;
    }
    v1::SnapshotHeader header;
    absl::StatusOr<bool> got = stream->Next(&header, weights);
    if (got.ok() && *got) {
      message = "V" + header.SerializeAsString();
    } else {
      message = Resubscribe(got.ok() ? std::string("the master ended the snapshot stream")
                                     : std::string(got.status().message()));
    }
  }
  absl::MutexLock lock(&mu_);
  waiting_since_ = absl::InfiniteFuture();
  return message;
}

absl::StatusOr<std::unique_ptr<SnapshotStream>> ValidationPool::Subscribe() {
  v1::SubscribeSnapshotsRequest request;
  for (const std::string& id : options_.job_ids) request.add_job_ids(id);
  request.set_subscriber("pool " + options_.label);
  absl::StatusOr<std::unique_ptr<SnapshotStream>> stream =
      master_->SubscribeSnapshots(request);
  if (stream.ok()) return stream;
  std::string why(stream.status().message());
  if (why.empty()) why = stream.status().ToString();
  return WithReason(
      absl::UnavailableError(absl::StrCat("cannot subscribe to snapshots: ", why)),
      ReasonOf(stream.status()));
}

std::string ValidationPool::Resubscribe(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return "S";  // the helper cancelled the stream
  }
  if (options_.resubscribe_for <= absl::ZeroDuration()) {
    return absl::StrCat("E", "lost the snapshot stream: ", why);
  }
  LOG(WARNING) << tag_ << "lost the snapshot stream (" << why
               << "); subscribing again for up to "
               << absl::FormatDuration(options_.resubscribe_for);
  const absl::Time give_up = absl::Now() + options_.resubscribe_for;
  absl::Status last;
  while (true) {
    absl::StatusOr<std::unique_ptr<SnapshotStream>> fresh = Subscribe();
    absl::MutexLock lock(&mu_);
    if (stop_) {
      if (fresh.ok()) (*fresh)->Cancel();
      return "S";
    }
    if (fresh.ok()) {
      stream_ = std::move(fresh).value();
      LOG(INFO) << tag_ << "subscribed again";
      return "";
    }
    last = fresh.status();
    const absl::Time now = absl::Now();
    if (now >= give_up) break;
    // Stop() and the helper's stop both signal wake_.
    wake_.WaitWithDeadline(&mu_, std::min(give_up, now + absl::Seconds(1)));
  }
  return absl::StrCat("E", "lost the snapshot stream (", why,
                      ") and could not subscribe again within ",
                      absl::FormatDuration(options_.resubscribe_for), ": ",
                      last.message());
}

ValidationPool::JobState ValidationPool::LoadJob(const v1::JobSpec& spec) {
  JobState job;
  // The master sends its normalized spec; it is checked like any input.
  absl::StatusOr<JobConfig> config = JobConfig::Create(spec);
  if (!config.ok()) {
    job.error = config.status();
    return job;
  }
  absl::StatusOr<TrainingData> data =
      LoadTrainingData(*config, /*sample_rows=*/1);
  if (!data.ok()) {
    job.error = data.status();
    return job;
  }
  if (data->validation_samples() == 0) {
    job.error = absl::FailedPreconditionError(
        "the job has no validation set (data.validation_count is 0 and no "
        "validation files)");
    return job;
  }
  // Keep only this rank's shard, in memory: a pool validates it again and
  // again. In-memory data is copied so the training data goes; streamed
  // data reads just the shard's rows.
  if (!data->streamed()) {
    const Dataset shard =
        Shard(data->splits.validation, group_.rank(), group_.size());
    if (shard.size() > 0) {
      job.shard.features = shard.features.clone();
      job.shard.labels = shard.labels.clone();
    }
  } else {
    const ShareRange share = ShareOf(data->validation_samples(), group_.rank(),
                                     group_.size());
    if (share.end > share.begin) {
      FileReader reader(data->files->validation, data->files->names);
      absl::StatusOr<DataRows> rows = reader.ReadRange(share.begin, share.end);
      if (!rows.ok()) {
        job.error = rows.status();
        return job;
      }
      job.shard.features = std::move(rows->features);
      job.shard.labels = std::move(rows->labels);
      data->transform.Apply(&job.shard.features);
    }
  }
  absl::StatusOr<JobModel> model = BuildJobModel(*config, data->splits);
  if (!model.ok()) {
    job.error = model.status();
    return job;
  }
  model->model.SetTraining(false);
  job.model.emplace(*std::move(model));
  return job;
}

ValidationPool::JobState& ValidationPool::PrepareJob(
    const v1::SnapshotHeader& header) {
  auto it = jobs_.find(header.job_id());
  if (it == jobs_.end()) {
    if (static_cast<int>(jobs_.size()) >= std::max(1, options_.max_cached_jobs)) {
      auto oldest = std::min_element(
          jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
            return a.second.last_used < b.second.last_used;
          });
      jobs_.erase(oldest);
    }
    JobState job = LoadJob(header.spec());
    // Every rank must be able to validate, or none does.
    if (!AllRanksOk(group_, job.error.ok()) && job.error.ok()) {
      job.error = absl::AbortedError("another rank could not load the job");
    }
    if (!job.error.ok() && leader()) {
      LOG(WARNING) << tag_ << "cannot validate job " << header.job_id() << ": "
                   << job.error;
    }
    it = jobs_.emplace(header.job_id(), std::move(job)).first;
  }
  JobState& job = it->second;
  job.last_used = ++uses_;
  return job;
}

Evaluation ValidationPool::Validate(
    JobState& job, const std::vector<std::vector<float>>& weights) {
  torch::NoGradGuard no_grad;
  // The leader holds the weights; every rank receives them into its model.
  {
    TraceSpan span(options_.trace, "broadcast", "mpi");
    for (size_t i = 0; i < job.model->model.state().size(); ++i) {
      const torch::Tensor& p = job.model->model.state()[i];
      absl::Span<float> view(p.data_ptr<float>(), p.numel());
      if (leader()) std::memcpy(view.data(), weights[i].data(), view.size() * sizeof(float));
      group_.Broadcast(view, 0);
    }
  }
  return EvaluateShard(group_, job.model->model, job.model->loss, job.shard,
                       options_.eval_batch_size);
}

bool ValidationPool::Report(const v1::SnapshotHeader& header,
                            const Evaluation& metrics) {
  v1::ReportValidationRequest request;
  request.set_job_id(header.job_id());
  v1::ValidationRecord* record = request.mutable_record();
  record->set_version(header.weights().version());
  record->set_epoch(header.epoch());
  record->set_val_loss(metrics.loss);
  record->set_val_accuracy(metrics.accuracy);
  for (const auto& [name, value] : metrics.metrics) {
    (*record->mutable_metrics())[name] = value;
  }
  record->set_samples(metrics.samples);
  record->set_source("pool " + options_.label);
  record->set_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  absl::StatusOr<v1::JobState> state = master_->ReportValidation(request);
  if (!state.ok()) {
    LOG(WARNING) << tag_ << "could not report the validation of job "
                 << header.job_id() << " v" << header.weights().version()
                 << ": " << state.status();
  }
  if (options_.print) {
    std::printf("validated %s v%llu (epoch %d): %s%s%s\n",
                header.job_id().c_str(),
                static_cast<unsigned long long>(header.weights().version()),
                header.epoch(), FormatMetrics(metrics, "val", " ").c_str(),
                header.skipped() > 0
                    ? absl::StrCat(" [skipped ", header.skipped(), "]").c_str()
                    : "",
                state.ok() ? "" : " (not recorded)");
    std::fflush(stdout);
  }
  return state.ok();
}

absl::StatusOr<ValidationPoolResult> ValidationPool::Run() {
  // The leader subscribes; every rank learns whether it could.
  absl::Status subscribed = absl::OkStatus();
  if (leader()) {
    absl::StatusOr<std::unique_ptr<SnapshotStream>> stream = Subscribe();
    if (stream.ok()) {
      absl::MutexLock lock(&mu_);
      stream_ = std::move(stream).value();
    } else {
      subscribed = stream.status();
    }
  }
  MPILEARN_RETURN_IF_ERROR(BroadcastStatus(group_, subscribed, 0));
  if (leader()) {
    LOG(INFO) << tag_ << "subscribed to "
              << (options_.job_ids.empty()
                      ? std::string("every job")
                      : absl::StrCat(options_.job_ids.size(), " job(s)"));
    if (options_.print) {
      std::printf("pool %s: %d rank(s), waiting for snapshots\n",
                  options_.label.c_str(), group_.size());
      std::fflush(stdout);
    }
  }
  std::thread watcher;
  if (leader()) watcher = std::thread([this] { WatchForStop(); });

  ValidationPoolResult result;
  absl::Status outcome = absl::OkStatus();
  std::vector<std::vector<float>> weights;  // the leader's received copy
  while (true) {
    std::string message;
    {
      TraceSpan span(options_.trace, "wait", "wait");
      if (leader()) message = NextMessage(&weights);
      group_.Broadcast(&message, 0);
    }
    if (message.empty() || message[0] == 'S') break;
    if (message[0] == 'E') {
      // Every rank saw the 'E'; the leader's status reaches them all.
      outcome = BroadcastStatus(
          group_,
          leader() ? absl::UnavailableError(message.substr(1)) : absl::OkStatus(),
          0);
      break;
    }
    v1::SnapshotHeader header;
    if (!header.ParseFromArray(message.data() + 1,
                               static_cast<int>(message.size() - 1))) {
      outcome = absl::InternalError("could not parse a broadcast snapshot header");
      break;
    }
    JobState& job = PrepareJob(header);
    bool usable = job.error.ok();
    if (usable && leader()) {
      absl::Status fits = CheckSameLayout(job.model->layout, header.weights());
      if (!fits.ok()) {
        LOG(WARNING) << tag_ << "job " << header.job_id() << " v"
                     << header.weights().version()
                     << ": the snapshot does not fit the model its spec "
                        "builds: "
                     << fits;
        usable = false;
      }
    }
    std::string go = usable ? "1" : "0";
    group_.Broadcast(&go, 0);
    if (go != "1") {
      ++result.failed;
      continue;
    }
    TraceSpan span(options_.trace, "validation", "eval");
    span.Arg("version", static_cast<int64_t>(header.weights().version()));
    span.Arg("epoch", header.epoch());
    const Evaluation metrics = Validate(job, weights);
    span.End();
    if (leader()) {
      if (Report(header, metrics)) {
        ++result.validated;
      } else {
        ++result.failed;
      }
    }
  }

  if (leader()) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      wake_.SignalAll();
    }
    watcher.join();
    absl::MutexLock lock(&mu_);
    stream_.reset();
    LOG(INFO) << tag_ << "validated " << result.validated << " snapshot(s), "
              << result.failed << " skipped or unreported";
  }
  if (!outcome.ok()) return outcome;
  return result;
}

}  // namespace mpilearn::worker
