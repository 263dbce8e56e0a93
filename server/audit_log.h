// The audit log: one row per user or admin request that changes state (submit, cancel, tokens,
// users, teams, worker registration and join), allowed or denied. It is a table of the job store's
// database, written by whoever makes the change inside the change's own transaction, so that a
// kill -9 never leaves a change without its row (docs/authorization.md).
#ifndef STOKER_SERVER_AUDIT_LOG_H_
#define STOKER_SERVER_AUDIT_LOG_H_

#include <sqlite3.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/access/authorize.h"
#include "stoker.pb.h"

namespace stoker {

// CREATE TABLE IF NOT EXISTS for the audit table.
absl::Status CreateAuditTable(sqlite3* db);

// Appends `record` (its seq is assigned; time_unix_ms 0 means now). Call inside the transaction
// of the change it records.
absl::Status AppendAudit(sqlite3* db, const v1::AuditRecord& record);

// Rows at or after `since_unix_ms`, oldest first; only `user`'s when it is not empty; only rows
// of `teams` (or whose principal is `also_user`) when `teams_only` is set; at most `limit`, the
// newest ones.
struct AuditQuery {
  int64_t since_unix_ms = 0;
  std::string user;
  bool teams_only = false;
  std::vector<std::string> teams;
  std::string also_user;
  int limit = 1000;
};
absl::StatusOr<std::vector<v1::AuditRecord>> ReadAudit(sqlite3* db, const AuditQuery& query);

// An audit record of `action` on `target` by `principal`, not yet decided.
v1::AuditRecord AuditOf(const std::string& principal, const std::string& token_id,
                        const std::string& action, const std::string& target,
                        const std::string& team = "");
// The same for a caller (its Name() and token id).
v1::AuditRecord AuditFor(const Principal& who, const std::string& action, const std::string& target,
                         const std::string& team = "");
// `audit` decided by `outcome`: "allowed" when OK, else "denied" with the code and message as
// its reason.
v1::AuditRecord Decided(v1::AuditRecord audit, const absl::Status& outcome);

}  // namespace stoker

#endif  // STOKER_SERVER_AUDIT_LOG_H_
