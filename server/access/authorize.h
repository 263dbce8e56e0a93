// Who may do what: the callers (Principal) and the one table that decides (Authorize). Pure
// functions over the caller and the resource, no I/O: the services look the resource up, ask,
// and act. docs/authorization.md writes the same table out; authorize_test.cc and
// tests/access_test.cc check it cell by cell.
#ifndef STOKER_SERVER_ACCESS_AUTHORIZE_H_
#define STOKER_SERVER_ACCESS_AUTHORIZE_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "stoker.pb.h"

namespace stoker {

struct Principal {
  enum class Kind {
    kOpen,    // a server with neither users nor a --token-file: anyone, as a cluster admin
    kLegacy,  // the shared --token-file token: a cluster admin and a worker (legacy mode)
    kUser,    // a user token
    kWorker,  // a worker token, bound to worker ids
    kJoin,    // a single-use worker join token
  };
  Kind kind = Kind::kOpen;
  std::string user;  // kUser: the user's name
  std::string token_id;
  bool cluster_admin = false;  // kUser
  std::map<std::string, v1::TeamRole> teams;
  std::string worker_ids;  // kWorker, kJoin: a glob over worker ids

  bool IsClusterAdmin() const {
    return kind == Kind::kOpen || kind == Kind::kLegacy || cluster_admin;
  }
  // As the audit log and job owners name it: the user, "legacy", "open" or "worker:<token id>".
  std::string Name() const;
  // The caller's role in `team` (UNSPECIFIED when not in it).
  v1::TeamRole RoleIn(const std::string& team) const;
  // "user", "legacy", "open", "worker" or "join".
  std::string KindName() const;
};

enum class Action {
  kSubmitJob,  // resource: team, priority, max_priority
  kViewJob,    // status, list: resource: id, owner, team
  kReadJob,    // logs, events, artifacts
  kCancelJob,
  kListJobs,  // what is listed is filtered by the service (MaySee's rule)
  kListWorkers,
  kWhoAmI,
  kOwnTokens,    // create, list, revoke one's own tokens
  kOtherTokens,  // list or revoke another user's
  kListUsers,
  kAddUser,  // resource: team (a team admin may add a user to its team)
  kDisableUser,
  kCreateTeam,
  kManageTeam,  // add, remove members; resource: team
  kReadAudit,   // a team admin reads its teams' rows only (the service filters)
  kCreateJoinToken,
  kWorkerCall,  // WorkerService; resource: worker_id
  kJoinWorker,  // resource: worker_id
};

// What the action is about; only the fields the action uses are read.
struct Resource {
  std::string id;  // a job id (for the NOT_FOUND message)
  std::string owner;
  std::string team;
  int priority = 0;
  int max_priority = 0;
  std::string worker_id;
};

// OK, or the refusal: UNAUTHENTICATED never (that is the Authenticator's), PERMISSION_DENIED
// naming what is missing, or NOT_FOUND ("no job 'j-000007'") for a job the caller may not see,
// exactly as for a job that does not exist.
absl::Status Authorize(const Principal& who, Action action, const Resource& resource);

// Worker ids allowed by a glob ('*', '?', '[...]', as fnmatch).
bool WorkerIdAllowed(const std::string& pattern, const std::string& worker_id);

}  // namespace stoker

#endif  // STOKER_SERVER_ACCESS_AUTHORIZE_H_
