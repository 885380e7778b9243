#include "server/study_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/call_guard.h"
#include "server/rpc_scope.h"

namespace mpilearn::server {
namespace {

// Rule "owners manage their own" for a study (its base job's owner).
absl::Status CheckManagesStudy(const opt::StudyTable& table, const Caller& caller,
                               const std::string& study_id) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  MPILEARN_ASSIGN_OR_RETURN(const std::string owner, table.StudyOwner(study_id));
  return CheckManages(caller, owner, absl::StrCat("study ", study_id));
}

}  // namespace

grpc::Status StudyServiceImpl::CreateStudy(grpc::ServerContext* context,
                                           const v1::CreateStudyRequest* request,
                                           v1::CreateStudyResponse* response) {
  RpcScope rpc(metrics_, "CreateStudy");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("CreateStudy", [&]() -> grpc::Status {
    // The study and its trials' jobs belong to its creator unless an
    // admin names another owner.
    v1::CreateStudyRequest owned = *request;
    v1::JobSpec* base = owned.mutable_spec()->mutable_base();
    if (absl::Status denied = CheckSubmission(rpc.caller(), base->mutable_owner(),
                                              base->priority(), "CreateStudy");
        !denied.ok()) {
      return ToGrpcStatus(denied);
    }
    if (!base->study().empty()) {
      return ToGrpcStatus(
          InvalidRequestError("spec.base.study is set by MPI Opt on each trial; remove it"));
    }
    return Reply(table_.CreateStudy(owned), response);
  }));
}

grpc::Status StudyServiceImpl::GetStudy(grpc::ServerContext* context,
                                        const v1::GetStudyRequest* request,
                                        v1::StudyStatus* response) {
  RpcScope rpc(metrics_, "GetStudy");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("GetStudy", [&] {
    return Reply(table_.GetStudy(request->study_id()), response);
  }));
}

grpc::Status StudyServiceImpl::ListStudies(grpc::ServerContext* context,
                                           const v1::ListStudiesRequest*,
                                           v1::ListStudiesResponse* response) {
  RpcScope rpc(metrics_, "ListStudies");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("ListStudies", [&] {
    *response = table_.ListStudies();
    return grpc::Status::OK;
  }));
}

grpc::Status StudyServiceImpl::WatchStudy(
    grpc::ServerContext* context, const v1::WatchStudyRequest* request,
    grpc::ServerWriter<v1::StudyEvent>* writer) {
  RpcScope rpc(metrics_, "WatchStudy", /*streaming=*/true);
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  absl::StatusOr<std::unique_ptr<opt::StudyTable::Watch>> watch =
      table_.WatchStudy(request->study_id());
  if (!watch.ok()) return rpc.Finish(ToGrpcStatus(watch.status()));
  v1::StudyEvent event;
  while (!context->IsCancelled()) {
    if ((*watch)->Next(&event, absl::Seconds(1))) {
      if (!writer->Write(event)) {
        return rpc.Finish(ToGrpcStatus(absl::CancelledError("the watcher went away")));
      }
      if (event.kind() == v1::StudyEvent::KIND_STUDY_ENDED) {
        return rpc.Finish(grpc::Status::OK);
      }
    } else if ((*watch)->ended()) {
      return rpc.Finish(ToGrpcStatus(absl::UnavailableError(
          "the master is shutting down; watch again once it is back")));
    }
  }
  return rpc.Finish(ToGrpcStatus(absl::CancelledError("the watcher cancelled")));
}

grpc::Status StudyServiceImpl::CancelStudy(grpc::ServerContext* context,
                                           const v1::CancelStudyRequest* request,
                                           v1::StudyStatus* response) {
  RpcScope rpc(metrics_, "CancelStudy");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("CancelStudy", [&]() -> grpc::Status {
    if (absl::Status denied = CheckManagesStudy(table_, rpc.caller(), request->study_id());
        !denied.ok()) {
      return ToGrpcStatus(denied);
    }
    return Reply(table_.CancelStudy(*request), response);
  }));
}

grpc::Status StudyServiceImpl::CancelTrial(grpc::ServerContext* context,
                                           const v1::CancelTrialRequest* request,
                                           v1::Trial* response) {
  RpcScope rpc(metrics_, "CancelTrial");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("CancelTrial", [&]() -> grpc::Status {
    if (absl::Status denied = CheckManagesStudy(table_, rpc.caller(), request->study_id());
        !denied.ok()) {
      return ToGrpcStatus(denied);
    }
    return Reply(table_.CancelTrial(*request), response);
  }));
}

grpc::Status StudyServiceImpl::AskTrial(grpc::ServerContext* context,
                                        const v1::AskTrialRequest* request,
                                        v1::Trial* response) {
  RpcScope rpc(metrics_, "AskTrial");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("AskTrial", [&]() -> grpc::Status {
    if (absl::Status denied = CheckManagesStudy(table_, rpc.caller(), request->study_id());
        !denied.ok()) {
      return ToGrpcStatus(denied);
    }
    return Reply(table_.AskTrial(*request), response);
  }));
}

grpc::Status StudyServiceImpl::TellTrial(grpc::ServerContext* context,
                                         const v1::TellTrialRequest* request,
                                         v1::Trial* response) {
  RpcScope rpc(metrics_, "TellTrial");
  if (grpc::Status denied = rpc.Authorize(auth_, context); !denied.ok()) {
    return rpc.Finish(denied);
  }
  return rpc.Finish(GuardCall("TellTrial", [&]() -> grpc::Status {
    if (absl::Status denied = CheckManagesStudy(table_, rpc.caller(), request->study_id());
        !denied.ok()) {
      return ToGrpcStatus(denied);
    }
    return Reply(table_.TellTrial(*request), response);
  }));
}

}  // namespace mpilearn::server
