#include "worker/training_loop.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "data/heartbeat.h"
#include "data/loader.h"  // SliceOfRank

namespace stoker {
namespace {

struct EvalSummary {
  double accuracy = 0;
  double loss = 0;
};

// Evaluates test samples [first, end). Raises `heartbeats` after each batch: a long evaluation
// is work, not a hang.
absl::StatusOr<EvalResult> EvaluateTestSamples(Model& model, const SamplesView& test, int64_t first,
                                               int64_t end, int batch_size,
                                               std::atomic<uint64_t>& heartbeats) {
  EvalResult total;
  for (int64_t start = first; start < end; start += batch_size) {
    heartbeats.fetch_add(1, std::memory_order_relaxed);
    const BatchView batch = MakeBatchView(
        test.samples + start * test.sample_bytes, test.labels + start,
        static_cast<int>(std::min<int64_t>(batch_size, end - start)), test.sample_type);
    STOKER_ASSIGN_OR_RETURN(const EvalResult result, model.Evaluate(batch));
    total.loss_sum += result.loss_sum;
    total.correct += result.correct;
    total.count += result.count;
  }
  return total;
}

EvalSummary Summarize(const EvalResult& total) {
  if (total.count == 0) return EvalSummary{};
  return EvalSummary{double(total.correct) / total.count, total.loss_sum / total.count};
}

// A step's error from the model. Alone, the model refused the batch: bad input. Data-parallel, a
// failed gradient sum (a rank gone, a timeout) comes back the same way, and a retry may help.
absl::Status StepError(uint64_t batch, const absl::Status& status, bool data_parallel) {
  const std::string message = absl::StrCat("batch ", batch, ": ", status.message());
  if (data_parallel && (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
                        absl::IsInternal(status) || absl::IsAborted(status) ||
                        absl::IsCancelled(status) || absl::IsUnknown(status))) {
    return absl::InternalError(message);
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

// Gives the model this rank's share of the step's actual global batch (the epoch's last one may
// be short) and passes its gradients on to the bucketed reducer.
class TrainingLoop::ShareReducer : public GradientReducer {
 public:
  explicit ShareReducer(BucketedReducer& inner) : inner_(inner) {}
  void SetStep(int64_t local_samples, int64_t global_samples) {
    inner_.SetLocalSamples(local_samples);
    share_ = global_samples > 0 ? static_cast<float>(double(local_samples) / global_samples) : 0;
  }
  float LocalShare() const override { return share_; }
  void GradientReady(int index, float* gradient, int64_t count) override {
    inner_.GradientReady(index, gradient, count);
  }
  absl::Status Finish() override { return inner_.Finish(); }

 private:
  BucketedReducer& inner_;
  float share_ = 0;
};

std::pair<int64_t, int64_t> EvaluationShare(int64_t count, int rank, int replicas) {
  if (replicas <= 1) return {0, count};
  return {count * rank / replicas, count * (rank + 1) / replicas};
}

double LearningRateAt(const v1::OptimizerSpec& optimizer, uint64_t step, uint64_t total_steps) {
  const double base = optimizer.lr();
  const uint64_t warmup = static_cast<uint64_t>(optimizer.warmup_steps());
  if (step < warmup) return base * double(step + 1) / double(warmup);
  if (optimizer.lr_schedule() != "cosine" || total_steps <= warmup) return base;
  const double progress = double(step - warmup) / double(total_steps - warmup);
  return base * 0.5 * (1.0 + std::cos(M_PI * progress));
}

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

TrainingLoop::TrainingLoop(JobRegion& region, Model& model, SamplesView test,
                           TrainingLoopOptions options, EventSink events,
                           CheckpointWriter checkpoint)
    : region_(region),
      model_(model),
      test_(std::move(test)),
      options_(std::move(options)),
      events_(std::move(events)),
      checkpoint_(std::move(checkpoint)),
      total_batches_(region.geometry().total_batches),
      batches_per_epoch_(total_batches_ / std::max(options_.epochs, 1)),
      run_start_(absl::Now()),
      last_accuracy_(options_.test_accuracy),
      last_checkpoint_step_(options_.first_batch),
      window_start_(run_start_),
      next_vote_step_(options_.first_batch + 1),
      last_vote_step_(options_.first_batch),
      last_vote_time_(run_start_) {}

TrainingLoop::~TrainingLoop() = default;

absl::Status TrainingLoop::Run() {
  if (!options_.data_parallel) return RunSteps();
  share_reducer_ = std::make_unique<ShareReducer>(*options_.data_parallel->reducer);
  if (absl::Status s = model_.SetGradientReducer(share_reducer_.get()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("this model cannot train data-parallel: ", s.message()));
  }
  const absl::Status status = RunSteps();
  (void)model_.SetGradientReducer(nullptr);
  return status;
}

absl::Status TrainingLoop::RunSteps() {
  if (total_batches_ > 0 && options_.first_batch >= total_batches_) {
    // Resumed from the final weights (their attempt ended before its success was recorded): no
    // step is left. The last epoch's end, evaluation, report and checkpoint, is done again, as
    // that attempt did it: the same weights give the same test results.
    return EndOfEpoch(total_batches_, EpochOf(total_batches_ - 1), absl::Now());
  }
  for (uint64_t b = options_.first_batch; b < total_batches_; ++b) {
    const absl::Time wait_start = absl::Now();
    STOKER_ASSIGN_OR_RETURN(const ReadableBatch batch, WaitForBatch(b));
    STOKER_RETURN_IF_ERROR(Step(b, batch, wait_start, absl::Now()));
    if (b + 1 >= total_batches_) continue;
    if (options_.data_parallel) {
      // Every rank must stop at the same step, whichever rank's worker asked.
      if (b + 1 < next_vote_step_) continue;
      STOKER_ASSIGN_OR_RETURN(const bool stop, AnyRankAsksToStop(b + 1));
      if (stop) return CheckpointAndStop(b + 1);
    } else if (region_.CheckpointAndStopRequested()) {
      return CheckpointAndStop(b + 1);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadableBatch> TrainingLoop::WaitForBatch(uint64_t batch) {
  // Waits for a loader, looking for a shutdown each second. No heartbeat while it waits: a batch
  // that no loader makes leaves the whole pipeline silent, and the agent's watchdog stops the
  // attempt in tens of seconds, naming the batch and the loader that owes it.
  while (true) {
    absl::StatusOr<ReadableBatch> readable = region_.WaitReadable(batch, absl::Seconds(1));
    if (readable.ok() || absl::IsCancelled(readable.status())) return readable;
    if (!absl::IsDeadlineExceeded(readable.status())) {
      return absl::InternalError(absl::StrCat("waiting for batch ", batch, " (loader ",
                                              region_.LoaderFor(batch),
                                              "): ", readable.status().message()));
    }
    // A data-parallel rank stops only where the ranks vote (Run): the others would wait for it
    // in the next step's gradient sum.
    if (!options_.data_parallel && region_.CheckpointAndStopRequested()) {
      return CheckpointAndStop(batch);
    }
  }
}

absl::Status TrainingLoop::Step(uint64_t batch, const ReadableBatch& readable,
                                absl::Time wait_start, absl::Time got_batch) {
  const int epoch = EpochOf(batch);
  JobStats& stats = region_.stats();
  const double learning_rate = LearningRateAt(options_.optimizer, batch, total_batches_);
  // A batch smaller than the network takes (one sample into a BatchNorm, which TrainStep refuses
  // as PyTorch does) is dropped, as DataLoader's drop_last would, instead of failing the job: the
  // epoch's short last batch (training set size mod batch_size = 1), or a rank's slice of 1.
  uint32_t count = readable.count;
  if (count > 0 && count < static_cast<uint32_t>(model_.MinTrainBatch())) {
    if (!dropped_small_batch_) {
      Log(absl::StrCat("step ", batch + 1, ": a training batch of ", count,
                       count == 1 ? " sample is" : " samples are",
                       " dropped (the network's BatchNorm needs at least ", model_.MinTrainBatch(),
                       "; logged once)"));
      dropped_small_batch_ = true;
    }
    count = 0;
  }
  if (options_.data_parallel) {
    const DataParallelContext& dp = *options_.data_parallel;
    const int replicas = dp.collective->size();
    const uint32_t batch_size = region_.geometry().batch_size;
    int64_t global_samples = int64_t{batch_size} * replicas;
    if (dp.train_samples > 0) {
      const RankSlice slice = SliceOfRank(
          dp.train_samples, batch_size, static_cast<uint32_t>(dp.collective->rank()),
          static_cast<uint32_t>(replicas), static_cast<int64_t>(batch % batches_per_epoch_));
      global_samples = slice.global_end - slice.global_first;
    }
    share_reducer_->SetStep(static_cast<int64_t>(count), global_samples);
  }
  if (count == 0 && options_.data_parallel) {
    // This rank's slice of the global batch is empty (the epoch's short last batch, or every
    // image of it was bad): it still joins the step's gradient sum and takes the same update.
    absl::StatusOr<StepResult> step = model_.TrainStepWithoutSamples(learning_rate);
    region_.Release(batch);
    stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
    const absl::Time step_done = absl::Now();
    if (!step.ok()) return StepError(batch, step.status(), true);
    PublishReducerCounters();
    stats.data_stall_ns_total.fetch_add(absl::ToInt64Nanoseconds(got_batch - wait_start));
    stats.device_busy_ns_total.fetch_add(absl::ToInt64Nanoseconds(step_done - got_batch));
    stats.steps_total.fetch_add(1);
    stats.epoch.store(epoch);
    return AfterStep(batch + 1, epoch, step_done);
  }
  if (count == 0) {
    // Every image of the batch was bad (the loaders skipped and counted them), or it was dropped
    // above: nothing to train on, but the batch still ends an epoch or falls on a checkpoint.
    region_.Release(batch);
    stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
    return AfterStep(batch + 1, epoch, absl::Now());
  }
  const BatchView view =
      MakeBatchView(readable.samples, readable.labels, static_cast<int>(readable.count),
                    region_.geometry().sample_type);
  absl::StatusOr<StepResult> step = model_.TrainStep(view, learning_rate);
  region_.Release(batch);
  stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
  const absl::Time step_done = absl::Now();
  if (!step.ok()) return StepError(batch, step.status(), options_.data_parallel.has_value());
  if (options_.data_parallel) PublishReducerCounters();
  if (!std::isfinite(step->loss)) {
    std::ostringstream message;  // prints the loss as the trainer always has ("nan", "-nan", "inf")
    message << "the loss diverged (" << step->loss << ") at step " << batch + 1
            << "; lower train.optimizer.lr";
    return absl::InvalidArgumentError(message.str());
  }
  const uint64_t stall_ns = absl::ToInt64Nanoseconds(got_batch - wait_start);
  stats.data_stall_ns_total.fetch_add(stall_ns);
  stats.device_busy_ns_total.fetch_add(absl::ToInt64Nanoseconds(step_done - got_batch));
  stats.samples_total.fetch_add(readable.count);
  stats.steps_total.fetch_add(1);
  stats.skipped_steps_total.fetch_add(step->skipped ? 1 : 0);
  stats.epoch.store(epoch);
  StoreDouble(stats.loss_bits, step->loss);
  StoreDouble(stats.loss_scale_bits, step->loss_scale);
  window_loss_ += step->loss;
  window_steps_ += 1;
  window_samples_ += readable.count;
  window_stall_ns_ += stall_ns;
  return AfterStep(batch + 1, epoch, step_done);
}

absl::Status TrainingLoop::AfterStep(uint64_t done, int epoch, absl::Time step_done) {
  if (done % batches_per_epoch_ == 0) return EndOfEpoch(done, epoch, step_done);
  const uint64_t every = options_.checkpoint_every_steps;
  if (every > 0 && done % every == 0) STOKER_RETURN_IF_ERROR(Checkpoint(done, epoch));
  if (step_done - window_start_ >= options_.report_interval) Report(done, epoch, step_done);
  return absl::OkStatus();
}

absl::Status TrainingLoop::EndOfEpoch(uint64_t step, int epoch, absl::Time now) {
  v1::TrainingProgress progress = WindowProgress(step, epoch, now);
  // A data-parallel rank evaluates its share of the test set; the sums make the global result.
  const auto [first, end] =
      options_.data_parallel
          ? EvaluationShare(test_.count, options_.data_parallel->collective->rank(),
                            options_.data_parallel->collective->size())
          : std::pair<int64_t, int64_t>(0, test_.count);
  absl::StatusOr<EvalResult> local = EvaluateTestSamples(
      model_, test_, first, end, options_.eval_batch_size, region_.stats().heartbeats_total);
  if (!local.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation: ", local.status().message()));
  }
  if (options_.data_parallel) {
    double sums[3] = {local->loss_sum, double(local->correct), double(local->count)};
    const ScopedHeartbeat waiting(region_.stats().heartbeats_total);
    if (absl::Status s = options_.data_parallel->collective->AllReduceSum(sums, 3); !s.ok()) {
      return absl::InternalError(absl::StrCat("all-reduce: evaluation: ", s.message()));
    }
    local->loss_sum = sums[0];
    local->correct = static_cast<int64_t>(std::llround(sums[1]));
    local->count = static_cast<int64_t>(std::llround(sums[2]));
  }
  const EvalSummary eval = Summarize(*local);
  last_accuracy_ = eval.accuracy;
  last_test_loss_ = eval.loss;
  StoreDouble(region_.stats().eval_accuracy_bits, eval.accuracy);
  progress.set_test_accuracy(last_accuracy_);
  progress.set_test_loss(last_test_loss_);
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_EPOCH);
  *event.mutable_progress() = std::move(progress);
  events_(event);
  STOKER_RETURN_IF_ERROR(Checkpoint(step, epoch));
  StartWindow();
  return absl::OkStatus();
}

void TrainingLoop::Report(uint64_t step, int epoch, absl::Time now) {
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_PROGRESS);
  *event.mutable_progress() = WindowProgress(step, epoch, now);
  events_(event);
  StartWindow();
}

absl::Status TrainingLoop::Checkpoint(uint64_t step, int epoch) {
  last_checkpoint_step_ = step;
  STOKER_RETURN_IF_ERROR(WriteCheckpoint(step, epoch));
  if (options_.data_parallel) {
    // The other ranks wait here, beating, while rank 0 writes (not silently inside the next
    // step's gradient sum, where the agent's stall watchdog would take them for hung).
    const ScopedHeartbeat waiting(region_.stats().heartbeats_total);
    if (absl::Status s = options_.data_parallel->collective->Barrier(); !s.ok()) {
      return absl::InternalError(absl::StrCat("all-reduce: checkpoint barrier: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status TrainingLoop::WriteCheckpoint(uint64_t step, int epoch) {
  if (!checkpoint_) return absl::OkStatus();
  absl::Status written;
  {
    const ScopedHeartbeat writing(region_.stats().heartbeats_total);
    written = checkpoint_(step, epoch, last_accuracy_);
  }
  if (!written.ok()) return absl::InternalError(absl::StrCat("checkpoint: ", written.message()));
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_CHECKPOINT);
  event.mutable_progress()->set_step(static_cast<int64_t>(step));
  event.mutable_progress()->set_epoch(epoch);
  events_(event);
  return absl::OkStatus();
}

absl::Status TrainingLoop::CheckpointAndStop(uint64_t step) {
  // The worker is shutting down: keep what was trained (a checkpoint at `step`, the batches
  // before it done), then stop; the job resumes from there on another worker.
  if (step > last_checkpoint_step_) {
    STOKER_RETURN_IF_ERROR(Checkpoint(step, EpochOf(step - 1)));  // the epoch of step's batch
  }
  const bool preempted = region_.CheckpointAndStopReason() == JobRegion::StopReason::kPreempted;
  const std::string message =
      !options_.data_parallel || region_.CheckpointAndStopRequested()
          ? absl::StrCat(
                "stopped at step ", step,
                preempted ? " to give the devices back (preempted)" : " for the worker's shutdown")
          : absl::StrCat("stopped at step ", step,
                         " with the other ranks: a worker of the job is shutting down");
  Log(message);
  return absl::CancelledError(message);
}

absl::StatusOr<bool> TrainingLoop::AnyRankAsksToStop(uint64_t done) {
  const DataParallelContext& dp = *options_.data_parallel;
  const absl::Time now = absl::Now();
  // The stop flag and this rank's seconds per step since the last vote.
  float vote[2] = {region_.CheckpointAndStopRequested() ? 1.0f : 0.0f,
                   static_cast<float>(absl::ToDoubleSeconds(now - last_vote_time_) /
                                      double(std::max<uint64_t>(1, done - last_vote_step_)))};
  if (absl::Status s = dp.collective->AllReduceSum(vote, 2); !s.ok()) {
    return absl::InternalError(absl::StrCat("all-reduce: stop vote: ", s.message()));
  }
  last_vote_step_ = done;
  last_vote_time_ = now;
  // Every rank has the same sums, so every rank picks the same next step.
  uint64_t interval = dp.stop_vote_every_steps;
  if (interval == 0) {
    const double step_seconds = double(vote[1]) / std::max(1, dp.collective->size());
    const double steps =
        step_seconds > 0 ? absl::ToDoubleSeconds(dp.stop_vote_interval) / step_seconds : 1.0;
    // At most twice the last interval: steps measured while the ring was full of prefetched
    // batches are faster than the ones after them.
    interval = static_cast<uint64_t>(std::clamp(steps, 1.0, 2.0 * double(vote_interval_)));
    vote_interval_ = interval;
  }
  next_vote_step_ = done + interval;
  return vote[0] > 0;
}

void TrainingLoop::PublishReducerCounters() {
  const ReducerCounters counters = options_.data_parallel->reducer->counters();
  JobStats& stats = region_.stats();
  stats.allreduce_ns_total.store(static_cast<uint64_t>(counters.allreduce_seconds * 1e9));
  stats.allreduce_exposed_ns_total.store(static_cast<uint64_t>(counters.exposed_seconds * 1e9));
  stats.allreduce_bytes_total.store(counters.allreduce_bytes);
  stats.allreduce_calls_total.store(counters.allreduce_calls);
}

v1::TrainingProgress TrainingLoop::WindowProgress(uint64_t step, int epoch, absl::Time now) const {
  v1::TrainingProgress p;
  p.set_epoch(epoch);
  p.set_epochs(options_.epochs);
  p.set_step(static_cast<int64_t>(step));
  p.set_total_steps(static_cast<int64_t>(total_batches_));
  p.set_test_accuracy(last_accuracy_);
  p.set_test_loss(last_test_loss_);
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - run_start_);
  if (step > options_.first_batch) {
    p.set_eta_seconds(elapsed / (step - options_.first_batch) * (total_batches_ - step));
  }
  const double window_seconds = std::max(absl::ToDoubleSeconds(now - window_start_), 1e-9);
  // (A window of only empty steps, a data-parallel rank's empty slice or a batch of bad images,
  // has no loss to report.)
  if (window_steps_ > 0) p.set_loss(window_loss_ / window_steps_);
  p.set_samples_per_second(window_samples_ / window_seconds);
  p.set_data_stall_ratio(std::min(1.0, window_stall_ns_ / 1e9 / window_seconds));
  return p;
}

void TrainingLoop::StartWindow() {
  window_start_ = absl::Now();
  window_loss_ = 0;
  window_steps_ = window_samples_ = 0;
  window_stall_ns_ = 0;
}

void TrainingLoop::Log(const std::string& message) {
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_LOG);
  event.set_message(message);
  events_(event);
}

}  // namespace stoker
