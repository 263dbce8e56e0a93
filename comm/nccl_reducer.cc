// CreateNcclReducer (nccl_reducer.h). The layout is learnt in the first step as the cpu
// BucketedReducer learns it: tensors in index order, a bucket closed when the next tensor would
// overflow it (or at Finish), so every rank issues its all-reduces in one order. All gradients
// come from one compute stream, so the event recorded after a bucket's last gradient covers the
// whole bucket: one event per bucket, re-recorded for each tensor while the first step learns.
// Bucket buffers (for buckets of two or more tensors) are allocated when the learning step closes
// them (the first step, or the one after a failed learning step), never afterwards.
#include "comm/nccl_reducer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace stoker {
namespace {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                          cudaGetErrorName(error), " (", cudaGetErrorString(error),
                                          ")"));
}

#define STOKER_REDUCER_CUDA(call)                                       \
  do {                                                                  \
    const cudaError_t stoker_cuda_error_ = (call);                      \
    if (stoker_cuda_error_ != cudaSuccess) {                            \
      return CudaStatus(stoker_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

// Seconds from `start` to `end` (both recorded and complete), or 0 when end is not after start.
double SecondsBetween(cudaEvent_t start, cudaEvent_t end) {
  float milliseconds = 0;
  if (cudaEventElapsedTime(&milliseconds, start, end) != cudaSuccess) return 0;
  return std::max(0.0, static_cast<double>(milliseconds) / 1000.0);
}

class NcclReducer : public BucketedReducer {
 public:
  NcclReducer(NcclCollective& collective, const NcclReducerOptions& options)
      : collective_(collective),
        compute_(options.compute_stream),
        bucket_bytes_(std::max<int64_t>(options.buckets.bucket_bytes, sizeof(float))),
        global_batch_(std::max<int64_t>(options.buckets.global_batch, 1)) {}

  ~NcclReducer() override {
    cudaSetDevice(collective_.device());
    // A step left mid-way (a backend error after GradientReady, which skips Finish) may have
    // all-reduces on the stream that the other ranks never join, and the communicator is only
    // destroyed after this reducer: wait with the collective's timeout (which aborts it, ending
    // the stream's NCCL work), never unbounded. Then the buffers go when the stream is done.
    if (comm_ != nullptr) {
      (void)collective_.WaitForStream(comm_, "destroying the NCCL gradient reducer");
      cudaStreamSynchronize(comm_);
    }
    for (Bucket& bucket : buckets_) DestroyBucket(bucket);
    for (float* buffer : retired_buffers_) cudaFree(buffer);
    if (backward_done_ != nullptr) cudaEventDestroy(backward_done_);
    if (comm_done_ != nullptr) cudaEventDestroy(comm_done_);
    if (comm_ != nullptr) cudaStreamDestroy(comm_);
  }

  absl::Status Init() {
    STOKER_REDUCER_CUDA(cudaSetDevice(collective_.device()));
    STOKER_REDUCER_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    STOKER_REDUCER_CUDA(cudaEventCreate(&backward_done_));
    STOKER_REDUCER_CUDA(cudaEventCreate(&comm_done_));
    return absl::OkStatus();
  }

  void SetLocalSamples(int64_t samples) override { local_samples_.store(samples); }

  float LocalShare() const override {
    return static_cast<float>(static_cast<double>(local_samples_.load()) /
                              static_cast<double>(global_batch_));
  }

  void GradientReady(int index, float* gradient, int64_t count) override {
    if (!step_error_.ok()) return;  // the step has failed already; Finish() says why
    step_error_ = Ready(index, gradient, count);
  }

  absl::Status Finish() override {
    const bool learning = learning_;  // this step learns the layout
    // Every failure drains, also FinishStep's own (a gradient missing at Finish, a bucket that
    // could not be closed): buckets already enqueued may still read and write the model's
    // gradients.
    absl::Status status = step_error_.ok() ? FinishStep() : step_error_;
    if (!status.ok()) Drain();
    // A learning step that failed teaches nothing: the next one learns again (its buckets were
    // never summed, or their sums are lost with the aborted communicator). After an abort the
    // stream may still wait for the compute stream (a hung kernel): the buffers are retired, not
    // freed (cudaFree would wait for the device), so Finish stays bounded by the timeout.
    if (!status.ok() && learning) {
      for (Bucket& bucket : buckets_) {
        if (bucket.buffer != nullptr) retired_buffers_.push_back(bucket.buffer);
        bucket.buffer = nullptr;
        DestroyBucket(bucket);  // events: released by CUDA once their work is done
      }
      buckets_.clear();
      tensors_.clear();
      learning_ = true;
    }
    ++step_;
    ready_ = 0;
    launched_ = 0;
    step_error_ = absl::OkStatus();
    return status;
  }

  ReducerCounters counters() const override {
    absl::MutexLock lock(&counters_mu_);
    return counters_;
  }

 private:
  using Tensor = BucketedTensor;
  struct Bucket {
    int first_tensor = 0;
    int last_tensor = -1;
    int64_t count = 0;            // floats
    float* buffer = nullptr;      // device; null for a bucket of one tensor (summed in place)
    cudaEvent_t ready = nullptr;  // compute stream, after the bucket's last gradient
    cudaEvent_t start = nullptr;  // communication stream, around the NCCL call (timing)
    cudaEvent_t end = nullptr;
  };

  static void DestroyBucket(Bucket& bucket) {
    if (bucket.buffer != nullptr) cudaFree(bucket.buffer);
    if (bucket.ready != nullptr) cudaEventDestroy(bucket.ready);
    if (bucket.start != nullptr) cudaEventDestroy(bucket.start);
    if (bucket.end != nullptr) cudaEventDestroy(bucket.end);
    bucket = Bucket{};
  }

  absl::Status Ready(int index, float* gradient, int64_t count) {
    STOKER_RETURN_IF_ERROR(CheckGradientArrival(step_, index, ready_, gradient, count));
    STOKER_REDUCER_CUDA(cudaSetDevice(collective_.device()));
    if (learning_) {
      STOKER_RETURN_IF_ERROR(Learn(gradient, count));
      ++ready_;
      // Re-recorded for each tensor: when the bucket closes, it marks its last one.
      STOKER_REDUCER_CUDA(cudaEventRecord(buckets_.back().ready, compute_));
      return absl::OkStatus();
    }
    STOKER_RETURN_IF_ERROR(CheckSameGradient(step_, index, tensors_, gradient, count));
    const Tensor& tensor = tensors_[index];
    ++ready_;
    Bucket& bucket = buckets_[tensor.bucket];
    if (index != bucket.last_tensor) return absl::OkStatus();
    STOKER_REDUCER_CUDA(cudaEventRecord(bucket.ready, compute_));
    return Launch(tensor.bucket);
  }

  // First step: the tensor goes at the end of the open bucket, or the open bucket is closed
  // (launched) and a new one opened when the tensor would overflow it.
  absl::Status Learn(float* gradient, int64_t count) {
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    if (buckets_.empty() ||
        (buckets_.back().count > 0 &&
         buckets_.back().count * static_cast<int64_t>(sizeof(float)) + bytes > bucket_bytes_)) {
      if (!buckets_.empty()) STOKER_RETURN_IF_ERROR(Close(static_cast<int>(buckets_.size()) - 1));
      Bucket bucket;
      bucket.first_tensor = static_cast<int>(tensors_.size());
      STOKER_REDUCER_CUDA(cudaEventCreateWithFlags(&bucket.ready, cudaEventDisableTiming));
      const cudaError_t start = cudaEventCreate(&bucket.start);
      const cudaError_t end = start == cudaSuccess ? cudaEventCreate(&bucket.end) : start;
      buckets_.push_back(bucket);  // owns the events from here, also on an error below
      STOKER_REDUCER_CUDA(start);
      STOKER_REDUCER_CUDA(end);
    }
    Bucket& bucket = buckets_.back();
    tensors_.push_back(
        Tensor{gradient, count, static_cast<int>(buckets_.size()) - 1, bucket.count});
    bucket.count += count;
    bucket.last_tensor = static_cast<int>(tensors_.size()) - 1;
    return absl::OkStatus();
  }

  // First step: the bucket's layout is final; allocate its buffer (two or more tensors) and sum.
  absl::Status Close(int index) {
    Bucket& bucket = buckets_[index];
    if (bucket.last_tensor > bucket.first_tensor && bucket.count > 0) {
      void* buffer = nullptr;
      const cudaError_t error = cudaMalloc(&buffer, bucket.count * sizeof(float));
      if (error != cudaSuccess) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "gradient bucket ", index, ": cannot allocate ", bucket.count * sizeof(float),
            " bytes on device ", collective_.device(), ": ", cudaGetErrorName(error)));
      }
      bucket.buffer = static_cast<float*>(buffer);
    }
    return Launch(index);
  }

  // Enqueues the bucket's sum on the communication stream, after its gradients are final.
  absl::Status Launch(int index) {
    Bucket& bucket = buckets_[index];
    STOKER_REDUCER_CUDA(cudaStreamWaitEvent(comm_, bucket.ready, 0));
    if (bucket.count == 0) return absl::OkStatus();  // only empty tensors: nothing to sum
    float* data = bucket.buffer;
    if (data == nullptr) {
      data = tensors_[bucket.first_tensor].gradient;  // one tensor: summed in place
    } else {
      for (int t = bucket.first_tensor; t <= bucket.last_tensor; ++t) {
        const Tensor& tensor = tensors_[t];
        if (tensor.count == 0) continue;
        STOKER_REDUCER_CUDA(cudaMemcpyAsync(data + tensor.offset, tensor.gradient,
                                            tensor.count * sizeof(float), cudaMemcpyDeviceToDevice,
                                            comm_));
      }
    }
    STOKER_REDUCER_CUDA(cudaEventRecord(bucket.start, comm_));
    STOKER_RETURN_IF_ERROR(collective_.EnqueueAllReduceSum(
        data, static_cast<size_t>(bucket.count), comm_,
        absl::StrCat("step ", step_, ": NCCL all-reduce of gradient bucket ", index, " (",
                     bucket.count, " floats)")));
    ++launched_;
    STOKER_REDUCER_CUDA(cudaEventRecord(bucket.end, comm_));
    if (bucket.buffer != nullptr) {
      for (int t = bucket.first_tensor; t <= bucket.last_tensor; ++t) {
        const Tensor& tensor = tensors_[t];
        if (tensor.count == 0) continue;
        STOKER_REDUCER_CUDA(cudaMemcpyAsync(tensor.gradient, data + tensor.offset,
                                            tensor.count * sizeof(float), cudaMemcpyDeviceToDevice,
                                            comm_));
      }
    }
    return absl::OkStatus();
  }

  // A failed step: whatever it enqueued on the communication stream (copies, all-reduces, also
  // one whose enqueue failed half-way) must be done before the model touches its buffers again.
  // Bounded by the collective's timeout, which aborts the communicator (so the stream ends); an
  // idle stream passes at once. The step's own error is the one Finish reports.
  void Drain() {
    if (cudaSetDevice(collective_.device()) == cudaSuccess &&
        cudaEventRecord(comm_done_, comm_) == cudaSuccess &&
        collective_
            .WaitForStream(comm_, absl::StrCat("step ", step_, ": draining ", launched_,
                                               " gradient all-reduces of a failed step"))
            .ok()) {
      cudaStreamWaitEvent(compute_, comm_done_, 0);
    }
  }

  absl::Status FinishStep() {
    STOKER_REDUCER_CUDA(cudaSetDevice(collective_.device()));
    if (learning_) {
      if (!buckets_.empty()) STOKER_RETURN_IF_ERROR(Close(static_cast<int>(buckets_.size()) - 1));
      learning_ = false;
    }
    if (ready_ != static_cast<int>(tensors_.size())) {
      return absl::InternalError(absl::StrCat("step ", step_, ": only ", ready_, " of ",
                                              tensors_.size(),
                                              " gradients were ready at Finish()"));
    }
    STOKER_REDUCER_CUDA(cudaEventRecord(backward_done_, compute_));
    STOKER_REDUCER_CUDA(cudaEventRecord(comm_done_, comm_));
    STOKER_RETURN_IF_ERROR(collective_.WaitForStream(
        comm_, absl::StrCat("step ", step_, ": waiting for ", launched_, " gradient all-reduces")));
    // The update the model enqueues next reads the sums.
    STOKER_REDUCER_CUDA(cudaStreamWaitEvent(compute_, comm_done_, 0));

    ReducerCounters step;
    for (const Bucket& bucket : buckets_) {
      if (bucket.count == 0) continue;
      step.allreduce_seconds += SecondsBetween(bucket.start, bucket.end);
      step.allreduce_bytes += static_cast<uint64_t>(bucket.count) * sizeof(float);
      step.allreduce_calls += 1;
    }
    // Backward still running when the sums were done: fully hidden.
    if (cudaEventQuery(backward_done_) == cudaSuccess) {
      step.exposed_seconds = SecondsBetween(backward_done_, comm_done_);
    }
    absl::MutexLock lock(&counters_mu_);
    counters_.allreduce_seconds += step.allreduce_seconds;
    counters_.exposed_seconds += step.exposed_seconds;
    counters_.allreduce_bytes += step.allreduce_bytes;
    counters_.allreduce_calls += step.allreduce_calls;
    return absl::OkStatus();
  }

  NcclCollective& collective_;
  const cudaStream_t compute_;
  const int64_t bucket_bytes_;
  const int64_t global_batch_;
  std::atomic<int64_t> local_samples_{0};
  cudaStream_t comm_ = nullptr;
  cudaEvent_t backward_done_ = nullptr;  // compute stream at Finish (timing)
  cudaEvent_t comm_done_ = nullptr;      // communication stream at Finish (timing)

  // Driven from the model's thread only.
  bool learning_ = true;
  int64_t step_ = 0;
  int ready_ = 0;     // tensors ready in this step
  int launched_ = 0;  // buckets enqueued in this step
  std::vector<Tensor> tensors_;
  std::vector<Bucket> buckets_;
  std::vector<float*> retired_buffers_;  // of failed learning steps; freed with the reducer
  absl::Status step_error_;

  mutable absl::Mutex counters_mu_;
  ReducerCounters counters_ ABSL_GUARDED_BY(counters_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<BucketedReducer>> CreateNcclReducer(
    NcclCollective& collective, const NcclReducerOptions& options) {
  if (options.compute_stream == nullptr) {
    return absl::InvalidArgumentError(
        "NCCL reducer: no compute stream (the model's stream its gradients are final on)");
  }
  auto reducer = std::make_unique<NcclReducer>(collective, options);
  STOKER_RETURN_IF_ERROR(reducer->Init());
  return std::unique_ptr<BucketedReducer>(std::move(reducer));
}

}  // namespace stoker
