// The input pipeline under SIGKILL, through the real agent: a killed loader is respawned and the
// job trains on exactly the same batches; a killed trainer takes its loaders and the job's
// shared memory with it.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

// Open file descriptors that point at a job region memfd, in the processes of `cluster` (those
// whose command line names its directory: the worker agent, trainers and loaders). Other
// processes on the machine, such as another test run's, are not this test's business.
std::vector<std::string> OpenJobRegions(const TestCluster& cluster) {
  std::vector<std::string> found;
  for (const pid_t pid : FindProcesses({cluster.dir()})) {
    std::error_code error;
    const std::filesystem::path fd_dir = absl::StrCat("/proc/", pid, "/fd");
    for (const auto& fd : std::filesystem::directory_iterator(fd_dir, error)) {
      const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
      if (!error && absl::StrContains(target, "memfd:stoker-job")) {
        found.push_back(fd.path().string() + " -> " + target);
      }
    }
  }
  return found;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// ~20 ms per batch with two loaders: 141 batches, about 3 s, so a loader killed at step 20 leaves
// the job running for several of the agent's once-a-second metric updates.
v1::JobSpec SlowJob() {
  v1::JobSpec spec = SmallFashionMnistJob(3, 6000, 1000);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_loader()->set_processes(2);
  spec.mutable_loader()->set_delay_ms(40);
  return spec;
}

absl::StatusOr<Checkpoint> Artifact(TestCluster& cluster, const std::string& job_id) {
  const std::string path = cluster.dir() + "/" + job_id + ".safetensors";
  CommandResult result = cluster.Cli("artifact " + job_id + " -o " + path);
  if (result.exit_code != 0) return absl::InternalError(result.output);
  return ReadCheckpoint(path);
}

// A server and worker w1 whose watchdog stops a silent pipeline after `stall_seconds`, running
// SlowJob(), which has taken 10 steps when this returns.
absl::StatusOr<v1::Job> StartSlowJobWithStallLimit(TestCluster& cluster, int stall_seconds) {
  cluster.StartServer();
  cluster.StartWorker("w1", {"--trainer-stall-seconds", absl::StrCat(stall_seconds)});
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob());
  if (!job.ok()) return job.status();
  return cluster.WaitForStep(job->id(), 10);
}

// The first attempt's directory on worker w1, in this cluster's work directory (job ids repeat
// across clusters on one machine).
std::string FirstAttemptDir(const TestCluster& cluster, const v1::Job& job) {
  return cluster.dir() + "/w1/" + job.id() + "-a1/";
}

TEST(PipelineFaultsTest, KilledLoaderIsRespawnedAndTrainingIsIdentical) {
  TestCluster cluster;
  cluster.StartServer();
  const std::string metrics = absl::StrCat("127.0.0.1:", FreePort());
  cluster.StartWorker("w1", {"--metrics-listen", metrics});

  absl::StatusOr<v1::Job> straight = cluster.Submit(SlowJob());
  ASSERT_TRUE(straight.ok());
  absl::StatusOr<v1::Job> straight_done = cluster.WaitForFinal(straight->id(), absl::Seconds(90));
  ASSERT_TRUE(straight_done.ok() && straight_done->state() == v1::JOB_STATE_SUCCEEDED)
      << straight_done->error();

  absl::StatusOr<v1::Job> disturbed = cluster.Submit(SlowJob());
  ASSERT_TRUE(disturbed.ok());
  ASSERT_TRUE(cluster.WaitForStep(disturbed->id(), 20).ok());
  const std::string attempt_dir = FirstAttemptDir(cluster, *disturbed);
  std::vector<pid_t> loaders = FindProcesses({"stoker-loader", attempt_dir, "--index 1"});
  ASSERT_EQ(loaders.size(), 1u);
  ASSERT_EQ(kill(loaders[0], SIGKILL), 0);

  // The agent notices, respawns it, and counts the restart in the exported metrics.
  bool counted = false;
  std::string last_seen;
  for (int i = 0; i < 100 && !counted; ++i) {
    CommandResult scrape = RunCommand("curl -s http://" + metrics + "/metrics");
    for (absl::string_view line : absl::StrSplit(scrape.output, '\n')) {
      if (!absl::StartsWith(line, "stoker_loader_restarts_total{") ||
          !absl::StrContains(line, absl::StrCat("job_id=\"", disturbed->id(), "\""))) {
        continue;
      }
      last_seen = std::string(line);
      counted = absl::EndsWith(line, "} 1");
    }
    if (!counted) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(counted) << "last seen: " << last_seen;

  absl::StatusOr<v1::Job> disturbed_done = cluster.WaitForFinal(disturbed->id(), absl::Seconds(90));
  ASSERT_TRUE(disturbed_done.ok());
  ASSERT_EQ(disturbed_done->state(), v1::JOB_STATE_SUCCEEDED) << disturbed_done->error();
  EXPECT_EQ(disturbed_done->attempt(), 1) << "a loader death must not cost the attempt";
  CommandResult logs = cluster.Cli("logs " + disturbed->id());
  EXPECT_NE(logs.output.find("loader 1 killed by signal 9"), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("respawned"), std::string::npos) << logs.output;

  // Same batches in the same order: bit-identical weights.
  absl::StatusOr<Checkpoint> a = Artifact(cluster, straight->id());
  absl::StatusOr<Checkpoint> b = Artifact(cluster, disturbed->id());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values) << a->tensors[i].name;
  }
}

TEST(PipelineFaultsTest, AHungTrainerIsStoppedAndTheJobRetried) {
  TestCluster cluster;
  absl::StatusOr<v1::Job> job = StartSlowJobWithStallLimit(cluster, 3);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string attempt_dir = FirstAttemptDir(cluster, *job);
  std::vector<pid_t> trainers = FindProcesses({"stoker-trainer", attempt_dir});
  ASSERT_EQ(trainers.size(), 1u);
  ASSERT_EQ(kill(trainers[0], SIGSTOP), 0);  // alive, holding its slot, doing nothing

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  bool saw_watchdog = false;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    saw_watchdog =
        saw_watchdog || (event.attempt() == 1 &&
                         absl::StrContains(event.message(), "the trainer made no progress for"));
  }
  EXPECT_TRUE(saw_watchdog);
  EXPECT_TRUE(FindProcesses({attempt_dir}).empty()) << "the stopped trainer is gone";
}

// Issue 12: a loader stopped in its tracks (alive, making nothing) used to leave the trainer
// waiting 5 minutes for its batch, and the agent's watchdog watched only the trainer. The whole
// pipeline falls silent instead, and the error names the batch and the loader that owes it.
TEST(PipelineFaultsTest, AStoppedLoaderIsFoundNamingTheBatchAndTheLoader) {
  TestCluster cluster;
  absl::StatusOr<v1::Job> job = StartSlowJobWithStallLimit(cluster, 3);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string attempt_dir = FirstAttemptDir(cluster, *job);
  std::vector<pid_t> loaders = FindProcesses({"stoker-loader", attempt_dir, "--index 1"});
  ASSERT_EQ(loaders.size(), 1u);
  const absl::Time stopped = absl::Now();
  ASSERT_EQ(kill(loaders[0], SIGSTOP), 0);

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  std::string watchdog;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    if (event.attempt() == 1 && absl::StrContains(event.message(), "made no progress")) {
      watchdog = event.message();
    }
  }
  EXPECT_TRUE(absl::StrContains(watchdog, "the pipeline made no progress for")) << watchdog;
  EXPECT_TRUE(absl::StrContains(watchdog, "the trainer waits for batch ")) << watchdog;
  EXPECT_TRUE(absl::StrContains(watchdog, " of loader 1 (pid ")) << watchdog;
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(50));
  EXPECT_TRUE(FindProcesses({attempt_dir}).empty()) << "the stopped loader is gone";
}

// Issue 12: the trainer says nothing while it evaluates, so with a short --trainer-stall-seconds
// an evaluation longer than that was taken for a hang. It beats for every test batch now.
TEST(PipelineFaultsTest, ALongEvaluationDoesNotTripTheWatchdog) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--trainer-stall-seconds", "1"});
  // 10000 test samples through three 4096-wide layers: seconds of evaluation on 2 cores (about
  // 0.8 TFLOP; two such layers took only 1.3 s on a 2-core AMD EPYC with AVX-512), each
  // 128-sample batch a fraction of a second.
  v1::JobSpec spec = SmallFashionMnistJob(1, 512, 10000);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_model()->clear_hidden();
  for (int i = 0; i < 3; ++i) spec.mutable_model()->add_hidden(4096);
  spec.set_max_retries(0);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 1);
  int64_t training_started_ms = 0, epoch_done_ms = 0;
  for (const v1::JobEvent& event : cluster.History(job->id())) {
    EXPECT_FALSE(absl::StrContains(event.message(), "made no progress")) << event.message();
    if (absl::StartsWith(event.message(), "training on "))
      training_started_ms = event.time_unix_ms();
    if (event.type() == v1::EVENT_TYPE_EPOCH) epoch_done_ms = event.time_unix_ms();
  }
  // The trainer sent no event for longer than the watchdog's limit (4 quick steps, then the
  // evaluation): a watchdog that only listened to events would have stopped it.
  EXPECT_GT(epoch_done_ms - training_started_ms, 1500);
}

TEST(PipelineFaultsTest, KilledTrainerTakesItsLoadersAndSharedMemoryWithIt) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  v1::JobSpec spec = SlowJob();
  spec.set_max_retries(0);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(cluster.WaitForStep(job->id(), 10).ok());
  const std::string attempt_dir = FirstAttemptDir(cluster, *job);
  std::vector<pid_t> trainers = FindProcesses({"stoker-trainer", attempt_dir});
  ASSERT_EQ(trainers.size(), 1u);
  ASSERT_EQ(FindProcesses({"stoker-loader", attempt_dir}).size(), 2u);
  ASSERT_FALSE(OpenJobRegions(cluster).empty());
  ASSERT_EQ(kill(trainers[0], SIGKILL), 0);

  absl::StatusOr<v1::Job> failed = cluster.WaitForFinal(job->id(), absl::Seconds(10));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->error().find("trainer killed by signal 9"), std::string::npos)
      << failed->error();
  // No stoker process of the attempt remains, and no process of the cluster (the agent included)
  // holds a job region.
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (absl::Now() < deadline &&
         (!FindProcesses({attempt_dir}).empty() || !OpenJobRegions(cluster).empty())) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(FindProcesses({attempt_dir}).empty());
  std::vector<std::string> regions = OpenJobRegions(cluster);
  EXPECT_TRUE(regions.empty()) << regions.front();

  // The worker takes the next job.
  absl::StatusOr<v1::Job> next = cluster.Submit(SmallFashionMnistJob(1, 2000, 500));
  ASSERT_TRUE(next.ok());
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(next->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
}

TEST(PipelineFaultsTest, AutotuneAddsLoadersWithoutChangingTheBatchStream) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  v1::JobSpec spec = SmallFashionMnistJob(2, 12000, 500);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_loader()->set_delay_ms(25);  // one loader cannot keep up
  spec.mutable_loader()->set_processes(0);  // auto
  absl::StatusOr<v1::Job> tuned = cluster.Submit(spec);
  ASSERT_TRUE(tuned.ok());
  spec.mutable_loader()->set_processes(1);
  spec.mutable_loader()->set_delay_ms(0);
  absl::StatusOr<v1::Job> fixed = cluster.Submit(spec);
  ASSERT_TRUE(fixed.ok());
  for (const std::string& id : {tuned->id(), fixed->id()}) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(id, absl::Seconds(120));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  }
  CommandResult logs = cluster.Cli("logs " + tuned->id());
  EXPECT_NE(logs.output.find("autotune: input-bound"), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("loader processes 1 -> 2"), std::string::npos) << logs.output;
  // More loaders mid-run, same batches: bit-identical weights to the one-loader run.
  absl::StatusOr<Checkpoint> a = Artifact(cluster, tuned->id());
  absl::StatusOr<Checkpoint> b = Artifact(cluster, fixed->id());
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    EXPECT_TRUE(a->tensors[i].values == b->tensors[i].values) << a->tensors[i].name;
  }
}

}  // namespace
}  // namespace stoker::testing
