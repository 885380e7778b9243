#include "common/client/client_security.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace mpilearn {
namespace {

constexpr size_t kMaxTokenLength = 512;

// Adds "authorization: Bearer TOKEN" to each call's initial metadata.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;  // the factory's, which outlives calls
};

// Threading: CreateClientInterceptor runs on any calling thread; the
// factory only reads its immutable value.
class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read '", path, "'"));
  }
  return text.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view flag) {
  absl::StatusOr<std::string> text = ReadFile(path, flag);
  if (text.ok() && !absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", path, "' is not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

}  // namespace

absl::Status CheckTlsFiles(const ClientSecurity& security) {
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS needs both --tls_cert and --tls_key");
  }
  if (!security.tls_cert.empty() && security.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key need --tls_ca (the CA of the master's "
        "certificate)");
  }
  return absl::OkStatus();
}

absl::Status CheckToken(absl::string_view token) {
  if (token.size() > kMaxTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the token has ", token.size(), " characters; at most ",
        kMaxTokenLength));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "the token has a space or a character outside printable ASCII");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "--token_file");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file: '", path, "' is empty"));
  }
  const absl::Status valid = CheckToken(token);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file: '", path, "': ", valid.message()));
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateMasterChannel(
    const std::string& address, const ClientSecurity& security,
    const grpc::ChannelArguments& args) {
  MPILEARN_RETURN_IF_ERROR(CheckTlsFiles(security));
  const absl::Status token = CheckToken(security.token);
  if (!token.ok()) return token;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The master's Unix socket is plaintext (file permissions guard it).
  if (security.tls_ca.empty() || absl::StartsWith(address, "unix:")) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadPem(security.tls_ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!security.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPem(security.tls_cert, "--tls_cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem(security.tls_key, "--tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  }
  if (security.token.empty()) {
    return grpc::CreateCustomChannel(address, credentials, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<BearerInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, credentials, args, std::move(interceptors));
}

}  // namespace mpilearn
