#include "server/auth.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/error_reason.h"
#include "common/spec/job_spec.h"

namespace mpilearn::server {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 512;
// Error messages quote at most this much of a field of the tokens file.
constexpr size_t kMaxQuoted = 64;

// Whether every character of `token` is printable ASCII other than a space
// (the tokens file's and the metrics token file's rule).
bool TokenCharacters(absl::string_view token) {
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

absl::Status Unauthenticated(absl::string_view message) {
  return WithReason(absl::UnauthenticatedError(message),
                    v1::ERROR_REASON_PERMISSION);
}

std::string Quoted(absl::string_view text) {
  if (text.size() <= kMaxQuoted) return absl::StrCat("'", text, "'");
  return absl::StrCat("'", text.substr(0, kMaxQuoted), "...'");
}

std::optional<Role> ParseRole(absl::string_view name) {
  if (name == "admin") return Role::kAdmin;
  if (name == "owner") return Role::kOwner;
  if (name == "worker") return Role::kWorker;
  if (name == "reader") return Role::kReader;
  return std::nullopt;
}

}  // namespace

Role RequiredRole(absl::string_view method) {
  static const auto* const kRoles =
      new absl::flat_hash_map<absl::string_view, Role>({
          // Master: jobs (an owner changes only its own: CheckManages).
          {"SubmitJob", Role::kOwner},
          {"CancelJob", Role::kOwner},
          {"DeleteJob", Role::kOwner},
          // Master: a parameter shard syncing with its lead.
          {"ShardSync", Role::kAdmin},
          {"ReportSlice", Role::kAdmin},
          // Master: worker groups and validation pools.
          {"RegisterGroup", Role::kWorker},
          {"InitWeights", Role::kWorker},
          {"PushGradient", Role::kWorker},
          {"PullWeights", Role::kWorker},
          {"NextDataUnit", Role::kWorker},
          {"ReportEpoch", Role::kWorker},
          {"Heartbeat", Role::kWorker},
          {"Leave", Role::kWorker},
          {"SubscribeSnapshots", Role::kWorker},
          {"ReportValidation", Role::kWorker},
          // Master: reads.
          {"GetJobStatus", Role::kReader},
          {"ListJobs", Role::kReader},
          {"GetServerInfo", Role::kReader},
          // Studies: changes need an owner (its own studies) or an admin,
          // reads a reader.
          {"CreateStudy", Role::kOwner},
          {"CancelStudy", Role::kOwner},
          {"CancelTrial", Role::kOwner},
          {"AskTrial", Role::kOwner},
          {"TellTrial", Role::kOwner},
          {"GetStudy", Role::kReader},
          {"ListStudies", Role::kReader},
          {"WatchStudy", Role::kReader},
      });
  const auto it = kRoles->find(method);
  return it == kRoles->end() ? Role::kAdmin : it->second;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `a` is compared (against `b` cycled), whatever matches.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  if (b.empty()) return a.empty();
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^
            static_cast<unsigned char>(b[i % b.size()]);
  }
  return diff == 0;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text,
                                             absl::string_view source) {
  TokenTable table;
  absl::flat_hash_set<std::string> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto error = [&](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": ", message));
    };
    if (fields.size() < 3) {
      return error(absl::StrCat("want 'ROLE NAME TOKEN [KEY=VALUE...]', got ",
                                fields.size(), " field(s)"));
    }
    const std::optional<Role> role = ParseRole(fields[0]);
    if (!role.has_value()) {
      return error(absl::StrCat("unknown role ", Quoted(fields[0]),
                                "; roles are admin, owner, worker, reader"));
    }
    if (!IsOwnerName(fields[1])) {
      return error(absl::StrCat("bad name ", Quoted(fields[1]),
                                ": 1 to 64 of A-Z a-z 0-9 _ . @ -"));
    }
    const absl::string_view token = fields[2];
    if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
      return error(absl::StrCat("the token of '", fields[1], "' has ",
                                token.size(), " characters; want ",
                                kMinTokenLength, " to ", kMaxTokenLength,
                                " (e.g. `openssl rand -hex 32`)"));
    }
    if (!TokenCharacters(token)) {
      return error(absl::StrCat("the token of '", fields[1],
                                "' has a character outside printable ASCII"));
    }
    if (!names.insert(std::string(fields[1])).second) {
      return error(absl::StrCat("name '", fields[1], "' given twice"));
    }
    if (table.Find(token).has_value()) {
      return error(absl::StrCat("the token of '", fields[1],
                                "' is also another name's token"));
    }
    Entry entry{std::string(token), Caller{std::string(fields[1]), *role}, OwnerPolicy()};
    for (size_t f = 3; f < fields.size(); ++f) {
      absl::Status option = ParseOption(fields[f], entry);
      if (!option.ok()) return error(option.message());
    }
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": no tokens (want lines 'ROLE NAME TOKEN [KEY=VALUE...]')"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the tokens file '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the tokens file '", path, "'"));
  }
  return Parse(text.str(), path);
}

absl::Status TokenTable::ParseOption(absl::string_view field, Entry& entry) {
  const std::string& name = entry.caller.name;
  const std::pair<absl::string_view, absl::string_view> option =
      absl::StrSplit(field, absl::MaxSplits('=', 1));
  const absl::string_view key = option.first;
  const absl::string_view value = option.second;
  auto bad = [&](absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat("the ", key, "= of '", name, "' is ",
                                                   Quoted(value), "; want ", want));
  };
  if (key == "owners") {
    if (!entry.caller.owners.empty()) return bad("it once");
    for (absl::string_view owner : absl::StrSplit(value, ',')) {
      if (!IsOwnerName(owner)) return bad("names of 1 to 64 of A-Z a-z 0-9 _ . @ -, comma-separated");
      entry.caller.owners.emplace_back(owner);
    }
    return absl::OkStatus();
  }
  if (key == "share") {
    double share = 0;
    if (!absl::SimpleAtod(value, &share) || !(share > 0) || share > 1e6) {
      return bad("a number above 0 and at most 1e6");
    }
    entry.policy.share = share;
    return absl::OkStatus();
  }
  if (key == "max_groups") {
    int groups = 0;
    if (!absl::SimpleAtoi(value, &groups) || groups < 1 || groups > 1000000) {
      return bad("a whole number from 1 to 1000000");
    }
    entry.policy.max_groups = groups;
    return absl::OkStatus();
  }
  if (key == "max_priority") {
    int priority = 0;
    if (!absl::SimpleAtoi(value, &priority) || priority < kMinPriority ||
        priority > kMaxPriority) {
      return bad(absl::StrCat("a whole number from ", kMinPriority, " to ", kMaxPriority));
    }
    entry.caller.max_priority = priority;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown option ", Quoted(field), " of '", name,
      "'; options are owners=NAME,..., share=W, max_groups=N, max_priority=P"));
}

absl::flat_hash_map<std::string, OwnerPolicy> TokenTable::OwnerPolicies() const {
  absl::flat_hash_map<std::string, OwnerPolicy> policies;
  for (const Entry& entry : entries_) policies[entry.caller.name] = entry.policy;
  return policies;
}

std::optional<Caller> TokenTable::Find(absl::string_view token) const {
  std::optional<Caller> found;
  for (const Entry& entry : entries_) {
    // No early exit: every entry costs the same whether it matched or not.
    if (ConstantTimeEquals(token, entry.token)) found = entry.caller;
  }
  return found;
}

std::string BearerToken(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ") &&
      !absl::ConsumePrefix(&value, "bearer ")) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(value));
}

Authorizer::Authorizer(TokenTable tokens) : tokens_(std::move(tokens)) {}

absl::StatusOr<Caller> Authorizer::Authenticate(
    const grpc::ServerContext& context, absl::string_view method) const {
  if (!tokens_.has_value()) return Caller{"", Role::kAdmin};
  const std::string token = BearerToken(context);
  if (token.empty()) {
    return Unauthenticated(absl::StrCat(
        method, ": this master requires a token; give the client "
                "--token_file FILE or $MPILEARN_TOKEN (docs/security.md)"));
  }
  const std::optional<Caller> caller = tokens_->Find(token);
  if (!caller.has_value()) {
    return Unauthenticated(absl::StrCat(
        method, ": unknown token; ask the master's operator for one "
                "(docs/security.md)"));
  }
  const Role needed = RequiredRole(method);
  if (caller->role < needed) {
    return PermissionError(absl::StrCat(
        method, " needs a token of role ", RoleName(needed), "; token '",
        caller->name, "' has role ", RoleName(caller->role)));
  }
  return *caller;
}

absl::StatusOr<std::string> LoadMetricsToken(const std::string& path) {
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_token_file: '", path, "' ", why));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("cannot be read");
  // One byte more than allowed tells a file that is too long.
  std::string text(kMaxMetricsTokenFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return error("cannot be read");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxMetricsTokenFileBytes) {
    return error(absl::StrCat("is larger than ", kMaxMetricsTokenFileBytes,
                              " bytes; it should hold one token"));
  }
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.size() < kMinTokenLength) {
    return error(absl::StrCat("holds a token of ", token.size(),
                              " characters; want at least ", kMinTokenLength,
                              " (e.g. `openssl rand -hex 32`)"));
  }
  if (!TokenCharacters(token)) {
    return error(
        "holds a character outside printable ASCII (a control character, a "
        "space or a non-ASCII byte); it should hold one token on one line");
  }
  return std::string(token);
}

std::function<bool(const std::string&, const std::string&)>
MetricsPasswordCheck(std::string token) {
  return [token = std::move(token)](const std::string& /*user*/,
                                    const std::string& password) {
    return ConstantTimeEquals(password, token);
  };
}

}  // namespace mpilearn::server
