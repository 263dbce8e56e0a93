#include "worker/metrics/worker_metrics.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/http_get_for_test.h"
#include "gtest/gtest.h"
#include "worker/metrics/buckets.h"

namespace stoker {
namespace {

std::optional<double> Value(const std::string& text, const std::string& series) {
  return MetricValueForTest(text, series);
}

std::string JobSeries(const std::string& name, const std::string& job,
                      const std::string& device = "cpu") {
  return absl::StrCat(name, "{device=\"", device, "\",job_id=\"", job, "\",worker=\"w1\"}");
}

std::unique_ptr<WorkerMetrics> Make(const std::string& listen = "",
                                    const std::string& nvml_library = "") {
  auto metrics = WorkerMetrics::Create(
      {.worker_id = "w1", .listen_address = listen, .nvml_library = nvml_library});
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

JobCounters Counters(const std::string& job, uint32_t attempt, uint64_t samples) {
  JobCounters c;
  c.job_id = job;
  c.attempt = attempt;
  c.samples_total = samples;
  return c;
}

TEST(WorkerMetricsTest, ServesJobCountersOverHttp) {
  auto metrics = Make("127.0.0.1:0");
  ASSERT_NE(metrics, nullptr);
  ASSERT_GT(metrics->Port(), 0);

  JobCounters c = Counters("j1", 1, 1280);
  c.steps_total = 10;
  c.skipped_steps_total = 1;
  c.data_stall_seconds = 0.5;
  c.device_busy_seconds = 2.0;
  c.loader_batches_total = 12;
  c.loader_busy_seconds = 0.25;
  c.loader_restarts_total = 1;
  c.loader_bad_samples_total = 7;
  c.h2d_bytes_total = 1000;
  c.ring_filled_slots = 3;
  c.loader_processes = 4;
  c.loss = 0.75;
  c.loss_scale = 65536;
  c.eval_accuracy = 0.5;
  c.epoch = 2;
  metrics->Update({c});

  absl::StatusOr<std::string> text = HttpGetForTest(metrics->Port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, JobSeries("stoker_samples_total", "j1")), 1280);
  EXPECT_EQ(Value(*text, JobSeries("stoker_skipped_steps_total", "j1")), 1);
  EXPECT_EQ(Value(*text, JobSeries("stoker_data_stall_seconds_total", "j1")), 0.5);
  EXPECT_EQ(Value(*text, JobSeries("stoker_device_busy_seconds_total", "j1")), 2.0);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loader_batches_total", "j1")), 12);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loader_restarts_total", "j1")), 1);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loader_bad_samples_total", "j1")), 7);
  EXPECT_EQ(Value(*text, JobSeries("stoker_h2d_bytes_total", "j1")), 1000);
  EXPECT_EQ(Value(*text, JobSeries("stoker_ring_filled_slots", "j1")), 3);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loader_processes", "j1")), 4);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loss", "j1")), 0.75);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loss_scale", "j1")), 65536);
  EXPECT_EQ(Value(*text, JobSeries("stoker_eval_accuracy_ratio", "j1")), 0.5);
  EXPECT_EQ(Value(*text, JobSeries("stoker_epoch", "j1")), 2);
  EXPECT_EQ(Value(*text, JobSeries("stoker_step_seconds_count", "j1")), 10);
  EXPECT_EQ(Value(*text, JobSeries("stoker_step_seconds_sum", "j1")), 2.0);
  EXPECT_EQ(Value(*text, JobSeries("stoker_loader_batch_seconds_count", "j1")), 12);
  EXPECT_TRUE(absl::StrContains(*text, "# TYPE stoker_step_seconds histogram")) << *text;
  EXPECT_TRUE(absl::StrContains(*text, "# TYPE stoker_samples_total counter"));
  // The text over HTTP is the exposer's own metrics, then what Scrape() gives.
  EXPECT_TRUE(absl::EndsWith(*text, metrics->Scrape()));
}

// Issue 16: a worker may run two ranks of one job; each has its own series (a `rank` label) and
// its all-reduce counters, and one rank ending leaves the other's.
TEST(WorkerMetricsTest, RanksOfOneJobHaveTheirOwnSeriesWithAllReduceCounters) {
  auto metrics = Make();
  JobCounters r0 = Counters("j1", 1, 100), r1 = Counters("j1", 1, 50);
  r0.data_parallel = r1.data_parallel = true;
  r1.rank = 1;
  r0.allreduce_seconds = 1.5;
  r0.allreduce_exposed_seconds = 0.25;
  r0.allreduce_bytes_total = 4096;
  r0.allreduce_calls_total = 8;
  r1.allreduce_calls_total = 9;
  metrics->Update({r0, r1});
  const std::string text = metrics->Scrape();
  auto series = [](const std::string& name, int rank) {
    return absl::StrCat(name, "{device=\"cpu\",job_id=\"j1\",rank=\"", rank, "\",worker=\"w1\"}");
  };
  EXPECT_EQ(Value(text, series("stoker_samples_total", 0)), 100) << text;
  EXPECT_EQ(Value(text, series("stoker_samples_total", 1)), 50);
  EXPECT_EQ(Value(text, series("stoker_allreduce_seconds_total", 0)), 1.5);
  EXPECT_EQ(Value(text, series("stoker_allreduce_exposed_seconds_total", 0)), 0.25);
  EXPECT_EQ(Value(text, series("stoker_allreduce_bytes_total", 0)), 4096);
  EXPECT_EQ(Value(text, series("stoker_allreduce_calls_total", 0)), 8);
  EXPECT_EQ(Value(text, series("stoker_allreduce_calls_total", 1)), 9);
  metrics->JobEnded("j1", 1);
  const std::string after = metrics->Scrape();
  EXPECT_EQ(Value(after, series("stoker_samples_total", 0)), 100);
  EXPECT_EQ(Value(after, series("stoker_samples_total", 1)), std::nullopt);
  EXPECT_EQ(Value(after, series("stoker_allreduce_calls_total", 1)), std::nullopt);
  // A job of one rank has neither a rank label nor all-reduce series.
  metrics->Update({Counters("j2", 1, 10)});
  EXPECT_EQ(Value(metrics->Scrape(), JobSeries("stoker_samples_total", "j2")), 10);
  EXPECT_FALSE(absl::StrContains(metrics->Scrape(),
                                 "stoker_allreduce_calls_total{device=\"cpu\",job_id=\"j2\""));
}

TEST(WorkerMetricsTest, LastHeartbeatIsAUnixTimestampFromZero) {
  std::unique_ptr<WorkerMetrics> metrics = Make();
  ASSERT_NE(metrics, nullptr);
  const std::string series = "stoker_worker_last_heartbeat_timestamp_seconds{worker=\"w1\"}";
  EXPECT_EQ(Value(metrics->Scrape(), series), 0.0);
  metrics->HeartbeatAnswered(absl::FromUnixSeconds(1796083200));
  EXPECT_EQ(Value(metrics->Scrape(), series), 1796083200.0);
}

TEST(WorkerMetricsTest, CountersAdvanceByTheChangeInTotals) {
  auto metrics = Make();
  metrics->Update({Counters("j1", 1, 100)});
  metrics->Update({Counters("j1", 1, 250)});
  metrics->Update({Counters("j1", 1, 250)});
  EXPECT_EQ(Value(metrics->Scrape(), JobSeries("stoker_samples_total", "j1")), 250);
}

TEST(WorkerMetricsTest, RestartedTotalsKeepTheCounterRising) {
  auto metrics = Make();
  metrics->Update({Counters("j1", 1, 300)});
  // A new attempt counts from 0 again (and may already be past its old total).
  metrics->Update({Counters("j1", 2, 500)});
  EXPECT_EQ(Value(metrics->Scrape(), JobSeries("stoker_samples_total", "j1")), 800);
  // Totals that go down within an attempt (a restarted publisher) are new counts too.
  metrics->Update({Counters("j1", 2, 20)});
  EXPECT_EQ(Value(metrics->Scrape(), JobSeries("stoker_samples_total", "j1")), 820);
}

TEST(WorkerMetricsTest, JobEndedRemovesItsSeries) {
  auto metrics = Make("127.0.0.1:0");
  JobCounters c = Counters("j1", 1, 100);
  c.loss = 1.5;
  metrics->Update({c, Counters("j2", 1, 7)});
  ASSERT_TRUE(absl::StrContains(metrics->Scrape(), "job_id=\"j1\""));

  metrics->JobEnded("j1");
  absl::StatusOr<std::string> text = HttpGetForTest(metrics->Port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(absl::StrContains(*text, "job_id=\"j1\"")) << *text;
  EXPECT_EQ(Value(*text, JobSeries("stoker_samples_total", "j2")), 7);

  // A snapshot taken before the job ended must not bring it back.
  metrics->Update({c});
  EXPECT_FALSE(absl::StrContains(metrics->Scrape(), "job_id=\"j1\""));
  // A later attempt of the same job on this worker is a new run.
  metrics->Update({Counters("j1", 2, 5)});
  EXPECT_EQ(Value(metrics->Scrape(), JobSeries("stoker_samples_total", "j1")), 5);
  metrics->JobEnded("unknown-job");  // ignored
}

TEST(WorkerMetricsTest, OptionalGaugesAppearWithTheirFirstValue) {
  auto metrics = Make();
  metrics->Update({Counters("j1", 1, 0)});
  std::string text = metrics->Scrape();
  EXPECT_FALSE(Value(text, JobSeries("stoker_loss", "j1")).has_value());
  EXPECT_FALSE(Value(text, JobSeries("stoker_loss_scale", "j1")).has_value());
  EXPECT_FALSE(Value(text, JobSeries("stoker_eval_accuracy_ratio", "j1")).has_value());
  EXPECT_EQ(Value(text, JobSeries("stoker_epoch", "j1")), 0);
}

TEST(WorkerMetricsTest, HistogramFromBucketCounts) {
  auto metrics = Make();
  JobCounters c = Counters("j1", 1, 0);
  c.steps_total = 6;
  c.step_seconds.bucket_counts.assign(kStepSecondsBounds.size() + 1, 0);
  c.step_seconds.bucket_counts[BucketIndex(kStepSecondsBounds, 0.0004)] = 4;  // le 0.0005
  c.step_seconds.bucket_counts[BucketIndex(kStepSecondsBounds, 0.2)] = 1;     // le 0.25
  c.step_seconds.bucket_counts.back() = 1;                                    // > 10 s
  c.step_seconds.sum_seconds = 20.0;
  metrics->Update({c});
  c.step_seconds.bucket_counts[BucketIndex(kStepSecondsBounds, 0.0004)] += 2;
  c.step_seconds.sum_seconds += 0.001;
  metrics->Update({c});

  std::string text = metrics->Scrape();
  auto bucket = [&](const std::string& le) {
    return Value(text, absl::StrCat("stoker_step_seconds_bucket{device=\"cpu\",job_id=\"j1\",le=\"",
                                    le, "\",worker=\"w1\"}"));
  };
  EXPECT_EQ(bucket("0.00025"), 0) << text;
  EXPECT_EQ(bucket("0.0005"), 6);
  EXPECT_EQ(bucket("0.1"), 6);
  EXPECT_EQ(bucket("0.25"), 7);
  EXPECT_EQ(bucket("10"), 7);
  EXPECT_EQ(bucket("+Inf"), 8);
  EXPECT_EQ(Value(text, JobSeries("stoker_step_seconds_count", "j1")), 8);
  EXPECT_NEAR(Value(text, JobSeries("stoker_step_seconds_sum", "j1")).value_or(0), 20.001, 1e-9);
}

TEST(WorkerMetricsTest, HistogramApproximatedFromMeansWithoutBuckets) {
  auto metrics = Make();
  JobCounters c = Counters("j1", 1, 0);
  c.loader_batches_total = 10;
  c.loader_busy_seconds = 0.02;  // mean 2 ms: all ten in le="0.0025"
  metrics->Update({c});
  c.loader_batches_total = 12;
  c.loader_busy_seconds = 0.22;  // two more, mean 100 ms: le="0.1"
  metrics->Update({c});

  std::string text = metrics->Scrape();
  auto bucket = [&](const std::string& le) {
    return Value(text,
                 absl::StrCat("stoker_loader_batch_seconds_bucket{device=\"cpu\",job_id=\"j1\","
                              "le=\"",
                              le, "\",worker=\"w1\"}"));
  };
  EXPECT_EQ(bucket("0.001"), 0) << text;
  EXPECT_EQ(bucket("0.0025"), 10);
  EXPECT_EQ(bucket("0.05"), 10);
  EXPECT_EQ(bucket("0.1"), 12);
  EXPECT_EQ(Value(text, JobSeries("stoker_loader_batch_seconds_count", "j1")), 12);
  EXPECT_NEAR(Value(text, JobSeries("stoker_loader_batch_seconds_sum", "j1")).value_or(0), 0.22,
              1e-12);
}

TEST(WorkerMetricsTest, GpuSeriesCarryTheJobRunningOnThem) {
  auto metrics = Make("", FAKE_NVML_PATH);
  EXPECT_EQ(metrics->NvmlStatus(), "NVML: 2 GPUs");
  JobCounters c = Counters("j1", 1, 10);
  c.device = "gpu0";
  c.gpu_indices = {0};
  metrics->Update({c});
  std::string text = metrics->Scrape();
  EXPECT_EQ(
      Value(text, "stoker_gpu_utilization_ratio{device=\"gpu0\",job_id=\"j1\",worker=\"w1\"}"),
      0.75)
      << text;
  EXPECT_EQ(
      Value(text, "stoker_gpu_memory_used_bytes{device=\"gpu0\",job_id=\"j1\",worker=\"w1\"}"),
      double(1ull << 30));
  EXPECT_EQ(Value(text, "stoker_gpu_memory_used_bytes{device=\"gpu1\",worker=\"w1\"}"),
            double(2ull << 30));
  // gpu1 cannot report utilization: no series rather than a made-up value.
  EXPECT_FALSE(absl::StrContains(text, "stoker_gpu_utilization_ratio{device=\"gpu1\""));
  EXPECT_EQ(Value(text,
                  "stoker_gpu_info{device=\"gpu0\",name=\"Fake GPU A\","
                  "uuid=\"GPU-00000000-0000-0000-0000-000000000000\",worker=\"w1\"}"),
            1);
  EXPECT_EQ(Value(text, JobSeries("stoker_samples_total", "j1", "gpu0")), 10);

  metrics->JobEnded("j1");
  text = metrics->Scrape();
  EXPECT_FALSE(absl::StrContains(text, "j1")) << text;
  metrics->Update({});
  text = metrics->Scrape();
  EXPECT_EQ(Value(text, "stoker_gpu_utilization_ratio{device=\"gpu0\",worker=\"w1\"}"), 0.75);
}

TEST(WorkerMetricsTest, NoNvmlMeansNoGpuSeries) {
  auto metrics = Make("", "libnvidia-ml-does-not-exist.so.1");
  EXPECT_TRUE(absl::StartsWith(metrics->NvmlStatus(), "NVML unavailable: "))
      << metrics->NvmlStatus();
  metrics->Update({Counters("j1", 1, 10)});
  std::string text = metrics->Scrape();
  EXPECT_FALSE(absl::StrContains(text, "stoker_gpu_utilization_ratio{")) << text;
  EXPECT_FALSE(absl::StrContains(text, "stoker_gpu_memory_used_bytes{"));
}

TEST(WorkerMetricsTest, BusyPortIsAnError) {
  auto first = Make("127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  auto second = WorkerMetrics::Create(
      {.worker_id = "w2", .listen_address = absl::StrCat("127.0.0.1:", first->Port())});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "cannot serve on")) << second.status();
}

}  // namespace
}  // namespace stoker
