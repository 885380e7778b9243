#include "common/client/client_security_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM certificate of the CA that signed the master's certificate: "
          "connect with TLS (the master runs with --tls_cert/--tls_key). A "
          "unix: master address stays plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "Mutual TLS: this client's PEM certificate (signed by the master's "
          "--tls_client_ca). Needs --tls_key and --tls_ca.");
ABSL_FLAG(std::string, tls_key, "",
          "Mutual TLS: the PEM private key of --tls_cert.");
ABSL_FLAG(std::string, token_file, "",
          "File holding this client's bearer token (the master's "
          "--tokens_file gives it a role). Default: the token in "
          "$MPILEARN_TOKEN, if set.");

namespace mpilearn {

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags() {
  ClientSecurity security;
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  MPILEARN_RETURN_IF_ERROR(CheckTlsFiles(security));
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    security.token = *std::move(token);
  } else if (const char* env = std::getenv("MPILEARN_TOKEN");
             env != nullptr && *env != '\0') {
    const absl::Status valid = CheckToken(env);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("$MPILEARN_TOKEN: ", valid.message()));
    }
    security.token = env;
  }
  return security;
}

}  // namespace mpilearn
