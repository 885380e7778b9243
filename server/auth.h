// Bearer-token authentication and roles for the master's RPCs
// (docs/security.md).
//
// The master reads a tokens file (--tokens_file), one token a line:
//
//   # ROLE   NAME    TOKEN
//   admin    alice   3f9c...   (submit, cancel, delete, studies)
//   worker   rack1   a81b...   (register groups, push, pull, data units)
//   reader   grafana 77de...   (status, list, watch)
//
// Roles nest: admin may do everything a worker may, and a worker everything
// a reader may (a validation pool and a worker read job status). Each RPC
// needs one role (RequiredRole); clients send the token as the call
// metadata "authorization: Bearer TOKEN" (common/client_security.h).
//
// A worker group is bound to the NAME of the token that registered it:
// every later call naming that group id must come from a token of the same
// name, so one user's token cannot push into, pull from or end another's
// group even when the group id is guessed.
//
//   MPILEARN_ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load(path));
//   Authorizer auth(std::move(tokens), group_timeout);
//   absl::StatusOr<Caller> caller = auth.Authenticate(context, "SubmitJob");
//
// An Authorizer without a table (default-constructed) checks nothing: every
// caller is an admin and groups are not bound (the master's default on
// loopback).
//
// Threading: TokenTable is immutable after Load. Authorizer is thread-safe:
// its group bindings sit behind a mutex; RPC threads call it concurrently.
#ifndef MPILEARN_SERVER_AUTH_H_
#define MPILEARN_SERVER_AUTH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace mpilearn::server {

// Ordered: a role may make every call a lower one may.
enum class Role { kReader = 1, kWorker = 2, kAdmin = 3 };

// "admin", "worker", "reader".
absl::string_view RoleName(Role role);

// The role `method` (the RPC's short name, "SubmitJob", "GetStudy") needs.
// A method the table does not know needs admin, so a new RPC is closed
// until someone decides otherwise.
Role RequiredRole(absl::string_view method);

// Who made a call: the token's name and role.
struct Caller {
  std::string name;
  Role role = Role::kAdmin;
};

// The parsed tokens file.
class TokenTable {
 public:
  // Parses the file format above; `source` names the file in errors, which
  // give the line number ("tokens.txt:3: unknown role 'root'"). Refused:
  // fewer than 3 or more than 3 fields, an unknown role, a name that is not
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

 private:
  struct Entry {
    std::string token;
    Caller caller;
  };
  std::vector<Entry> entries_;
};

// True when `a` and `b` are equal, in time that depends only on the
// lengths (for comparing secrets).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token in a call's metadata ("authorization: Bearer TOKEN"), or "".
std::string BearerToken(const grpc::ServerContext& context);

class Authorizer {
 public:
  // Most groups bound at once: a registration beyond it (after dropping
  // bindings idle for 2 x group_timeout) is refused with RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxBoundGroups = 1 << 18;

  // Checks every call against `tokens`. `group_timeout` is the master's
  // --group_timeout_s: a binding idle for twice that (the core declared its
  // group lost long ago) is dropped.
  Authorizer(TokenTable tokens, absl::Duration group_timeout);
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

  // Binds a group RegisterGroup just created to `caller`. RESOURCE_EXHAUSTED
  // (ERROR_REASON_LIMIT) when kMaxBoundGroups are bound. No-op when
  // disabled.
  absl::Status BindGroup(const std::string& group_id, const Caller& caller);
  // OK when `caller` registered `group_id` (and refreshes the binding);
  // PERMISSION_DENIED (ERROR_REASON_PERMISSION) when another token's name
  // did; GROUP_UNKNOWN when no token did (a group from before a master
  // restart or one long lost: register again). Always OK when disabled.
  absl::Status CheckGroup(absl::string_view group_id, const Caller& caller);
  // Forgets `group_id` (it left). No-op when unknown or disabled.
  void UnbindGroup(absl::string_view group_id);

  size_t bound_groups() const;

 private:
  struct Binding {
    std::string name;
    absl::Time last_used;
  };
  // Drops bindings idle for longer than 2 x group_timeout_.
  void DropIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::optional<TokenTable> tokens_;
  const absl::Duration group_timeout_ = absl::Seconds(60);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Binding> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_AUTH_H_
