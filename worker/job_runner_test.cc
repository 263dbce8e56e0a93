#include "worker/job_runner.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "data/prepared_dataset.h"
#include "data/test_util.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "worker/process.h"

namespace stoker {
namespace {

// Issue 12: a stopped trainer or loader held a job for 10 minutes; a silent pipeline is now
// stopped in tens of seconds (evaluations and checkpoints beat, so they do not trip it).
TEST(RunnerOptionsTest, ASilentPipelineIsStoppedWithinTensOfSeconds) {
  EXPECT_EQ(RunnerOptions().trainer_stall_timeout, absl::Seconds(30));
}

// Spawn's default_env adds only names the parent does not set (the worker's own environment
// overrides what the runner would add).
TEST(SpawnTest, DefaultEnvironmentEntriesGiveWayToTheParentsOwn) {
  testing::TempDir dir;
  auto child_sees = [&](const std::string& name) {
    const std::string log = dir.File(name + ".log");
    absl::StatusOr<pid_t> pid = Spawn({{"/bin/sh", "-c", "echo \"[$" + name + "]\""},
                                       {},
                                       log,
                                       {name + "=passive", "=ignored", "NOEQUALS"}});
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return std::string();
    std::optional<ExitInfo> done;
    for (int i = 0; i < 500 && !(done = TryReap(*pid)); ++i) usleep(10000);
    EXPECT_TRUE(done.has_value() && !done->signaled && done->code == 0);
    std::ifstream in(log);
    std::string line;
    std::getline(in, line);
    return line;
  };
  unsetenv("STOKER_SPAWN_TEST_A");
  EXPECT_EQ(child_sees("STOKER_SPAWN_TEST_A"), "[passive]");
  setenv("STOKER_SPAWN_TEST_B", "active", 1);
  EXPECT_EQ(child_sees("STOKER_SPAWN_TEST_B"), "[active]");
  unsetenv("STOKER_SPAWN_TEST_B");
}

TEST(AutoLoaderLimitTest, TwoPerCoreBetweenTwoAndSixteen) {
  EXPECT_EQ(AutoLoaderLimit(1), 2);
  EXPECT_EQ(AutoLoaderLimit(2), 4);
  EXPECT_EQ(AutoLoaderLimit(6), 12);
  EXPECT_EQ(AutoLoaderLimit(64), 16);
}

TEST(AutotuneLoaderCountTest, DoublesWhileTheTrainerWaitsUpToTheLimit) {
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.50, 1.0), 2);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.11, 2.0), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 6, 0.30, 4.0), 6) << "capped at the limit";
  EXPECT_EQ(AutotuneLoaderCount(6, 6, 0.30, 6.0), 6);
}

// Issue 12: autotune went 1 -> 2 -> 4 while reporting "loaders busy 0% each". When the loaders
// idle while the trainer waits, the stall is not theirs and more loaders cannot help.
TEST(AutotuneLoaderCountTest, GrowsOnlyWhenTheLoadersAreTheBottleneck) {
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.90, 0.0), 1) << "loaders idle: the stall is elsewhere";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 0.4), 2) << "20% busy each";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 1.2), 2) << "60% busy each is not enough";
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.50, 1.3), 4) << "65% busy each";
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.30, 3.9), 8);
}

TEST(AutotuneLoaderCountTest, KeepsTheCountBetweenTheTwoThresholds) {
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.10, 0.1), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.05, 0.1), 4);
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.02, 0.1), 4);
}

TEST(AutotuneLoaderCountTest, HalvesOnlyWhenHalfTheLoadersWouldStillBeHalfIdle) {
  // 8 loaders, 1.5 loader-seconds of work per second: 4 loaders would be 38% busy.
  EXPECT_EQ(AutotuneLoaderCount(8, 8, 0.0, 1.5), 4);
  // 4 loaders with the same work: 2 would be 75% busy, so keep 4.
  EXPECT_EQ(AutotuneLoaderCount(4, 8, 0.0, 1.5), 4);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.01, 0.5), 1);
  EXPECT_EQ(AutotuneLoaderCount(2, 8, 0.01, 0.6), 2);
  EXPECT_EQ(AutotuneLoaderCount(1, 8, 0.0, 0.0), 1) << "never below one loader";
  EXPECT_EQ(AutotuneLoaderCount(3, 8, 0.0, 0.2), 1) << "3 -> 1: integer half";
}

// The rules cannot chase each other: a count reached by halving does not double again on the
// same load unless the trainer then waits.
TEST(AutotuneLoaderCountTest, ShrinkingThenGrowingNeedsTheTrainerToWait) {
  const int shrunk = AutotuneLoaderCount(8, 16, 0.0, 1.0);
  EXPECT_EQ(shrunk, 4);
  EXPECT_EQ(AutotuneLoaderCount(shrunk, 16, 0.0, 1.0), 2) << "still plenty: 2 are 50% busy";
  EXPECT_EQ(AutotuneLoaderCount(2, 16, 0.0, 1.0), 2) << "1 would be 100% busy";
}

// Issue 16: a worker may run several ranks of one job; their files must not meet.
TEST(AttemptDirectoryTest, RanksOtherThanZeroGetTheirOwnDirectory) {
  v1::Assignment assignment;
  assignment.set_job_id("j-000007");
  assignment.set_attempt(3);
  EXPECT_EQ(AttemptDirectory("/w", assignment), "/w/j-000007-a3") << "a job of one rank";
  assignment.set_replicas(2);
  EXPECT_EQ(AttemptDirectory("/w", assignment), "/w/j-000007-a3") << "rank 0";
  assignment.set_rank(1);
  EXPECT_EQ(AttemptDirectory("/w", assignment), "/w/j-000007-a3-r1");
}

TEST(RankTotalBatchesTest, ARankCountsTheGlobalBatchesOfItsEpochs) {
  EXPECT_EQ(RankTotalBatches(60000, 128, 1, 10), 4690u) << "469 batches an epoch";
  EXPECT_EQ(RankTotalBatches(60000, 128, 0, 10), 4690u) << "replicas 0 is one rank";
  EXPECT_EQ(RankTotalBatches(60000, 128, 2, 10), 2350u) << "235 global batches of 256";
  EXPECT_EQ(RankTotalBatches(10, 4, 3, 1), 1u) << "one global batch of 12 holds all 10";
}

std::string ArgAfter(const std::vector<std::string>& argv, const std::string& flag) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) return argv[i + 1];
  }
  return "<absent>";
}

TEST(TrainerArgumentsTest, AJobOfOneRankGetsNoDataParallelFlags) {
  RunnerOptions options;
  options.trainer_path = "/bin/stoker-trainer";
  v1::Assignment assignment;
  assignment.set_job_id("j-1");
  assignment.set_attempt(1);
  const std::vector<std::string> argv =
      TrainerArguments(options, assignment, "/w/j-1-a1", 5, 6, "/w/j-1-a1/job.pb", "", 10, 60000);
  EXPECT_EQ(argv[0], "/bin/stoker-trainer");
  EXPECT_EQ(ArgAfter(argv, "--checkpoint"), "/w/j-1-a1/checkpoint.safetensors");
  EXPECT_EQ(ArgAfter(argv, "--region-fd"), "5");
  EXPECT_EQ(ArgAfter(argv, "--rank"), "<absent>");
  EXPECT_EQ(ArgAfter(argv, "--server"), "<absent>");
  EXPECT_EQ(ArgAfter(argv, "--train-samples"), "<absent>");
}

TEST(TrainerArgumentsTest, ADataParallelRankFindsTheRendezvousWithoutTheTokenOnItsCommandLine) {
  RunnerOptions options;
  options.trainer_path = "/bin/stoker-trainer";
  options.server_address = "10.0.0.1:50051";
  options.worker_id = "w2";
  options.token_file = "/etc/stoker/token";
  options.tls_ca = "/etc/stoker/ca.pem";
  options.collective_host = "node2";
  options.collective_timeout = absl::Seconds(45);
  v1::Assignment assignment;
  assignment.set_job_id("j-1");
  assignment.set_attempt(4);
  assignment.set_rank(1);
  assignment.set_replicas(2);
  const std::vector<std::string> argv =
      TrainerArguments(options, assignment, "/w/j-1-a4-r1", 5, 6, "/w/j-1-a4-r1/job.pb",
                       "/w/r.safetensors", 10, 60000);
  EXPECT_EQ(ArgAfter(argv, "--checkpoint"), "<absent>") << "only rank 0 writes checkpoints";
  EXPECT_EQ(ArgAfter(argv, "--resume"), "/w/r.safetensors") << "every rank resumes";
  EXPECT_EQ(ArgAfter(argv, "--rank"), "1");
  EXPECT_EQ(ArgAfter(argv, "--replicas"), "2");
  EXPECT_EQ(ArgAfter(argv, "--train-samples"), "60000");
  EXPECT_EQ(ArgAfter(argv, "--server"), "10.0.0.1:50051");
  EXPECT_EQ(ArgAfter(argv, "--worker-id"), "w2");
  EXPECT_EQ(ArgAfter(argv, "--job-id"), "j-1");
  EXPECT_EQ(ArgAfter(argv, "--attempt"), "4");
  EXPECT_EQ(ArgAfter(argv, "--collective-host"), "node2");
  EXPECT_EQ(ArgAfter(argv, "--collective-timeout-seconds"), "45");
  EXPECT_EQ(ArgAfter(argv, "--token-file"), "/etc/stoker/token");
  EXPECT_EQ(ArgAfter(argv, "--tls-ca"), "/etc/stoker/ca.pem");
  EXPECT_EQ(ArgAfter(argv, "--train-data"), "/w/j-1-a4-r1/train.samples");
}

constexpr double kMiB = 1024.0 * 1024;

// Fashion-MNIST's training set: 60000 samples of 784 bytes.
DatasetSummary FashionMnist() {
  DatasetSummary train;
  train.count = 60000;
  train.features = 784;
  train.sample_bytes = 784;
  train.sample_dims = {28, 28};
  train.classes = 10;
  return train;
}

TEST(PipelineMemoryTest, LoadersShareOneCopyOfTheTrainingSet) {
  const PipelineMemory memory = EstimatePipelineMemory(FashionMnist(), 128, 8, /*decodes=*/true);
  EXPECT_DOUBLE_EQ(memory.ring_bytes, 8.0 * 128 * 785);
  EXPECT_DOUBLE_EQ(memory.dataset_bytes, 60000.0 * 785);
  EXPECT_DOUBLE_EQ(memory.per_loader_bytes, kLoaderProcessBytes + 8.0 * 60000 + 784);
  EXPECT_DOUBLE_EQ(memory.prepare_bytes, memory.dataset_bytes);
  EXPECT_DOUBLE_EQ(EstimatePipelineMemory(FashionMnist(), 128, 8, false).prepare_bytes, 0);
  // 512 MiB available, 256 MiB for the pipeline: 16 loaders fit. A copy of the training set each
  // (as before) would not have: 16 x 44.9 MiB.
  const int64_t available = 512 * 1024 * 1024;
  ASSERT_GT(16 * memory.dataset_bytes, available / 2.0);
  absl::StatusOr<int> loaders = FitLoadersInMemory(memory, 16, /*autotune=*/false, available);
  ASSERT_TRUE(loaders.ok()) << loaders.status();
  EXPECT_EQ(*loaders, 16);
  EXPECT_EQ(*FitLoadersInMemory(memory, 16, /*autotune=*/true, available), 16);
}

TEST(PipelineMemoryTest, WhatDoesNotFitIsRefusedSayingWhy) {
  const PipelineMemory memory = EstimatePipelineMemory(FashionMnist(), 128, 8, /*decodes=*/false);
  // 40 MiB available, 20 for the pipeline: the ring (0.8 MiB) and four loaders of 4.5 MiB fit,
  // five do not.
  const int64_t available = 40 * 1024 * 1024;
  EXPECT_EQ(*FitLoadersInMemory(memory, 4, false, available), 4);
  absl::StatusOr<int> five = FitLoadersInMemory(memory, 5, false, available);
  EXPECT_TRUE(absl::IsResourceExhausted(five.status())) << five.status();
  EXPECT_TRUE(absl::StrContains(five.status().message(),
                                "loader.processes: 5 loader(s) of 4 MiB each (the 0.04 GiB "
                                "training set is one read-only mapping they share, not "
                                "counted per loader), plus a ring of 0.00 GiB"))
      << five.status().message();
  EXPECT_TRUE(absl::StrContains(five.status().message(),
                                "need 0.02 GiB; this machine has 0.0 GiB available, half of it "
                                "for the data pipeline: use fewer loader processes"))
      << five.status().message();
  EXPECT_EQ(*FitLoadersInMemory(memory, 16, /*autotune=*/true, available), 4);
  EXPECT_EQ(*FitLoadersInMemory(memory, 16, /*autotune=*/true, 20 * 1024 * 1024), 2);
  EXPECT_TRUE(absl::IsResourceExhausted(FitLoadersInMemory(memory, 16, true, 1024 * 1024).status()))
      << "not even one loader fits";
  // Decoding the 44.9 MiB training set in the agent does not fit in 20 MiB either.
  const PipelineMemory decoded = EstimatePipelineMemory(FashionMnist(), 128, 8, true);
  absl::StatusOr<int> refused = FitLoadersInMemory(decoded, 1, false, available);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "the agent decodes the 0.04 GiB training set once"))
      << refused.status().message();
}

// JobRunner::Run up to its preparation of the training set (no trainer or loader is started: the
// attempt is cancelled or fails before).
class PrepareInRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.File("data");
    std::filesystem::create_directories(root_);
    const LabeledSamples data =
        testing::PatternSamples(50, {4, 4}, [](int i, int j) { return i * 3 + j; });
    testing::WriteGzip(root_ + "/images.gz", testing::IdxBytes({50, 4, 4}, data.samples));
    testing::WriteRaw(root_ + "/labels.idx", testing::IdxBytes({50}, data.labels));
    spec_ = DefaultJobSpec();
    v1::DatasetSpec* dataset = spec_.mutable_dataset();
    dataset->set_train_images("images.gz");
    dataset->set_train_labels("labels.idx");
    dataset->set_test_images("images.gz");
    dataset->set_test_labels("labels.idx");
    spec_.mutable_train()->set_batch_size(8);
    spec_.mutable_loader()->set_processes(2);
  }

  // Runs the attempt; `on_event` sees each event as it comes.
  AttemptOutcome Run(
      bool cancel, const std::function<void(JobRunner&, const std::string&)>& on_event = nullptr) {
    RunnerOptions options;
    options.trainer_path = "/nonexistent/stoker-trainer";
    options.loader_path = "/nonexistent/stoker-loader";
    options.work_dir = dir_.File("work");
    options.data_root = root_;
    v1::Assignment assignment;
    assignment.set_job_id("j-000001");
    assignment.set_attempt(1);
    *assignment.mutable_spec() = spec_;
    JobRunner* self = nullptr;
    auto runner = std::make_unique<JobRunner>(options, assignment, [&](const v1::JobEvent& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e.message());
      if (on_event) on_event(*self, e.message());
    });
    self = runner.get();
    if (cancel) runner->Cancel();
    return runner->Run();
  }

  testing::TempDir dir_;
  std::string root_;
  v1::JobSpec spec_;
  absl::Mutex mu_;
  std::vector<std::string> events_;
};

TEST_F(PrepareInRunTest, TheTrainingSetIsPreparedOnceForTheAttemptAndRemovedAfter) {
  int64_t mapped_count = -1;
  std::string path;
  const AttemptOutcome outcome = Run(true, [&](JobRunner& runner, const std::string& message) {
    if (message.rfind("prepared the training set in ", 0) != 0) return;
    path = runner.training_set_path();
    absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(path);
    mapped_count = mapped.ok() ? (*mapped)->view().count : -2;
  });
  EXPECT_EQ(outcome.state, v1::JOB_STATE_CANCELLED) << outcome.error;
  EXPECT_EQ(mapped_count, 50) << "the file loaders map, complete before they start";
  EXPECT_EQ(path, dir_.File("work") + "/j-000001-a1/train.samples");
  EXPECT_FALSE(std::filesystem::exists(path)) << "removed when the attempt ended";
  absl::MutexLock lock(&mu_);
  ASSERT_GE(events_.size(), 2u);
  EXPECT_EQ(events_[0], "preparing the training set: the loaders will share one read-only copy");
  EXPECT_TRUE(absl::StartsWith(events_[1], "prepared the training set in ") &&
              absl::EndsWith(events_[1], " s: 0.0 MiB decoded into train.samples"))
      << events_[1];
}

TEST_F(PrepareInRunTest, WhatAKilledTrainerLeftOfItsTestSplitIsRemovedAfter) {
  // A trainer killed while decoding an image test split leaves test.samples' temporary file in
  // the attempt's directory; the attempt's end removes it, and only it besides train.samples.
  const std::string attempt_dir = dir_.File("work") + "/j-000001-a1";
  std::string leftover, kept;
  const AttemptOutcome outcome = Run(true, [&](JobRunner&, const std::string& message) {
    if (message.rfind("prepared the training set in ", 0) != 0) return;
    leftover = attempt_dir + "/test.samples.tmp-Ab12Cd";
    kept = attempt_dir + "/trainer.log";
    std::ofstream(leftover) << "partial";
    std::ofstream(kept) << "log";
  });
  EXPECT_EQ(outcome.state, v1::JOB_STATE_CANCELLED) << outcome.error;
  ASSERT_FALSE(leftover.empty());
  EXPECT_FALSE(std::filesystem::exists(leftover));
  EXPECT_TRUE(std::filesystem::exists(kept)) << "logs stay";
}

TEST_F(PrepareInRunTest, BadDataFailsTheJobNamingTheFileAsWritten) {
  // Gzipped samples cut short: the probe reads only their header, the preparation all of them.
  std::vector<uint8_t> whole = testing::ReadRaw(root_ + "/images.gz");
  testing::WriteRaw(root_ + "/images.gz", std::vector<uint8_t>(whole.begin(), whole.end() - 20));
  const AttemptOutcome outcome = Run(false);
  EXPECT_EQ(outcome.state, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(outcome.permanent) << "bad data is not retried";
  EXPECT_TRUE(absl::StartsWith(outcome.error, "images.gz: ")) << outcome.error;
  EXPECT_EQ(outcome.error.find(root_), std::string::npos) << outcome.error;
  EXPECT_FALSE(std::filesystem::exists(dir_.File("work") + "/j-000001-a1/train.samples"));
}

TEST_F(PrepareInRunTest, AFileItCannotWriteFailsOnlyTheAttempt) {
  // A directory where the file goes: the rename into place fails.
  const std::string path = dir_.File("work") + "/j-000001-a1/train.samples";
  std::filesystem::create_directories(path + "/x");
  const AttemptOutcome outcome = Run(false);
  EXPECT_EQ(outcome.state, v1::JOB_STATE_FAILED);
  EXPECT_FALSE(outcome.permanent) << "another worker may do better";
  EXPECT_TRUE(absl::StrContains(outcome.error, path + ": cannot write the prepared training set: "))
      << outcome.error;
  EXPECT_TRUE(std::filesystem::is_directory(path + "/x")) << "not ours to remove";
}

}  // namespace
}  // namespace stoker
