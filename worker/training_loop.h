// The trainer's loop: consumes the job's batches in order from the ring (JobRegion), takes an
// optimizer step with each, and at every epoch's end evaluates on the test set, reports the
// epoch and writes a checkpoint; in between it reports progress about once a second. A worker
// shutting down (JobRegion::RequestCheckpointAndStop) makes it checkpoint the step it reached and
// stop. stoker-trainer (trainer_main.cc) builds the model and runs this; everything the loop does
// goes through the region, the model, an event sink and a checkpoint writer, so a test runs it in
// one process.
//
// Data-parallel jobs (TrainingLoopOptions::data_parallel): every rank runs this loop over its own
// region, whose batch b is the rank's slice of global batch b, and every rank takes every step
// (one whose slice is empty brings zero gradients: Model::TrainStepWithoutSamples), so each step's
// gradient sum meets all ranks. Evaluation splits the test set into contiguous shares, one per
// rank, and sums (loss, correct, count) over the ranks: every rank reports the global accuracy.
// Only the rank given a checkpoint writer (rank 0) writes checkpoints. A checkpoint-and-stop
// request reaching any rank stops every rank at the same step: the ranks sum a stop flag after
// every stop_vote_every_steps-th step, and all stop when one asked.
#ifndef STOKER_WORKER_TRAINING_LOOP_H_
#define STOKER_WORKER_TRAINING_LOOP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "data/dataset.h"
#include "data/job_region.h"
#include "engine/model.h"
#include "stoker.pb.h"

namespace stoker {

// Learning rate for step `step` (0-based) of `total_steps`: linear warm-up over
// optimizer.warmup_steps, then constant or (lr_schedule "cosine") cosine decay to 0 at the end.
double LearningRateAt(const v1::OptimizerSpec& optimizer, uint64_t step, uint64_t total_steps);

// A batch of `count` samples at `samples` for the model: uint8 pixels, or float32 features.
BatchView MakeBatchView(const uint8_t* samples, const uint8_t* labels, int count,
                        SampleType sample_type);

// A data-parallel rank's means of meeting the other ranks. `reducer` sums each step's gradients
// over `collective`: while Run() runs, the model trains through the loop's own GradientReducer,
// which passes gradients to `reducer` and gives the model its share of each step's global batch
// (Model::SetGradientReducer; Run() sets it back to null when it returns). The loop itself uses
// `collective` only between steps (the stop vote, evaluation), when the reducer is idle.
struct DataParallelContext {
  BucketedReducer* reducer = nullptr;
  Collective* collective = nullptr;
  // The training set's samples: a rank's share of a step is its samples over the global batch's
  // (RankSlice: the epoch's last global batch may be short). 0: every global batch is full
  // (replicas x batch_size).
  int64_t train_samples = 0;
  // The ranks sum their stop flags (a checkpoint-and-stop request) at agreed steps and all stop at
  // the first vote after any rank's request. A vote is one all-reduce of two floats, 0.2 to
  // 1.9 ms on loopback with two ranks on a loaded 2-core machine (measured 2026-12-01): as much
  // as a small step, so the ranks vote after the first step, then about every stop_vote_interval
  // (the next vote's step is computed from the ranks' summed step times, the same on every rank;
  // the interval in steps at most doubles from one vote to the next). N > 0 in
  // stop_vote_every_steps votes every N steps instead (tests).
  absl::Duration stop_vote_interval = absl::Milliseconds(500);
  uint64_t stop_vote_every_steps = 0;
};

// The contiguous share [first, end) of `count` test samples that rank `rank` of `replicas`
// evaluates: [count*rank/replicas, count*(rank+1)/replicas).
std::pair<int64_t, int64_t> EvaluationShare(int64_t count, int rank, int replicas);

struct TrainingLoopOptions {
  v1::OptimizerSpec optimizer;  // the learning-rate schedule (lr, warmup_steps, lr_schedule)
  int epochs = 1;               // the ring's total_batches split evenly into this many epochs
  int eval_batch_size = 128;    // test-set batches (at most the model's max_batch)
  uint64_t checkpoint_every_steps = 0;  // also checkpoint after every N-th step (0 = epochs only)
  // Resuming: the first batch to train on (the region must start there, JobRegion::StartAt), and
  // the test accuracy the checkpoint held (-1 = none), reported until the next evaluation.
  uint64_t first_batch = 0;
  double test_accuracy = -1;
  // Progress is reported when at least this much time has passed since the last report.
  absl::Duration report_interval = absl::Seconds(1);
  // Set for a data-parallel rank; its pointers must outlive the loop.
  std::optional<DataParallelContext> data_parallel;
};

class TrainingLoop {
 public:
  // Receives every event: PROGRESS (loss, samples/s, data-stall ratio over the steps since the
  // last report), EPOCH (the same, with test accuracy and loss), CHECKPOINT (step, epoch), LOG.
  using EventSink = std::function<void(const v1::JobEvent&)>;
  // Writes a checkpoint of the model at `step` (batches done) in `epoch` (1-based) with the last
  // test accuracy (-1 = none yet). Null: checkpoints are only counted, never written or reported.
  using CheckpointWriter =
      std::function<absl::Status(uint64_t step, int epoch, double test_accuracy)>;

  // `region`, `model` and the samples `test` views (a LabeledSamples, or a mapped file) must
  // outlive the loop. The loop is the region's consumer: it
  // waits for and releases its batches and raises its counters (steps, samples, stall and busy
  // time, loss, epoch, accuracy, heartbeats).
  TrainingLoop(JobRegion& region, Model& model, SamplesView test, TrainingLoopOptions options,
               EventSink events, CheckpointWriter checkpoint);
  ~TrainingLoop();

  // Trains from options.first_batch to the ring's last batch. OK when every batch was trained on
  // (and the last epoch evaluated and checkpointed). CANCELLED when it stopped early: the region's
  // stop flag while it waited, or a checkpoint-and-stop request after a checkpoint at the step it
  // reached (logged as "stopped at step N for the worker's shutdown"). INVALID_ARGUMENT when the
  // job cannot train and a retry cannot help: the model refused a batch ("batch B: ..."), the
  // loss diverged ("the loss diverged (nan) at step N; lower train.optimizer.lr"), or the
  // evaluation failed ("evaluation: ..."). INTERNAL for what a retry may fix: a batch that cannot
  // be read ("waiting for batch B (loader K): ...") or a checkpoint that cannot be written
  // ("checkpoint: ...").
  // Data-parallel ranks: CANCELLED also when another rank's request stopped them all (logged as
  // "stopped at step N with the other ranks: a worker of the job is shutting down"), INTERNAL
  // ("all-reduce: ...", "batch B: ...") when a collective failed (a rank gone, a timeout): the
  // attempt is retried.
  absl::Status Run();

 private:
  absl::Status RunSteps();
  // The named steps of Run.
  absl::StatusOr<ReadableBatch> WaitForBatch(uint64_t batch);
  absl::Status Step(uint64_t batch, const ReadableBatch& readable, absl::Time wait_start,
                    absl::Time got_batch);
  // After batch done - 1 (trained, or empty because every image of it was bad): the end of an
  // epoch, a periodic checkpoint or a progress report, whichever falls due.
  absl::Status AfterStep(uint64_t done, int epoch, absl::Time step_done);
  absl::Status EndOfEpoch(uint64_t step, int epoch, absl::Time now);
  void Report(uint64_t step, int epoch, absl::Time now);
  // Data-parallel: every rank takes part (rank 0 writes, all meet at a barrier).
  absl::Status Checkpoint(uint64_t step, int epoch);
  absl::Status WriteCheckpoint(uint64_t step, int epoch);
  // Never OK: CANCELLED once stopped, or the checkpoint's error.
  absl::Status CheckpointAndStop(uint64_t step);
  // Data-parallel: whether any rank asked to checkpoint and stop (summed over the ranks), voted
  // after `done` steps; sets next_vote_step_.
  absl::StatusOr<bool> AnyRankAsksToStop(uint64_t done);
  // Data-parallel: copies the reducer's counters into JobStats' allreduce_*.
  void PublishReducerCounters();

  int EpochOf(uint64_t batch) const { return static_cast<int>(batch / batches_per_epoch_) + 1; }
  // The progress of the window that ends at `now`, after `step` batches.
  v1::TrainingProgress WindowProgress(uint64_t step, int epoch, absl::Time now) const;
  void StartWindow();
  void Log(const std::string& message);

  JobRegion& region_;
  Model& model_;
  const SamplesView test_;
  const TrainingLoopOptions options_;
  EventSink events_;
  CheckpointWriter checkpoint_;
  const uint64_t total_batches_;
  const uint64_t batches_per_epoch_;
  const absl::Time run_start_;

  double last_accuracy_;
  double last_test_loss_ = -1;
  uint64_t last_checkpoint_step_;  // the server holds this step (or nothing at 0)
  // Since the last report: loss, steps, samples and time spent waiting for data.
  absl::Time window_start_;
  double window_loss_ = 0;
  int64_t window_steps_ = 0, window_samples_ = 0;
  uint64_t window_stall_ns_ = 0;
  // Data-parallel: the reducer the model trains through (forwards to data_parallel->reducer).
  class ShareReducer;
  std::unique_ptr<ShareReducer> share_reducer_;
  bool dropped_small_batch_ = false;  // logged once per attempt
  // Data-parallel: the step after which the ranks vote next, and when the last vote was.
  uint64_t next_vote_step_;
  uint64_t last_vote_step_;
  uint64_t vote_interval_ = 1;
  absl::Time last_vote_time_;
};

}  // namespace stoker

#endif  // STOKER_WORKER_TRAINING_LOOP_H_
