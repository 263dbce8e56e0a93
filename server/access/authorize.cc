#include "server/access/authorize.h"

#include <fnmatch.h>

#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

using Kind = Principal::Kind;

absl::Status Denied(const std::string& why) { return absl::PermissionDeniedError(why); }

// Which tokens may ask for which actions at all: users the job and access services, workers
// the worker service, join tokens only the join.
absl::Status CheckTokenKind(const Principal& who, Action action) {
  const bool worker_action = action == Action::kWorkerCall || action == Action::kJoinWorker;
  switch (who.kind) {
    case Kind::kOpen:
    case Kind::kLegacy:
      return absl::OkStatus();
    case Kind::kUser:
      if (worker_action) {
        return Denied(
            "a user token cannot call the worker service; a worker joins with a join token "
            "(stoker worker join-token)");
      }
      return absl::OkStatus();
    case Kind::kWorker:
      if (action != Action::kWorkerCall) {
        return Denied("a worker token can only call the worker service");
      }
      return absl::OkStatus();
    case Kind::kJoin:
      if (action != Action::kJoinWorker) {
        return Denied(
            "a join token only joins a worker (stoker-worker --join-token-file); it is not a "
            "user or worker token");
      }
      return absl::OkStatus();
  }
  return Denied("unknown kind of token");
}

// May see the job at all: cluster admins, its owner, anyone in its team.
bool MaySee(const Principal& who, const Resource& job) {
  if (who.IsClusterAdmin()) return true;
  if (!job.owner.empty() && job.owner == who.user) return true;
  return !job.team.empty() && who.RoleIn(job.team) != v1::TEAM_ROLE_UNSPECIFIED;
}

// May act on it: cluster admins, its owner, its team's admins.
bool MayManage(const Principal& who, const Resource& job) {
  if (who.IsClusterAdmin()) return true;
  if (!job.owner.empty() && job.owner == who.user) return true;
  return !job.team.empty() && who.RoleIn(job.team) == v1::TEAM_ROLE_ADMIN;
}

absl::Status JobAction(const Principal& who, Action action, const Resource& job) {
  if (!MaySee(who, job)) return absl::NotFoundError(absl::StrCat("no job '", job.id, "'"));
  if (action == Action::kViewJob || MayManage(who, job)) return absl::OkStatus();
  const char* verb = action == Action::kCancelJob ? "cancel it" : "read its logs or weights";
  const std::string owner = job.owner.empty() ? "none" : job.owner;
  if (job.team.empty()) {
    return Denied(absl::StrCat("only the job's owner (", owner, ") or a cluster admin may ", verb));
  }
  return Denied(absl::StrCat("only the job's owner (", owner, "), an admin of team '", job.team,
                             "' or a cluster admin may ", verb));
}

absl::Status Submit(const Principal& who, const Resource& r) {
  if (who.IsClusterAdmin()) return absl::OkStatus();
  if (r.team.empty()) return Denied("a job needs a team (job file `team:` or --team)");
  const v1::TeamRole role = who.RoleIn(r.team);
  if (role == v1::TEAM_ROLE_UNSPECIFIED) {
    return Denied(absl::StrCat("user '", who.user, "' is not in team '", r.team, "'"));
  }
  if (role == v1::TEAM_ROLE_VIEWER) {
    return Denied(absl::StrCat("user '", who.user, "' is a viewer of team '", r.team,
                               "' and cannot submit; a team admin can make it a member"));
  }
  if (r.priority > r.max_priority) {
    return Denied(absl::StrCat("priority ", r.priority, " is above team '", r.team, "''s cap of ",
                               r.max_priority, " (a cluster admin sets it: stoker team cap)"));
  }
  return absl::OkStatus();
}

absl::Status ClusterAdminOnly(const Principal& who, const char* what) {
  if (who.IsClusterAdmin()) return absl::OkStatus();
  return Denied(absl::StrCat("only a cluster admin may ", what));
}

}  // namespace

std::string Principal::Name() const {
  switch (kind) {
    case Kind::kUser:
      return user;
    case Kind::kWorker:
    case Kind::kJoin:
      return absl::StrCat("worker:", token_id);
    default:
      return KindName();  // "open", "legacy"
  }
}

std::string Principal::KindName() const {
  switch (kind) {
    case Kind::kOpen:
      return "open";
    case Kind::kLegacy:
      return "legacy";
    case Kind::kUser:
      return "user";
    case Kind::kWorker:
      return "worker";
    case Kind::kJoin:
      return "join";
  }
  return "";
}

v1::TeamRole Principal::RoleIn(const std::string& team) const {
  auto it = teams.find(team);
  return it == teams.end() ? v1::TEAM_ROLE_UNSPECIFIED : it->second;
}

bool WorkerIdAllowed(const std::string& pattern, const std::string& worker_id) {
  return fnmatch(pattern.empty() ? "*" : pattern.c_str(), worker_id.c_str(), 0) == 0;
}

absl::Status Authorize(const Principal& who, Action action, const Resource& r) {
  if (absl::Status kind = CheckTokenKind(who, action); !kind.ok()) return kind;
  switch (action) {
    case Action::kSubmitJob:
      return Submit(who, r);
    case Action::kViewJob:
    case Action::kReadJob:
    case Action::kCancelJob:
      return JobAction(who, action, r);
    case Action::kListJobs:
    case Action::kListWorkers:
    case Action::kWhoAmI:
    case Action::kOwnTokens:
    case Action::kListUsers:
      return absl::OkStatus();
    case Action::kOtherTokens:
      return ClusterAdminOnly(who, "see or revoke another user's tokens");
    case Action::kAddUser:
      if (who.IsClusterAdmin() || (!r.team.empty() && who.RoleIn(r.team) == v1::TEAM_ROLE_ADMIN)) {
        return absl::OkStatus();
      }
      return Denied(
          "only a cluster admin, or a team admin adding the user to its own team (--team), "
          "may add users");
    case Action::kDisableUser:
      return ClusterAdminOnly(who, "disable users");
    case Action::kCreateTeam:
      return ClusterAdminOnly(who, "create teams or set their caps");
    case Action::kManageTeam:
      if (who.IsClusterAdmin() || who.RoleIn(r.team) == v1::TEAM_ROLE_ADMIN) {
        return absl::OkStatus();
      }
      return Denied(absl::StrCat("only an admin of team '", r.team,
                                 "' or a cluster admin may change its members"));
    case Action::kReadAudit: {
      if (who.IsClusterAdmin()) return absl::OkStatus();
      for (const auto& [team, role] : who.teams) {
        if (role == v1::TEAM_ROLE_ADMIN) return absl::OkStatus();
      }
      return Denied("only cluster admins and team admins may read the audit log");
    }
    case Action::kCreateJoinToken:
      return ClusterAdminOnly(who, "create worker join tokens");
    case Action::kWorkerCall:
    case Action::kJoinWorker:
      if (who.kind == Kind::kOpen || who.kind == Kind::kLegacy ||
          WorkerIdAllowed(who.worker_ids, r.worker_id)) {
        return absl::OkStatus();
      }
      return Denied(absl::StrCat("this ", who.KindName(), " token allows worker ids '",
                                 who.worker_ids, "', not '", r.worker_id, "'"));
  }
  return Denied("unknown action");
}

}  // namespace stoker
