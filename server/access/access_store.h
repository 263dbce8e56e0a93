// Users, teams, memberships and tokens, in the job store's database (its own connection, so that
// identity calls never wait on the coordinator's lock). Tokens are kept as the SHA-256 of their
// secret, with expiry, last use and revocation; a secret is returned once, when it is created.
// Every change appends its audit row (server/audit_log.h) in its own transaction. Thread-safe.
#ifndef STOKER_SERVER_ACCESS_ACCESS_STORE_H_
#define STOKER_SERVER_ACCESS_ACCESS_STORE_H_

#include <sqlite3.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/audit_log.h"
#include "server/policy/quota.h"
#include "stoker.pb.h"

namespace stoker {

class Statement;

// INVALID_ARGUMENT unless `name` is 1 to 64 characters of [a-z0-9._-] starting with a letter or
// digit, and not one of the principal names the server uses itself ("legacy", "open").
// `what` names it in the message ("user name").
absl::Status ValidateName(absl::string_view what, const std::string& name);

class AccessStore {
 public:
  static absl::StatusOr<std::unique_ptr<AccessStore>> Open(const std::string& path);
  ~AccessStore();

  struct NewToken {
    std::string secret;  // shown once; only its hash is stored
    v1::TokenInfo info;
  };

  // --- Reads
  absl::StatusOr<bool> HasUsers();
  // The token whose secret hashes to `hash` (HashSecret); NOT_FOUND when none.
  absl::StatusOr<v1::TokenInfo> FindToken(absl::string_view hash);
  absl::StatusOr<v1::TokenInfo> GetToken(const std::string& id);
  // With its memberships. NOT_FOUND "no user 'x'".
  absl::StatusOr<v1::User> GetUser(const std::string& name);
  // With its members. NOT_FOUND "no team 'x'".
  absl::StatusOr<v1::Team> GetTeam(const std::string& name);
  absl::StatusOr<v1::ListUsersResponse> ListUsers();
  // `user`'s tokens ("" = everyone's), newest first.
  absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(const std::string& user);
  absl::StatusOr<std::vector<v1::AuditRecord>> ReadAudit(const AuditQuery& query);

  // Sets the token's last use (the caller limits how often: each is a write).
  absl::Status TouchToken(const std::string& id, int64_t now_unix_ms);

  // --- Changes: each writes `audit` (decision "allowed") in its transaction, or changes nothing
  // and returns why (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION).
  // The user (and its membership) with a first token, in one transaction.
  absl::StatusOr<v1::AddUserResponse> AddUser(const v1::AddUserRequest& request,
                                              int64_t token_expires_unix_ms, v1::AuditRecord audit);
  absl::StatusOr<v1::User> DisableUser(const std::string& name, v1::AuditRecord audit);
  absl::StatusOr<v1::Team> CreateTeam(const v1::CreateTeamRequest& request, v1::AuditRecord audit);
  absl::StatusOr<v1::Team> SetTeamCap(const v1::CreateTeamRequest& request, v1::AuditRecord audit);
  absl::StatusOr<v1::Team> SetMember(const v1::SetMemberRequest& request, v1::AuditRecord audit);
  absl::StatusOr<v1::Team> RemoveMember(const v1::RemoveMemberRequest& request,
                                        v1::AuditRecord audit);
  // A token of `token.kind()` ("user", "worker" or "join") for `token.user()`, with its name,
  // expiry and worker_ids; id, secret and creation time are made here.
  absl::StatusOr<NewToken> CreateToken(const v1::TokenInfo& token, v1::AuditRecord audit);
  // FAILED_PRECONDITION when already revoked.
  absl::StatusOr<v1::TokenInfo> RevokeToken(const std::string& id, v1::AuditRecord audit);
  // Marks the join token `join_id` used and creates a worker token with its worker_ids, in one
  // transaction: of two workers racing with one join token, one gets FAILED_PRECONDITION.
  absl::StatusOr<NewToken> RedeemJoinToken(const std::string& join_id, v1::AuditRecord audit);
  // The first cluster admin `admin` and a token for it: new, or `admin_secret` when given (a
  // deployment's secret file, "stku_" and at least 32 more characters). With `join_secret`
  // ("stkj_..."), also a join token for any worker id, usable until `join_expires_unix_ms`.
  // FAILED_PRECONDITION when a cluster admin exists already; INVALID_ARGUMENT for a bad name or
  // secret.
  absl::StatusOr<NewToken> Bootstrap(const std::string& admin, const std::string& admin_secret = "",
                                     const std::string& join_secret = "",
                                     int64_t join_expires_unix_ms = 0);
  // Sets (or with a negative nominal removes) `team`'s quota on `request.quota().resource()`.
  // INVALID_ARGUMENT for an unknown resource or a negative borrowing limit, NOT_FOUND for an
  // unknown team. A quota below what the team uses now is allowed: its running jobs go on, and
  // no new job of the team starts until it is back under.
  absl::StatusOr<v1::TeamQuota> SetQuota(const v1::SetQuotaRequest& request, v1::AuditRecord audit);
  // Every team's quotas (kept in memory, read from the store at Open and updated by SetQuota).
  Quotas AllQuotas();

  // A row on its own: a denied or failed request, which changed nothing.
  absl::Status Audit(const v1::AuditRecord& record);
  // Audit(Decided(audit, outcome)) for a request whose own change (if any) is not in this store;
  // a row that cannot be written is logged ("stoker-server: cannot write an audit row: ...").
  void AuditOutcome(v1::AuditRecord audit, const absl::Status& outcome);

 private:
  explicit AccessStore(sqlite3* db) : db_(db) {}
  absl::Status Error(const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps `query` to its one row: NOT_FOUND "no `what` '`key`'" when there is none.
  absl::Status StepToRow(Statement& query, absl::string_view what, absl::string_view key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::User> GetUserLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::Team> GetTeamLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::TokenInfo> QueryToken(const char* where, absl::string_view value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `secret` empty: a new one.
  absl::StatusOr<NewToken> InsertToken(v1::TokenInfo token, std::string secret = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddMemberLocked(const std::string& team, const std::string& user, v1::TeamRole role)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status LoadQuotas() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_PT_GUARDED_BY(mu_);
  Quotas quotas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stoker

#endif  // STOKER_SERVER_ACCESS_ACCESS_STORE_H_
