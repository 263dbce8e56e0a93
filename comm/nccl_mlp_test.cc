// The cuda MLP training data-parallel through the NCCL reducer, on one rank (what one GPU can
// run: NCCL refuses two ranks on one device): with the whole global batch the steps equal
// training alone (CUDA graphs) up to rounding; with half of it (a share of 0.5) they equal
// training alone at half the learning rate; a step without samples sums zeros and updates with
// momentum only; a reducer that times out fails the step with the weights untouched. Skips
// without a device, unless STOKER_REQUIRE_CUDA=1 (tests/gpu/check.sh).
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "comm/nccl_collective.h"
#include "comm/nccl_reducer.h"
#include "engine/cuda/cuda_mlp.h"
#include "engine/cuda/cuda_test_util.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using cuda_testing::Batch;
using cuda_testing::CudaMlp;
using cuda_testing::ExpectTensorsNear;
using cuda_testing::RandomBatch;

constexpr int kBatch = 16;

MlpConfig SmallMlp(double momentum) {
  MlpConfig config = test_layers::TestMlp(20, {32, 24}, 4, kBatch, /*seed=*/3);
  config.optimizer.momentum = momentum;
  return config;
}

// A one-rank communicator and a reducer ordered after `model`'s compute stream.
struct OneRank {
  OneRank(const Model& model, int64_t global_batch, absl::Duration timeout) {
    store = CreateInProcessStore();
    NcclOptions options;
    options.timeout = timeout;
    absl::StatusOr<std::unique_ptr<NcclCollective>> connected = ConnectNccl(options, *store);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (!connected.ok()) return;
    collective = std::move(*connected);
    const auto stream = static_cast<cudaStream_t>(model.device_stream());
    EXPECT_NE(stream, nullptr);
    if (stream == nullptr) return;
    NcclReducerOptions reducer_options;
    reducer_options.buckets.global_batch = global_batch;
    reducer_options.buckets.bucket_bytes = 4096;  // several buckets, some of several tensors
    reducer_options.compute_stream = stream;
    absl::StatusOr<std::unique_ptr<BucketedReducer>> created =
        CreateNcclReducer(*collective, reducer_options);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) reducer = std::move(*created);
  }
  std::unique_ptr<KeyValueStore> store;
  std::unique_ptr<NcclCollective> collective;
  std::unique_ptr<BucketedReducer> reducer;
};

std::vector<Batch> Batches(int steps) {
  std::vector<Batch> batches;
  for (int s = 0; s < steps; ++s) {
    batches.push_back(RandomBatch(kBatch, 20, 4, 100 + s, /*float_features=*/true));
  }
  return batches;
}

TEST(NcclMlpTest, TheWholeGlobalBatchOnOneRankTrainsAsAlone) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Model> alone = CudaMlp(SmallMlp(0.9));
  std::unique_ptr<Model> ranked = CudaMlp(SmallMlp(0.9));
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(ranked, nullptr);
  OneRank rank(*ranked, kBatch, absl::Seconds(60));
  ASSERT_NE(rank.reducer, nullptr);
  ASSERT_TRUE(ranked->SetGradientReducer(rank.reducer.get()).ok());
  for (const Batch& batch : Batches(6)) {
    absl::StatusOr<StepResult> a = alone->TrainStep(batch.View(), 0.05);
    rank.reducer->SetLocalSamples(kBatch);
    absl::StatusOr<StepResult> b = ranked->TrainStep(batch.View(), 0.05);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NEAR(a->loss, b->loss, 1e-6);
  }
  ExpectTensorsNear(ranked->Parameters(), alone->Parameters(), 1e-6, "one rank vs alone");
  // In hand-over order, 4 + 96 + 24 + 768 + 32 floats fit one 1024-float bucket and the first
  // layer's 640 weights take a second: two all-reduces of 1564 floats in all, every step.
  const ReducerCounters counters = rank.reducer->counters();
  EXPECT_EQ(counters.allreduce_calls, 6u * 2);
  EXPECT_EQ(counters.allreduce_bytes, 6u * 1564 * sizeof(float));
  const CudaModelCounters model = cuda_testing::Counters(*ranked);
  EXPECT_EQ(model.graph_replays, 0);
  EXPECT_EQ(model.eager_steps, 6);
}

TEST(NcclMlpTest, HalfTheGlobalBatchScalesTheGradientByOneHalf) {
  SKIP_WITHOUT_DEVICE();
  // SGD with momentum and no weight decay: gradients x 0.5 are steps at half the learning rate,
  // exactly (x 0.5 is exact in fp32).
  std::unique_ptr<Model> alone = CudaMlp(SmallMlp(0.9));
  std::unique_ptr<Model> ranked = CudaMlp(SmallMlp(0.9));
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(ranked, nullptr);
  OneRank rank(*ranked, 2 * kBatch, absl::Seconds(60));
  ASSERT_NE(rank.reducer, nullptr);
  ASSERT_TRUE(ranked->SetGradientReducer(rank.reducer.get()).ok());
  for (const Batch& batch : Batches(5)) {
    ASSERT_TRUE(alone->TrainStep(batch.View(), 0.025).ok());
    rank.reducer->SetLocalSamples(kBatch);
    ASSERT_TRUE(ranked->TrainStep(batch.View(), 0.05).ok());
  }
  ExpectTensorsNear(ranked->Parameters(), alone->Parameters(), 1e-6, "share 0.5 vs lr / 2");
}

TEST(NcclMlpTest, AStepWithoutSamplesSumsZerosAndUpdatesWithMomentumOnly) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Model> ranked = CudaMlp(SmallMlp(0.0));
  ASSERT_NE(ranked, nullptr);
  EXPECT_EQ(ranked->TrainStepWithoutSamples(0.05).status().code(),
            absl::StatusCode::kFailedPrecondition);
  OneRank rank(*ranked, kBatch, absl::Seconds(60));
  ASSERT_NE(rank.reducer, nullptr);
  ASSERT_TRUE(ranked->SetGradientReducer(rank.reducer.get()).ok());
  rank.reducer->SetLocalSamples(kBatch);
  ASSERT_TRUE(ranked->TrainStep(Batches(1)[0].View(), 0.05).ok());
  const std::vector<NamedTensor> before = ranked->Parameters();
  const uint64_t calls = rank.reducer->counters().allreduce_calls;
  rank.reducer->SetLocalSamples(0);
  absl::StatusOr<StepResult> empty = ranked->TrainStepWithoutSamples(0.05);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->loss, 0);
  // No momentum: a zero gradient moves nothing; the sums still ran.
  ExpectTensorsNear(ranked->Parameters(), before, 0, "a step without samples");
  EXPECT_GT(rank.reducer->counters().allreduce_calls, calls);
}

void CUDART_CB HoldStream(void* microseconds) {
  usleep(static_cast<useconds_t>(reinterpret_cast<uintptr_t>(microseconds)));
}

TEST(NcclMlpTest, AReducerThatTimesOutFailsTheStepWithoutAnUpdate) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Model> ranked = CudaMlp(SmallMlp(0.9));
  ASSERT_NE(ranked, nullptr);
  OneRank rank(*ranked, kBatch, absl::Milliseconds(300));
  ASSERT_NE(rank.reducer, nullptr);
  ASSERT_TRUE(ranked->SetGradientReducer(rank.reducer.get()).ok());
  const std::vector<Batch> batches = Batches(2);
  rank.reducer->SetLocalSamples(kBatch);
  ASSERT_TRUE(ranked->TrainStep(batches[0].View(), 0.05).ok());
  const std::vector<NamedTensor> before = ranked->Parameters();
  // The compute stream is held for 2 s (as by a hung kernel): the gradients are not final within
  // the 300 ms timeout.
  const auto stream = static_cast<cudaStream_t>(ranked->device_stream());
  ASSERT_NE(stream, nullptr);
  ASSERT_EQ(cudaLaunchHostFunc(stream, HoldStream, reinterpret_cast<void*>(uintptr_t{2'000'000})),
            cudaSuccess);
  absl::StatusOr<StepResult> step = ranked->TrainStep(batches[1].View(), 0.05);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kDeadlineExceeded) << step.status();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ExpectTensorsNear(ranked->Parameters(), before, 0, "after a failed reduction");
}

}  // namespace
}  // namespace stoker
