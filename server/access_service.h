// gRPC front of identity: AccessService (who am I, tokens, users, teams, worker join tokens, the
// audit log). Calls are read through server/checked_calls.h, authorized by the one table
// (server/access/authorize.h), and every change, allowed or denied, leaves an audit row: an
// allowed one in the change's own transaction (AccessStore).
#ifndef STOKER_SERVER_ACCESS_SERVICE_H_
#define STOKER_SERVER_ACCESS_SERVICE_H_

#include <functional>

#include "server/access/access_store.h"
#include "server/access/authenticator.h"
#include "server/access/authorize.h"
#include "server/coordinator.h"
#include "stoker.grpc.pb.h"

namespace stoker {

class AccessServiceImpl final : public v1::AccessService::Service {
 public:
  // `coordinator` gives the teams' usage for ListQuotas.
  AccessServiceImpl(Authenticator* auth, AccessStore* store, Coordinator* coordinator);

 private:
  grpc::Status WhoAmI(const Principal& who, grpc::ServerContext*, const v1::WhoAmIRequest&,
                      v1::WhoAmIResponse* response);
  grpc::Status CreateToken(const Principal& who, grpc::ServerContext*,
                           const v1::CreateTokenRequest& request,
                           v1::CreateTokenResponse* response);
  grpc::Status ListTokens(const Principal& who, grpc::ServerContext*,
                          const v1::ListTokensRequest& request, v1::ListTokensResponse* response);
  grpc::Status RevokeToken(const Principal& who, grpc::ServerContext*,
                           const v1::RevokeTokenRequest& request, v1::TokenInfo* response);
  grpc::Status AddUser(const Principal& who, grpc::ServerContext*,
                       const v1::AddUserRequest& request, v1::AddUserResponse* response);
  grpc::Status DisableUser(const Principal& who, grpc::ServerContext*,
                           const v1::DisableUserRequest& request, v1::User* response);
  grpc::Status ListUsers(const Principal& who, grpc::ServerContext*, const v1::ListUsersRequest&,
                         v1::ListUsersResponse* response);
  grpc::Status CreateTeam(const Principal& who, grpc::ServerContext*,
                          const v1::CreateTeamRequest& request, v1::Team* response);
  grpc::Status SetTeamCap(const Principal& who, grpc::ServerContext*,
                          const v1::CreateTeamRequest& request, v1::Team* response);
  grpc::Status SetMember(const Principal& who, grpc::ServerContext*,
                         const v1::SetMemberRequest& request, v1::Team* response);
  grpc::Status RemoveMember(const Principal& who, grpc::ServerContext*,
                            const v1::RemoveMemberRequest& request, v1::Team* response);
  grpc::Status CreateJoinToken(const Principal& who, grpc::ServerContext*,
                               const v1::CreateJoinTokenRequest& request,
                               v1::CreateTokenResponse* response);
  grpc::Status ListAudit(const Principal& who, grpc::ServerContext*,
                         const v1::ListAuditRequest& request, v1::ListAuditResponse* response);
  grpc::Status SetQuota(const Principal& who, grpc::ServerContext*,
                        const v1::SetQuotaRequest& request, v1::TeamQuota* response);
  grpc::Status ListQuotas(const Principal& who, grpc::ServerContext*,
                          const v1::ListQuotasRequest& request, v1::ListQuotasResponse* response);

  // Runs `change` with `audit` if `allowed` is OK; otherwise, or when the change fails, appends
  // `audit` as denied with the reason. The answer either way.
  template <typename T>
  grpc::Status Audited(v1::AuditRecord audit, absl::Status allowed,
                       const std::function<absl::StatusOr<T>(v1::AuditRecord)>& change,
                       T* response);

  Authenticator* auth_;
  AccessStore* store_;
  Coordinator* coordinator_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_ACCESS_SERVICE_H_
