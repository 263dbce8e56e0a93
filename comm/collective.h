// Collectives between the ranks of a data-parallel job, through real engines: Gloo (TCP) for
// cpu ranks, NCCL for GPU ranks. The ranks meet through a KeyValueStore (the server's rendezvous
// RPCs in a trainer, an in-process store in tests); no daemon of our own.
#ifndef STOKER_COMM_COLLECTIVE_H_
#define STOKER_COMM_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/gradient_reducer.h"

namespace stoker {

// Where ranks publish and find each other's addresses. Keys are set once.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The values of `keys`, in order, once all are set; DEADLINE_EXCEEDED (naming a missing key)
  // after `timeout`.
  virtual absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                       absl::Duration timeout) = 0;
};

// A thread-safe store in this process (tests, benchmarks with every rank in one process).
std::unique_ptr<KeyValueStore> CreateInProcessStore();

// A store in `directory` (which must exist), shared by processes on one machine (tests,
// benchmarks with forked ranks): each key a file, written under a temporary name and linked into
// place, so a reader sees a value whole or not at all; Get polls every millisecond. Setting a key
// again to another value is ALREADY_EXISTS.
std::unique_ptr<KeyValueStore> CreateDirectoryStore(const std::string& directory);

// INVALID_ARGUMENT unless 0 <= rank < size and the timeout is positive: the options every
// Connect* function checks first.
absl::Status CheckGroup(int rank, int size, absl::Duration timeout);

// INVALID_ARGUMENT unless 0 <= root < size: "`what` root R is not a rank of N".
absl::Status CheckRoot(const char* what, int root, int size);

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sums over the ranks; every rank gets the same bits. Errors: DEADLINE_EXCEEDED after
  // the options' timeout, UNAVAILABLE when a peer is gone (its process died): the caller must
  // give up on the job's attempt, not retry the collective.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  virtual absl::Status AllReduceSum(double* data, size_t count) = 0;
  // `data` of rank `root` copied to every rank.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
  virtual absl::Status Barrier() = 0;
};

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // The address other ranks reach this one at (the TCP device binds to it): "127.0.0.1" when
  // every rank is on this machine, else this host's name or address.
  std::string host = "127.0.0.1";
  // Prefixes every store key, so attempts of a job (and jobs) never meet each other's keys.
  std::string store_prefix;
  // Connecting (every rank must arrive within it) and each collective.
  absl::Duration timeout = absl::Seconds(60);
};

// A Gloo context over TCP, fully connected through `store`. The store is used only while
// connecting.
absl::StatusOr<std::unique_ptr<Collective>> ConnectGloo(const GlooOptions& options,
                                                        KeyValueStore& store);

struct SharedMemoryOptions {
  int rank = 0;
  int size = 1;
  std::string store_prefix;  // as GlooOptions.store_prefix
  // Connecting and each collective; a rank whose peer process is gone learns it within ~20 ms.
  absl::Duration timeout = absl::Seconds(60);
  // Take part in the agreement only to say no (its worker turned shared memory off): every rank
  // then gets FAILED_PRECONDITION.
  bool refuse = false;
};

// Every rank on this machine: the ranks sum through a POSIX shared-memory segment (about
// (size + 1) x 4 MiB of /dev/shm), bit-identical on every rank, each element summed in rank
// order (shm_collective.cc). FAILED_PRECONDITION on every rank, together, when one of them cannot
// map it (another machine, a full /dev/shm): connect with Gloo then.
absl::StatusOr<std::unique_ptr<Collective>> ConnectSharedMemory(const SharedMemoryOptions& options,
                                                                KeyValueStore& store);

struct CpuRanksOptions {
  int rank = 0;
  int size = 1;
  std::string host = "127.0.0.1";  // as GlooOptions.host: where other machines reach this rank
  std::string store_prefix;        // as GlooOptions.store_prefix
  absl::Duration timeout = absl::Seconds(60);
  // This rank sums through Gloo only, as if alone on its machine (its worker runs with
  // --collective-transport gloo).
  bool refuse_shared_memory = false;
  // The machine this rank runs on, as the ranks group themselves: empty for this machine's own
  // identity (MachineIdentity). Tests name machines to make several groups on one host.
  std::string machine;
};

// The ranks of a cpu job, however they are spread (cpu_ranks.cc): ranks that share a machine sum
// through shared memory, one rank of each machine (its lowest) sums those machine sums with the
// other machines' over Gloo, and shares the result back; every rank gets the same bits. All on
// one machine: shared memory alone; one rank a machine: Gloo alone. When a machine's ranks cannot
// map their segment after all, every rank falls back to Gloo alone, together.
struct CpuRanks {
  std::unique_ptr<Collective> collective;
  std::string description;  // for the log: "shared memory (...)", "gloo over HOST", "two-level ..."
};
absl::StatusOr<CpuRanks> ConnectCpuRanks(const CpuRanksOptions& options, KeyValueStore& store);

// This machine as ranks compare it: the host name, the boot id and /dev/shm's device and inode
// (two containers of one host have different /dev/shm mounts, so they are different machines
// here; the segment's nonce check catches any that still collide).
std::string MachineIdentity();

// Counters of a reducer, read while it runs (from another thread).
struct ReducerCounters {
  double allreduce_seconds = 0;  // wall time spent in all-reduce calls (overlapped or not)
  double exposed_seconds = 0;    // time Finish() waited: what the overlap did not hide
  uint64_t allreduce_bytes = 0;  // bytes summed (each bucket's size, once per all-reduce)
  uint64_t allreduce_calls = 0;
};

struct BucketOptions {
  // Gradients are packed, in the order they become ready, into buckets of about this many bytes
  // (PyTorch DDP's default, 25 MiB); a bucket is summed as soon as all its gradients are ready.
  int64_t bucket_bytes = 25ll << 20;
  // The global batch of every step (replicas x batch_size); LocalShare() is the rank's samples
  // of the step (SetLocalSamples) over it.
  int64_t global_batch = 1;
};

// A GradientReducer that sums bucketed gradients over `collective` on a thread of its own,
// overlapping backward. Each step: SetLocalSamples(n) before the model's TrainStep.
class BucketedReducer : public GradientReducer {
 public:
  virtual void SetLocalSamples(int64_t samples) = 0;
  virtual ReducerCounters counters() const = 0;
};
// For reducers (bucketed_reducer.cc, nccl_reducer.cc): a gradient buffer's address in messages.
std::string GradientAddress(const void* pointer);
// For reducers: one tensor of the layout their first step learns, a model's gradient buffer and
// where it lies in its bucket.
struct BucketedTensor {
  float* gradient;
  int64_t count;
  int bucket;
  int64_t offset;  // in floats, within the bucket's buffer
};
// For reducers: INTERNAL unless `gradient` (`count` floats) is a gradient buffer and `index` is
// the gradient step `step` expects next (`expected`: indices count 0, 1, ...).
absl::Status CheckGradientArrival(int64_t step, int index, int expected, const float* gradient,
                                  int64_t count);
// After a reducer's first step fixed the layout (`layout`, one tensor a gradient): INTERNAL naming
// what differs unless gradient `index` of step `step` is the first step's gradient `index` at the
// same buffer with the same count.
absl::Status CheckSameGradient(int64_t step, int index, const std::vector<BucketedTensor>& layout,
                               const float* gradient, int64_t count);

std::unique_ptr<BucketedReducer> CreateBucketedReducer(Collective& collective,
                                                       const BucketOptions& options);

}  // namespace stoker

#endif  // STOKER_COMM_COLLECTIVE_H_
