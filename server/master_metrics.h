// The master's Prometheus metrics (docs/observability.md lists every name,
// type and label): what an mpilearn-master exposes on --metrics_listen.
//
//   auto metrics = std::make_shared<MasterMetrics>(MasterMetrics::Options{});
//   metrics->SetStatusProvider([&] { return registry.ListForMetrics(); });
//   registry_options.observers = {metrics.get()};    // applied updates
//   exposer.RegisterCollectable(metrics);            // GET /metrics
//
// Two kinds of families:
//   - Instrumented, kept in an owned prometheus::Registry and updated as
//     things happen: mpilearn_apply_duration_seconds{job_id,device,optimizer},
//     mpilearn_update_staleness{job_id} (as a JobObserver of the job
//     registry), mpilearn_job_received_bytes_total / _sent_bytes_total{job_id},
//     mpilearn_rpc_duration_seconds{method,code} and
//     mpilearn_open_streams{method} (from the gRPC service).
//   - Built at Collect() time from the status provider's view of every job
//     (job, group and mpilearn_jobs families) and from /proc/self (process
//     families), so they can never disagree with the job's own status.
//
// Bounded series: a job's series exist while it is QUEUED or RUNNING and for
// the Options::ended_jobs most recently ended jobs (by job number, "job-12"
// -> 12); Collect removes the instrumented series of jobs that fell out.
// A group's series exist while the group is alive. mpilearn_jobs{state}
// always has all four states.
//
// Threading: thread-safe; Collect may run on several scrape threads at once
// while RPC threads record.
#ifndef MPILEARN_SERVER_MASTER_METRICS_H_
#define MPILEARN_SERVER_MASTER_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/core/job_values.h"
#include "proto/study.pb.h"
#include "common/version.h"
#include "server/core/job_observer.h"

namespace mpilearn::server {

// The label that names a job in every per-job and per-group series.
inline constexpr char kJobLabel[] = "job_id";

class MasterMetrics final : public prometheus::Collectable, public JobObserver {
 public:
  struct Options {
    // Ended (COMPLETED, FAILED) jobs whose series are kept, the most
    // recently ended first; >= 0.
    int ended_jobs = 20;
  };

  // Every job the master holds (JobRegistry::ListForMetrics), with the
  // snapshot counters filled in; called once per Collect.
  using StatusProvider = std::function<std::vector<JobMetricsView>()>;

  MasterMetrics();  // default Options
  explicit MasterMetrics(Options options);
  MasterMetrics(const MasterMetrics&) = delete;
  MasterMetrics& operator=(const MasterMetrics&) = delete;

  // Set once, before the first scrape. Without one, Collect exports only
  // the process and instrumented families.
  void SetStatusProvider(StatusProvider provider);

  // MPI Opt's studies without their trials (StudyTable::ListStudies);
  // called once per Collect. Exports mpilearn_studies{state} and, per
  // RUNNING study, mpilearn_study_trials_running, _trials_created,
  // _trials_budget, _epochs_trained and _best_value{study}. Set once, before
  // the first scrape; none: no study families.
  using StudyProvider = std::function<std::vector<v1::StudyStatus>()>;
  void SetStudyProvider(StudyProvider provider);

  // What each job owner's jobs hold and wait with (docs/scheduling.md);
  // called once per Collect. Exports, per owner,
  // mpilearn_owner_groups, _queued_jobs, _recent_groups, _share_weight and
  // _group_share (its fraction of every live group). Set once, before the
  // first scrape; none: no owner families.
  struct OwnerView {
    std::string owner;
    int groups = 0;
    int queued_jobs = 0;
    double recent_groups = 0;
    double share = 1.0;
  };
  using OwnerProvider = std::function<std::vector<OwnerView>()>;
  void SetOwnerProvider(OwnerProvider provider);

  // JobObserver: one observation each in mpilearn_apply_duration_seconds
  // and mpilearn_update_staleness.
  void OnUpdateApplied(const std::string& job_id, const v1::JobSpec& spec,
                       const AppliedUpdate& update) override;
  // JobObserver: drops the job's series at once (otherwise the next scrape
  // would, and a master nobody scrapes would keep them forever).
  void OnJobDeleted(const std::string& job_id) override;

  // Tensor bytes received from (gradients, initial weights) and sent to
  // (weights, snapshots) clients, per job.
  void AddReceivedBytes(const std::string& job_id, uint64_t bytes);
  void AddSentBytes(const std::string& job_id, uint64_t bytes);

  // One finished RPC: `method` as the proto names it ("PushGradient"),
  // `code` the gRPC status code's name ("OK", "NOT_FOUND").
  void ObserveRpc(absl::string_view method, absl::string_view code,
                  double seconds);

  // mpilearn_open_streams{method} +1 / -1.
  void StreamOpened(absl::string_view method);
  void StreamClosed(absl::string_view method);

  // prometheus::Collectable: every family, instrumented and built.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  // A job's instrumented series.
  struct JobSeries {
    prometheus::Counter* received = nullptr;
    prometheus::Counter* sent = nullptr;
    prometheus::Histogram* staleness = nullptr;
    // Keyed by (device, optimizer); one entry in practice.
    std::map<std::pair<std::string, std::string>, prometheus::Histogram*> apply;
  };

  JobSeries& SeriesLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the instrumented series of every job not in `keep`.
  void RetainLocked(const std::vector<std::string>& keep) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes one job's series from their families.
  void RemoveSeriesLocked(const JobSeries& series) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  prometheus::Gauge& OpenStreams(absl::string_view method);

  const Options options_;
  const double start_time_seconds_;
  // Owns the instrumented families; shared so the registry outlives them.
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& apply_family_;
  prometheus::Family<prometheus::Histogram>& staleness_family_;
  prometheus::Family<prometheus::Counter>& received_family_;
  prometheus::Family<prometheus::Counter>& sent_family_;
  prometheus::Family<prometheus::Histogram>& rpc_family_;
  prometheus::Family<prometheus::Gauge>& streams_family_;

  static void CollectStudies(const std::vector<v1::StudyStatus>& studies,
                             std::vector<prometheus::MetricFamily>& out);
  static void CollectOwners(const std::vector<OwnerView>& owners,
                            std::vector<prometheus::MetricFamily>& out);

  mutable absl::Mutex provider_mu_;
  StatusProvider provider_ ABSL_GUARDED_BY(provider_mu_);
  StudyProvider study_provider_ ABSL_GUARDED_BY(provider_mu_);
  OwnerProvider owner_provider_ ABSL_GUARDED_BY(provider_mu_);

  // Collect creates and removes series, hence mutable.
  mutable absl::Mutex mu_;
  mutable std::map<std::string, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_MASTER_METRICS_H_
