// The worker agent: registers this machine's devices with the server, keeps its lease with
// heartbeats, runs each assignment in a JobRunner and reports events and the outcome. It links
// no CUDA, so it can serve /metrics (docs/toolchain.md, pitfall 1).
#ifndef STOKER_WORKER_AGENT_H_
#define STOKER_WORKER_AGENT_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/credentials.h"
#include "stoker.grpc.pb.h"
#include "worker/job_runner.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/server_reachability.h"

namespace stoker {

struct AgentOptions {
  std::string server_address = "127.0.0.1:50051";
  std::string worker_id;  // default: hostname-pid
  RunnerOptions runner;
  // At most this many jobs at once; which jobs fit (cores, memory, GPUs) the server decides
  // from what the agent advertises below, and tells each job what it holds (Placement).
  int job_slots = 64;
  // Bearer token for the server ("" = none). Data-parallel trainers read it from
  // runner.token_file themselves (never from their command line, which `ps` shows).
  std::string token;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // default: plaintext
  std::string metrics_url;                                // advertised to the server
  std::vector<v1::Device> gpus;  // found through NVML (index, UUID); each job gets its own
  // What jobs may use here, advertised at registration: cores (trainer threads and loaders of
  // all jobs together) and memory in bytes.
  int cpus = 1;
  int64_t memory_bytes = 0;
  // Test-only: `gpus` are fake (stoker-worker --fake-gpus-for-tests). A GPU job's trainer is told
  // its CUDA_VISIBLE_DEVICES, logs it and trains on the cpu backend.
  bool fake_gpus_for_tests = false;
  // This process and the one that ran before it with the same id and work directory (see
  // ClaimWorkerInstance); sent with each registration, `instance` with each heartbeat.
  std::string instance;
  std::string previous_instance;
};

// This process's claim on `worker_id` in `work_dir`: an exclusive lock on
// `work_dir/.worker-<id>.lock`, held until the process exits, which holds a fresh random instance
// name. `previous_instance` is the one the file held: that process is gone (its lock was free),
// so the server may give its id to this one at once. FAILED_PRECONDITION naming the pid when
// another live process holds the lock (the same worker id started twice on this directory).
struct WorkerInstance {
  std::string instance;
  std::string previous_instance;
  int lock_fd = -1;  // kept open (and locked) for the life of the process
};
absl::StatusOr<WorkerInstance> ClaimWorkerInstance(const std::string& work_dir,
                                                   const std::string& worker_id);

// Attempt directories name the worker that ran them (a `.worker` file holding its id), so that a
// worker restarted under its id can clear what its killed predecessor left: a process killed with
// SIGKILL, or a machine that lost power, never ran the attempt's clean-up, and its prepared
// training set, decoded test split and checkpoint copies (as large as the dataset) would stay on
// the disk for good. The server has requeued those attempts by then and keeps their checkpoints.
void MarkAttemptDirectory(const std::string& dir, const std::string& worker_id);
struct StaleAttemptData {
  int directories = 0;  // attempt directories with something removed
  uint64_t bytes = 0;   // what the removed files held
};
// In each directory of `work_dir` marked by `worker_id`, removes every file but the logs (*.log),
// the job (job.pb) and the mark. Call it holding the id's claim (ClaimWorkerInstance) and before
// any attempt starts: every attempt of the id is then stale. Directories of other worker ids
// sharing the work directory, and unmarked ones, are left alone.
StaleAttemptData RemoveStaleAttemptData(const std::string& work_dir, const std::string& worker_id);

// A job attempt's rank on this worker: a worker may run several ranks of one data-parallel job, so
// running attempts are named by (job id, rank) everywhere (rank 0 for a job of one rank).
using RankKey = std::pair<std::string, int>;
// "j-000001" for rank 0 of a job of one rank, else "j-000001 rank 2" (for log lines).
std::string RankName(const v1::Assignment& assignment);

class Agent {
 public:
  // `metrics` may be null (no /metrics served).
  Agent(AgentOptions options, WorkerMetrics* metrics);
  ~Agent();

  // Runs until `stop` becomes true; then drains running attempts (each trainer checkpoints and
  // its job goes back to the queue) and returns true. False when the server refused this worker
  // (a bad token, say): nothing this agent does can work.
  bool Run(const std::atomic<bool>& stop);

 private:
  struct RunningJob {
    v1::Assignment assignment;
    std::unique_ptr<JobRunner> runner;
    std::thread thread;
    std::atomic<bool> done{false};
    // The server preempted the attempt (HeartbeatResponse.preempt): drained to give it back.
    std::atomic<bool> preempted{false};
    // Events not yet accepted by the server: appended and sent under pending_mu by the runner's
    // threads (its trainer-event reader and its supervising loop both report events), then by
    // RunJob after the runner returned.
    absl::Mutex pending_mu;
    std::vector<v1::JobEvent> pending;
    // The latest checkpoint, when its upload failed because the server was unreachable.
    std::optional<v1::TrainingProgress> unsent_checkpoint;
    // The server holds the attempt's latest checkpoint: the local copy may go once the outcome
    // is delivered.
    std::atomic<bool> checkpoint_on_server{false};
    // Step of the last checkpoint the server accepted (uploads of older files are skipped).
    std::atomic<int64_t> uploaded_step{-1};
  };

  // Registers until the server answers, retrying 200 ms doubling to 2 s (with jitter) while it
  // cannot be reached. False when it refuses (a bad token, the worker id in use) or on `stop`.
  bool Register(const std::atomic<bool>& stop);
  void HeartbeatOnce();
  // While draining: a heartbeat saying this worker takes no new job (free_slots 0) and listing
  // what still runs; honours the server's stops, starts nothing.
  void DrainingHeartbeat();
  void StartJob(const v1::Assignment& assignment) ABSL_LOCKS_EXCLUDED(mu_);
  void StartJobLocked(const v1::Assignment& assignment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While this worker drains: the deferred attempts it will not start go back to the server
  // (released, not counted against max_retries).
  void GiveBackDeferred() ABSL_LOCKS_EXCLUDED(mu_);
  // The server says stop to `stop`: a deferred attempt it names is dropped (never started).
  void DropDeferred(const v1::RunningAttempt& stop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunJob(RunningJob* job);
  void ReapFinishedJobs();
  // Lists the attempts this worker runs (register and heartbeat requests carry them).
  void AddRunningAttempts(google::protobuf::RepeatedPtrField<v1::RunningAttempt>* running) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the running jobs' shared-memory counters to /metrics.
  void ExportMetrics();
  // Sends queued events for one attempt; returns false if the server says to stop it.
  bool SendEvents(const v1::Assignment& assignment, std::vector<v1::JobEvent>& pending);
  // Uploads the attempt's latest checkpoint. UNAVAILABLE when the server cannot be reached,
  // RESOURCE_EXHAUSTED or INTERNAL when it could not store the file (a full disk: try again
  // later), FAILED_PRECONDITION when the attempt is no longer this worker's.
  absl::Status UploadCheckpoint(RunningJob& job, const v1::TrainingProgress& at);
  // Fetches the checkpoint the assignment resumes from into `path` (every rank resumes from it).
  absl::Status DownloadCheckpoint(const v1::Assignment& assignment, const std::string& path);
  // A call context with the token and a deadline. `wait_for_ready`: while the server cannot be
  // reached the call waits (until the deadline) for the channel to connect instead of failing at
  // once; the waiting call also drives the reconnection, which otherwise gRPC notices only on
  // its 5 s backup poll.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout, bool wait_for_ready = false);

  AgentOptions options_;
  WorkerMetrics* metrics_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  // Says why the server cannot be reached (a name that does not resolve, or no answer); only
  // the registration and heartbeat loop (one thread) uses it.
  ServerReachability reachability_;
  std::atomic<bool> shutting_down_{false};
  absl::Mutex mu_;
  std::map<RankKey, std::unique_ptr<RunningJob>> jobs_ ABSL_GUARDED_BY(mu_);
  // A newer attempt of a rank whose older attempt still ends here (the server requeued the job
  // and gave it back to this worker before the old trainer was gone): it starts once the old
  // attempt is reaped, and heartbeats report it as running meanwhile, so the server neither
  // requeues it as lost (which would cost the job a retry) nor places it twice.
  std::map<RankKey, v1::Assignment> deferred_ ABSL_GUARDED_BY(mu_);
};

// This machine's CPU as a device (model name from /proc/cpuinfo, total memory).
v1::Device DescribeCpu();

// `count` fake GPUs for tests (kind "cuda", indices 0.., uuid "fake-GPU-<i>"), so that packing
// and GPU isolation run on machines without a GPU. INVALID_ARGUMENT when `real_gpus` is not
// empty (never mix them with real ones) or the server is not on loopback (never in production).
absl::StatusOr<std::vector<v1::Device>> FakeGpusForTests(int count, int real_gpus,
                                                         const std::string& server_address);

// What the runner of `assignment` may use: `base` with the placement's cores, memory and GPUs
// (CUDA_VISIBLE_DEVICES: UUIDs of real GPUs, indices of fake ones).
RunnerOptions RunnerOptionsFor(const RunnerOptions& base, const v1::Assignment& assignment,
                               bool fake_gpus_for_tests);

}  // namespace stoker

#endif  // STOKER_WORKER_AGENT_H_
