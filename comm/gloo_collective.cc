// ConnectGloo (collective.h): a Gloo context over the TCP transport. Gloo reports every failure by
// throwing; each call into it is wrapped, the exception becomes an absl::Status, and a failed
// context is never used again (Gloo closes every pair of a context once one operation times out,
// so a later call could only fail differently).
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <chrono>
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
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/math.h"
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

class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(ToMilliseconds(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduceSum(float* data, size_t count) override { return Sum(data, count); }
  absl::Status AllReduceSum(double* data, size_t count) override { return Sum(data, count); }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of ", size()));
    }
    if (size() == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("broadcast of a null buffer");
    return Run(absl::StrCat("broadcast of ", count, " floats from rank ", root), [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(data, count);
      options.setRoot(root);
      options.setTimeout(timeout_);
      gloo::broadcast(options);
    });
  }

  absl::Status Barrier() override {
    if (size() == 1) return absl::OkStatus();
    return Run("barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTimeout(timeout_);
      gloo::barrier(options);
    });
  }

 private:
  template <typename T>
  absl::Status Sum(T* data, size_t count) {
    if (size() == 1 || count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("all-reduce of a null buffer");
    return Run(absl::StrCat("all-reduce of ", count, " ", sizeof(T) == 4 ? "floats" : "doubles",
                            " (rank ", rank(), " of ", size(), ")"),
               [&] {
                 gloo::AllreduceOptions options(context_);
                 options.setOutput(data, count);
                 void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<T>;
                 options.setReduceFunction(sum);
                 options.setTimeout(timeout_);
                 gloo::allreduce(options);
               });
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
      return failed_;
    }
  }

  const std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  absl::Mutex mu_;  // one operation at a time: they share Gloo's slot 0
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> ConnectGloo(const GlooOptions& options,
                                                        KeyValueStore& store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not a rank of a group of ", options.size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("the collective timeout must be positive, not ",
                                                   absl::FormatDuration(options.timeout)));
  }
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
    }
    return std::unique_ptr<Collective>(
        std::make_unique<GlooCollective>(std::move(context), options.timeout));
  } catch (...) {
    return StatusFromException(std::current_exception(), what);
  }
}

}  // namespace stoker
