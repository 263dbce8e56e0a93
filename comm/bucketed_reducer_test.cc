// The bucketed reducer over real Gloo (ranks as threads on loopback TCP): exact sums written back
// into the gradient buffers over several steps, buckets summed before Finish(), a changed layout
// refused, a peer gone reported instead of a hang, the counters.
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
#include "gtest/gtest.h"

namespace stoker {
namespace {

// Runs `body(rank)` on `size` threads and waits for all.
template <typename F>
void OnRanks(int size, F body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&body, rank] { body(rank); });
  for (std::thread& thread : threads) thread.join();
}

std::vector<std::unique_ptr<Collective>> ConnectThreads(int size, absl::Duration timeout) {
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  std::vector<std::unique_ptr<Collective>> collectives(size);
  OnRanks(size, [&](int rank) {
    GlooOptions options;
    options.rank = rank;
    options.size = size;
    options.store_prefix = "reducer/";
    options.timeout = timeout;
    absl::StatusOr<std::unique_ptr<Collective>> collective = ConnectGloo(options, *store);
    EXPECT_TRUE(collective.ok()) << "rank " << rank << ": " << collective.status();
    if (collective.ok()) collectives[rank] = std::move(*collective);
  });
  return collectives;
}

// A model's gradients: one buffer per trained tensor, handed over in index order.
struct Gradients {
  explicit Gradients(const std::vector<int64_t>& counts) {
    for (int64_t count : counts) tensors.emplace_back(count);
  }
  // Integer values, so the sum over ranks is exact in any order.
  void Fill(int rank, int step) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (size_t i = 0; i < tensors[t].size(); ++i) tensors[t][i] = Value(rank, step, t, i);
    }
  }
  static float Value(int rank, int step, size_t tensor, size_t i) {
    return static_cast<float>((rank + 1) * 1000 + step * 100 + static_cast<int>(tensor) * 10 +
                              static_cast<int>(i % 7));
  }
  void HandTo(GradientReducer& reducer) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      reducer.GradientReady(static_cast<int>(t), tensors[t].data(),
                            static_cast<int64_t>(tensors[t].size()));
    }
  }
  std::vector<std::vector<float>> tensors;
};

// Sizes with a 1 KiB cap: {10} | {300} (1200 bytes, over the cap: alone) | {50, 50} | {1000}
// (alone) | {3, 0}: five buckets.
const std::vector<int64_t> kCounts = {10, 300, 50, 50, 1000, 3, 0};
constexpr int kBuckets = 5;
constexpr int64_t kBytesPerStep = (10 + 300 + 50 + 50 + 1000 + 3) * 4;

TEST(BucketedReducerTest, TwoRanksSumEveryStepExactlyIntoTheGradientBuffers) {
  constexpr int kRanks = 2;
  constexpr int kSteps = 4;
  std::vector<std::unique_ptr<Collective>> collectives = ConnectThreads(kRanks, absl::Seconds(20));
  for (const auto& collective : collectives) ASSERT_NE(collective, nullptr);
  BucketOptions options;
  options.bucket_bytes = 1024;
  options.global_batch = 64;
  std::vector<std::unique_ptr<BucketedReducer>> reducers;
  std::vector<Gradients> gradients;
  for (int rank = 0; rank < kRanks; ++rank) {
    reducers.push_back(CreateBucketedReducer(*collectives[rank], options));
    gradients.emplace_back(kCounts);
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<absl::Status> statuses(kRanks);
    OnRanks(kRanks, [&](int rank) {
      reducers[rank]->SetLocalSamples(rank == 0 ? 40 : 24);
      gradients[rank].Fill(rank, step);
      gradients[rank].HandTo(*reducers[rank]);
      if (step > 0) {
        // Once the layout is known, every bucket is summed as soon as its gradients are ready,
        // without waiting for Finish().
        const uint64_t expected = static_cast<uint64_t>(kBuckets) * (step + 1);
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        while (reducers[rank]->counters().allreduce_calls < expected && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(1));
        }
        EXPECT_EQ(reducers[rank]->counters().allreduce_calls, expected) << "step " << step;
      }
      statuses[rank] = reducers[rank]->Finish();
    });
    for (int rank = 0; rank < kRanks; ++rank) {
      ASSERT_TRUE(statuses[rank].ok())
          << "rank " << rank << " step " << step << ": " << statuses[rank];
      for (size_t t = 0; t < kCounts.size(); ++t) {
        for (size_t i = 0; i < gradients[rank].tensors[t].size(); ++i) {
          ASSERT_EQ(gradients[rank].tensors[t][i],
                    Gradients::Value(0, step, t, i) + Gradients::Value(1, step, t, i))
              << "rank " << rank << " step " << step << " tensor " << t << " element " << i;
        }
      }
    }
  }
  EXPECT_FLOAT_EQ(reducers[0]->LocalShare(), 40.0f / 64.0f);
  EXPECT_FLOAT_EQ(reducers[1]->LocalShare(), 24.0f / 64.0f);
  for (int rank = 0; rank < kRanks; ++rank) {
    const ReducerCounters counters = reducers[rank]->counters();
    EXPECT_EQ(counters.allreduce_calls, static_cast<uint64_t>(kBuckets * kSteps));
    EXPECT_EQ(counters.allreduce_bytes, static_cast<uint64_t>(kBytesPerStep * kSteps));
    EXPECT_GT(counters.allreduce_seconds, 0.0);
    EXPECT_GE(counters.exposed_seconds, 0.0);
  }
}

TEST(BucketedReducerTest, OneBucketWhenEverythingFits) {
  std::vector<std::unique_ptr<Collective>> collectives = ConnectThreads(2, absl::Seconds(20));
  for (const auto& collective : collectives) ASSERT_NE(collective, nullptr);
  std::vector<std::unique_ptr<BucketedReducer>> reducers;
  std::vector<Gradients> gradients;
  for (int rank = 0; rank < 2; ++rank) {
    reducers.push_back(CreateBucketedReducer(*collectives[rank], BucketOptions{}));  // 25 MiB
    gradients.emplace_back(kCounts);
  }
  std::vector<absl::Status> statuses(2);
  OnRanks(2, [&](int rank) {
    gradients[rank].Fill(rank, 0);
    gradients[rank].HandTo(*reducers[rank]);
    statuses[rank] = reducers[rank]->Finish();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_EQ(reducers[rank]->counters().allreduce_calls, 1u);
    EXPECT_EQ(gradients[rank].tensors[4][999],
              Gradients::Value(0, 0, 4, 999) + Gradients::Value(1, 0, 4, 999));
  }
}

TEST(BucketedReducerTest, AStepThatDiffersFromTheFirstFailsFinish) {
  std::unique_ptr<KeyValueStore> store = CreateInProcessStore();
  absl::StatusOr<std::unique_ptr<Collective>> collective = ConnectGloo(GlooOptions{}, *store);
  ASSERT_TRUE(collective.ok()) << collective.status();
  BucketOptions options;
  options.bucket_bytes = 1024;
  std::unique_ptr<BucketedReducer> reducer = CreateBucketedReducer(**collective, options);
  Gradients gradients(kCounts);
  gradients.Fill(0, 0);
  gradients.HandTo(*reducer);
  ASSERT_TRUE(reducer->Finish().ok());
  EXPECT_EQ(gradients.tensors[1][0], Gradients::Value(0, 0, 1, 0));  // one rank: its own sum

  // Another count for tensor 2.
  Gradients resized({10, 300, 51, 50, 1000, 3, 0});
  resized.tensors[0] = gradients.tensors[0];
  reducer->GradientReady(0, gradients.tensors[0].data(), 10);
  reducer->GradientReady(1, gradients.tensors[1].data(), 300);
  reducer->GradientReady(2, resized.tensors[2].data(), 51);
  absl::Status status = reducer->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("gradient 2"), std::string::npos) << status;

  // Out of order.
  reducer->GradientReady(1, gradients.tensors[1].data(), 300);
  status = reducer->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;

  // A gradient missing.
  for (int t = 0; t < 6; ++t) {
    reducer->GradientReady(t, gradients.tensors[t].data(), kCounts[t]);
  }
  status = reducer->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("6 of 7"), std::string::npos) << status;

  // One more than the first step had.
  gradients.HandTo(*reducer);
  std::vector<float> extra(5);
  reducer->GradientReady(7, extra.data(), 5);
  EXPECT_EQ(reducer->Finish().code(), absl::StatusCode::kInternal);

  // The same layout as the first step still works.
  gradients.Fill(0, 3);
  gradients.HandTo(*reducer);
  EXPECT_TRUE(reducer->Finish().ok());
  EXPECT_EQ(gradients.tensors[4][5], Gradients::Value(0, 3, 4, 5));
}

TEST(BucketedReducerTest, APeerGoneFailsFinishInsteadOfHanging) {
  std::vector<std::unique_ptr<Collective>> collectives = ConnectThreads(2, absl::Seconds(30));
  for (const auto& collective : collectives) ASSERT_NE(collective, nullptr);
  BucketOptions options;
  options.bucket_bytes = 1024;
  std::vector<std::unique_ptr<BucketedReducer>> reducers;
  std::vector<Gradients> gradients;
  for (int rank = 0; rank < 2; ++rank) {
    reducers.push_back(CreateBucketedReducer(*collectives[rank], options));
    gradients.emplace_back(kCounts);
  }
  OnRanks(2, [&](int rank) {
    gradients[rank].HandTo(*reducers[rank]);
    EXPECT_TRUE(reducers[rank]->Finish().ok());
  });
  // Rank 1's process is gone (its reducer and context with it).
  reducers[1].reset();
  collectives[1].reset();
  const absl::Time start = absl::Now();
  gradients[0].Fill(0, 1);
  gradients[0].HandTo(*reducers[0]);
  absl::Status status = reducers[0]->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The buffers keep this rank's own gradients: a failed step is not applied.
  EXPECT_EQ(gradients[0].tensors[4][3], Gradients::Value(0, 1, 4, 3));
}

}  // namespace
}  // namespace stoker
