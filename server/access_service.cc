#include "server/access_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/audit_log.h"
#include "server/checked_calls.h"
#include "server/coordinator.h"
#include "spec/team_role.h"

namespace stoker {
namespace {

constexpr int64_t kMaxExpirySeconds = int64_t{10} * 365 * 24 * 3600;

// Expiry from "expires in N seconds" (0 = `default_seconds`; then 0 = never).
absl::StatusOr<int64_t> ExpiryMs(int64_t seconds, int64_t default_seconds) {
  if (seconds < 0 || seconds > kMaxExpirySeconds) {
    return absl::InvalidArgumentError("expires: between 1 second and 10 years");
  }
  if (seconds == 0) seconds = default_seconds;
  return seconds == 0 ? 0 : absl::ToUnixMillis(absl::Now()) + seconds * 1000;
}

absl::Status NeedsUser(const Principal& who, const char* what) {
  if (who.kind == Principal::Kind::kUser) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", who.KindName(), " caller is no user and cannot ", what,
      "; create the first admin with `stoker-server bootstrap-admin` and use its token"));
}

// A new token as the caller gets it: the secret (once) and what it is.
absl::StatusOr<v1::CreateTokenResponse> Handed(absl::StatusOr<AccessStore::NewToken> created) {
  if (!created.ok()) return created.status();
  v1::CreateTokenResponse out;
  out.set_secret(std::move(created->secret));
  *out.mutable_token() = std::move(created->info);
  return out;
}

}  // namespace

AccessServiceImpl::AccessServiceImpl(Authenticator* auth, AccessStore* store,
                                     Coordinator* coordinator)
    : auth_(auth), store_(store), coordinator_(coordinator) {
  const char* service = v1::AccessService::service_full_name();
  auto mark = [&](const char* method, grpc::internal::MethodHandler* handler) {
    MarkMethodStreamed(MethodIndex(service, method), handler);
  };
  mark("WhoAmI", CheckedUnary(this, auth_, &AccessServiceImpl::WhoAmI));
  mark("CreateToken", CheckedUnary(this, auth_, &AccessServiceImpl::CreateToken));
  mark("ListTokens", CheckedUnary(this, auth_, &AccessServiceImpl::ListTokens));
  mark("RevokeToken", CheckedUnary(this, auth_, &AccessServiceImpl::RevokeToken));
  mark("AddUser", CheckedUnary(this, auth_, &AccessServiceImpl::AddUser));
  mark("DisableUser", CheckedUnary(this, auth_, &AccessServiceImpl::DisableUser));
  mark("ListUsers", CheckedUnary(this, auth_, &AccessServiceImpl::ListUsers));
  mark("CreateTeam", CheckedUnary(this, auth_, &AccessServiceImpl::CreateTeam));
  mark("SetTeamCap", CheckedUnary(this, auth_, &AccessServiceImpl::SetTeamCap));
  mark("SetMember", CheckedUnary(this, auth_, &AccessServiceImpl::SetMember));
  mark("RemoveMember", CheckedUnary(this, auth_, &AccessServiceImpl::RemoveMember));
  mark("CreateJoinToken", CheckedUnary(this, auth_, &AccessServiceImpl::CreateJoinToken));
  mark("ListAudit", CheckedUnary(this, auth_, &AccessServiceImpl::ListAudit));
  mark("SetQuota", CheckedUnary(this, auth_, &AccessServiceImpl::SetQuota));
  mark("ListQuotas", CheckedUnary(this, auth_, &AccessServiceImpl::ListQuotas));
}

template <typename T>
grpc::Status AccessServiceImpl::Audited(
    v1::AuditRecord audit, absl::Status allowed,
    const std::function<absl::StatusOr<T>(v1::AuditRecord)>& change, T* response) {
  absl::StatusOr<T> result = allowed.ok() ? change(audit) : absl::StatusOr<T>(allowed);
  if (!result.ok()) {
    store_->AuditOutcome(std::move(audit), result.status());
    return ToGrpcStatus(result.status());
  }
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status AccessServiceImpl::WhoAmI(const Principal& who, grpc::ServerContext*,
                                       const v1::WhoAmIRequest&, v1::WhoAmIResponse* response) {
  if (absl::Status s = Authorize(who, Action::kWhoAmI, {}); !s.ok()) return ToGrpcStatus(s);
  response->set_kind(who.KindName());
  response->set_token_id(who.token_id);
  if (who.kind == Principal::Kind::kUser) {
    absl::StatusOr<v1::User> user = store_->GetUser(who.user);
    if (!user.ok()) return ToGrpcStatus(user.status());
    *response->mutable_user() = std::move(*user);
  } else {
    response->mutable_user()->set_name(who.Name());
    response->mutable_user()->set_cluster_admin(true);
  }
  return grpc::Status::OK;
}

grpc::Status AccessServiceImpl::CreateToken(const Principal& who, grpc::ServerContext*,
                                            const v1::CreateTokenRequest& request,
                                            v1::CreateTokenResponse* response) {
  const bool other = !request.user().empty() && request.user() != who.user;
  absl::Status allowed = Authorize(who, other ? Action::kOtherTokens : Action::kOwnTokens, {});
  if (allowed.ok() && !other) allowed = NeedsUser(who, "own tokens");
  const std::string user = other ? request.user() : who.user;
  if (allowed.ok() && other) {
    absl::StatusOr<v1::User> found = store_->GetUser(user);
    allowed = found.status();
    if (found.ok() && found->disabled()) {
      allowed = absl::FailedPreconditionError(absl::StrCat("user '", user, "' is disabled"));
    }
  }
  absl::StatusOr<int64_t> expires = ExpiryMs(request.expires_in_seconds(), 0);
  if (allowed.ok()) allowed = expires.status();
  v1::AuditRecord audit = AuditFor(who, "token.create", "");
  audit.set_reason(absl::StrCat("for ", user));
  return Audited<v1::CreateTokenResponse>(
      audit, allowed,
      [&](v1::AuditRecord audit) -> absl::StatusOr<v1::CreateTokenResponse> {
        v1::TokenInfo token;
        token.set_kind("user");
        token.set_user(user);
        token.set_name(request.name());
        token.set_expires_unix_ms(*expires);
        return Handed(store_->CreateToken(token, audit));
      },
      response);
}

grpc::Status AccessServiceImpl::ListTokens(const Principal& who, grpc::ServerContext*,
                                           const v1::ListTokensRequest& request,
                                           v1::ListTokensResponse* response) {
  const bool others = request.all() || (!request.user().empty() && request.user() != who.user);
  absl::Status allowed = Authorize(who, others ? Action::kOtherTokens : Action::kOwnTokens, {});
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  // Open and legacy callers have no tokens of their own: they see everyone's.
  const std::string user =
      request.all() ? "" : (!request.user().empty() ? request.user() : who.user);
  absl::StatusOr<std::vector<v1::TokenInfo>> tokens = store_->ListTokens(user);
  if (!tokens.ok()) return ToGrpcStatus(tokens.status());
  for (v1::TokenInfo& token : *tokens) *response->add_tokens() = std::move(token);
  return grpc::Status::OK;
}

grpc::Status AccessServiceImpl::RevokeToken(const Principal& who, grpc::ServerContext*,
                                            const v1::RevokeTokenRequest& request,
                                            v1::TokenInfo* response) {
  absl::StatusOr<v1::TokenInfo> token = store_->GetToken(request.id());
  absl::Status allowed = Authorize(who, Action::kOwnTokens, {});
  if (allowed.ok()) allowed = token.status();
  if (allowed.ok()) {
    const bool own =
        token->kind() == "user" && who.kind == Principal::Kind::kUser && token->user() == who.user;
    allowed = Authorize(who, own ? Action::kOwnTokens : Action::kOtherTokens, {});
    // Another user's token is as unknown as a missing one to a caller who may not revoke it.
    if (absl::IsPermissionDenied(allowed)) {
      allowed = absl::NotFoundError(absl::StrCat("no token '", request.id(), "'"));
    }
  }
  return Audited<v1::TokenInfo>(
      AuditFor(who, "token.revoke", request.id()), allowed,
      [&](v1::AuditRecord audit) { return store_->RevokeToken(request.id(), audit); }, response);
}

grpc::Status AccessServiceImpl::AddUser(const Principal& who, grpc::ServerContext*,
                                        const v1::AddUserRequest& request,
                                        v1::AddUserResponse* response) {
  Resource resource;
  resource.team = request.team();
  absl::Status allowed = Authorize(who, Action::kAddUser, resource);
  if (allowed.ok() && request.cluster_admin() && !who.IsClusterAdmin()) {
    allowed = absl::PermissionDeniedError("only a cluster admin may make cluster admins");
  }
  if (allowed.ok() && request.team().empty() && request.role() != v1::TEAM_ROLE_UNSPECIFIED) {
    allowed = absl::InvalidArgumentError("a role needs a team (--team)");
  }
  absl::StatusOr<int64_t> expires = ExpiryMs(request.token_expires_in_seconds(), 0);
  if (allowed.ok()) allowed = expires.status();
  return Audited<v1::AddUserResponse>(
      AuditFor(who, "user.add", request.name(), request.team()), allowed,
      [&](v1::AuditRecord audit) { return store_->AddUser(request, *expires, audit); }, response);
}

grpc::Status AccessServiceImpl::DisableUser(const Principal& who, grpc::ServerContext*,
                                            const v1::DisableUserRequest& request,
                                            v1::User* response) {
  absl::Status allowed = Authorize(who, Action::kDisableUser, {});
  if (allowed.ok() && who.kind == Principal::Kind::kUser && request.name() == who.user) {
    allowed =
        absl::FailedPreconditionError("you cannot disable yourself (another cluster admin can)");
  }
  return Audited<v1::User>(
      AuditFor(who, "user.disable", request.name()), allowed,
      [&](v1::AuditRecord audit) { return store_->DisableUser(request.name(), audit); }, response);
}

grpc::Status AccessServiceImpl::ListUsers(const Principal& who, grpc::ServerContext*,
                                          const v1::ListUsersRequest&,
                                          v1::ListUsersResponse* response) {
  if (absl::Status s = Authorize(who, Action::kListUsers, {}); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<v1::ListUsersResponse> users = store_->ListUsers();
  if (!users.ok()) return ToGrpcStatus(users.status());
  *response = std::move(*users);
  return grpc::Status::OK;
}

grpc::Status AccessServiceImpl::CreateTeam(const Principal& who, grpc::ServerContext*,
                                           const v1::CreateTeamRequest& request,
                                           v1::Team* response) {
  return Audited<v1::Team>(
      AuditFor(who, "team.create", request.name(), request.name()),
      Authorize(who, Action::kCreateTeam, {}),
      [&](v1::AuditRecord audit) { return store_->CreateTeam(request, audit); }, response);
}

grpc::Status AccessServiceImpl::SetTeamCap(const Principal& who, grpc::ServerContext*,
                                           const v1::CreateTeamRequest& request,
                                           v1::Team* response) {
  v1::AuditRecord audit = AuditFor(who, "team.cap", request.name(), request.name());
  audit.set_reason(absl::StrCat("max priority ", request.max_priority()));
  return Audited<v1::Team>(
      audit, Authorize(who, Action::kCreateTeam, {}),
      [&](v1::AuditRecord audit) { return store_->SetTeamCap(request, audit); }, response);
}

grpc::Status AccessServiceImpl::SetMember(const Principal& who, grpc::ServerContext*,
                                          const v1::SetMemberRequest& request, v1::Team* response) {
  Resource resource;
  resource.team = request.team();
  v1::AuditRecord audit = AuditFor(who, "team.add", request.user(), request.team());
  audit.set_reason(RoleName(request.role() == v1::TEAM_ROLE_UNSPECIFIED ? v1::TEAM_ROLE_MEMBER
                                                                        : request.role()));
  return Audited<v1::Team>(
      audit, Authorize(who, Action::kManageTeam, resource),
      [&](v1::AuditRecord audit) { return store_->SetMember(request, audit); }, response);
}

grpc::Status AccessServiceImpl::RemoveMember(const Principal& who, grpc::ServerContext*,
                                             const v1::RemoveMemberRequest& request,
                                             v1::Team* response) {
  Resource resource;
  resource.team = request.team();
  return Audited<v1::Team>(
      AuditFor(who, "team.remove", request.user(), request.team()),
      Authorize(who, Action::kManageTeam, resource),
      [&](v1::AuditRecord audit) { return store_->RemoveMember(request, audit); }, response);
}

grpc::Status AccessServiceImpl::CreateJoinToken(const Principal& who, grpc::ServerContext*,
                                                const v1::CreateJoinTokenRequest& request,
                                                v1::CreateTokenResponse* response) {
  absl::Status allowed = Authorize(who, Action::kCreateJoinToken, {});
  const std::string pattern = request.worker_ids().empty() ? "*" : request.worker_ids();
  if (allowed.ok() && pattern.size() > 128) {
    allowed = absl::InvalidArgumentError("worker ids: a pattern of at most 128 characters");
  }
  absl::StatusOr<int64_t> expires = ExpiryMs(request.expires_in_seconds(), 3600);
  if (allowed.ok()) allowed = expires.status();
  v1::AuditRecord audit = AuditFor(who, "worker.join-token", "");
  audit.set_reason(absl::StrCat("worker ids '", pattern, "'"));
  return Audited<v1::CreateTokenResponse>(
      audit, allowed,
      [&](v1::AuditRecord audit) -> absl::StatusOr<v1::CreateTokenResponse> {
        v1::TokenInfo token;
        token.set_kind("join");
        token.set_user(who.Name());
        token.set_name(request.name());
        token.set_expires_unix_ms(*expires);
        token.set_worker_ids(pattern);
        return Handed(store_->CreateToken(token, audit));
      },
      response);
}

grpc::Status AccessServiceImpl::ListAudit(const Principal& who, grpc::ServerContext*,
                                          const v1::ListAuditRequest& request,
                                          v1::ListAuditResponse* response) {
  if (absl::Status s = Authorize(who, Action::kReadAudit, {}); !s.ok()) return ToGrpcStatus(s);
  if (request.limit() < 0 || request.limit() > 100000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "limit: between 0 and 100000");
  }
  AuditQuery query;
  query.since_unix_ms = request.since_unix_ms();
  query.user = request.user();
  query.limit = request.limit();
  if (!who.IsClusterAdmin()) {
    // A team admin reads its teams' rows and its own.
    query.teams_only = true;
    query.also_user = who.Name();
    for (const auto& [team, role] : who.teams) {
      if (role == v1::TEAM_ROLE_ADMIN) query.teams.push_back(team);
    }
  }
  absl::StatusOr<std::vector<v1::AuditRecord>> records = store_->ReadAudit(query);
  if (!records.ok()) return ToGrpcStatus(records.status());
  for (v1::AuditRecord& record : *records) *response->add_records() = std::move(record);
  return grpc::Status::OK;
}

grpc::Status AccessServiceImpl::SetQuota(const Principal& who, grpc::ServerContext*,
                                         const v1::SetQuotaRequest& request,
                                         v1::TeamQuota* response) {
  v1::AuditRecord audit = AuditFor(who, "quota.set", request.team(), request.team());
  audit.set_reason(
      request.quota().resource().empty()
          ? absl::StrCat("weight ", request.weight())
          : absl::StrCat(request.quota().resource(), " nominal ", request.quota().nominal(),
                         " borrow ", request.quota().borrow(),
                         request.weight() > 0 ? absl::StrCat(" weight ", request.weight()) : ""));
  return Audited<v1::TeamQuota>(
      audit, Authorize(who, Action::kCreateTeam, {}),
      [&](v1::AuditRecord audit) { return store_->SetQuota(request, audit); }, response);
}

grpc::Status AccessServiceImpl::ListQuotas(const Principal& who, grpc::ServerContext*,
                                           const v1::ListQuotasRequest&,
                                           v1::ListQuotasResponse* response) {
  if (absl::Status s = Authorize(who, Action::kListUsers, {}); !s.ok()) return ToGrpcStatus(s);
  const std::map<std::string, ResourceAmounts> usage = coordinator_->TeamUsage();
  const std::map<std::string, double> shares = coordinator_->TeamShares();
  Quotas quotas = store_->AllQuotas();
  for (const auto& [team, share] : shares) {
    if (!team.empty()) quotas.try_emplace(team);  // teams that ran lately, without quotas
  }
  for (auto& [team, quota] : quotas) {
    const auto share = shares.find(team);
    if (quota.empty() && quota.weight == 1 && share == shares.end()) continue;
    v1::TeamQuota* out = response->add_teams();
    out->set_team(team);
    out->set_weight(quota.weight);
    if (share != shares.end()) out->set_share(share->second);
    const auto used = usage.find(team);
    const ResourceAmounts amounts = used == usage.end() ? ResourceAmounts() : used->second;
    for (const auto& [resource, in_use] : {std::pair<const char*, int64_t>{"gpus", amounts.gpus},
                                           {"cpus", amounts.cpus},
                                           {"memory", amounts.memory_bytes}}) {
      const std::optional<QuotaLimit>& limit = *LimitOf(quota, resource);
      if (!limit.has_value()) continue;
      v1::ResourceQuota* q = out->add_quotas();
      q->set_resource(resource);
      q->set_nominal(limit->nominal);
      q->set_borrow(limit->borrow);
      q->set_used(in_use);
    }
  }
  return grpc::Status::OK;
}

}  // namespace stoker
