#include "worker/job_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "common/exit_codes.h"
#include "common/status_macros.h"
#include "common/system_memory.h"
#include "data/dataset.h"
#include "data/decoded_cache.h"
#include "data/image_dataset.h"
#include "data/prepared_dataset.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "worker/autotuner.h"
#include "worker/job_runner_internal.h"
#include "worker/loader_pool.h"
#include "worker/omp_wait.h"
#include "worker/process.h"

namespace stoker {
namespace {

AttemptOutcome Failed(std::string error, bool permanent) {
  AttemptOutcome outcome;
  outcome.state = v1::JOB_STATE_FAILED;
  outcome.error = std::move(error);
  outcome.permanent = permanent;
  return outcome;
}

// The attempt's stall watchdog: the pipeline is hung when neither the shared heartbeat
// (JobStats::heartbeats_total) nor the trainer's events moved for `timeout`.
class Watchdog {
 public:
  Watchdog(JobRegion& region, absl::Duration timeout, const std::atomic<int64_t>& last_event_ns)
      : region_(region),
        timeout_(timeout),
        last_event_ns_(last_event_ns),
        last_beats_(region.stats().heartbeats_total.load()),
        last_beat_(absl::Now()) {}

  // nullopt while the pipeline works; else why the attempt is stopped, naming the batch the
  // trainer waits for and the loader that owes it (with its pid from `loaders`).
  std::optional<std::string> Check(const LoaderPool& loaders) {
    if (const uint64_t beats = region_.stats().heartbeats_total.load(); beats != last_beats_) {
      last_beats_ = beats;
      last_beat_ = absl::Now();
    }
    const absl::Duration silent =
        absl::Now() - std::max(last_beat_, absl::FromUnixNanos(last_event_ns_.load()));
    if (silent <= timeout_) return std::nullopt;
    const uint64_t next = region_.stats().consumer_next_batch.load();
    if (next < region_.geometry().total_batches && !region_.IsPublished(next)) {
      // The trainer waits for a batch and no loader works on it: name the one that owes it.
      const uint32_t k = region_.LoaderFor(next);
      const std::optional<pid_t> pid = loaders.pid(static_cast<int>(k));
      return absl::StrCat(
          "the pipeline made no progress for ", absl::FormatDuration(silent),
          ": the trainer waits for batch ", next, " of loader ", k,
          pid ? absl::StrCat(" (pid ", *pid, "), which made nothing") : " (not running)",
          "; stopped the attempt");
    }
    return absl::StrCat("the trainer made no progress for ", absl::FormatDuration(silent), " (",
                        region_.stats().steps_total.load(), " steps done",
                        next < region_.geometry().total_batches
                            ? absl::StrCat(", its next batch ", next, " waiting in the ring")
                            : "",
                        "); stopped it");
  }

 private:
  JobRegion& region_;
  const absl::Duration timeout_;
  const std::atomic<int64_t>& last_event_ns_;
  // When the pipeline last showed a sign of work (a heartbeat).
  uint64_t last_beats_;
  absl::Time last_beat_;
};

// Reads the trainer's events (length-delimited JobEvent messages) from the pipe's read end `fd`
// on a thread of its own until the pipe closes, passing each to `on_event`; keeps when the last one
// came (for the watchdog) and the last epoch's progress (for the outcome).
class TrainerEvents {
 public:
  TrainerEvents(int fd, const JobRunner::EventCallback& on_event)
      : thread_([this, fd, &on_event] {
          google::protobuf::io::FileInputStream input(fd);
          input.SetCloseOnDelete(true);
          bool clean_eof = false;
          // The parse merges into `event`: it is cleared after each one, or an event would
          // inherit the fields (such as a log line's message) of the one before.
          for (v1::JobEvent event;
               google::protobuf::util::ParseDelimitedFromZeroCopyStream(&event, &input, &clean_eof);
               event.Clear()) {
            last_event_ns_.store(absl::GetCurrentTimeNanos());
            if (event.type() == v1::EVENT_TYPE_EPOCH) {
              absl::MutexLock lock(&mu_);
              last_epoch_progress_ = event.progress();
            }
            on_event(event);
          }
        }) {}
  ~TrainerEvents() { Join(); }

  // Waits for the pipe to close (every writer gone).
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // When the trainer last reported; it reports at least once a second while it steps.
  const std::atomic<int64_t>& last_event_ns() const { return last_event_ns_; }
  v1::TrainingProgress last_epoch_progress() {
    absl::MutexLock lock(&mu_);
    return last_epoch_progress_;
  }

 private:
  std::atomic<int64_t> last_event_ns_{absl::GetCurrentTimeNanos()};
  absl::Mutex mu_;
  v1::TrainingProgress last_epoch_progress_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members it uses exist
};

// How an attempt ended whose trainer exited with `exit` (nothing else failed first); `drained`
// when the worker's shutdown asked it to checkpoint and stop.
AttemptOutcome TrainerOutcome(const ExitInfo& exit, bool drained, bool data_parallel,
                              const std::string& trainer_log) {
  AttemptOutcome outcome;
  if (!exit.signaled && exit.code == kExitSuccess) {
    outcome.state = v1::JOB_STATE_SUCCEEDED;
    return outcome;
  }
  outcome.state = v1::JOB_STATE_FAILED;
  if (drained) {
    outcome.released = true;  // the agent says why: its shutdown
    return outcome;
  }
  if (data_parallel && !exit.signaled && exit.code == kExitStopped) {
    // The ranks stop together at a checkpoint when any rank's worker shuts down (the trainers
    // vote on it every step): this rank gives the job back too.
    outcome.released = true;
    outcome.error = "stopped at a checkpoint with the other ranks: a worker of the job shut down";
    return outcome;
  }
  outcome.permanent = !exit.signaled && exit.code == kExitBadInput;
  const std::string tail = TailOfFile(trainer_log, 2000);
  if (outcome.permanent && !tail.empty()) {
    // The trainer refused the job (bad data or model) and said why: that is the whole story.
    absl::string_view message = tail;
    absl::ConsumePrefix(&message, "stoker-trainer: ");
    outcome.error = std::string(message);
  } else {
    outcome.error =
        absl::StrCat("trainer ", exit.Describe(), tail.empty() ? "" : absl::StrCat(": ", tail));
  }
  return outcome;
}

}  // namespace

std::string AttemptDirectory(const std::string& work_dir, const v1::Assignment& assignment) {
  return absl::StrCat(work_dir, "/", assignment.job_id(), "-a", assignment.attempt(),
                      assignment.rank() > 0 ? absl::StrCat("-r", assignment.rank()) : "");
}

uint64_t RankTotalBatches(int64_t count, uint32_t batch_size, int replicas, int epochs) {
  const int64_t global_batch = int64_t{batch_size} * std::max(1, replicas);
  return static_cast<uint64_t>(BatchesPerEpoch(count, global_batch)) *
         static_cast<uint64_t>(std::max(0, epochs));
}

std::vector<std::string> TrainerArguments(const RunnerOptions& options,
                                          const v1::Assignment& assignment, const std::string& dir,
                                          int region_fd, int events_fd, const std::string& job_file,
                                          const std::string& resume_checkpoint, int classes,
                                          int64_t train_samples) {
  std::vector<std::string> argv = {options.trainer_path,
                                   "--region-fd",
                                   absl::StrCat(region_fd),
                                   "--events-fd",
                                   absl::StrCat(events_fd),
                                   "--job",
                                   job_file,
                                   "--parent-pid",
                                   absl::StrCat(getpid()),
                                   "--classes",
                                   absl::StrCat(classes),
                                   "--train-data",
                                   dir + "/train.samples",
                                   "--test-data",
                                   absl::StrCat(dir, "/test.samples"),
                                   "--threads",
                                   absl::StrCat(std::max(1, options.cpu_count))};
  // Only rank 0 writes checkpoints.
  if (assignment.rank() == 0) {
    argv.insert(argv.begin() + 7, {"--checkpoint", dir + "/checkpoint.safetensors"});
  }
  if (!options.cuda_visible_devices.empty()) {
    argv.push_back("--cuda-visible-devices");
    argv.push_back(options.cuda_visible_devices);
  }
  if (options.fake_gpus_for_tests) argv.push_back("--fake-gpus-for-tests");
  if (!resume_checkpoint.empty()) {
    argv.push_back("--resume");
    argv.push_back(resume_checkpoint);
  }
  if (assignment.replicas() > 1) {
    argv.insert(argv.end(), {"--rank",
                             absl::StrCat(assignment.rank()),
                             "--replicas",
                             absl::StrCat(assignment.replicas()),
                             "--server",
                             options.server_address,
                             "--train-samples",
                             absl::StrCat(train_samples),
                             "--worker-id",
                             options.worker_id,
                             "--job-id",
                             assignment.job_id(),
                             "--attempt",
                             absl::StrCat(assignment.attempt()),
                             "--collective-host",
                             options.collective_host,
                             "--collective-timeout-seconds",
                             absl::StrCat(absl::ToDoubleSeconds(options.collective_timeout)),
                             "--collective-transport",
                             options.collective_transport});
    if (!options.collective_machine_for_tests.empty()) {
      argv.insert(argv.end(),
                  {"--collective-machine-for-tests", options.collective_machine_for_tests});
    }
    if (!options.token_file.empty()) argv.insert(argv.end(), {"--token-file", options.token_file});
    if (!options.tls_ca.empty()) argv.insert(argv.end(), {"--tls-ca", options.tls_ca});
  }
  return argv;
}

PipelineMemory EstimatePipelineMemory(const DatasetSummary& train, uint32_t batch_size,
                                      uint64_t ring_batches, bool decodes) {
  PipelineMemory memory;
  const double record_bytes = double(train.sample_bytes) + 1;  // a sample and its label
  memory.ring_bytes = double(ring_batches) * batch_size * record_bytes;
  memory.per_loader_bytes =
      kLoaderProcessBytes + 8.0 * double(train.count) + double(train.sample_bytes);
  memory.dataset_bytes = double(train.count) * record_bytes;
  memory.prepare_bytes = decodes ? memory.dataset_bytes : 0;
  return memory;
}

absl::StatusOr<int> FitLoadersInMemory(const PipelineMemory& memory, int loader_count,
                                       bool autotune, int64_t available_bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;
  const double budget = available_bytes / 2.0;
  if (memory.prepare_bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the agent decodes the %.2f GiB training set once to prepare it for the loaders; this "
        "machine has %.1f GiB available, half of it for the data pipeline: use "
        "dataset.train_limit, or the training set as raw (not gzipped) IDX or as NPY, which the "
        "loaders map in place without decoding",
        memory.prepare_bytes / kGiB, available_bytes / kGiB));
  }
  if (autotune) {
    const double affordable = std::floor((budget - memory.ring_bytes) / memory.per_loader_bytes);
    loader_count = static_cast<int>(std::clamp(affordable, 1.0, double(loader_count)));
  }
  const double need = memory.ring_bytes + loader_count * memory.per_loader_bytes;
  if (need > budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "loader.processes: %d loader(s) of %.0f MiB each (the %.2f GiB training set is one "
        "read-only mapping they share, not counted per loader), plus a ring of %.2f GiB "
        "(loader.ring_slots x train.batch_size), need %.2f GiB; this machine has %.1f GiB "
        "available, half of it for the data pipeline: use fewer loader processes or ring slots, "
        "or a smaller batch",
        loader_count, memory.per_loader_bytes / kMiB, memory.dataset_bytes / kGiB,
        memory.ring_bytes / kGiB, need / kGiB, available_bytes / kGiB));
  }
  return loader_count;
}

JobRunner::JobRunner(RunnerOptions options, v1::Assignment assignment, EventCallback on_event)
    : options_(std::move(options)),
      assignment_(std::move(assignment)),
      dir_(AttemptDirectory(options_.work_dir, assignment_)),
      on_event_(std::move(on_event)) {}

JobRunner::StatsSnapshot JobRunner::Snapshot() {
  absl::MutexLock lock(&region_mu_);
  StatsSnapshot snapshot;
  if (region_ == nullptr) return snapshot;
  JobStats& stats = region_->stats();
  snapshot.running = true;
  snapshot.skipped_steps_total = stats.skipped_steps_total.load();
  snapshot.loader_busy_ns = stats.loader_busy_ns_total.load();
  snapshot.epoch = stats.epoch.load();
  snapshot.loss = LoadDouble(stats.loss_bits);
  snapshot.loss_scale = LoadDouble(stats.loss_scale_bits);
  snapshot.eval_accuracy = LoadDouble(stats.eval_accuracy_bits);
  snapshot.samples_total = stats.samples_total.load();
  snapshot.steps_total = stats.steps_total.load();
  snapshot.data_stall_ns = stats.data_stall_ns_total.load();
  snapshot.device_busy_ns = stats.device_busy_ns_total.load();
  snapshot.loader_batches_total = stats.loader_batches_total.load();
  snapshot.loader_restarts_total = stats.loader_restarts_total.load();
  snapshot.bad_samples_total = stats.bad_samples_total.load();
  snapshot.allreduce_ns = stats.allreduce_ns_total.load();
  snapshot.allreduce_exposed_ns = stats.allreduce_exposed_ns_total.load();
  snapshot.allreduce_bytes_total = stats.allreduce_bytes_total.load();
  snapshot.allreduce_calls_total = stats.allreduce_calls_total.load();
  snapshot.filled_slots = region_->FilledSlots();
  snapshot.loader_processes = region_->ActiveLoaderCount();
  return snapshot;
}

namespace {

// The attempt's data, removed when it ends: the prepared training set (decoded samples, or an
// image index), as large as the dataset, which only the loaders use (gone by then); and what a
// trainer killed while decoding an image test split left of it (test.samples and its temporary
// files; a trainer that finished unlinked it itself), and the decoded cache.
struct RemoveAttemptData {
  std::string dir;
  std::string training_set;
  ~RemoveAttemptData() {
    std::error_code ignored;
    std::filesystem::remove(training_set, ignored);
    for (std::filesystem::directory_iterator it(dir, ignored), end; !ignored && it != end;
         it.increment(ignored)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("test.samples", 0) == 0 || name.rfind("train.samples", 0) == 0) {
        std::error_code also_ignored;
        std::filesystem::remove(it->path(), also_ignored);
      }
    }
  }
};

AttemptOutcome Cancelled() {
  AttemptOutcome outcome;
  outcome.state = v1::JOB_STATE_CANCELLED;
  outcome.error = "cancelled";
  return outcome;
}

}  // namespace

AttemptOutcome JobRunner::Run(const std::string& resume_checkpoint) {
  AttemptOutcome ended;
  std::optional<v1::JobSpec> spec = ResolveJob(&ended);
  if (!spec) return ended;
  RemoveAttemptData remove_attempt_data{dir_, training_set_path()};
  std::optional<PipelinePlan> plan = PlanPipeline(*spec, &ended);
  if (!plan) return ended;
  std::optional<PreparedInfo> prepared = PrepareData(*spec, *plan, &ended);
  if (!prepared) return ended;
  if (cancel_requested_.load()) return Cancelled();
  std::unique_ptr<JobRegion> region =
      CreateRegion(*spec, prepared->summary, *plan, resume_checkpoint, &ended);
  if (region == nullptr) return ended;
  std::optional<std::string> job_file = WriteJobFile(*spec, &ended);
  if (!job_file) return ended;
  LogPipeline(prepared->summary, *plan, region->geometry());
  {
    absl::MutexLock lock(&region_mu_);
    region_ = region.get();
  }
  AttemptOutcome outcome = Supervise(*region, *job_file, resume_checkpoint, plan->loader_count,
                                     prepared->summary.classes, prepared->summary.count);
  // Loader and trainer errors name the files as the job wrote them, not under the data root.
  outcome.error = DatasetPathsAsWritten(outcome.error, assignment_.spec(), *spec);
  {
    absl::MutexLock lock(&region_mu_);
    region_ = nullptr;
  }
  return outcome;
}

std::optional<v1::JobSpec> JobRunner::ResolveJob(AttemptOutcome* ended) {
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) {
    *ended = Failed(absl::StrCat("cannot create ", dir_, ": ", error.message()), false);
    return std::nullopt;
  }
  v1::JobSpec spec = assignment_.spec();
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) {
    *ended = Failed(std::string(s.message()), true);
    return std::nullopt;
  }
  if (absl::Status s = ResolveDatasetPaths(options_.data_root, &spec); !s.ok()) {
    *ended = Failed(absl::StrCat("on this worker: ", s.message()), true);
    return std::nullopt;
  }
  resolved_spec_ = spec;
  return spec;
}

std::optional<JobRunner::PipelinePlan> JobRunner::PlanPipeline(const v1::JobSpec& spec,
                                                               AttemptOutcome* ended) {
  PipelinePlan plan;
  // Image datasets: the index is the probe (it is what knows the count and the classes), built
  // once, here.
  plan.images = IsImageFormat(spec.dataset().format());
  if (plan.images) plan.image_index = IndexTrainingImagesLogged(spec);
  absl::StatusOr<DatasetSummary> shape =
      plan.images
          ? (plan.image_index->ok() ? absl::StatusOr<DatasetSummary>((*plan.image_index)->summary)
                                    : absl::StatusOr<DatasetSummary>(plan.image_index->status()))
          : ProbeDatasetFiles(TrainDatasetFiles(spec), spec.dataset().train_limit());
  if (!shape.ok()) {
    // A dataset the agent cannot read fails the job; an index it cannot write only the attempt.
    *ended = Failed(DatasetPathsAsWritten(shape.status().message(), assignment_.spec(), spec),
                    !absl::IsUnavailable(shape.status()));
    return std::nullopt;
  }
  // `auto` starts with one loader and grows while the trainer waits for data (see Supervise).
  plan.autotune = spec.loader().processes() == 0;
  plan.loader_count =
      plan.autotune ? AutoLoaderLimit(options_.cpu_count) : spec.loader().processes();
  plan.replicas = std::max(1, assignment_.replicas());
  // Memory: the ring, each loader's own memory, and preparing the training set; not a copy of the
  // training set per loader (they share one mapping). They may take half of what is available;
  // the trainer sizes its model against what is left when it starts.
  absl::StatusOr<int64_t> available = AvailableSystemMemoryBytes();
  if (!available.ok()) return plan;
  // The job may use what its placement gives it, if the machine has that much.
  const bool limited = options_.memory_limit_bytes > 0 && options_.memory_limit_bytes < *available;
  if (limited) *available = options_.memory_limit_bytes;
  const uint64_t total_batches = RankTotalBatches(shape->count, spec.train().batch_size(),
                                                  plan.replicas, spec.train().epochs());
  const absl::StatusOr<SamplesStorage> storage =
      plan.images ? absl::StatusOr<SamplesStorage>(SamplesStorage::kSource)
                  : ChooseSamplesStorage(TrainDatasetFiles(spec));
  const PipelineMemory memory =
      EstimatePipelineMemory(*shape, spec.train().batch_size(),
                             std::min<uint64_t>(spec.loader().ring_slots(), total_batches),
                             !storage.ok() || *storage == SamplesStorage::kCopy);
  absl::StatusOr<int> fitted =
      FitLoadersInMemory(memory, plan.loader_count, plan.autotune, *available);
  if (!fitted.ok()) {
    *ended = Failed(limited ? absl::StrCat(fitted.status().message(),
                                           " (the machine's available memory "
                                           "here is this job's share of the worker: raise "
                                           "resources.memory_mib)")
                            : std::string(fitted.status().message()),
                    true);
    return std::nullopt;
  }
  plan.loader_count = *fitted;
  return plan;
}

std::optional<PreparedInfo> JobRunner::PrepareData(const v1::JobSpec& spec, PipelinePlan& plan,
                                                   AttemptOutcome* ended) {
  // Decoded once, here, for every loader of the attempt (image datasets: indexed already).
  absl::StatusOr<PreparedInfo> prepared =
      plan.images ? std::move(*plan.image_index) : PrepareTrainingSetLogged(spec);
  if (!prepared.ok()) {
    // A dataset the agent cannot read fails the job; a file it cannot write (a full disk) only
    // this attempt.
    *ended = Failed(DatasetPathsAsWritten(prepared.status().message(), assignment_.spec(), spec),
                    !absl::IsUnavailable(prepared.status()));
    return std::nullopt;
  }
  return *std::move(prepared);
}

std::unique_ptr<JobRegion> JobRunner::CreateRegion(const v1::JobSpec& spec,
                                                   const DatasetSummary& train,
                                                   const PipelinePlan& plan,
                                                   const std::string& resume_checkpoint,
                                                   AttemptOutcome* ended) {
  // The prepared set is the training set (the same as probed, unless the files changed
  // meanwhile); a data-parallel rank's ring holds its slices of the global batches.
  RingGeometry geometry;
  geometry.slot_count = spec.loader().ring_slots();
  geometry.batch_size = spec.train().batch_size();
  geometry.sample_bytes = train.sample_bytes;
  geometry.sample_type = train.sample_type;
  geometry.loader_count = plan.loader_count;
  geometry.initial_loaders = plan.autotune ? 1 : plan.loader_count;
  geometry.total_batches = RankTotalBatches(train.count, spec.train().batch_size(), plan.replicas,
                                            spec.train().epochs());
  // The shape the job was resolved to (an image job's {C, H, W} from ImageSampleShape): the
  // trainer and the loaders read it from the header (a shape of more than 4 dimensions, possible
  // only for NPY, is not carried; nothing reads it for NPY).
  if (train.sample_dims.size() <= 4) {
    geometry.sample_dims.assign(train.sample_dims.begin(), train.sample_dims.end());
  }
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(geometry);
  if (!region.ok()) {
    *ended = Failed(absl::StrCat("ring buffer: ", region.status().message()), false);
    return nullptr;
  }
  if (!resume_checkpoint.empty()) {
    // Resume: the batch stream starts at the step the checkpoint holds. That may be the last
    // step: the final weights were stored but the attempt that wrote them ended before its
    // success was recorded (its worker or the server killed in between). The trainer then takes
    // no step, evaluates and ends as that attempt would have.
    absl::StatusOr<std::map<std::string, std::string>> metadata =
        ReadCheckpointMetadata(resume_checkpoint);
    uint64_t step = 0;
    if (!metadata.ok() || !metadata->contains("step") ||
        !absl::SimpleAtoi(metadata->at("step"), &step) || step > geometry.total_batches) {
      *ended =
          Failed(absl::StrCat("cannot resume from ", resume_checkpoint, ": ",
                              metadata.ok() ? "bad or missing step" : metadata.status().message()),
                 false);
      return nullptr;
    }
    (*region)->StartAt(step);
  }
  return *std::move(region);
}

std::optional<std::string> JobRunner::WriteJobFile(const v1::JobSpec& spec, AttemptOutcome* ended) {
  // The trainer and loaders read the spec, with absolute paths, from this file.
  const std::string job_file = dir_ + "/job.pb";
  std::ofstream out(job_file, std::ios::binary | std::ios::trunc);
  if (!spec.SerializeToOstream(&out)) {
    *ended = Failed("cannot write " + job_file, false);
    return std::nullopt;
  }
  return job_file;
}

void JobRunner::LogPipeline(const DatasetSummary& train, const PipelinePlan& plan,
                            const RingGeometry& geometry) {
  on_event_(LogEvent(
      absl::StrCat("dataset: ", train.count, " training samples of ",
                   plan.images ? absl::StrCat(absl::StrJoin(train.sample_dims, "x"), " ")
                               : absl::StrCat(train.features, " "),
                   SampleTypeName(train.sample_type), plan.images ? " pixels, " : " features, ",
                   train.classes, " classes; ", geometry.initial_loaders, " loader process(es)",
                   plan.autotune ? absl::StrCat(" (auto, up to ", plan.loader_count, ")") : "",
                   ", ", geometry.slot_count, " ring slots")));
}

absl::StatusOr<pid_t> JobRunner::StartTrainer(JobRegion& region, int events_fd,
                                              const std::string& job_file,
                                              const std::string& resume_checkpoint, int classes,
                                              int64_t train_samples, int loader_count,
                                              const std::string& log_path) {
  const std::vector<std::string> argv =
      TrainerArguments(options_, assignment_, dir_, region.fd(), events_fd, job_file,
                       resume_checkpoint, classes, train_samples);
  // How its OpenMP threads wait: spinning when they have their cores to themselves, passive when
  // other work shares them (worker/omp_wait.h; OMP_WAIT_POLICY or GOMP_SPINCOUNT in the worker's
  // environment decide instead). Image loaders that decode every sample count as busy cores.
  const bool decoding_loaders = IsImageFormat(assignment_.spec().dataset().format()) &&
                                access(DecodedCachePath(training_set_path()).c_str(), F_OK) != 0;
  const OmpWaitChoice wait =
      ChooseTrainerOmpWait(std::max(1, options_.cpu_count), decoding_loaders ? loader_count : 0);
  on_event_(LogEvent(absl::StrCat("trainer OpenMP waits: ", wait.reason)));
  std::vector<std::string> env;
  if (!wait.env_entry.empty()) env.push_back(wait.env_entry);
  return Spawn({argv, {region.fd(), events_fd}, log_path, env});
}

AttemptOutcome JobRunner::Supervise(JobRegion& region, const std::string& job_file,
                                    const std::string& resume_checkpoint, int loader_count,
                                    int classes, int64_t train_samples) {
  const std::string& dir = dir_;
  int event_pipe[2];
  if (pipe2(event_pipe, O_CLOEXEC) != 0) return Failed("cannot create the event pipe", false);
  const std::string trainer_log = dir + "/trainer.log";
  absl::StatusOr<pid_t> trainer = StartTrainer(region, event_pipe[1], job_file, resume_checkpoint,
                                               classes, train_samples, loader_count, trainer_log);
  close(event_pipe[1]);
  if (!trainer.ok()) {
    close(event_pipe[0]);
    return Failed(std::string(trainer.status().message()), false);
  }
  // Loaders check that their consumer lives; it must be known before the first loader starts.
  region.SetConsumerPid(*trainer);

  // Events from the trainer: length-delimited JobEvent messages until the pipe closes.
  TrainerEvents events(event_pipe[0], on_event_);

  std::optional<std::string> fatal;  // set when the attempt must end early
  bool fatal_permanent = false;
  auto fail = [&](const absl::Status& status) {
    fatal = std::string(status.message());
    fatal_permanent = absl::IsInvalidArgument(status);  // a loader refused the data
  };
  LoaderPool loaders(region,
                     {.loader_path = options_.loader_path,
                      .job_file = job_file,
                      .data_file = training_set_path(),
                      .dir = dir,
                      .max_restarts = options_.max_loader_restarts,
                      .rank = assignment_.replicas() > 1 ? assignment_.rank() : 0,
                      .replicas = std::max(1, assignment_.replicas()),
                      .jpeg_cache_dir = options_.jpeg_cache_dir,
                      .jpeg_cache_bytes = options_.jpeg_cache_bytes},
                     [this](const std::string& line) { on_event_(LogEvent(line)); });
  if (absl::Status s = loaders.StartInitial(); !s.ok()) fail(s);

  std::optional<absl::Time> drain_started;
  std::optional<ExitInfo> trainer_exit;
  bool cancelled = false;
  // loader.processes: auto.
  std::optional<Autotuner> autotuner;
  if (assignment_.spec().loader().processes() == 0) {
    autotuner.emplace(region, loader_count, absl::Now());
  }
  Watchdog watchdog(region, options_.trainer_stall_timeout, events.last_event_ns());
  while (!trainer_exit && !fatal) {
    if (std::optional<std::string> stalled = watchdog.Check(loaders)) {
      fatal = *stalled;
      on_event_(LogEvent(*fatal));
      break;
    }
    if (autotuner) {
      if (std::optional<std::string> line = autotuner->Tick(absl::Now())) {
        on_event_(LogEvent(*line));
      }
    }
    if (cancel_requested_.load()) {
      cancelled = true;
      break;
    }
    if (drain_requested_.load() && !drain_started) {
      drain_started = absl::Now();
      region.RequestCheckpointAndStop(preempted_.load() ? JobRegion::StopReason::kPreempted
                                                        : JobRegion::StopReason::kShutdown);
    }
    if (drain_started && absl::Now() - *drain_started > options_.drain_timeout) {
      on_event_(
          LogEvent(absl::StrCat("the trainer did not checkpoint and stop within ",
                                absl::FormatDuration(options_.drain_timeout), "; stopping it")));
      break;
    }
    trainer_exit = TryReap(*trainer);
    if (trainer_exit) break;
    ForwardBadSamples(region, false);
    if (absl::Status s = loaders.ReapAndRespawn(); !s.ok()) {
      fail(s);
    } else if (absl::Status s = loaders.StartNeeded(); !s.ok()) {
      fail(s);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }

  // Wind down: wake every waiter, then make sure no child outlives the attempt.
  region.RequestStop();
  if (!trainer_exit) trainer_exit = Terminate(*trainer, absl::Seconds(2));
  loaders.TerminateAll(absl::Seconds(1));
  events.Join();
  ForwardBadSamples(region, true);

  AttemptOutcome outcome;
  if (cancelled) {
    outcome.state = v1::JOB_STATE_CANCELLED;
    outcome.error = "cancelled";
  } else if (fatal) {
    outcome = Failed(*fatal, fatal_permanent);
  } else {
    outcome = TrainerOutcome(*trainer_exit, drain_started.has_value(), assignment_.replicas() > 1,
                             trainer_log);
  }
  outcome.progress = events.last_epoch_progress();
  return outcome;
}

}  // namespace stoker
