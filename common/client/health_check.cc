#include "common/client/health_check.h"

#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace mpilearn {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

// HealthCheckRequest { string service = 1; }
std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string bytes = "\x0a";  // field 1, length-delimited
  for (size_t n = service.size();; n >>= 7) {
    const unsigned char low = n & 0x7f;
    if (n < 0x80) {
      bytes.push_back(static_cast<char>(low));
      break;
    }
    bytes.push_back(static_cast<char>(low | 0x80));
  }
  return bytes + service;
}

// HealthCheckResponse { ServingStatus status = 1; }: the last value of field
// 1 wins; other fields are skipped as protobuf skips unknown fields.
absl::StatusOr<ServingStatus> DecodeResponse(const std::string& bytes) {
  uint64_t status = 0;
  size_t i = 0;
  auto varint = [&](uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64 && i < bytes.size(); shift += 7) {
      const unsigned char byte = static_cast<unsigned char>(bytes[i++]);
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < bytes.size()) {
    uint64_t key = 0;
    if (!varint(&key)) return absl::DataLossError("health reply: truncated field key");
    const uint64_t type = key & 7;
    uint64_t value = 0;
    if (type == 0) {
      if (!varint(&value)) return absl::DataLossError("health reply: truncated varint");
      if ((key >> 3) == 1) status = value;
    } else if (type == 2) {
      if (!varint(&value) || value > bytes.size() - i) {
        return absl::DataLossError("health reply: truncated field");
      }
      i += value;
    } else if (type == 1 || type == 5) {
      const size_t width = type == 1 ? 8 : 4;
      if (width > bytes.size() - i) return absl::DataLossError("health reply: truncated field");
      i += width;
    } else {
      return absl::DataLossError(absl::StrCat("health reply: wire type ", type));
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
