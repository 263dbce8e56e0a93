// The worker agent: registers this machine's devices with the server, keeps its lease with
// heartbeats, runs each assignment in a JobRunner and reports events and the outcome. It links
// no CUDA, so it can serve /metrics (see shared/TOOLCHAIN.md, pitfall 1).
#ifndef STOKER_WORKER_AGENT_H_
#define STOKER_WORKER_AGENT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "stoker.grpc.pb.h"
#include "worker/job_runner.h"

namespace stoker {

struct AgentOptions {
  std::string server_address = "127.0.0.1:50051";
  std::string worker_id;  // default: hostname-pid
  RunnerOptions runner;
  int job_slots = 1;  // jobs run at once (one per device)
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();

  // Runs until `stop` becomes true; then cancels running attempts and returns.
  void Run(const std::atomic<bool>& stop);

 private:
  struct RunningJob {
    v1::Assignment assignment;
    std::unique_ptr<JobRunner> runner;
    std::thread thread;
    std::atomic<bool> done{false};
    // Events not yet accepted by the server (touched by the runner's reader thread, then by
    // RunJob after the runner returned).
    std::vector<v1::JobEvent> pending;
  };

  bool Register(const std::atomic<bool>& stop);
  void HeartbeatOnce();
  void StartJob(const v1::Assignment& assignment);
  void RunJob(RunningJob* job);
  void ReapFinishedJobs();
  // Sends queued events for one attempt; returns false if the server says to stop it.
  bool SendEvents(const v1::Assignment& assignment, std::vector<v1::JobEvent>& pending);
  // Uploads the attempt's latest checkpoint; false if the server refused it for good.
  bool UploadCheckpoint(const RunningJob& job, const v1::TrainingProgress& at);
  // Fetches the checkpoint the assignment resumes from into `path`.
  absl::Status DownloadCheckpoint(const v1::Assignment& assignment, const std::string& path);
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout);

  AgentOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  std::atomic<bool> shutting_down_{false};
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<RunningJob>> jobs_ ABSL_GUARDED_BY(mu_);
};

// This machine's CPU as a device (model name from /proc/cpuinfo, total memory).
v1::Device DescribeCpu();

}  // namespace stoker

#endif  // STOKER_WORKER_AGENT_H_
