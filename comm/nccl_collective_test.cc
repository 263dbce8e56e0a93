// The NCCL collective on real devices: one rank on device 0 (what a lent single-GPU machine can
// run), two ranks as threads when two devices are visible. Skips without a device, unless
// STOKER_REQUIRE_CUDA=1 (tests/gpu/check.sh), which turns a missing device into a failure; without
// a device, ConnectNccl's refusal is checked instead.
#include "comm/nccl_collective.h"

#include <cuda_runtime.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "comm/nccl_test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using nccl_testing::VisibleDevices;

// A device copy of `values`, freed with the object.
class DeviceBuffer {
 public:
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& values) : bytes_(values.size() * sizeof(T)) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, values.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  template <typename T>
  T* get() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  std::vector<T> Read() {
    std::vector<T> values(bytes_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(values.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

TEST(NcclCollectiveTest, WithoutADeviceConnectIsRefused) {
  if (VisibleDevices() > 0) GTEST_SKIP() << "a device is visible";
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  absl::StatusOr<std::unique_ptr<Collective>> collective = ConnectNccl(NcclOptions{}, *store);
  EXPECT_EQ(collective.status().code(), absl::StatusCode::kFailedPrecondition)
      << collective.status();
}

TEST(NcclCollectiveTest, RefusesBadOptions) {
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  NcclOptions options;
  options.rank = 1;
  options.size = 1;
  EXPECT_EQ(ConnectNccl(options, *store).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.timeout = absl::ZeroDuration();
  EXPECT_EQ(ConnectNccl(options, *store).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclCollectiveTest, OneRankSumsBroadcastsAndPasses) {
  SKIP_WITHOUT_DEVICES(1);
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  NcclOptions options;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Collective>> collective = ConnectNccl(options, *store);
  ASSERT_TRUE(collective.ok()) << collective.status();
  EXPECT_EQ((*collective)->rank(), 0);
  EXPECT_EQ((*collective)->size(), 1);
  std::vector<float> floats(100000);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = 0.25f * static_cast<float>(i);
  DeviceBuffer device_floats(floats);
  ASSERT_TRUE((*collective)->AllReduceSum(device_floats.get<float>(), floats.size()).ok());
  EXPECT_EQ(device_floats.Read<float>(), floats);
  std::vector<double> doubles = {1.5, -2.25, 1e300};
  DeviceBuffer device_doubles(doubles);
  ASSERT_TRUE((*collective)->AllReduceSum(device_doubles.get<double>(), doubles.size()).ok());
  EXPECT_EQ(device_doubles.Read<double>(), doubles);
  ASSERT_TRUE((*collective)->Broadcast(device_floats.get<float>(), floats.size(), 0).ok());
  EXPECT_EQ(device_floats.Read<float>(), floats);
  EXPECT_EQ((*collective)->Broadcast(device_floats.get<float>(), 1, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*collective)->Barrier().ok());
}

// ConnectNccl on a thread, given `bound` to return: a connect that hangs (an abort of a
// non-blocking init that does not return) fails the test instead of hanging it; the thread is
// then left behind with what it uses.
absl::Status ConnectWithin(const NcclOptions& options, absl::Duration bound, absl::Duration* took) {
  struct Shared {
    std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
    absl::Notification done;
    absl::Status status;
  };
  auto shared = std::make_shared<Shared>();
  const absl::Time start = absl::Now();
  std::thread thread([shared, options] {
    absl::StatusOr<std::unique_ptr<NcclCollective>> collective =
        ConnectNccl(options, *shared->store);
    shared->status = collective.status();
    shared->done.Notify();
  });
  if (!shared->done.WaitForNotificationWithTimeout(bound)) {
    thread.detach();
    return absl::InternalError("ConnectNccl did not return within the bound");
  }
  thread.join();
  *took = absl::Now() - start;
  return shared->status;
}

// The ranks that never come: rank 1 of 2 finds no id from rank 0 (the store's wait), and rank 0
// of 2 starts the non-blocking init, which waits for rank 1 until the timeout aborts it. Both
// are DEADLINE_EXCEEDED soon after the timeout, never a hang.
TEST(NcclCollectiveTest, ARankThatNeverArrivesTimesOut) {
  SKIP_WITHOUT_DEVICES(1);
  NcclOptions options;
  options.size = 2;
  options.timeout = absl::Milliseconds(500);
  options.store_prefix = "alone/";
  for (int rank : {1, 0}) {
    options.rank = rank;
    absl::Duration took;
    const absl::Status status = ConnectWithin(options, absl::Seconds(30), &took);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << rank << ": " << status;
    if (status.code() != absl::StatusCode::kDeadlineExceeded) continue;
    EXPECT_GE(took, absl::Milliseconds(450)) << "rank " << rank;
    EXPECT_LT(took, absl::Seconds(10)) << "rank " << rank << ": the abort took long";
  }
}

TEST(NcclCollectiveTest, TwoRanksOnTwoDevicesSumExactly) {
  SKIP_WITHOUT_DEVICES(2);
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  const size_t count = 1 << 20;
  std::vector<std::vector<float>> results(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Collective>> collective =
          ConnectNccl(nccl_testing::TwoDeviceRank(rank, "two/"), *store);
      if (!collective.ok()) {
        statuses[rank] = collective.status();
        return;
      }
      cudaSetDevice(rank);
      DeviceBuffer buffer(std::vector<float>(count, static_cast<float>(rank + 1)));
      statuses[rank] = (*collective)->AllReduceSum(buffer.get<float>(), count);
      results[rank] = buffer.Read<float>();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    EXPECT_EQ(results[rank], std::vector<float>(count, 3.0f)) << "rank " << rank;
  }
}

}  // namespace
}  // namespace stoker
