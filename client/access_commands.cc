#include "client/access_commands.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "spec/team_role.h"
#include "stoker.grpc.pb.h"

namespace stoker {
namespace {

absl::StatusOr<v1::TeamRole> ParseRoleFlag(const std::string& role) {
  absl::StatusOr<v1::TeamRole> parsed = ParseRole(role);
  if (!parsed.ok())
    return absl::InvalidArgumentError(absl::StrCat("--", parsed.status().message()));
  return parsed;
}

std::string Time(int64_t unix_ms, const char* none) {
  if (unix_ms == 0) return none;
  return absl::FormatTime("%Y-%m-%d %H:%M", absl::FromUnixMillis(unix_ms), absl::LocalTimeZone());
}

std::string Teams(const v1::User& user) {
  std::vector<std::string> teams;
  for (const v1::Membership& m : user.teams()) {
    teams.push_back(absl::StrCat(m.team(), " (", RoleName(m.role()), ")"));
  }
  return teams.empty() ? "none" : absl::StrJoin(teams, ", ");
}

class AccessClient {
 public:
  AccessClient(const AccessCommands& c, const Options& options,
               const std::shared_ptr<grpc::Channel>& channel, std::string token)
      : c_(c),
        options_(options),
        stub_(v1::AccessService::NewStub(channel)),
        token_(std::move(token)) {}

  int Run() {
    if (c_.whoami->parsed()) return WhoAmI();
    if (c_.token_create->parsed()) return TokenCreate();
    if (c_.token_list->parsed()) return TokenList();
    if (c_.token_revoke->parsed()) return TokenRevoke();
    if (c_.user_add->parsed()) return UserAdd();
    if (c_.user_disable->parsed()) return UserDisable();
    if (c_.user_list->parsed()) return UserList();
    if (c_.team_create->parsed() || c_.team_cap->parsed()) return TeamCreateOrCap();
    if (c_.team_add->parsed() || c_.team_remove->parsed()) return TeamMember();
    if (c_.join_token->parsed()) return JoinToken();
    if (c_.quota_set->parsed()) return QuotaSet();
    if (c_.quota_list->parsed()) return QuotaList();
    return Audit();
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AddToken(*context, token_);
    return context;
  }

  int BadInput(const absl::Status& status) {
    std::cerr << "stoker: " << status.message() << "\n";
    return kExitBadInput;
  }

  absl::StatusOr<int64_t> Expiry() {
    if (c_.expires.empty()) return 0;
    return ParseDurationFlag("--expires", c_.expires);
  }

  // Hands a new secret over: into --token-out (a new file, mode 0600) or onto stdout, alone on
  // its line; what it is goes to stderr.
  int HandOver(const v1::CreateTokenResponse& created, const std::string& what) {
    const v1::TokenInfo& token = created.token();
    const std::string expiry = token.expires_unix_ms() == 0
                                   ? "never expires"
                                   : absl::StrCat("expires ", Time(token.expires_unix_ms(), ""));
    if (!c_.token_out.empty()) {
      if (!WriteSecretFile(c_.token_out, created.secret(), SecretFileMode::kNew).ok()) {
        std::cerr << "stoker: cannot create " << c_.token_out << " (it must not exist yet); token "
                  << token.id() << " was made: revoke it (stoker token revoke " << token.id()
                  << ")\n";
        return kExitFailed;
      }
      std::cerr << what << " " << token.id() << " (" << expiry << ") written to " << c_.token_out
                << "\n";
      if (options_.json()) std::cout << ToJson(token, true) << "\n";
      return kExitOk;
    }
    if (options_.json()) {
      std::cout << ToJson(created, true) << "\n";
      return kExitOk;
    }
    std::cerr << what << " " << token.id() << " (" << expiry
              << "). The secret is shown once; keep it in a file only its owner can read:\n";
    std::cout << created.secret() << "\n";
    return kExitOk;
  }

  int WhoAmI() {
    v1::WhoAmIResponse response;
    grpc::Status status = stub_->WhoAmI(Context().get(), {}, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "whoami");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    const v1::User& user = response.user();
    std::cout << user.name() << (user.cluster_admin() ? " (cluster admin)" : "")
              << (response.kind() == "user" ? "" : absl::StrCat(" [", response.kind(), " caller]"))
              << "\n";
    if (!response.token_id().empty()) std::cout << "token: " << response.token_id() << "\n";
    if (response.kind() == "user") std::cout << "teams: " << Teams(user) << "\n";
    return kExitOk;
  }

  int TokenCreate() {
    absl::StatusOr<int64_t> expires = Expiry();
    if (!expires.ok()) return BadInput(expires.status());
    v1::CreateTokenRequest request;
    request.set_name(c_.name);
    request.set_expires_in_seconds(*expires);
    request.set_user(c_.user);
    v1::CreateTokenResponse response;
    grpc::Status status = stub_->CreateToken(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "token create");
    return HandOver(response, absl::StrCat("token for ", response.token().user()));
  }

  int TokenList() {
    v1::ListTokensRequest request;
    request.set_user(c_.user);
    request.set_all(c_.all);
    v1::ListTokensResponse response;
    grpc::Status status = stub_->ListTokens(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "token list");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    std::cout << absl::StrFormat("%-13s %-6s %-10s %-16s %-16s %-16s %-16s %s\n", "ID", "KIND",
                                 "USER", "NAME", "CREATED", "EXPIRES", "LAST USED", "STATE");
    const int64_t now = absl::ToUnixMillis(absl::Now());
    for (const v1::TokenInfo& t : response.tokens()) {
      std::string state = "live";
      if (t.revoked_unix_ms() != 0) {
        state = "revoked";
      } else if (t.expires_unix_ms() != 0 && t.expires_unix_ms() <= now) {
        state = "expired";
      } else if (t.kind() == "join" && t.used_unix_ms() != 0) {
        state = "used";
      }
      if (!t.worker_ids().empty()) absl::StrAppend(&state, " ids=", t.worker_ids());
      std::cout << absl::StrFormat("%-13s %-6s %-10s %-16s %-16s %-16s %-16s %s\n", t.id(),
                                   t.kind(), t.user(), t.name(), Time(t.created_unix_ms(), "-"),
                                   Time(t.expires_unix_ms(), "never"),
                                   Time(t.last_used_unix_ms(), "never"), state);
    }
    return kExitOk;
  }

  int TokenRevoke() {
    v1::RevokeTokenRequest request;
    request.set_id(c_.id);
    v1::TokenInfo response;
    grpc::Status status = stub_->RevokeToken(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "token revoke");
    std::cout << (options_.json() ? ToJson(response, true) : absl::StrCat("revoked ", c_.id))
              << "\n";
    return kExitOk;
  }

  int UserAdd() {
    absl::StatusOr<int64_t> expires = Expiry();
    if (!expires.ok()) return BadInput(expires.status());
    v1::AddUserRequest request;
    request.set_name(c_.name);
    request.set_cluster_admin(c_.cluster_admin);
    request.set_team(c_.team);
    if (!c_.role.empty()) {
      absl::StatusOr<v1::TeamRole> role = ParseRoleFlag(c_.role);
      if (!role.ok()) return BadInput(role.status());
      request.set_role(*role);
    }
    request.set_token_expires_in_seconds(*expires);
    v1::AddUserResponse response;
    grpc::Status status = stub_->AddUser(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "user add");
    std::cerr << "added user " << response.user().name()
              << (response.user().cluster_admin() ? " (cluster admin)" : "")
              << ", teams: " << Teams(response.user()) << "\n";
    return HandOver(response.first_token(),
                    absl::StrCat("first token for ", response.user().name()));
  }

  int UserDisable() {
    v1::DisableUserRequest request;
    request.set_name(c_.name);
    v1::User response;
    grpc::Status status = stub_->DisableUser(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "user disable");
    std::cout << (options_.json()
                      ? ToJson(response, true)
                      : absl::StrCat("disabled ", c_.name, "; its tokens are refused from now on"))
              << "\n";
    return kExitOk;
  }

  int UserList() {
    v1::ListUsersResponse response;
    grpc::Status status = stub_->ListUsers(Context().get(), {}, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "user list");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    std::cout << absl::StrFormat("%-16s %-8s %s\n", "USER", "STATE", "TEAMS");
    for (const v1::User& u : response.users()) {
      std::cout << absl::StrFormat("%-16s %-8s %s%s\n", u.name(),
                                   u.disabled() ? "disabled" : "active", Teams(u),
                                   u.cluster_admin() ? "; cluster admin" : "");
    }
    std::cout << "\n" << absl::StrFormat("%-16s %-8s %s\n", "TEAM", "MAX PRIO", "MEMBERS");
    for (const v1::Team& t : response.teams()) {
      std::cout << absl::StrFormat("%-16s %-8d %s\n", t.name(), t.max_priority(),
                                   absl::StrJoin(t.members(), ", "));
    }
    return kExitOk;
  }

  int PrintTeam(const grpc::Status& status, const v1::Team& team, const char* what) {
    if (!status.ok()) return ReportRpcError(options_, status, what);
    std::cout << (options_.json()
                      ? ToJson(team, true)
                      : absl::StrCat(
                            "team ", team.name(), ": max priority ", team.max_priority(),
                            "; members: ",
                            team.members().empty() ? "none" : absl::StrJoin(team.members(), ", ")))
              << "\n";
    return kExitOk;
  }

  int TeamCreateOrCap() {
    v1::CreateTeamRequest request;
    request.set_name(c_.team);
    request.set_max_priority(c_.max_priority);
    v1::Team team;
    if (c_.team_create->parsed()) {
      return PrintTeam(stub_->CreateTeam(Context().get(), request, &team), team, "team create");
    }
    return PrintTeam(stub_->SetTeamCap(Context().get(), request, &team), team, "team cap");
  }

  int TeamMember() {
    v1::Team team;
    if (c_.team_add->parsed()) {
      absl::StatusOr<v1::TeamRole> role = ParseRoleFlag(c_.role);
      if (!role.ok()) return BadInput(role.status());
      v1::SetMemberRequest request;
      request.set_team(c_.team);
      request.set_user(c_.user);
      request.set_role(*role);
      return PrintTeam(stub_->SetMember(Context().get(), request, &team), team, "team add");
    }
    v1::RemoveMemberRequest request;
    request.set_team(c_.team);
    request.set_user(c_.user);
    return PrintTeam(stub_->RemoveMember(Context().get(), request, &team), team, "team remove");
  }

  int JoinToken() {
    v1::CreateJoinTokenRequest request;
    if (!c_.expires.empty()) {
      absl::StatusOr<int64_t> expires = ParseDurationFlag("--expires", c_.expires);
      if (!expires.ok()) return BadInput(expires.status());
      request.set_expires_in_seconds(*expires);
    }
    request.set_worker_ids(c_.ids);
    request.set_name(c_.name);
    v1::CreateTokenResponse response;
    grpc::Status status = stub_->CreateJoinToken(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "worker join-token");
    return HandOver(response, absl::StrCat("single-use join token for worker ids '",
                                           response.token().worker_ids(), "':"));
  }

  // "64GiB", "512MiB", "1TiB" or bytes for memory; a count for gpus and cpus.
  static absl::StatusOr<int64_t> Amount(const std::string& resource, const std::string& text,
                                        const char* what) {
    int64_t value = 0;
    int64_t unit = 1;
    std::string digits = text;
    if (resource == "memory") {
      for (const auto& [suffix, size] : {std::pair<const char*, int64_t>{"TiB", int64_t{1} << 40},
                                         {"GiB", int64_t{1} << 30},
                                         {"MiB", int64_t{1} << 20}}) {
        if (absl::EndsWith(text, suffix)) {
          unit = size;
          digits = text.substr(0, text.size() - 3);
          break;
        }
      }
    }
    if (!absl::SimpleAtoi(digits, &value) || value < 0 || value > (int64_t{1} << 50) / unit) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", text, "': a count of 0 or more",
                       resource == "memory" ? " (bytes, or with MiB, GiB or TiB)" : ""));
    }
    return value * unit;
  }

  int QuotaSet() {
    v1::SetQuotaRequest request;
    request.set_team(c_.team);
    if (!c_.weight.empty()) {
      double weight = 0;
      if (!absl::SimpleAtod(c_.weight, &weight) || !(weight > 0) || !std::isfinite(weight)) {
        return BadInput(absl::InvalidArgumentError(
            absl::StrCat("--weight '", c_.weight, "': a positive number (e.g. 1, 2.5)")));
      }
      request.set_weight(weight);
    }
    if (c_.quota.empty()) {
      if (c_.weight.empty()) {
        return BadInput(absl::InvalidArgumentError(
            "give RESOURCE=AMOUNT (gpus=4, cpus=64, memory=256GiB), --weight W, or both"));
      }
      if (!c_.borrow.empty()) {
        return BadInput(absl::InvalidArgumentError("--borrow needs RESOURCE=AMOUNT"));
      }
      return SendQuota(request);
    }
    const size_t eq = c_.quota.find('=');
    const std::string resource = c_.quota.substr(0, eq);
    if (eq == std::string::npos ||
        (resource != "gpus" && resource != "cpus" && resource != "memory")) {
      return BadInput(absl::InvalidArgumentError(
          absl::StrCat("'", c_.quota,
                       "': RESOURCE=AMOUNT with gpus, cpus or memory (e.g. gpus=4, "
                       "memory=256GiB), or RESOURCE=none to remove it")));
    }
    request.mutable_quota()->set_resource(resource);
    const std::string amount = c_.quota.substr(eq + 1);
    if (amount == "none") {
      request.mutable_quota()->set_nominal(-1);
    } else {
      absl::StatusOr<int64_t> nominal = Amount(resource, amount, resource.c_str());
      if (!nominal.ok()) return BadInput(nominal.status());
      request.mutable_quota()->set_nominal(*nominal);
      absl::StatusOr<int64_t> borrow =
          c_.borrow.empty() ? 0 : Amount(resource, c_.borrow, "--borrow");
      if (!borrow.ok()) return BadInput(borrow.status());
      request.mutable_quota()->set_borrow(*borrow);
    }
    return SendQuota(request);
  }

  int SendQuota(const v1::SetQuotaRequest& request) {
    v1::TeamQuota response;
    grpc::Status status = stub_->SetQuota(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "quota set");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    return QuotaList();
  }

  int QuotaList() {
    v1::ListQuotasResponse response;
    grpc::Status status = stub_->ListQuotas(Context().get(), {}, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "quota list");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    std::cout << absl::StrFormat("%-16s %-8s %-7s %-8s %-12s %-12s %s\n", "TEAM", "WEIGHT", "SHARE",
                                 "RESOURCE", "NOMINAL", "BORROW", "USED");
    auto show = [](const v1::ResourceQuota& q, int64_t value) {
      return q.resource() == "memory" ? absl::StrFormat("%.1f GiB", value / double(1 << 30))
                                      : absl::StrCat(value);
    };
    for (const v1::TeamQuota& team : response.teams()) {
      const std::string weight = absl::StrFormat("%g", team.weight());
      const std::string share = absl::StrFormat("%.3f", team.share());
      if (team.quotas().empty()) {
        std::cout << absl::StrFormat("%-16s %-8s %-7s %-8s %-12s %-12s %s\n", team.team(), weight,
                                     share, "-", "-", "-", "-");
      }
      for (const v1::ResourceQuota& q : team.quotas()) {
        std::cout << absl::StrFormat("%-16s %-8s %-7s %-8s %-12s %-12s %s\n", team.team(), weight,
                                     share, q.resource(), show(q, q.nominal()), show(q, q.borrow()),
                                     show(q, q.used()));
      }
    }
    return kExitOk;
  }

  int Audit() {
    v1::ListAuditRequest request;
    if (!c_.since.empty()) {
      absl::Time since;
      std::string error;
      if (absl::ParseTime(absl::RFC3339_full, c_.since, &since, &error)) {
        request.set_since_unix_ms(absl::ToUnixMillis(since));
      } else {
        absl::StatusOr<int64_t> ago = ParseDurationFlag("--since", c_.since);
        if (!ago.ok()) {
          return BadInput(absl::InvalidArgumentError(absl::StrCat(
              "--since '", c_.since, "': a duration (90m, 24h, 7d) or an RFC 3339 time")));
        }
        request.set_since_unix_ms(absl::ToUnixMillis(absl::Now()) - *ago * 1000);
      }
    }
    request.set_user(c_.user);
    request.set_limit(c_.limit);
    v1::ListAuditResponse response;
    grpc::Status status = stub_->ListAudit(Context().get(), request, &response);
    if (!status.ok()) return ReportRpcError(options_, status, "audit");
    if (options_.json()) {
      std::cout << ToJson(response, true) << "\n";
      return kExitOk;
    }
    std::cout << absl::StrFormat("%-19s %-14s %-13s %-18s %-14s %-10s %-8s %s\n", "TIME", "WHO",
                                 "TOKEN", "ACTION", "TARGET", "TEAM", "DECISION", "REASON");
    for (const v1::AuditRecord& r : response.records()) {
      std::cout << absl::StrFormat(
          "%-19s %-14s %-13s %-18s %-14s %-10s %-8s %s\n",
          absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(r.time_unix_ms()),
                           absl::LocalTimeZone()),
          r.principal(), r.token_id().empty() ? "-" : r.token_id(), r.action(),
          r.target().empty() ? "-" : r.target(), r.team().empty() ? "-" : r.team(), r.decision(),
          r.reason());
    }
    return kExitOk;
  }

  const AccessCommands& c_;
  const Options& options_;
  std::unique_ptr<v1::AccessService::Stub> stub_;
  std::string token_;
};

}  // namespace

absl::StatusOr<int64_t> ParseDurationFlag(const std::string& flag, const std::string& text) {
  int64_t count = 0;
  const char unit = text.empty() ? '\0' : text.back();
  const int64_t seconds = unit == 's'   ? 1
                          : unit == 'm' ? 60
                          : unit == 'h' ? 3600
                          : unit == 'd' ? 86400
                          : unit == 'w' ? 7 * 86400
                                        : 0;
  if (seconds == 0 || !absl::SimpleAtoi(text.substr(0, text.size() - 1), &count) || count <= 0 ||
      count > 3650 * 86400 / seconds) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", text,
                     "': a positive count with a unit s, m, h, d or w (e.g. 30d), at most "
                     "10 years"));
  }
  return count * seconds;
}

bool AccessCommands::Parsed() const {
  for (const CLI::App* command :
       {whoami, token_create, token_list, token_revoke, user_add, user_disable, user_list,
        team_create, team_cap, team_add, team_remove, join_token, audit, quota_set, quota_list}) {
    if (command != nullptr && command->parsed()) return true;
  }
  return false;
}

void AddAccessCommands(CLI::App& app, AccessCommands& c) {
  c.whoami = app.add_subcommand("whoami", "show who the token acts as, and its teams");

  CLI::App* token = app.add_subcommand("token", "create, list and revoke your tokens");
  token->require_subcommand(1);
  c.token_create = token->add_subcommand("create", "make a token; its secret is shown once");
  c.token_create->add_option("--name", c.name, "what it is for, e.g. laptop");
  c.token_create->add_option("--expires", c.expires, "lifetime, e.g. 30d (default: never)");
  c.token_create->add_option("--user", c.user, "for another user (cluster admins)");
  c.token_create->add_option("--token-out", c.token_out,
                             "write the secret to this new file (mode 0600) instead of stdout");
  c.token_list = token->add_subcommand("list", "your tokens (never their secrets)");
  c.token_list->add_option("--user", c.user, "another user's (cluster admins)");
  c.token_list->add_flag("--all", c.all, "everyone's (cluster admins)");
  c.token_revoke = token->add_subcommand("revoke", "revoke a token at once");
  c.token_revoke->add_option("id", c.id, "token id, e.g. tok-1a2b3c4d")->required();

  CLI::App* user = app.add_subcommand("user", "add, disable and list users (admins)");
  user->require_subcommand(1);
  c.user_add = user->add_subcommand(
      "add", "add a user and make its first token (cluster admins; a team admin with --team)");
  c.user_add->add_option("name", c.name, "user name")->required();
  c.user_add->add_flag("--cluster-admin", c.cluster_admin, "make it a cluster admin");
  c.user_add->add_option("--team", c.team, "also add it to this team");
  c.user_add->add_option("--role", c.role, "its role there: viewer, member (default), admin");
  c.user_add->add_option("--expires", c.expires, "lifetime of its first token (default: never)");
  c.user_add->add_option("--token-out", c.token_out,
                         "write the first token to this new file (mode 0600) instead of stdout");
  c.user_disable = user->add_subcommand("disable", "refuse every token of a user (cluster admins)");
  c.user_disable->add_option("name", c.name, "user name")->required();
  c.user_list = user->add_subcommand("list", "users and teams");

  CLI::App* team = app.add_subcommand("team", "create teams and manage their members");
  team->require_subcommand(1);
  c.team_create = team->add_subcommand("create", "create a team (cluster admins)");
  c.team_create->add_option("team", c.team, "team name")->required();
  c.team_create
      ->add_option("--max-priority", c.max_priority, "highest job priority its members may ask for")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  c.team_cap = team->add_subcommand("cap", "set a team's highest job priority (cluster admins)");
  c.team_cap->add_option("team", c.team, "team name")->required();
  c.team_cap->add_option("max_priority", c.max_priority, "the cap")
      ->required()
      ->check(CLI::Range(0, 1000));
  c.team_add = team->add_subcommand("add", "add a user to a team, or change its role");
  c.team_add->add_option("team", c.team, "team name")->required();
  c.team_add->add_option("user", c.user, "user name")->required();
  c.team_add->add_option("--role", c.role, "viewer, member (default) or admin");
  c.team_remove = team->add_subcommand("remove", "remove a user from a team");
  c.team_remove->add_option("team", c.team, "team name")->required();
  c.team_remove->add_option("user", c.user, "user name")->required();

  CLI::App* worker = app.add_subcommand("worker", "worker credentials (cluster admins)");
  worker->require_subcommand(1);
  c.join_token = worker->add_subcommand(
      "join-token", "a single-use secret a new worker exchanges for its own worker token");
  c.join_token->add_option("--ids", c.ids,
                           "worker ids it may join as, a glob, e.g. 'gpu-node-*' (default: *)");
  c.join_token->add_option("--expires", c.expires, "how long it stays usable (default: 1h)");
  c.join_token->add_option("--name", c.name, "what it is for");
  c.join_token->add_option("--token-out", c.token_out,
                           "write it to this new file (mode 0600) instead of stdout");

  CLI::App* quota = app.add_subcommand("quota", "team quotas on gpus, cpus and memory");
  quota->require_subcommand(1);
  c.quota_set = quota->add_subcommand(
      "set",
      "set a team's nominal quota on one resource and how much more it may borrow while "
      "idle, and/or its fair-share weight (cluster admins)");
  c.quota_set->add_option("team", c.team, "team name")->required();
  c.quota_set->add_option("quota", c.quota,
                          "RESOURCE=AMOUNT: gpus=4, cpus=64, memory=256GiB; "
                          "RESOURCE=none removes it");
  c.quota_set->add_option("--weight", c.weight,
                          "fair-share weight (default 1): weight 3 gets three times the "
                          "resources of weight 1 when both always have work queued");
  c.quota_set->add_option("--borrow", c.borrow,
                          "how much past the nominal quota it may run on idle capacity "
                          "(default 0)");
  c.quota_list = quota->add_subcommand(
      "list", "every team's quotas, fair-share weight and share, and what it uses now");

  c.audit = app.add_subcommand("audit", "who changed what, allowed or denied (admins)");
  c.audit->add_option("--since", c.since, "from this long ago (24h, 7d) or an RFC 3339 time");
  c.audit->add_option("--user", c.user, "only this principal's rows");
  c.audit->add_option("--limit", c.limit, "at most this many, the newest")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
}

int RunAccessCommand(const AccessCommands& c, const Options& options,
                     const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  return AccessClient(c, options, channel, token).Run();
}

}  // namespace stoker
