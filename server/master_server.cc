#include "server/master_server.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/client/channel_args.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"

namespace mpilearn::server {
namespace {

// The services' full names, as health checks name them.
constexpr char kMasterServiceName[] = "mpilearn.v1.Master";
constexpr char kStudiesServiceName[] = "mpilearn.v1.Studies";

// The whole of a PEM file named by `flag`; an error names both.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", path, "' is not a PEM file (no -----BEGIN line)"));
  }
  return text.str();
}

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<X509, X509Free> ParseCertificate(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return nullptr;
  return std::unique_ptr<X509, X509Free>(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// Checks what gRPC would only report as a failed start: that the
// certificate and the key parse and belong together, and that the client
// CA parses. Messages name the flags.
absl::Status CheckServerTls(const std::string& cert_pem,
                            const std::string& key_pem,
                            const std::string& client_ca_pem,
                            const MasterServer::Options& options) {
  std::unique_ptr<X509, X509Free> cert = ParseCertificate(cert_pem);
  std::unique_ptr<BIO, BioFree> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio == nullptr
          ? nullptr
          : PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  absl::Status status;
  if (cert == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert: '", options.tls_cert, "' holds no PEM certificate"));
  } else if (key == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: '", options.tls_key,
        "' holds no PEM private key (or it is encrypted; the master takes "
        "an unencrypted key)"));
  } else if (X509_check_private_key(cert.get(), key.get()) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: '", options.tls_key, "' is not the key of the "
        "certificate in --tls_cert '", options.tls_cert, "'"));
  } else if (!client_ca_pem.empty() && ParseCertificate(client_ca_pem) == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_client_ca: '", options.tls_client_ca,
        "' holds no PEM certificate"));
  }
  ERR_clear_error();  // gRPC shares OpenSSL's error queue
  return status;
}

// The credentials of the `listen` port: TLS when a certificate is given.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const MasterServer::Options& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both --tls_cert and --tls_key");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is "
          "TLS with client certificates)");
    }
    return grpc::InsecureServerCredentials();
  }
  MPILEARN_ASSIGN_OR_RETURN(const std::string cert,
                            ReadPemFile(options.tls_cert, "--tls_cert"));
  MPILEARN_ASSIGN_OR_RETURN(const std::string key,
                            ReadPemFile(options.tls_key, "--tls_key"));
  std::string client_ca;
  if (!options.tls_client_ca.empty()) {
    MPILEARN_ASSIGN_OR_RETURN(
        client_ca, ReadPemFile(options.tls_client_ca, "--tls_client_ca"));
  }
  MPILEARN_RETURN_IF_ERROR(CheckServerTls(cert, key, client_ca, options));
  grpc::SslServerCredentialsOptions ssl(
      client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = client_ca;
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

// True when every address of a metrics endpoint's listening ports
// (civetweb takes a comma-separated list: "127.0.0.1:7071,[::1]:7071") is
// loopback. A bare port ("7071") listens on every interface: not loopback.
bool IsLoopbackMetricsListen(const std::string& listen) {
  for (absl::string_view address : absl::StrSplit(listen, ',')) {
    if (!IsLoopbackListen(std::string(absl::StripAsciiWhitespace(address)))) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  absl::string_view host = listen;
  const size_t colon = host.rfind(':');
  if (colon != absl::string_view::npos) host = host.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return host == "localhost" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::BuildAndStart(
    const Options& options) {
  auto server = std::unique_ptr<MasterServer>(new MasterServer());
  // Security first: a bad file or an open address fails the start before
  // anything else is set up.
  if (options.tokens_file.empty() && !options.insecure &&
      !IsLoopbackListen(options.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve '", options.listen,
        "' (not loopback) without --tokens_file: anyone who reaches the "
        "port could submit, push into and end jobs. Give --tokens_file FILE "
        "(and --tls_cert/--tls_key; docs/security.md), or --insecure to "
        "serve it open anyway"));
  }
  if (!options.metrics_listen.empty() && options.metrics_token_file.empty() &&
      !options.insecure && !IsLoopbackMetricsListen(options.metrics_listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve metrics on '", options.metrics_listen,
        "' (not loopback) without --metrics_token_file: anyone who reaches "
        "the port could read every job's and host's series. Give "
        "--metrics_token_file FILE (Prometheus sends it with basic_auth "
        "password_file; docs/security.md), or --insecure to serve it open "
        "anyway"));
  }
  // Read even when metrics are off: a bad file is a mistake to report now.
  std::string metrics_token;
  if (!options.metrics_token_file.empty()) {
    MPILEARN_ASSIGN_OR_RETURN(metrics_token,
                              LoadMetricsToken(options.metrics_token_file));
  }
  MPILEARN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                            ListenCredentials(options));
  // Each owner's share and group limit come from its token's line.
  SchedulingPolicy scheduling = options.scheduling;
  if (options.tokens_file.empty()) {
    server->auth_ = std::make_unique<Authorizer>();
  } else {
    MPILEARN_ASSIGN_OR_RETURN(TokenTable tokens,
                              TokenTable::Load(options.tokens_file));
    LOG(INFO) << "tokens: " << tokens.size() << " from " << options.tokens_file;
    scheduling.owners = tokens.OwnerPolicies();
    server->auth_ = std::make_unique<Authorizer>(std::move(tokens));
  }
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
  Master::Options master_options;
  master_options.trace = server->trace_.get();
  MasterCore::Options& core_options = master_options.core;
  core_options.registry.observers = {server->metrics_.get()};
  core_options.registry.state_dir = options.state_dir;
  core_options.registry.group_timeout = options.group_timeout;
  core_options.registry.engine = options.engine;
  core_options.registry.scheduling = std::move(scheduling);
  core_options.limits = options.limits;
  // With tokens, groups belong to the caller that registered them.
  core_options.check_callers = server->auth_->enabled();
  core_options.shard_of = options.shard_of;
  core_options.shard_table.shards_per_job = options.shards_per_job;
  core_options.shard_table.min_shards = options.min_shards;
  MPILEARN_ASSIGN_OR_RETURN(server->master_,
                            Master::Create(std::move(master_options)));
  server->service_ = std::make_unique<MasterServiceImpl>(
      server->master_->core(), server->metrics_.get(), server->trace_.get(),
      server->auth_.get());
  opt::StudyTable* studies = server->master_->studies();
  if (server->metrics_ != nullptr) {
    server->metrics_->SetStudyProvider([studies] {
      const v1::ListStudiesResponse listed = studies->ListStudies();
      return std::vector<v1::StudyStatus>(listed.studies().begin(),
                                          listed.studies().end());
    });
  }
  server->study_service_ = std::make_unique<StudyServiceImpl>(
      *studies, server->metrics_.get(), server->auth_.get());

  // Metrics before gRPC: a bad --metrics_listen fails the start before any
  // client could have been served.
  if (server->metrics_ != nullptr) {
    MasterCore* core = &server->master_->core();
    server->metrics_->SetStatusProvider([core] { return core->ListForMetrics(); });
    server->metrics_->SetOwnerProvider([core] {
      std::vector<MasterMetrics::OwnerView> owners;
      for (const auto& [name, load] : core->OwnerLoads()) {
        owners.push_back({name, load.groups, load.queued_jobs, load.recent_groups, load.share});
      }
      return owners;
    });
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
    if (!metrics_token.empty()) {
      // Before the collectable: no scrape reads a metric unauthenticated.
      server->exposer_->RegisterAuth(MetricsPasswordCheck(metrics_token),
                                     "mpilearn-master", "/metrics");
    }
    server->exposer_->RegisterCollectable(server->metrics_);
  }

  // grpc.health.v1.Health on every address the server listens on, for load
  // balancers and Kubernetes probes; NOT_SERVING until the master ticks.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  SetBulkTransferArgs(&builder);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_streams_per_connection);
  builder.AddListeningPort(options.listen, credentials, &server->port_);
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

  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(false);

  // Lost groups, timed checkpoints, write retries and the trace's flush
  // from now on.
  server->master_->Start();
  if (!options.shard_of.empty()) {
    ShardAgent::Options agent;
    agent.lead = options.shard_of;
    agent.advertise = options.advertise;
    if (agent.advertise.empty()) {
      const std::string host = options.listen.substr(0, options.listen.rfind(':'));
      if (host.empty() || host == "0.0.0.0" || host == "[::]") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--shard_of: --listen ", options.listen,
            " names no address groups can reach; give --advertise HOST:PORT"));
      }
      agent.advertise = absl::StrCat(host, ":", server->port_);
    }
    agent.security = options.lead_security;
    MPILEARN_ASSIGN_OR_RETURN(server->shard_agent_,
                              ShardAgent::Start(std::move(agent), server->master_->core()));
  }
  server->drain_ = options.drain;
  if (health != nullptr) {
    health->SetServingStatus(true);
    health->SetServingStatus(kMasterServiceName, true);
    health->SetServingStatus(kStudiesServiceName, true);
  }
  return server;
}

void MasterServer::Shutdown(absl::Duration grace) {
  if (stopping_) return;
  stopping_ = true;
  if (shard_agent_ != nullptr) shard_agent_->Stop();
  // Draining: probes see NOT_SERVING while calls are still served.
  if (server_ != nullptr && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->Shutdown();
    if (drain_ > absl::ZeroDuration()) {
      LOG(INFO) << "health: NOT_SERVING; draining for " << absl::FormatDuration(drain_);
      absl::SleepFor(drain_);
    }
  }
  // No scrape reads the registry or the hub from now on.
  exposer_.reset();
  // Snapshot streams and study watches end; no study starts or stops a job
  // any more.
  if (master_ != nullptr) master_->CloseStreams();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoSeconds(grace));
  }
  // No call runs any more: the checkpoints hold everything the jobs did.
  if (master_ != nullptr) master_->Shutdown();
  if (trace_ != nullptr) {
    const absl::Status closed = trace_->Close();
    if (!closed.ok()) LOG(ERROR) << "trace: " << closed;
  }
}

MasterServer::~MasterServer() { Shutdown(); }

}  // namespace mpilearn::server
