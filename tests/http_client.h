// A minimal HTTP/1.0 GET client for integration tests: reads the master's
// /metrics endpoint and queries a real Prometheus server's HTTP API on
// loopback. Not for production use (no TLS, no redirects, no chunking: an
// HTTP/1.0 request gets a plain body that ends when the server closes).
#ifndef MPILEARN_TESTS_HTTP_CLIENT_H_
#define MPILEARN_TESTS_HTTP_CLIENT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mpilearn::testing {

struct HttpResponse {
  int status = 0;
  std::string body;
};

// Extra request header lines, name and value ("Authorization", "Basic ...").
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// GET http://127.0.0.1:<port><target> (target: path and query).
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target,
                                     absl::Duration timeout = absl::Seconds(10));
// The same with `headers` added to the request.
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target,
                                     const HttpHeaders& headers,
                                     absl::Duration timeout = absl::Seconds(10));

// GET http://<host>:<port><target>, `host` an IPv4 address.
absl::StatusOr<HttpResponse> HttpGetFrom(const std::string& host, int port,
                                         const std::string& target,
                                         const HttpHeaders& headers = {},
                                         absl::Duration timeout = absl::Seconds(10));

// The "Authorization" header of HTTP Basic auth for `user` and `password`.
std::pair<std::string, std::string> BasicAuthorization(
    absl::string_view user, absl::string_view password);

// Percent-encodes a query parameter value.
std::string UrlEncode(absl::string_view text);

// A port no one listens on now (bind to port 0, read it, close).
int PickFreePort();

}  // namespace mpilearn::testing

#endif  // MPILEARN_TESTS_HTTP_CLIENT_H_
