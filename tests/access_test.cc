// Users, teams, tokens and the audit log with real processes on loopback and the real SQLite
// store (issue 28): the role x action x resource matrix through gRPC (three users in two teams, a
// cluster admin, a worker), token expiry and revocation, worker and user credentials kept apart,
// join-token reuse, the audit row of every audited call including denials (and none lost to a
// kill -9), an upgrade from a single-token state directory, and no secret in the database or logs.
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "stoker.grpc.pb.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

// A client of the three services that sends one token.
class Caller {
 public:
  Caller(const std::string& address, std::string token)
      : channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        jobs_(v1::JobService::NewStub(channel_)),
        workers_(v1::WorkerService::NewStub(channel_)),
        access_(v1::AccessService::NewStub(channel_)),
        token_(std::move(token)) {}

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    return context;
  }

  grpc::Status Submit(v1::JobSpec spec, v1::Job* job = nullptr) const {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = std::move(spec);
    v1::SubmitJobResponse response;
    grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
    if (job != nullptr) *job = response.job();
    return status;
  }
  grpc::Status Get(const std::string& id, v1::Job* job = nullptr) const {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job response;
    grpc::Status status = jobs_->GetJob(Context().get(), request, &response);
    if (job != nullptr) *job = response;
    return status;
  }
  grpc::Status Logs(const std::string& id) const {
    v1::WatchJobRequest request;
    request.set_job_id(id);
    auto context = Context();
    auto reader = jobs_->WatchJob(context.get(), request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  }
  grpc::Status Artifact(const std::string& id) const {
    v1::GetArtifactRequest request;
    request.set_job_id(id);
    auto context = Context();
    auto reader = jobs_->GetArtifact(context.get(), request);
    v1::CheckpointChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }
  // An experiment over `spec`: a grid over two learning rates, one trial at a time.
  grpc::Status SubmitSearch(v1::JobSpec spec, v1::Experiment* experiment) const {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = std::move(spec);
    v1::SearchSpec& search = *request.mutable_search();
    search.set_method("grid");
    search.set_max_concurrent_trials(1);
    v1::ParameterSpace* lr = search.add_parameters();
    lr->set_path("train.optimizer.lr");
    lr->set_kind("choice");
    lr->add_choices("0.1");
    lr->add_choices("0.2");
    v1::SubmitJobResponse response;
    grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
    *experiment = response.experiment();
    return status;
  }
  grpc::Status GetExperiment(const std::string& id) const {
    v1::GetExperimentRequest request;
    request.set_experiment_id(id);
    v1::Experiment response;
    return jobs_->GetExperiment(Context().get(), request, &response);
  }
  grpc::Status CancelExperiment(const std::string& id) const {
    v1::CancelExperimentRequest request;
    request.set_experiment_id(id);
    v1::Experiment response;
    return jobs_->CancelExperiment(Context().get(), request, &response);
  }
  std::set<std::string> ListExperiments() const {
    v1::ListExperimentsResponse response;
    EXPECT_TRUE(jobs_->ListExperiments(Context().get(), {}, &response).ok());
    std::set<std::string> ids;
    for (const v1::Experiment& e : response.experiments()) ids.insert(e.id());
    return ids;
  }
  grpc::Status Cancel(const std::string& id) const {
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::Job response;
    return jobs_->CancelJob(Context().get(), request, &response);
  }
  // Ids listed (ListJobs with these flags).
  std::set<std::string> List(bool all = false, const std::string& team = "",
                             grpc::Status* status_out = nullptr) const {
    v1::ListJobsRequest request;
    request.set_limit(10000);
    request.set_all(all);
    request.set_team(team);
    v1::ListJobsResponse response;
    grpc::Status status = jobs_->ListJobs(Context().get(), request, &response);
    if (status_out != nullptr) *status_out = status;
    std::set<std::string> ids;
    for (const v1::Job& job : response.jobs()) ids.insert(job.id());
    return ids;
  }
  grpc::Status Workers(v1::ListWorkersResponse* response) const {
    return jobs_->ListWorkers(Context().get(), {}, response);
  }
  grpc::Status Heartbeat(const std::string& worker_id) const {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    v1::HeartbeatResponse response;
    return workers_->Heartbeat(Context().get(), request, &response);
  }
  grpc::Status WhoAmI(v1::WhoAmIResponse* response) const {
    return access_->WhoAmI(Context().get(), {}, response);
  }
  grpc::Status SetQuota(const v1::SetQuotaRequest& request) const {
    v1::TeamQuota response;
    return access_->SetQuota(Context().get(), request, &response);
  }
  std::vector<v1::AuditRecord> Audit() const {
    v1::ListAuditRequest request;
    request.set_limit(100000);
    v1::ListAuditResponse response;
    grpc::Status status = access_->ListAudit(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.records().begin(), response.records().end()};
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::AccessService::Stub> access_;
  std::string token_;
};

// A job that stays QUEUED while no worker runs (or trains briefly when one does).
v1::JobSpec Job(const std::string& name, const std::string& team = "", int priority = 0) {
  v1::JobSpec spec = SmallFashionMnistJob(1, 512, 256);
  spec.set_name(name);
  spec.set_team(team);
  spec.set_priority(priority);
  return spec;
}

// A job that holds its `gpus` GPUs for long (50 epochs of 6,000 samples, a slowed loader): until
// it is cancelled or preempted.
v1::JobSpec LongGpuJob(const std::string& name, const std::string& team = "", int priority = 0,
                       int gpus = 1) {
  v1::JobSpec spec = Job(name, team, priority);
  spec.mutable_train()->set_epochs(50);
  spec.mutable_dataset()->set_train_limit(6000);
  spec.mutable_loader()->set_processes(1);
  spec.mutable_loader()->set_delay_ms(15);
  spec.mutable_resources()->set_gpus(gpus);
  spec.mutable_resources()->set_cpus(1);
  return spec;
}

// The cluster of the matrix: root (cluster admin), teams vision (cap 5) and nlp; alice admin of
// vision, bob member of vision, carol viewer of vision and member of nlp, dave member of nlp.
class AccessTest : public ::testing::Test {
 protected:
  // Extra flags of the server (a fixture below shortens preemption's minimum run time).
  virtual std::vector<std::string> ServerFlags() const { return {}; }

  void SetUp() override {
    cluster_.StartServer(ServerFlags());
    // While the server runs; the secret alone on stdout's line, what it is on stderr.
    CommandResult boot =
        RunCommand(absl::StrCat("(", STOKER_SERVER_PATH_FOR_TEST, " bootstrap-admin --state-dir ",
                                cluster_.dir(), "/server --user root 2>/dev/null)"));
    ASSERT_EQ(boot.exit_code, 0) << boot.output;
    root_token_ = std::string(absl::StripAsciiWhitespace(boot.output));
    ASSERT_TRUE(absl::StartsWith(root_token_, "stku_")) << root_token_;
    secrets_.push_back(root_token_);
    root_file_ = WriteFile(cluster_.dir() + "/root.token", root_token_ + "\n");
    ASSERT_EQ(Admin("team create vision --max-priority 5").exit_code, 0);
    ASSERT_EQ(Admin("team create nlp").exit_code, 0);
    AddUser("alice", "--team vision --role admin");
    AddUser("bob", "--team vision");
    AddUser("carol", "--team vision --role viewer");
    AddUser("dave", "--team nlp");
    ASSERT_EQ(Admin("team add nlp carol").exit_code, 0);
  }

  CommandResult Admin(const std::string& args) {
    return cluster_.Cli(absl::StrCat("--token-file ", root_file_, " ", args));
  }
  CommandResult As(const std::string& user, const std::string& args) {
    return cluster_.Cli(absl::StrCat("--token-file ", cluster_.dir(), "/", user, ".token ", args));
  }
  void AddUser(const std::string& name, const std::string& flags) {
    CommandResult added = Admin(absl::StrCat("user add ", name, " ", flags, " --token-out ",
                                             cluster_.dir(), "/", name, ".token"));
    ASSERT_EQ(added.exit_code, 0) << added.output;
    secrets_.push_back(Token(name));
  }
  std::string Token(const std::string& user) {
    return std::string(absl::StripAsciiWhitespace(ReadAll(cluster_.dir() + "/" + user + ".token")));
  }
  Caller As(const std::string& user) { return Caller(cluster_.address(), Token(user)); }
  Caller Root() { return Caller(cluster_.address(), root_token_); }

  // Worker w-1 with `gpus` fake GPUs and `cpus` cores, joined with a join token.
  void StartGpuWorker(int gpus, int cpus) {
    ASSERT_EQ(Admin("worker join-token --token-out " + cluster_.dir() + "/join.token").exit_code,
              0);
    cluster_.StartWorker(
        "w-1", {"--join-token-file", cluster_.dir() + "/join.token", "--fake-gpus-for-tests",
                absl::StrCat(gpus), "--cpus", absl::StrCat(cpus)});
  }
  // The job as the server has it now.
  v1::Job JobNow(const std::string& id) {
    v1::Job now;
    EXPECT_TRUE(Root().Get(id, &now).ok());
    return now;
  }
  // Polls (60 s) until the job is in `state`; whether it got there.
  bool WaitForState(const std::string& id, v1::JobState state) {
    for (int i = 0; i < 300 && JobNow(id).state() != state; ++i) {
      absl::SleepFor(absl::Milliseconds(200));
    }
    return JobNow(id).state() == state;
  }

  // No secret handed out in this test is in the database, its WAL or any log.
  void ExpectNoSecretStored() {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(cluster_.dir())) {
      const std::string path = entry.path().string();
      if (!entry.is_regular_file() || absl::EndsWith(path, ".token")) continue;
      if (absl::StrContains(path, "/server/") || absl::EndsWith(path, ".log"))
        files.push_back(path);
    }
    ASSERT_FALSE(files.empty());
    for (const std::string& path : files) {
      const std::string bytes = ReadAll(path);
      for (const std::string& secret : secrets_) {
        EXPECT_EQ(bytes.find(secret.substr(5)), std::string::npos) << "a secret in " << path;
      }
    }
  }

  TestCluster cluster_;
  std::string root_token_, root_file_;
  std::vector<std::string> secrets_;
};

TEST_F(AccessTest, TheRoleActionResourceMatrixThroughGrpc) {
  // bob's job in vision (his only team), and dave's in nlp; no worker: they stay queued.
  v1::Job bobs, daves, carols;
  ASSERT_TRUE(As("bob").Submit(Job("bobs"), &bobs).ok());
  EXPECT_EQ(bobs.owner(), "bob");
  EXPECT_EQ(bobs.spec().team(), "vision");
  ASSERT_TRUE(As("dave").Submit(Job("daves"), &daves).ok());
  ASSERT_TRUE(As("carol").Submit(Job("carols", "nlp"), &carols).ok());

  using C = grpc::StatusCode;
  struct Row {
    const char* who;
    C view, logs, artifact;
  };
  // artifact: NOT_FOUND "no checkpoint yet" for those allowed (the job never ran).
  const std::vector<Row> rows = {
      {"bob", C::OK, C::OK, C::NOT_FOUND},                           // owner
      {"alice", C::OK, C::OK, C::NOT_FOUND},                         // vision admin
      {"carol", C::OK, C::PERMISSION_DENIED, C::PERMISSION_DENIED},  // vision viewer
      {"dave", C::NOT_FOUND, C::NOT_FOUND, C::NOT_FOUND},            // nlp only
      {"root", C::OK, C::OK, C::NOT_FOUND},                          // cluster admin
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.who);
    const Caller caller = std::string(row.who) == "root" ? Root() : As(row.who);
    EXPECT_EQ(caller.Get(bobs.id()).error_code(), row.view);
    EXPECT_EQ(caller.Logs(bobs.id()).error_code(), row.logs);
    EXPECT_EQ(caller.Artifact(bobs.id()).error_code(), row.artifact);
  }
  // No existence leak: another team's job reads exactly as a missing one.
  const grpc::Status hidden = As("dave").Get(bobs.id());
  const grpc::Status missing = As("dave").Get("j-999999");
  EXPECT_EQ(hidden.error_message(), absl::StrCat("no job '", bobs.id(), "'"));
  EXPECT_EQ(missing.error_message(), "no job 'j-999999'");
  EXPECT_EQ(As("dave").Cancel(bobs.id()).error_message(), hidden.error_message());

  // Listing: each sees its teams' jobs and its own.
  EXPECT_EQ(As("bob").List(), (std::set<std::string>{bobs.id()}));
  EXPECT_EQ(As("dave").List(), (std::set<std::string>{daves.id(), carols.id()}));
  EXPECT_EQ(As("carol").List(), (std::set<std::string>{bobs.id(), daves.id(), carols.id()}));
  EXPECT_EQ(As("carol").List(false, "nlp"), (std::set<std::string>{daves.id(), carols.id()}));
  EXPECT_TRUE(Root().List().empty()) << "root is in no team and submitted nothing";
  EXPECT_EQ(Root().List(true).size(), 3u);
  grpc::Status all_status;
  As("bob").List(true, "", &all_status);
  EXPECT_EQ(all_status.error_code(), C::PERMISSION_DENIED);

  // A request id is deduplicated per owner: another user's is refused, never answered with the job.
  {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Job("retried");
    request.set_request_id("req-42");
    v1::SubmitJobResponse first, again, other;
    grpc::ClientContext c1, c2, c3;
    const std::string bob = "Bearer " + Token("bob"), dave = "Bearer " + Token("dave");
    c1.AddMetadata("authorization", bob);
    c2.AddMetadata("authorization", bob);
    c3.AddMetadata("authorization", dave);
    auto stub = v1::JobService::NewStub(
        grpc::CreateChannel(cluster_.address(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stub->SubmitJob(&c1, request, &first).ok());
    ASSERT_TRUE(stub->SubmitJob(&c2, request, &again).ok());
    EXPECT_TRUE(again.deduplicated());
    EXPECT_EQ(again.job().id(), first.job().id());
    const grpc::Status taken = stub->SubmitJob(&c3, request, &other);
    EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_FALSE(absl::StrContains(taken.error_message(), first.job().id()));
    ASSERT_TRUE(As("bob").Cancel(first.job().id()).ok());
  }

  // Submit: roles, the default team, the cap, unknown teams.
  grpc::Status s = As("carol").Submit(Job("x", "vision"));
  EXPECT_EQ(s.error_code(), C::PERMISSION_DENIED) << s.error_message();
  s = As("carol").Submit(Job("x"));
  EXPECT_EQ(s.error_code(), C::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "nlp, vision")) << s.error_message();
  s = As("bob").Submit(Job("x", "", 6));
  EXPECT_EQ(s.error_code(), C::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "cap of 5")) << s.error_message();
  EXPECT_TRUE(As("bob").Submit(Job("x", "", 5)).ok());
  EXPECT_EQ(As("dave").Submit(Job("x", "vision")).error_code(), C::PERMISSION_DENIED);
  s = As("bob").Submit(Job("x", "no-such-team"));
  EXPECT_EQ(s.error_code(), C::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "no team 'no-such-team'")) << s.error_message();

  // Cancel: viewer and other team refused, team admin allowed; nothing changed by a refusal.
  EXPECT_EQ(As("carol").Cancel(bobs.id()).error_code(), C::PERMISSION_DENIED);
  v1::Job still;
  ASSERT_TRUE(As("bob").Get(bobs.id(), &still).ok());
  EXPECT_EQ(still.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(As("alice").Cancel(bobs.id()).ok());
  EXPECT_TRUE(As("dave").Cancel(daves.id()).ok());
  EXPECT_TRUE(Root().Cancel(carols.id()).ok());

  // The CLI says the same, with exit codes.
  CommandResult cli = As("dave", "status " + bobs.id());
  EXPECT_EQ(cli.exit_code, 1) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "no job '" + bobs.id() + "'")) << cli.output;
  cli = As("bob", "whoami");
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_TRUE(absl::StrContains(cli.output, "vision (member)")) << cli.output;

  // Every audited call left its row, the denials too.
  std::map<std::string, std::set<std::string>> seen;  // "action decision" -> principals
  for (const v1::AuditRecord& r : Root().Audit()) {
    seen[absl::StrCat(r.action(), " ", r.decision())].insert(r.principal());
  }
  EXPECT_EQ(seen["job.submit allowed"], (std::set<std::string>{"bob", "carol", "dave"}));
  EXPECT_EQ(seen["job.submit denied"], (std::set<std::string>{"bob", "carol", "dave"}));
  EXPECT_EQ(seen["job.cancel denied"], (std::set<std::string>{"carol", "dave"}));
  EXPECT_EQ(seen["job.cancel allowed"], (std::set<std::string>{"alice", "bob", "dave", "root"}));
  EXPECT_EQ(seen["user.add allowed"].size(), 1u);
  EXPECT_EQ(seen["team.create allowed"].size(), 1u);
  EXPECT_EQ(seen["team.add allowed"], (std::set<std::string>{"root"}));
  EXPECT_EQ(seen["user.bootstrap allowed"], (std::set<std::string>{"bootstrap"}));
  // A team admin reads its team's rows only; a member none.
  for (const v1::AuditRecord& r : As("alice").Audit()) {
    EXPECT_TRUE(r.team() == "vision" || r.principal() == "alice") << r.ShortDebugString();
  }
  CommandResult audit = As("bob", "audit");
  EXPECT_EQ(audit.exit_code, 1) << audit.output;
  ExpectNoSecretStored();
}

// An experiment follows its jobs' rules: seen by its teams and its owner, cancelled by its owner
// and team admins, another team's reads as a missing one; its trials are its owner's; audited.
TEST_F(AccessTest, ExperimentsFollowTheRulesOfTheirJobs) {
  v1::Experiment experiment;
  ASSERT_TRUE(As("bob").SubmitSearch(Job("search"), &experiment).ok());
  EXPECT_EQ(experiment.owner(), "bob");
  EXPECT_EQ(experiment.team(), "vision");
  ASSERT_EQ(experiment.trials_size(), 1) << "one at a time";
  v1::Job trial;
  ASSERT_TRUE(As("bob").Get(experiment.trials(0).job_id(), &trial).ok());
  EXPECT_EQ(trial.owner(), "bob");
  EXPECT_EQ(trial.spec().team(), "vision");
  using C = grpc::StatusCode;
  EXPECT_EQ(As("carol").GetExperiment(experiment.id()).error_code(), C::OK);  // vision viewer
  EXPECT_EQ(As("dave").GetExperiment(experiment.id()).error_message(),
            absl::StrCat("no experiment '", experiment.id(), "'"));
  EXPECT_EQ(As("dave").GetExperiment("e-999999").error_message(), "no experiment 'e-999999'");
  EXPECT_EQ(As("dave").CancelExperiment(experiment.id()).error_code(), C::NOT_FOUND);
  EXPECT_TRUE(As("dave").ListExperiments().empty());
  EXPECT_EQ(As("carol").ListExperiments(), (std::set<std::string>{experiment.id()}));
  const grpc::Status viewer = As("carol").CancelExperiment(experiment.id());
  EXPECT_EQ(viewer.error_code(), C::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(viewer.error_message(), "experiment's owner (bob)"))
      << viewer.error_message();
  EXPECT_EQ(As("alice").CancelExperiment(experiment.id()).error_code(), C::OK);  // vision admin
  v1::Job cancelled;
  ASSERT_TRUE(As("bob").Get(trial.id(), &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  std::set<std::string> actions;
  for (const v1::AuditRecord& record : Root().Audit()) {
    if (record.target() == experiment.id())
      actions.insert(record.action() + " " + record.principal());
  }
  EXPECT_TRUE(actions.contains("experiment.submit bob")) << absl::StrJoin(actions, ", ");
  EXPECT_TRUE(actions.contains("experiment.cancel alice")) << absl::StrJoin(actions, ", ");
  EXPECT_TRUE(actions.contains("experiment.cancel carol")) << "a denied cancel is audited too";
}

TEST_F(AccessTest, TokensExpireAndAreRevokedAndAdminCommandsAreGuarded) {
  // A token of one second, then another that is revoked.
  CommandResult made = As("bob", "token create --name short --expires 1s --token-out " +
                                     cluster_.dir() + "/short.token");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  secrets_.push_back(Token("short"));
  absl::SleepFor(absl::Seconds(2));
  v1::WhoAmIResponse me;
  grpc::Status s = As("short").WhoAmI(&me);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "expired")) << s.error_message();

  made = As("bob", "token create --name laptop -o json");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  v1::CreateTokenResponse laptop;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(made.output, &laptop).ok())
      << made.output;
  secrets_.push_back(laptop.secret());
  const Caller on_laptop(cluster_.address(), laptop.secret());
  ASSERT_TRUE(on_laptop.WhoAmI(&me).ok());
  EXPECT_EQ(me.user().name(), "bob");
  // Another user cannot revoke it, and learns nothing about it.
  CommandResult refused = As("dave", "token revoke " + laptop.token().id());
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.output, "no token")) << refused.output;
  ASSERT_EQ(As("bob", "token revoke " + laptop.token().id()).exit_code, 0);
  s = on_laptop.WhoAmI(&me);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "revoked")) << s.error_message();
  // Unknown tokens: the same answer as before users existed.
  s = Caller(cluster_.address(), "stku_0000").WhoAmI(&me);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "invalid bearer token");
  s = Caller(cluster_.address(), "").WhoAmI(&me);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // Admin commands: members and team admins outside their team are refused, with no change.
  EXPECT_EQ(As("bob", "team create rogue").exit_code, 1);
  EXPECT_EQ(As("alice", "team add nlp alice --role admin").exit_code, 1);
  EXPECT_EQ(As("alice", "user add eve --cluster-admin --team vision --token-out " + cluster_.dir() +
                            "/eve.token")
                .exit_code,
            1);
  CommandResult eve =
      As("alice", "user add eve --team vision --token-out " + cluster_.dir() + "/eve.token");
  ASSERT_EQ(eve.exit_code, 0) << eve.output;
  secrets_.push_back(Token("eve"));
  EXPECT_EQ(As("alice", "user disable eve").exit_code, 1) << "cluster admins only";
  // Bad input: clear errors, nothing changed.
  CommandResult bad = Admin("team add vision nobody");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad.output, "no user 'nobody'")) << bad.output;
  bad = Admin("user add 'Bad Name'");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(bad.output, "user name 'Bad Name'")) << bad.output;
  bad = Admin("token create --expires 3 --token-out /dev/null");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(bad.output, "--expires '3'")) << bad.output;
  // A disabled user's tokens stop working at once.
  ASSERT_EQ(Admin("user disable eve").exit_code, 0);
  s = As("eve").WhoAmI(&me);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "disabled")) << s.error_message();
  CommandResult list = Admin("token list --all");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "revoked")) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "expired")) << list.output;
  ExpectNoSecretStored();
}

TEST_F(AccessTest, WorkersJoinOnceAndWorkerAndUserCredentialsAreKeptApart) {
  CommandResult join =
      Admin("worker join-token --ids 'w-*' --token-out " + cluster_.dir() + "/join.token");
  ASSERT_EQ(join.exit_code, 0) << join.output;
  secrets_.push_back(Token("join"));
  // A user token cannot act as a worker, a join token only joins.
  EXPECT_EQ(As("bob").Heartbeat("w-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Root().Heartbeat("w-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(As("join").Heartbeat("w-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // An id outside the pattern is refused without using the join token up.
  const pid_t outside =
      cluster_.StartWorker("laptop", {"--join-token-file", cluster_.dir() + "/join.token"});
  EXPECT_EQ(cluster_.WaitWorkerExit(outside, absl::Seconds(30)), std::optional<int>(2));
  const pid_t worker =
      cluster_.StartWorker("w-1", {"--join-token-file", cluster_.dir() + "/join.token"});
  const std::string kept = cluster_.dir() + "/w-1/worker.token";
  for (int i = 0; i < 300 && !std::filesystem::exists(kept); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(kept)) << ReadAll(cluster_.dir() + "/w-1.log");
  EXPECT_EQ(std::filesystem::status(kept).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string worker_token(absl::StripAsciiWhitespace(ReadAll(kept)));
  EXPECT_TRUE(absl::StartsWith(worker_token, "stkw_"));
  secrets_.push_back(worker_token);
  // The join token is spent: a second worker cannot use it.
  const pid_t second =
      cluster_.StartWorker("w-2", {"--join-token-file", cluster_.dir() + "/join.token"});
  EXPECT_EQ(cluster_.WaitWorkerExit(second, absl::Seconds(30)), std::optional<int>(2));
  EXPECT_TRUE(absl::StrContains(ReadAll(cluster_.dir() + "/w-2.log"), "was used at"))
      << ReadAll(cluster_.dir() + "/w-2.log");

  // The worker runs bob's job with its own token; bob downloads the weights, dave cannot.
  v1::Job job;
  ASSERT_TRUE(As("bob").Submit(Job("trained"), &job).ok());
  absl::StatusOr<v1::Job> done = [&]() -> absl::StatusOr<v1::Job> {
    const absl::Time deadline = absl::Now() + absl::Seconds(180);
    v1::Job now;
    while (absl::Now() < deadline) {
      if (grpc::Status s = As("bob").Get(job.id(), &now); !s.ok()) {
        return absl::InternalError(s.error_message());
      }
      if (now.state() >= v1::JOB_STATE_SUCCEEDED) return now;
      absl::SleepFor(absl::Milliseconds(250));
    }
    return absl::DeadlineExceededError("job did not finish");
  }();
  ASSERT_TRUE(done.ok()) << done.status() << ReadAll(cluster_.dir() + "/w-1.log");
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_TRUE(As("bob").Artifact(job.id()).ok());
  EXPECT_EQ(As("carol").Artifact(job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(As("dave").Artifact(job.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  // The worker token cannot use the job service, nor act as another worker id.
  const Caller as_worker(cluster_.address(), worker_token);
  grpc::Status list_status;
  as_worker.List(false, "", &list_status);
  EXPECT_EQ(list_status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(as_worker.Heartbeat("other-host").error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // A restarted worker uses its kept token (no join token needed).
  cluster_.KillWorker(worker, SIGKILL);
  const pid_t again = cluster_.StartWorker("w-1");
  absl::SleepFor(absl::Seconds(3));
  EXPECT_TRUE(absl::StrContains(ReadAll(cluster_.dir() + "/w-1.log"), "using the worker token"));
  EXPECT_FALSE(cluster_.WaitWorkerExit(again, absl::Seconds(1)).has_value()) << "still running";

  std::map<std::string, std::set<std::string>> seen;
  for (const v1::AuditRecord& r : Root().Audit()) {
    seen[absl::StrCat(r.action(), " ", r.decision())].insert(r.target());
  }
  EXPECT_EQ(seen["worker.join allowed"], (std::set<std::string>{"w-1"}));
  EXPECT_EQ(seen["worker.join denied"], (std::set<std::string>{"laptop"}));
  EXPECT_EQ(seen["worker.register allowed"], (std::set<std::string>{"w-1"}));
  EXPECT_EQ(seen["worker.join-token allowed"].size(), 1u);
  ExpectNoSecretStored();
}

TEST_F(AccessTest, OtherTeamsJobsShowAsOccupiedOnTheWorkersTable) {
  ASSERT_EQ(Admin("worker join-token --token-out " + cluster_.dir() + "/join.token").exit_code, 0);
  cluster_.StartWorker("w-1", {"--join-token-file", cluster_.dir() + "/join.token"});
  v1::JobSpec long_job = Job("long");
  long_job.mutable_train()->set_epochs(50);
  long_job.mutable_dataset()->set_train_limit(4096);
  v1::Job job;
  ASSERT_TRUE(As("bob").Submit(long_job, &job).ok());
  v1::ListWorkersResponse workers;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(As("dave").Workers(&workers).ok());
    if (workers.workers_size() == 1 && workers.workers(0).hidden_jobs() == 1) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).hidden_jobs(), 1);
  EXPECT_TRUE(workers.workers(0).job_ids().empty());
  for (const v1::Placement& p : workers.workers(0).placements()) EXPECT_EQ(p.job_id(), "");
  ASSERT_TRUE(As("alice").Workers(&workers).ok());
  EXPECT_EQ(workers.workers(0).hidden_jobs(), 0);
  EXPECT_EQ(workers.workers(0).job_ids(0), job.id());
  CommandResult table = As("dave", "workers");
  EXPECT_TRUE(absl::StrContains(table.output, "1 other team's job")) << table.output;
  EXPECT_FALSE(absl::StrContains(table.output, job.id())) << table.output;
  EXPECT_TRUE(As("bob").Cancel(job.id()).ok());
}

// Team quotas (issue 29, first slice): vision may hold 1 GPU and borrow 1 more; nlp has no quota.
TEST_F(AccessTest, QuotasHoldJobsBackRefuseWhatNeverFitsAndLetTeamsBorrow) {
  StartGpuWorker(4, 8);
  CommandResult set = Admin("quota set vision gpus=1 --borrow 1");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  auto gpu_job = [](const std::string& name, int gpus) { return LongGpuJob(name, "", 0, gpus); };
  // Never fits the quota and its borrowing: refused at submit, nothing stored.
  grpc::Status s = As("bob").Submit(gpu_job("too-big", 3));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "could never run")) << s.error_message();
  std::vector<v1::Job> jobs(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(As("bob").Submit(gpu_job(absl::StrCat("g", i), 1), &jobs[i]).ok());
  }
  v1::Job daves;
  ASSERT_TRUE(As("dave").Submit(gpu_job("nlp", 2), &daves).ok());
  // Two of vision's run (nominal 1 + borrowed 1), nlp's 2-GPU job runs beside them; the third
  // vision job waits on the quota although a worker... has no free GPU either way: the quota is
  // what it names, before the resources.
  auto state = [&](const v1::Job& job) { return JobNow(job.id()); };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int running = 0;
  while (absl::Now() < deadline) {
    running = 0;
    for (const v1::Job& job : jobs) running += state(job).state() == v1::JOB_STATE_RUNNING;
    if (running == 2 && state(daves).state() == v1::JOB_STATE_RUNNING) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(running, 2);
  ASSERT_EQ(state(daves).state(), v1::JOB_STATE_RUNNING);
  std::string waiting_id;
  for (const v1::Job& job : jobs) {
    if (state(job).state() == v1::JOB_STATE_QUEUED) waiting_id = job.id();
  }
  ASSERT_FALSE(waiting_id.empty());
  v1::Job waiting;
  ASSERT_TRUE(As("bob").Get(waiting_id, &waiting).ok());
  EXPECT_EQ(waiting.waiting_reason(),
            "quota: team vision uses 1 of 1 GPUs, borrowing 1 of 1; the job needs 1");
  CommandResult list = As("bob", "quota list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "vision")) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "gpus")) << list.output;

  // A quota below what the team uses now is allowed: the running jobs go on, nothing new starts.
  ASSERT_EQ(Admin("quota set vision gpus=0").exit_code, 0);
  absl::SleepFor(absl::Seconds(2));
  running = 0;
  for (const v1::Job& job : jobs) running += state(job).state() == v1::JOB_STATE_RUNNING;
  EXPECT_EQ(running, 2);
  ASSERT_TRUE(As("bob").Get(waiting_id, &waiting).ok());
  EXPECT_EQ(waiting.waiting_reason(),
            "quota: team vision uses 0 of 0 GPUs, borrowing 2 of 0; the job needs 1");
  // Back to 1 + 1 and one of vision's jobs cancelled: the waiting one starts.
  ASSERT_EQ(Admin("quota set vision gpus=1 --borrow 1").exit_code, 0);
  for (const v1::Job& job : jobs) {
    if (job.id() != waiting_id) {
      ASSERT_TRUE(As("bob").Cancel(job.id()).ok());
      break;
    }
  }
  v1::Job started;
  for (int i = 0; i < 150; ++i) {
    started = state(waiting);
    if (started.state() == v1::JOB_STATE_RUNNING) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(started.state(), v1::JOB_STATE_RUNNING) << started.waiting_reason();

  // Bad input: clear errors, nothing changed.
  CommandResult bad = Admin("quota set vision tpus=4");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  bad = Admin("quota set no-such-team gpus=1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad.output, "no team 'no-such-team'")) << bad.output;
  bad = Admin("quota set vision gpus=-3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  bad = Admin("quota set vision memory=12XB");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  bad = As("alice", "quota set vision gpus=100");
  EXPECT_EQ(bad.exit_code, 1) << "cluster admins only: " << bad.output;
  for (const v1::Job& job : jobs) (void)As("bob").Cancel(job.id());
  (void)As("dave").Cancel(daves.id());
}

// Fair share (issue 29): among jobs of equal priority the team that uses less goes first, whatever
// the submit order; weights are set by admins and checked.
TEST_F(AccessTest, FairShareServesTheTeamThatUsesLessFirst) {
  StartGpuWorker(1, 4);
  auto gpu_job = [](const std::string& name) { return LongGpuJob(name); };
  auto state = [&](const std::string& id) { return JobNow(id); };
  auto wait_running = [&](const std::string& id) {
    return WaitForState(id, v1::JOB_STATE_RUNNING);
  };
  v1::Job first, second, third, daves;
  ASSERT_TRUE(As("bob").Submit(gpu_job("v-first"), &first).ok());
  ASSERT_TRUE(wait_running(first.id()));
  ASSERT_TRUE(As("bob").Submit(gpu_job("v-second"), &second).ok());
  ASSERT_TRUE(As("bob").Submit(gpu_job("v-third"), &third).ok());
  ASSERT_TRUE(As("dave").Submit(gpu_job("nlp-late"), &daves).ok());
  // vision holds the only GPU: nlp's job, submitted last, is first in the queue.
  EXPECT_EQ(state(daves.id()).queue_position(), 0);
  EXPECT_EQ(state(second.id()).queue_position(), 1);
  EXPECT_EQ(state(third.id()).queue_position(), 2);
  CommandResult list = As("bob", "quota list");
  EXPECT_TRUE(absl::StrContains(list.output, "vision")) << list.output;
  ASSERT_TRUE(As("bob").Cancel(first.id()).ok());
  ASSERT_TRUE(wait_running(daves.id())) << state(daves.id()).waiting_reason();
  EXPECT_EQ(state(second.id()).state(), v1::JOB_STATE_QUEUED);

  // Weights: set by cluster admins, shown by quota list; bad ones refused, nothing changed.
  CommandResult set = Admin("quota set nlp --weight 3");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  list = Admin("quota list");
  EXPECT_TRUE(absl::StrContains(list.output, "nlp              3 ")) << list.output;
  set = Admin("quota set vision gpus=1 --borrow 0 --weight 2.5");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  EXPECT_TRUE(absl::StrContains(set.output, "vision           2.5 ")) << set.output;
  for (const char* bad :
       {"quota set nlp --weight -1", "quota set nlp --weight 0", "quota set nlp --weight abc",
        "quota set nlp", "quota set nlp --borrow 2 --weight 2"}) {
    CommandResult result = Admin(bad);
    EXPECT_EQ(result.exit_code, 2) << bad << ": " << result.output;
  }
  EXPECT_EQ(Admin("quota set ghost --weight 2").exit_code, 1);
  EXPECT_EQ(As("alice", "quota set nlp --weight 9").exit_code, 1) << "cluster admins only";
  // A hostile client past the CLI's checks: the server refuses too.
  for (double weight : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9}) {
    v1::SetQuotaRequest request;
    request.set_team("nlp");
    request.set_weight(weight);
    grpc::Status status = Root().SetQuota(request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << weight;
  }
  list = Admin("quota list");
  EXPECT_TRUE(absl::StrContains(list.output, "nlp              3 ")) << list.output;
  for (const v1::Job& job : {second, third, daves}) (void)Root().Cancel(job.id());
}

// Preemption across teams (issue 29): a team within its nominal quota takes back what another
// team borrows, and a higher priority takes a device from another team's job.
class AccessPreemptionTest : public AccessTest {
 protected:
  std::vector<std::string> ServerFlags() const override {
    return {"--preemption-min-runtime-seconds", "0.5"};
  }
};

TEST_F(AccessPreemptionTest, TeamsReclaimBorrowedDevicesAndHigherPriorityCrossesTeams) {
  StartGpuWorker(2, 8);
  ASSERT_EQ(Admin("quota set vision gpus=1 --borrow 1").exit_code, 0);
  ASSERT_EQ(Admin("quota set nlp gpus=1").exit_code, 0);
  auto gpu_job = [](const std::string& name, const std::string& team, int priority) {
    return LongGpuJob(name, team, priority);
  };
  auto get = [&](const std::string& id) { return JobNow(id); };
  auto wait = [&](const std::string& id, v1::JobState state) { return WaitForState(id, state); };
  // Vision runs both GPUs: one of its nominal quota, one borrowed.
  v1::Job v1_job, v2_job, n1_job, n2_job, urgent;
  ASSERT_TRUE(As("bob").Submit(gpu_job("v1", "vision", 0), &v1_job).ok());
  ASSERT_TRUE(wait(v1_job.id(), v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(As("bob").Submit(gpu_job("v2", "vision", 0), &v2_job).ok());
  ASSERT_TRUE(wait(v2_job.id(), v1::JOB_STATE_RUNNING));
  absl::SleepFor(absl::Seconds(1));  // past the minimum run time
  // nlp wants its nominal GPU back: the most recently started vision job gives it back.
  ASSERT_TRUE(As("dave").Submit(gpu_job("n1", "nlp", 0), &n1_job).ok());
  ASSERT_TRUE(wait(n1_job.id(), v1::JOB_STATE_RUNNING)) << get(n1_job.id()).waiting_reason();
  const v1::Job reclaimed = get(v2_job.id());
  EXPECT_EQ(reclaimed.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(reclaimed.preemptions(), 1);
  EXPECT_TRUE(absl::StrContains(reclaimed.error(),
                                absl::StrCat("preempted by ", n1_job.id(),
                                             " (team vision runs past its nominal quota; team "
                                             "nlp takes back its own)")))
      << reclaimed.error();
  EXPECT_EQ(get(v1_job.id()).state(), v1::JOB_STATE_RUNNING) << "within vision's nominal quota";
  // It does not take the GPU back in turn: nlp runs within its nominal quota.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(get(n1_job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(get(v2_job.id()).preemptions(), 1);
  EXPECT_EQ(get(n1_job.id()).preemptions(), 0);

  // Without quotas, priority crosses teams: vision's priority-5 job takes nlp's newest GPU.
  for (const v1::Job& job : {v1_job, v2_job}) ASSERT_TRUE(As("bob").Cancel(job.id()).ok());
  ASSERT_EQ(Admin("quota set vision gpus=none").exit_code, 0);
  ASSERT_EQ(Admin("quota set nlp gpus=none").exit_code, 0);
  ASSERT_TRUE(As("dave").Submit(gpu_job("n2", "nlp", 0), &n2_job).ok());
  ASSERT_TRUE(wait(n2_job.id(), v1::JOB_STATE_RUNNING));
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(As("bob").Submit(gpu_job("urgent", "vision", 5), &urgent).ok());
  ASSERT_TRUE(wait(urgent.id(), v1::JOB_STATE_RUNNING)) << get(urgent.id()).waiting_reason();
  const v1::Job taken = get(n2_job.id());
  EXPECT_EQ(taken.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(taken.error(),
                                absl::StrCat("preempted by ", urgent.id(), " (priority 5 over 0)")))
      << taken.error();
  EXPECT_EQ(get(n1_job.id()).state(), v1::JOB_STATE_RUNNING) << "one victim is enough";
  CommandResult status = As("dave", "status " + n2_job.id());
  EXPECT_TRUE(absl::StrContains(status.output, "preemptions:")) << status.output;
  for (const v1::Job& job : {n1_job, n2_job, urgent}) (void)Root().Cancel(job.id());
}

// kill -9 of the server while users submit and cancel: every job that exists has its submit row,
// every cancelled job its cancel row.
TEST_F(AccessTest, NoChangeWithoutItsAuditRowAcrossKillMinus9) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> submitters;
  for (const char* user : {"bob", "dave"}) {
    submitters.emplace_back([&, user] {
      const Caller caller = As(user);
      for (int i = 0; !stop.load(); ++i) {
        v1::Job job;
        if (caller.Submit(Job(absl::StrCat(user, "-", i)), &job).ok() && i % 3 == 0) {
          (void)caller.Cancel(job.id());
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(1500));
  cluster_.KillServer(SIGKILL);
  stop.store(true);
  for (std::thread& t : submitters) t.join();
  cluster_.StartServer();
  std::map<std::string, std::set<std::string>> rows;  // job id -> allowed actions
  for (const v1::AuditRecord& r : Root().Audit()) {
    if (r.decision() == "allowed") rows[r.target()].insert(r.action());
  }
  const std::set<std::string> all = Root().List(true);
  ASSERT_GT(all.size(), 3u);
  int cancelled = 0;
  for (const std::string& id : all) {
    EXPECT_TRUE(rows[id].contains("job.submit")) << id << " has no submit row";
    v1::Job job;
    ASSERT_TRUE(Root().Get(id, &job).ok());
    if (job.state() == v1::JOB_STATE_CANCELLED) {
      ++cancelled;
      EXPECT_TRUE(rows[id].contains("job.cancel")) << id << " has no cancel row";
    }
  }
  EXPECT_GT(cancelled, 0);
}

// A state directory from before users: the shared token keeps working (as a cluster admin and a
// worker, audited as "legacy") until the server runs without --token-file.
TEST(AccessUpgradeTest, ASingleTokenStateDirectoryKeepsWorkingThenMigrates) {
  TestCluster cluster;
  const std::string legacy = "legacy-token-0123456789abcdef";
  const std::string token_file = WriteFile(cluster.dir() + "/legacy.token", legacy + "\n");
  cluster.StartServer({"--token-file", token_file});
  const Caller old_client(cluster.address(), legacy);
  v1::Job before;
  const grpc::Status submitted = old_client.Submit(Job("before"), &before);
  ASSERT_TRUE(submitted.ok()) << submitted.error_code() << " " << submitted.error_message()
                              << ReadAll(cluster.dir() + "/server.log");
  cluster.KillServer(SIGTERM);

  CommandResult boot = RunCommand(
      absl::StrCat(STOKER_SERVER_PATH_FOR_TEST, " bootstrap-admin --state-dir ", cluster.dir(),
                   "/server --user root --token-out ", cluster.dir(), "/root.token"));
  ASSERT_EQ(boot.exit_code, 0) << boot.output;
  cluster.StartServer({"--token-file", token_file});
  v1::Job during;
  ASSERT_TRUE(old_client.Submit(Job("during"), &during).ok()) << "legacy mode keeps the old token";
  EXPECT_EQ(during.owner(), "legacy");
  const std::string root_token(absl::StripAsciiWhitespace(ReadAll(cluster.dir() + "/root.token")));
  const Caller root(cluster.address(), root_token);
  EXPECT_EQ(root.List(true), (std::set<std::string>{before.id(), during.id()}));
  bool legacy_audited = false;
  for (const v1::AuditRecord& r : root.Audit()) {
    legacy_audited |= r.principal() == "legacy" && r.action() == "job.submit";
  }
  EXPECT_TRUE(legacy_audited);
  EXPECT_TRUE(absl::StrContains(ReadAll(cluster.dir() + "/server.log"), "legacy token accepted"));
  cluster.KillServer(SIGTERM);

  // Legacy mode off: the old token is refused, the admin's works.
  cluster.StartServer();
  v1::WhoAmIResponse me;
  EXPECT_EQ(old_client.WhoAmI(&me).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(root.WhoAmI(&me).ok());
  EXPECT_EQ(me.user().name(), "root");
  EXPECT_TRUE(me.user().cluster_admin());
  // A second bootstrap is refused.
  boot = RunCommand(absl::StrCat(STOKER_SERVER_PATH_FOR_TEST, " bootstrap-admin --state-dir ",
                                 cluster.dir(), "/server --user mallory"));
  EXPECT_EQ(boot.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(boot.output, "a cluster admin exists already")) << boot.output;
}

// What deploy/ does: secrets made outside the server, made known by its first start.
TEST(AccessBootstrapFlagsTest, AFirstStartCreatesTheAdminAndAJoinTokenFromFiles) {
  TestCluster cluster;
  const std::string admin = "stku_" + std::string(64, 'a');
  const std::string join = "stkj_" + std::string(64, 'b');
  const std::string admin_file = WriteFile(cluster.dir() + "/admin.token", admin + "\n");
  const std::string join_file = WriteFile(cluster.dir() + "/join.token", join + "\n");
  const std::vector<std::string> flags = {"--bootstrap-admin",           "admin",
                                          "--bootstrap-token-file",      admin_file,
                                          "--bootstrap-join-token-file", join_file};
  cluster.StartServer(flags);
  v1::WhoAmIResponse me;
  ASSERT_TRUE(Caller(cluster.address(), admin).WhoAmI(&me).ok());
  EXPECT_TRUE(me.user().cluster_admin());
  EXPECT_EQ(Caller(cluster.address(), "").WhoAmI(&me).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const pid_t worker = cluster.StartWorker("w-1", {"--join-token-file", join_file});
  const std::string kept = cluster.dir() + "/w-1/worker.token";
  for (int i = 0; i < 300 && !std::filesystem::exists(kept); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(std::filesystem::exists(kept)) << ReadAll(cluster.dir() + "/w-1.log");
  cluster.KillWorker(worker, SIGTERM);
  // A second start with the same flags changes nothing and says so.
  cluster.KillServer(SIGTERM);
  cluster.StartServer(flags);
  ASSERT_TRUE(Caller(cluster.address(), admin).WhoAmI(&me).ok());
  EXPECT_TRUE(absl::StrContains(ReadAll(cluster.dir() + "/server.log"),
                                "--bootstrap-admin ignored: a cluster admin exists already"));
  // A malformed secret is refused before serving.
  const std::string bad_file = WriteFile(cluster.dir() + "/bad.token", "not-a-user-token-at-all\n");
  CommandResult bad = RunCommand(absl::StrCat(
      "timeout 20 ", STOKER_SERVER_PATH_FOR_TEST, " --listen 127.0.0.1:0 --state-dir ",
      cluster.dir(), "/fresh --bootstrap-admin admin --bootstrap-token-file ", bad_file));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "must start with 'stku_'")) << bad.output;
}

}  // namespace
}  // namespace stoker::testing
