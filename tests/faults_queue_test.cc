// Fault tolerance with real processes on loopback, the queue: jobs spread over workers, a job that
// keeps failing, retried and concurrent submits stored exactly once.
#include <dirent.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/faults_util.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

TEST(FaultsTest, JobsSpreadOverWorkersAndAGpuJobSaysWhyItWaits) {
  TestCluster cluster;
  cluster.StartServer();
  cluster.StartWorker("w1");
  cluster.StartWorker("w2");
  // A job no CPU-only worker can take stays queued, with the reason, and blocks nobody.
  v1::JobSpec gpu_job = SmallFashionMnistJob(1, 1000, 200);
  gpu_job.mutable_resources()->set_gpus(2);
  gpu_job.set_priority(10);
  absl::StatusOr<v1::Job> waiting = cluster.Submit(gpu_job);
  ASSERT_TRUE(waiting.ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    v1::JobSpec spec = SlowJob(1);
    spec.mutable_loader()->set_delay_ms(5);
    absl::StatusOr<v1::Job> job = cluster.Submit(spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id());
  }
  std::set<std::string> workers;
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> done = cluster.WaitForFinal(id, absl::Seconds(90));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
    workers.insert(done->worker_id());
  }
  EXPECT_EQ(workers, (std::set<std::string>{"w1", "w2"})) << "both workers took jobs";
  CommandResult status = cluster.Cli("status " + waiting->id());
  EXPECT_NE(status.output.find("state:           queued"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("needs 2 GPUs on one worker; the largest worker has 0"),
            std::string::npos)
      << status.output;
}

TEST(FaultsTest, AJobThatKeepsFailingStopsAfterMaxRetries) {
  TestCluster cluster;
  cluster.StartServer();
  // A trainer that always fails the way a crash does (exit code 1).
  cluster.StartWorker("w1", {"--trainer", "/bin/false"});
  v1::JobSpec spec = SmallFashionMnistJob(1, 1000, 200);
  spec.set_max_retries(2);
  absl::StatusOr<v1::Job> job = cluster.Submit(spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<v1::Job> failed = cluster.WaitForFinal(job->id(), absl::Seconds(30));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->attempt(), 3);
  EXPECT_NE(failed->error().find("trainer exit code 1"), std::string::npos) << failed->error();
  EXPECT_NE(failed->error().find("attempt 3 of 3"), std::string::npos) << failed->error();
}

TEST(FaultsTest, RetriedSubmitWithTheSameRequestIdIsStoredOnce) {
  TestCluster cluster;
  cluster.StartServer();
  v1::JobSpec spec = SmallFashionMnistJob(1, 1000, 200);
  absl::StatusOr<v1::Job> first = cluster.Submit(spec, "req-42");
  absl::StatusOr<v1::Job> second = cluster.Submit(spec, "req-42");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->id(), second->id());
  const std::string job_file = cluster.dir() + "/job.yaml";
  std::filesystem::copy_file(STOKER_SOURCE_DIR "/examples/fashion-mnist-mlp.yaml", job_file);
  CommandResult cli1 = cluster.Cli("submit --request-id cli-1 " + job_file);
  CommandResult cli2 = cluster.Cli("submit --request-id cli-1 " + job_file);
  EXPECT_EQ(cli1.exit_code, 0) << cli1.output;
  EXPECT_NE(cli2.output.find("already submitted as"), std::string::npos) << cli2.output;
  CommandResult list = cluster.Cli("--output json list");
  size_t count = 0;
  for (size_t at = list.output.find("\"id\""); at != std::string::npos;
       at = list.output.find("\"id\"", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 2u) << list.output;
}

TEST(FaultsTest, ConcurrentSubmitsWithRetriesAreStoredExactlyOnce) {
  TestCluster cluster;
  cluster.StartServer();
  constexpr int kClients = 8, kJobsPerClient = 25;
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  std::mutex ids_mu;
  std::map<std::string, std::string> id_by_request;  // request id -> job id
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto stub = v1::JobService::NewStub(
          grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
      for (int i = 0; i < kJobsPerClient; ++i) {
        const std::string request_id = absl::StrCat("c", c, "-", i);
        // Every submit is sent twice, as a client retrying after a lost answer would.
        for (int attempt = 0; attempt < 2; ++attempt) {
          grpc::ClientContext context;
          v1::SubmitJobRequest request;
          *request.mutable_spec() = SmallFashionMnistJob(1, 1000, 100);
          request.mutable_spec()->set_name(request_id);
          request.set_request_id(request_id);
          v1::SubmitJobResponse response;
          if (!stub->SubmitJob(&context, request, &response).ok()) {
            ++failures;
            continue;
          }
          std::lock_guard<std::mutex> lock(ids_mu);
          auto [it, inserted] = id_by_request.emplace(request_id, response.job().id());
          if (!inserted && it->second != response.job().id()) ++failures;
          if (attempt == 1 && !response.deduplicated()) ++failures;
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(failures.load(), 0);
  grpc::ClientContext context;
  v1::ListJobsRequest request;
  request.set_limit(10000);
  v1::ListJobsResponse response;
  ASSERT_TRUE(cluster.jobs().ListJobs(&context, request, &response).ok());
  EXPECT_EQ(response.jobs_size(), kClients * kJobsPerClient);
  std::set<std::string> names;
  for (const v1::Job& job : response.jobs()) names.insert(job.spec().name());
  EXPECT_EQ(names.size(), size_t{kClients * kJobsPerClient});
}

}  // namespace
}  // namespace stoker::testing
