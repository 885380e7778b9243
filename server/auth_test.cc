#include "server/auth.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/error_reason.h"
#include "grpcpp/test/server_context_test_spouse.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

constexpr char kTokens[] =
    "# role name token\n"
    "admin  alice  aaaaaaaaaaaaaaaaaaaa\n"
    "\n"
    "worker rack1  wwwwwwwwwwwwwwwwwwww   # the first rack\n"
    "worker rack2  xxxxxxxxxxxxxxxxxxxx\n"
    "reader dash   rrrrrrrrrrrrrrrrrrrr\n";

TokenTable Table() {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(kTokens, "tokens");
  EXPECT_TRUE(table.ok()) << table.status();
  return *std::move(table);
}

TEST(TokenTableTest, ParsesRolesAndNamesSkippingComments) {
  const TokenTable table = Table();
  EXPECT_EQ(table.size(), 4u);
  std::optional<Caller> alice = table.Find("aaaaaaaaaaaaaaaaaaaa");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kAdmin);
  std::optional<Caller> rack1 = table.Find("wwwwwwwwwwwwwwwwwwww");
  ASSERT_TRUE(rack1.has_value());
  EXPECT_EQ(rack1->name, "rack1");
  EXPECT_EQ(rack1->role, Role::kWorker);
  EXPECT_EQ(table.Find("rrrrrrrrrrrrrrrrrrrr")->role, Role::kReader);
  // A prefix, an extension and a different token of the same length.
  EXPECT_FALSE(table.Find("aaaaaaaaaaaaaaaaaaa").has_value());
  EXPECT_FALSE(table.Find("aaaaaaaaaaaaaaaaaaaaa").has_value());
  EXPECT_FALSE(table.Find("aaaaaaaaaaaaaaaaaaab").has_value());
  EXPECT_FALSE(table.Find("").has_value());
}

TEST(TokenTableTest, RefusesBadLinesWithTheirNumber) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"admin alice\n", "f:1: want 'ROLE NAME TOKEN [KEY=VALUE...]', got 2"},
      {"# c\nroot alice aaaaaaaaaaaaaaaaaaaa\n", "f:2: unknown role 'root'"},
      {"admin al/ice aaaaaaaaaaaaaaaaaaaa\n", "f:1: bad name 'al/ice'"},
      {"admin alice short\n", "f:1: the token of 'alice' has 5 characters"},
      {"admin alice aaaaaaaaaaaaaaaaaaaa\nworker alice bbbbbbbbbbbbbbbbbbbb\n",
       "f:2: name 'alice' given twice"},
      {"admin alice aaaaaaaaaaaaaaaaaaaa\nworker bob aaaaaaaaaaaaaaaaaaaa\n",
       "f:2: the token of 'bob' is also another name's token"},
      {"admin alice aaaaaaaaaaaaaaaaaaaa extra\n", "f:1: unknown option 'extra' of 'alice'"},
      {"owner alice aaaaaaaaaaaaaaaaaaaa share=0\n", "f:1: the share= of 'alice' is '0'"},
      {"owner alice aaaaaaaaaaaaaaaaaaaa share=x\n", "f:1: the share= of 'alice' is 'x'"},
      {"owner alice aaaaaaaaaaaaaaaaaaaa max_groups=0\n", "f:1: the max_groups= of 'alice'"},
      {"owner alice aaaaaaaaaaaaaaaaaaaa max_priority=101\n",
       "want a whole number from -100 to 100"},
      {"worker w aaaaaaaaaaaaaaaaaaaa owners=al/ice\n", "f:1: the owners= of 'w' is 'al/ice'"},
      {"worker w aaaaaaaaaaaaaaaaaaaa owners=a owners=b\n", "want it once"},
      {"worker w aaaaaaaaaaaaaaaaaaaa owners=\n", "f:1: the owners= of 'w' is ''"},
      {"# only comments\n\n", "f: no tokens"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text, "f");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.expected), std::string::npos)
        << table.status() << " does not contain " << c.expected;
  }
}

TEST(TokenTableTest, LoadNamesAnUnreadableFile) {
  absl::StatusOr<TokenTable> table = TokenTable::Load("/nonexistent/tokens");
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("/nonexistent/tokens"),
            std::string::npos);
}

TEST(ConstantTimeEqualsTest, EqualOnlyForEqualStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcabc"));  // cycled b
  EXPECT_FALSE(ConstantTimeEquals("abcabc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
}

TEST(TokenTableTest, OptionsGiveScopeSharesAndLimits) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(
      "owner alice aaaaaaaaaaaaaaaaaaaa share=2.5 max_groups=3 max_priority=10\n"
      "worker rack bbbbbbbbbbbbbbbbbbbb owners=alice,bob\n"
      "owner bob cccccccccccccccccccc\n",
      "f");
  ASSERT_TRUE(table.ok()) << table.status();
  const std::optional<Caller> alice = table->Find("aaaaaaaaaaaaaaaaaaaa");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->role, Role::kOwner);
  EXPECT_EQ(alice->max_priority, 10);
  EXPECT_TRUE(alice->owners.empty());
  const std::optional<Caller> rack = table->Find("bbbbbbbbbbbbbbbbbbbb");
  ASSERT_TRUE(rack.has_value());
  EXPECT_EQ(rack->owners, (std::vector<std::string>{"alice", "bob"}));
  EXPECT_EQ(rack->max_priority, 0);
  const auto policies = table->OwnerPolicies();
  EXPECT_EQ(policies.at("alice").share, 2.5);
  EXPECT_EQ(policies.at("alice").max_groups, 3);
  EXPECT_EQ(policies.at("bob").share, 1.0);
  EXPECT_EQ(policies.at("bob").max_groups, 0);
}

TEST(RequiredRoleTest, RolesPerMethod) {
  EXPECT_EQ(RequiredRole("SubmitJob"), Role::kOwner);
  EXPECT_EQ(RequiredRole("CancelJob"), Role::kOwner);
  EXPECT_EQ(RequiredRole("CreateStudy"), Role::kOwner);
  EXPECT_EQ(RequiredRole("TellTrial"), Role::kOwner);
  EXPECT_EQ(RequiredRole("ShardSync"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("GetServerInfo"), Role::kReader);
  EXPECT_EQ(RequiredRole("PushGradient"), Role::kWorker);
  EXPECT_EQ(RequiredRole("ReportValidation"), Role::kWorker);
  EXPECT_EQ(RequiredRole("ListJobs"), Role::kReader);
  EXPECT_EQ(RequiredRole("WatchStudy"), Role::kReader);
  // Unknown methods are closed to all but admins.
  EXPECT_EQ(RequiredRole("SomeFutureCall"), Role::kAdmin);
}

// Authenticate on a server context whose client sent `authorization`.
absl::StatusOr<Caller> Call(const Authorizer& auth, const std::string& method,
                            const std::string& authorization) {
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (!authorization.empty()) {
    spouse.AddClientMetadata("authorization", authorization);
  }
  return auth.Authenticate(context, method);
}

TEST(AuthorizerTest, ChecksTokenAndRole) {
  Authorizer auth(Table());
  absl::StatusOr<Caller> none = Call(auth, "ListJobs", "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ReasonOf(none.status()), v1::ERROR_REASON_PERMISSION);
  EXPECT_EQ(Call(auth, "ListJobs", "Bearer nottherightonenottheright")
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  // Not a bearer token.
  EXPECT_EQ(Call(auth, "ListJobs", "Basic rrrrrrrrrrrrrrrrrrrr").status().code(),
            absl::StatusCode::kUnauthenticated);

  absl::StatusOr<Caller> reader =
      Call(auth, "SubmitJob", "Bearer rrrrrrrrrrrrrrrrrrrr");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReasonOf(reader.status()), v1::ERROR_REASON_PERMISSION);
  EXPECT_EQ(Call(auth, "PushGradient", "Bearer rrrrrrrrrrrrrrrrrrrr")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Call(auth, "SubmitJob", "Bearer wwwwwwwwwwwwwwwwwwww")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);

  // Roles nest: admin > worker > reader.
  EXPECT_TRUE(Call(auth, "ListJobs", "Bearer rrrrrrrrrrrrrrrrrrrr").ok());
  EXPECT_TRUE(Call(auth, "ListJobs", "Bearer wwwwwwwwwwwwwwwwwwww").ok());
  EXPECT_TRUE(Call(auth, "PushGradient", "Bearer aaaaaaaaaaaaaaaaaaaa").ok());
  absl::StatusOr<Caller> admin =
      Call(auth, "SubmitJob", "Bearer aaaaaaaaaaaaaaaaaaaa");
  ASSERT_TRUE(admin.ok());
  EXPECT_EQ(admin->name, "alice");
}

TEST(AuthorizerTest, WithoutTokensEveryoneIsAnAdmin) {
  Authorizer open;
  EXPECT_FALSE(open.enabled());
  absl::StatusOr<Caller> caller = Call(open, "SubmitJob", "");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->role, Role::kAdmin);
  EXPECT_EQ(caller->name, "");
}

std::string WriteTempFile(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return path;
}

TEST(MetricsTokenTest, LoadsOneTokenAndRefusesBadFiles) {
  absl::StatusOr<std::string> token = LoadMetricsToken(
      WriteTempFile("good", "  0123456789abcdef0123456789abcdef\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef0123456789abcdef");

  struct Case {
    std::string name;
    std::string text;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"empty", "\n", "holds a token of 0 characters"},
      {"short", "abc\n", "holds a token of 3 characters"},
      {"control", "0123456789abcdef\x01\n", "outside printable ASCII"},
      {"two-lines", "0123456789abcdef\n0123456789abcdef\n",
       "outside printable ASCII"},
      {"space", "0123456789 abcdef\n", "outside printable ASCII"},
      {"large", std::string(kMaxMetricsTokenFileBytes + 1, 'a'),
       "larger than 4096 bytes"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteTempFile(c.name, c.text);
    absl::StatusOr<std::string> bad = LoadMetricsToken(path);
    ASSERT_FALSE(bad.ok()) << c.name;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(c.expected), std::string::npos)
        << bad.status();
    EXPECT_NE(bad.status().message().find(path), std::string::npos)
        << bad.status();
  }
  // Exactly the limit is fine.
  EXPECT_TRUE(LoadMetricsToken(WriteTempFile(
                  "limit", std::string(kMaxMetricsTokenFileBytes, 'a')))
                  .ok());
  absl::StatusOr<std::string> missing = LoadMetricsToken("/nonexistent/token");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/token"),
            std::string::npos);
}

TEST(MetricsTokenTest, PasswordCheckWantsTheTokenWithAnyUser) {
  const auto check = MetricsPasswordCheck("0123456789abcdef");
  EXPECT_TRUE(check("prometheus", "0123456789abcdef"));
  EXPECT_TRUE(check("", "0123456789abcdef"));
  EXPECT_FALSE(check("prometheus", "0123456789abcdeg"));
  EXPECT_FALSE(check("prometheus", "0123456789abcdef0"));
  EXPECT_FALSE(check("prometheus", ""));
  EXPECT_FALSE(check("0123456789abcdef", ""));
}

}  // namespace
}  // namespace mpilearn::server
