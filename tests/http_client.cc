#include "tests/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mpilearn::testing {
namespace {

// `host` (an IPv4 address) and `port`; false for a host that is not one.
bool Address(const std::string& host, int port, sockaddr_in* address) {
  *address = sockaddr_in{};
  address->sin_family = AF_INET;
  address->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, host.c_str(), &address->sin_addr) == 1;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target,
                                     absl::Duration timeout) {
  return HttpGet(port, target, HttpHeaders(), timeout);
}

std::pair<std::string, std::string> BasicAuthorization(
    absl::string_view user, absl::string_view password) {
  return {"Authorization",
          "Basic " + absl::Base64Escape(absl::StrCat(user, ":", password))};
}

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target,
                                     const HttpHeaders& headers,
                                     absl::Duration timeout) {
  return HttpGetFrom("127.0.0.1", port, target, headers, timeout);
}

absl::StatusOr<HttpResponse> HttpGetFrom(const std::string& host, int port,
                                         const std::string& target,
                                         const HttpHeaders& headers,
                                         absl::Duration timeout) {
  sockaddr_in address;
  if (!Address(host, port, &address)) {
    return absl::InvalidArgumentError(absl::StrCat("'", host, "' is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to ", host, ":", port, ": ", error));
  }
  std::string request = absl::StrCat("GET ", target,
                                     " HTTP/1.0\r\nHost: ", host, ":", port,
                                     "\r\nAccept: */*\r\n");
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&request, name, ": ", value, "\r\n");
  }
  request += "\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("could not send the HTTP request");
  }
  std::string raw;
  char buffer[65536];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      const std::string error = std::strerror(errno);
      close(fd);
      return absl::DeadlineExceededError(
          absl::StrCat("reading from 127.0.0.1:", port, target, ": ", error));
    }
    raw.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = raw.find("\r\n\r\n");
  const size_t space = raw.find(' ');
  HttpResponse response;
  if (header_end == std::string::npos || space == std::string::npos ||
      !absl::SimpleAtoi(raw.substr(space + 1, 3), &response.status)) {
    return absl::DataLossError(
        absl::StrCat("not an HTTP response: ", raw.substr(0, 200)));
  }
  response.body = raw.substr(header_end + 4);
  return response;
}

std::string UrlEncode(absl::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address;
  Address("127.0.0.1", 0, &address);
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace mpilearn::testing
