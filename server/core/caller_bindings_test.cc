#include "server/core/caller_bindings.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/error_reason.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

class CallerBindingsTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  CallerBindings bindings_{/*enabled=*/true, absl::Seconds(60),
                           [this] { return now_; }};
};

TEST(CallerBindingsOffTest, DisabledBindsNothingAndAllowsEverything) {
  CallerBindings open(/*enabled=*/false, absl::Seconds(60),
                      [] { return absl::UnixEpoch(); });
  EXPECT_FALSE(open.enabled());
  const Caller admin;
  EXPECT_TRUE(open.CheckGroup("g-1", admin).ok());
  EXPECT_TRUE(open.BindGroup("g-1", "job-1", admin).ok());
  EXPECT_TRUE(open.CheckValidation("job-1", admin).ok());
  EXPECT_TRUE(open.CheckValidation("job-1", Caller{"x", Role::kWorker}).ok());
  { CallerBindings::Subscription none = open.RecordSubscription(admin, {}); }
  EXPECT_EQ(open.subscribed_names(), 0u);
  EXPECT_EQ(open.bound_groups(), 0u);
}

TEST(RoleNameTest, NamesEveryRole) {
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
  EXPECT_EQ(RoleName(Role::kOwner), "owner");
  EXPECT_EQ(RoleName(Role::kWorker), "worker");
  EXPECT_EQ(RoleName(Role::kReader), "reader");
}

Caller Token(const std::string& name, Role role, std::vector<std::string> owners = {},
             int max_priority = 0) {
  Caller caller;
  caller.name = name;
  caller.role = role;
  caller.owners = std::move(owners);
  caller.max_priority = max_priority;
  return caller;
}

// A refusal is PERMISSION_DENIED with the reason and the rule's name.
void ExpectRefused(const absl::Status& status, const std::string& rule) {
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
  EXPECT_NE(status.message().find(rule), std::string::npos) << status;
}

TEST(OwnershipTest, OwnersManageTheirOwnAndAdminsAny) {
  const Caller alice = Token("alice", Role::kOwner);
  EXPECT_TRUE(CheckManages(alice, "alice", "job job-1").ok());
  ExpectRefused(CheckManages(alice, "bob", "job job-1"), "owners manage their own");
  // A job from before owners were kept belongs to nobody: admins only.
  ExpectRefused(CheckManages(alice, "", "job job-1"), "has no owner");
  ExpectRefused(CheckManages(Token("", Role::kOwner), "", "job job-1"), "owners manage");
  EXPECT_TRUE(CheckManages(Token("ops", Role::kAdmin), "bob", "job job-1").ok());
  // Without tokens every caller is an admin named "".
  EXPECT_TRUE(CheckManages(Caller{}, "bob", "job job-1").ok());
  ExpectRefused(CheckManages(Token("rack", Role::kWorker), "rack", "job job-1"),
                "owners manage their own");
}

TEST(OwnershipTest, TokensTrainTheOwnersTheyServe) {
  const Caller any_worker = Token("rack", Role::kWorker);
  const Caller alice_worker = Token("rack", Role::kWorker, {"alice"});
  const Caller alice = Token("alice", Role::kOwner);
  const Caller alice_helping_bob = Token("alice", Role::kOwner, {"bob"});
  EXPECT_FALSE(Scoped(any_worker));
  EXPECT_TRUE(Scoped(alice_worker));
  EXPECT_TRUE(Scoped(alice));
  EXPECT_FALSE(Scoped(Token("ops", Role::kAdmin, {"alice"})));
  EXPECT_TRUE(MayTrain(any_worker, "bob"));
  EXPECT_TRUE(MayTrain(any_worker, ""));
  EXPECT_TRUE(MayTrain(alice_worker, "alice"));
  EXPECT_FALSE(MayTrain(alice_worker, "bob"));
  EXPECT_FALSE(MayTrain(alice_worker, ""));
  EXPECT_TRUE(MayTrain(alice, "alice"));
  EXPECT_FALSE(MayTrain(alice, "bob"));
  EXPECT_TRUE(MayTrain(alice_helping_bob, "bob"));
  EXPECT_TRUE(MayTrain(Token("ops", Role::kAdmin), "bob"));
  ExpectRefused(CheckTrains(alice_worker, "bob", "job job-7"),
                "tokens train the owners they serve");
  const absl::Status refused = CheckTrains(alice_helping_bob, "carol", "job job-7");
  EXPECT_NE(refused.message().find("only the jobs of 'alice', 'bob'"), std::string::npos)
      << refused;
}

TEST(OwnershipTest, JobsBelongToTheirSubmitter) {
  const Caller alice = Token("alice", Role::kOwner, {}, /*max_priority=*/5);
  std::string owner;
  EXPECT_TRUE(CheckSubmission(alice, &owner, 5, "SubmitJob").ok());
  EXPECT_EQ(owner, "alice");
  owner = "alice";
  EXPECT_TRUE(CheckSubmission(alice, &owner, -100, "SubmitJob").ok());
  owner = "bob";
  ExpectRefused(CheckSubmission(alice, &owner, 0, "SubmitJob"), "jobs belong to their submitter");
  owner = "";
  ExpectRefused(CheckSubmission(alice, &owner, 6, "SubmitJob"), "max_priority 5");
  // An admin submits for anyone, at any priority.
  owner = "bob";
  EXPECT_TRUE(CheckSubmission(Token("ops", Role::kAdmin), &owner, 100, "SubmitJob").ok());
  EXPECT_EQ(owner, "bob");
  owner = "";
  EXPECT_TRUE(CheckSubmission(Token("ops", Role::kAdmin), &owner, 0, "SubmitJob").ok());
  EXPECT_EQ(owner, "ops");
}

TEST_F(CallerBindingsTest, GroupsBelongToTheTokenThatRegisteredThem) {
  const Caller rack1{"rack1", Role::kWorker};
  const Caller rack2{"rack2", Role::kWorker};
  const Caller alice{"alice", Role::kAdmin};
  ASSERT_TRUE(bindings_.BindGroup("g-1", "job-1", rack1).ok());
  EXPECT_TRUE(bindings_.CheckGroup("g-1", rack1).ok());
  const absl::Status other = bindings_.CheckGroup("g-1", rack2);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReasonOf(other), v1::ERROR_REASON_PERMISSION);
  // Not even an admin acts for another token's group.
  EXPECT_EQ(bindings_.CheckGroup("g-1", alice).code(),
            absl::StatusCode::kPermissionDenied);
  // A group no token registered is unknown (register again).
  EXPECT_EQ(ReasonOf(bindings_.CheckGroup("g-2", rack1)),
            v1::ERROR_REASON_GROUP_UNKNOWN);
  bindings_.UnbindGroup("g-1");
  EXPECT_EQ(bindings_.bound_groups(), 0u);
  EXPECT_EQ(ReasonOf(bindings_.CheckGroup("g-1", rack1)),
            v1::ERROR_REASON_GROUP_UNKNOWN);
}

void ExpectValidationDenied(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_PERMISSION);
  EXPECT_NE(status.message().find("SubscribeSnapshots"), std::string::npos)
      << status;
}

TEST_F(CallerBindingsTest, ValidationsNeedASubscriptionToTheJob) {
  const Caller rack1{"rack1", Role::kWorker};
  const Caller rack2{"rack2", Role::kWorker};
  const Caller alice{"alice", Role::kAdmin};
  ExpectValidationDenied(bindings_.CheckValidation("job-1", rack1));
  // Admins may report for any job.
  EXPECT_TRUE(bindings_.CheckValidation("job-1", alice).ok());
  {
    // A stream following job-1 (named twice) and job-2.
    CallerBindings::Subscription stream =
        bindings_.RecordSubscription(rack1, {"job-1", "job-2", "job-1"});
    EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());
    EXPECT_TRUE(bindings_.CheckValidation("job-2", rack1).ok());
    ExpectValidationDenied(bindings_.CheckValidation("job-3", rack1));
    // Another token name does not inherit it.
    ExpectValidationDenied(bindings_.CheckValidation("job-1", rack2));
    {
      // A second stream of the same name on job-1: closing it keeps the
      // first one's right.
      CallerBindings::Subscription second =
          bindings_.RecordSubscription(rack1, {"job-1"});
      EXPECT_EQ(bindings_.subscribed_names(), 1u);
    }
    EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());
    // Moving a subscription moves the record, not a copy of it.
    CallerBindings::Subscription moved = std::move(stream);
    EXPECT_TRUE(bindings_.CheckValidation("job-2", rack1).ok());
  }
  ExpectValidationDenied(bindings_.CheckValidation("job-1", rack1));
  EXPECT_EQ(bindings_.subscribed_names(), 0u);

  // An empty job list follows every job.
  {
    CallerBindings::Subscription all = bindings_.RecordSubscription(rack2, {});
    EXPECT_TRUE(bindings_.CheckValidation("job-1", rack2).ok());
    EXPECT_TRUE(bindings_.CheckValidation("job-99", rack2).ok());
    ExpectValidationDenied(bindings_.CheckValidation("job-1", rack1));
  }
  ExpectValidationDenied(bindings_.CheckValidation("job-99", rack2));
  EXPECT_EQ(bindings_.subscribed_names(), 0u);
}

TEST_F(CallerBindingsTest, AGroupsTokenReportsValidationsOfItsJob) {
  const Caller rack1{"rack1", Role::kWorker};
  const Caller rack2{"rack2", Role::kWorker};
  ASSERT_TRUE(bindings_.BindGroup("g-1", "job-1", rack1).ok());
  ASSERT_TRUE(bindings_.BindGroup("g-2", "job-1", rack1).ok());
  EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());
  ExpectValidationDenied(bindings_.CheckValidation("job-2", rack1));
  ExpectValidationDenied(bindings_.CheckValidation("job-1", rack2));
  bindings_.UnbindGroup("g-1");
  EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());  // g-2 remains
  bindings_.UnbindGroup("g-2");
  ExpectValidationDenied(bindings_.CheckValidation("job-1", rack1));
}

TEST_F(CallerBindingsTest, AnIdleGroupNoLongerAllowsValidations) {
  // Bindings idle for more than 2 x the group timeout (60 s) are not live.
  const Caller rack1{"rack1", Role::kWorker};
  ASSERT_TRUE(bindings_.BindGroup("g-1", "job-1", rack1).ok());
  now_ += absl::Seconds(119);
  EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());
  now_ += absl::Seconds(2);
  ExpectValidationDenied(bindings_.CheckValidation("job-1", rack1));
  // Using the group makes it live again; the core's clock is the judge.
  ASSERT_TRUE(bindings_.CheckGroup("g-1", rack1).ok());
  EXPECT_TRUE(bindings_.CheckValidation("job-1", rack1).ok());
}

}  // namespace
}  // namespace mpilearn::server
