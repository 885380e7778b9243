// How a client reaches a master that requires TLS and tokens
// (docs/security.md): ClientSecurity says which CA to trust, which client
// certificate to show (mutual TLS) and which bearer token to send;
// CreateMasterChannel builds the channel every C++ client uses.
//
//   ClientSecurity security;               // or ClientSecurityFromFlags()
//   security.tls_ca = "ca.pem";
//   security.token = "3f9c...";
//   MPILEARN_ASSIGN_OR_RETURN(auto channel,
//                             CreateMasterChannel("host:7070", security, args));
//
// The token rides on every call as the metadata "authorization: Bearer
// TOKEN", added by a client interceptor: gRPC's call credentials are only
// sent over TLS, while the master also checks tokens on its plaintext
// loopback and Unix-socket ports.
//
// The flags --tls_ca, --tls_cert, --tls_key and --token_file are defined in
// common/client/client_security_flags.h's library, which tools link.
#ifndef MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_H_
#define MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace mpilearn {

struct ClientSecurity {
  // PEM file of the CA that signed the master's certificate. Set: the
  // channel speaks TLS (except to a unix: target, which stays plaintext).
  std::string tls_ca;
  // Mutual TLS: PEM files of this client's certificate and its key.
  std::string tls_cert;
  std::string tls_key;
  // The bearer token itself (not a file name); empty sends none.
  std::string token;
};

// OK when the TLS files are given together as they must be: a client
// certificate with its key, and those only with the CA (--tls_ca).
absl::Status CheckTlsFiles(const ClientSecurity& security);

// OK when `token` can go into call metadata: printable ASCII without
// spaces, at most 512 characters.
absl::Status CheckToken(absl::string_view token);

// The token in `path`: its contents without surrounding whitespace (a
// trailing newline). Errors name the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// A channel to `address` with `args`: TLS per `security` (files read now;
// an unreadable or malformed one is INVALID_ARGUMENT naming it), the token
// on every call. Does not connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateMasterChannel(
    const std::string& address, const ClientSecurity& security,
    const grpc::ChannelArguments& args);

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_H_
