// stoker-trainer: the per-job training process. Attaches to the job's region, consumes batches
// in order from the ring, trains on the selected backend, evaluates on the test set after every
// epoch and reports events to the agent over a pipe (length-delimited stoker.v1.JobEvent).
//
// Exit codes (common/exit_codes.h): 0 done, 1 failed (may succeed on retry), 2 bad data or spec,
// 3 stopped, 64 bad arguments, other = crash.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checkpoint.h"
#include "common/exit_codes.h"
#include "data/dataset.h"
#include "data/heartbeat.h"
#include "data/job_region.h"
#include "engine/backend.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "spec/job_options.h"
#include "stoker.pb.h"
#ifdef STOKER_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif
#include "spec/model_spec.h"

namespace stoker {
namespace {

// Writes events to the agent. A write error (the agent died) is ignored: the run goes on and
// the stop flag or parent death ends it.
class EventWriter {
 public:
  explicit EventWriter(int fd) : fd_(fd) {}
  void Write(const v1::JobEvent& event) {
    if (fd_ >= 0) google::protobuf::util::SerializeDelimitedToFileDescriptor(event, fd_);
  }
  void Log(const std::string& message) {
    v1::JobEvent event;
    event.set_type(v1::EVENT_TYPE_LOG);
    event.set_message(message);
    Write(event);
  }

 private:
  int fd_;
};

// Learning rate for step `step` (0-based) of `total_steps`: linear warm-up, then the schedule.
double LearningRateAt(const v1::OptimizerSpec& optimizer, uint64_t step, uint64_t total_steps) {
  const double base = optimizer.lr();
  const uint64_t warmup = static_cast<uint64_t>(optimizer.warmup_steps());
  if (step < warmup) return base * double(step + 1) / double(warmup);
  if (optimizer.lr_schedule() != "cosine" || total_steps <= warmup) return base;
  const double progress = double(step - warmup) / double(total_steps - warmup);
  return base * 0.5 * (1.0 + std::cos(M_PI * progress));
}

constexpr char kOptimizerPrefix[] = "optimizer.";

// Weights and optimizer state as one safetensors file; the training position in its metadata.
absl::Status SaveCheckpoint(const std::string& path, const BuiltModel& built, uint64_t step,
                            int epoch, double test_accuracy, const v1::JobSpec& spec) {
  const Model& model = *built.model;
  Checkpoint checkpoint;
  for (NamedTensor& tensor : model.Parameters()) {
    checkpoint.tensors.push_back({tensor.name, tensor.shape, std::move(tensor.values)});
  }
  for (NamedTensor& tensor : model.OptimizerState()) {
    checkpoint.tensors.push_back(
        {absl::StrCat(kOptimizerPrefix, tensor.name), tensor.shape, std::move(tensor.values)});
  }
  checkpoint.metadata = {{"format", "stoker-checkpoint-1"},
                         {"step", absl::StrCat(step)},
                         {"epoch", absl::StrCat(epoch)},
                         {"test_accuracy", absl::StrCat(test_accuracy)},
                         {"seed", absl::StrCat(spec.train().seed())},
                         {"precision", v1::Precision_Name(spec.train().precision())},
                         {"job_name", spec.name()},
                         {"model", built.architecture}};
  return WriteCheckpoint(path, checkpoint);
}

struct ResumePoint {
  uint64_t step = 0;
  double test_accuracy = -1;
};

absl::StatusOr<ResumePoint> LoadCheckpoint(const std::string& path, Model& model) {
  absl::StatusOr<Checkpoint> checkpoint = ReadCheckpoint(path);
  if (!checkpoint.ok()) return checkpoint.status();
  std::vector<NamedTensor> parameters, optimizer;
  const std::string prefix = kOptimizerPrefix;
  for (CheckpointTensor& tensor : checkpoint->tensors) {
    const bool is_optimizer = tensor.name.rfind(prefix, 0) == 0;
    NamedTensor named{is_optimizer ? tensor.name.substr(prefix.size()) : tensor.name, tensor.shape,
                      std::move(tensor.values)};
    (is_optimizer ? optimizer : parameters).push_back(std::move(named));
  }
  if (absl::Status s = model.SetParameters(parameters); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  if (absl::Status s = model.SetOptimizerState(optimizer); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  ResumePoint point;
  auto step = checkpoint->metadata.find("step");
  if (step == checkpoint->metadata.end() || !absl::SimpleAtoi(step->second, &point.step)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no step in its metadata"));
  }
  auto accuracy = checkpoint->metadata.find("test_accuracy");
  if (accuracy != checkpoint->metadata.end()) {
    (void)absl::SimpleAtod(accuracy->second, &point.test_accuracy);
  }
  return point;
}

struct EvalSummary {
  double accuracy = 0;
  double loss = 0;
};

// A batch of `count` samples at `samples` for the model: uint8 pixels, or float32 features.
BatchView MakeBatchView(const uint8_t* samples, const uint8_t* labels, int count,
                        SampleType sample_type) {
  BatchView view;
  view.count = count;
  view.labels = labels;
  if (sample_type == SampleType::kFloat32) {
    view.features = reinterpret_cast<const float*>(samples);
  } else {
    view.samples = samples;
  }
  return view;
}

// Raises `heartbeats` after each batch: a long evaluation is work, not a hang.
absl::StatusOr<EvalSummary> EvaluateTestSet(Model& model, const LabeledSamples& test,
                                            int batch_size, std::atomic<uint64_t>& heartbeats) {
  EvalResult total;
  for (int64_t start = 0; start < test.count; start += batch_size) {
    heartbeats.fetch_add(1, std::memory_order_relaxed);
    const BatchView batch = MakeBatchView(
        test.samples.data() + start * test.sample_bytes, test.labels.data() + start,
        static_cast<int>(std::min<int64_t>(batch_size, test.count - start)), test.sample_type);
    absl::StatusOr<EvalResult> result = model.Evaluate(batch);
    if (!result.ok()) return result.status();
    total.loss_sum += result->loss_sum;
    total.correct += result->correct;
    total.count += result->count;
  }
  if (total.count == 0) return EvalSummary{};
  return EvalSummary{double(total.correct) / total.count, total.loss_sum / total.count};
}

int Train(int region_fd, int events_fd, const std::string& job_path,
          const std::string& checkpoint_path, const std::string& resume_path, int train_classes) {
  EventWriter events(events_fd);
  v1::JobSpec spec;
  {
    std::ifstream in(job_path, std::ios::binary);
    if (!in || !spec.ParseFromIstream(&in)) {
      std::cerr << "stoker-trainer: cannot read job spec " << job_path << "\n";
      return kExitUsage;
    }
  }
  absl::StatusOr<std::unique_ptr<JobRegion>> attached = JobRegion::Attach(region_fd);
  if (!attached.ok()) {
    std::cerr << "stoker-trainer: " << attached.status().message() << "\n";
    return kExitUsage;
  }
  JobRegion& region = **attached;
  region.SetConsumerPid(getpid());
  // Reading the test set, starting the device, building the model and loading a checkpoint are
  // work too: the agent's watchdog sees a heartbeat until the training loop beats on its own.
  std::optional<ScopedHeartbeat> starting(std::in_place, region.stats().heartbeats_total);
  const RingGeometry& geometry = region.geometry();

  // The test set is read once, up front; training batches come from the loaders.
  const v1::DatasetSpec& data = spec.dataset();
  absl::StatusOr<LabeledSamples> test =
      LoadDataset(TestDatasetFiles(spec, train_classes), data.test_limit());
  if (!test.ok()) {
    std::cerr << "stoker-trainer: test set: " << test.status().message() << "\n";
    return kExitBadInput;
  }
  if (test->sample_bytes != static_cast<int>(geometry.sample_bytes) ||
      test->sample_type != geometry.sample_type) {
    std::cerr << "stoker-trainer: " << data.test_images() << ": samples of " << test->features
              << " " << SampleTypeName(test->sample_type)
              << " values, but the training samples have "
              << geometry.sample_bytes / SampleTypeBytes(geometry.sample_type) << " "
              << SampleTypeName(geometry.sample_type) << " values\n";
    return kExitBadInput;
  }

#ifdef STOKER_HAVE_CUDA
  // Unpins the ring when Train returns: before `region` (declared above) unmaps it, and after
  // the model (declared below), which copies out of it, is gone.
  PinnedHostRegion pinned_ring;
#endif
  // resources.gpus > 0 trains on the cuda backend (device 0 of those the agent gave us).
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      absl::FailedPreconditionError("this trainer was built without the cuda backend");
  bool pinned = false;
  if (spec.resources().gpus() > 0) {
#ifdef STOKER_HAVE_CUDA
    backend = CreateCudaBackend(0);
    // Pin the ring so batches are copied by DMA straight out of their slots.
    pinned = backend.ok() && pinned_ring.Register(region.mapped_base(), region.mapped_bytes()).ok();
#endif
  } else {
    backend = CreateCpuBackend();
  }
  if (!backend.ok()) {
    std::cerr << "stoker-trainer: backend: " << backend.status().message() << "\n";
    return kExitBadInput;
  }
  (void)pinned;
  const int classes = std::max({2, train_classes, test->classes});
  absl::StatusOr<BuiltModel> built = BuildModel(**backend, spec, test->sample_dims, classes);
  if (!built.ok()) {
    std::cerr << "stoker-trainer: model: " << built.status().message() << "\n";
    return kExitBadInput;
  }
  std::unique_ptr<Model>* model = &built->model;
  const int max_batch = spec.train().batch_size();
  events.Log(absl::StrCat("training on ", (*backend)->Name(), " in ",
                          PrecisionName(built->precision), ": ", built->description));

  const int epochs = spec.train().epochs();
  const uint64_t total_batches = geometry.total_batches;
  const uint64_t batches_per_epoch = total_batches / epochs;
  JobStats& stats = region.stats();

  uint64_t first_batch = 0;
  double last_accuracy = -1, last_test_loss = -1;
  if (!resume_path.empty()) {
    absl::StatusOr<ResumePoint> resumed = LoadCheckpoint(resume_path, **model);
    if (!resumed.ok()) {
      std::cerr << "stoker-trainer: resume: " << resumed.status().message() << "\n";
      return kExitBadInput;
    }
    first_batch = resumed->step;
    last_accuracy = resumed->test_accuracy;
    events.Log(absl::StrCat("resumed from the checkpoint at step ", first_batch, " (epoch ",
                            first_batch / batches_per_epoch + 1, ")"));
  }
  uint64_t last_checkpoint_step = first_batch;  // the server holds this step (or nothing at 0)
  auto checkpoint = [&](uint64_t step, int epoch) -> bool {
    last_checkpoint_step = step;
    if (checkpoint_path.empty()) return true;
    absl::Status s;
    {
      const ScopedHeartbeat writing(stats.heartbeats_total);
      s = SaveCheckpoint(checkpoint_path, *built, step, epoch, last_accuracy, spec);
    }
    if (!s.ok()) {
      std::cerr << "stoker-trainer: checkpoint: " << s.message() << "\n";
      return false;
    }
    v1::JobEvent event;
    event.set_type(v1::EVENT_TYPE_CHECKPOINT);
    event.mutable_progress()->set_step(static_cast<int64_t>(step));
    event.mutable_progress()->set_epoch(epoch);
    events.Write(event);
    return true;
  };
  const uint64_t every_steps = static_cast<uint64_t>(spec.checkpoint().every_steps());

  // Progress is reported once a second: loss and rate over the steps since the last report.
  absl::Time window_start = absl::Now();
  double window_loss = 0;
  int64_t window_steps = 0, window_samples = 0;
  uint64_t window_stall_ns = 0;
  const absl::Time run_start = absl::Now();

  auto progress_now = [&](uint64_t step, int epoch) {
    v1::TrainingProgress p;
    p.set_epoch(epoch);
    p.set_epochs(epochs);
    p.set_step(static_cast<int64_t>(step));
    p.set_total_steps(static_cast<int64_t>(total_batches));
    p.set_test_accuracy(last_accuracy);
    p.set_test_loss(last_test_loss);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - run_start);
    if (step > first_batch) {
      p.set_eta_seconds(elapsed / (step - first_batch) * (total_batches - step));
    }
    return p;
  };

  // The worker is shutting down: keep what was trained (a checkpoint at `step`, the batches
  // before it done), then stop; the job resumes from there on another worker.
  auto checkpoint_and_stop = [&](uint64_t step) -> int {
    if (step > last_checkpoint_step) {
      const int epoch = static_cast<int>((step - 1) / batches_per_epoch + 1);  // step's batch
      if (!checkpoint(step, epoch)) return kExitFailure;
    }
    events.Log(absl::StrCat("stopped at step ", step, " for the worker's shutdown"));
    return kExitStopped;
  };

  starting.reset();
  for (uint64_t b = first_batch; b < total_batches; ++b) {
    const int epoch = static_cast<int>(b / batches_per_epoch) + 1;
    const absl::Time wait_start = absl::Now();
    // Waits for a loader, looking for a shutdown each second. No heartbeat while it waits: a
    // batch that no loader makes leaves the whole pipeline silent, and the agent's watchdog stops
    // the attempt in tens of seconds, naming the batch and the loader that owes it.
    absl::StatusOr<ReadableBatch> batch = absl::DeadlineExceededError("");
    while (true) {
      batch = region.WaitReadable(b, absl::Seconds(1));
      if (batch.ok() || !absl::IsDeadlineExceeded(batch.status())) break;
      if (region.CheckpointAndStopRequested()) return checkpoint_and_stop(b);
    }
    const absl::Time got_batch = absl::Now();
    if (!batch.ok()) {
      if (absl::IsCancelled(batch.status())) return kExitStopped;
      std::cerr << "stoker-trainer: waiting for batch " << b << " (loader " << region.LoaderFor(b)
                << "): " << batch.status().message() << "\n";
      return kExitFailure;
    }
    const BatchView view = MakeBatchView(batch->samples, batch->labels,
                                         static_cast<int>(batch->count), geometry.sample_type);
    absl::StatusOr<StepResult> step =
        (*model)->TrainStep(view, LearningRateAt(spec.train().optimizer(), b, total_batches));
    region.Release(b);
    stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
    const absl::Time step_done = absl::Now();
    if (!step.ok()) {
      std::cerr << "stoker-trainer: batch " << b << ": " << step.status().message() << "\n";
      return kExitBadInput;
    }
    if (!std::isfinite(step->loss)) {
      std::cerr << "stoker-trainer: the loss diverged (" << step->loss << ") at step " << b + 1
                << "; lower train.optimizer.lr\n";
      return kExitBadInput;
    }
    const uint64_t stall_ns = absl::ToInt64Nanoseconds(got_batch - wait_start);
    stats.data_stall_ns_total.fetch_add(stall_ns);
    stats.device_busy_ns_total.fetch_add(absl::ToInt64Nanoseconds(step_done - got_batch));
    stats.samples_total.fetch_add(batch->count);
    stats.steps_total.fetch_add(1);
    stats.skipped_steps_total.fetch_add(step->skipped ? 1 : 0);
    stats.epoch.store(epoch);
    StoreDouble(stats.loss_bits, step->loss);
    StoreDouble(stats.loss_scale_bits, step->loss_scale);
    window_loss += step->loss;
    window_steps += 1;
    window_samples += batch->count;
    window_stall_ns += stall_ns;

    const bool epoch_end = (b + 1) % batches_per_epoch == 0;
    if (!epoch_end && every_steps > 0 && (b + 1) % every_steps == 0 && !checkpoint(b + 1, epoch)) {
      return kExitFailure;
    }
    const double window_seconds = absl::ToDoubleSeconds(step_done - window_start);
    if (epoch_end || window_seconds >= 1.0) {
      v1::TrainingProgress p = progress_now(b + 1, epoch);
      p.set_loss(window_loss / window_steps);
      p.set_samples_per_second(window_samples / std::max(window_seconds, 1e-9));
      p.set_data_stall_ratio(std::min(1.0, window_stall_ns / 1e9 / std::max(window_seconds, 1e-9)));
      if (epoch_end) {
        absl::StatusOr<EvalSummary> eval =
            EvaluateTestSet(**model, *test, max_batch, stats.heartbeats_total);
        if (!eval.ok()) {
          std::cerr << "stoker-trainer: evaluation: " << eval.status().message() << "\n";
          return kExitBadInput;
        }
        last_accuracy = eval->accuracy;
        last_test_loss = eval->loss;
        StoreDouble(stats.eval_accuracy_bits, eval->accuracy);
        p.set_test_accuracy(last_accuracy);
        p.set_test_loss(last_test_loss);
      }
      v1::JobEvent event;
      event.set_type(epoch_end ? v1::EVENT_TYPE_EPOCH : v1::EVENT_TYPE_PROGRESS);
      *event.mutable_progress() = p;
      events.Write(event);
      if (epoch_end && !checkpoint(b + 1, epoch)) return kExitFailure;
      window_start = absl::Now();
      window_loss = 0;
      window_steps = window_samples = 0;
      window_stall_ns = 0;
    }
    if (b + 1 < total_batches && region.CheckpointAndStopRequested()) {
      return checkpoint_and_stop(b + 1);
    }
  }
  return kExitSuccess;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  CLI::App app{"stoker-trainer: trains one job attempt; started by stoker-worker"};
  int region_fd = -1, events_fd = -1;
  std::string job_path, checkpoint_path, resume_path;
  pid_t parent_pid = 0;
  int classes = 0;
  app.add_option("--classes", classes, "classes in the training labels (max label + 1)");
  app.add_option("--checkpoint", checkpoint_path,
                 "write checkpoints here (safetensors, replaced atomically)");
  app.add_option("--resume", resume_path, "resume from this checkpoint");
  app.add_option("--parent-pid", parent_pid, "the agent's pid; exit if it is gone");
  app.add_option("--region-fd", region_fd, "inherited memfd of the job's region")->required();
  app.add_option("--events-fd", events_fd, "inherited pipe for events to the agent")->required();
  app.add_option("--job", job_path, "binary stoker.v1.JobSpec with absolute dataset paths")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return stoker::kExitUsage;
  }
  // A write to a closed event pipe must not kill the trainer mid-step.
  signal(SIGPIPE, SIG_IGN);
  // The agent supervises us; if it dies, so do we (the loaders notice our death in turn).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent_pid > 0 && getppid() != parent_pid) return stoker::kExitStopped;
  return stoker::Train(region_fd, events_fd, job_path, checkpoint_path, resume_path, classes);
}
