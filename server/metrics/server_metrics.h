// The server's Prometheus endpoint: jobs and workers by state, queue wait, requeues, heartbeat
// ages, and per-RPC request counts and latencies (README.md, "Metrics reference").
//
// Usage (server main):
//   auto metrics = ServerMetrics::Create("0.0.0.0:9100");
//   (*metrics)->SetScrapeHook([&](ServerMetrics& m) {   // fresh gauges on every scrape
//     m.SetJobCounts(...); m.SetOldestQueuedJobAge(...); m.SetWorkerCounts(...);
//     m.SetHeartbeatAges(...);
//   });
//   builder.experimental().SetInterceptorCreators(...MakeRpcMetricsInterceptorFactory(metrics));
//   coordinator: ObserveQueueWait() when a job leaves the queue, JobRequeued() on each requeue,
//   CheckpointWriteFailed() when an upload cannot be stored.
#ifndef STOKER_SERVER_METRICS_SERVER_METRICS_H_
#define STOKER_SERVER_METRICS_SERVER_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

class ServerMetrics {
 public:
  // Serves GET /metrics on `listen_address` ("HOST:PORT"; port 0 picks a free port, see Port());
  // an empty address serves nothing (Scrape() still works). UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Create(const std::string& listen_address);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  int Port() const;  // 0 when not serving

  // Runs `hook` at the start of every scrape (on the HTTP thread, before any value is read), so
  // gauges that are snapshots of the coordinator's state are current. The hook may call any
  // setter below; it must not block for long (a scrape times out after ~10 s). Replaces any
  // earlier hook; set it before the server takes traffic.
  void SetScrapeHook(std::function<void(ServerMetrics&)> hook);

  // stoker_jobs{state}: jobs in each state. Keys are lower-case state names ("queued", "running",
  // "succeeded", "failed", "cancelled"); those five are always exported, 0 when missing from
  // `jobs_by_state`.
  void SetJobCounts(const std::map<std::string, int64_t>& jobs_by_state);
  // stoker_queue_oldest_job_age_seconds: how long the oldest queued job has waited (0 when the
  // queue is empty). The "queued too long" alert reads this: a stuck job never reaches
  // ObserveQueueWait.
  void SetOldestQueuedJobAge(double seconds);
  // stoker_queue_wait_seconds (histogram): submit (or requeue) to assignment, once per assignment.
  void ObserveQueueWait(double seconds);
  // stoker_workers{state}: workers in each state (e.g. "alive", "lost"). States missing from the
  // map but set before are set to 0.
  void SetWorkerCounts(const std::map<std::string, int64_t>& workers_by_state);
  // stoker_jobs_requeued_total: a running job went back to the queue (lease lost, worker lost it,
  // retryable failure).
  void JobRequeued();
  // stoker_worker_heartbeat_age_seconds{worker}: seconds since each worker's last heartbeat.
  // Replaces the whole set: workers not in the map lose their series.
  void SetHeartbeatAges(const std::map<std::string, double>& age_seconds_by_worker);
  // stoker_server_checkpoint_write_failures_total: checkpoint uploads the server could not write
  // (full disk, quota, I/O error). Each failed upload counts once; the worker retries.
  void CheckpointWriteFailed();
  // stoker_server_checkpoint_dir_free_bytes: free bytes on the file system of the checkpoint
  // directory (statvfs f_bavail). The series appears with the first value; a negative value
  // (could not be read) leaves it as it was.
  void SetCheckpointDirFreeBytes(int64_t bytes);
  // stoker_scheduling_pass_seconds{pass} (histogram): a heartbeat's scheduling pass ("assign")
  // or the sweep's preemption pass ("preemption").
  void ObserveSchedulingPass(const std::string& pass, double seconds);
  // A team as the team gauges show it (SetTeams).
  struct TeamValues {
    // Per resource ("gpus", "cpus", "memory" in bytes): nominal quota and borrowing limit (only
    // the resources with a quota), and what its running jobs are granted now.
    std::map<std::string, std::pair<int64_t, int64_t>> quota;
    std::map<std::string, int64_t> usage;
    double weight = 1;
    double share = 0;
    int64_t waiting_jobs = 0;
    int64_t preemptions = 0;  // its jobs preempted since the server started
  };
  // stoker_team_quota{team,resource,limit="nominal"|"borrow"}, stoker_team_usage{team,resource},
  // stoker_team_weight{team}, stoker_team_share{team}, stoker_team_waiting_jobs{team} and
  // stoker_team_preemptions_total{team}, by team ("none" for jobs without a team). Replaces the
  // whole set: teams (and quotas) not in the map lose their series; the counter only grows.
  void SetTeams(const std::map<std::string, TeamValues>& teams);
  // stoker_rpc_requests_total{method,code} and stoker_rpc_duration_seconds{method}. `method` is
  // "Service/Method" (a gRPC path "/pkg.Service/Method" is shortened to that); `code` is a gRPC
  // status code number. After 64 distinct methods, further ones are counted as "other".
  void RecordRpc(absl::string_view method, int code, double seconds);

  // The exposition text of these metrics (GET /metrics adds the exposer's own metrics). Does not
  // run the scrape hook.
  std::string Scrape() const;

 private:
  ServerMetrics();
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Times an RPC handler from construction to destruction; the handler sets the status code it
// returns. For servers that do not install the interceptor (rpc_metrics_interceptor.h).
//   RpcTimer timer(metrics, "JobService/SubmitJob");  ...  timer.set_code(status.error_code());
class RpcTimer {
 public:
  RpcTimer(ServerMetrics* metrics, std::string method);
  ~RpcTimer();
  RpcTimer(const RpcTimer&) = delete;
  RpcTimer& operator=(const RpcTimer&) = delete;
  void set_code(int code) { code_ = code; }

 private:
  ServerMetrics* metrics_;
  std::string method_;
  int code_ = 0;
  int64_t start_ns_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_METRICS_SERVER_METRICS_H_
