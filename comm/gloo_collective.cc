// ConnectGloo (collective.h): a Gloo context over the TCP transport, its pairs in sync mode. Gloo
// reports every failure by throwing; each call into it is wrapped, the exception becomes an
// absl::Status, and a failed context is never used again (Gloo closes every pair of a context once
// one operation times out, so a later call could only fail differently).
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "common/status_macros.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace stoker {
namespace {

// Thrown by the store adapter through Gloo's connectFullMesh, caught in ConnectGloo.
struct StoreFailure {
  absl::Status status;
};

std::chrono::milliseconds ToMilliseconds(absl::Duration duration) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(duration)));
}

// Gloo's rendezvous::Store over our KeyValueStore. Every key gets the options' prefix, and every
// wait ends at one deadline for the whole connection (Gloo waits key by key, which would otherwise
// multiply the timeout by the number of ranks).
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::string prefix, absl::Time deadline,
               absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), deadline_(deadline), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status = store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw StoreFailure{std::move(status)};
  }

  std::vector<char> get(const std::string& key) override {
    std::vector<std::string> values = Wait({key});
    const std::string& value = values.front();
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { Wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    Wait(keys);
  }

 private:
  // The values of `keys`; throws StoreFailure.
  std::vector<std::string> Wait(const std::vector<std::string>& keys) {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
    absl::StatusOr<std::vector<std::string>> values =
        store_.Get(prefixed, std::max(absl::ZeroDuration(), deadline_ - absl::Now()));
    if (!values.ok()) {
      absl::Status status = values.status();
      if (absl::IsDeadlineExceeded(status)) {
        status = absl::DeadlineExceededError(absl::StrCat("not every rank arrived within ",
                                                          absl::FormatDuration(timeout_), ": ",
                                                          status.message()));
      }
      throw StoreFailure{std::move(status)};
    }
    if (values->size() != keys.size()) {
      throw StoreFailure{absl::InternalError(absl::StrCat("the store returned ", values->size(),
                                                          " values for ", keys.size(), " keys"))};
    }
    return *std::move(values);
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
};

// The status for an exception Gloo (or the standard library under it) threw while doing `what`.
absl::Status StatusFromException(std::exception_ptr exception, const std::string& what) {
  auto timed_out = [](const std::string& message) {
    return absl::StrContains(message, "Timed out") || absl::StrContains(message, "timeout") ||
           absl::StrContains(message, "Timeout");
  };
  try {
    std::rethrow_exception(exception);
  } catch (const StoreFailure& failure) {
    return absl::Status(failure.status.code(), absl::StrCat(what, ": ", failure.status.message()));
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    if (timed_out(message)) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
    }
    return absl::UnavailableError(absl::StrCat(what, ": a peer is gone: ", message));
  } catch (const std::system_error& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    const std::string message = e.what();
    if (timed_out(message)) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
    }
    return absl::InternalError(absl::StrCat(what, ": ", message));
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (timed_out(message)) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
    }
    return absl::InternalError(absl::StrCat(what, ": ", message));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": an unknown exception"));
  }
}

// Blocks SIGPIPE in this thread for its lifetime and swallows one raised meanwhile. Gloo writes
// with writev(2), which raises SIGPIPE when the peer has closed its end (its process died): by
// default that would kill this process instead of returning the error (EPIPE) that becomes
// UNAVAILABLE. Gloo writes from the calling thread and from its device's event-loop thread; that
// thread is started while ConnectGloo holds this block, so it inherits the blocked mask for good
// (a SIGPIPE pending on it is never delivered). The process's signal dispositions stay as they
// are.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t sigpipe;
    sigemptyset(&sigpipe);
    sigaddset(&sigpipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe, &previous_mask_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        sigset_t sigpipe;
        sigemptyset(&sigpipe);
        sigaddset(&sigpipe, SIGPIPE);
        const timespec no_wait = {0, 0};
        sigtimedwait(&sigpipe, nullptr, &no_wait);
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t previous_mask_;
  bool was_pending_ = false;
};

// The largest piece summed or broadcast by one algorithm run, in bytes. A longer buffer goes
// piece by piece. In sync mode every write blocks until the kernel took it; ring steps have both
// neighbours write before either reads, so a piece must fit what loopback TCP buffers (send and
// receive buffers, several MiB here) or both would stall until the write timeout. 1 MiB in chunks
// of a quarter of that (2 ranks) keeps far below it.
constexpr size_t kPieceBytes = size_t{1} << 20;
// Algorithm instances kept at once (each holds its staging buffer and Gloo's two inboxes, about
// three times its bytes, so at most ~3 * kMaxCached MiB). All ranks call the same collectives in
// the same order, so all of them evict at the same call.
constexpr size_t kMaxCached = 16;

// One Gloo algorithm bound, at construction, to a staging buffer of a fixed element count: its
// transport buffers (and their slots) are registered once and reused by every later run.
class CachedOperation {
 public:
  virtual ~CachedOperation() = default;
  virtual void* staging() = 0;
  virtual void Run() = 0;
};

template <typename T, typename Algorithm>
class StagedOperation : public CachedOperation {
 public:
  template <typename Make>
  StagedOperation(size_t count, Make make) : staging_(count) {
    algorithm_ = make(std::vector<T*>{staging_.data()});
  }
  void* staging() override { return staging_.data(); }
  void Run() override { algorithm_->run(); }

 private:
  std::vector<T> staging_;  // declared first: the algorithm's buffers point into it
  std::unique_ptr<Algorithm> algorithm_;
};

// Every pair is in Gloo's sync mode: the calling thread does its own blocking reads and writes
// (each bounded by the context timeout through SO_RCVTIMEO / SO_SNDTIMEO, so a silent peer ends
// in "Read timeout", i.e. DEADLINE_EXCEEDED), and Gloo's event-loop thread has no descriptor
// left to wake for. Only Gloo's bound-buffer algorithms work in sync mode; they are cached per
// (operation, element type, count, root) over staging buffers, because creating them registers
// fresh slots on every pair and creating them per call was slow (tens of ms) on alternating
// sizes.
// Gloo sizes a pair's SO_SNDBUF to its first message and only grows it after: a first message of
// a few bytes leaves the kernel's minimum (about 4.5 KiB). In sync mode a write of a few KiB then
// blocks until the peer acknowledges, and the peer, blocked in its read with one segment in hand,
// delays that acknowledgement (40 ms): 16 KiB all-reduces took 40 ms each. So before any real
// operation every rank sends kPieceBytes to every other (one broadcast per root), which sizes
// every pair's send buffer for any piece. Throws as Gloo does.
void WidenSendBuffers(const std::shared_ptr<gloo::Context>& context) {
  std::vector<float> buffer(kPieceBytes / sizeof(float));
  for (int root = 0; root < context->size; ++root) {
    gloo::BroadcastOneToAll<float>(context, {buffer.data()}, buffer.size(), root).run();
  }
}

class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduceSum(float* data, size_t count) override { return Sum(data, count); }
  absl::Status AllReduceSum(double* data, size_t count) override { return Sum(data, count); }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (absl::Status s = CheckRoot("broadcast", root, size()); !s.ok()) return s;
    if (size() == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("broadcast of a null buffer");
    return Run(absl::StrCat("broadcast of ", count, " floats from rank ", root), [&] {
      Pieces<float>(data, count, [&](size_t n) -> CachedOperation& {
        return Operation<float>(Kind::kBroadcast, n, root, [&](std::vector<float*> ptrs) {
          return std::make_unique<gloo::BroadcastOneToAll<float>>(context_, ptrs, n, root);
        });
      });
    });
  }

  absl::Status Barrier() override {
    if (size() == 1) return absl::OkStatus();
    return Run("barrier", [&] {
      if (barrier_ == nullptr) barrier_ = std::make_unique<gloo::BarrierAllToAll>(context_);
      barrier_->run();
    });
  }

 private:
  enum class Kind { kSum, kBroadcast };
  struct Key {
    Kind kind;
    size_t element_bytes;
    size_t count;
    int root;
    bool operator==(const Key&) const = default;
  };

  template <typename T>
  absl::Status Sum(T* data, size_t count) {
    if (size() == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("all-reduce of a null buffer");
    return Run(absl::StrCat("all-reduce of ", count, " ", sizeof(T) == 4 ? "floats" : "doubles",
                            " (rank ", rank(), " of ", size(), ")"),
               [&] {
                 Pieces<T>(data, count, [&](size_t n) -> CachedOperation& {
                   return Operation<T>(Kind::kSum, n, -1, [&](std::vector<T*> ptrs) {
                     return std::make_unique<gloo::AllreduceRingChunked<T>>(context_, ptrs,
                                                                            static_cast<int>(n));
                   });
                 });
               });
  }

  // Runs `data` through the operation `operation_for(n)` piece by piece (n elements each, at
  // most kPieceBytes): copy in, run, copy out.
  template <typename T, typename OperationFor>
  void Pieces(T* data, size_t count, OperationFor operation_for) {
    const size_t piece = kPieceBytes / sizeof(T);
    for (size_t offset = 0; offset < count; offset += piece) {
      const size_t n = std::min(piece, count - offset);
      CachedOperation& operation = operation_for(n);
      T* staging = static_cast<T*>(operation.staging());
      std::memcpy(staging, data + offset, n * sizeof(T));
      operation.Run();
      std::memcpy(data + offset, staging, n * sizeof(T));
    }
  }

  // The cached operation for `key`, made with `make` on first use.
  template <typename T, typename Make>
  CachedOperation& Operation(Kind kind, size_t count, int root, Make make) {
    const Key key{kind, sizeof(T), count, root};
    for (auto& [cached_key, operation] : cache_) {
      if (cached_key == key) return *operation;
    }
    if (cache_.size() >= kMaxCached) cache_.clear();
    using Algorithm = typename decltype(make(std::vector<T*>{}))::element_type;
    cache_.emplace_back(key, std::make_unique<StagedOperation<T, Algorithm>>(count, make));
    return *cache_.back().second;
  }

  // Runs one Gloo operation; the first failure is kept and returned by every later call.
  template <typename F>
  absl::Status Run(const std::string& what, F&& operation) {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) {
      return absl::Status(
          failed_.code(),
          absl::StrCat(what, ": an earlier collective failed: ", failed_.message()));
    }
    ScopedSigpipeBlock no_sigpipe;
    try {
      operation();
      return absl::OkStatus();
    } catch (...) {
      failed_ = StatusFromException(std::current_exception(), what);
      if (absl::IsDeadlineExceeded(failed_)) {
        failed_ = absl::DeadlineExceededError(absl::StrCat(failed_.message(), " (no answer within ",
                                                           absl::FormatDuration(timeout_), ")"));
      }
      return failed_;
    }
  }

  const std::shared_ptr<gloo::Context> context_;
  const absl::Duration timeout_;
  absl::Mutex mu_;  // one operation at a time: a sync-mode pair serves one thread
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // Used only under mu_ (from the operations Run runs).
  std::vector<std::pair<Key, std::unique_ptr<CachedOperation>>> cache_;
  std::unique_ptr<gloo::BarrierAllToAll> barrier_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> ConnectGloo(const GlooOptions& options,
                                                        KeyValueStore& store) {
  STOKER_RETURN_IF_ERROR(CheckGroup(options.rank, options.size, options.timeout));
  const std::string what = absl::StrCat("connecting rank ", options.rank, " of ", options.size,
                                        " (Gloo over TCP on ", options.host, ")");
  const absl::Time deadline = absl::Now() + options.timeout;
  ScopedSigpipeBlock no_sigpipe;  // also for Gloo's event-loop thread, started here
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": cannot use host '", options.host,
                                                     "' for the TCP device: ", e.what()));
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(ToMilliseconds(options.timeout));
    if (options.size > 1) {
      StoreAdapter adapter(store, options.store_prefix, deadline, options.timeout);
      context->connectFullMesh(adapter, device);
      // Sync mode (see GlooCollective): each pair leaves the device's event loop.
      for (int peer = 0; peer < options.size; ++peer) {
        if (peer != options.rank) context->getPair(peer)->setSync(true, false);
      }
      WidenSendBuffers(context);
    }
    return std::unique_ptr<Collective>(
        std::make_unique<GlooCollective>(std::move(context), options.timeout));
  } catch (...) {
    return StatusFromException(std::current_exception(), what);
  }
}

}  // namespace stoker
