// CreateBucketedReducer (collective.h). The first step learns the layout: tensors arrive in index
// order and are packed, in that order, into buckets of about options.bucket_bytes; a bucket is
// closed (and summed) when the next tensor would overflow it, or at Finish(). Later steps know the
// layout, so a bucket is handed to the communication thread the moment its last tensor is ready.
// Buckets are always completed in the same order on every rank (tensors arrive in index order and
// buckets are runs of consecutive indices), so the ranks issue their all-reduces in one order.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/collective.h"

namespace stoker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class Reducer : public BucketedReducer {
 public:
  Reducer(Collective& collective, const BucketOptions& options)
      : collective_(collective),
        bucket_bytes_(std::max<int64_t>(options.bucket_bytes, sizeof(float))),
        global_batch_(std::max<int64_t>(options.global_batch, 1)),
        thread_([this] { CommunicationLoop(); }) {}

  ~Reducer() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  void SetLocalSamples(int64_t samples) override { local_samples_.store(samples); }

  float LocalShare() const override {
    return static_cast<float>(static_cast<double>(local_samples_.load()) /
                              static_cast<double>(global_batch_));
  }

  ReducerCounters counters() const override {
    absl::MutexLock lock(&mu_);
    return counters_;
  }

  void GradientReady(int index, float* gradient, int64_t count) override {
    absl::MutexLock lock(&mu_);
    if (!step_error_.ok()) return;  // the step has failed already; Finish() says why
    step_error_ = CheckGradientArrival(step_, index, ready_, gradient, count);
    if (!step_error_.ok()) return;
    if (learning_) {
      Learn(gradient, count);
    } else if (!CheckLayout(index, gradient, count)) {
      return;
    }
    Tensor& tensor = tensors_[index];
    Bucket& bucket = *buckets_[tensor.bucket];
    std::memcpy(bucket.buffer.data() + tensor.offset, gradient, count * sizeof(float));
    ++ready_;
    if (!learning_ && index == bucket.last_tensor) Enqueue(tensor.bucket);
  }

  absl::Status Finish() override {
    const auto start = std::chrono::steady_clock::now();
    absl::MutexLock lock(&mu_);
    if (learning_ && step_error_.ok()) {
      if (!buckets_.empty()) Enqueue(static_cast<int>(buckets_.size()) - 1);
      learning_ = false;
    }
    if (step_error_.ok() && ready_ != static_cast<int>(tensors_.size())) {
      step_error_ =
          absl::InternalError(absl::StrCat("step ", step_, ": only ", ready_, " of ",
                                           tensors_.size(), " gradients were ready at Finish()"));
    }
    // Every bucket handed over must be summed before the buffers are touched again, also when the
    // step failed.
    mu_.Await(absl::Condition(
        +[](Reducer* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
          return self->completed_ == self->enqueued_;
        },
        this));
    counters_.exposed_seconds += SecondsSince(start);
    absl::Status status = step_error_.ok() ? reduce_error_ : step_error_;
    if (status.ok()) {
      for (const Tensor& tensor : tensors_) {
        const Bucket& bucket = *buckets_[tensor.bucket];
        std::memcpy(tensor.gradient, bucket.buffer.data() + tensor.offset,
                    tensor.count * sizeof(float));
      }
    }
    // A first step that failed teaches nothing: the next one learns again.
    if (!status.ok() && step_ == 0) {
      tensors_.clear();
      buckets_.clear();
      learning_ = true;
    }
    ++step_;
    ready_ = 0;
    step_error_ = absl::OkStatus();
    reduce_error_ = absl::OkStatus();
    return status;
  }

 private:
  using Tensor = BucketedTensor;
  struct Bucket {
    std::vector<float> buffer;
    int last_tensor = -1;
  };

  // First step: places the tensor at the end of the open bucket, or closes it (handing it to the
  // communication thread) and opens a new one when the tensor would overflow it.
  void Learn(float* gradient, int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    if (buckets_.empty() ||
        (!buckets_.back()->buffer.empty() &&
         static_cast<int64_t>(buckets_.back()->buffer.size() * sizeof(float)) + bytes >
             bucket_bytes_)) {
      if (!buckets_.empty()) Enqueue(static_cast<int>(buckets_.size()) - 1);
      buckets_.push_back(std::make_unique<Bucket>());
    }
    Bucket& bucket = *buckets_.back();
    tensors_.push_back(Tensor{gradient, count, static_cast<int>(buckets_.size()) - 1,
                              static_cast<int64_t>(bucket.buffer.size())});
    bucket.buffer.resize(bucket.buffer.size() + count);
    bucket.last_tensor = static_cast<int>(tensors_.size()) - 1;
  }

  bool CheckLayout(int index, float* gradient, int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    step_error_ = CheckSameGradient(step_, index, tensors_, gradient, count);
    return step_error_.ok();
  }

  void Enqueue(int bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue_.push_back(buckets_[bucket].get());
    ++enqueued_;
  }

  void CommunicationLoop() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      mu_.Await(absl::Condition(
          +[](Reducer* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      Bucket* bucket = queue_.front();
      queue_.pop_front();
      // The bucket's buffer is not touched by anyone else until completed_ counts it.
      float* data = bucket->buffer.data();
      const size_t count = bucket->buffer.size();
      mu_.Unlock();
      const auto start = std::chrono::steady_clock::now();
      absl::Status status = collective_.AllReduceSum(data, count);
      const double seconds = SecondsSince(start);
      mu_.Lock();
      counters_.allreduce_seconds += seconds;
      counters_.allreduce_bytes += count * sizeof(float);
      counters_.allreduce_calls += 1;
      if (reduce_error_.ok() && !status.ok()) reduce_error_ = std::move(status);
      ++completed_;
    }
  }

  Collective& collective_;
  const int64_t bucket_bytes_;
  const int64_t global_batch_;
  std::atomic<int64_t> local_samples_{0};

  mutable absl::Mutex mu_;
  bool learning_ ABSL_GUARDED_BY(mu_) = true;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  int ready_ ABSL_GUARDED_BY(mu_) = 0;  // tensors ready in this step
  std::vector<Tensor> tensors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Bucket>> buckets_ ABSL_GUARDED_BY(mu_);
  std::deque<Bucket*> queue_ ABSL_GUARDED_BY(mu_);
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status step_error_ ABSL_GUARDED_BY(mu_);    // the model's calls broke the contract
  absl::Status reduce_error_ ABSL_GUARDED_BY(mu_);  // the collective failed
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ReducerCounters counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it starts once everything above is built
};

}  // namespace

std::unique_ptr<BucketedReducer> CreateBucketedReducer(Collective& collective,
                                                       const BucketOptions& options) {
  return std::make_unique<Reducer>(collective, options);
}

}  // namespace stoker
