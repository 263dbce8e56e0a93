#include "server/metrics/server_metrics.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/http_get_for_test.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/metrics/rpc_metrics_interceptor.h"
#include "stoker.grpc.pb.h"

namespace stoker {
namespace {

std::optional<double> Value(const std::string& text, const std::string& series) {
  return MetricValueForTest(text, series);
}

std::unique_ptr<ServerMetrics> Make(const std::string& listen = "") {
  auto metrics = ServerMetrics::Create(listen);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

TEST(ServerMetricsTest, JobStatesAreAlwaysExported) {
  auto metrics = Make();
  metrics->SetJobCounts({{"queued", 3}, {"running", 1}});
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"queued\"}"), 3) << text;
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"running\"}"), 1);
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"succeeded\"}"), 0);
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"cancelled\"}"), 0);
  // A snapshot replaces the previous one.
  metrics->SetJobCounts({{"succeeded", 4}});
  text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"queued\"}"), 0);
  EXPECT_EQ(Value(text, "stoker_jobs{state=\"succeeded\"}"), 4);
}

TEST(ServerMetricsTest, WorkersQueueAndRequeues) {
  auto metrics = Make();
  metrics->SetWorkerCounts({{"alive", 2}, {"lost", 1}});
  metrics->SetWorkerCounts({{"alive", 3}});
  metrics->SetOldestQueuedJobAge(42);
  metrics->ObserveQueueWait(0.3);
  metrics->ObserveQueueWait(700);
  metrics->JobRequeued();
  metrics->JobRequeued();
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_workers{state=\"alive\"}"), 3) << text;
  EXPECT_EQ(Value(text, "stoker_workers{state=\"lost\"}"), 0);
  EXPECT_EQ(Value(text, "stoker_queue_oldest_job_age_seconds"), 42);
  EXPECT_EQ(Value(text, "stoker_queue_wait_seconds_count"), 2);
  EXPECT_EQ(Value(text, "stoker_queue_wait_seconds_bucket{le=\"0.5\"}"), 1);
  EXPECT_EQ(Value(text, "stoker_queue_wait_seconds_bucket{le=\"1800\"}"), 2);
  EXPECT_EQ(Value(text, "stoker_jobs_requeued_total"), 2);
}

TEST(ServerMetricsTest, HeartbeatAgesFollowTheWorkerSet) {
  auto metrics = Make();
  metrics->SetHeartbeatAges({{"w1", 0.5}, {"w2", 12}});
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_worker_heartbeat_age_seconds{worker=\"w2\"}"), 12) << text;
  metrics->SetHeartbeatAges({{"w1", 1.5}});
  text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_worker_heartbeat_age_seconds{worker=\"w1\"}"), 1.5);
  EXPECT_FALSE(absl::StrContains(text, "w2")) << text;
}

TEST(ServerMetricsTest, CheckpointWriteFailuresAndFreeBytes) {
  auto metrics = Make();
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_server_checkpoint_write_failures_total"), 0) << text;
  EXPECT_FALSE(absl::StrContains(text, "stoker_server_checkpoint_dir_free_bytes ")) << text;
  metrics->CheckpointWriteFailed();
  metrics->CheckpointWriteFailed();
  metrics->SetCheckpointDirFreeBytes(4096);
  metrics->SetCheckpointDirFreeBytes(-1);  // unreadable: keeps the last value
  text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_server_checkpoint_write_failures_total"), 2) << text;
  EXPECT_EQ(Value(text, "stoker_server_checkpoint_dir_free_bytes"), 4096) << text;
}

TEST(ServerMetricsTest, RpcCountsAndDurations) {
  auto metrics = Make();
  metrics->RecordRpc("/stoker.v1.JobService/SubmitJob", 0, 0.002);
  metrics->RecordRpc("/stoker.v1.JobService/SubmitJob", 3, 0.0001);
  {
    RpcTimer timer(metrics.get(), "JobService/GetJob");
    timer.set_code(5);
  }
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_rpc_requests_total{code=\"OK\",method=\"JobService/SubmitJob\"}"),
            1)
      << text;
  EXPECT_EQ(Value(text,
                  "stoker_rpc_requests_total{code=\"INVALID_ARGUMENT\","
                  "method=\"JobService/SubmitJob\"}"),
            1);
  EXPECT_EQ(
      Value(text, "stoker_rpc_requests_total{code=\"NOT_FOUND\",method=\"JobService/GetJob\"}"), 1);
  EXPECT_EQ(Value(text, "stoker_rpc_duration_seconds_count{method=\"JobService/SubmitJob\"}"), 2);
  EXPECT_EQ(Value(text,
                  "stoker_rpc_duration_seconds_bucket{le=\"0.0025\","
                  "method=\"JobService/SubmitJob\"}"),
            2);
}

TEST(ServerMetricsTest, MethodLabelsAreBounded) {
  auto metrics = Make();
  for (int i = 0; i < 100; ++i) metrics->RecordRpc(absl::StrCat("/x.S/M", i), 12, 0.001);
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_rpc_duration_seconds_count{method=\"other\"}"), 36) << text;
}

// The scrape hook runs before the values are read, so an HTTP scrape sees what it set.
TEST(ServerMetricsTest, ScrapeHookRefreshesGaugesOverHttp) {
  auto metrics = Make("127.0.0.1:0");
  ASSERT_NE(metrics, nullptr);
  ASSERT_GT(metrics->Port(), 0);
  int scrapes = 0;
  metrics->SetScrapeHook([&scrapes](ServerMetrics& m) {
    ++scrapes;
    m.SetJobCounts({{"queued", scrapes}});
    m.SetHeartbeatAges({{"w1", 0.25 * scrapes}});
  });
  absl::StatusOr<std::string> text = HttpGetForTest(metrics->Port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, "stoker_jobs{state=\"queued\"}"), 1) << *text;
  text = HttpGetForTest(metrics->Port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, "stoker_jobs{state=\"queued\"}"), 2) << *text;
  EXPECT_EQ(Value(*text, "stoker_worker_heartbeat_age_seconds{worker=\"w1\"}"), 0.5);
}

// Answers GetJob, refuses CancelJob; everything else is the generated UNIMPLEMENTED.
class FakeJobService final : public v1::JobService::Service {
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override {
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
  }
};

TEST(ServerMetricsTest, InterceptorCountsRealRpcs) {
  auto metrics = Make("127.0.0.1:0");
  ASSERT_NE(metrics, nullptr);
  FakeJobService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(MakeRpcMetricsInterceptorFactory(metrics.get()));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::Job job;
    ASSERT_TRUE(stub->GetJob(&context, v1::GetJobRequest(), &job).ok());
  }
  {
    grpc::ClientContext context;
    v1::Job job;
    EXPECT_EQ(stub->CancelJob(&context, v1::CancelJobRequest(), &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::ListJobsResponse response;
    EXPECT_EQ(stub->ListJobs(&context, v1::ListJobsRequest(), &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  server->Shutdown();

  absl::StatusOr<std::string> text = HttpGetForTest(metrics->Port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, "stoker_rpc_requests_total{code=\"OK\",method=\"JobService/GetJob\"}"), 3)
      << *text;
  EXPECT_EQ(
      Value(*text, "stoker_rpc_requests_total{code=\"NOT_FOUND\",method=\"JobService/CancelJob\"}"),
      1);
  EXPECT_EQ(Value(*text,
                  "stoker_rpc_requests_total{code=\"UNIMPLEMENTED\","
                  "method=\"JobService/ListJobs\"}"),
            1);
  EXPECT_EQ(Value(*text, "stoker_rpc_duration_seconds_count{method=\"JobService/GetJob\"}"), 3);
}

TEST(ServerMetricsTest, BusyPortIsAnError) {
  auto first = Make("127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  auto second = ServerMetrics::Create(absl::StrCat("127.0.0.1:", first->Port()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace stoker
