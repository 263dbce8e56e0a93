// Serves WorkerMetrics and ServerMetrics with a simulated running job, so that the dashboard and
// alert expressions can be evaluated against real exposition before the server and worker are
// wired up (tests/observability/check_deploy.sh). Prints "server_port worker_port" to
// --port-file once both serve, then updates every 100 ms for --seconds.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "server/metrics/server_metrics.h"
#include "worker/metrics/buckets.h"
#include "worker/metrics/worker_metrics.h"

int main(int argc, char** argv) {
  CLI::App app{"Stoker metrics with a simulated job"};
  std::string server_listen = "127.0.0.1:0";
  std::string worker_listen = "127.0.0.1:0";
  std::string nvml_library;
  std::string port_file;
  double seconds = 60;
  app.add_option("--server-listen", server_listen);
  app.add_option("--worker-listen", worker_listen);
  app.add_option("--nvml-library", nvml_library, "e.g. the fake_nvml module; empty: none");
  app.add_option("--port-file", port_file)->required();
  app.add_option("--seconds", seconds);
  CLI11_PARSE(app, argc, argv);

  auto server = stoker::ServerMetrics::Create(server_listen);
  auto worker = stoker::WorkerMetrics::Create(
      {.worker_id = "obs-worker", .listen_address = worker_listen, .nvml_library = nvml_library});
  if (!server.ok() || !worker.ok()) {
    std::cerr << (server.ok() ? worker.status() : server.status()) << "\n";
    return 1;
  }
  {
    std::ofstream out(port_file + ".tmp");
    out << (*server)->Port() << " " << (*worker)->Port() << "\n";
  }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());

  (*server)->SetScrapeHook([](stoker::ServerMetrics& m) {
    m.SetJobCounts({{"queued", 1}, {"running", 1}, {"succeeded", 3}});
    m.SetOldestQueuedJobAge(12);
    m.SetWorkerCounts({{"alive", 1}});
    m.SetHeartbeatAges({{"obs-worker", 0.4}});
    m.SetCheckpointDirFreeBytes(int64_t{50} << 30);
    stoker::ServerMetrics::TeamValues vision;
    vision.quota = {{"gpus", {4, 2}}};
    vision.usage = {{"gpus", 5}, {"cpus", 10}, {"memory", int64_t{40} << 30}};
    vision.weight = 3;
    vision.share = 0.4;
    vision.waiting_jobs = 2;
    vision.preemptions = 1;
    m.SetTeams({{"vision", vision}});
  });

  stoker::JobCounters job;
  job.job_id = "obs-job";
  job.attempt = 1;
  job.device = "gpu0";
  job.gpu_indices = {0};
  job.step_seconds.bucket_counts.assign(stoker::kStepSecondsBounds.size() + 1, 0);
  job.loss_scale = 65536;
  // Rank 1 of a data-parallel job on the same worker, for the all-reduce panels.
  stoker::JobCounters rank = job;
  rank.job_id = "obs-ddp-job";
  rank.device = "cpu";
  rank.gpu_indices = {};
  rank.data_parallel = true;
  rank.rank = 1;
  const auto start = std::chrono::steady_clock::now();
  for (int tick = 0;; ++tick) {
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > seconds) break;
    // 10 steps of 128 samples per tick, 4 ms each, with some stall.
    job.samples_total += 1280;
    job.steps_total += 10;
    job.device_busy_seconds += 0.04;
    job.data_stall_seconds += 0.01;
    job.step_seconds.bucket_counts[stoker::BucketIndex(stoker::kStepSecondsBounds, 0.004)] += 9;
    job.step_seconds.bucket_counts[stoker::BucketIndex(stoker::kStepSecondsBounds, 0.03)] += 1;
    job.step_seconds.sum_seconds += 0.04;
    job.loader_batches_total += 10;
    job.loader_busy_seconds += 0.02;
    job.h2d_bytes_total += 10 * 128 * 784;
    job.ring_filled_slots = tick % 8;
    job.loss = 2.3 * std::exp(-0.01 * tick);
    job.eval_accuracy = 0.5 + 0.4 * (1 - std::exp(-0.01 * tick));
    job.epoch = tick / 50;
    if (tick % 100 == 50) job.loader_restarts_total += 1;
    if (tick % 70 == 0) job.skipped_steps_total += 1;
    rank.samples_total += 640;
    rank.steps_total += 10;
    rank.device_busy_seconds += 0.05;
    rank.allreduce_seconds += 0.02;
    rank.allreduce_exposed_seconds += 0.004;
    rank.allreduce_bytes_total += 10 * 946344;
    rank.allreduce_calls_total += 10;
    (*worker)->Update({job, rank});

    (*server)->RecordRpc("/stoker.v1.WorkerService/Heartbeat", 0, 0.0004);
    (*server)->RecordRpc("/stoker.v1.JobService/GetJob", tick % 10 == 0 ? 5 : 0, 0.0008);
    if (tick % 10 == 0) (*server)->ObserveQueueWait(0.2 + tick % 7);
    if (tick % 100 == 0) (*server)->JobRequeued();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}
