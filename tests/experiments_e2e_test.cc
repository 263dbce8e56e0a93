// Hyperparameter searches end to end (issue 32): a real server, a worker and trainers on a small
// dataset. A grid runs every point within its concurrency cap and is compared; random trials are
// cancelled with their experiment; ASHA stops trials by its rule, and a server killed mid-search
// loses no decision and repeats none; bad spaces are refused naming their line.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

std::string SearchJob(const std::string& train, const std::string& search) {
  return absl::StrCat(R"(name: digits
dataset:
  format: idx
  train_images: train-images.idx
  train_labels: train-labels.idx
  test_images: test-images.idx
  test_labels: test-labels.idx
  classes: 10
model: {type: mlp, hidden: [16]}
resources: {cpus: 1}
train: )",
                      train, "\n", search);
}

class ExperimentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = cluster_.dir() + "/data";
    std::filesystem::create_directories(root_);
    WriteDigits(root_, "train", 300);
    WriteDigits(root_, "test", 100);
    cluster_.StartServer({"--data-root", root_});
    cluster_.StartWorker("w1", {"--data-root", root_});
  }

  // Submits a job file through the CLI; the experiment id it printed.
  std::string Submit(const std::string& yaml) {
    const std::string path = cluster_.dir() + "/search.yaml";
    std::ofstream(path) << yaml;
    CommandResult result = cluster_.Cli("submit " + path);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    const size_t at = result.output.find("submitted experiment ");
    if (at == std::string::npos) return "";
    return result.output.substr(at + 21, 8);
  }

  absl::StatusOr<v1::Experiment> Get(const std::string& id) {
    grpc::ClientContext context;
    v1::GetExperimentRequest request;
    request.set_experiment_id(id);
    v1::Experiment experiment;
    grpc::Status status = cluster_.jobs().GetExperiment(&context, request, &experiment);
    if (!status.ok()) return absl::UnknownError(status.error_message());
    return experiment;
  }

  std::vector<v1::Job> Trials(const std::string& id) {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.set_experiment(id);
    request.set_limit(1000);
    v1::ListJobsResponse response;
    EXPECT_TRUE(cluster_.jobs().ListJobs(&context, request, &response).ok());
    return {response.jobs().begin(), response.jobs().end()};
  }

  // Polls until the experiment is no longer running; at every poll, no more trials queued or
  // running than `cap`. The experiment as it ended.
  v1::Experiment WaitDone(const std::string& id, int cap, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    v1::Experiment experiment;
    while (absl::Now() < deadline) {
      int live = 0;
      for (const v1::Job& job : Trials(id)) live += IsFinal(job.state()) ? 0 : 1;
      EXPECT_LE(live, cap) << "the concurrency cap was exceeded";
      absl::StatusOr<v1::Experiment> got = Get(id);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) break;
      experiment = *got;
      if (experiment.state() != v1::EXPERIMENT_STATE_RUNNING) return experiment;
      absl::SleepFor(absl::Milliseconds(200));
    }
    ADD_FAILURE() << "experiment " << id << " did not finish";
    return experiment;
  }

  TestCluster cluster_;
  std::string root_;
};

TEST_F(ExperimentsTest, AGridRunsEveryPointWithinItsCapAndIsCompared) {
  const std::string id = Submit(SearchJob("{epochs: 1, batch_size: 50}", R"(search:
  method: grid
  max_concurrent_trials: 2
  parameters:
    train.optimizer.lr: {choice: [0.05, 0.1, 0.2]}
    model.hidden: {choice: [[16], [32]]}
)"));
  ASSERT_EQ(id, "e-000001");
  const v1::Experiment done = WaitDone(id, 2, absl::Seconds(180));
  EXPECT_EQ(done.state(), v1::EXPERIMENT_STATE_COMPLETED);
  EXPECT_EQ(done.trial_count(), 6);
  ASSERT_EQ(done.trials_size(), 6);
  const std::vector<v1::Job> trials = Trials(id);
  ASSERT_EQ(trials.size(), 6u);
  std::set<std::string> points;
  for (const v1::Job& job : trials) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.id() << ": " << job.error();
    EXPECT_EQ(job.experiment_id(), id);
    EXPECT_EQ(job.labels().at("experiment"), id);
    const std::string lr = job.labels().at("train.optimizer.lr");
    const std::string hidden = job.labels().at("model.hidden");
    points.insert(lr + " " + hidden);
    double written = 0;
    ASSERT_TRUE(absl::SimpleAtod(lr, &written));
    EXPECT_DOUBLE_EQ(job.spec().train().optimizer().lr(), written) << "the trial runs its value";
    EXPECT_EQ(job.spec().model().hidden(0), hidden == "[16]" ? 16 : 32);
    EXPECT_TRUE(absl::StartsWith(job.spec().name(), "digits-t")) << job.spec().name();
  }
  EXPECT_EQ(points.size(), 6u) << "every point once";

  // Listing by experiment and by label.
  CommandResult listed = cluster_.Cli("list --experiment " + id);
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_EQ(std::count(listed.output.begin(), listed.output.end(), '\n'), 7) << listed.output;
  CommandResult labelled =
      cluster_.Cli("list --label train.optimizer.lr=0.1 --label experiment=" + id);
  EXPECT_EQ(labelled.exit_code, 0) << labelled.output;
  EXPECT_EQ(std::count(labelled.output.begin(), labelled.output.end(), '\n'), 3) << labelled.output;
  CommandResult bad_label = cluster_.Cli("list --label lr");
  EXPECT_EQ(bad_label.exit_code, 2) << bad_label.output;
  EXPECT_TRUE(absl::StrContains(bad_label.output, "'lr' is not key=value")) << bad_label.output;

  // The comparison shows only what differs: both parameters for all trials, only lr for two
  // trials of one width.
  CommandResult csv = cluster_.Cli("experiment compare " + id + " -o csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  const std::vector<std::string> lines = absl::StrSplit(csv.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << csv.output;
  EXPECT_EQ(lines[0],
            "trial,job,state,model.hidden,train.optimizer.lr,best,best_epoch,final,epochs");
  std::vector<std::string> same_width;
  for (const v1::Job& job : trials) {
    if (job.labels().at("model.hidden") == "[32]") same_width.push_back(job.id());
  }
  CommandResult two = cluster_.Cli("experiment compare " + id + " " + same_width[0] + " " +
                                   same_width[1] + " -o csv");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(absl::StartsWith(two.output, "trial,job,state,train.optimizer.lr,best,"))
      << two.output;
  CommandResult json = cluster_.Cli("experiment compare " + id + " -o json");
  EXPECT_TRUE(absl::StrContains(json.output, "\"metric\": \"test_accuracy\"")) << json.output;
  CommandResult status = cluster_.Cli("experiment status " + id);
  EXPECT_TRUE(absl::StrContains(status.output, "state:      completed")) << status.output;
  EXPECT_TRUE(absl::StrContains(status.output, "best:       trial ")) << status.output;
  CommandResult list = cluster_.Cli("experiment list");
  EXPECT_TRUE(absl::StrContains(list.output, id)) << list.output;

  // The best trial's weights.
  const std::string out = cluster_.dir() + "/best.safetensors";
  CommandResult best = cluster_.Cli("artifact " + id + " --best -o " + out);
  EXPECT_EQ(best.exit_code, 0) << best.output;
  EXPECT_GT(std::filesystem::file_size(out), 100u);
  EXPECT_TRUE(absl::StrContains(best.output, "best trial of " + id)) << best.output;
}

TEST_F(ExperimentsTest, CancellingAnExperimentCancelsItsTrialsAndMakesNoMore) {
  const std::string id = Submit(SearchJob("{epochs: 200, batch_size: 10}", R"(search:
  method: random
  seed: 5
  max_trials: 6
  max_concurrent_trials: 1
  parameters:
    train.optimizer.lr: {log_uniform: [0.001, 0.1]}
)"));
  ASSERT_FALSE(id.empty());
  // Wait until its first trial runs.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<v1::Job> trials;
  while (absl::Now() < deadline) {
    trials = Trials(id);
    if (!trials.empty() && trials[0].state() == v1::JOB_STATE_RUNNING) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(trials.size(), 1u) << "one at a time";
  ASSERT_EQ(trials[0].state(), v1::JOB_STATE_RUNNING);
  CommandResult cancelled = cluster_.Cli("experiment cancel " + id);
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.output;
  absl::StatusOr<v1::Job> ended = cluster_.WaitForFinal(trials[0].id(), absl::Seconds(30));
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(absl::StrContains(ended->error(), "cancelled with experiment " + id))
      << ended->error();
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(Trials(id).size(), 1u) << "no trial after the cancel";
  absl::StatusOr<v1::Experiment> experiment = Get(id);
  ASSERT_TRUE(experiment.ok());
  EXPECT_EQ(experiment->state(), v1::EXPERIMENT_STATE_CANCELLED);
  CommandResult again = cluster_.Cli("experiment cancel " + id);
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_TRUE(absl::StrContains(again.output, "already cancelled")) << again.output;
}

// ASHA on real trainers, with the server killed (SIGKILL) while the search runs: every trial is
// made once, every rung record once, and each stop follows the rule over the records before it.
TEST_F(ExperimentsTest, AshaStopsTrialsByItsRuleAcrossAServerKill) {
  const std::string id = Submit(SearchJob("{epochs: 4, batch_size: 50}", R"(search:
  method: asha
  seed: 11
  max_trials: 8
  max_concurrent_trials: 2
  asha: {grace_epochs: 1, reduction_factor: 2}
  parameters:
    train.optimizer.lr: {log_uniform: [0.0001, 0.5]}
)"));
  ASSERT_FALSE(id.empty());
  // Kill the server once some trials exist, then start it again on the same state.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && Trials(id).size() < 3) absl::SleepFor(absl::Milliseconds(100));
  cluster_.KillServer(SIGKILL);
  cluster_.StartServer({"--data-root", root_});
  const v1::Experiment done = WaitDone(id, 2, absl::Seconds(240));
  EXPECT_EQ(done.state(), v1::EXPERIMENT_STATE_COMPLETED);
  ASSERT_EQ(done.trials_size(), 8);
  const std::vector<v1::Job> trials = Trials(id);
  EXPECT_EQ(trials.size(), 8u) << "each trial made once";
  std::set<std::string> indices;
  int stopped = 0;
  for (const v1::Job& job : trials) {
    indices.insert(job.labels().at("trial"));
    if (job.state() == v1::JOB_STATE_STOPPED) {
      ++stopped;
      EXPECT_TRUE(absl::StrContains(job.error(), "stopped by ASHA at rung")) << job.error();
      EXPECT_GT(job.checkpoint_step(), 0) << "a stopped trial keeps its last checkpoint";
    } else {
      EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.id() << ": " << job.error();
    }
  }
  EXPECT_EQ(indices.size(), 8u);
  EXPECT_GT(stopped, 0) << "rungs at 1 and 2 epochs, factor 2: some trial stops";
  // The records: one per (rung, trial); a stop where the rule says.
  std::set<std::pair<int, int>> seen;
  std::map<int, std::vector<double>> rungs;
  for (const v1::AshaRecord& record : done.asha_records()) {
    EXPECT_TRUE(seen.insert({record.rung(), record.trial()}).second)
        << "rung " << record.rung() << " trial " << record.trial() << " recorded twice";
    int better = 0;
    for (double m : rungs[record.rung()]) better += m >= record.metric() ? 1 : 0;
    rungs[record.rung()].push_back(record.metric());
    const int n = static_cast<int>(rungs[record.rung()].size());
    if (record.rung() < 2) {
      EXPECT_EQ(record.stopped(), better >= std::max(1, n / 2))
          << "rung " << record.rung() << " trial " << record.trial();
    }
  }
  CommandResult compare = cluster_.Cli("experiment compare " + id);
  EXPECT_TRUE(absl::StrContains(compare.output, "stopped")) << compare.output;
}

// The README's example: an ASHA search over the MLP on Fashion-MNIST finds a trial of 0.89.
TEST(ExampleSearchTest, TheFashionMnistSearchFindsATrialOfAtLeast089) {
  ASSERT_TRUE(std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
      << "Fashion-MNIST is missing: install the Debian package dataset-fashion-mnist "
         "(scripts/setup.sh does)";
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  CommandResult submitted =
      cluster.Cli("submit " STOKER_SOURCE_DIR "/examples/fashion-mnist-search.yaml");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  v1::Experiment experiment;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::GetExperimentRequest request;
    request.set_experiment_id("e-000001");
    ASSERT_TRUE(cluster.jobs().GetExperiment(&context, request, &experiment).ok());
    if (experiment.state() != v1::EXPERIMENT_STATE_RUNNING) break;
    absl::SleepFor(absl::Seconds(1));
  }
  ASSERT_EQ(experiment.state(), v1::EXPERIMENT_STATE_COMPLETED);
  const double took = (experiment.end_time_unix_ms() - experiment.submit_time_unix_ms()) / 1e3;
  CommandResult status = cluster.Cli("experiment status e-000001");
  std::cout << status.output << "\nthe search took " << took << " s\n";
  const size_t at = status.output.find("final test_accuracy ");
  ASSERT_NE(at, std::string::npos) << status.output;
  double best = 0;
  ASSERT_TRUE(absl::SimpleAtod(status.output.substr(at + 20, 6), &best)) << status.output;
  EXPECT_GE(best, 0.89) << status.output;
}

TEST_F(ExperimentsTest, BadSpacesAreRefusedWithTheirLine) {
  const std::string path = cluster_.dir() + "/bad.yaml";
  std::ofstream(path) << SearchJob("{epochs: 1, batch_size: 50}", R"(search:
  method: random
  max_trials: 3
  parameters:
    train.optimizer.lr: {log_uniform: [-1, 0.1]}
)");
  CommandResult refused = cluster_.Cli("submit " + path);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(absl::StrContains(
      refused.output, "bad.yaml:16:39: search.parameters.train.optimizer.lr: log_uniform needs"))
      << refused.output;
  // Sent around the CLI, the server refuses it too, naming the field.
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_name("raw");
  request.mutable_spec()->mutable_dataset()->set_format("idx");
  request.mutable_spec()->mutable_dataset()->set_train_images("train-images.idx");
  request.mutable_spec()->mutable_dataset()->set_train_labels("train-labels.idx");
  request.mutable_spec()->mutable_dataset()->set_test_images("test-images.idx");
  request.mutable_spec()->mutable_dataset()->set_test_labels("test-labels.idx");
  request.mutable_search()->set_method("bayes");
  v1::SubmitJobResponse response;
  grpc::Status status = cluster_.jobs().SubmitJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "search.method")) << status.error_message();
  grpc::ClientContext context2;
  request.mutable_search()->set_method("grid");
  v1::ParameterSpace* space = request.mutable_search()->add_parameters();
  space->set_path("train.optimizer.lr");
  space->set_kind("choice");
  space->add_choices("[1, 2]");
  status = cluster_.jobs().SubmitJob(&context2, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "trial 0")) << status.error_message();
  EXPECT_TRUE(Trials("e-000001").empty());
}

}  // namespace
}  // namespace stoker::testing
