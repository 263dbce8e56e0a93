// One shared-memory region per job: a header, a control block, a stats block and a ring of batch
// slots. It is a memfd (no /dev/shm name to leak, no /dev/shm size limit in containers); processes
// share it by inheriting the file descriptor.
//
// Ordering contract: batch `b` (numbered over the whole job, across epochs) always goes to slot
// `b % slot_count`. A producer waits until that slot is free for `b`, fills it, publishes it; the
// consumer waits until slot holds `b`, reads it, releases it (which frees it for `b + slot_count`).
// Waits use futexes (no busy spin) and wake every 100 ms to check the stop flag and that the peer
// is alive, so no wait can hang on a dead process.
#ifndef STOKER_DATA_JOB_REGION_H_
#define STOKER_DATA_JOB_REGION_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/sample_type.h"

namespace stoker {

// Shape of the ring and of the job's batch stream.
struct RingGeometry {
  uint32_t slot_count = 8;
  uint32_t batch_size = 128;    // samples per full batch
  uint32_t sample_bytes = 784;  // bytes per sample: features * SampleTypeBytes(sample_type)
  // Most loader processes the job may use. Which loader makes batch b is set by the loader eras
  // (see ChangeLoaderCount): in an era with K loaders, loader b % K. The first era starts at
  // batch 0 with `initial_loaders` (0 = loader_count).
  uint32_t loader_count = 1;
  uint64_t total_batches = 0;                   // batches in the whole job (all epochs)
  SampleType sample_type = SampleType::kUint8;  // element type of the samples in a slot
  uint32_t initial_loaders = 0;
  // The shape of one sample as the agent resolved it ({C, H, W} for images, {H, W} or {features}
  // otherwise; at most 4 dimensions, their product times the type's size = sample_bytes). The
  // trainer and the loaders take it from here instead of working it out again. Empty: not given
  // (tests of the ring alone).
  std::vector<uint32_t> sample_dims;

  // An image job's sample shape {C, H, W} from sample_dims, or FAILED_PRECONDITION saying that the
  // agent and `reader` ("loader", "trainer") come from different builds.
  absl::StatusOr<std::vector<int>> ImageDims(const char* reader) const;
};

// The distinct training samples the loaders found bad, as an open-addressing set of sample index
// + 1 (0: empty) in shared memory. A corrupt image is skipped again every epoch, by whichever
// loader meets it, but it is one bad sample: the job's limit (dataset.max_bad_samples) counts
// samples, not skips. Exact for up to kSlots / 2 samples; past that every skip counts as a new
// sample (a job with that many bad images fails sooner, never later).
struct BadSampleSet {
  static constexpr size_t kSlots = 8192;
  // Samples inserted (plus the skips counted after the set filled up).
  std::atomic<uint64_t> distinct{0};
  std::atomic<uint64_t> slots[kSlots] = {};

  // True when `sample` was not in the set yet (or the set is full): a new bad sample, counted in
  // `distinct`. False when some loader had already found it bad.
  bool Insert(uint64_t sample);
};

// Counters the trainer and loaders publish and the agent exports. Lives in shared memory, so every
// field is a lock-free atomic; doubles are stored as their bit pattern (use the helpers below).
struct JobStats {
  std::atomic<uint64_t> samples_total{0};
  std::atomic<uint64_t> steps_total{0};
  std::atomic<uint64_t> skipped_steps_total{0};
  std::atomic<uint64_t> data_stall_ns_total{0};   // consumer waited for a batch
  std::atomic<uint64_t> device_busy_ns_total{0};  // consumer computed
  std::atomic<uint64_t> loader_batches_total{0};
  std::atomic<uint64_t> loader_busy_ns_total{0};  // time loaders spent making batches
  std::atomic<uint64_t> loader_restarts_total{0};
  std::atomic<uint64_t> consumer_next_batch{0};  // first batch the consumer has not yet released
  std::atomic<uint64_t> epoch{0};
  std::atomic<uint64_t> loss_bits{0};
  std::atomic<uint64_t> loss_scale_bits{0};
  std::atomic<uint64_t> eval_accuracy_bits{0};
  // The pipeline's heartbeat: raised by whoever does work, never by a process that only waits.
  // The trainer raises it for each step and at least once a second while it starts, evaluates or
  // writes a checkpoint; a loader for each batch it makes and at least once a second while it
  // maps its data or sleeps its loader.delay_ms. When it stops moving, nothing in the job is
  // doing anything: the agent's watchdog ends the attempt (RunnerOptions::trainer_stall_timeout).
  std::atomic<uint64_t> heartbeats_total{0};
  // Samples the loaders skipped because they could not be decoded (image datasets), every skip;
  // the job fails once bad_samples (distinct ones) pass dataset.max_bad_samples.
  std::atomic<uint64_t> bad_samples_total{0};
  BadSampleSet bad_samples;
  // Data-parallel jobs: this rank's gradient all-reduce time (all of it, and the part backward
  // did not hide), bytes and calls, and evaluation/setup collectives are not counted.
  std::atomic<uint64_t> allreduce_ns_total{0};
  std::atomic<uint64_t> allreduce_exposed_ns_total{0};
  std::atomic<uint64_t> allreduce_bytes_total{0};
  std::atomic<uint64_t> allreduce_calls_total{0};
};

void StoreDouble(std::atomic<uint64_t>& cell, double value);
double LoadDouble(const std::atomic<uint64_t>& cell);

// A filled slot, as the consumer sees it. Valid until Release(batch).
struct ReadableBatch {
  uint64_t batch = 0;
  const uint8_t* samples = nullptr;  // count * sample_bytes
  const uint8_t* labels = nullptr;   // count
  uint32_t count = 0;
};

// A free slot, as a producer sees it. Fill it, then Publish(batch, count).
struct WritableBatch {
  uint64_t batch = 0;
  uint8_t* samples = nullptr;  // room for batch_size * sample_bytes
  uint8_t* labels = nullptr;   // room for batch_size
};

// Clears FD_CLOEXEC on `fd`, so a child that exec()s inherits it. When it succeeds it only calls
// fcntl(), so a child may call it between fork() and exec().
absl::Status ClearCloexec(int fd);

class JobRegion {
 public:
  // Creates and initialises a region (memfd, sized and mapped). The fd is close-on-exec; the caller
  // clears that for the child it hands the fd to (or uses posix_spawn file actions).
  static absl::StatusOr<std::unique_ptr<JobRegion>> Create(const RingGeometry& geometry);
  // Maps an existing region and validates magic, version and size. The error says what mismatched
  // and what to do (e.g. rebuild: agent and trainer from different builds). Does not take
  // ownership of `fd`: the caller may close it after Attach (the mapping stays valid).
  static absl::StatusOr<std::unique_ptr<JobRegion>> Attach(int fd);

  ~JobRegion();  // unmaps; closes the fd if this object owns it
  JobRegion(const JobRegion&) = delete;
  JobRegion& operator=(const JobRegion&) = delete;

  int fd() const;
  // The whole mapping, e.g. to pin it for DMA (cudaHostRegister).
  void* mapped_base() const;
  size_t mapped_bytes() const;
  const RingGeometry& geometry() const;
  JobStats& stats();

  // Control block. Stop is sticky and wakes every waiter.
  void RequestStop();
  bool StopRequested() const;
  // Sticky too, but wakes nobody: the trainer polls it between steps (and while it waits for a
  // batch), writes a checkpoint at the step it reached, and exits. For a worker shutting down, or
  // an attempt the server preempted (the reason is only for the trainer's log line).
  enum class StopReason : uint32_t { kShutdown = 1, kPreempted = 2 };
  void RequestCheckpointAndStop(StopReason reason = StopReason::kShutdown);
  bool CheckpointAndStopRequested() const;
  // Why (kShutdown when not requested).
  StopReason CheckpointAndStopReason() const;
  void SetConsumerPid(pid_t pid);
  pid_t ConsumerPid() const;

  // Producer side. Waits until the slot is free for `batch`. Returns CANCELLED when stop was
  // requested, ABORTED when the consumer process died, DEADLINE_EXCEEDED after `timeout`,
  // FAILED_PRECONDITION when `batch` is already published (its slot has moved past it).
  // absl::InfiniteDuration() waits for ever (still waking every 100 ms for stop and the consumer).
  absl::StatusOr<WritableBatch> WaitWritable(uint64_t batch, absl::Duration timeout);
  // True if `batch` is already published (a restarted loader skips it).
  bool IsPublished(uint64_t batch) const;
  void Publish(uint64_t batch, uint32_t count);

  // Consumer side. Returns CANCELLED on stop, DEADLINE_EXCEEDED after `timeout`,
  // FAILED_PRECONDITION when `batch` was already released.
  absl::StatusOr<ReadableBatch> WaitReadable(uint64_t batch, absl::Duration timeout);
  // Frees the slot for `batch + slot_count` and raises stats().consumer_next_batch to `batch + 1`.
  void Release(uint64_t batch);

  // Call right after Create, before any other process attaches: makes `first_batch` the first
  // batch of the stream (a job resumed from a checkpoint), as if every earlier one had been
  // consumed. Loaders then start there on their own.
  void StartAt(uint64_t first_batch);

  // Loader eras. Batch contents never depend on which loader makes them, so the number of
  // loaders can change while the job runs without changing the batch stream.
  //
  // The era table says "from batch S on (until the next era's start), loader b % K makes batch
  // b". Protocol invariant: an era starting at S is in the table before the slot of batch S is
  // first freed for S (Release of S - slot_count). So once a process has seen the slot of batch b
  // free for b (or b published), the owner of every batch <= b is final in the table it reads
  // next; nothing can change it any more. Each batch then has exactly one maker, and a loader that
  // re-derives what it owns from its own position after every slot wait (RunLoader does) can
  // neither miss a batch it owns nor make one it does not. Eras that start later may still be
  // appended, so "nothing left for loader k" is not final: the agent starts loader k again when
  // LoaderNeeded(k) says it owes a batch and it is not running.
  //
  // The first batch >= `from` that loader `index` makes, or total_batches when none is left.
  uint64_t NextBatchFor(uint32_t index, uint64_t from) const;
  // The loader that makes `batch` according to the table now (final once its slot was freed for
  // it, see above).
  uint32_t LoaderFor(uint64_t batch) const;
  // Loaders in the latest era, and the batch it starts at.
  uint32_t ActiveLoaderCount() const;
  uint64_t ActiveEraStart() const;
  // Agent side: asks for `loader_count` loaders (1..geometry.loader_count, else
  // INVALID_ARGUMENT). The consumer applies it in its next Release(b) whose slot_count-th
  // successor is past the latest era's start: it appends the era "from b + slot_count on" just
  // before it frees that slot, which keeps the invariant above whatever the agent's timing. A
  // later request replaces one not yet applied. Nothing is appended once the table is full (64
  // eras). ActiveLoaderCount() shows when it took effect.
  absl::Status RequestLoaderCount(uint32_t loader_count);
  // The count last asked for with RequestLoaderCount (0 = none yet).
  uint32_t RequestedLoaderCount() const;
  // Consumer side (its thread only, or before it runs): from `start_batch` on, `loader_count`
  // loaders (1..geometry.loader_count) make the batches. FAILED_PRECONDITION unless start_batch >=
  // consumer_next_batch + slot_count (no slot can be free for a batch of the new era yet) and
  // after the latest era's start, or when the era table is full. Called from any other thread
  // while the consumer releases it would break the invariant: the agent uses RequestLoaderCount.
  absl::Status ChangeLoaderCount(uint64_t start_batch, uint32_t loader_count);
  // Whether loader `index` owes a batch: it makes (by the table now) a batch at or after the
  // consumer's position that is not published yet. The agent starts a loader that owes a batch
  // and is not running, whichever era the batch is in.
  bool LoaderNeeded(uint32_t index) const;

  // Slots currently holding a published, unreleased batch.
  uint32_t FilledSlots() const;

 private:
  JobRegion() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker

#endif  // STOKER_DATA_JOB_REGION_H_
