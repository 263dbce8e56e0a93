// The worker agent's Prometheus endpoint: GPU readings from NVML and each running job's counters,
// which the trainer and loaders publish in the job's shared memory (README.md, "Metrics
// reference").
//
// Usage (agent):
//   auto metrics = WorkerMetrics::Create({.worker_id = id, .listen_address = "0.0.0.0:9101"});
//   every ~1 s, even with no jobs:  (*metrics)->Update(snapshots_of_running_jobs);
//   when an attempt ends for good:   (*metrics)->JobEnded(job_id, rank);
//
// This class must live in a process that does not link cuBLAS (docs/toolchain.md, pitfall 1).
#ifndef STOKER_WORKER_METRICS_WORKER_METRICS_H_
#define STOKER_WORKER_METRICS_WORKER_METRICS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stoker {

// Per-bucket observation counts (NOT cumulative) and the sum of the observed values, both totals
// since the attempt started. bucket_counts has bounds.size() + 1 entries, the last for +Inf,
// using the bounds in worker/metrics/buckets.h. Empty bucket_counts means "not measured".
struct HistogramTotals {
  std::vector<uint64_t> bucket_counts;
  double sum_seconds = 0;
};

// A snapshot of one job attempt's shared-memory stats. Totals count from the start of the
// attempt; a new attempt (or any total that goes down) starts counting from 0 again, and the
// exported counters keep rising across attempts.
struct JobCounters {
  std::string job_id;
  uint32_t attempt = 0;
  // A data-parallel job's rank (a worker may run several ranks of one job): its series carry a
  // `rank` label, and (job_id, rank) names them. A job of one rank (data_parallel false) has no
  // rank label, as before.
  int rank = 0;
  bool data_parallel = false;
  // Value of the `device` label on the job's series: "cpu", "gpu0", or e.g. "gpu0,gpu1".
  std::string device = "cpu";
  // NVML indices of the GPUs the job runs on; their GPU series get the job's `job_id` label.
  std::vector<int> gpu_indices;

  uint64_t samples_total = 0;
  uint64_t steps_total = 0;
  uint64_t skipped_steps_total = 0;  // fp16 overflow: step skipped, loss scale halved
  double data_stall_seconds = 0;     // consumer waited for a batch
  double device_busy_seconds = 0;    // consumer computed
  uint64_t loader_batches_total = 0;
  double loader_busy_seconds = 0;  // loaders' time making batches, summed over loaders
  uint64_t loader_restarts_total = 0;
  uint64_t loader_bad_samples_total = 0;  // undecodable images skipped
  uint64_t h2d_bytes_total = 0;
  uint32_t ring_filled_slots = 0;
  uint32_t loader_processes = 0;     // loaders making batches now (autotune grows and shrinks it)
  std::optional<double> loss;        // last training loss; empty before the first step
  std::optional<double> loss_scale;  // empty when the job does not scale (fp32, bf16)
  std::optional<double> eval_accuracy;  // 0..1; empty before the first evaluation
  uint64_t epoch = 0;
  // Data-parallel jobs: this rank's gradient all-reduce time (all of it, and the part backward did
  // not hide), bytes and calls (stoker_allreduce_*; absent for a job of one rank).
  double allreduce_seconds = 0;
  double allreduce_exposed_seconds = 0;
  uint64_t allreduce_bytes_total = 0;
  uint64_t allreduce_calls_total = 0;

  // Real histograms when the trainer/loaders keep bucket counts. When empty, the histogram is
  // approximated from the totals above: each Update's new steps (batches) are all counted in the
  // bucket of their mean duration (device_busy_seconds / steps, loader_busy_seconds / batches),
  // so _sum and _count are exact and quantiles describe ~1 s means rather than single steps.
  HistogramTotals step_seconds;
  HistogramTotals loader_batch_seconds;
};

struct WorkerMetricsOptions {
  std::string worker_id;  // value of the `worker` label on every series
  // "HOST:PORT" to serve GET /metrics on (port 0 picks a free port, see Port()); empty serves
  // nothing (the text is still available from Scrape()).
  std::string listen_address;
  // NVML library to dlopen; empty disables GPU metrics.
  std::string nvml_library = "libnvidia-ml.so.1";
};

class WorkerMetrics {
 public:
  // Fails (UNAVAILABLE) only when listen_address cannot be bound. A missing NVML is not an error:
  // GPU series are then simply absent (see NvmlStatus()).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(const WorkerMetricsOptions& options);
  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The bound port; 0 when not serving.
  int Port() const;
  // "NVML: 2 GPUs" or "NVML unavailable: <reason>", for one startup log line.
  std::string NvmlStatus() const;

  // Reads the GPUs and applies the jobs' snapshots: counters advance by the change since the
  // previous snapshot of the same job, gauges take the new value. Jobs not listed keep their last
  // values. Thread-safe.
  void Update(const std::vector<JobCounters>& jobs);
  // The server answered a registration or heartbeat at `at`: sets
  // stoker_worker_last_heartbeat_timestamp_seconds (the container healthcheck and the "worker
  // down" alert read its age). Thread-safe.
  void HeartbeatAnswered(absl::Time at);
  // Removes every series of rank `rank` of `job_id` (call once the rank's attempt has ended and no
  // further attempt will run here). Unknown ids are ignored. Thread-safe.
  void JobEnded(absl::string_view job_id, int rank = 0);

  // The exposition text, exactly what GET /metrics returns.
  std::string Scrape() const;

 private:
  WorkerMetrics();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker

#endif  // STOKER_WORKER_METRICS_WORKER_METRICS_H_
