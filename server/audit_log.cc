#include "server/audit_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/sqlite_util.h"

namespace stoker {
namespace {

constexpr char kAuditSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms INTEGER NOT NULL,
  principal TEXT NOT NULL,
  token_id TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL,
  team TEXT NOT NULL,
  decision TEXT NOT NULL,
  reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (time_ms);
)sql";

absl::Status SqlError(sqlite3* db, const char* what) {
  return absl::InternalError(absl::StrCat("audit log: ", what, ": ", sqlite3_errmsg(db)));
}

}  // namespace

absl::Status CreateAuditTable(sqlite3* db) {
  if (sqlite3_exec(db, kAuditSchema, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqlError(db, "create table");
  }
  return absl::OkStatus();
}

absl::Status AppendAudit(sqlite3* db, const v1::AuditRecord& record) {
  Statement insert(db,
                   "INSERT INTO audit (time_ms, principal, token_id, action, target, team, "
                   "decision, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  if (!insert.ok()) return SqlError(db, "prepare insert");
  insert.BindInt(
      1, record.time_unix_ms() != 0 ? record.time_unix_ms() : absl::ToUnixMillis(absl::Now()));
  insert.BindText(2, record.principal());
  insert.BindText(3, record.token_id());
  insert.BindText(4, record.action());
  insert.BindText(5, record.target());
  insert.BindText(6, record.team());
  insert.BindText(7, record.decision());
  insert.BindText(8, record.reason());
  if (insert.Step() != SQLITE_DONE) return SqlError(db, "insert");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::AuditRecord>> ReadAudit(sqlite3* db, const AuditQuery& query) {
  std::string sql =
      "SELECT seq, time_ms, principal, token_id, action, target, team, decision, reason "
      "FROM audit WHERE time_ms >= ?1";
  if (!query.user.empty()) sql += " AND principal = ?2";
  if (query.teams_only) {
    std::vector<std::string> slots;
    for (size_t i = 0; i < query.teams.size(); ++i) slots.push_back(absl::StrCat("?", i + 5));
    sql += absl::StrCat(" AND (principal = ?4", slots.empty() ? "" : " OR team IN (",
                        absl::StrJoin(slots, ","), slots.empty() ? "" : ")", ")");
  }
  sql += " ORDER BY seq DESC LIMIT ?3";
  Statement select(db, sql);
  if (!select.ok()) return SqlError(db, "prepare select");
  select.BindInt(1, query.since_unix_ms);
  if (!query.user.empty()) select.BindText(2, query.user);
  select.BindInt(3, query.limit > 0 ? query.limit : 1000);
  if (query.teams_only) {
    select.BindText(4, query.also_user);
    for (size_t i = 0; i < query.teams.size(); ++i) {
      select.BindText(static_cast<int>(i) + 5, query.teams[i]);
    }
  }
  std::vector<v1::AuditRecord> records;
  int rc;
  while ((rc = select.Step()) == SQLITE_ROW) {
    v1::AuditRecord& r = records.emplace_back();
    r.set_seq(select.ColumnInt(0));
    r.set_time_unix_ms(select.ColumnInt(1));
    r.set_principal(select.ColumnText(2));
    r.set_token_id(select.ColumnText(3));
    r.set_action(select.ColumnText(4));
    r.set_target(select.ColumnText(5));
    r.set_team(select.ColumnText(6));
    r.set_decision(select.ColumnText(7));
    r.set_reason(select.ColumnText(8));
  }
  if (rc != SQLITE_DONE) return SqlError(db, "select");
  std::reverse(records.begin(), records.end());
  return records;
}

v1::AuditRecord AuditOf(const std::string& principal, const std::string& token_id,
                        const std::string& action, const std::string& target,
                        const std::string& team) {
  v1::AuditRecord record;
  record.set_principal(principal);
  record.set_token_id(token_id);
  record.set_action(action);
  record.set_target(target);
  record.set_team(team);
  return record;
}

v1::AuditRecord AuditFor(const Principal& who, const std::string& action, const std::string& target,
                         const std::string& team) {
  return AuditOf(who.Name(), who.token_id, action, target, team);
}

v1::AuditRecord Decided(v1::AuditRecord audit, const absl::Status& outcome) {
  audit.set_decision(outcome.ok() ? "allowed" : "denied");
  if (!outcome.ok()) {
    audit.set_reason(
        absl::StrCat(absl::StatusCodeToString(outcome.code()), ": ", outcome.message()));
  }
  return audit;
}

}  // namespace stoker
