#include "server/master_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mpilearn::server {

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::BuildAndStart(
    const Options& options) {
  auto server = std::unique_ptr<MasterServer>(new MasterServer());
  if (!options.trace_file.empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        server->trace_, TraceRecorder::ToFile(options.trace_file, /*pid=*/0,
                                              "mpilearn-master"));
  }
  if (!options.metrics_listen.empty()) {
    MasterMetrics::Options metrics_options;
    metrics_options.ended_jobs = options.metrics_ended_jobs;
    server->metrics_ = std::make_shared<MasterMetrics>(metrics_options);
  }
  MasterCore::Options core_options;
  // A trial's job that validated or ended wakes the study table (set once
  // the table exists; no RPC arrives before).
  MasterServer* self_for_jobs = server.get();
  core_options.registry.on_job_changed = [self_for_jobs](const std::string&) {
    opt::StudyTable* studies = self_for_jobs->studies_for_wake_.load();
    if (studies != nullptr) studies->Wake();
  };
  core_options.registry.metrics = server->metrics_.get();
  core_options.registry.trace = server->trace_.get();
  core_options.registry.state_dir = options.state_dir;
  core_options.registry.group_timeout = options.group_timeout;
  core_options.registry.engine = options.engine;
  core_options.max_model_bytes = options.max_model_bytes;
  MPILEARN_ASSIGN_OR_RETURN(server->core_, MasterCore::Create(core_options));
  server->service_ = std::make_unique<MasterServiceImpl>(
      *server->core_, server->metrics_.get(), server->trace_.get());
  server->trial_jobs_ = std::make_unique<CoreTrialJobs>(*server->core_);
  opt::StudyTable::Options study_options;
  study_options.state_dir = options.state_dir;
  MPILEARN_ASSIGN_OR_RETURN(
      server->studies_,
      opt::StudyTable::Create(study_options, *server->trial_jobs_));
  server->studies_for_wake_.store(server->studies_.get());
  if (server->metrics_ != nullptr) {
    opt::StudyTable* studies = server->studies_.get();
    server->metrics_->SetStudyProvider([studies] {
      const v1::ListStudiesResponse listed = studies->ListStudies();
      return std::vector<v1::StudyStatus>(listed.studies().begin(),
                                          listed.studies().end());
    });
  }
  server->study_service_ =
      std::make_unique<StudyServiceImpl>(*server->studies_, server->metrics_.get());

  // Metrics before gRPC: a bad --metrics_listen fails the start before any
  // client could have been served.
  if (server->metrics_ != nullptr) {
    MasterCore* core = server->core_.get();
    server->metrics_->SetStatusProvider([core] { return core->ListForMetrics(); });
    std::string why;
    try {
      server->exposer_ = std::make_unique<prometheus::Exposer>(
          options.metrics_listen, /*num_threads=*/2);
      const std::vector<int> ports = server->exposer_->GetListeningPorts();
      if (!ports.empty()) server->metrics_port_ = ports.front();
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (server->exposer_ == nullptr || server->metrics_port_ == 0) {
      server->exposer_.reset();
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on '", options.metrics_listen, "'",
          why.empty() ? "" : absl::StrCat(" (", why, ")"),
          "; is the port in use or the address not local? Use "
          "--metrics_listen HOST:PORT (port 0 picks a free one), or "
          "--metrics_listen= to serve no metrics"));
    }
    server->exposer_->RegisterCollectable(server->metrics_);
  }

  grpc::ServerBuilder builder;
  SetBulkTransferArgs(&builder);
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &server->port_);
  if (!options.listen_unix.empty()) {
    // sun_path holds 108 bytes with the terminating NUL.
    constexpr size_t kMaxSocketPath = 107;
    if (options.listen_unix.size() > kMaxSocketPath) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen_unix: the socket path is ", options.listen_unix.size(),
          " bytes; Unix sockets take at most ", kMaxSocketPath,
          ": choose a shorter path, e.g. /run/mpilearn.sock"));
    }
    // A socket file left by a previous master would make the bind fail.
    struct stat st;
    if (::stat(options.listen_unix.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      ::unlink(options.listen_unix.c_str());
    }
    builder.AddListeningPort("unix:" + options.listen_unix,
                             grpc::InsecureServerCredentials());
  }
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->study_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options.listen,
        "'", options.listen_unix.empty() ? "" : absl::StrCat(" or unix:'", options.listen_unix, "'"),
        "; is the port in use or the address not local? Use --listen "
        "HOST:PORT (port 0 picks a free one)"));
  }

  MasterServer* self = server.get();
  server->reaper_ = std::thread([self] {
    const absl::Duration period = self->core_->TickPeriod();
    bool flush_failed = false;
    while (!self->stopping_.WaitForNotificationWithTimeout(period)) {
      self->core_->Tick();  // lost groups, time-based checkpoints
      if (self->trace_ != nullptr) {
        const absl::Status flushed = self->trace_->Flush();
        if (!flushed.ok() && !flush_failed) {
          LOG(ERROR) << "trace: " << flushed;  // once; the disk may be full
        }
        flush_failed = !flushed.ok();
      }
    }
  });
  return server;
}

void MasterServer::Shutdown(absl::Duration grace) {
  if (stopping_.HasBeenNotified()) return;
  stopping_.Notify();
  // No scrape reads the registry or the hub from now on.
  exposer_.reset();
  // Snapshot streams never end on their own; closing the hub ends them now
  // rather than at the end of the grace period.
  if (core_ != nullptr) core_->CloseSnapshots();
  // Study watches end too, and the table's thread stops: no study starts
  // or stops a job any more.
  if (studies_ != nullptr) studies_->CloseWatches();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoSeconds(grace));
  }
  if (reaper_.joinable()) reaper_.join();
  studies_for_wake_.store(nullptr);
  studies_.reset();  // joins its thread; no RPC uses it any more
  // No call runs any more: the checkpoints hold everything the jobs did.
  if (core_ != nullptr) core_->CheckpointAll();
  if (trace_ != nullptr) {
    const absl::Status closed = trace_->Close();
    if (!closed.ok()) LOG(ERROR) << "trace: " << closed;
  }
}

MasterServer::~MasterServer() { Shutdown(); }

}  // namespace mpilearn::server
