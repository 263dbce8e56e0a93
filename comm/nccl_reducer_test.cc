// The NCCL gradient reducer on a real device with one rank (NCCL refuses two ranks on one
// device): gradients written on a compute stream come back as their own sums over several steps
// (bucketed, in place and through bucket buffers), the counters, a changed layout refused, and a
// compute stream that never reaches the gradients turning into DEADLINE_EXCEEDED within the
// timeout, with the communicator aborted for every later step. Skips without a device, unless
// STOKER_REQUIRE_CUDA=1 (tests/gpu/check.sh).
#include "comm/nccl_reducer.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "comm/nccl_collective.h"
#include "comm/nccl_test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using nccl_testing::VisibleDevices;

// One rank on device 0, with a compute stream standing in for a model's.
struct OneRank {
  explicit OneRank(absl::Duration timeout) {
    store = CreateInProcessStore();
    NcclOptions options;
    options.timeout = timeout;
    options.store_prefix = "reducer/";
    absl::StatusOr<std::unique_ptr<NcclCollective>> connected = ConnectNccl(options, *store);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (connected.ok()) collective = std::move(*connected);
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  }
  ~OneRank() {
    cudaStreamSynchronize(compute);
    cudaStreamDestroy(compute);
  }
  std::unique_ptr<KeyValueStore> store;
  std::unique_ptr<NcclCollective> collective;
  cudaStream_t compute = nullptr;
};

// A model's gradients on the device: one buffer per trained tensor.
class DeviceGradients {
 public:
  explicit DeviceGradients(const std::vector<int64_t>& counts) : counts_(counts) {
    for (int64_t count : counts) {
      void* buffer = nullptr;
      EXPECT_EQ(cudaMalloc(&buffer, std::max<int64_t>(count, 1) * sizeof(float)), cudaSuccess);
      buffers_.push_back(static_cast<float*>(buffer));
    }
  }
  ~DeviceGradients() {
    for (float* buffer : buffers_) cudaFree(buffer);
  }
  static float Value(int step, size_t tensor, int64_t i) {
    return static_cast<float>(step * 100 + static_cast<int>(tensor) * 10 + static_cast<int>(i % 7));
  }
  // Writes step `step`'s values on `stream` and hands each tensor over as it is written, the way
  // a model hands a gradient over right after enqueueing the kernel that finalises it.
  // `offset` is added to every value (a rank's own gradients).
  void WriteAndHandTo(int step, cudaStream_t stream, GradientReducer& reducer, float offset = 0) {
    host_.assign(counts_.size(), {});
    for (size_t t = 0; t < counts_.size(); ++t) {
      host_[t].resize(counts_[t]);
      for (int64_t i = 0; i < counts_[t]; ++i) host_[t][i] = Value(step, t, i) + offset;
      if (counts_[t] > 0) {
        EXPECT_EQ(cudaMemcpyAsync(buffers_[t], host_[t].data(), counts_[t] * sizeof(float),
                                  cudaMemcpyHostToDevice, stream),
                  cudaSuccess);
      }
      reducer.GradientReady(static_cast<int>(t), buffers_[t], counts_[t]);
    }
  }
  // Hands every tensor over without writing it (a copy from pageable memory could wait for a
  // held stream on the host).
  void HandTo(GradientReducer& reducer) {
    for (size_t t = 0; t < counts_.size(); ++t) {
      reducer.GradientReady(static_cast<int>(t), buffers_[t], counts_[t]);
    }
  }
  // The device values, read after `stream` (the model's, ordered after Finish) has run.
  std::vector<std::vector<float>> Read(cudaStream_t stream) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<std::vector<float>> values(counts_.size());
    for (size_t t = 0; t < counts_.size(); ++t) {
      values[t].resize(counts_[t]);
      if (counts_[t] == 0) continue;
      EXPECT_EQ(cudaMemcpy(values[t].data(), buffers_[t], counts_[t] * sizeof(float),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return values;
  }
  const std::vector<std::vector<float>>& written() const { return host_; }
  float* buffer(size_t t) const { return buffers_[t]; }

 private:
  std::vector<int64_t> counts_;
  std::vector<float*> buffers_;
  std::vector<std::vector<float>> host_;  // pinned would be faster; the test waits anyway
};

// With a 1 KiB cap: {10} | {300} (over the cap: alone, in place) | {50, 50} (a bucket buffer) |
// {1000} (alone) | {3, 0} (a buffer): five buckets.
const std::vector<int64_t> kCounts = {10, 300, 50, 50, 1000, 3, 0};
constexpr uint64_t kBucketsPerStep = 5;
constexpr uint64_t kBytesPerStep = (10 + 300 + 50 + 50 + 1000 + 3) * 4;

TEST(NcclReducerTest, OneRankGivesBackEachGradientOverSeveralSteps) {
  SKIP_WITHOUT_DEVICES(1);
  OneRank rank(absl::Seconds(60));
  ASSERT_NE(rank.collective, nullptr);
  NcclReducerOptions options;
  options.buckets.bucket_bytes = 1024;
  options.buckets.global_batch = 64;
  options.compute_stream = rank.compute;
  absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
      CreateNcclReducer(*rank.collective, options);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  (*reducer)->SetLocalSamples(16);
  EXPECT_FLOAT_EQ((*reducer)->LocalShare(), 0.25f);

  DeviceGradients gradients(kCounts);
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    gradients.WriteAndHandTo(step, rank.compute, **reducer);
    ASSERT_TRUE((*reducer)->Finish().ok()) << "step " << step;
    EXPECT_EQ(gradients.Read(rank.compute), gradients.written()) << "step " << step;
  }
  const ReducerCounters counters = (*reducer)->counters();
  EXPECT_EQ(counters.allreduce_calls, kSteps * kBucketsPerStep);
  EXPECT_EQ(counters.allreduce_bytes, kSteps * kBytesPerStep);
  // One rank's in-place sum may enqueue no work at all: its time can be 0, never negative.
  EXPECT_GE(counters.allreduce_seconds, 0);
  EXPECT_GE(counters.exposed_seconds, 0);
}

// Two ranks as threads on two devices (skips with fewer): unlike one rank, whose sums equal its
// own gradients, this catches a bucket that is never copied back, or copied at wrong offsets.
// Rank r writes Value + 1000 r, so every element sums to 2 Value + 1000.
TEST(NcclReducerTest, TwoRanksOnTwoDevicesSumEveryGradient) {
  SKIP_WITHOUT_DEVICES(2);
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<NcclCollective>> collective =
          ConnectNccl(nccl_testing::TwoDeviceRank(rank, "two-reducer/"), *store);
      if (!collective.ok()) {
        failures[rank] = collective.status().ToString();
        return;
      }
      cudaSetDevice(rank);
      cudaStream_t compute = nullptr;
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
      {
        NcclReducerOptions reducer_options;
        reducer_options.buckets.bucket_bytes = 1024;
        reducer_options.compute_stream = compute;
        absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
            CreateNcclReducer(**collective, reducer_options);
        if (!reducer.ok()) {
          failures[rank] = reducer.status().ToString();
          return;
        }
        DeviceGradients gradients(kCounts);
        for (int step = 0; step < 3 && failures[rank].empty(); ++step) {
          std::vector<std::vector<float>> expected(kCounts.size());
          for (size_t t = 0; t < kCounts.size(); ++t) {
            for (int64_t i = 0; i < kCounts[t]; ++i) {
              expected[t].push_back(2 * DeviceGradients::Value(step, t, i) + 1000);
            }
          }
          gradients.WriteAndHandTo(step, compute, **reducer, /*offset=*/1000.0f * rank);
          const absl::Status finished = (*reducer)->Finish();
          if (!finished.ok()) {
            failures[rank] = finished.ToString();
          } else if (gradients.Read(compute) != expected) {
            failures[rank] = "step " + std::to_string(step) + ": the sums differ";
          }
        }
      }
      cudaStreamSynchronize(compute);
      cudaStreamDestroy(compute);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST(NcclReducerTest, AChangedLayoutFailsTheStepAndTheNextStepStillSums) {
  SKIP_WITHOUT_DEVICES(1);
  OneRank rank(absl::Seconds(60));
  ASSERT_NE(rank.collective, nullptr);
  NcclReducerOptions options;
  options.buckets.bucket_bytes = 1024;
  options.compute_stream = rank.compute;
  absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
      CreateNcclReducer(*rank.collective, options);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  DeviceGradients gradients(kCounts);
  gradients.WriteAndHandTo(0, rank.compute, **reducer);
  ASSERT_TRUE((*reducer)->Finish().ok());
  // Step 1 hands tensor 1 over with tensor 0's buffer.
  (*reducer)->GradientReady(0, gradients.buffer(0), kCounts[0]);
  (*reducer)->GradientReady(1, gradients.buffer(0), kCounts[1]);
  const absl::Status changed = (*reducer)->Finish();
  EXPECT_EQ(changed.code(), absl::StatusCode::kInternal) << changed;
  EXPECT_NE(changed.message().find("must not change"), absl::string_view::npos) << changed;
  // Out of order.
  (*reducer)->GradientReady(1, gradients.buffer(1), kCounts[1]);
  EXPECT_EQ((*reducer)->Finish().code(), absl::StatusCode::kInternal);
  // Finish before the last gradients: the buckets of the first three were enqueued ({10} and
  // {300}) and are drained before Finish returns its error.
  for (int t = 0; t < 3; ++t) (*reducer)->GradientReady(t, gradients.buffer(t), kCounts[t]);
  const absl::Status missing = (*reducer)->Finish();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInternal) << missing;
  EXPECT_NE(missing.message().find("only 3 of 7"), absl::string_view::npos) << missing;
  // The communicator is fine: the next step sums.
  gradients.WriteAndHandTo(3, rank.compute, **reducer);
  ASSERT_TRUE((*reducer)->Finish().ok());
  EXPECT_EQ(gradients.Read(rank.compute), gradients.written());
}

TEST(NcclReducerTest, RefusesNoComputeStream) {
  SKIP_WITHOUT_DEVICES(1);
  OneRank rank(absl::Seconds(60));
  ASSERT_NE(rank.collective, nullptr);
  EXPECT_EQ(CreateNcclReducer(*rank.collective, NcclReducerOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Blocks the stream it is enqueued on for the given microseconds.
void CUDART_CB SleepOnStream(void* microseconds) {
  usleep(static_cast<useconds_t>(reinterpret_cast<uintptr_t>(microseconds)));
}

// The gradients never become final (the compute stream is held by a 3 s host function, as by a
// hung kernel): Finish gives up after the 300 ms timeout, the communicator is aborted, and the
// next step fails at once instead of waiting again.
TEST(NcclReducerTest, GradientsThatNeverArriveTimeOutAndAbort) {
  SKIP_WITHOUT_DEVICES(1);
  OneRank rank(absl::Milliseconds(300));
  ASSERT_NE(rank.collective, nullptr);
  NcclReducerOptions options;
  options.compute_stream = rank.compute;
  absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
      CreateNcclReducer(*rank.collective, options);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  DeviceGradients gradients({1000, 10});
  ASSERT_EQ(cudaLaunchHostFunc(rank.compute, SleepOnStream,
                               reinterpret_cast<void*>(uintptr_t{3'000'000})),
            cudaSuccess);
  const absl::Time start = absl::Now();
  gradients.HandTo(**reducer);
  const absl::Status timed_out = (*reducer)->Finish();
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2.5)) << "Finish waited for the stream";
  const absl::Time again = absl::Now();
  gradients.HandTo(**reducer);
  const absl::Status after = (*reducer)->Finish();
  EXPECT_EQ(after.code(), absl::StatusCode::kDeadlineExceeded) << after;
  EXPECT_NE(after.message().find("an earlier collective failed"), absl::string_view::npos) << after;
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(250)) << "the aborted step waited again";
  // The host-staged collective on the same communicator fails alike.
  absl::StatusOr<std::unique_ptr<Collective>> host = CreateHostStagedCollective(*rank.collective);
  ASSERT_TRUE(host.ok()) << host.status();
  double sums[2] = {1, 2};
  EXPECT_EQ((*host)->AllReduceSum(sums, 2).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclReducerTest, HostStagedCollectiveSumsAndBroadcastsHostBuffers) {
  SKIP_WITHOUT_DEVICES(1);
  OneRank rank(absl::Seconds(60));
  ASSERT_NE(rank.collective, nullptr);
  absl::StatusOr<std::unique_ptr<Collective>> host = CreateHostStagedCollective(*rank.collective);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*host)->rank(), 0);
  EXPECT_EQ((*host)->size(), 1);
  std::vector<double> sums = {3.5, -1, 1e300};
  ASSERT_TRUE((*host)->AllReduceSum(sums.data(), sums.size()).ok());
  EXPECT_EQ(sums, (std::vector<double>{3.5, -1, 1e300}));
  // Larger than the first call: the device buffer grows.
  std::vector<float> weights(100000);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5f * static_cast<float>(i);
  const std::vector<float> expected = weights;
  ASSERT_TRUE((*host)->Broadcast(weights.data(), weights.size(), 0).ok());
  EXPECT_EQ(weights, expected);
  ASSERT_TRUE((*host)->AllReduceSum(weights.data(), weights.size()).ok());
  EXPECT_EQ(weights, expected);
  EXPECT_TRUE((*host)->Barrier().ok());
  EXPECT_EQ((*host)->AllReduceSum(static_cast<float*>(nullptr), 3).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoker
