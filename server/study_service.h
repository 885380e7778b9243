// The gRPC face of MPI Opt: the Studies service (proto/study.proto), a thin
// adapter over the master's study table (server/opt/study_table.h; the
// master, server/master.h, runs it over the core's jobs). Holds no state of
// its own beyond the table it was given.
//
// Observability: every RPC's latency and code, like the Master service's
// (mpilearn_rpc_duration_seconds{method="CreateStudy",...}); WatchStudy
// counts in mpilearn_open_streams while it runs.
#ifndef MPILEARN_SERVER_STUDY_SERVICE_H_
#define MPILEARN_SERVER_STUDY_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "proto/study.grpc.pb.h"
#include "server/auth.h"
#include "server/master_metrics.h"
#include "server/opt/study_table.h"

namespace mpilearn::server {

class StudyServiceImpl final : public v1::Studies::Service {
 public:
  // `metrics` may be null; when given it must outlive the service.
  // `auth`, when given (it must outlive the service), checks every call's
  // token and role (server/auth.h); null checks nothing.
  explicit StudyServiceImpl(opt::StudyTable& table,
                            MasterMetrics* metrics = nullptr,
                            Authorizer* auth = nullptr)
      : table_(table), metrics_(metrics), auth_(auth) {}

  grpc::Status CreateStudy(grpc::ServerContext* context,
                           const v1::CreateStudyRequest* request,
                           v1::CreateStudyResponse* response) override;
  grpc::Status GetStudy(grpc::ServerContext* context,
                        const v1::GetStudyRequest* request,
                        v1::StudyStatus* response) override;
  grpc::Status ListStudies(grpc::ServerContext* context,
                           const v1::ListStudiesRequest* request,
                           v1::ListStudiesResponse* response) override;
  // Streams the watch's events until the study ends (OK), the client
  // cancels (noticed within a second) or the master shuts down
  // (UNAVAILABLE).
  grpc::Status WatchStudy(grpc::ServerContext* context,
                          const v1::WatchStudyRequest* request,
                          grpc::ServerWriter<v1::StudyEvent>* writer) override;
  grpc::Status CancelStudy(grpc::ServerContext* context,
                           const v1::CancelStudyRequest* request,
                           v1::StudyStatus* response) override;
  grpc::Status CancelTrial(grpc::ServerContext* context,
                           const v1::CancelTrialRequest* request,
                           v1::Trial* response) override;
  grpc::Status AskTrial(grpc::ServerContext* context,
                        const v1::AskTrialRequest* request,
                        v1::Trial* response) override;
  grpc::Status TellTrial(grpc::ServerContext* context,
                         const v1::TellTrialRequest* request,
                         v1::Trial* response) override;

 private:
  opt::StudyTable& table_;
  MasterMetrics* const metrics_;
  Authorizer* const auth_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_STUDY_SERVICE_H_
