// A team role's name ("viewer", "member", "admin") and back, shared by the CLI's flags, the
// server's listings and its audit rows (docs/authorization.md).
#ifndef STOKER_SPEC_TEAM_ROLE_H_
#define STOKER_SPEC_TEAM_ROLE_H_

#include <string>

#include "absl/status/statusor.h"
#include "stoker.pb.h"

namespace stoker {

// "viewer", "member", "admin"; "none" for TEAM_ROLE_UNSPECIFIED.
std::string RoleName(v1::TeamRole role);
// The role named `name` ("" = member); INVALID_ARGUMENT "role 'x': one of viewer, member, admin".
absl::StatusOr<v1::TeamRole> ParseRole(const std::string& name);

}  // namespace stoker

#endif  // STOKER_SPEC_TEAM_ROLE_H_
