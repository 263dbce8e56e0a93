// The access store on a real SQLite file: tokens kept as hashes only, join tokens single-use,
// bootstrap once, bad input refused without a change, and an audit row with every change.
#include "server/access/access_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "server/access/token_secret.h"

namespace stoker {
namespace {

class AccessStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("access_store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    absl::StatusOr<std::unique_ptr<AccessStore>> store = AccessStore::Open(path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string path() const { return (dir_ / "jobs.db").string(); }
  // Every byte of the database and its WAL.
  std::string DatabaseBytes() const {
    std::string all;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      all += bytes.str();
    }
    return all;
  }
  v1::AuditRecord Audit(const char* action) { return AuditOf("root", "tok-r", action, ""); }

  std::filesystem::path dir_;
  std::unique_ptr<AccessStore> store_;
};

TEST_F(AccessStoreTest, SecretsAreStoredOnlyAsHashes) {
  absl::StatusOr<AccessStore::NewToken> admin = store_->Bootstrap("root");
  ASSERT_TRUE(admin.ok()) << admin.status();
  v1::TokenInfo user_token;
  user_token.set_kind("user");
  user_token.set_user("root");
  user_token.set_name("laptop");
  absl::StatusOr<AccessStore::NewToken> laptop =
      store_->CreateToken(user_token, Audit("token.create"));
  ASSERT_TRUE(laptop.ok()) << laptop.status();
  EXPECT_EQ(laptop->secret.rfind("stku_", 0), 0u);
  EXPECT_EQ(laptop->secret.size(), 5u + 64u);
  const std::string bytes = DatabaseBytes();
  for (const std::string& secret : {admin->secret, laptop->secret}) {
    EXPECT_EQ(bytes.find(secret), std::string::npos);
    EXPECT_EQ(bytes.find(secret.substr(5)), std::string::npos);
  }
  absl::StatusOr<v1::TokenInfo> found = store_->FindToken(HashSecret(laptop->secret));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->id(), laptop->info.id());
  EXPECT_TRUE(absl::IsNotFound(store_->FindToken(HashSecret("stku_guess")).status()));
}

TEST_F(AccessStoreTest, BootstrapOnlyOnce) {
  ASSERT_TRUE(store_->Bootstrap("root").ok());
  const absl::Status again = store_->Bootstrap("mallory").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_TRUE(absl::IsNotFound(store_->GetUser("mallory").status()));
  EXPECT_EQ(store_->Bootstrap("Bad Name").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AccessStoreTest, JoinTokensAreSingleUse) {
  ASSERT_TRUE(store_->Bootstrap("root").ok());
  v1::TokenInfo join;
  join.set_kind("join");
  join.set_user("root");
  join.set_worker_ids("node-*");
  absl::StatusOr<AccessStore::NewToken> created =
      store_->CreateToken(join, Audit("worker.join-token"));
  ASSERT_TRUE(created.ok()) << created.status();
  absl::StatusOr<AccessStore::NewToken> worker =
      store_->RedeemJoinToken(created->info.id(), Audit("worker.join"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->info.kind(), "worker");
  EXPECT_EQ(worker->info.worker_ids(), "node-*");
  EXPECT_EQ(worker->secret.rfind("stkw_", 0), 0u);
  const absl::Status reused =
      store_->RedeemJoinToken(created->info.id(), Audit("worker.join")).status();
  EXPECT_EQ(reused.code(), absl::StatusCode::kFailedPrecondition) << reused;
}

TEST_F(AccessStoreTest, BadInputChangesNothingAndChangesAreAudited) {
  ASSERT_TRUE(store_->Bootstrap("root").ok());
  v1::AddUserRequest add;
  add.set_name("bob");
  add.set_team("no-such-team");
  EXPECT_TRUE(absl::IsNotFound(store_->AddUser(add, 0, Audit("user.add")).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->GetUser("bob").status())) << "nothing half-done";
  v1::CreateTeamRequest team;
  team.set_name("vision");
  team.set_max_priority(5);
  ASSERT_TRUE(store_->CreateTeam(team, Audit("team.create")).ok());
  EXPECT_EQ(store_->CreateTeam(team, Audit("team.create")).status().code(),
            absl::StatusCode::kAlreadyExists);
  add.set_team("vision");
  absl::StatusOr<v1::AddUserResponse> bob = store_->AddUser(add, 0, Audit("user.add"));
  ASSERT_TRUE(bob.ok()) << bob.status();
  ASSERT_EQ(bob->user().teams_size(), 1);
  EXPECT_EQ(bob->user().teams(0).role(), v1::TEAM_ROLE_MEMBER);
  // Its first token acts as bob.
  absl::StatusOr<v1::TokenInfo> first = store_->FindToken(HashSecret(bob->first_token().secret()));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->user(), "bob");
  v1::SetMemberRequest member;
  member.set_team("vision");
  member.set_user("nobody");
  EXPECT_TRUE(absl::IsNotFound(store_->SetMember(member, Audit("team.add")).status()));
  v1::RemoveMemberRequest remove;
  remove.set_team("vision");
  remove.set_user("root");
  EXPECT_TRUE(absl::IsNotFound(store_->RemoveMember(remove, Audit("team.remove")).status()));

  absl::StatusOr<std::vector<v1::AuditRecord>> rows = store_->ReadAudit({});
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<std::string> actions;
  for (const v1::AuditRecord& row : *rows) actions.push_back(row.action());
  // Only the changes that happened: bootstrap, the team, the user.
  EXPECT_EQ(actions, (std::vector<std::string>{"user.bootstrap", "team.create", "user.add"}));
  for (const v1::AuditRecord& row : *rows) EXPECT_EQ(row.decision(), "allowed");
}

}  // namespace
}  // namespace stoker
