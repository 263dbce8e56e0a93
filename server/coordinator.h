// The server's logic, free of gRPC types: job lifecycle, worker leases, assignment and fencing.
// One mutex guards the store and the worker table; every state change is committed to the store
// before the call returns. Checkpoint files (paths, fsync, rename) are the CheckpointStore's; the
// coordinator decides which step a job holds and what the job is told.
#ifndef STOKER_SERVER_COORDINATOR_H_
#define STOKER_SERVER_COORDINATOR_H_

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint_store.h"
#include "server/job_store.h"
#include "server/scheduler.h"
#include "stoker.pb.h"

namespace stoker {

// Told of events that metrics count; called with the coordinator's lock held, so it must be quick.
class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;
  // A job attempt was placed on a worker after waiting this long in the queue.
  virtual void JobAssigned(double queue_wait_seconds) = 0;
  // A running attempt was lost (worker gone, failure) and the job went back to the queue.
  virtual void JobRequeued() = 0;
  // A checkpoint upload could not be written to the checkpoint directory (full disk, I/O error).
  virtual void CheckpointWriteFailed() {}
};

// The coordinator's state for gauges, read on each metrics scrape.
struct CoordinatorSnapshot {
  std::map<std::string, int64_t> jobs_by_state;  // "queued", "running", ...
  double oldest_queued_job_age_seconds = 0;
  std::map<std::string, int64_t> workers_by_state;      // "alive", "lost", "reconnecting"
  std::map<std::string, double> heartbeat_age_seconds;  // by worker id
  // Bytes an unprivileged writer may still use on the checkpoint directory's file system
  // (statvfs f_bavail); -1 when it cannot be read.
  int64_t checkpoint_dir_free_bytes = -1;
};

struct CoordinatorOptions {
  // Dataset paths of submitted jobs must resolve under this directory.
  std::string data_root = "/usr/share/datasets";
  // A worker that has not sent a heartbeat for this long loses its jobs back to the queue.
  absl::Duration lease = absl::Seconds(10);
  // After a restart, workers that ran jobs (RUNNING in the store) get this long, or one lease if
  // that is longer, to register again before their jobs are requeued. A worker needs a few
  // seconds to notice the restart; a short lease alone would cost its jobs an attempt.
  absl::Duration restart_grace = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Checkpoints of jobs are kept here, one file per job (<job>.safetensors).
  std::string checkpoint_dir = ".stoker/server/checkpoints";
};

class Coordinator {
 public:
  Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options);

  // Call once at start: jobs that were RUNNING when the server stopped keep their worker for
  // options.restart_grace (at least one lease); if it does not register again in that time they
  // are requeued.
  absl::Status Recover();

  // --- JobService
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  v1::ListWorkersResponse ListWorkers();

  // Events of `job_id` after `after_seq`. If there are none yet, waits up to `wait` for some.
  // Sets *job_finished when the job is in a final state and every event has been returned.
  absl::StatusOr<std::vector<v1::JobEvent>> WaitForEvents(const std::string& job_id,
                                                          int64_t after_seq, absl::Duration wait,
                                                          bool* job_finished);

  // --- WorkerService
  // Registers (or re-registers) a worker. ALREADY_EXISTS while another instance of the same
  // worker id holds a live lease (unless the request names it as its stopped predecessor in
  // previous_instance): two processes under one id would requeue each other's jobs.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // NOT_FOUND when the worker is not registered, its lease ran out, or another instance holds
  // its id: the worker should register again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request);
  // Ends an attempt. SUCCEEDED is refused (FAILED_PRECONDITION) while the server does not hold
  // the checkpoint of the final step (request.progress): a job succeeds only once its final
  // weights are stored.
  absl::Status CompleteJob(const v1::CompleteJobRequest& request);

  // --- Checkpoints. An upload is written to the path StartCheckpointUpload returns, then
  // committed: validated, moved into place atomically and recorded in the job.
  absl::StatusOr<std::string> StartCheckpointUpload(const std::string& worker_id,
                                                    const std::string& job_id, int attempt);
  absl::Status CommitCheckpoint(const v1::CheckpointChunk& first_chunk,
                                const std::string& upload_path, int64_t bytes);
  // An upload could not be written (`error_number`: errno of the failed write, 0 if unknown).
  // Counts and logs it, tells the job why it cannot go on (event and waiting_reason), and
  // returns the status for the worker: RESOURCE_EXHAUSTED for a full disk or quota, INTERNAL
  // otherwise. Either way the worker keeps its file and retries.
  absl::Status CheckpointWriteFailed(const v1::CheckpointChunk& first_chunk,
                                     const std::string& upload_path, int error_number);
  // The checkpoint a worker resumes the attempt from (fenced).
  absl::StatusOr<std::string> CheckpointForAttempt(const std::string& worker_id,
                                                   const std::string& job_id, int attempt);
  // The job's latest checkpoint, for users; NOT_FOUND if it has none.
  absl::StatusOr<std::string> ArtifactPath(const std::string& job_id);

  // Set once before serving; may be null.
  void SetObserver(CoordinatorObserver* observer) { observer_ = observer; }
  CoordinatorSnapshot Snapshot();

  // Requeues the jobs of workers whose lease ran out. Called periodically.
  void ExpireLeases();
  // Wakes every WaitForEvents caller (server shutdown).
  void Shutdown();

 private:
  struct WorkerEntry {
    v1::RegisterWorkerRequest info;
    absl::Time last_heartbeat;
    bool lost = false;
    // Restored from the store after a restart; must register again before heartbeats count, and
    // before `grace_until` or its jobs are requeued.
    bool restored = false;
    absl::Time grace_until = absl::InfinitePast();
    // The registered process (RegisterWorkerRequest.instance); "" for a restored entry.
    std::string instance;
    // What the worker advertised for jobs (cpus, memory, GPUs); empty while restored.
    WorkerResources capacity;
    // Jobs the server placed there, by id, with what each holds: the worker's ledger. Its free
    // resources are the capacity less these (FreeResources); nothing is placed beyond them.
    std::map<std::string, v1::Placement> running;
  };
  // The scheduler's view of a worker: capacity and what its jobs leave free.
  static WorkerView ViewOf(const std::string& worker_id, const WorkerEntry& worker);

  // Reads a RUNNING job and checks that `worker_id` runs its current attempt.
  absl::StatusOr<v1::Job> FencedJob(const std::string& worker_id, const std::string& job_id,
                                    int attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a job back in the queue, or fails it when its retries are used up.
  absl::Status Requeue(v1::Job job, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues the jobs placed on `worker_id` that its report (`reported` job ids) leaves out.
  absl::Status RequeueUnreported(const std::string& worker_id,
                                 const std::set<std::string>& reported, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveAndNotify(const v1::Job& job, std::vector<v1::JobEvent> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places queued jobs on the worker while they fit its free resources, at most `free_slots`.
  absl::StatusOr<std::vector<v1::Assignment>> Assign(const std::string& worker_id, int free_slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillQueueInfo(v1::Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Concurrent submits are committed together (one transaction, one fsync), LevelDB-style: the
  // submit at the front of the queue writes everything queued behind it.
  struct PendingSubmit {
    const v1::SubmitJobRequest* request;
    absl::StatusOr<JobStore::Inserted> result = absl::UnknownError("not committed");
    bool done = false;
  };
  absl::Mutex submit_mu_;
  std::deque<PendingSubmit*> submit_queue_ ABSL_GUARDED_BY(submit_mu_);

  const CoordinatorOptions options_;
  const CheckpointStore checkpoints_;
  absl::Mutex mu_;
  absl::CondVar events_changed_;
  std::unique_ptr<JobStore> store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  // When each job last got an event for a failed checkpoint write (one a minute at most).
  std::map<std::string, absl::Time> write_failure_event_time_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  CoordinatorObserver* observer_ = nullptr;
};

// A job event stamped with the current time.
v1::JobEvent MakeEvent(v1::EventType type, const std::string& message, int attempt = 0);

}  // namespace stoker

#endif  // STOKER_SERVER_COORDINATOR_H_
