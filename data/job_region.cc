#include "data/job_region.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "data/stream_copy.h"

namespace stoker {
namespace {

// "STOKERRG" read as a little-endian integer.
constexpr uint64_t kRegionMagic = 0x475252454b4f5453ull;
// Bump whenever RegionHeader, RegionControl, SlotHeader, JobStats or the layout rules change.
constexpr uint32_t kRegionVersion = 9;  // 2: sample_type; 3: loader eras; 4: slot waiters;
                                        // 5: checkpoint_and_stop; 6: requested_loaders and
                                        // heartbeats_total (the consumer appends eras);
                                        // 7: bad_samples_total; 8: bad_samples (the set);
                                        // 9: sample_rank and sample_dims
constexpr uint64_t kCacheLineBytes = 64;
// Longest single futex sleep: every wait re-checks stop and peer liveness at least this often.
constexpr auto kWaitTick = std::chrono::milliseconds(100);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word must be 32 bits");

// Everything below lives in the shared mapping, at fixed offsets that the header records.
struct RegionHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;  // sizeof(RegionHeader) of the creator
  uint64_t total_bytes;   // size of the whole region
  uint32_t slot_count;
  uint32_t batch_size;
  uint32_t sample_bytes;
  uint32_t loader_count;
  uint32_t sample_type;  // a SampleType value
  uint32_t reserved;     // zero; keeps the 64-bit fields aligned without padding
  uint32_t sample_rank;  // dimensions in sample_dims (0: not given)
  uint32_t sample_dims[4];
  uint32_t reserved2;  // zero
  uint64_t total_batches;
  uint64_t control_offset;
  uint64_t stats_offset;
  uint64_t stats_bytes;  // sizeof(JobStats) of the creator
  uint64_t slots_offset;
  uint64_t slot_stride;
  uint64_t slot_samples_offset;  // within a slot
  uint64_t slot_labels_offset;   // within a slot
};

// Attach compares headers with memcmp: there must be no padding bytes.
static_assert(std::has_unique_object_representations_v<RegionHeader>);

constexpr uint32_t kMaxLoaderEras = 64;

// From batch `start_batch` on (until the next era's start), batch b is made by loader b % count.
struct LoaderEra {
  std::atomic<uint64_t> start_batch;
  std::atomic<uint32_t> loader_count;
};

struct RegionControl {
  std::atomic<uint32_t> stop;
  std::atomic<int32_t> consumer_pid;  // 0 = not set
  // Entries below era_count are complete; an entry is written before era_count is raised. Only
  // the consumer appends entries (see JobRegion::RequestLoaderCount).
  std::atomic<uint32_t> era_count;
  LoaderEra eras[kMaxLoaderEras];
  // The agent is shutting down: the trainer checkpoints where it is, then stops.
  std::atomic<uint32_t> checkpoint_and_stop;
  // The loader count the agent asked for (0 = none); the consumer appends the era.
  std::atomic<uint32_t> requested_loaders;
};

// Per-slot words. `seq` encodes the slot's state for batch b (mod 2^32):
//   2*b     free, waiting for the producer of batch b
//   2*b + 1 holds batch b, waiting for the consumer
// Slot s starts at 2*s; Release(b) moves it to 2*(b + slot_count).
struct SlotHeader {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> count;
  // Processes asleep (or about to sleep) on seq. Publish and Release make the futex wake call
  // only when it is non-zero: most hand-offs find nobody asleep, and a wake is a system call.
  // A waiter killed in its sleep leaves it too high, which costs only needless wakes.
  std::atomic<uint32_t> waiters;
};

constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Offsets of every part of a region with the given geometry (the header's offset fields).
absl::StatusOr<RegionHeader> ComputeLayout(const RingGeometry& geometry) {
  if (geometry.slot_count == 0 || geometry.batch_size == 0 || geometry.sample_bytes == 0 ||
      geometry.loader_count == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad ring geometry: slot_count=%u batch_size=%u sample_bytes=%u loader_count=%u "
        "(all must be > 0)",
        geometry.slot_count, geometry.batch_size, geometry.sample_bytes, geometry.loader_count));
  }
  const uint32_t type = static_cast<uint32_t>(geometry.sample_type);
  if (!IsKnownSampleType(type)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad ring geometry: unknown sample type %u (0 = uint8, 1 = float32)", type));
  }
  if (geometry.sample_bytes % SampleTypeBytes(geometry.sample_type) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad ring geometry: %u-byte samples are not whole %s values",
                        geometry.sample_bytes, SampleTypeName(geometry.sample_type)));
  }
  if (geometry.sample_dims.size() > 4) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad ring geometry: a sample of %u dimensions (at most 4)", geometry.sample_dims.size()));
  }
  if (!geometry.sample_dims.empty()) {
    uint64_t values = 1;
    for (uint32_t d : geometry.sample_dims) values *= d;
    if (values * SampleTypeBytes(geometry.sample_type) != geometry.sample_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("bad ring geometry: sample dimensions %s do not make %u-byte samples",
                          absl::StrJoin(geometry.sample_dims, "x"), geometry.sample_bytes));
    }
  }
  RegionHeader h{};
  h.magic = kRegionMagic;
  h.version = kRegionVersion;
  h.header_bytes = sizeof(RegionHeader);
  h.slot_count = geometry.slot_count;
  h.batch_size = geometry.batch_size;
  h.sample_bytes = geometry.sample_bytes;
  h.loader_count = geometry.loader_count;
  h.sample_type = type;
  h.sample_rank = static_cast<uint32_t>(geometry.sample_dims.size());
  for (size_t d = 0; d < geometry.sample_dims.size(); ++d)
    h.sample_dims[d] = geometry.sample_dims[d];
  h.total_batches = geometry.total_batches;
  h.control_offset = AlignUp(sizeof(RegionHeader), kCacheLineBytes);
  h.stats_offset = AlignUp(h.control_offset + sizeof(RegionControl), kCacheLineBytes);
  h.stats_bytes = sizeof(JobStats);
  h.slots_offset = AlignUp(h.stats_offset + sizeof(JobStats), kCacheLineBytes);
  // All factors are 32-bit, so these 64-bit products cannot overflow.
  const uint64_t samples_bytes = uint64_t{geometry.batch_size} * geometry.sample_bytes;
  h.slot_samples_offset = AlignUp(sizeof(SlotHeader), kCacheLineBytes);
  h.slot_labels_offset = AlignUp(h.slot_samples_offset + samples_bytes, kCacheLineBytes);
  h.slot_stride = AlignUp(h.slot_labels_offset + geometry.batch_size, kCacheLineBytes);
  const unsigned __int128 total =
      static_cast<unsigned __int128>(h.slot_stride) * geometry.slot_count + h.slots_offset;
  constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 40;
  if (total > kMaxRegionBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad ring geometry: %u slots of %u x %u bytes exceed 1 TiB",
                        geometry.slot_count, geometry.batch_size, geometry.sample_bytes));
  }
  h.total_bytes = static_cast<uint64_t>(total);
  return h;
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void WakeAll(std::atomic<uint32_t>* word) { Futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

void WakeSlotSleepers(SlotHeader* slot) {
  if (slot->waiters.load(std::memory_order_seq_cst) != 0) WakeAll(&slot->seq);
}

// Moves a slot's seq on and wakes its sleepers, if any. The seq_cst store and load pair with the
// waiter's seq_cst increment before its futex wait (which re-reads seq in the kernel): either
// this load sees the waiter, or the waiter's futex call sees the new seq and does not sleep.
void AdvanceSlot(SlotHeader* slot, uint32_t seq) {
  slot->seq.store(seq, std::memory_order_seq_cst);
  WakeSlotSleepers(slot);
}

}  // namespace

void StoreDouble(std::atomic<uint64_t>& cell, double value) {
  cell.store(std::bit_cast<uint64_t>(value), std::memory_order_relaxed);
}

double LoadDouble(const std::atomic<uint64_t>& cell) {
  return std::bit_cast<double>(cell.load(std::memory_order_relaxed));
}

absl::Status ClearCloexec(int fd) {
  const int flags = fcntl(fd, F_GETFD);
  if (flags < 0 || fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("clearing FD_CLOEXEC on fd ", fd));
  }
  return absl::OkStatus();
}

struct JobRegion::Impl {
  int fd = -1;
  bool owns_fd = false;
  uint8_t* base = nullptr;
  size_t size = 0;
  RingGeometry geometry;
  RegionHeader* header = nullptr;
  RegionControl* control = nullptr;
  JobStats* stats = nullptr;

  ~Impl() {
    if (base != nullptr) munmap(base, size);
    if (owns_fd && fd >= 0) close(fd);
  }

  SlotHeader* Slot(uint64_t batch) const {
    return reinterpret_cast<SlotHeader*>(base + header->slots_offset +
                                         (batch % geometry.slot_count) * header->slot_stride);
  }
  uint8_t* SlotSamples(uint64_t batch) const {
    return reinterpret_cast<uint8_t*>(Slot(batch)) + header->slot_samples_offset;
  }
  uint8_t* SlotLabels(uint64_t batch) const {
    return reinterpret_cast<uint8_t*>(Slot(batch)) + header->slot_labels_offset;
  }

  bool ConsumerDead() const {
    const pid_t pid = control->consumer_pid.load(std::memory_order_relaxed);
    return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
  }

  // Waits until the slot of `batch` is at `2*batch + phase` (phase 0: free for the producer,
  // phase 1: holding the batch for the consumer).
  absl::Status WaitForPhase(uint64_t batch, uint32_t phase, absl::Duration timeout) const;

  // Appends the era "from `start_batch` on, `loader_count` loaders" if it changes anything and
  // fits: after the latest era's start, before the job's end, with room in the table. The caller
  // is the consumer, and calls it before any slot is freed for `start_batch` or a later batch.
  bool AppendEra(uint64_t start_batch, uint32_t loader_count) {
    const uint32_t eras = control->era_count.load(std::memory_order_relaxed);
    if (eras >= kMaxLoaderEras || start_batch >= geometry.total_batches ||
        start_batch <= control->eras[eras - 1].start_batch.load(std::memory_order_relaxed) ||
        loader_count == control->eras[eras - 1].loader_count.load(std::memory_order_relaxed)) {
      return false;
    }
    control->eras[eras].start_batch.store(start_batch, std::memory_order_relaxed);
    control->eras[eras].loader_count.store(loader_count, std::memory_order_relaxed);
    // Release: a process that sees the new count sees the entry. The slot store that later frees
    // a slot for start_batch is sequenced after this, so whoever sees that slot free sees the era.
    control->era_count.store(eras + 1, std::memory_order_release);
    return true;
  }
};

absl::Status JobRegion::Impl::WaitForPhase(uint64_t batch, uint32_t phase,
                                           absl::Duration timeout) const {
  using Clock = std::chrono::steady_clock;
  const bool infinite = timeout == absl::InfiniteDuration();
  const Clock::time_point deadline =
      infinite ? Clock::time_point::max()
               : Clock::now() +
                     std::max(absl::ToChronoNanoseconds(timeout), std::chrono::nanoseconds::zero());
  std::atomic<uint32_t>* word = &Slot(batch)->seq;
  const uint32_t wanted = static_cast<uint32_t>(2 * batch + phase);
  const bool producer = phase == 0;
  for (;;) {
    const uint32_t seq = word->load(std::memory_order_acquire);
    if (control->stop.load(std::memory_order_acquire) != 0) {
      return absl::CancelledError(absl::StrCat("stop requested while waiting for batch ", batch));
    }
    // Distance of the slot's state from the wanted one; it only moves forward.
    const int32_t ahead = static_cast<int32_t>(seq - wanted);
    if (ahead == 0) return absl::OkStatus();
    if (ahead > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "batch ", batch, producer ? " is already published" : " was already released", " (slot ",
          batch % geometry.slot_count, ")"));
    }
    if (producer && ConsumerDead()) {
      return absl::AbortedError(absl::StrCat("consumer process ",
                                             control->consumer_pid.load(std::memory_order_relaxed),
                                             " died while batch ", batch, " waited for its slot"));
    }
    auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(kWaitTick);
    if (!infinite) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) {
        return absl::DeadlineExceededError(
            absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting for batch ",
                         batch, producer ? " to get a free slot" : " to be published"));
      }
      sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::nanoseconds>(left));
    }
    const timespec ts{.tv_sec = static_cast<time_t>(sleep.count() / 1000000000),
                      .tv_nsec = static_cast<long>(sleep.count() % 1000000000)};
    // Returns at once if the word already moved on (EAGAIN); wakes on Publish/Release/RequestStop.
    std::atomic<uint32_t>& waiters = Slot(batch)->waiters;
    waiters.fetch_add(1, std::memory_order_seq_cst);
    Futex(word, FUTEX_WAIT, seq, &ts);
    waiters.fetch_sub(1, std::memory_order_relaxed);
  }
}

absl::StatusOr<std::unique_ptr<JobRegion>> JobRegion::Create(const RingGeometry& geometry) {
  STOKER_ASSIGN_OR_RETURN(RegionHeader layout, ComputeLayout(geometry));

  auto impl = std::make_unique<Impl>();
  impl->fd = memfd_create("stoker-job", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (impl->fd < 0) return absl::ErrnoToStatus(errno, "memfd_create for the job region");
  impl->owns_fd = true;
  if (ftruncate(impl->fd, static_cast<off_t>(layout.total_bytes)) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("sizing the job region to ", layout.total_bytes, " bytes"));
  }
  // A region that shrank under a mapping would make every process that touches it die of SIGBUS.
  if (fcntl(impl->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::ErrnoToStatus(errno, "sealing the job region's size");
  }
  void* base = mmap(nullptr, layout.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, impl->fd, 0);
  if (base == MAP_FAILED) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("mapping ", layout.total_bytes, " bytes of the job region"));
  }
  impl->base = static_cast<uint8_t*>(base);
  impl->size = layout.total_bytes;
  impl->geometry = geometry;

  // A fresh memfd is zero-filled; construct the shared objects in place.
  impl->header = new (impl->base) RegionHeader(layout);
  impl->control = new (impl->base + layout.control_offset) RegionControl{};
  impl->control->eras[0].start_batch.store(0, std::memory_order_relaxed);
  impl->control->eras[0].loader_count.store(
      geometry.initial_loaders > 0 ? std::min(geometry.initial_loaders, geometry.loader_count)
                                   : geometry.loader_count,
      std::memory_order_relaxed);
  impl->control->era_count.store(1, std::memory_order_relaxed);
  impl->stats = new (impl->base + layout.stats_offset) JobStats{};
  for (uint32_t s = 0; s < geometry.slot_count; ++s) {
    auto* slot = new (impl->base + layout.slots_offset + s * layout.slot_stride) SlotHeader{};
    slot->seq.store(2 * s, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);

  std::unique_ptr<JobRegion> region(new JobRegion());
  region->impl_ = std::move(impl);
  return region;
}

absl::StatusOr<std::unique_ptr<JobRegion>> JobRegion::Attach(int fd) {
  const std::string what = absl::StrCat("job region fd ", fd);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat(what, ": cannot stat it (was the fd passed to this process?)"));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(RegionHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not a Stoker job region: it holds ", file_bytes,
                     " bytes, fewer than the ", sizeof(RegionHeader), "-byte header"));
  }
  void* base = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat(what, ": mapping ", file_bytes, " bytes"));
  }
  auto impl = std::make_unique<Impl>();
  impl->fd = fd;
  impl->owns_fd = false;
  impl->base = static_cast<uint8_t*>(base);
  impl->size = file_bytes;
  impl->header = reinterpret_cast<RegionHeader*>(impl->base);
  const RegionHeader& h = *impl->header;

  if (h.magic != kRegionMagic) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a Stoker job region: magic 0x%016x at offset 0, expected 0x%016x", what, h.magic,
        kRegionMagic));
  }
  if (h.version != kRegionVersion || h.header_bytes != sizeof(RegionHeader) ||
      h.stats_bytes != sizeof(JobStats)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has layout version %u (header %u bytes, stats %u bytes) but this binary expects "
        "version %u (header %u bytes, stats %u bytes): the agent and this process come from "
        "different builds; rebuild and redeploy them together",
        what, h.version, h.header_bytes, h.stats_bytes, kRegionVersion, sizeof(RegionHeader),
        sizeof(JobStats)));
  }
  RingGeometry geometry;
  geometry.slot_count = h.slot_count;
  geometry.batch_size = h.batch_size;
  geometry.sample_bytes = h.sample_bytes;
  geometry.loader_count = h.loader_count;
  geometry.total_batches = h.total_batches;
  geometry.sample_type = static_cast<SampleType>(h.sample_type);
  if (h.sample_rank > 4) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": corrupt header: a sample of ", h.sample_rank, " dimensions"));
  }
  geometry.sample_dims.assign(h.sample_dims, h.sample_dims + h.sample_rank);
  absl::StatusOr<RegionHeader> expected = ComputeLayout(geometry);
  if (!expected.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": corrupt header: ", expected.status().message()));
  }
  if (std::memcmp(&*expected, &h, sizeof(RegionHeader)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": corrupt header: its offsets do not match its geometry (",
                     h.slot_count, " slots of ", h.batch_size, " x ", h.sample_bytes, " bytes)"));
  }
  if (h.total_bytes != file_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": header says the region holds ", h.total_bytes, " bytes but the fd has ",
        file_bytes, " bytes; the region was resized or is not a job region"));
  }
  impl->geometry = geometry;
  impl->control = reinterpret_cast<RegionControl*>(impl->base + h.control_offset);
  impl->stats = reinterpret_cast<JobStats*>(impl->base + h.stats_offset);
  std::atomic_thread_fence(std::memory_order_acquire);

  std::unique_ptr<JobRegion> region(new JobRegion());
  region->impl_ = std::move(impl);
  return region;
}

JobRegion::~JobRegion() = default;

int JobRegion::fd() const { return impl_->fd; }
void* JobRegion::mapped_base() const { return impl_->base; }
size_t JobRegion::mapped_bytes() const { return impl_->size; }
const RingGeometry& JobRegion::geometry() const { return impl_->geometry; }
JobStats& JobRegion::stats() { return *impl_->stats; }

bool BadSampleSet::Insert(uint64_t sample) {
  const uint64_t key = sample + 1;
  if (distinct.load(std::memory_order_relaxed) < kSlots / 2) {
    // SplitMix64's finaliser spreads neighbouring indices over the table.
    uint64_t h = key;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    for (size_t probe = 0, i = h & (kSlots - 1); probe < kSlots;
         ++probe, i = (i + 1) & (kSlots - 1)) {
      uint64_t seen = slots[i].load(std::memory_order_acquire);
      if (seen == 0 && slots[i].compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
        break;  // new
      }
      if (seen == key) return false;  // also when another loader inserted it just now
    }
  }
  distinct.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void JobRegion::RequestStop() {
  impl_->control->stop.store(1, std::memory_order_release);
  for (uint32_t s = 0; s < impl_->geometry.slot_count; ++s) WakeAll(&impl_->Slot(s)->seq);
}

bool JobRegion::StopRequested() const {
  return impl_->control->stop.load(std::memory_order_acquire) != 0;
}

void JobRegion::RequestCheckpointAndStop(StopReason reason) {
  impl_->control->checkpoint_and_stop.store(static_cast<uint32_t>(reason),
                                            std::memory_order_release);
}

JobRegion::StopReason JobRegion::CheckpointAndStopReason() const {
  return impl_->control->checkpoint_and_stop.load(std::memory_order_acquire) ==
                 static_cast<uint32_t>(StopReason::kPreempted)
             ? StopReason::kPreempted
             : StopReason::kShutdown;
}

bool JobRegion::CheckpointAndStopRequested() const {
  return impl_->control->checkpoint_and_stop.load(std::memory_order_acquire) != 0;
}

void JobRegion::SetConsumerPid(pid_t pid) {
  impl_->control->consumer_pid.store(pid, std::memory_order_relaxed);
}

pid_t JobRegion::ConsumerPid() const {
  return impl_->control->consumer_pid.load(std::memory_order_relaxed);
}

absl::StatusOr<WritableBatch> JobRegion::WaitWritable(uint64_t batch, absl::Duration timeout) {
  STOKER_RETURN_IF_ERROR(impl_->WaitForPhase(batch, 0, timeout));
  return WritableBatch{
      .batch = batch, .samples = impl_->SlotSamples(batch), .labels = impl_->SlotLabels(batch)};
}

bool JobRegion::IsPublished(uint64_t batch) const {
  const uint32_t seq = impl_->Slot(batch)->seq.load(std::memory_order_acquire);
  return static_cast<int32_t>(seq - static_cast<uint32_t>(2 * batch)) >= 1;
}

void JobRegion::Publish(uint64_t batch, uint32_t count) {
  SlotHeader* slot = impl_->Slot(batch);
  slot->count.store(std::min(count, impl_->geometry.batch_size), std::memory_order_relaxed);
  StreamFence();  // the slot's streaming stores (StreamCopy) land before the slot is published
  AdvanceSlot(slot, static_cast<uint32_t>(2 * batch + 1));
}

absl::StatusOr<ReadableBatch> JobRegion::WaitReadable(uint64_t batch, absl::Duration timeout) {
  STOKER_RETURN_IF_ERROR(impl_->WaitForPhase(batch, 1, timeout));
  return ReadableBatch{.batch = batch,
                       .samples = impl_->SlotSamples(batch),
                       .labels = impl_->SlotLabels(batch),
                       .count = impl_->Slot(batch)->count.load(std::memory_order_relaxed)};
}

void JobRegion::Release(uint64_t batch) {
  SlotHeader* slot = impl_->Slot(batch);
  // The agent's requested loader count becomes an era that starts at the batch this release
  // frees a slot for, appended before the slot is freed (the invariant in the header).
  if (const uint32_t wanted = impl_->control->requested_loaders.load(std::memory_order_acquire);
      wanted != 0) {
    impl_->AppendEra(batch + impl_->geometry.slot_count, wanted);
  }
  slot->seq.store(static_cast<uint32_t>(2 * (batch + impl_->geometry.slot_count)),
                  std::memory_order_seq_cst);
  // consumer_next_batch only grows, so a restarted loader never goes back to a released batch.
  std::atomic<uint64_t>& next = impl_->stats->consumer_next_batch;
  uint64_t current = next.load(std::memory_order_relaxed);
  while (current < batch + 1 &&
         !next.compare_exchange_weak(current, batch + 1, std::memory_order_release)) {
  }
  WakeSlotSleepers(slot);  // seq_cst store above, then this load: see AdvanceSlot
}

uint32_t JobRegion::FilledSlots() const {
  uint32_t filled = 0;
  for (uint32_t s = 0; s < impl_->geometry.slot_count; ++s) {
    filled += impl_->Slot(s)->seq.load(std::memory_order_relaxed) & 1u;
  }
  return filled;
}

void JobRegion::StartAt(uint64_t first_batch) {
  for (uint64_t batch = first_batch; batch < first_batch + impl_->geometry.slot_count; ++batch) {
    impl_->Slot(batch)->seq.store(static_cast<uint32_t>(2 * batch), std::memory_order_relaxed);
  }
  impl_->stats->consumer_next_batch.store(first_batch, std::memory_order_release);
}

uint64_t JobRegion::NextBatchFor(uint32_t index, uint64_t from) const {
  const RegionControl& control = *impl_->control;
  const uint32_t eras = std::min(control.era_count.load(std::memory_order_acquire), kMaxLoaderEras);
  const uint64_t total = impl_->geometry.total_batches;
  for (uint32_t e = 0; e < eras; ++e) {
    const uint64_t start = control.eras[e].start_batch.load(std::memory_order_relaxed);
    const uint64_t end =
        e + 1 < eras ? control.eras[e + 1].start_batch.load(std::memory_order_relaxed) : total;
    const uint64_t loaders = control.eras[e].loader_count.load(std::memory_order_relaxed);
    const uint64_t first = std::max(from, start);
    if (loaders == 0 || index >= loaders || first >= end) continue;
    const uint64_t batch = first + (index + loaders - first % loaders) % loaders;
    if (batch < std::min(end, total)) return batch;
  }
  return total;
}

uint32_t JobRegion::LoaderFor(uint64_t batch) const {
  const RegionControl& control = *impl_->control;
  const uint32_t eras = std::min(control.era_count.load(std::memory_order_acquire), kMaxLoaderEras);
  uint32_t e = eras - 1;
  while (e > 0 && control.eras[e].start_batch.load(std::memory_order_relaxed) > batch) --e;
  return static_cast<uint32_t>(batch %
                               control.eras[e].loader_count.load(std::memory_order_relaxed));
}

uint32_t JobRegion::ActiveLoaderCount() const {
  const RegionControl& control = *impl_->control;
  const uint32_t eras = std::min(control.era_count.load(std::memory_order_acquire), kMaxLoaderEras);
  return control.eras[eras - 1].loader_count.load(std::memory_order_relaxed);
}

uint64_t JobRegion::ActiveEraStart() const {
  const RegionControl& control = *impl_->control;
  const uint32_t eras = std::min(control.era_count.load(std::memory_order_acquire), kMaxLoaderEras);
  return control.eras[eras - 1].start_batch.load(std::memory_order_relaxed);
}

absl::Status JobRegion::RequestLoaderCount(uint32_t loader_count) {
  if (loader_count == 0 || loader_count > impl_->geometry.loader_count) {
    return absl::InvalidArgumentError(absl::StrCat("loader count ", loader_count, " is outside 1..",
                                                   impl_->geometry.loader_count));
  }
  impl_->control->requested_loaders.store(loader_count, std::memory_order_release);
  return absl::OkStatus();
}

uint32_t JobRegion::RequestedLoaderCount() const {
  return impl_->control->requested_loaders.load(std::memory_order_acquire);
}

absl::Status JobRegion::ChangeLoaderCount(uint64_t start_batch, uint32_t loader_count) {
  RegionControl& control = *impl_->control;
  const uint32_t eras = control.era_count.load(std::memory_order_acquire);
  if (loader_count == 0 || loader_count > impl_->geometry.loader_count) {
    return absl::InvalidArgumentError(absl::StrCat("loader count ", loader_count, " is outside 1..",
                                                   impl_->geometry.loader_count));
  }
  if (eras >= kMaxLoaderEras) {
    return absl::FailedPreconditionError("the loader era table is full");
  }
  const uint64_t next = impl_->stats->consumer_next_batch.load(std::memory_order_acquire);
  if (start_batch < next + impl_->geometry.slot_count ||
      start_batch <= control.eras[eras - 1].start_batch.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a new loader era must start at or after batch ",
                     next + impl_->geometry.slot_count, " and after the current era's start"));
  }
  control.eras[eras].start_batch.store(start_batch, std::memory_order_relaxed);
  control.eras[eras].loader_count.store(loader_count, std::memory_order_relaxed);
  control.era_count.store(eras + 1, std::memory_order_release);
  return absl::OkStatus();
}

bool JobRegion::LoaderNeeded(uint32_t index) const {
  const uint64_t total = impl_->geometry.total_batches;
  // Published batches lie within one ring of the consumer, so this looks at most slot_count + 1.
  for (uint64_t batch =
           NextBatchFor(index, impl_->stats->consumer_next_batch.load(std::memory_order_acquire));
       batch < total; batch = NextBatchFor(index, batch + 1)) {
    if (!IsPublished(batch)) return true;
  }
  return false;
}

absl::StatusOr<std::vector<int>> RingGeometry::ImageDims(const char* reader) const {
  if (sample_dims.size() != 3) {
    return absl::FailedPreconditionError(
        absl::StrCat("the region header gives no image sample shape (C, H, W): the agent and this ",
                     reader, " come from different builds"));
  }
  return std::vector<int>(sample_dims.begin(), sample_dims.end());
}

}  // namespace stoker
