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
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "common/exit_codes.h"
#include "common/system_memory.h"
#include "data/dataset.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "worker/process.h"

namespace stoker {
namespace {

v1::JobEvent LogEvent(const std::string& message) {
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_LOG);
  event.set_message(message);
  return event;
}

AttemptOutcome Failed(std::string error, bool permanent) {
  AttemptOutcome outcome;
  outcome.state = v1::JOB_STATE_FAILED;
  outcome.error = std::move(error);
  outcome.permanent = permanent;
  return outcome;
}

}  // namespace

int AutoLoaderLimit(int cpu_count) {
  // Like tf.data's AUTOTUNE, bounded by the cores: two loaders per core (a loader often waits on
  // I/O or sleeps), at least 2, at most 16.
  return std::clamp(2 * cpu_count, 2, 16);
}

int AutotuneLoaderCount(int current, int limit, double input_bound_fraction,
                        double loader_busy_per_second) {
  // Busy loader-seconds per second and loader: above this, loaders are what the trainer waits on.
  constexpr double kBottleneckBusy = 0.6;
  if (input_bound_fraction > 0.10) {
    if (current > 0 && loader_busy_per_second > kBottleneckBusy * current) {
      return std::max(current, std::min(limit, 2 * current));
    }
    return current;
  }
  const int half = current / 2;
  if (input_bound_fraction < 0.02 && half >= 1 && loader_busy_per_second <= 0.5 * half) {
    return half;
  }
  return current;
}

JobRunner::JobRunner(RunnerOptions options, v1::Assignment assignment, EventCallback on_event)
    : options_(std::move(options)),
      assignment_(std::move(assignment)),
      dir_(absl::StrCat(options_.work_dir, "/", assignment_.job_id(), "-a", assignment_.attempt())),
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
  snapshot.filled_slots = region_->FilledSlots();
  snapshot.loader_processes = region_->ActiveLoaderCount();
  return snapshot;
}

AttemptOutcome JobRunner::Run(const std::string& resume_checkpoint) {
  const std::string& dir = dir_;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return Failed(absl::StrCat("cannot create ", dir, ": ", error.message()), false);

  v1::JobSpec spec = assignment_.spec();
  if (absl::Status s = ValidateJobSpec(spec); !s.ok())
    return Failed(std::string(s.message()), true);
  if (absl::Status s = ResolveDatasetPaths(options_.data_root, &spec); !s.ok()) {
    return Failed(absl::StrCat("on this worker: ", s.message()), true);
  }
  absl::StatusOr<DatasetSummary> shape =
      ProbeDatasetFiles(TrainDatasetFiles(spec), spec.dataset().train_limit());
  if (!shape.ok()) {
    return Failed(DatasetPathsAsWritten(shape.status().message(), assignment_.spec(), spec), true);
  }

  // `auto` starts with one loader and grows while the trainer waits for data (see Supervise).
  const bool autotune = spec.loader().processes() == 0;
  int loader_count = autotune ? AutoLoaderLimit(options_.cpu_count) : spec.loader().processes();
  const uint64_t total_batches =
      static_cast<uint64_t>(BatchesPerEpoch(shape->count, spec.train().batch_size())) *
      spec.train().epochs();
  // Memory: every loader holds its own copy of the training set, and the ring holds up to
  // ring_slots batches. They may take half of what is available; the trainer sizes its model
  // against what is left when it starts.
  if (absl::StatusOr<int64_t> available = AvailableSystemMemoryBytes(); available.ok()) {
    const double budget = *available / 2.0;
    const double dataset_bytes = double(shape->count) * (shape->sample_bytes + 1);
    const double ring_bytes =
        double(std::min<uint64_t>(spec.loader().ring_slots(), total_batches)) *
        spec.train().batch_size() * (shape->sample_bytes + 1);
    if (autotune) {
      const double affordable = std::floor((budget - ring_bytes) / dataset_bytes);
      loader_count = static_cast<int>(std::clamp(affordable, 1.0, double(loader_count)));
    }
    if (ring_bytes + loader_count * dataset_bytes > budget) {
      constexpr double kGiB = 1024.0 * 1024 * 1024;
      return Failed(
          absl::StrFormat("loader.processes: %d loader(s) each holding the %.2f GiB training set, "
                          "plus a ring of %.2f GiB (loader.ring_slots x train.batch_size), need "
                          "%.1f GiB; this machine has %.1f GiB available, half of it for the data "
                          "pipeline: use fewer loader processes or ring slots, or a smaller batch",
                          loader_count, dataset_bytes / kGiB, ring_bytes / kGiB,
                          (ring_bytes + loader_count * dataset_bytes) / kGiB, *available / kGiB),
          true);
    }
  }
  RingGeometry geometry;
  geometry.slot_count = spec.loader().ring_slots();
  geometry.batch_size = spec.train().batch_size();
  geometry.sample_bytes = shape->sample_bytes;
  geometry.sample_type = shape->sample_type;
  geometry.loader_count = loader_count;
  geometry.initial_loaders = autotune ? 1 : loader_count;
  geometry.total_batches = total_batches;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(geometry);
  if (!region.ok()) return Failed(absl::StrCat("ring buffer: ", region.status().message()), false);
  if (!resume_checkpoint.empty()) {
    // Resume: the batch stream starts at the step the checkpoint holds.
    absl::StatusOr<std::map<std::string, std::string>> metadata =
        ReadCheckpointMetadata(resume_checkpoint);
    uint64_t step = 0;
    if (!metadata.ok() || !metadata->contains("step") ||
        !absl::SimpleAtoi(metadata->at("step"), &step) || step >= geometry.total_batches) {
      return Failed(
          absl::StrCat("cannot resume from ", resume_checkpoint, ": ",
                       metadata.ok() ? "bad or missing step" : metadata.status().message()),
          false);
    }
    (*region)->StartAt(step);
  }

  // The trainer and loaders read the spec, with absolute paths, from this file.
  const std::string job_file = dir + "/job.pb";
  {
    std::ofstream out(job_file, std::ios::binary | std::ios::trunc);
    if (!spec.SerializeToOstream(&out)) return Failed("cannot write " + job_file, false);
  }
  on_event_(
      LogEvent(absl::StrCat("dataset: ", shape->count, " training samples of ", shape->features,
                            " ", SampleTypeName(shape->sample_type), " features, ", shape->classes,
                            " classes; ", geometry.initial_loaders, " loader process(es)",
                            autotune ? absl::StrCat(" (auto, up to ", loader_count, ")") : "", ", ",
                            geometry.slot_count, " ring slots")));
  {
    absl::MutexLock lock(&region_mu_);
    region_ = region->get();
  }
  AttemptOutcome outcome =
      Supervise(**region, job_file, resume_checkpoint, loader_count, shape->classes);
  // Loader and trainer errors name the files as the job wrote them, not under the data root.
  outcome.error = DatasetPathsAsWritten(outcome.error, assignment_.spec(), spec);
  {
    absl::MutexLock lock(&region_mu_);
    region_ = nullptr;
  }
  return outcome;
}

AttemptOutcome JobRunner::Supervise(JobRegion& region, const std::string& job_file,
                                    const std::string& resume_checkpoint, int loader_count,
                                    int classes) {
  const std::string& dir = dir_;
  const std::string region_fd = absl::StrCat(region.fd());
  int event_pipe[2];
  if (pipe2(event_pipe, O_CLOEXEC) != 0) return Failed("cannot create the event pipe", false);

  const std::string trainer_log = dir + "/trainer.log";
  std::vector<std::string> trainer_argv = {options_.trainer_path,
                                           "--region-fd",
                                           region_fd,
                                           "--events-fd",
                                           absl::StrCat(event_pipe[1]),
                                           "--job",
                                           job_file,
                                           "--checkpoint",
                                           checkpoint_path(),
                                           "--parent-pid",
                                           absl::StrCat(getpid()),
                                           "--classes",
                                           absl::StrCat(classes)};
  if (!resume_checkpoint.empty()) {
    trainer_argv.push_back("--resume");
    trainer_argv.push_back(resume_checkpoint);
  }
  absl::StatusOr<pid_t> trainer = Spawn({trainer_argv, {region.fd(), event_pipe[1]}, trainer_log});
  close(event_pipe[1]);
  if (!trainer.ok()) {
    close(event_pipe[0]);
    return Failed(std::string(trainer.status().message()), false);
  }
  // Loaders check that their consumer lives; it must be known before the first loader starts.
  region.SetConsumerPid(*trainer);

  // Events from the trainer: length-delimited JobEvent messages until the pipe closes.
  AttemptOutcome outcome;
  absl::Mutex progress_mu;
  v1::TrainingProgress last_epoch_progress;
  // When the trainer last reported; it reports at least once a second while it steps. The
  // watchdog reads it.
  std::atomic<int64_t> last_event_ns{absl::GetCurrentTimeNanos()};
  std::thread reader([&] {
    google::protobuf::io::FileInputStream input(event_pipe[0]);
    input.SetCloseOnDelete(true);
    bool clean_eof = false;
    // The parse merges into `event`: it is cleared after each one, or an event would inherit the
    // fields (such as a log line's message) of the one before.
    for (v1::JobEvent event;
         google::protobuf::util::ParseDelimitedFromZeroCopyStream(&event, &input, &clean_eof);
         event.Clear()) {
      last_event_ns.store(absl::GetCurrentTimeNanos());
      if (event.type() == v1::EVENT_TYPE_EPOCH) {
        absl::MutexLock lock(&progress_mu);
        last_epoch_progress = event.progress();
      }
      on_event_(event);
    }
  });

  auto spawn_loader = [&](int index) {
    return Spawn({{options_.loader_path, "--region-fd", region_fd, "--index", absl::StrCat(index),
                   "--job", job_file, "--parent-pid", absl::StrCat(getpid())},
                  {region.fd()},
                  absl::StrCat(dir, "/loader-", index, ".log")});
  };
  std::vector<std::optional<pid_t>> loaders(loader_count);
  std::optional<std::string> fatal;  // set when the attempt must end early
  bool fatal_permanent = false;
  const int initial_loaders = static_cast<int>(region.ActiveLoaderCount());
  for (int k = 0; k < initial_loaders && !fatal; ++k) {
    absl::StatusOr<pid_t> pid = spawn_loader(k);
    if (pid.ok()) {
      loaders[k] = *pid;
    } else {
      fatal = std::string(pid.status().message());
    }
  }

  int restarts = 0;
  std::optional<absl::Time> drain_started;
  std::optional<ExitInfo> trainer_exit;
  bool cancelled = false;
  // Autotune window (loader.processes: auto).
  const bool autotune = assignment_.spec().loader().processes() == 0;
  struct Window {
    absl::Time start;
    uint64_t stall_ns, busy_ns, loader_ns;
  };
  auto window_now = [&region] {
    const JobStats& stats = region.stats();
    return Window{absl::Now(), stats.data_stall_ns_total.load(), stats.device_busy_ns_total.load(),
                  stats.loader_busy_ns_total.load()};
  };
  Window window = window_now();
  // The watchdog: when the pipeline last showed a sign of work (a heartbeat or an event).
  uint64_t last_beats = region.stats().heartbeats_total.load();
  absl::Time last_beat = absl::Now();
  // An autotune change asked for and not yet applied by the trainer: what to log once it is.
  std::optional<std::string> pending_change;
  while (!trainer_exit && !fatal) {
    if (const uint64_t beats = region.stats().heartbeats_total.load(); beats != last_beats) {
      last_beats = beats;
      last_beat = absl::Now();
    }
    if (const absl::Duration silent =
            absl::Now() - std::max(last_beat, absl::FromUnixNanos(last_event_ns.load()));
        silent > options_.trainer_stall_timeout) {
      const uint64_t next = region.stats().consumer_next_batch.load();
      if (next < region.geometry().total_batches && !region.IsPublished(next)) {
        // The trainer waits for a batch and no loader works on it: name the one that owes it.
        const uint32_t k = region.LoaderFor(next);
        fatal =
            absl::StrCat("the pipeline made no progress for ", absl::FormatDuration(silent),
                         ": the trainer waits for batch ", next, " of loader ", k,
                         loaders[k] ? absl::StrCat(" (pid ", *loaders[k], "), which made nothing")
                                    : " (not running)",
                         "; stopped the attempt");
      } else {
        fatal = absl::StrCat("the trainer made no progress for ", absl::FormatDuration(silent),
                             " (", region.stats().steps_total.load(), " steps done",
                             next < region.geometry().total_batches
                                 ? absl::StrCat(", its next batch ", next, " waiting in the ring")
                                 : "",
                             "); stopped it");
      }
      on_event_(LogEvent(*fatal));
      break;
    }
    if (pending_change && region.ActiveLoaderCount() == region.RequestedLoaderCount()) {
      // The trainer appended the era: the change is in effect from its first batch.
      on_event_(LogEvent(absl::StrCat(*pending_change, " from batch ", region.ActiveEraStart())));
      pending_change.reset();
      window = window_now();  // measure the new count from here
    }
    if (autotune && !pending_change && absl::Now() - window.start >= absl::Seconds(2)) {
      const Window now = window_now();
      const uint64_t stall = now.stall_ns - window.stall_ns;
      const uint64_t busy = now.busy_ns - window.busy_ns;
      const uint64_t loader_busy = now.loader_ns - window.loader_ns;
      const double window_ns = absl::ToDoubleNanoseconds(now.start - window.start);
      const int active = static_cast<int>(region.ActiveLoaderCount());
      if (busy > 0) {
        const double fraction = double(stall) / double(stall + busy);
        const int wanted =
            AutotuneLoaderCount(active, loader_count, fraction, double(loader_busy) / window_ns);
        // The trainer appends the era at its next release (JobRegion::RequestLoaderCount); the
        // loaders it needs are started below once it is in the table.
        if (wanted != active &&
            region.stats().consumer_next_batch.load() + region.geometry().slot_count <
                region.geometry().total_batches &&
            region.RequestLoaderCount(static_cast<uint32_t>(wanted)).ok()) {
          pending_change =
              absl::StrCat("autotune: input-bound ", static_cast<int>(100 * fraction + 0.5),
                           "% of the last window, loaders busy ",
                           static_cast<int>(100 * double(loader_busy) / window_ns / active + 0.5),
                           "% each; loader processes ", active, " -> ", wanted);
        }
      }
      window = window_now();
    }
    if (cancel_requested_.load()) {
      cancelled = true;
      break;
    }
    if (drain_requested_.load() && !drain_started) {
      drain_started = absl::Now();
      region.RequestCheckpointAndStop();
    }
    if (drain_started && absl::Now() - *drain_started > options_.drain_timeout) {
      on_event_(
          LogEvent(absl::StrCat("the trainer did not checkpoint and stop within ",
                                absl::FormatDuration(options_.drain_timeout), "; stopping it")));
      break;
    }
    trainer_exit = TryReap(*trainer);
    if (trainer_exit) break;
    for (int k = 0; k < loader_count && !fatal; ++k) {
      if (!loaders[k]) continue;
      std::optional<ExitInfo> loader_exit = TryReap(*loaders[k]);
      if (!loader_exit) continue;
      loaders[k].reset();
      if (!loader_exit->signaled && loader_exit->code == kExitSuccess) continue;  // all its batches
      const std::string log_path = absl::StrCat(dir, "/loader-", k, ".log");
      if (!loader_exit->signaled && loader_exit->code == kExitBadInput) {
        fatal = absl::StrCat("loader ", k, ": ", TailOfFile(log_path, 2000));
        fatal_permanent = true;
        break;
      }
      if (++restarts > options_.max_loader_restarts) {
        fatal = absl::StrCat("loader ", k, " ", loader_exit->Describe(), "; gave up after ",
                             options_.max_loader_restarts,
                             " restarts. Last output: ", TailOfFile(log_path, 1000));
        break;
      }
      region.stats().loader_restarts_total.fetch_add(1);
      on_event_(LogEvent(absl::StrCat("loader ", k, " ", loader_exit->Describe(),
                                      "; respawned (restart ", restarts, ")")));
      absl::StatusOr<pid_t> pid = spawn_loader(k);
      if (pid.ok()) {
        loaders[k] = *pid;
      } else {
        fatal = std::string(pid.status().message());
      }
    }
    // Every loader that owes a batch runs: one of a new era, and one that left an era and is
    // given batches again by a later one (perhaps before it even exited). After the reaping
    // above, so a loader that ended just now is seen as not running.
    for (int k = 0; k < loader_count && !fatal; ++k) {
      if (loaders[k] || !region.LoaderNeeded(static_cast<uint32_t>(k))) continue;
      absl::StatusOr<pid_t> pid = spawn_loader(k);
      if (pid.ok()) {
        loaders[k] = *pid;
      } else {
        fatal = std::string(pid.status().message());
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }

  // Wind down: wake every waiter, then make sure no child outlives the attempt.
  region.RequestStop();
  if (!trainer_exit) trainer_exit = Terminate(*trainer, absl::Seconds(2));
  for (std::optional<pid_t>& loader : loaders) {
    if (loader) Terminate(*loader, absl::Seconds(1));
  }
  reader.join();

  {
    absl::MutexLock lock(&progress_mu);
    outcome.progress = last_epoch_progress;
  }
  if (cancelled) {
    outcome.state = v1::JOB_STATE_CANCELLED;
    outcome.error = "cancelled";
    return outcome;
  }
  if (fatal) {
    outcome.state = v1::JOB_STATE_FAILED;
    outcome.error = *fatal;
    outcome.permanent = fatal_permanent;
    return outcome;
  }
  if (!trainer_exit->signaled && trainer_exit->code == kExitSuccess) {
    outcome.state = v1::JOB_STATE_SUCCEEDED;
    return outcome;
  }
  if (drain_started) {
    outcome.state = v1::JOB_STATE_FAILED;
    outcome.released = true;  // the agent says why: its shutdown
    return outcome;
  }
  outcome.state = v1::JOB_STATE_FAILED;
  outcome.permanent = !trainer_exit->signaled && trainer_exit->code == kExitBadInput;
  const std::string tail = TailOfFile(trainer_log, 2000);
  if (outcome.permanent && !tail.empty()) {
    // The trainer refused the job (bad data or model) and said why: that is the whole story.
    absl::string_view message = tail;
    absl::ConsumePrefix(&message, "stoker-trainer: ");
    outcome.error = std::string(message);
  } else {
    outcome.error = absl::StrCat("trainer ", trainer_exit->Describe(),
                                 tail.empty() ? "" : absl::StrCat(": ", tail));
  }
  return outcome;
}

}  // namespace stoker
