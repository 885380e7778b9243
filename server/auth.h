// Bearer-token authentication and roles for the master's RPCs
// (docs/security.md).
//
// The master reads a tokens file (--tokens_file), one token a line:
//
//   # ROLE   NAME    TOKEN     OPTIONS
//   admin    ops     3f9c...             (every job and study, shards)
//   owner    alice   5d01...   share=2   (submit jobs and studies, change
//                                         and train its own)
//   worker   rack1   a81b...   owners=alice,bob   (register groups, push,
//                                         pull, data units, snapshots)
//   reader   grafana 77de...             (status, list, watch)
//
// Roles nest: admin may do everything an owner may, an owner everything a
// worker may, and a worker everything a reader may (a validation pool and
// a worker read job status). Each RPC needs one role (RequiredRole); which
// jobs a token may change or train is ownership's (caller_bindings.h:
// CheckManages, CheckTrains). Options: owners= (the owners whose jobs the
// token trains), share= and max_groups= (the name's fair share and group
// limit as an owner, server/sched/queue_order.h), max_priority= (the
// highest priority it submits). Clients send the token as the call
// metadata "authorization: Bearer TOKEN" (common/client/client_security.h).
//
// The Caller a token gives is passed to the master's core, which binds
// each worker group to the caller that registered it and each validation
// report to a subscription or a group (server/core/caller_bindings.h).
//
// The metrics endpoint has a token of its own (--metrics_token_file,
// LoadMetricsToken), checked as the password of HTTP Basic auth
// (MetricsPasswordCheck): Prometheus' scrape configs send it with
// basic_auth.password_file.
//
//   MPILEARN_ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load(path));
//   Authorizer auth(std::move(tokens));
//   absl::StatusOr<Caller> caller = auth.Authenticate(context, "SubmitJob");
//
// An Authorizer without a table (default-constructed) checks nothing: every
// caller is an admin named "" (the master's default on loopback).
//
// Threading: TokenTable and Authorizer are immutable after construction;
// RPC threads call them concurrently.
#ifndef MPILEARN_SERVER_AUTH_H_
#define MPILEARN_SERVER_AUTH_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "absl/container/flat_hash_map.h"
#include "server/core/caller_bindings.h"
#include "server/sched/queue_order.h"

namespace mpilearn::server {

// The role `method` (the RPC's short name, "SubmitJob", "GetStudy") needs.
// A method the table does not know needs admin, so a new RPC is closed
// until someone decides otherwise.
Role RequiredRole(absl::string_view method);

// The parsed tokens file.
class TokenTable {
 public:
  // Parses the file format above; `source` names the file in errors, which
  // give the line number ("tokens.txt:3: unknown role 'root'"). Refused:
  // fewer than 3 fields, an unknown or repeated option or a bad value of
  // one, an unknown role, a name that is not
  // [A-Za-z0-9_.@-]{1,64}, a token shorter than 16 or longer than 512
  // characters or with characters outside printable ASCII, a repeated token
  // or name, and a file without any token.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text,
                                          absl::string_view source);
  // Reads and parses `path`; an unreadable file is an error naming it.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The caller holding `token`, or nullopt. Compares against every entry in
  // time independent of where (or whether) the token matches.
  std::optional<Caller> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

  // Each name's share= and max_groups= (defaults where not given).
  absl::flat_hash_map<std::string, OwnerPolicy> OwnerPolicies() const;

 private:
  struct Entry {
    std::string token;
    Caller caller;
    OwnerPolicy policy;
  };
  // One KEY=VALUE field of `entry`'s line into it.
  static absl::Status ParseOption(absl::string_view field, Entry& entry);
  std::vector<Entry> entries_;
};

// True when `a` and `b` are equal, in time that depends only on the
// lengths (for comparing secrets).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token in a call's metadata ("authorization: Bearer TOKEN"), or "".
std::string BearerToken(const grpc::ServerContext& context);

// Largest metrics token file LoadMetricsToken reads.
inline constexpr size_t kMaxMetricsTokenFileBytes = 4096;

// Reads the metrics endpoint's token from `path` (--metrics_token_file):
// the file's contents with surrounding whitespace removed. Refused, with a
// message naming the file: an unreadable file, one over
// kMaxMetricsTokenFileBytes, and a token shorter than 16 characters or
// with characters outside printable ASCII (control characters, spaces,
// non-ASCII bytes).
absl::StatusOr<std::string> LoadMetricsToken(const std::string& path);

// The metrics endpoint's HTTP Basic auth check (prometheus::Exposer::
// RegisterAuth): true when `password` equals `token`, compared in time
// that does not depend on where they differ; the user name is not checked
// (docs suggest "prometheus"). Thread-safe: scrape threads call it at once.
std::function<bool(const std::string& user, const std::string& password)>
MetricsPasswordCheck(std::string token);

class Authorizer {
 public:
  // Checks every call against `tokens`.
  explicit Authorizer(TokenTable tokens);
  // Checks nothing.
  Authorizer() = default;

  Authorizer(const Authorizer&) = delete;
  Authorizer& operator=(const Authorizer&) = delete;

  bool enabled() const { return tokens_.has_value(); }

  // The caller of an RPC named `method`, from its bearer token.
  // UNAUTHENTICATED without a token or with an unknown one;
  // PERMISSION_DENIED when the token's role is below RequiredRole(method).
  // Both carry ERROR_REASON_PERMISSION. Without a table: an admin named "".
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context,
                                      absl::string_view method) const;

 private:
  const std::optional<TokenTable> tokens_;
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_AUTH_H_
