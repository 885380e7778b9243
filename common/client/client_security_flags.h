// The command-line flags every MPI Learn client takes to reach a secured
// master (docs/security.md), defined once in client_security_flags.cc:
//
//   --tls_ca FILE      trust this CA's PEM certificate: speak TLS
//   --tls_cert FILE    mutual TLS: this client's PEM certificate
//   --tls_key FILE     ... and its PEM key
//   --token_file FILE  the bearer token (else $MPILEARN_TOKEN)
//
// Linked by the client tools (mpilearnctl, mpilearn-opt, mpilearn-worker),
// never by the master, whose own --tls_cert/--tls_key are its server's.
#ifndef MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_FLAGS_H_
#define MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/client/client_security.h"

namespace mpilearn {

// Path of the file defining the flags, for a tool's absl usage config
// (its --helpfull listing).
inline constexpr char kClientSecurityFlagsSource[] =
    "common/client/client_security_flags.cc";

// Lines for a tool's --help text describing the flags.
inline constexpr char kClientSecurityUsage[] =
    "Secured masters (docs/security.md):\n"
    "  --tls_ca FILE      speak TLS, trusting this CA (PEM)\n"
    "  --tls_cert FILE    mutual TLS: this client's certificate (PEM)\n"
    "  --tls_key FILE     mutual TLS: its key (PEM)\n"
    "  --token_file FILE  the bearer token (default: $MPILEARN_TOKEN)\n";

// The flags' values: the token read from --token_file when given, else
// from $MPILEARN_TOKEN. Errors (an unreadable token file, a bad token, a
// certificate without its key) say which flag to fix.
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_CLIENT_SECURITY_FLAGS_H_
