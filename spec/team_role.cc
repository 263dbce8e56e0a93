#include "spec/team_role.h"

#include "absl/strings/str_cat.h"

namespace stoker {

std::string RoleName(v1::TeamRole role) {
  switch (role) {
    case v1::TEAM_ROLE_VIEWER:
      return "viewer";
    case v1::TEAM_ROLE_MEMBER:
      return "member";
    case v1::TEAM_ROLE_ADMIN:
      return "admin";
    default:
      return "none";
  }
}

absl::StatusOr<v1::TeamRole> ParseRole(const std::string& name) {
  if (name == "viewer") return v1::TEAM_ROLE_VIEWER;
  if (name == "member" || name.empty()) return v1::TEAM_ROLE_MEMBER;
  if (name == "admin") return v1::TEAM_ROLE_ADMIN;
  return absl::InvalidArgumentError(
      absl::StrCat("role '", name, "': one of viewer, member, admin"));
}

}  // namespace stoker
