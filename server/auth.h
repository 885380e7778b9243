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
// metadata "authorization: Bearer TOKEN" (common/client/client_security.h).
//
// A worker group is bound to the NAME of the token that registered it:
// every later call naming that group id must come from a token of the same
// name, so one user's token cannot push into, pull from or end another's
// group even when the group id is guessed.
//
// Validation reports are bound to jobs the same way: a SubscribeSnapshots
// stream is recorded under its token's name while it is open
// (RecordSubscription), and ReportValidation for job J is allowed only to
// a token name that follows J with an open stream (or follows every job)
// or owns a live group registered for J (CheckValidation). A worker token
// that merely knows a job id cannot complete it by a stop rule's target.
//
// The metrics endpoint has a token of its own (--metrics_token_file,
// LoadMetricsToken), checked as the password of HTTP Basic auth
// (MetricsPasswordCheck): Prometheus' scrape configs send it with
// basic_auth.password_file.
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
// its group bindings and subscriptions sit behind one mutex; RPC threads
// call it concurrently.
#ifndef MPILEARN_SERVER_AUTH_H_
#define MPILEARN_SERVER_AUTH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

  // Binds a group RegisterGroup just created for `job_id` to `caller`.
  // RESOURCE_EXHAUSTED (ERROR_REASON_LIMIT) when kMaxBoundGroups are bound.
  // No-op when disabled.
  absl::Status BindGroup(const std::string& group_id, const std::string& job_id,
                         const Caller& caller);
  // OK when `caller` registered `group_id` (and refreshes the binding);
  // PERMISSION_DENIED (ERROR_REASON_PERMISSION) when another token's name
  // did; GROUP_UNKNOWN when no token did (a group from before a master
  // restart or one long lost: register again). Always OK when disabled.
  absl::Status CheckGroup(absl::string_view group_id, const Caller& caller);
  // Forgets `group_id` (it left). No-op when unknown or disabled.
  void UnbindGroup(absl::string_view group_id);

  size_t bound_groups() const;

  // One open SubscribeSnapshots stream, recorded under its token's name
  // until destroyed (the stream ended). Movable; a default-constructed one
  // records nothing. Must not outlive its Authorizer.
  class Subscription {
   public:
    Subscription() = default;
    Subscription(Subscription&& other) noexcept;
    Subscription& operator=(Subscription&& other) noexcept;
    ~Subscription();

   private:
    friend class Authorizer;
    void Release();

    Authorizer* auth_ = nullptr;  // null: records nothing
    std::string name_;
    // Distinct job ids; empty follows every job.
    std::vector<std::string> job_ids_;
  };

  // Records that `caller`'s token follows `job_ids` (empty: every job) while
  // the returned Subscription lives. Records nothing when disabled. The
  // caller bounds how many are alive (the core's --max_subscriptions) and
  // which job ids they name (jobs the master holds), so the records are
  // bounded too.
  Subscription RecordSubscription(const Caller& caller,
                                  const std::vector<std::string>& job_ids);

  // OK when `caller` may report a validation of `job_id`: its token name
  // has an open subscription following the job (or every job), or owns a
  // live group registered for it (bound, and used within 2 x
  // group_timeout), or its role is admin. Otherwise PERMISSION_DENIED
  // (ERROR_REASON_PERMISSION) saying what would allow it. Always OK when
  // disabled. One lock and a few hash lookups.
  absl::Status CheckValidation(absl::string_view job_id,
                               const Caller& caller) const;

  // Token names with an open subscription (for tests).
  size_t subscribed_names() const;

 private:
  struct Binding {
    std::string name;
    std::string job_id;
    absl::Time last_used;
  };
  // The open subscriptions of one token name: how many follow every job,
  // and how many follow each job they name. Entries at zero are erased.
  struct Following {
    int all_jobs = 0;
    absl::flat_hash_map<std::string, int> jobs;
  };
  // Drops bindings idle for longer than 2 x group_timeout_.
  void DropIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `group_id`'s binding (at `it`) and its entry in owned_.
  void EraseBindingLocked(
      absl::flat_hash_map<std::string, Binding>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Undoes RecordSubscription (Subscription's destructor).
  void ReleaseSubscription(const std::string& name,
                           const std::vector<std::string>& job_ids);

  const std::optional<TokenTable> tokens_;
  const absl::Duration group_timeout_ = absl::Seconds(60);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Binding> groups_ ABSL_GUARDED_BY(mu_);
  // The same bindings by owner: token name -> job id -> group ids. Holds
  // exactly the groups in groups_.
  absl::flat_hash_map<
      std::string,
      absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>>
      owned_ ABSL_GUARDED_BY(mu_);
  // Open subscriptions by token name; names with none are erased.
  absl::flat_hash_map<std::string, Following> following_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_AUTH_H_
