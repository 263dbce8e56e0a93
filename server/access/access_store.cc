#include "server/access/access_store.h"

#include <cmath>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/access/token_secret.h"
#include "server/sqlite_util.h"
#include "spec/team_role.h"

namespace stoker {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS users (
  name TEXT PRIMARY KEY,
  cluster_admin INTEGER NOT NULL,
  disabled INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS teams (
  name TEXT PRIMARY KEY,
  max_priority INTEGER NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
  team TEXT NOT NULL REFERENCES teams (name),
  user TEXT NOT NULL REFERENCES users (name),
  role INTEGER NOT NULL,
  PRIMARY KEY (team, user)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tokens (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,              -- user | worker | join
  user TEXT NOT NULL,              -- acts as (user) or was created by (worker, join)
  name TEXT NOT NULL,
  hash BLOB NOT NULL UNIQUE,       -- SHA-256 of the secret; the secret is never stored
  created_ms INTEGER NOT NULL,
  expires_ms INTEGER NOT NULL,     -- 0 = never
  last_used_ms INTEGER NOT NULL DEFAULT 0,
  revoked_ms INTEGER NOT NULL DEFAULT 0,
  worker_ids TEXT NOT NULL DEFAULT '',
  used_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tokens_by_user ON tokens (user);
CREATE TABLE IF NOT EXISTS team_weights (
  team TEXT PRIMARY KEY REFERENCES teams (name),
  weight REAL NOT NULL             -- fair-share weight, > 0 (absent: 1)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS team_quotas (
  team TEXT NOT NULL REFERENCES teams (name),
  resource TEXT NOT NULL,          -- gpus | cpus | memory (bytes)
  nominal INTEGER NOT NULL,
  borrow INTEGER NOT NULL,
  PRIMARY KEY (team, resource)
) WITHOUT ROWID;
)sql";

// The largest fair-share weight: a million to one is already "only when nobody else waits".
constexpr double kMaxWeight = 1e6;

constexpr char kTokenColumns[] =
    "id, kind, user, name, created_ms, expires_ms, last_used_ms, revoked_ms, worker_ids, used_ms";

v1::TokenInfo TokenFromRow(Statement& row) {
  v1::TokenInfo token;
  token.set_id(row.ColumnText(0));
  token.set_kind(row.ColumnText(1));
  token.set_user(row.ColumnText(2));
  token.set_name(row.ColumnText(3));
  token.set_created_unix_ms(row.ColumnInt(4));
  token.set_expires_unix_ms(row.ColumnInt(5));
  token.set_last_used_unix_ms(row.ColumnInt(6));
  token.set_revoked_unix_ms(row.ColumnInt(7));
  token.set_worker_ids(row.ColumnText(8));
  token.set_used_unix_ms(row.ColumnInt(9));
  return token;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

v1::AuditRecord Allowed(v1::AuditRecord audit) {
  audit.set_decision("allowed");
  return audit;
}

// A team's priority cap: 0..1000 (job priorities run from -1000 to 1000).
absl::Status ValidateCap(int max_priority) {
  if (max_priority < 0 || max_priority > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("max priority ", max_priority, ": between 0 and 1000"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateName(absl::string_view what, const std::string& name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "': 1 to 64 characters"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool alnum = absl::ascii_isdigit(c) || (c >= 'a' && c <= 'z');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", name,
                       "': use lower-case letters, digits, '.', '_' and '-', starting with a "
                       "letter or digit"));
    }
  }
  if (name == "legacy" || name == "open") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "' is reserved (the server's own principals)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AccessStore>> AccessStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open access store '", path, "': ", message));
  }
  std::unique_ptr<AccessStore> store(new AccessStore(db));
  sqlite3_busy_timeout(db, 10000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                          "PRAGMA foreign_keys=ON", static_cast<const char*>(kSchema)}) {
    char* message = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
      std::string text = message ? message : "unknown error";
      sqlite3_free(message);
      return absl::InternalError(absl::StrCat("access store: ", text));
    }
  }
  if (absl::Status s = CreateAuditTable(db); !s.ok()) return s;
  {
    absl::MutexLock lock(&store->mu_);
    if (absl::Status s = store->LoadQuotas(); !s.ok()) return s;
  }
  return store;
}

absl::Status AccessStore::LoadQuotas() {
  Statement rows(db_, "SELECT team, resource, nominal, borrow FROM team_quotas");
  if (!rows.ok()) return Error("prepare quota query");
  Quotas quotas;
  int rc;
  while ((rc = rows.Step()) == SQLITE_ROW) {
    std::optional<QuotaLimit>* limit = LimitOf(quotas[rows.ColumnText(0)], rows.ColumnText(1));
    if (limit != nullptr) *limit = QuotaLimit{rows.ColumnInt(2), rows.ColumnInt(3)};
  }
  if (rc != SQLITE_DONE) return Error("read quotas");
  Statement weights(db_, "SELECT team, weight FROM team_weights");
  if (!weights.ok()) return Error("prepare weight query");
  while ((rc = weights.Step()) == SQLITE_ROW) {
    quotas[weights.ColumnText(0)].weight = sqlite3_column_double(weights.get(), 1);
  }
  if (rc != SQLITE_DONE) return Error("read weights");
  quotas_ = std::move(quotas);
  return absl::OkStatus();
}

Quotas AccessStore::AllQuotas() {
  absl::MutexLock lock(&mu_);
  return quotas_;
}

absl::StatusOr<v1::TeamQuota> AccessStore::SetQuota(const v1::SetQuotaRequest& request,
                                                    v1::AuditRecord audit) {
  const v1::ResourceQuota& q = request.quota();
  const bool weight_only = q.resource().empty() && request.weight() != 0;
  TeamQuota probe;
  if (!weight_only && LimitOf(probe, q.resource()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("resource '", q.resource(), "': one of gpus, cpus, memory"));
  }
  if (q.borrow() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("borrow ", q.borrow(), ": must be 0 or more"));
  }
  if (!(request.weight() >= 0) || !std::isfinite(request.weight()) ||
      request.weight() > kMaxWeight) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight ", request.weight(), ": must be a positive number of at most ", kMaxWeight));
  }
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(GetTeamLocked(request.team()).status());
  if (request.weight() > 0) {
    Statement upsert(db_,
                     "INSERT INTO team_weights (team, weight) VALUES (?, ?) "
                     "ON CONFLICT (team) DO UPDATE SET weight = excluded.weight");
    upsert.BindText(1, request.team());
    if (upsert.ok()) sqlite3_bind_double(upsert.get(), 2, request.weight());
    if (!upsert.ok() || upsert.Step() != SQLITE_DONE) return Error("set weight");
  }
  if (weight_only) {
    // Only the weight.
  } else if (q.nominal() < 0) {
    Statement remove(db_, "DELETE FROM team_quotas WHERE team = ? AND resource = ?");
    remove.BindText(1, request.team());
    remove.BindText(2, q.resource());
    if (!remove.ok() || remove.Step() != SQLITE_DONE) return Error("remove quota");
  } else {
    Statement upsert(
        db_,
        "INSERT INTO team_quotas (team, resource, nominal, borrow) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (team, resource) DO UPDATE SET nominal = excluded.nominal, "
        "borrow = excluded.borrow");
    upsert.BindText(1, request.team());
    upsert.BindText(2, q.resource());
    upsert.BindInt(3, q.nominal());
    upsert.BindInt(4, q.borrow());
    if (!upsert.ok() || upsert.Step() != SQLITE_DONE) return Error("set quota");
  }
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  if (!transaction.Commit()) return Error("commit");
  STOKER_RETURN_IF_ERROR(LoadQuotas());
  v1::TeamQuota team;
  team.set_team(request.team());
  TeamQuota& quota = quotas_[request.team()];
  team.set_weight(quota.weight);
  for (const char* resource : {"gpus", "cpus", "memory"}) {
    if (const std::optional<QuotaLimit>& limit = *LimitOf(quota, resource); limit.has_value()) {
      v1::ResourceQuota* out = team.add_quotas();
      out->set_resource(resource);
      out->set_nominal(limit->nominal);
      out->set_borrow(limit->borrow);
    }
  }
  return team;
}

AccessStore::~AccessStore() { sqlite3_close(db_); }

absl::Status AccessStore::Error(const char* what) const {
  return absl::InternalError(absl::StrCat("access store: ", what, ": ", sqlite3_errmsg(db_)));
}

absl::StatusOr<bool> AccessStore::HasUsers() {
  absl::MutexLock lock(&mu_);
  Statement query(db_, "SELECT EXISTS (SELECT 1 FROM users)");
  if (!query.ok() || query.Step() != SQLITE_ROW) return Error("count users");
  return query.ColumnInt(0) != 0;
}

absl::Status AccessStore::StepToRow(Statement& query, absl::string_view what,
                                    absl::string_view key) {
  if (!query.ok()) return Error("prepare query");
  const int rc = query.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("no ", what, " '", key, "'"));
  if (rc != SQLITE_ROW) return Error("read row");
  return absl::OkStatus();
}

absl::StatusOr<v1::TokenInfo> AccessStore::QueryToken(const char* where, absl::string_view value) {
  Statement query(db_,
                  absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE ", where, " = ?"));
  query.BindBlob(1, std::string(value));
  if (absl::Status s = StepToRow(query, "token", "(by digest)"); !s.ok()) return s;
  return TokenFromRow(query);
}

absl::StatusOr<v1::TokenInfo> AccessStore::FindToken(absl::string_view hash) {
  absl::MutexLock lock(&mu_);
  return QueryToken("hash", hash);
}

absl::StatusOr<v1::TokenInfo> AccessStore::GetToken(const std::string& id) {
  absl::MutexLock lock(&mu_);
  // Ids are stored as text; bind as text for the comparison.
  Statement query(db_, absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE id = ?"));
  query.BindText(1, id);
  STOKER_RETURN_IF_ERROR(StepToRow(query, "token", id));
  return TokenFromRow(query);
}

absl::StatusOr<v1::User> AccessStore::GetUserLocked(const std::string& name) {
  Statement query(db_, "SELECT cluster_admin, disabled, created_ms FROM users WHERE name = ?");
  query.BindText(1, name);
  STOKER_RETURN_IF_ERROR(StepToRow(query, "user", name));
  v1::User user;
  user.set_name(name);
  user.set_cluster_admin(query.ColumnInt(0) != 0);
  user.set_disabled(query.ColumnInt(1) != 0);
  user.set_created_unix_ms(query.ColumnInt(2));
  Statement teams(db_, "SELECT team, role FROM members WHERE user = ? ORDER BY team");
  if (!teams.ok()) return Error("prepare membership query");
  teams.BindText(1, name);
  int step;
  while ((step = teams.Step()) == SQLITE_ROW) {
    v1::Membership* m = user.add_teams();
    m->set_team(teams.ColumnText(0));
    m->set_role(static_cast<v1::TeamRole>(teams.ColumnInt(1)));
  }
  if (step != SQLITE_DONE) return Error("read memberships");
  return user;
}

absl::StatusOr<v1::User> AccessStore::GetUser(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return GetUserLocked(name);
}

absl::StatusOr<v1::Team> AccessStore::GetTeamLocked(const std::string& name) {
  Statement query(db_, "SELECT max_priority FROM teams WHERE name = ?");
  query.BindText(1, name);
  STOKER_RETURN_IF_ERROR(StepToRow(query, "team", name));
  v1::Team team;
  team.set_name(name);
  team.set_max_priority(static_cast<int32_t>(query.ColumnInt(0)));
  Statement members(db_, "SELECT user, role FROM members WHERE team = ? ORDER BY user");
  if (!members.ok()) return Error("prepare member query");
  members.BindText(1, name);
  int step;
  while ((step = members.Step()) == SQLITE_ROW) {
    team.add_members(absl::StrCat(members.ColumnText(0), ":",
                                  RoleName(static_cast<v1::TeamRole>(members.ColumnInt(1)))));
  }
  if (step != SQLITE_DONE) return Error("read members");
  return team;
}

absl::StatusOr<v1::Team> AccessStore::GetTeam(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return GetTeamLocked(name);
}

absl::StatusOr<v1::ListUsersResponse> AccessStore::ListUsers() {
  absl::MutexLock lock(&mu_);
  v1::ListUsersResponse response;
  std::vector<std::string> names;
  {
    Statement users(db_, "SELECT name FROM users ORDER BY name");
    if (!users.ok()) return Error("prepare user list");
    while (users.Step() == SQLITE_ROW) names.push_back(users.ColumnText(0));
  }
  for (const std::string& name : names) {
    STOKER_ASSIGN_OR_RETURN(*response.add_users(), GetUserLocked(name));
  }
  names.clear();
  {
    Statement teams(db_, "SELECT name FROM teams ORDER BY name");
    if (!teams.ok()) return Error("prepare team list");
    while (teams.Step() == SQLITE_ROW) names.push_back(teams.ColumnText(0));
  }
  for (const std::string& name : names) {
    STOKER_ASSIGN_OR_RETURN(*response.add_teams(), GetTeamLocked(name));
  }
  return response;
}

absl::StatusOr<std::vector<v1::TokenInfo>> AccessStore::ListTokens(const std::string& user) {
  absl::MutexLock lock(&mu_);
  Statement query(
      db_, absl::StrCat("SELECT ", kTokenColumns, " FROM tokens",
                        user.empty() ? "" : " WHERE user = ?", " ORDER BY created_ms DESC, id"));
  if (!query.ok()) return Error("prepare token list");
  if (!user.empty()) query.BindText(1, user);
  std::vector<v1::TokenInfo> tokens;
  int rc;
  while ((rc = query.Step()) == SQLITE_ROW) tokens.push_back(TokenFromRow(query));
  if (rc != SQLITE_DONE) return Error("list tokens");
  return tokens;
}

absl::StatusOr<std::vector<v1::AuditRecord>> AccessStore::ReadAudit(const AuditQuery& query) {
  absl::MutexLock lock(&mu_);
  return stoker::ReadAudit(db_, query);
}

absl::Status AccessStore::TouchToken(const std::string& id, int64_t now_unix_ms) {
  absl::MutexLock lock(&mu_);
  Statement update(db_, "UPDATE tokens SET last_used_ms = ? WHERE id = ?");
  if (!update.ok()) return Error("prepare token use");
  update.BindInt(1, now_unix_ms);
  update.BindText(2, id);
  if (update.Step() != SQLITE_DONE) return Error("record token use");
  return absl::OkStatus();
}

absl::Status AccessStore::AddMemberLocked(const std::string& team, const std::string& user,
                                          v1::TeamRole role) {
  Statement upsert(db_,
                   "INSERT INTO members (team, user, role) VALUES (?, ?, ?) "
                   "ON CONFLICT (team, user) DO UPDATE SET role = excluded.role");
  if (!upsert.ok()) return Error("prepare membership");
  upsert.BindText(1, team);
  upsert.BindText(2, user);
  upsert.BindInt(3, role);
  if (upsert.Step() != SQLITE_DONE) return Error("add member");
  return absl::OkStatus();
}

absl::StatusOr<v1::AddUserResponse> AccessStore::AddUser(const v1::AddUserRequest& request,
                                                         int64_t token_expires_unix_ms,
                                                         v1::AuditRecord audit) {
  STOKER_RETURN_IF_ERROR(ValidateName("user name", request.name()));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  if (GetUserLocked(request.name()).ok()) {
    return absl::AlreadyExistsError(absl::StrCat("user '", request.name(), "' exists already"));
  }
  if (!request.team().empty()) {
    if (absl::StatusOr<v1::Team> team = GetTeamLocked(request.team()); !team.ok()) {
      return team.status();
    }
  }
  Statement insert(db_, "INSERT INTO users (name, cluster_admin, created_ms) VALUES (?, ?, ?)");
  if (!insert.ok()) return Error("prepare user insert");
  insert.BindText(1, request.name());
  insert.BindInt(2, request.cluster_admin() ? 1 : 0);
  insert.BindInt(3, NowMs());
  if (insert.Step() != SQLITE_DONE) return Error("add user");
  if (!request.team().empty()) {
    const v1::TeamRole role =
        request.role() == v1::TEAM_ROLE_UNSPECIFIED ? v1::TEAM_ROLE_MEMBER : request.role();
    STOKER_RETURN_IF_ERROR(AddMemberLocked(request.team(), request.name(), role));
  }
  v1::TokenInfo token;
  token.set_kind("user");
  token.set_user(request.name());
  token.set_name("first");
  token.set_expires_unix_ms(token_expires_unix_ms);
  STOKER_ASSIGN_OR_RETURN(NewToken created, InsertToken(std::move(token)));
  audit.set_reason(absl::StrCat("first token ", created.info.id()));
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  v1::AddUserResponse response;
  STOKER_ASSIGN_OR_RETURN(*response.mutable_user(), GetUserLocked(request.name()));
  response.mutable_first_token()->set_secret(std::move(created.secret));
  *response.mutable_first_token()->mutable_token() = std::move(created.info);
  if (!transaction.Commit()) return Error("commit");
  return response;
}

absl::StatusOr<v1::User> AccessStore::DisableUser(const std::string& name, v1::AuditRecord audit) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(GetUserLocked(name).status());
  Statement update(db_, "UPDATE users SET disabled = 1 WHERE name = ?");
  if (!update.ok()) return Error("prepare disable");
  update.BindText(1, name);
  if (update.Step() != SQLITE_DONE) return Error("disable user");
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  STOKER_ASSIGN_OR_RETURN(v1::User user, GetUserLocked(name));
  if (!transaction.Commit()) return Error("commit");
  return user;
}

absl::StatusOr<v1::Team> AccessStore::CreateTeam(const v1::CreateTeamRequest& request,
                                                 v1::AuditRecord audit) {
  STOKER_RETURN_IF_ERROR(ValidateName("team name", request.name()));
  STOKER_RETURN_IF_ERROR(ValidateCap(request.max_priority()));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  if (GetTeamLocked(request.name()).ok()) {
    return absl::AlreadyExistsError(absl::StrCat("team '", request.name(), "' exists already"));
  }
  Statement insert(db_, "INSERT INTO teams (name, max_priority, created_ms) VALUES (?, ?, ?)");
  if (!insert.ok()) return Error("prepare team insert");
  insert.BindText(1, request.name());
  insert.BindInt(2, request.max_priority());
  insert.BindInt(3, NowMs());
  if (insert.Step() != SQLITE_DONE) return Error("create team");
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  STOKER_ASSIGN_OR_RETURN(v1::Team team, GetTeamLocked(request.name()));
  if (!transaction.Commit()) return Error("commit");
  return team;
}

absl::StatusOr<v1::Team> AccessStore::SetTeamCap(const v1::CreateTeamRequest& request,
                                                 v1::AuditRecord audit) {
  STOKER_RETURN_IF_ERROR(ValidateCap(request.max_priority()));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(GetTeamLocked(request.name()).status());
  Statement update(db_, "UPDATE teams SET max_priority = ? WHERE name = ?");
  if (!update.ok()) return Error("prepare cap");
  update.BindInt(1, request.max_priority());
  update.BindText(2, request.name());
  if (update.Step() != SQLITE_DONE) return Error("set cap");
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  STOKER_ASSIGN_OR_RETURN(v1::Team team, GetTeamLocked(request.name()));
  if (!transaction.Commit()) return Error("commit");
  return team;
}

absl::StatusOr<v1::Team> AccessStore::SetMember(const v1::SetMemberRequest& request,
                                                v1::AuditRecord audit) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(GetTeamLocked(request.team()).status());
  STOKER_RETURN_IF_ERROR(GetUserLocked(request.user()).status());
  const v1::TeamRole role =
      request.role() == v1::TEAM_ROLE_UNSPECIFIED ? v1::TEAM_ROLE_MEMBER : request.role();
  STOKER_RETURN_IF_ERROR(AddMemberLocked(request.team(), request.user(), role));
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  STOKER_ASSIGN_OR_RETURN(v1::Team team, GetTeamLocked(request.team()));
  if (!transaction.Commit()) return Error("commit");
  return team;
}

absl::StatusOr<v1::Team> AccessStore::RemoveMember(const v1::RemoveMemberRequest& request,
                                                   v1::AuditRecord audit) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(GetTeamLocked(request.team()).status());
  Statement remove(db_, "DELETE FROM members WHERE team = ? AND user = ?");
  if (!remove.ok()) return Error("prepare member removal");
  remove.BindText(1, request.team());
  remove.BindText(2, request.user());
  if (remove.Step() != SQLITE_DONE) return Error("remove member");
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(
        absl::StrCat("user '", request.user(), "' is not in team '", request.team(), "'"));
  }
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  STOKER_ASSIGN_OR_RETURN(v1::Team team, GetTeamLocked(request.team()));
  if (!transaction.Commit()) return Error("commit");
  return team;
}

absl::StatusOr<AccessStore::NewToken> AccessStore::InsertToken(v1::TokenInfo token,
                                                               std::string secret) {
  absl::string_view prefix = token.kind() == "user"     ? kUserTokenPrefix
                             : token.kind() == "worker" ? kWorkerTokenPrefix
                                                        : kJoinTokenPrefix;
  if (secret.empty()) {
    STOKER_ASSIGN_OR_RETURN(secret, NewTokenSecret(prefix));
  } else if (!absl::StartsWith(secret, prefix) || secret.size() < prefix.size() + 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", token.kind(), " token given as a secret must start with '", prefix,
        "' and have at least 32 more characters (e.g. ", prefix, "$(openssl rand -hex 32))"));
  }
  STOKER_ASSIGN_OR_RETURN(std::string id, NewTokenId());
  token.set_id(id);
  token.set_created_unix_ms(NowMs());
  Statement insert(db_,
                   "INSERT INTO tokens (id, kind, user, name, hash, created_ms, expires_ms, "
                   "worker_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  if (!insert.ok()) return Error("prepare token insert");
  insert.BindText(1, token.id());
  insert.BindText(2, token.kind());
  insert.BindText(3, token.user());
  insert.BindText(4, token.name());
  insert.BindBlob(5, HashSecret(secret));
  insert.BindInt(6, token.created_unix_ms());
  insert.BindInt(7, token.expires_unix_ms());
  insert.BindText(8, token.worker_ids());
  if (insert.Step() != SQLITE_DONE) return Error("store token");
  return NewToken{std::move(secret), std::move(token)};
}

absl::StatusOr<AccessStore::NewToken> AccessStore::CreateToken(const v1::TokenInfo& token,
                                                               v1::AuditRecord audit) {
  if (token.name().size() > 128) {
    return absl::InvalidArgumentError("token name: at most 128 characters");
  }
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_ASSIGN_OR_RETURN(NewToken created, InsertToken(token));
  if (audit.target().empty()) audit.set_target(created.info.id());
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  if (!transaction.Commit()) return Error("commit");
  return created;
}

absl::StatusOr<v1::TokenInfo> AccessStore::RevokeToken(const std::string& id,
                                                       v1::AuditRecord audit) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  Statement update(db_, "UPDATE tokens SET revoked_ms = ? WHERE id = ? AND revoked_ms = 0");
  if (!update.ok()) return Error("prepare revoke");
  update.BindInt(1, NowMs());
  update.BindText(2, id);
  if (update.Step() != SQLITE_DONE) return Error("revoke token");
  if (sqlite3_changes(db_) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("token '", id, "' is already revoked"));
  }
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  Statement query(db_, absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE id = ?"));
  query.BindText(1, id);
  if (!query.ok() || query.Step() != SQLITE_ROW) return Error("read revoked token");
  v1::TokenInfo token = TokenFromRow(query);
  if (!transaction.Commit()) return Error("commit");
  return token;
}

absl::StatusOr<AccessStore::NewToken> AccessStore::RedeemJoinToken(const std::string& join_id,
                                                                   v1::AuditRecord audit) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  const int64_t now = NowMs();
  Statement use(db_,
                "UPDATE tokens SET used_ms = ?, last_used_ms = ? WHERE id = ? AND kind = 'join' "
                "AND used_ms = 0 AND revoked_ms = 0");
  if (!use.ok()) return Error("prepare join");
  use.BindInt(1, now);
  use.BindInt(2, now);
  use.BindText(3, join_id);
  if (use.Step() != SQLITE_DONE) return Error("use join token");
  if (sqlite3_changes(db_) == 0) {
    return absl::FailedPreconditionError(
        "join token already used: ask an admin for a new one "
        "(stoker worker join-token)");
  }
  Statement query(db_, absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE id = ?"));
  query.BindText(1, join_id);
  if (!query.ok() || query.Step() != SQLITE_ROW) return Error("read join token");
  const v1::TokenInfo join = TokenFromRow(query);
  v1::TokenInfo worker;
  worker.set_kind("worker");
  worker.set_user(join.user());
  worker.set_name(absl::StrCat("joined with ", join.id(), join.name().empty() ? "" : " (",
                               join.name(), join.name().empty() ? "" : ")"));
  worker.set_worker_ids(join.worker_ids());
  STOKER_ASSIGN_OR_RETURN(NewToken created, InsertToken(std::move(worker)));
  audit.set_reason(absl::StrCat("worker token ", created.info.id()));
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  if (!transaction.Commit()) return Error("commit");
  return created;
}

absl::StatusOr<AccessStore::NewToken> AccessStore::Bootstrap(const std::string& admin,
                                                             const std::string& admin_secret,
                                                             const std::string& join_secret,
                                                             int64_t join_expires_unix_ms) {
  STOKER_RETURN_IF_ERROR(ValidateName("user name", admin));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  Statement admins(db_, "SELECT name FROM users WHERE cluster_admin = 1 LIMIT 1");
  if (!admins.ok()) return Error("prepare admin query");
  if (admins.Step() == SQLITE_ROW) {
    return absl::FailedPreconditionError(absl::StrCat("a cluster admin exists already ('",
                                                      admins.ColumnText(0),
                                                      "'): it adds users with `stoker user add`"));
  }
  if (GetUserLocked(admin).ok()) {
    Statement promote(db_, "UPDATE users SET cluster_admin = 1, disabled = 0 WHERE name = ?");
    promote.BindText(1, admin);
    if (!promote.ok() || promote.Step() != SQLITE_DONE) return Error("make admin");
  } else {
    Statement insert(db_, "INSERT INTO users (name, cluster_admin, created_ms) VALUES (?, 1, ?)");
    if (!insert.ok()) return Error("prepare user insert");
    insert.BindText(1, admin);
    insert.BindInt(2, NowMs());
    if (insert.Step() != SQLITE_DONE) return Error("add admin");
  }
  v1::TokenInfo token;
  token.set_kind("user");
  token.set_user(admin);
  token.set_name("bootstrap");
  STOKER_ASSIGN_OR_RETURN(NewToken created, InsertToken(std::move(token), admin_secret));
  v1::AuditRecord audit = AuditOf("bootstrap", "", "user.bootstrap", admin);
  audit.set_reason(absl::StrCat("first cluster admin, token ", created.info.id()));
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(audit))));
  if (!join_secret.empty()) {
    v1::TokenInfo join;
    join.set_kind("join");
    join.set_user(admin);
    join.set_name("bootstrap");
    join.set_worker_ids("*");
    join.set_expires_unix_ms(join_expires_unix_ms);
    STOKER_ASSIGN_OR_RETURN(NewToken joined, InsertToken(std::move(join), join_secret));
    v1::AuditRecord join_audit = AuditOf("bootstrap", "", "worker.join-token", joined.info.id());
    join_audit.set_reason("worker ids '*'");
    STOKER_RETURN_IF_ERROR(AppendAudit(db_, Allowed(std::move(join_audit))));
  }
  if (!transaction.Commit()) return Error("commit");
  return created;
}

absl::Status AccessStore::Audit(const v1::AuditRecord& record) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, record));
  if (!transaction.Commit()) return Error("commit");
  return absl::OkStatus();
}

void AccessStore::AuditOutcome(v1::AuditRecord audit, const absl::Status& outcome) {
  if (absl::Status s = Audit(Decided(std::move(audit), outcome)); !s.ok()) {
    std::cerr << "stoker-server: cannot write an audit row: " << s.message() << std::endl;
  }
}

}  // namespace stoker
