// MasterMetrics (master_metrics.h). Over ~500 lines because it defines every
// metric family the master exports in one place (docs/observability.md
// lists them in the same order), so a name, its help text and where its
// value comes from are read together.
#include "server/master_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process_stats.h"
#include "server/core/update/update_rule.h"

namespace mpilearn::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// The streaming RPCs, whose open-stream gauges exist from the start.
constexpr const char* kStreamingMethods[] = {"PushGradient", "PullWeights",
                                             "InitWeights", "SubscribeSnapshots"};

// `count` bounds from `start`, each `factor` times the one before.
std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

// 10us .. ~10.5s.
const std::vector<double>& ApplyBuckets() {
  static const auto* const kBuckets =
      new std::vector<double>(ExponentialBuckets(1e-5, 2.0, 21));
  return *kBuckets;
}

// In weight versions.
const std::vector<double>& StalenessBuckets() {
  static const auto* const kBuckets = new std::vector<double>{
      0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256};
  return *kBuckets;
}

// 100us .. 60s.
const std::vector<double>& RpcBuckets() {
  static const auto* const kBuckets = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *kBuckets;
}

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// "job-000012" -> 12; 0 when the id has no number.
int64_t JobNumber(const std::string& job_id) {
  const size_t dash = job_id.rfind('-');
  int64_t number = 0;
  if (dash == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(job_id).substr(dash + 1), &number)) {
    return 0;
  }
  return number;
}

// The mpilearn_jobs / mpilearn_job_info `state` label.
const char* StateLabel(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED: return "queued";
    case v1::JOB_STATE_RUNNING: return "running";
    case v1::JOB_STATE_COMPLETED: return "completed";
    case v1::JOB_STATE_FAILED: return "failed";
    case v1::JOB_STATE_CANCELLED: return "cancelled";
    default: return "unspecified";
  }
}

// A family built at Collect time.
class Built {
 public:
  Built(const char* name, const char* help, MetricType type) {
    family_.name = name;
    family_.help = help;
    family_.type = type;
  }

  void Add(std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric metric;
    metric.label = std::move(labels);
    if (family_.type == MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family_.metric.push_back(std::move(metric));
  }

  // Appends the family to `out` unless it has no samples.
  void MoveTo(std::vector<MetricFamily>& out) {
    if (!family_.metric.empty()) out.push_back(std::move(family_));
  }

 private:
  MetricFamily family_;
};

}  // namespace

MasterMetrics::MasterMetrics() : MasterMetrics(Options()) {}

MasterMetrics::MasterMetrics(Options options)
    : options_(options),
      start_time_seconds_(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())),
      registry_(std::make_shared<prometheus::Registry>()),
      apply_family_(prometheus::BuildHistogram()
                        .Name("mpilearn_apply_duration_seconds")
                        .Help("Time of one update on the master (optimizer "
                              "step, elastic move or delta add).")
                        .Register(*registry_)),
      staleness_family_(prometheus::BuildHistogram()
                            .Name("mpilearn_update_staleness")
                            .Help("Staleness of applied updates, in weight "
                                  "versions.")
                            .Register(*registry_)),
      received_family_(prometheus::BuildCounter()
                           .Name("mpilearn_job_received_bytes_total")
                           .Help("Tensor bytes received (gradients, initial "
                                 "weights).")
                           .Register(*registry_)),
      sent_family_(prometheus::BuildCounter()
                       .Name("mpilearn_job_sent_bytes_total")
                       .Help("Tensor bytes sent (weights, snapshots).")
                       .Register(*registry_)),
      rpc_family_(prometheus::BuildHistogram()
                      .Name("mpilearn_rpc_duration_seconds")
                      .Help("RPC latency by method and gRPC status code; its "
                            "_count is the RPC count.")
                      .Register(*registry_)),
      streams_family_(prometheus::BuildGauge()
                          .Name("mpilearn_open_streams")
                          .Help("Streaming RPCs open now.")
                          .Register(*registry_)) {
  for (const char* method : kStreamingMethods) {
    streams_family_.Add({{"method", method}});
  }
}

void MasterMetrics::SetStatusProvider(StatusProvider provider) {
  absl::MutexLock lock(&provider_mu_);
  provider_ = std::move(provider);
}

void MasterMetrics::SetOwnerProvider(OwnerProvider provider) {
  absl::MutexLock lock(&provider_mu_);
  owner_provider_ = std::move(provider);
}

void MasterMetrics::SetStudyProvider(StudyProvider provider) {
  absl::MutexLock lock(&provider_mu_);
  study_provider_ = std::move(provider);
}

MasterMetrics::JobSeries& MasterMetrics::SeriesLocked(
    const std::string& job_id) const {
  auto [it, inserted] = jobs_.try_emplace(job_id);
  if (inserted) {
    it->second.received = &received_family_.Add({{kJobLabel, job_id}});
    it->second.sent = &sent_family_.Add({{kJobLabel, job_id}});
  }
  return it->second;
}

void MasterMetrics::OnUpdateApplied(const std::string& job_id,
                                    const v1::JobSpec& /*spec*/,
                                    const AppliedUpdate& update) {
  const std::pair<std::string, std::string> key(update.device, update.optimizer);
  {
    // Series are removed only under the writer lock, so they stay valid
    // while the reader lock is held.
    absl::ReaderMutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job != jobs_.end() && job->second.staleness != nullptr) {
      auto apply = job->second.apply.find(key);
      if (apply != job->second.apply.end()) {
        apply->second->Observe(update.apply_seconds());
        job->second.staleness->Observe(static_cast<double>(update.staleness));
        return;
      }
    }
  }
  absl::MutexLock lock(&mu_);
  JobSeries& series = SeriesLocked(job_id);
  if (series.staleness == nullptr) {
    series.staleness =
        &staleness_family_.Add({{kJobLabel, job_id}}, StalenessBuckets());
  }
  prometheus::Histogram*& apply = series.apply[key];
  if (apply == nullptr) {
    apply = &apply_family_.Add({{kJobLabel, job_id},
                                {"device", update.device},
                                {"optimizer", update.optimizer}},
                               ApplyBuckets());
  }
  apply->Observe(update.apply_seconds());
  series.staleness->Observe(static_cast<double>(update.staleness));
}

void MasterMetrics::AddReceivedBytes(const std::string& job_id,
                                     uint64_t bytes) {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job != jobs_.end()) {
      job->second.received->Increment(static_cast<double>(bytes));
      return;
    }
  }
  absl::MutexLock lock(&mu_);
  SeriesLocked(job_id).received->Increment(static_cast<double>(bytes));
}

void MasterMetrics::AddSentBytes(const std::string& job_id, uint64_t bytes) {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job != jobs_.end()) {
      job->second.sent->Increment(static_cast<double>(bytes));
      return;
    }
  }
  absl::MutexLock lock(&mu_);
  SeriesLocked(job_id).sent->Increment(static_cast<double>(bytes));
}

void MasterMetrics::ObserveRpc(absl::string_view method, absl::string_view code,
                               double seconds) {
  rpc_family_
      .Add({{"method", std::string(method)}, {"code", std::string(code)}},
           RpcBuckets())
      .Observe(seconds);
}

prometheus::Gauge& MasterMetrics::OpenStreams(absl::string_view method) {
  return streams_family_.Add({{"method", std::string(method)}});
}

void MasterMetrics::StreamOpened(absl::string_view method) {
  OpenStreams(method).Increment();
}

void MasterMetrics::StreamClosed(absl::string_view method) {
  OpenStreams(method).Decrement();
}

void MasterMetrics::RemoveSeriesLocked(const JobSeries& series) const {
  received_family_.Remove(series.received);
  sent_family_.Remove(series.sent);
  if (series.staleness != nullptr) staleness_family_.Remove(series.staleness);
  for (const auto& [key, histogram] : series.apply) {
    apply_family_.Remove(histogram);
  }
}

void MasterMetrics::OnJobDeleted(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  RemoveSeriesLocked(it->second);
  jobs_.erase(it);
}

void MasterMetrics::RetainLocked(const std::vector<std::string>& keep) const {
  std::map<std::string, JobSeries> kept;
  for (const std::string& job_id : keep) {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) {
      kept.insert(jobs_.extract(it));
    }
  }
  for (const auto& [job_id, series] : jobs_) RemoveSeriesLocked(series);
  jobs_ = std::move(kept);
  // Retained jobs have their byte counters from the start (at 0).
  for (const std::string& job_id : keep) SeriesLocked(job_id);
}

// MPI Opt: studies by state, and the running ones' progress (ended studies
// keep no series: their figures no longer change).
void MasterMetrics::CollectStudies(const std::vector<v1::StudyStatus>& studies,
                                   std::vector<MetricFamily>& out) {
  std::map<std::string, int> by_state = {
      {"running", 0}, {"completed", 0}, {"cancelled", 0}};
  Built running("mpilearn_study_trials_running",
                "Trials of the study whose jobs are queued or running.",
                MetricType::Gauge);
  Built created("mpilearn_study_trials_created",
                "Trials the study has created so far.", MetricType::Gauge);
  Built budget("mpilearn_study_trials_budget",
               "Trials the study creates in all.", MetricType::Gauge);
  Built epochs("mpilearn_study_epochs_trained",
               "Epochs trained by all the study's trials.", MetricType::Gauge);
  Built best("mpilearn_study_best_value",
             "The study's best objective value so far.", MetricType::Gauge);
  for (const v1::StudyStatus& study : studies) {
    switch (study.state()) {
      case v1::STUDY_STATE_COMPLETED:
        ++by_state["completed"];
        continue;
      case v1::STUDY_STATE_CANCELLED:
        ++by_state["cancelled"];
        continue;
      default:
        ++by_state["running"];
        break;
    }
    const std::vector<ClientMetric::Label> labels = {{"study", study.study_id()}};
    running.Add(labels, study.trials_running());
    created.Add(labels, study.trials_created());
    budget.Add(labels, study.spec().trials());
    epochs.Add(labels, study.epochs_trained());
    if (study.has_best_value()) best.Add(labels, study.best_value());
  }
  Built states("mpilearn_studies", "MPI Opt studies by state.",
               MetricType::Gauge);
  for (const auto& [state, count] : by_state) states.Add({{"state", state}}, count);
  for (Built* family : {&states, &running, &created, &budget, &epochs, &best}) {
    family->MoveTo(out);
  }
}

void MasterMetrics::CollectOwners(const std::vector<OwnerView>& owners,
                                  std::vector<MetricFamily>& out) {
  Built groups("mpilearn_owner_groups", "Live groups the owner's jobs hold.",
               MetricType::Gauge);
  Built queued("mpilearn_owner_queued_jobs", "The owner's QUEUED jobs.", MetricType::Gauge);
  Built recent("mpilearn_owner_recent_groups",
               "The owner's recent use: groups held, averaged with decaying weights "
               "(--fair_share_half_life_s).",
               MetricType::Gauge);
  Built weight("mpilearn_owner_share_weight", "The owner's fair-share weight (share=).",
               MetricType::Gauge);
  Built share("mpilearn_owner_group_share",
              "The owner's fraction of all live groups (0 when none is live).",
              MetricType::Gauge);
  int total = 0;
  for (const OwnerView& owner : owners) total += owner.groups;
  for (const OwnerView& owner : owners) {
    const std::vector<ClientMetric::Label> labels = {{"owner", owner.owner}};
    groups.Add(labels, owner.groups);
    queued.Add(labels, owner.queued_jobs);
    recent.Add(labels, owner.recent_groups);
    weight.Add(labels, owner.share);
    share.Add(labels, total > 0 ? static_cast<double>(owner.groups) / total : 0.0);
  }
  for (Built* family : {&groups, &queued, &recent, &weight, &share}) family->MoveTo(out);
}

std::vector<MetricFamily> MasterMetrics::Collect() const {
  StatusProvider provider;
  StudyProvider study_provider;
  OwnerProvider owner_provider;
  {
    absl::MutexLock lock(&provider_mu_);
    provider = provider_;
    study_provider = study_provider_;
    owner_provider = owner_provider_;
  }
  std::vector<JobMetricsView> all;
  if (provider) all = provider();

  // Which jobs have series: QUEUED and RUNNING ones, and the ended_jobs
  // most recently ended ones (by job number).
  std::vector<const JobMetricsView*> ended;
  std::vector<const JobMetricsView*> shown;
  std::map<v1::JobState, int> by_state = {{v1::JOB_STATE_QUEUED, 0},
                                          {v1::JOB_STATE_RUNNING, 0},
                                          {v1::JOB_STATE_COMPLETED, 0},
                                          {v1::JOB_STATE_FAILED, 0},
                                          {v1::JOB_STATE_CANCELLED, 0}};
  for (const JobMetricsView& job : all) {
    auto state = by_state.find(job.status.state());
    if (state != by_state.end()) ++state->second;
    (Ended(job.status.state()) ? ended : shown).push_back(&job);
  }
  std::sort(ended.begin(), ended.end(),
            [](const JobMetricsView* a, const JobMetricsView* b) {
              const int64_t na = JobNumber(a->status.job_id());
              const int64_t nb = JobNumber(b->status.job_id());
              if (na != nb) return na > nb;
              return a->status.job_id() > b->status.job_id();
            });
  if (ended.size() > static_cast<size_t>(std::max(0, options_.ended_jobs))) {
    ended.resize(static_cast<size_t>(std::max(0, options_.ended_jobs)));
  }
  shown.insert(shown.end(), ended.begin(), ended.end());

  Built jobs("mpilearn_jobs", "Jobs by state.", MetricType::Gauge);
  for (const auto& [state, count] : by_state) {
    jobs.Add({{"state", StateLabel(state)}}, count);
  }

  Built info("mpilearn_job_info",
             "Always 1; the job's description, for legends and filters.",
             MetricType::Gauge);
  Built updates("mpilearn_job_updates_applied_total",
                "Updates the master applied.", MetricType::Counter);
  Built samples("mpilearn_job_samples_trained_total",
                "Training samples in completed data units, all groups.",
                MetricType::Counter);
  Built epochs_completed("mpilearn_job_epochs_completed",
                         "Epochs whose last unit completed.", MetricType::Gauge);
  Built epochs("mpilearn_job_epochs", "Epochs the job trains for.",
               MetricType::Gauge);
  Built progress("mpilearn_job_progress_ratio",
                 "Samples trained / (epochs x samples per epoch), 0..1.",
                 MetricType::Gauge);
  Built train_loss("mpilearn_job_train_loss",
                   "Mean training loss of the most recently completed units.",
                   MetricType::Gauge);
  Built val_loss("mpilearn_job_validation_loss",
                 "Loss of the latest validation (group or validation pool).",
                 MetricType::Gauge);
  Built val_accuracy(
      "mpilearn_job_validation_accuracy",
      "Accuracy of the latest validation (group or validation pool).",
      MetricType::Gauge);
  Built validations("mpilearn_job_validations_total", "Validations recorded.",
                    MetricType::Counter);
  Built test_loss("mpilearn_job_test_loss", "Test set loss of the final weights.",
                  MetricType::Gauge);
  Built test_accuracy("mpilearn_job_test_accuracy",
                      "Test set accuracy of the final weights.",
                      MetricType::Gauge);
  Built stale_rejected("mpilearn_job_stale_rejected_total",
                       "Updates refused by max_staleness.", MetricType::Counter);
  Built requeued("mpilearn_job_units_requeued_total",
                 "Data units re-queued after a group left or was lost.",
                 MetricType::Counter);
  Built update_rejected(
      "mpilearn_job_updates_rejected_total",
      "Updates refused because they would have made the weights or the "
      "optimizer state NaN or Inf.",
      MetricType::Counter);
  Built storage_pending(
      "mpilearn_job_storage_pending",
      "1 while some of the job's records could not be written to the state "
      "directory (JobStatus.storage_error; the master retries), else 0.",
      MetricType::Gauge);
  Built job_groups("mpilearn_job_groups", "Alive groups serving the job.",
                   MetricType::Gauge);
  Built job_ranks("mpilearn_job_ranks", "Ranks of the alive groups serving the job.",
                  MetricType::Gauge);
  Built job_shards("mpilearn_job_shards",
                   "Parameter shards holding the job's weights (0: this master holds them).",
                   MetricType::Gauge);
  Built job_learning_rate("mpilearn_job_learning_rate",
                          "The master optimizer's learning rate for the job's next update "
                          "(its optimizer.schedule's).",
                          MetricType::Gauge);
  Built published("mpilearn_job_snapshots_published_total",
                  "Weight snapshots published for validation pools.",
                  MetricType::Counter);
  Built skipped("mpilearn_job_snapshots_skipped_total",
                "Weight snapshots replaced before a slow subscriber took them.",
                MetricType::Counter);

  Built step_seconds("mpilearn_group_step_seconds_total",
                     "Seconds summed over the group's ranks by phase: data, "
                     "compute, master (waiting on the master), mpi "
                     "(collectives).",
                     MetricType::Counter);
  Built group_samples("mpilearn_group_samples_trained_total",
                      "Samples in the group's completed units.",
                      MetricType::Counter);
  Built group_units("mpilearn_group_units_completed_total",
                    "Data units the group completed.", MetricType::Counter);
  Built group_updates("mpilearn_group_updates_applied_total",
                      "The group's accepted updates.", MetricType::Counter);
  Built group_cpu("mpilearn_group_cpu_seconds_total",
                  "CPU time of the group's processes.", MetricType::Counter);
  Built group_memory("mpilearn_group_resident_memory_bytes",
                     "Resident memory of the group's processes.",
                     MetricType::Gauge);
  Built group_ranks("mpilearn_group_ranks", "Ranks in the group.",
                    MetricType::Gauge);

  std::vector<std::string> keep;
  keep.reserve(shown.size());
  for (const JobMetricsView* view : shown) {
    const v1::JobStatus& status = view->status;
    const v1::JobSpec& spec = status.spec();
    const std::string& id = status.job_id();
    keep.push_back(id);
    const ClientMetric::Label job{kJobLabel, id};
    info.Add({job,
              {"name", spec.name()},
              {"algorithm", spec.algorithm()},
              {"model", spec.model().name()},
              {"optimizer", UpdateRuleName(spec)},
              {"owner", spec.owner()},
              {"state", StateLabel(status.state())}},
             1);
    updates.Add({job}, static_cast<double>(status.updates_applied()));
    samples.Add({job}, static_cast<double>(status.samples_trained()));
    epochs_completed.Add({job}, status.epochs_done());
    epochs.Add({job}, spec.epochs());
    const double planned = static_cast<double>(spec.epochs()) *
                           static_cast<double>(status.samples_per_epoch());
    progress.Add({job},
                 planned > 0 ? std::min(1.0, static_cast<double>(
                                                 status.samples_trained()) /
                                                 planned)
                             : 0.0);
    if (status.has_train_loss()) train_loss.Add({job}, status.train_loss());
    if (status.validations_size() > 0) {
      const v1::ValidationRecord& latest = *status.validations().rbegin();
      val_loss.Add({job}, latest.val_loss());
      val_accuracy.Add({job}, latest.val_accuracy());
    }
    validations.Add({job}, static_cast<double>(view->validations));
    if (status.has_test_accuracy()) {
      test_loss.Add({job}, status.test_loss());
      test_accuracy.Add({job}, status.test_accuracy());
    }
    stale_rejected.Add({job}, static_cast<double>(status.stale_rejected()));
    requeued.Add({job}, static_cast<double>(status.units_requeued()));
    update_rejected.Add({job}, static_cast<double>(status.updates_rejected()));
    storage_pending.Add({job}, status.storage_error().empty() ? 0.0 : 1.0);
    published.Add({job}, static_cast<double>(status.snapshots_published()));
    skipped.Add({job}, static_cast<double>(status.snapshots_skipped()));

    int alive = 0;
    int ranks = 0;
    for (const v1::GroupInfo& group : status.groups()) {
      if (!group.alive()) continue;
      ++alive;
      ranks += group.ranks();
      const ClientMetric::Label group_label{"group", group.group_id()};
      group_samples.Add({job, group_label},
                        static_cast<double>(group.samples_trained()));
      group_units.Add({job, group_label},
                      static_cast<double>(group.units_completed()));
      group_updates.Add({job, group_label},
                        static_cast<double>(group.updates_applied()));
      group_ranks.Add({job, group_label}, group.ranks());
      if (group.has_telemetry()) {
        const v1::GroupTelemetry& t = group.telemetry();
        const std::pair<const char*, double> phases[] = {
            {"data", t.data_seconds()},
            {"compute", t.compute_seconds()},
            {"master", t.master_seconds()},
            {"mpi", t.mpi_seconds()}};
        for (const auto& [phase, seconds] : phases) {
          step_seconds.Add({job, group_label, {"phase", phase}}, seconds);
        }
        group_cpu.Add({job, group_label}, t.cpu_seconds());
        group_memory.Add({job, group_label},
                         static_cast<double>(t.resident_bytes()));
      }
    }
    job_groups.Add({job}, alive);
    job_ranks.Add({job}, ranks);
    job_shards.Add({job}, status.shards_size());
    job_learning_rate.Add({job}, status.learning_rate());
  }

  std::vector<MetricFamily> out;
  jobs.MoveTo(out);
  for (Built* family :
       {&info, &updates, &samples, &epochs_completed, &epochs, &progress,
        &train_loss, &val_loss, &val_accuracy, &validations, &test_loss,
        &test_accuracy, &stale_rejected, &requeued, &update_rejected,
        &storage_pending, &job_groups, &job_ranks, &job_shards, &job_learning_rate,
        &published, &skipped, &step_seconds, &group_samples, &group_units,
        &group_updates, &group_cpu, &group_memory, &group_ranks}) {
    family->MoveTo(out);
  }

  if (study_provider) CollectStudies(study_provider(), out);
  if (owner_provider) CollectOwners(owner_provider(), out);

  // A live process always has resident pages: 0 means /proc could not be
  // read, and the figures are left out rather than reported as 0.
  const double resident_bytes = ProcessResidentBytes();
  if (resident_bytes > 0.0) {
    const double cpu_seconds = ProcessCpuSeconds();
    Built cpu("mpilearn_process_cpu_seconds_total",
              "The master's CPU time (user + system).", MetricType::Counter);
    cpu.Add({}, cpu_seconds);
    cpu.MoveTo(out);
    Built memory("mpilearn_process_resident_memory_bytes",
                 "The master's resident memory.", MetricType::Gauge);
    memory.Add({}, resident_bytes);
    memory.MoveTo(out);
  }
  Built start("mpilearn_process_start_time_seconds",
              "When the master started (Unix time).", MetricType::Gauge);
  start.Add({}, start_time_seconds_);
  start.MoveTo(out);
  Built build("mpilearn_build_info", "Always 1; the master's version.",
              MetricType::Gauge);
  build.Add({{"version", kMpiLearnVersion}}, 1);
  build.MoveTo(out);

  // The instrumented families, without the series of jobs that fell out.
  // The writer lock keeps recorders from re-adding one meanwhile.
  absl::MutexLock lock(&mu_);
  if (provider) RetainLocked(keep);
  for (MetricFamily& family : registry_->Collect()) {
    out.push_back(std::move(family));
  }
  return out;
}

}  // namespace mpilearn::server
