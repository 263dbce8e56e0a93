// ConnectNccl (nccl_collective.h). The communicator is created non-blocking
// (ncclConfig_t.blocking = 0) so that no call can wait past the timeout inside NCCL: each call
// returns ncclInProgress at once, and Wait() polls ncclCommGetAsyncError and the stream until
// they finish, fail, or the deadline passes (then ncclCommAbort unblocks everything).
// EnqueueAllReduceSum waits only for NCCL to accept the call (a non-blocking communicator may
// answer ncclInProgress, and no other NCCL call may follow before it settles), never for the
// stream.
#include "comm/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace stoker {
namespace {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  return absl::FailedPreconditionError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                                    cudaGetErrorName(error), " (",
                                                    cudaGetErrorString(error), ")"));
}

#define STOKER_CUDA_RETURN_IF_ERROR(call)                              \
  do {                                                                 \
    const cudaError_t stoker_cuda_error_ = (call);                     \
    if (stoker_cuda_error_ != cudaSuccess) {                           \
      return CudaError(stoker_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                  \
  } while (0)

// The status for an NCCL result other than ncclSuccess / ncclInProgress.
absl::Status NcclError(ncclResult_t result, const std::string& what, ncclComm_t comm) {
  std::string message = absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                                     ncclGetErrorString(result), ")");
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  }
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(absl::StrCat(message, " (a peer or the network is gone)"));
    default:
      return absl::InternalError(message);
  }
}

// Polls `comm` until its pending call is done (ncclCommGetAsyncError leaves ncclInProgress) and
// then, when `stream` is set, until the stream has run everything enqueued, or the deadline.
absl::Status Wait(ncclComm_t comm, cudaStream_t stream, absl::Time deadline,
                  const std::string& what) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return NcclError(result, what, comm);
    if (state != ncclSuccess && state != ncclInProgress) return NcclError(state, what, comm);
    if (state == ncclSuccess) {
      if (stream == nullptr) return absl::OkStatus();
      const cudaError_t query = cudaStreamQuery(stream);
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) {
        return absl::UnavailableError(absl::StrCat(what,
                                                   ": the stream failed: ", cudaGetErrorName(query),
                                                   " (", cudaGetErrorString(query), ")"));
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what,
                       ": not finished within the timeout (a rank did not arrive, "
                       "stopped, or died)"));
    }
    // Spin briefly (a collective of a few KiB takes microseconds), then give the core away.
    if (polls > 1000) absl::SleepFor(absl::Microseconds(50));
  }
}

class NcclCommunicator : public NcclCollective {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, float* scratch, const NcclOptions& options)
      : comm_(comm),
        stream_(stream),
        scratch_(scratch),
        rank_(options.rank),
        size_(options.size),
        device_(options.device),
        timeout_(options.timeout) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    {
      absl::MutexLock lock(&mu_);
      if (!comm_aborted_) {
        // A clean end flushes what is pending; anything else aborts. On a non-blocking
        // communicator ncclCommFinalize answers ncclInProgress and the state turns ncclSuccess
        // once it is quiescent (nccl.h), which Wait polls for.
        const ncclResult_t finalize = ncclCommFinalize(comm_);
        const bool finalized =
            (finalize == ncclSuccess || finalize == ncclInProgress) &&
            Wait(comm_, nullptr, absl::Now() + timeout_, "finalizing the NCCL communicator").ok();
        if (finalized) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
      }
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  absl::Duration timeout() const override { return timeout_; }

  absl::Status EnqueueAllReduceSum(float* data, size_t count, cudaStream_t stream,
                                   const std::string& what) override {
    // Accepted (not run): only the communicator's state is waited for, not the stream.
    return Run(what, count, data, /*wait_stream=*/nullptr, [&] {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream);
    });
  }

  absl::Status WaitForStream(cudaStream_t stream, const std::string& what) override {
    absl::MutexLock lock(&mu_);
    STOKER_RETURN_IF_ERROR(CheckNotFailed(what));
    STOKER_RETURN_IF_ERROR(SetDevice());
    return Settle(Wait(comm_, stream, absl::Now() + timeout_, what));
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Run(absl::StrCat("NCCL all-reduce of ", count, " floats"), count, data, stream_, [&] {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  absl::Status AllReduceSum(double* data, size_t count) override {
    return Run(absl::StrCat("NCCL all-reduce of ", count, " doubles"), count, data, stream_, [&] {
      return ncclAllReduce(data, data, count, ncclFloat64, ncclSum, comm_, stream_);
    });
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (absl::Status s = CheckRoot("broadcast", root, size_); !s.ok()) return s;
    return Run(absl::StrCat("NCCL broadcast of ", count, " floats from rank ", root), count, data,
               stream_,
               [&] { return ncclBroadcast(data, data, count, ncclFloat32, root, comm_, stream_); });
  }

  // NCCL has no barrier: an all-reduce of one float on a scratch buffer of our own.
  absl::Status Barrier() override {
    return Run("NCCL barrier", 1, scratch_, stream_, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

 private:
  // One operation on `count` elements at `data` (nothing to do for none): `enqueue` it on the
  // communicator, then wait, until the timeout, for `wait_stream` and the communicator's state
  // (null: the state only).
  absl::Status Run(const std::string& what, size_t count, const void* data,
                   cudaStream_t wait_stream, const std::function<ncclResult_t()>& enqueue) {
    if (count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
    absl::MutexLock lock(&mu_);
    STOKER_RETURN_IF_ERROR(CheckNotFailed(what));
    const absl::Time deadline = absl::Now() + timeout_;
    STOKER_RETURN_IF_ERROR(SetDevice());
    const ncclResult_t result = enqueue();
    return Settle((result == ncclSuccess || result == ncclInProgress)
                      ? Wait(comm_, wait_stream, deadline, what)
                      : NcclError(result, what, comm_));
  }

  absl::Status SetDevice() const {
    const cudaError_t set = cudaSetDevice(device_);
    if (set != cudaSuccess) return CudaError(set, "cudaSetDevice", __FILE__, __LINE__);
    return absl::OkStatus();
  }

  absl::Status CheckNotFailed(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failed_.ok()) return absl::OkStatus();
    return absl::Status(failed_.code(),
                        absl::StrCat(what, ": an earlier collective failed: ", failed_.message()));
  }

  // Any error but a refused argument ends the communicator: it is aborted (which unblocks its
  // streams) and remembered for every later call.
  absl::Status Settle(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status.ok() && !absl::IsInvalidArgument(status)) {
      failed_ = status;
      ncclCommAbort(comm_);
      comm_aborted_ = true;
    }
    return status;
  }

  ncclComm_t comm_;
  const cudaStream_t stream_;
  float* const scratch_;
  const int rank_;
  const int size_;
  const int device_;
  const absl::Duration timeout_;
  absl::Mutex mu_;  // one operation at a time, as the stream orders them anyway
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool comm_aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCollective>> ConnectNccl(const NcclOptions& options,
                                                            KeyValueStore& store) {
  STOKER_RETURN_IF_ERROR(CheckGroup(options.rank, options.size, options.timeout));
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::string what =
      absl::StrCat("connecting NCCL rank ", options.rank, " of ", options.size);
  int devices = 0;  // left untouched without a driver (docs/toolchain.md, pitfall 2)
  const cudaError_t count_error = cudaGetDeviceCount(&devices);
  if (count_error != cudaSuccess || devices <= options.device || options.device < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": no CUDA device ", options.device, " (", devices, " visible",
        count_error != cudaSuccess ? absl::StrCat(", ", cudaGetErrorName(count_error)) : "", ")"));
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));

  // The unique id: made by rank 0, read by the others.
  ncclUniqueId id;
  const std::string key = options.store_prefix + "nccl-unique-id";
  if (options.rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) return NcclError(result, what, nullptr);
    absl::Status status = store.Set(key, std::string(id.internal, sizeof(id.internal)));
    if (!status.ok()) return status;
  } else {
    absl::StatusOr<std::vector<std::string>> values =
        store.Get({key}, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!values.ok()) {
      return absl::Status(values.status().code(),
                          absl::StrCat(what, ": rank 0's id: ", values.status().message()));
    }
    if (values->size() != 1 || (*values)[0].size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat(what, ": store key '", key, "' does not hold a ",
                                              sizeof(id.internal), "-byte NCCL id"));
    }
    std::memcpy(id.internal, (*values)[0].data(), sizeof(id.internal));
  }

  cudaStream_t stream = nullptr;
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* scratch = nullptr;
  cudaError_t malloc_error = cudaMalloc(&scratch, sizeof(float));
  if (malloc_error != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaError(malloc_error, "cudaMalloc", __FILE__, __LINE__);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  absl::Status status = (result == ncclSuccess || result == ncclInProgress)
                            ? Wait(comm, nullptr, deadline, what)
                            : NcclError(result, what, comm);
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return status;
  }
  return std::unique_ptr<NcclCollective>(
      std::make_unique<NcclCommunicator>(comm, stream, scratch, options));
}

namespace {

// CreateHostStagedCollective's Collective: host buffers through one growing device buffer.
class HostStagedCollective : public Collective {
 public:
  HostStagedCollective(NcclCollective& device, cudaStream_t stream)
      : device_(device), stream_(stream) {}
  ~HostStagedCollective() override {
    cudaSetDevice(device_.device());
    cudaStreamSynchronize(stream_);
    cudaFree(buffer_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return device_.rank(); }
  int size() const override { return device_.size(); }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Staged(data, count,
                  [&](float* on_device) { return device_.AllReduceSum(on_device, count); });
  }
  absl::Status AllReduceSum(double* data, size_t count) override {
    return Staged(data, count,
                  [&](double* on_device) { return device_.AllReduceSum(on_device, count); });
  }
  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Staged(data, count,
                  [&](float* on_device) { return device_.Broadcast(on_device, count, root); });
  }
  absl::Status Barrier() override { return device_.Barrier(); }

 private:
  template <typename T, typename Op>
  absl::Status Staged(T* data, size_t count, Op op) {
    if (count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError("host-staged collective: null buffer");
    const size_t bytes = count * sizeof(T);
    STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_.device()));
    if (bytes > capacity_) {
      STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      cudaFree(buffer_);
      buffer_ = nullptr;
      capacity_ = 0;
      const cudaError_t error = cudaMalloc(&buffer_, bytes);
      if (error != cudaSuccess) {
        buffer_ = nullptr;
        return absl::ResourceExhaustedError(
            absl::StrCat("host-staged collective: cannot allocate ", bytes, " bytes on device ",
                         device_.device(), ": ", cudaGetErrorName(error)));
      }
      capacity_ = bytes;
    }
    T* on_device = static_cast<T*>(buffer_);
    // The device collective runs on its own stream: the copy in must have landed first.
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(on_device, data, bytes, cudaMemcpyHostToDevice, stream_));
    STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    STOKER_RETURN_IF_ERROR(op(on_device));  // synchronous: its result is final on return
    STOKER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data, on_device, bytes, cudaMemcpyDeviceToHost, stream_));
    STOKER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  NcclCollective& device_;
  const cudaStream_t stream_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> CreateHostStagedCollective(NcclCollective& device) {
  STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.device()));
  cudaStream_t stream = nullptr;
  STOKER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Collective>(std::make_unique<HostStagedCollective>(device, stream));
}

}  // namespace stoker
