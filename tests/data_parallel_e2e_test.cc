// Data-parallel jobs (issue 16) with real processes on loopback: a real server, workers, loaders
// and trainers whose ranks meet through the server's rendezvous and sum their gradients with
// Gloo over TCP.
//
// - Two ranks of batch b reach the weights of one rank of batch 2b (the same stream of global
//   batches, sliced by rank), within fp32 summation-order noise; so do four ranks on two
//   "machines" (two workers told to act as two), summing in two levels.
// - Gang scheduling: a gang starts whole or waits holding nothing, saying why.
// - GPU ranks (resources.gpus: 1 each) are accepted and each gets its own GPU (fake GPUs here).
// - Faults: a rank's trainer killed with SIGKILL stops the whole gang within seconds; the job is
//   requeued and resumes from rank 0's last checkpoint. Cancel stops every rank.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

// The MLP example's shape on a subset of Fashion-MNIST, fp32 so that only the summation order
// separates two ranks from one.
v1::JobSpec DataParallelJob(int replicas, int batch_size, int epochs) {
  v1::JobSpec spec = SmallFashionMnistJob(epochs, 3000, 1000);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_train()->set_batch_size(batch_size);
  spec.mutable_train()->set_seed(7);
  spec.mutable_loader()->set_processes(1);
  spec.mutable_resources()->set_cpus(1);
  spec.mutable_resources()->set_replicas(replicas);
  return spec;
}

// Processes are matched with the cluster's own directory among the needles: another test run on
// the machine has jobs of the same ids.
bool WaitUntilNoProcessMentions(const std::vector<std::string>& needles, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!FindProcesses(needles).empty()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

absl::StatusOr<Checkpoint> Artifact(TestCluster& cluster, const std::string& job_id) {
  const std::string path = absl::StrCat(cluster.dir(), "/", job_id, ".safetensors");
  CommandResult result = cluster.Cli(absl::StrCat("artifact ", job_id, " -o ", path));
  if (result.exit_code != 0) return absl::InternalError(result.output);
  return ReadCheckpoint(path);
}

bool HistoryMentions(TestCluster& cluster, const std::string& job_id, const std::string& text) {
  for (const v1::JobEvent& event : cluster.History(job_id)) {
    if (absl::StrContains(event.message(), text)) return true;
  }
  return false;
}

// `ranks` (data-parallel) and `one` (one rank of the same global batch) took the same number of
// steps to the same weights, up to the order of the sums.
void ExpectSameTraining(TestCluster& cluster, const v1::Job& ranks, const v1::Job& one) {
  EXPECT_EQ(ranks.progress().step(), one.progress().step());
  absl::StatusOr<Checkpoint> a = Artifact(cluster, ranks.id());
  absl::StatusOr<Checkpoint> b = Artifact(cluster, one.id());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  double worst = 0, largest = 0;
  for (size_t t = 0; t < a->tensors.size(); ++t) {
    const CheckpointTensor& x = a->tensors[t];
    const CheckpointTensor& y = b->tensors[t];
    ASSERT_EQ(x.name, y.name);
    ASSERT_EQ(x.values.size(), y.values.size()) << x.name;
    for (size_t i = 0; i < x.values.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(x.values[i]) - y.values[i]));
      largest = std::max(largest, std::fabs(static_cast<double>(y.values[i])));
    }
  }
  std::cout << ranks.rank_placements_size() << " ranks vs one: max |weight difference| " << worst
            << " (largest weight " << largest << "), test accuracy "
            << ranks.progress().test_accuracy() << " vs " << one.progress().test_accuracy() << ", "
            << ranks.progress().step() << " steps\n";
  EXPECT_GT(largest, 0.01);
  // fp32 sums of 32 + 32 rows against sums of 64 rows differ in the last bits; ~190 SGD steps
  // with momentum carry that to ~1e-5 at most.
  EXPECT_LT(worst, 1e-4) << "largest weight " << largest;
  EXPECT_NEAR(ranks.progress().test_accuracy(), one.progress().test_accuracy(), 0.01);
}

TEST(DataParallelE2eTest, TwoRanksOnTwoWorkersMatchOneRankWithTheGlobalBatch) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--cpus", "1"});
  // As if w2 were another machine: its ranks refuse shared memory, so the gang sums over Gloo.
  cluster.StartWorker("w2", {"--cpus", "1", "--collective-transport", "gloo"});

  absl::StatusOr<v1::Job> two = cluster.Submit(DataParallelJob(2, 32, 2));
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<v1::Job> two_done = cluster.WaitForFinal(two->id(), absl::Seconds(120));
  ASSERT_TRUE(two_done.ok()) << two_done.status();
  ASSERT_EQ(two_done->state(), v1::JOB_STATE_SUCCEEDED) << two_done->error();
  // One rank on each worker (each has one core).
  ASSERT_EQ(two_done->rank_placements_size(), 2);
  EXPECT_NE(two_done->rank_placements(0).worker_id(), two_done->rank_placements(1).worker_id());
  EXPECT_TRUE(HistoryMentions(cluster, two->id(), "rank 1 of 2, gloo over"));
  // Each rank's epoch line is there, rank 1's named as such (its train loss is its own half's).
  int rank0_epochs = 0, rank1_epochs = 0;
  for (const v1::JobEvent& event : cluster.History(two->id())) {
    if (event.type() != v1::EVENT_TYPE_EPOCH) continue;
    if (event.message().empty()) ++rank0_epochs;
    if (event.message() == "rank 1") ++rank1_epochs;
  }
  EXPECT_EQ(rank0_epochs, 2);
  EXPECT_EQ(rank1_epochs, 2);
  CommandResult logs = cluster.Cli("logs " + two->id());
  EXPECT_NE(logs.output.find("] rank 1: epoch 2/2: train loss "), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("] epoch 2/2: train loss "), std::string::npos) << logs.output;

  absl::StatusOr<v1::Job> one = cluster.Submit(DataParallelJob(1, 64, 2));
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<v1::Job> one_done = cluster.WaitForFinal(one->id(), absl::Seconds(120));
  ASSERT_TRUE(one_done.ok()) << one_done.status();
  ASSERT_EQ(one_done->state(), v1::JOB_STATE_SUCCEEDED) << one_done->error();

  ExpectSameTraining(cluster, *two_done, *one_done);
}

// Four ranks on two workers that act as two machines: each worker's two ranks sum through shared
// memory, the two machines through Gloo between their first ranks (the two-level sum), and reach
// the weights of one rank of the 4 x 16 global batch.
TEST(DataParallelE2eTest, FourRanksOnTwoMachinesSumInTwoLevelsAndMatchOneRank) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--cpus", "2", "--collective-machine-for-tests", "machine-a"});
  cluster.StartWorker("w2", {"--cpus", "2", "--collective-machine-for-tests", "machine-b"});
  absl::StatusOr<v1::Job> four_done = cluster.RunJob(DataParallelJob(4, 16, 2), absl::Seconds(180));
  ASSERT_TRUE(four_done.ok()) << four_done.status();
  ASSERT_EQ(four_done->state(), v1::JOB_STATE_SUCCEEDED) << four_done->error();
  ASSERT_EQ(four_done->rank_placements_size(), 4);
  std::set<std::string> workers;
  for (const auto& placement : four_done->rank_placements()) {
    workers.insert(placement.worker_id());
  }
  EXPECT_EQ(workers, (std::set<std::string>{"w1", "w2"}));
  EXPECT_TRUE(HistoryMentions(cluster, four_done->id(),
                              "two-level: shared memory within each of 2 "
                              "machines"));

  absl::StatusOr<v1::Job> one_done = cluster.RunJob(DataParallelJob(1, 64, 2), absl::Seconds(120));
  ASSERT_TRUE(one_done.ok()) << one_done.status();
  ASSERT_EQ(one_done->state(), v1::JOB_STATE_SUCCEEDED) << one_done->error();
  ExpectSameTraining(cluster, *four_done, *one_done);
}

TEST(DataParallelE2eTest, AGangStartsWholeOrWaitsHoldingNothing) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--cpus", "1"});
  cluster.StartWorker("w2", {"--cpus", "1"});

  // Three ranks of one core cannot run on two one-core workers: the gang waits, holds nothing,
  // and says why; a job of one rank behind it runs meanwhile.
  absl::StatusOr<v1::Job> big = cluster.Submit(DataParallelJob(3, 32, 1));
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<v1::Job> small_done =
      cluster.RunJob(DataParallelJob(1, 64, 1), absl::Seconds(120));
  ASSERT_TRUE(small_done.ok()) << small_done.status();
  EXPECT_EQ(small_done->state(), v1::JOB_STATE_SUCCEEDED) << small_done->error();

  absl::StatusOr<v1::Job> waiting = cluster.WaitFor(
      big->id(), [](const v1::Job& j) { return !j.waiting_reason().empty(); }, absl::Seconds(10));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StrContains(waiting->waiting_reason(), "3")) << waiting->waiting_reason();
  CommandResult workers = cluster.Cli("workers");
  EXPECT_FALSE(absl::StrContains(workers.output, big->id())) << workers.output;

  // A third worker makes room: the gang starts and finishes.
  cluster.StartWorker("w3", {"--cpus", "1"});
  absl::StatusOr<v1::Job> big_done = cluster.WaitForFinal(big->id(), absl::Seconds(120));
  ASSERT_TRUE(big_done.ok()) << big_done.status();
  EXPECT_EQ(big_done->state(), v1::JOB_STATE_SUCCEEDED) << big_done->error();
  EXPECT_EQ(big_done->rank_placements_size(), 3);
}

// A job slow enough (delayed loader) to be interrupted between checkpoints.
v1::JobSpec SlowDataParallelJob() {
  v1::JobSpec spec = DataParallelJob(2, 32, 4);
  spec.mutable_loader()->set_delay_ms(15);
  spec.mutable_checkpoint()->set_every_steps(20);
  spec.set_max_retries(2);
  return spec;
}

TEST(DataParallelE2eTest, AKilledRankStopsTheGangWhichResumesFromTheCheckpoint) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  cluster.StartWorker("w1", {"--cpus", "1"});
  cluster.StartWorker("w2", {"--cpus", "1"});
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowDataParallelJob());
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.checkpoint_step() >= 40; }, absl::Seconds(90));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::JOB_STATE_RUNNING);

  // SIGKILL rank 1's trainer: rank 0 must not hang in its all-reduce; the whole attempt ends.
  const std::vector<std::string> rank1 = {"stoker-trainer", cluster.dir(), job->id(), "--rank 1"};
  std::vector<pid_t> pids = FindProcesses(rank1);
  ASSERT_EQ(pids.size(), 1u);
  const absl::Time killed = absl::Now();
  kill(pids[0], SIGKILL);
  EXPECT_TRUE(WaitUntilNoProcessMentions({"stoker-trainer", cluster.dir(), job->id(), "-a1"},
                                         absl::Seconds(15)))
      << "a trainer of attempt 1 still runs";
  absl::StatusOr<v1::Job> second = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.attempt() >= 2; }, absl::Seconds(15));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(15));

  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_TRUE(HistoryMentions(cluster, job->id(), "resumed from the checkpoint at step"));
  EXPECT_GT(done->progress().test_accuracy(), 0.6);
}

TEST(DataParallelE2eTest, ALostWorkerStopsTheGangWhichResumesOnTheWorkersLeft) {
  TestCluster cluster;
  cluster.StartServer({"--lease-seconds", "2"});
  cluster.StartWorker("w1", {"--cpus", "1"});
  const pid_t w2 = cluster.StartWorker("w2", {"--cpus", "1"});
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowDataParallelJob());
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [](const v1::Job& j) { return j.checkpoint_step() >= 20; }, absl::Seconds(90));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  ASSERT_EQ(checkpointed->state(), v1::JOB_STATE_RUNNING);

  // The whole worker w2 goes (its trainer dies with it): w1's rank must not hang.
  cluster.KillWorker(w2, SIGKILL);
  EXPECT_TRUE(WaitUntilNoProcessMentions({"stoker-trainer", cluster.dir(), job->id(), "-a1"},
                                         absl::Seconds(15)))
      << "a trainer of attempt 1 still runs";
  // One one-core worker cannot hold two ranks: the gang waits, holding nothing, until a worker
  // joins; then it resumes from the checkpoint and finishes.
  absl::StatusOr<v1::Job> waiting = cluster.WaitFor(
      job->id(),
      [](const v1::Job& j) {
        return j.attempt() >= 1 && j.state() == v1::JOB_STATE_QUEUED && !j.waiting_reason().empty();
      },
      absl::Seconds(15));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  cluster.StartWorker("w3", {"--cpus", "1"});
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_TRUE(HistoryMentions(cluster, job->id(), "resumed from the checkpoint at step"));
  std::set<std::string> workers;
  for (const v1::Placement& placement : done->rank_placements()) {
    workers.insert(placement.worker_id());
  }
  EXPECT_EQ(workers, (std::set<std::string>{"w1", "w3"}));
}

// A gang of two one-GPU ranks on a worker with two (fake) GPUs: accepted, each rank given its
// own GPU through CUDA_VISIBLE_DEVICES, and trained to the end. Fake GPUs train on the cpu
// backend, so the ranks still sum with Gloo (real GPUs: NCCL, tests/gpu/check.sh's one-rank
// tests; two real GPUs were not available).
TEST(DataParallelE2eTest, OneGpuPerRankRunsWithADistinctDeviceForEachRank) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--fake-gpus-for-tests", "2", "--cpus", "2"});
  v1::JobSpec spec = DataParallelJob(2, 32, 1);
  spec.mutable_resources()->set_gpus(1);
  absl::StatusOr<v1::Job> done = cluster.RunJob(spec, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  ASSERT_EQ(done->rank_placements_size(), 2);
  std::set<int> gpus;
  for (const v1::Placement& placement : done->rank_placements()) {
    EXPECT_EQ(placement.worker_id(), "w1");
    ASSERT_EQ(placement.gpu_indices_size(), 1);
    gpus.insert(placement.gpu_indices(0));
  }
  EXPECT_EQ(gpus, (std::set<int>{0, 1}));
  // Each rank's trainer was told its own GPU, and summed through shared memory (the cpu backend
  // trains; both ranks are on this machine).
  for (int gpu : {0, 1}) {
    EXPECT_TRUE(HistoryMentions(
        cluster, done->id(),
        absl::StrCat("devices: CUDA_VISIBLE_DEVICES=", gpu, " (fake GPUs for tests")))
        << "no rank was given GPU " << gpu;
  }
  EXPECT_TRUE(HistoryMentions(cluster, done->id(), "rank 1 of 2, shared memory"));
  EXPECT_TRUE(HistoryMentions(cluster, done->id(), "training on cpu"));
  EXPECT_GT(done->progress().test_accuracy(), 0.6);
}

TEST(DataParallelE2eTest, CancelStopsEveryRank) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--cpus", "2"});
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowDataParallelJob());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitForStep(job->id(), 10).ok());
  // Both ranks on the one worker of two cores.
  EXPECT_EQ(FindProcesses({"stoker-trainer", cluster.dir(), job->id()}).size(), 2u);
  CommandResult cancel = cluster.Cli("cancel " + job->id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_TRUE(
      WaitUntilNoProcessMentions({"stoker-trainer", cluster.dir(), job->id()}, absl::Seconds(10)));
  absl::StatusOr<v1::Job> done = cluster.WaitForFinal(job->id(), absl::Seconds(10));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace stoker::testing
