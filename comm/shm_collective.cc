// ConnectSharedMemory (collective.h): the ranks of one machine sum through a POSIX shared-memory
// segment instead of Gloo's TCP ring (Gloo has no shared-memory transport).
//
// Layout: a header (barrier word and count, each rank's pid, a nonce), then `size` slots and one
// result area of kChunkBytes each. An all-reduce goes chunk by chunk: each rank copies its chunk
// into its slot; barrier; rank r sums its 1/size share of the chunk over the slots in rank order
// (so every element is summed in the same order whoever sums it) into the result area; barrier;
// every rank copies the whole result out; barrier. Every rank reads the same result bytes, so the
// ranks agree bit for bit.
//
// The barrier is a generation counter in the segment: the last rank to arrive bumps it and wakes
// the others with a futex (shared, not private: the segment is mapped by several processes). A
// rank waiting longer than the options' timeout gets DEADLINE_EXCEEDED; one whose peer process is
// gone (no such process, or a zombie; checked every 20 ms of waiting) gets UNAVAILABLE.
//
// Connecting: rank 0 creates the segment under a random name (O_EXCL, mode 0600) and publishes
// the name and a random nonce in the store; each other rank opens it, checks the nonce (the same
// /dev/shm: the same machine, the same container) and publishes whether it could. Every rank reads
// every answer, so all of them fall back to Gloo together when one could not (FAILED_PRECONDITION
// from here). Rank 0 unlinks the name once all have it mapped: nothing is left in /dev/shm.
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/collective.h"
#include "comm/shm_group.h"

namespace stoker {
namespace {

constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr int kMaxRanks = 64;

struct Header {
  std::atomic<uint32_t> generation;  // bumped by the last rank to reach a barrier
  std::atomic<uint32_t> arrived;     // ranks at the current barrier
  uint64_t nonce;
  int32_t size;
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<int32_t> abandoned_by;  // 1 + the rank that gave up (Abandon), 0 while none has
  char abandon_reason[256];           // written before abandoned_by
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

size_t HeaderBytes() { return (sizeof(Header) + 63) / 64 * 64; }

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Whether process `pid` has exited: no such process, or a zombie its parent has not reaped yet.
bool Gone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[512];
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  const char* close_paren = std::strrchr(text, ')');  // the command name may hold spaces
  return close_paren != nullptr && close_paren[1] == ' ' &&
         (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

uint64_t RandomWord() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

class SharedMemoryCollective : public SharedMemoryGroup {
 public:
  SharedMemoryCollective(int rank, int size, void* base, size_t bytes, absl::Duration timeout)
      : rank_(rank), size_(size), base_(base), bytes_(bytes), timeout_(timeout) {}
  ~SharedMemoryCollective() override { munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(float* data, size_t count) override { return Sum(data, count); }
  absl::Status AllReduceSum(double* data, size_t count) override { return Sum(data, count); }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Copy(data, count, root);
  }
  absl::Status Broadcast(double* data, size_t count, int root) override {
    return Copy(data, count, root);
  }

  absl::Status Barrier() override { return size_ == 1 ? absl::OkStatus() : Wait("barrier"); }

  absl::Status ReduceSum(float* data, size_t count, int root) override {
    return Reduce(data, count, root);
  }
  absl::Status ReduceSum(double* data, size_t count, int root) override {
    return Reduce(data, count, root);
  }

  void Abandon(absl::string_view why) override {
    Header* h = header();
    int32_t none = 0;
    if (h->abandoned_by.load(std::memory_order_acquire) == 0) {
      const size_t n = std::min(why.size(), sizeof h->abandon_reason - 1);
      std::memcpy(h->abandon_reason, why.data(), n);
      h->abandon_reason[n] = '\0';
      h->abandoned_by.compare_exchange_strong(none, rank_ + 1, std::memory_order_acq_rel);
    }
    // Wakes the waiters without passing the barrier: they find abandoned_by set.
    Futex(&h->generation, FUTEX_WAKE, INT32_MAX, nullptr);
  }

 private:
  Header* header() const { return static_cast<Header*>(base_); }
  uint8_t* Slot(int rank) const {
    return static_cast<uint8_t*>(base_) + HeaderBytes() + size_t(rank) * kChunkBytes;
  }
  uint8_t* Result() const { return Slot(size_); }

  template <typename T>
  absl::Status Sum(T* data, size_t count) {
    if (size_ == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("all-reduce of a null buffer");
    const size_t per_chunk = kChunkBytes / sizeof(T);
    for (size_t begin = 0; begin < count; begin += per_chunk) {
      const size_t n = std::min(per_chunk, count - begin);
      std::memcpy(Slot(rank_), data + begin, n * sizeof(T));
      if (absl::Status s = Wait("all-reduce"); !s.ok()) return s;
      T* out = reinterpret_cast<T*>(Result());
      SumShare(n, out);
      if (absl::Status s = Wait("all-reduce"); !s.ok()) return s;
      std::memcpy(data + begin, out, n * sizeof(T));
      if (absl::Status s = Wait("all-reduce"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Broadcast: rank `root`'s data copied to every rank through the result area.
  template <typename T>
  absl::Status Copy(T* data, size_t count, int root) {
    if (absl::Status s = CheckRoot("broadcast", root, size_); !s.ok()) return s;
    if (size_ == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("broadcast of a null buffer");
    const size_t per_chunk = kChunkBytes / sizeof(T);
    for (size_t begin = 0; begin < count; begin += per_chunk) {
      const size_t n = std::min(per_chunk, count - begin);
      if (rank_ == root) std::memcpy(Result(), data + begin, n * sizeof(T));
      if (absl::Status s = Wait("broadcast"); !s.ok()) return s;
      if (rank_ != root) std::memcpy(data + begin, Result(), n * sizeof(T));
      if (absl::Status s = Wait("broadcast"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The sum of the ranks' chunks, in rank order, into the root's `data`: as Sum, but only the
  // root copies the result out. The last barrier keeps the next collective from writing the
  // result area before the root has read it.
  template <typename T>
  absl::Status Reduce(T* data, size_t count, int root) {
    if (absl::Status s = CheckRoot("reduce", root, size_); !s.ok()) return s;
    if (size_ == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("reduce of a null buffer");
    const size_t per_chunk = kChunkBytes / sizeof(T);
    for (size_t begin = 0; begin < count; begin += per_chunk) {
      const size_t n = std::min(per_chunk, count - begin);
      std::memcpy(Slot(rank_), data + begin, n * sizeof(T));
      if (absl::Status s = Wait("reduce"); !s.ok()) return s;
      SumShare(n, reinterpret_cast<T*>(Result()));
      if (absl::Status s = Wait("reduce"); !s.ok()) return s;
      // The next chunk's sums into the result area start after the next barrier, which the root
      // reaches only once it has copied this one.
      if (rank_ == root) std::memcpy(data + begin, Result(), n * sizeof(T));
    }
    return Wait("reduce");
  }

  // This rank's 1/size share of a chunk of `n` elements, summed over the slots in rank order.
  template <typename T>
  void SumShare(size_t n, T* out) {
    const size_t share = (n + size_ - 1) / size_;
    const size_t lo = std::min(n, share * rank_), hi = std::min(n, lo + share);
    const T* first = reinterpret_cast<const T*>(Slot(0));
    for (size_t i = lo; i < hi; ++i) out[i] = first[i];
    for (int r = 1; r < size_; ++r) {
      const T* slot = reinterpret_cast<const T*>(Slot(r));
      for (size_t i = lo; i < hi; ++i) out[i] += slot[i];
    }
  }

  absl::Status Abandoned(const char* what) const {
    const Header* h = header();
    const int32_t by = h->abandoned_by.load(std::memory_order_acquire);
    if (by == 0) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrFormat("%s: rank %d gave up: %s (shared memory, rank "
                        "%d of %d)",
                        what, by - 1, h->abandon_reason, rank_, size_));
  }

  // The barrier (see the file comment).
  absl::Status Wait(const char* what) {
    if (absl::Status s = Abandoned(what); !s.ok()) return s;
    Header* h = header();
    const uint32_t generation = h->generation.load(std::memory_order_acquire);
    if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(size_)) {
      h->arrived.store(0, std::memory_order_relaxed);
      h->generation.store(generation + 1, std::memory_order_release);
      Futex(&h->generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout_;
    for (int spins = 0; h->generation.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < 2000) continue;  // a peer a few microseconds behind: no system call
      const timespec slice{0, 20'000'000};
      Futex(&h->generation, FUTEX_WAIT, generation, &slice);
      if (h->generation.load(std::memory_order_acquire) != generation) break;
      if (absl::Status s = Abandoned(what); !s.ok()) return s;
      for (int r = 0; r < size_; ++r) {
        const int pid = h->pids[r].load(std::memory_order_relaxed);
        if (r != rank_ && pid > 0 && Gone(pid)) {
          return absl::UnavailableError(
              absl::StrFormat("%s: rank %d (pid %d) is gone (shared memory, rank %d of %d)", what,
                              r, pid, rank_, size_));
        }
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("%s: the other ranks did not arrive within %s (shared memory, rank %d "
                            "of %d)",
                            what, absl::FormatDuration(timeout_), rank_, size_));
      }
    }
    return absl::OkStatus();
  }

  const int rank_;
  const int size_;
  void* base_;
  size_t bytes_;
  const absl::Duration timeout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> ConnectSharedMemory(const SharedMemoryOptions& options,
                                                                KeyValueStore& store) {
  absl::StatusOr<std::unique_ptr<SharedMemoryGroup>> group =
      ConnectSharedMemoryGroup(options, store);
  if (!group.ok()) return group.status();
  return std::unique_ptr<Collective>(std::move(*group));
}

absl::StatusOr<std::unique_ptr<SharedMemoryGroup>> ConnectSharedMemoryGroup(
    const SharedMemoryOptions& options, KeyValueStore& store) {
  if (absl::Status s = CheckGroup(options.rank, options.size, options.timeout); !s.ok()) return s;
  if (options.size > kMaxRanks) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory: at most ", kMaxRanks, " ranks on one machine"));
  }
  const size_t bytes = HeaderBytes() + size_t(options.size + 1) * kChunkBytes;
  const std::string& prefix = options.store_prefix;
  std::string name;
  uint64_t nonce = 0;
  int fd = -1;
  std::string why;
  if (options.refuse) why = "its worker runs with --collective-transport gloo";
  if (options.rank == 0 && options.refuse) {
    if (absl::Status s = store.Set(absl::StrCat(prefix, "shm/segment"), ""); !s.ok()) return s;
  } else if (options.rank == 0) {
    nonce = RandomWord();
    name = absl::StrFormat("/stoker-dp-%016x", RandomWord());
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      why = absl::StrCat("shm_open: ", std::strerror(errno));
    } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      why = absl::StrCat("cannot size ", bytes >> 20, " MiB of /dev/shm: ", std::strerror(errno));
    }
    if (!why.empty() && fd >= 0) {
      close(fd);
      fd = -1;
      shm_unlink(name.c_str());
    }
    if (absl::Status s = store.Set(absl::StrCat(prefix, "shm/segment"),
                                   why.empty() ? absl::StrFormat("%s %016x", name, nonce) : "");
        !s.ok()) {
      if (fd >= 0) shm_unlink(name.c_str());
      return s;
    }
  } else if (!options.refuse) {
    absl::StatusOr<std::vector<std::string>> segment =
        store.Get({absl::StrCat(prefix, "shm/segment")}, options.timeout);
    if (!segment.ok()) return segment.status();
    char text[64] = {};
    unsigned long long published = 0;
    if ((*segment)[0].empty() ||
        std::sscanf((*segment)[0].c_str(), "%63s %llx", text, &published) != 2) {
      why = "rank 0 has no segment";
    } else {
      name = text;
      nonce = published;
      fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) why = absl::StrCat("shm_open ", name, ": ", std::strerror(errno));
    }
  }
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) why = absl::StrCat("mmap: ", std::strerror(errno));
  }
  Header* header = static_cast<Header*>(base == MAP_FAILED ? nullptr : base);
  if (header != nullptr && options.rank == 0) {
    header->nonce = nonce;
    header->size = options.size;
    header->pids[0].store(getpid(), std::memory_order_release);
  }
  // Every rank says whether it has the segment; rank 0 first, so that the others can check its
  // nonce (written before its answer).
  if (header != nullptr && options.rank != 0) {
    absl::StatusOr<std::vector<std::string>> zero =
        store.Get({absl::StrCat(prefix, "shm/ok/0")}, options.timeout);
    if (!zero.ok()) {
      munmap(base, bytes);
      return zero.status();
    }
    if (header->nonce != nonce || header->size != options.size) {
      why = "the segment is another machine's (its nonce differs)";
    } else {
      header->pids[options.rank].store(getpid(), std::memory_order_release);
    }
  }
  if (absl::Status s =
          store.Set(absl::StrCat(prefix, "shm/ok/", options.rank), why.empty() ? "1" : why);
      !s.ok()) {
    if (base != MAP_FAILED) munmap(base, bytes);
    return s;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(absl::StrCat(prefix, "shm/ok/", r));
  absl::StatusOr<std::vector<std::string>> answers = store.Get(keys, options.timeout);
  if (options.rank == 0 && !name.empty()) shm_unlink(name.c_str());  // all have it, or gave up
  std::string refused;
  if (answers.ok()) {
    for (int r = 0; r < options.size; ++r) {
      if ((*answers)[r] != "1" && refused.empty()) {
        refused = absl::StrCat("rank ", r, ": ", (*answers)[r]);
      }
    }
  }
  if (!answers.ok() || !refused.empty()) {
    if (base != MAP_FAILED) munmap(base, bytes);
    if (!answers.ok()) return answers.status();
    return absl::FailedPreconditionError(
        absl::StrCat("the ranks cannot share memory (", refused, ")"));
  }
  auto collective = std::make_unique<SharedMemoryCollective>(options.rank, options.size, base,
                                                             bytes, options.timeout);
  // Nobody sums before everyone has mapped the segment.
  if (absl::Status s = collective->Barrier(); !s.ok()) return s;
  return collective;
}

}  // namespace stoker
