// Runs one attempt of a job on this worker: one memfd region (ring + stats + control), one
// stoker-trainer and K stoker-loader processes, supervised until the trainer ends. A loader that
// dies is respawned and resumes with the batch it owed; a trainer that dies fails the attempt.
#ifndef STOKER_WORKER_JOB_RUNNER_H_
#define STOKER_WORKER_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/job_region.h"
#include "stoker.pb.h"
#include "worker/autotuner.h"  // AutoLoaderLimit, AutotuneLoaderCount

namespace stoker {

struct RunnerOptions {
  std::string trainer_path;
  std::string loader_path;
  std::string work_dir;   // each attempt gets <work_dir>/<job>-a<attempt>/ for its files and logs
  std::string data_root;  // dataset paths resolve under it
  int cpu_count = 1;      // bounds loader.processes: auto
  int max_loader_restarts = 20;
  // Drain(): how long the trainer gets to checkpoint and stop before it is stopped outright.
  absl::Duration drain_timeout = absl::Seconds(30);
  // A job whose pipeline is silent this long is hung (a stopped trainer or loader, a wedged
  // device, a deadlock): it is stopped and the attempt fails, to be retried. Silent means nothing
  // raised JobStats::heartbeats_total and the trainer sent no event: the trainer beats for every
  // step and at least once a second while it starts, evaluates or writes a checkpoint, a loader
  // for every batch and while it loads its data, but neither while it only waits for the other.
  // absl::InfiniteDuration() never gives up.
  absl::Duration trainer_stall_timeout = absl::Seconds(30);
};

struct AttemptOutcome {
  v1::JobState state = v1::JOB_STATE_FAILED;
  std::string error;
  bool permanent = false;  // retrying cannot help (bad data or spec)
  // Stopped by Drain() before it finished (state FAILED): the job should run on elsewhere, from
  // the checkpoint the trainer wrote on its way out, without counting this attempt.
  bool released = false;
  v1::TrainingProgress progress;
};

class JobRunner {
 public:
  using EventCallback = std::function<void(const v1::JobEvent&)>;

  // `on_event` is called from a runner thread for every event the trainer or supervisor emits.
  JobRunner(RunnerOptions options, v1::Assignment assignment, EventCallback on_event);

  // Blocks until the attempt ends. With `resume_checkpoint`, the trainer loads it and the batch
  // stream starts at the step it holds.
  AttemptOutcome Run(const std::string& resume_checkpoint = "");
  // Asks a running attempt to stop (thread-safe); Run() then returns CANCELLED within ~2 s.
  void Cancel() { cancel_requested_.store(true); }
  // The worker is shutting down (thread-safe): the trainer writes a checkpoint at the step it
  // reached and stops (within RunnerOptions::drain_timeout, else it is stopped as by Cancel);
  // Run() then returns FAILED with `released` set, unless the attempt had already finished.
  void Drain() { drain_requested_.store(true); }

  // Counters of the running attempt, for export; zero before the region exists.
  struct StatsSnapshot {
    bool running = false;  // false before the region exists and after the attempt ended
    uint64_t samples_total = 0, steps_total = 0, skipped_steps_total = 0, data_stall_ns = 0,
             device_busy_ns = 0, loader_batches_total = 0, loader_busy_ns = 0,
             loader_restarts_total = 0, epoch = 0;
    double loss = 0, loss_scale = 1, eval_accuracy = 0;
    uint32_t filled_slots = 0;
    uint32_t loader_processes = 0;  // loaders of the current era (loader.processes: auto moves it)
  };
  StatsSnapshot Snapshot();

  // The attempt's directory (job file, logs, checkpoints).
  const std::string& dir() const { return dir_; }
  // Where the trainer writes its checkpoints (replaced atomically each time).
  std::string checkpoint_path() const { return dir_ + "/checkpoint.safetensors"; }

 private:
  // Starts stoker-trainer with the region, the event pipe's write end and its flags.
  absl::StatusOr<pid_t> StartTrainer(JobRegion& region, int events_fd, const std::string& job_file,
                                     const std::string& resume_checkpoint, int classes,
                                     const std::string& log_path);
  // Runs the trainer and the loaders until the trainer ends (or the attempt is cancelled, drained,
  // stalled, or a loader fails for good) and says how the attempt ended.
  AttemptOutcome Supervise(JobRegion& region, const std::string& job_file,
                           const std::string& resume_checkpoint, int loader_count, int classes);

  const RunnerOptions options_;
  const v1::Assignment assignment_;
  const std::string dir_;
  EventCallback on_event_;
  std::atomic<bool> cancel_requested_{false};
  std::atomic<bool> drain_requested_{false};
  absl::Mutex region_mu_;
  JobRegion* region_ ABSL_GUARDED_BY(region_mu_) = nullptr;
};

}  // namespace stoker

#endif  // STOKER_WORKER_JOB_RUNNER_H_
