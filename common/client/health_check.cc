#include "common/client/health_check.h"

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace mpilearn {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

// HealthCheckRequest { string service = 1; }: an empty service is left
// out, as protobuf leaves out a default value.
std::string EncodeRequest(const std::string& service) {
  google::protobuf::UnknownFieldSet request;
  if (!service.empty()) request.AddLengthDelimited(1, service);
  std::string bytes;
  request.SerializeToString(&bytes);
  return bytes;
}

// HealthCheckResponse { ServingStatus status = 1; }: the last value of field
// 1 wins; other fields are skipped, as protobuf skips unknown fields.
absl::StatusOr<ServingStatus> DecodeResponse(const std::string& bytes) {
  google::protobuf::UnknownFieldSet response;
  if (!response.ParseFromString(bytes)) {
    return absl::DataLossError("health reply: not a protobuf message");
  }
  uint64_t status = 0;
  for (int i = 0; i < response.field_count(); ++i) {
    const google::protobuf::UnknownField& field = response.field(i);
    if (field.number() == 1 && field.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      status = field.varint();
    }
  }
  if (status > 3) return ServingStatus::kUnknown;
  return static_cast<ServingStatus>(status);
}

}  // namespace

absl::string_view ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case ServingStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service,
                                          absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, kCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("health reply: unreadable");
  std::string bytes;
  for (const grpc::Slice& part : slices) {
    bytes.append(reinterpret_cast<const char*>(part.begin()), part.size());
  }
  return DecodeResponse(bytes);
}

}  // namespace mpilearn
