// Several jobs per worker (issue 16, first slice), with real processes on loopback: jobs are
// packed onto one worker while their cpus, memory and GPUs fit, each GPU belongs to one job (the
// trainer is told its own through CUDA_VISIBLE_DEVICES), nothing is over-committed, a job that
// waits says which resource it waits for, and cancel and drain act per job.
//
// GPUs here are the worker's test-only fake ones (--fake-gpus-for-tests): the trainer logs the
// CUDA_VISIBLE_DEVICES it was given and trains on the cpu backend.
#include <signal.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::SmallFashionMnistJob;
using testing::TestCluster;

// A job slow enough (loader delay) that several overlap: ~0.7 s per epoch of 47 batches.
v1::JobSpec SlowJob(int epochs, int gpus, int cpus) {
  v1::JobSpec spec = SmallFashionMnistJob(epochs, 6000, 1000);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_loader()->set_processes(1);
  spec.mutable_loader()->set_delay_ms(15);
  spec.mutable_resources()->set_gpus(gpus);
  spec.mutable_resources()->set_cpus(cpus);
  return spec;
}

v1::Job Get(TestCluster& cluster, const std::string& id) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  EXPECT_TRUE(cluster.jobs().GetJob(&context, request, &job).ok());
  return job;
}

v1::ListWorkersResponse Workers(TestCluster& cluster) {
  grpc::ClientContext context;
  v1::ListWorkersResponse response;
  EXPECT_TRUE(cluster.jobs().ListWorkers(&context, v1::ListWorkersRequest(), &response).ok());
  return response;
}

// Checks the server's ledger of every worker: cpus and memory within what it advertised, each
// GPU held by at most one job. Returns the number of running jobs it saw.
int CheckNothingOverCommitted(TestCluster& cluster) {
  int running = 0;
  const v1::ListWorkersResponse workers = Workers(cluster);
  for (const v1::WorkerStatus& worker : workers.workers()) {
    EXPECT_LE(worker.cpus_used(), worker.cpus()) << worker.worker_id();
    EXPECT_LE(worker.memory_used_bytes(), worker.memory_bytes()) << worker.worker_id();
    std::set<int> gpus;
    int cpus = 0;
    for (const v1::Placement& placement : worker.placements()) {
      cpus += placement.cpus();
      for (int index : placement.gpu_indices()) {
        EXPECT_TRUE(gpus.insert(index).second) << "GPU " << index << " held twice";
      }
    }
    EXPECT_EQ(cpus, worker.cpus_used());
    running += worker.placements_size();
  }
  return running;
}

// The trainer's "devices: ..." line from the job's history ("" if none yet).
std::string DevicesLine(TestCluster& cluster, const std::string& id) {
  for (const v1::JobEvent& event : cluster.History(id)) {
    if (absl::StartsWith(event.message(), "devices: ")) return event.message();
  }
  return "";
}

// Polls until `done` holds, checking the ledger at every turn; false after `timeout`.
bool PollChecking(TestCluster& cluster, absl::Duration timeout, const std::function<bool()>& done,
                  int max_running) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    EXPECT_LE(CheckNothingOverCommitted(cluster), max_running);
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST(PackingTest, TwoCpuJobsRunAtOnceOnOneWorker) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--cpus", "2"});
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob(3, 0, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  // Both train at the same time on the one worker.
  bool both_stepping = PollChecking(
      cluster, absl::Seconds(60),
      [&] {
        const v1::Job a = Get(cluster, ids[0]), b = Get(cluster, ids[1]);
        return a.state() == v1::JOB_STATE_RUNNING && b.state() == v1::JOB_STATE_RUNNING &&
               a.progress().step() > 0 && b.progress().step() > 0;
      },
      2);
  ASSERT_TRUE(both_stepping) << "the two 1-cpu jobs never ran at once";
  CommandResult workers = cluster.Cli("workers");
  EXPECT_NE(workers.output.find("2 used, 0 free"), std::string::npos) << workers.output;
  for (const std::string& id : ids) {
    const v1::Job job = Get(cluster, id);
    EXPECT_EQ(job.worker_id(), "w1");
    EXPECT_EQ(job.placement().cpus(), 1);
    EXPECT_EQ(job.placement().gpu_indices_size(), 0);
    // The trainer runs with the job's one thread.
    EXPECT_EQ(DevicesLine(cluster, id), "devices: no GPU, 1 cpu threads");
  }
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(id, absl::Seconds(120));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
    EXPECT_GT(done->progress().test_accuracy(), 0.5);
  }
  workers = cluster.Cli("workers");
  EXPECT_NE(workers.output.find("0 used, 2 free"), std::string::npos) << workers.output;
}

TEST(PackingTest, FakeGpusGoOneToEachJobAndTheThirdJobWaitsForOne) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1", {"--fake-gpus-for-tests", "2", "--cpus", "2"});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob(3, 1, 0));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  // Two run at once, one GPU each; the third waits, saying for what.
  ASSERT_TRUE(PollChecking(
      cluster, absl::Seconds(60),
      [&] {
        return Get(cluster, ids[0]).progress().step() > 0 &&
               Get(cluster, ids[1]).progress().step() > 0;
      },
      2))
      << "the first two GPU jobs never ran at once";
  const v1::Job third = Get(cluster, ids[2]);
  ASSERT_EQ(third.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(third.waiting_reason(), "needs 1 GPUs, the most free on one worker is 0");
  CommandResult status = cluster.Cli("status " + ids[2]);
  EXPECT_NE(status.output.find("needs 1 GPUs, the most free on one worker is 0"), std::string::npos)
      << status.output;
  const std::string on_gpu0 =
      Get(cluster, ids[0]).placement().gpu_indices(0) == 0 ? ids[0] : ids[1];
  CommandResult workers = cluster.Cli("workers");
  EXPECT_NE(workers.output.find(absl::StrCat("gpu0:", on_gpu0)), std::string::npos)
      << workers.output;
  EXPECT_NE(workers.output.find("(fake)"), std::string::npos) << workers.output;

  std::set<int> first_two;
  for (int i = 0; i < 2; ++i) {
    const v1::Job job = Get(cluster, ids[i]);
    ASSERT_EQ(job.placement().gpu_indices_size(), 1);
    const int gpu = job.placement().gpu_indices(0);
    first_two.insert(gpu);
    EXPECT_EQ(job.placement().cpus(), 1);  // half the cores: its GPU's share
    // The trainer was given exactly its own GPU.
    EXPECT_EQ(DevicesLine(cluster, job.id()),
              absl::StrCat("devices: CUDA_VISIBLE_DEVICES=", gpu,
                           " (fake GPUs for tests: the cpu backend trains), 1 cpu threads"));
  }
  EXPECT_EQ(first_two, (std::set<int>{0, 1}));

  // When one finishes, the third gets its GPU; never more than two at once.
  ASSERT_TRUE(PollChecking(
      cluster, absl::Seconds(120), [&] { return IsFinal(Get(cluster, ids[2]).state()); }, 2));
  std::map<std::string, int> gpu_of;
  for (const std::string& id : ids) {
    const v1::Job job = Get(cluster, id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
    ASSERT_EQ(job.placement().gpu_indices_size(), 1);
    gpu_of[id] = job.placement().gpu_indices(0);
  }
  const v1::Job last = Get(cluster, ids[2]);
  // It started only after one of the first two ended.
  EXPECT_GE(last.start_time_unix_ms(), std::min(Get(cluster, ids[0]).end_time_unix_ms(),
                                                Get(cluster, ids[1]).end_time_unix_ms()));
  EXPECT_TRUE(absl::StrContains(DevicesLine(cluster, ids[2]),
                                absl::StrCat("CUDA_VISIBLE_DEVICES=", gpu_of[ids[2]], " ")));
}

TEST(PackingTest, CancelAndDrainActPerJobOnASharedWorker) {
  TestCluster cluster;
  cluster.StartServer();
  const pid_t w1 = cluster.StartWorker("w1", {"--cpus", "3"});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob(8, 0, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  for (const std::string& id : ids) ASSERT_TRUE(cluster.WaitForStep(id, 1).ok()) << id;
  // Cancelling one stops its trainer only.
  CommandResult cancel = cluster.Cli("cancel " + ids[0]);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  ASSERT_TRUE(PollChecking(
      cluster, absl::Seconds(20),
      [&] { return Workers(cluster).workers(0).placements_size() == 2; }, 3))
      << "the cancelled job's resources were not given back";
  EXPECT_EQ(testing::FindProcesses({"stoker-trainer", "/" + ids[0] + "-a1/"}).size(), 0u);
  EXPECT_EQ(Get(cluster, ids[1]).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(cluster, ids[2]).state(), v1::JOB_STATE_RUNNING);

  // Draining the worker gives both remaining jobs back (uncounted); another worker finishes them.
  cluster.KillWorker(w1, SIGTERM);
  cluster.StartWorker("w2", {"--cpus", "2"});
  for (int i = 1; i < 3; ++i) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(ids[i], absl::Seconds(120));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
    EXPECT_EQ(done->worker_id(), "w2");
    EXPECT_EQ(done->released_attempts(), 1);
    EXPECT_GT(done->attempt(), 1);
  }
  EXPECT_EQ(Get(cluster, ids[0]).state(), v1::JOB_STATE_CANCELLED);
}

TEST(PackingTest, FakeGpusAreRefusedOutsideTests) {
  TestCluster cluster;  // for its directory
  CommandResult remote = RunCommand(absl::StrCat("timeout 10 ", STOKER_WORKER_PATH_FOR_TEST,
                                                 " --server 192.0.2.1:50051 --work-dir ",
                                                 cluster.dir(), "/w --fake-gpus-for-tests 1"));
  EXPECT_EQ(remote.exit_code, 2) << remote.output;
  EXPECT_NE(remote.output.find("only with a server on loopback"), std::string::npos)
      << remote.output;
}

}  // namespace
}  // namespace stoker
