// Runs one attempt of a job on this worker: the training set prepared once in the attempt's
// directory (data/prepared_dataset.h), one memfd region (ring + stats + control), one
// stoker-trainer and K stoker-loader processes that share one read-only mapping of the prepared
// training set, supervised until the trainer ends. A loader that dies is respawned and resumes
// with the batch it owed; a trainer that dies fails the attempt.
//
// Data-parallel jobs (Assignment.replicas > 1): one JobRunner runs one rank. Its ring holds the
// rank's slices of the job's global batches (replicas x batch_size samples, so the ring counts
// BatchesPerEpoch(train count, replicas x batch_size) batches an epoch, each slot still
// batch_size samples), its loaders are told --rank/--replicas, and its trainer how to reach the
// other ranks through the server's rendezvous. Only rank 0's trainer writes checkpoints.
#ifndef STOKER_WORKER_JOB_RUNNER_H_
#define STOKER_WORKER_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/dataset.h"
#include "data/image/image_transform.h"
#include "data/index/sample_index.h"
#include "data/job_region.h"
#include "data/prepared_dataset.h"
#include "stoker.pb.h"
#include "worker/autotuner.h"  // AutoLoaderLimit, AutotuneLoaderCount

namespace stoker {

struct RunnerOptions {
  std::string trainer_path;
  std::string loader_path;
  // Each attempt gets <work_dir>/<job>-a<attempt>/ for its files and logs (rank r > 0 of a
  // data-parallel job: <job>-a<attempt>-r<r>/).
  std::string work_dir;
  std::string data_root;  // dataset paths resolve under it
  // Image folders: the worker's cache of restart-indexed JPEGs (data/jpeg_cache.h), handed to the
  // loaders with its bound; "" = none.
  std::string jpeg_cache_dir;
  int64_t jpeg_cache_bytes = 0;
  // The job's cores (its Placement): the trainer's thread count (--threads), and the bound of
  // loader.processes: auto. Loaders share these cores with the trainer.
  int cpu_count = 1;
  // The job's memory (its Placement; 0 = only the machine's available memory bounds it): the
  // data pipeline's budget is half of the smaller of the two.
  int64_t memory_limit_bytes = 0;
  // The GPUs the trainer may see (CUDA_VISIBLE_DEVICES: UUIDs or indices, comma-separated);
  // "" = none. It uses them as its devices 0...
  std::string cuda_visible_devices;
  // Test-only (stoker-worker --fake-gpus-for-tests): the GPUs are fake; the trainer logs its
  // CUDA_VISIBLE_DEVICES and trains on the cpu backend.
  bool fake_gpus_for_tests = false;
  int max_loader_restarts = 20;
  // Drain(): how long the trainer gets to checkpoint and stop before it is stopped outright.
  absl::Duration drain_timeout = absl::Seconds(30);
  // A job whose pipeline is silent this long is hung (a stopped trainer or loader, a wedged
  // device, a deadlock): it is stopped and the attempt fails, to be retried. Silent means nothing
  // raised JobStats::heartbeats_total and the trainer sent no event: the trainer beats for every
  // step and at least once a second while it starts, evaluates or writes a checkpoint, a loader
  // for every batch and while it maps its data, but neither while it only waits for the other.
  // absl::InfiniteDuration() never gives up.
  absl::Duration trainer_stall_timeout = absl::Seconds(30);

  // Data-parallel jobs: what the trainer needs to reach the server's rendezvous as this worker.
  // The token reaches it as a file path (never the token on its command line, which `ps`
  // shows). Paths are made absolute by the agent.
  std::string server_address;
  std::string worker_id;
  std::string token_file;  // "" = no token
  std::string tls_ca;      // "" = plaintext
  // The address the other ranks reach this worker's trainers at (Gloo's TCP device binds to it).
  std::string collective_host = "127.0.0.1";
  // Connecting the ranks (all must arrive within it) and each collective.
  absl::Duration collective_timeout = absl::Seconds(60);
  // "auto": ranks on one machine sum through shared memory, machines through Gloo
  // (ConnectCpuRanks); "gloo": this worker's ranks never use shared memory (each is a machine of
  // its own).
  std::string collective_transport = "auto";
  // --collective-machine-for-tests of the trainers (empty: their machine's own identity).
  std::string collective_machine_for_tests;
};

// The attempt's directory under `work_dir`: <job>-a<attempt>, and -r<rank> after it for a rank
// other than 0.
std::string AttemptDirectory(const std::string& work_dir, const v1::Assignment& assignment);

// The trainer's command line (argv[0] is options.trainer_path) for `assignment`, its region and
// event pipe descriptors, the job file, the resume checkpoint ("" = none), the class count and
// the training set's sample count (a data-parallel rank's share of each step depends on it).
std::vector<std::string> TrainerArguments(const RunnerOptions& options,
                                          const v1::Assignment& assignment, const std::string& dir,
                                          int region_fd, int events_fd, const std::string& job_file,
                                          const std::string& resume_checkpoint, int classes,
                                          int64_t train_samples);

// Batches the ring of one rank holds: BatchesPerEpoch(count, replicas x batch_size) x epochs
// (replicas <= 1: a job of one rank).
uint64_t RankTotalBatches(int64_t count, uint32_t batch_size, int replicas, int epochs);

struct AttemptOutcome {
  v1::JobState state = v1::JOB_STATE_FAILED;
  std::string error;
  bool permanent = false;  // retrying cannot help (bad data or spec)
  // Stopped by Drain() before it finished (state FAILED): the job should run on elsewhere, from
  // the checkpoint the trainer wrote on its way out, without counting this attempt.
  bool released = false;
  v1::TrainingProgress progress;
};

// The data pipeline's memory as the agent budgets it: the ring, what each loader holds of its own,
// and what preparing the training set takes in the agent. The training set itself is not counted
// per loader: the loaders share one read-only mapping of the prepared file, page cache that the
// kernel can drop and read again.
struct PipelineMemory {
  double ring_bytes = 0;        // min(ring_slots, total batches) x batch_size x (sample + label)
  double per_loader_bytes = 0;  // kLoaderProcessBytes, the epoch's order (4 bytes a sample, twice
                                // while the next epoch's replaces it), one augmented sample
  double dataset_bytes = 0;     // count x (sample + label): the prepared file's samples and labels
  double prepare_bytes = 0;     // the agent's peak while preparing: dataset_bytes when it decodes
                                // the samples (gzipped IDX, CSV), 0 when they are mapped in place
};

// A loader's own memory besides the epoch's order: code, heap, stacks. Measured with
// bench/run_loader_memory.sh: RssAnon 0.9 to 1.2 MiB per loader of a Fashion-MNIST job (its
// 0.23 MiB order included), 46 MiB before the loaders shared the training set; 4 MiB leaves room.
inline constexpr double kLoaderProcessBytes = 4.0 * 1024 * 1024;
// Bad-sample lines forwarded from the loader logs to the job's log per attempt; the rest are
// counted.
inline constexpr uint64_t kForwardedBadSamples = 100;

PipelineMemory EstimatePipelineMemory(const DatasetSummary& train, uint32_t batch_size,
                                      uint64_t ring_batches, bool decodes);

// How many loaders the pipeline may have in `available_bytes` (half of them for the data
// pipeline): `loader_count` if they fit; with `autotune`, as many as fit up to `loader_count`
// (at least 1). RESOURCE_EXHAUSTED, saying what needs how much and what to do, when they do not
// fit, or preparing the training set does not.
absl::StatusOr<int> FitLoadersInMemory(const PipelineMemory& memory, int loader_count,
                                       bool autotune, int64_t available_bytes);

class JobRunner {
 public:
  using EventCallback = std::function<void(const v1::JobEvent&)>;

  // `on_event` is called from a runner thread for every event the trainer or supervisor emits.
  JobRunner(RunnerOptions options, v1::Assignment assignment, EventCallback on_event);

  // Blocks until the attempt ends. With `resume_checkpoint`, the trainer loads it and the batch
  // stream starts at the step it holds. Before any process starts it prepares the training set in
  // training_set_path() (logging when it starts, every 10 s while it takes, and when it is done)
  // and removes it when the attempt ends.
  AttemptOutcome Run(const std::string& resume_checkpoint = "");
  // Asks a running attempt to stop (thread-safe); Run() then returns CANCELLED within ~2 s.
  void Cancel() { cancel_requested_.store(true); }
  // The worker is shutting down (thread-safe): the trainer writes a checkpoint at the step it
  // reached and stops (within RunnerOptions::drain_timeout, else it is stopped as by Cancel);
  // Run() then returns FAILED with `released` set, unless the attempt had already finished.
  // `preempted`: the server asked for the devices back (the trainer's log line says so).
  void Drain(bool preempted = false) {
    preempted_.store(preempted);
    drain_requested_.store(true);
  }

  // Counters of the running attempt, for export; zero before the region exists.
  struct StatsSnapshot {
    bool running = false;  // false before the region exists and after the attempt ended
    uint64_t samples_total = 0, steps_total = 0, skipped_steps_total = 0, data_stall_ns = 0,
             device_busy_ns = 0, loader_batches_total = 0, loader_busy_ns = 0,
             loader_restarts_total = 0, bad_samples_total = 0, epoch = 0;
    // Data-parallel jobs: this rank's gradient all-reduce (JobStats allreduce_*).
    uint64_t allreduce_ns = 0, allreduce_exposed_ns = 0, allreduce_bytes_total = 0,
             allreduce_calls_total = 0;
    double loss = 0, loss_scale = 1, eval_accuracy = 0;
    uint32_t filled_slots = 0;
    uint32_t loader_processes = 0;  // loaders of the current era (loader.processes: auto moves it)
  };
  StatsSnapshot Snapshot();

  // The attempt's directory (job file, logs, checkpoints).
  const std::string& dir() const { return dir_; }
  // Where the trainer writes its checkpoints (replaced atomically each time).
  std::string checkpoint_path() const { return dir_ + "/checkpoint.safetensors"; }
  // The prepared training set the loaders map (while the attempt runs).
  std::string training_set_path() const { return dir_ + "/train.samples"; }

 private:
  // Run's steps, in order. Each returns what the next needs, or nothing with the outcome that ends
  // the attempt in `ended`.
  // The spec validated and its dataset paths resolved on this worker (resolved_spec_).
  std::optional<v1::JobSpec> ResolveJob(AttemptOutcome* ended);
  // What the pipeline will be: the training set probed (an image dataset indexed), the loader
  // count fitted into the memory the job may use.
  struct PipelinePlan {
    bool images = false;
    std::optional<absl::StatusOr<PreparedInfo>> image_index;  // image datasets
    bool autotune = false;                                    // loader.processes: auto
    int loader_count = 1;                                     // auto: the most it may grow to
    int replicas = 1;
  };
  std::optional<PipelinePlan> PlanPipeline(const v1::JobSpec& spec, AttemptOutcome* ended);
  // The training set prepared in training_set_path() (an image dataset's index, from the plan).
  std::optional<PreparedInfo> PrepareData(const v1::JobSpec& spec, PipelinePlan& plan,
                                          AttemptOutcome* ended);
  // The job's region, its header holding the resolved geometry; started at the checkpoint's step
  // when resuming.
  std::unique_ptr<JobRegion> CreateRegion(const v1::JobSpec& spec, const DatasetSummary& train,
                                          const PipelinePlan& plan,
                                          const std::string& resume_checkpoint,
                                          AttemptOutcome* ended);
  // job.pb, the resolved spec the trainer and the loaders read.
  std::optional<std::string> WriteJobFile(const v1::JobSpec& spec, AttemptOutcome* ended);
  void LogPipeline(const DatasetSummary& train, const PipelinePlan& plan,
                   const RingGeometry& geometry);

  // Starts stoker-trainer with the region, the event pipe's write end and its flags.
  absl::StatusOr<pid_t> StartTrainer(JobRegion& region, int events_fd, const std::string& job_file,
                                     const std::string& resume_checkpoint, int classes,
                                     int64_t train_samples, int loader_count,
                                     const std::string& log_path);
  // Runs the trainer and the loaders until the trainer ends (or the attempt is cancelled, drained,
  // stalled, or a loader fails for good) and says how the attempt ended.
  AttemptOutcome Supervise(JobRegion& region, const std::string& job_file,
                           const std::string& resume_checkpoint, int loader_count, int classes,
                           int64_t train_samples);
  // Prepares the training set in training_set_path(), logging its progress; the error is the
  // attempt's outcome.
  absl::StatusOr<PreparedInfo> PrepareTrainingSetLogged(const v1::JobSpec& spec);
  // Image datasets (image_folder, shards): indexes the training images into training_set_path()
  // (the loaders map the index and decode the images themselves), logging its progress. The
  // summary describes the transformed samples ([C, size, size] uint8).
  absl::StatusOr<PreparedInfo> IndexTrainingImagesLogged(const v1::JobSpec& spec);
  // Calls `work` while a thread logs "still <what> (N s)" every 10 s.
  template <typename Work>
  auto WithProgressTicker(const std::string& what, Work work);
  // Forwards the loaders' "bad sample" lines (from their logs) to the job's log, paths as the job
  // wrote them; at most kForwardedBadSamples per attempt, then one line saying how many more.
  void ForwardBadSamples(JobRegion& region, bool final);
  // dataset.decoded_cache: decodes the training split once into DecodedCachePath of the training
  // set when DecodedCacheRefusal allows it, logging what it did or why not. A failure only logs:
  // the loaders then decode as without it.
  void CacheDecodedImages(const v1::JobSpec& spec, const SampleIndex& index,
                          const ImageTransform& transform);

  const RunnerOptions options_;
  const v1::Assignment assignment_;
  const std::string dir_;
  EventCallback on_event_;
  std::atomic<bool> cancel_requested_{false};
  std::atomic<bool> drain_requested_{false};
  std::atomic<bool> preempted_{false};
  absl::Mutex region_mu_;
  JobRegion* region_ ABSL_GUARDED_BY(region_mu_) = nullptr;
  // The spec with dataset paths resolved on this worker (set by Run).
  v1::JobSpec resolved_spec_;
  // ForwardBadSamples' state: bytes of each loader log read so far, lines forwarded, and the
  // region's bad_samples_total when it last looked.
  std::vector<uint64_t> bad_sample_log_offsets_;
  uint64_t bad_samples_forwarded_ = 0;
  uint64_t bad_samples_seen_ = 0;
};

}  // namespace stoker

#endif  // STOKER_WORKER_JOB_RUNNER_H_
