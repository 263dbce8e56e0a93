// The authorization table, cell by cell: three users in two teams, a cluster admin, a worker, a
// join token, and the legacy and open callers, against every action (docs/authorization.md).
#include "server/access/authorize.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stoker {
namespace {

Principal User(const std::string& name, std::map<std::string, v1::TeamRole> teams,
               bool admin = false) {
  Principal p;
  p.kind = Principal::Kind::kUser;
  p.user = name;
  p.token_id = "tok-" + name;
  p.teams = std::move(teams);
  p.cluster_admin = admin;
  return p;
}

Principal Worker(const std::string& pattern, Principal::Kind kind = Principal::Kind::kWorker) {
  Principal p;
  p.kind = kind;
  p.token_id = "tok-w";
  p.worker_ids = pattern;
  return p;
}

// alice: admin of vision; bob: member of vision; carol: viewer of vision, member of nlp;
// dave: member of nlp; root: cluster admin in no team.
const Principal kAlice = User("alice", {{"vision", v1::TEAM_ROLE_ADMIN}});
const Principal kBob = User("bob", {{"vision", v1::TEAM_ROLE_MEMBER}});
const Principal kCarol =
    User("carol", {{"vision", v1::TEAM_ROLE_VIEWER}, {"nlp", v1::TEAM_ROLE_MEMBER}});
const Principal kDave = User("dave", {{"nlp", v1::TEAM_ROLE_MEMBER}});
const Principal kRoot = User("root", {}, /*admin=*/true);

Resource BobsVisionJob() {
  Resource r;
  r.id = "j-000001";
  r.owner = "bob";
  r.team = "vision";
  return r;
}

absl::StatusCode Code(const Principal& who, Action action, const Resource& r) {
  return Authorize(who, action, r).code();
}

TEST(AuthorizeTest, JobActionsByRole) {
  const Resource job = BobsVisionJob();
  struct Row {
    const Principal* who;
    absl::StatusCode view, read, cancel;
  };
  using C = absl::StatusCode;
  const std::vector<Row> rows = {
      {&kBob, C::kOk, C::kOk, C::kOk},                                // owner
      {&kAlice, C::kOk, C::kOk, C::kOk},                              // team admin
      {&kCarol, C::kOk, C::kPermissionDenied, C::kPermissionDenied},  // team viewer
      {&kDave, C::kNotFound, C::kNotFound, C::kNotFound},             // other team
      {&kRoot, C::kOk, C::kOk, C::kOk},                               // cluster admin
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.who->user);
    EXPECT_EQ(Code(*row.who, Action::kViewJob, job), row.view);
    EXPECT_EQ(Code(*row.who, Action::kReadJob, job), row.read);
    EXPECT_EQ(Code(*row.who, Action::kCancelJob, job), row.cancel);
  }
  // Another member of the job's team sees it but may not act on it.
  const Principal eve = User("eve", {{"vision", v1::TEAM_ROLE_MEMBER}});
  EXPECT_EQ(Code(eve, Action::kViewJob, job), absl::StatusCode::kOk);
  EXPECT_EQ(Code(eve, Action::kCancelJob, job), absl::StatusCode::kPermissionDenied);
  // Not visible: exactly the store's message for a missing job.
  EXPECT_EQ(Authorize(kDave, Action::kViewJob, job).message(), "no job 'j-000001'");
  const std::string denied(Authorize(kCarol, Action::kCancelJob, job).message());
  EXPECT_NE(denied.find("owner (bob)"), std::string::npos) << denied;
  EXPECT_NE(denied.find("team 'vision'"), std::string::npos) << denied;
}

TEST(AuthorizeTest, SubmitNeedsMemberRoleAndRespectsTheCap) {
  Resource vision;
  vision.team = "vision";
  vision.priority = 3;
  vision.max_priority = 5;
  EXPECT_TRUE(Authorize(kBob, Action::kSubmitJob, vision).ok());
  EXPECT_TRUE(Authorize(kAlice, Action::kSubmitJob, vision).ok());
  EXPECT_EQ(Code(kCarol, Action::kSubmitJob, vision), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(kDave, Action::kSubmitJob, vision), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(kRoot, Action::kSubmitJob, vision).ok());
  vision.priority = 6;
  const absl::Status capped = Authorize(kBob, Action::kSubmitJob, vision);
  EXPECT_EQ(capped.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(capped.message().find("cap of 5"), absl::string_view::npos) << capped;
  EXPECT_TRUE(Authorize(kRoot, Action::kSubmitJob, vision).ok()) << "cluster admins set caps";
}

TEST(AuthorizeTest, AdminActions) {
  Resource vision;
  vision.team = "vision";
  Resource nlp;
  nlp.team = "nlp";
  using C = absl::StatusCode;
  EXPECT_EQ(Code(kRoot, Action::kAddUser, {}), C::kOk);
  EXPECT_EQ(Code(kAlice, Action::kAddUser, vision), C::kOk);
  EXPECT_EQ(Code(kAlice, Action::kAddUser, nlp), C::kPermissionDenied);
  EXPECT_EQ(Code(kAlice, Action::kAddUser, {}), C::kPermissionDenied);
  EXPECT_EQ(Code(kBob, Action::kAddUser, vision), C::kPermissionDenied);
  EXPECT_EQ(Code(kAlice, Action::kManageTeam, vision), C::kOk);
  EXPECT_EQ(Code(kAlice, Action::kManageTeam, nlp), C::kPermissionDenied);
  EXPECT_EQ(Code(kBob, Action::kManageTeam, vision), C::kPermissionDenied);
  for (Action only_root : {Action::kDisableUser, Action::kCreateTeam, Action::kCreateJoinToken,
                           Action::kOtherTokens}) {
    EXPECT_EQ(Code(kRoot, only_root, {}), C::kOk);
    EXPECT_EQ(Code(kAlice, only_root, {}), C::kPermissionDenied);
    EXPECT_EQ(Code(kBob, only_root, {}), C::kPermissionDenied);
  }
  EXPECT_EQ(Code(kRoot, Action::kReadAudit, {}), C::kOk);
  EXPECT_EQ(Code(kAlice, Action::kReadAudit, {}), C::kOk);  // its teams' rows (filtered)
  EXPECT_EQ(Code(kBob, Action::kReadAudit, {}), C::kPermissionDenied);
  for (Action anyone : {Action::kWhoAmI, Action::kOwnTokens, Action::kListWorkers}) {
    EXPECT_EQ(Code(kBob, anyone, {}), C::kOk);
  }
}

TEST(AuthorizeTest, TokenKindsAreKeptApart) {
  Resource worker;
  worker.worker_id = "gpu-node-3";
  using C = absl::StatusCode;
  // Users cannot act as workers; workers and join tokens cannot act as users.
  EXPECT_EQ(Code(kRoot, Action::kWorkerCall, worker), C::kPermissionDenied);
  EXPECT_EQ(Code(kRoot, Action::kJoinWorker, worker), C::kPermissionDenied);
  const Principal w = Worker("gpu-node-*");
  EXPECT_EQ(Code(w, Action::kWorkerCall, worker), C::kOk);
  for (Action user_action :
       {Action::kSubmitJob, Action::kViewJob, Action::kCancelJob, Action::kListJobs,
        Action::kListWorkers, Action::kWhoAmI, Action::kOwnTokens, Action::kJoinWorker}) {
    EXPECT_EQ(Code(w, user_action, BobsVisionJob()), C::kPermissionDenied);
  }
  worker.worker_id = "laptop";
  EXPECT_EQ(Code(w, Action::kWorkerCall, worker), C::kPermissionDenied);
  const Principal join = Worker("gpu-node-?", Principal::Kind::kJoin);
  worker.worker_id = "gpu-node-3";
  EXPECT_EQ(Code(join, Action::kJoinWorker, worker), C::kOk);
  EXPECT_EQ(Code(join, Action::kWorkerCall, worker), C::kPermissionDenied);
  worker.worker_id = "gpu-node-13";
  EXPECT_EQ(Code(join, Action::kJoinWorker, worker), C::kPermissionDenied);
  // The legacy token and an open server are both: admin and any worker.
  for (Principal::Kind kind : {Principal::Kind::kLegacy, Principal::Kind::kOpen}) {
    Principal p;
    p.kind = kind;
    EXPECT_EQ(Code(p, Action::kWorkerCall, worker), C::kOk);
    EXPECT_EQ(Code(p, Action::kCancelJob, BobsVisionJob()), C::kOk);
    EXPECT_EQ(Code(p, Action::kCreateTeam, {}), C::kOk);
  }
}

TEST(AuthorizeTest, WorkerIdPatternsAreGlobs) {
  EXPECT_TRUE(WorkerIdAllowed("*", "anything"));
  EXPECT_TRUE(WorkerIdAllowed("", "anything"));
  EXPECT_TRUE(WorkerIdAllowed("node-[0-9]", "node-7"));
  EXPECT_FALSE(WorkerIdAllowed("node-[0-9]", "node-77"));
  EXPECT_FALSE(WorkerIdAllowed("node-1", "node-12"));
}

}  // namespace
}  // namespace stoker
