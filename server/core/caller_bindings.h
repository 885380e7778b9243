// Who calls the master (Caller: a token's name and role) and what each
// caller owns (CallerBindings): the worker groups it registered and the
// snapshot streams it has open (docs/security.md, "Groups belong to their
// token" and "Validation reports belong to a subscription or a group").
// The transport turns a call's token into a Caller (server/auth.h); the
// core passes it to CallerBindings on every call that names a group or
// reports a validation.
//
//   CallerBindings bindings(/*enabled=*/true, group_timeout, clock);
//   MPILEARN_RETURN_IF_ERROR(bindings.BindGroup("g-1", "job-1", caller));
//   MPILEARN_RETURN_IF_ERROR(bindings.CheckGroup("g-1", caller));
//   CallerBindings::Subscription open = bindings.RecordSubscription(caller,
//   ids); MPILEARN_RETURN_IF_ERROR(bindings.CheckValidation("job-1", caller));
//
// Disabled (a master without tokens, and the worker's --local mode), it
// binds nothing and every check passes.
//
// Errors: PERMISSION_DENIED with ERROR_REASON_PERMISSION, GROUP_UNKNOWN for
// a group no caller registered, LIMIT when kMaxBoundGroups are bound.
//
// Threading: thread-safe; one mutex (a leaf: nothing is called under it
// but the clock) guards the bindings and subscriptions.
#ifndef MPILEARN_SERVER_CORE_CALLER_BINDINGS_H_
#define MPILEARN_SERVER_CORE_CALLER_BINDINGS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mpilearn::server {

// Ordered: a role may make every call a lower one may. An owner submits
// jobs and studies and manages its own; an admin manages everyone's.
enum class Role { kReader = 1, kWorker = 2, kOwner = 3, kAdmin = 4 };

// "admin", "owner", "worker", "reader".
absl::string_view RoleName(Role role);

// Who made a call: the token's name, role and scope. Without tokens: an
// admin named "".
struct Caller {
  std::string name;
  Role role = Role::kAdmin;
  // owners= in the tokens file: the job owners whose jobs this token may
  // train and whose weights it may read. Empty: a worker's any owner's, an
  // owner's only its own (it always may its own).
  std::vector<std::string> owners;
  // max_priority= in the tokens file: the highest JobSpec.priority this
  // token may submit (admins: any).
  int max_priority = 0;
};

// PERMISSION_DENIED with ERROR_REASON_PERMISSION.
absl::Status PermissionError(absl::string_view message);

// The ownership rules (docs/security.md, "Owners"). Each refusal is
// PERMISSION_DENIED naming its rule.
//
// Rule "owners manage their own": cancelling or deleting a job, and
// changing a study (cancel, cancel a trial, ask, tell), takes the owner's
// token or an admin's. `what` names the thing ("job job-000003").
absl::Status CheckManages(const Caller& caller, const std::string& owner,
                          absl::string_view what);
// Rule "tokens train the owners they serve": whether `caller` may train a
// job of `owner`, or read its weights (snapshots, pulls): an admin any; an
// owner its own and those of owners=; a worker those of owners=, any when
// the tokens file gives none.
bool MayTrain(const Caller& caller, const std::string& owner);
absl::Status CheckTrains(const Caller& caller, const std::string& owner,
                         absl::string_view what);
// Whether `caller` may train some owners' jobs only (an owner, or a
// worker with owners=).
bool Scoped(const Caller& caller);
// Rule "jobs belong to their submitter": a submitted spec's owner and
// priority. Fills `owner` (empty: the caller's name); only an admin names
// another owner or a priority above its max_priority.
absl::Status CheckSubmission(const Caller& caller, std::string* owner,
                             int priority, absl::string_view what);

class CallerBindings {
 public:
  // Most groups bound at once: a registration beyond it (after dropping
  // bindings idle for 2 x group_timeout) is refused with RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxBoundGroups = 1 << 18;

  // `group_timeout` is the master's --group_timeout_s: a binding idle for
  // twice that (the core declared its group lost long ago) is dropped.
  // `clock` is the core's.
  CallerBindings(bool enabled, absl::Duration group_timeout,
                 std::function<absl::Time()> clock);

  CallerBindings(const CallerBindings&) = delete;
  CallerBindings& operator=(const CallerBindings&) = delete;

  bool enabled() const { return enabled_; }

  // Binds a group RegisterGroup just created for `job_id` to `caller`.
  // RESOURCE_EXHAUSTED (ERROR_REASON_LIMIT) when kMaxBoundGroups are bound.
  absl::Status BindGroup(const std::string& group_id, const std::string& job_id,
                         const Caller& caller);
  // OK when `caller` registered `group_id` (and refreshes the binding);
  // PERMISSION_DENIED when another token's name did, an admin's included;
  // GROUP_UNKNOWN when no token did (a group from before a master restart
  // or one long lost: register again).
  absl::Status CheckGroup(absl::string_view group_id, const Caller& caller);
  // Forgets `group_id` (it left). No-op when unknown.
  void UnbindGroup(absl::string_view group_id);

  size_t bound_groups() const;

  // One open SubscribeSnapshots stream, recorded under its caller's name
  // until destroyed (the stream ended). Movable; a default-constructed one
  // records nothing. Must not outlive its CallerBindings.
  class Subscription {
   public:
    Subscription() = default;
    Subscription(Subscription&& other) noexcept;
    Subscription& operator=(Subscription&& other) noexcept;
    ~Subscription();

   private:
    friend class CallerBindings;
    void Release();

    CallerBindings* bindings_ = nullptr;  // null: records nothing
    std::string name_;
    // Distinct job ids; empty follows every job.
    std::vector<std::string> job_ids_;
  };

  // Records that `caller` follows `job_ids` (empty: every job) while the
  // returned Subscription lives. The core bounds how many are alive
  // (--max_subscriptions) and which job ids they name (jobs it holds), so
  // the records are bounded too.
  Subscription RecordSubscription(const Caller& caller,
                                  const std::vector<std::string>& job_ids);

  // OK when `caller` may report a validation of `job_id`: its name has an
  // open subscription following the job (or every job), or owns a live
  // group registered for it (bound, and used within 2 x group_timeout), or
  // its role is admin. Otherwise PERMISSION_DENIED saying what would allow
  // it. One lock and a few hash lookups.
  absl::Status CheckValidation(absl::string_view job_id,
                               const Caller& caller) const;

  // Names with an open subscription (for tests).
  size_t subscribed_names() const;

 private:
  struct Binding {
    std::string name;
    std::string job_id;
    absl::Time last_used;
  };
  // The open subscriptions of one name: how many follow every job, and how
  // many follow each job they name. Entries at zero are erased.
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

  const bool enabled_;
  const absl::Duration group_timeout_;
  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Binding> groups_ ABSL_GUARDED_BY(mu_);
  // The same bindings by owner: name -> job id -> group ids. Holds exactly
  // the groups in groups_.
  absl::flat_hash_map<
      std::string,
      absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>>
      owned_ ABSL_GUARDED_BY(mu_);
  // Open subscriptions by name; names with none are erased.
  absl::flat_hash_map<std::string, Following> following_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mpilearn::server

#endif  // MPILEARN_SERVER_CORE_CALLER_BINDINGS_H_
