// The cuda network's vision layers (issue 15) against the cpu network, the reference, on the same
// weights and batches: bias-free Conv2d/Linear, BatchNorm2d/1d (training on batch statistics,
// running statistics and evaluation on them, train/eval switching), AvgPool2d with padding,
// global average pooling, residual blocks with a projection and with identity shortcuts (ReLU,
// GELU and no activation after the sum), label smoothing; fp32, bf16 and fp16; 16-bit against
// fp32 on the cuda network itself; weight decay only on Conv2d/Linear weights; checkpoints both
// ways; and data-parallel training through a GradientReducer (the cpu network's hand-over order,
// two ranks against one model, a failing Finish changing nothing, a rank without samples).
// Tolerances as cuda_network_test.cc's (L2 relative per tensor): fp32 1e-4; bf16/fp16 1e-2 on
// losses and 3e-2 on updates (BatchNorm divides by the batch's deviation, which amplifies 16-bit
// rounding a little beyond the plain CNN's 2e-2). Every test skips without a device (fails with
// STOKER_REQUIRE_CUDA=1) or without cuDNN, except the graph checks of cuda_network_test.cc.
#include <cuda_runtime_api.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_test_util.h"
#include "engine/model.h"
#include "engine/model_shapes.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using cuda_testing::Batch;
using cuda_testing::CpuNetwork;
using cuda_testing::CudaNetwork;
using cuda_testing::Delta;
using cuda_testing::ExpectTensorsNear;
using cuda_testing::RandomBatch;
using namespace stoker::test_layers;  // NOLINT: Conv, Pool, Linear, Of, Dropout, Kind

NetworkConfig Net(std::vector<int> input_shape, std::vector<LayerConfig> layers, int classes,
                  uint64_t seed, Precision precision) {
  NetworkConfig config;
  config.input_shape = std::move(input_shape);
  config.layers = std::move(layers);
  config.classes = classes;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = seed;
  config.optimizer.learning_rate = 0.05;
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 1e-3;
  return config;
}

// A conv feeding a BatchNorm has no bias here: its gradient would be 0 up to rounding, which no
// relative comparison can judge.
// conv (no bias), BatchNorm2d, ReLU, AvgPool k2, Flatten, Linear.
NetworkConfig BatchNorm2dNet(Precision precision) {
  return Net({3, 8, 8},
             {NoBias(Conv(6, 3, 1, 1)), Norm2d(), Of(Kind::kRelu), AvgPool(2), Of(Kind::kFlatten),
              Linear(5)},
             5, 21, precision);
}

// Flat: Linear (no bias), BatchNorm1d, GELU, Linear; label smoothing 0.2.
NetworkConfig BatchNorm1dNet(Precision precision) {
  NetworkConfig config =
      Net({20}, {NoBias(Linear(12)), Norm1d(), Of(Kind::kGelu), Linear(4)}, 4, 22, precision);
  config.label_smoothing = 0.2f;
  return config;
}

// conv, AvgPool k3 s2 p1 (count_include_pad: border windows divide by 9), GELU, global average
// pooling, Linear straight off [C, 1, 1].
NetworkConfig AvgPoolNet(Precision precision) {
  return Net(
      {2, 9, 9},
      {Conv(5, 3, 1, 0), AvgPool(3, 2, 1), Of(Kind::kGelu), Of(Kind::kGlobalAvgPool), Linear(4)}, 4,
      23, precision);
}

// A ResNet basic block with a projection shortcut after a stem, then global average pooling.
NetworkConfig ProjectionNet(Precision precision) {
  return Net({3, 8, 8},
             {NoBias(Conv(4, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
              Residual({NoBias(Conv(6, 3, 2, 1)), Norm2d(), Of(Kind::kRelu),
                        NoBias(Conv(6, 3, 1, 1)), Norm2d()},
                       {NoBias(Conv(6, 1, 2, 0)), Norm2d()}),
              Of(Kind::kGlobalAvgPool), Of(Kind::kFlatten), Linear(5)},
             5, 24, precision);
}

// Identity shortcuts: a block straight on the input (no input gradient needed there), a conv,
// a ReLU block, a GELU block, a block without activation; global average pooling; label
// smoothing 0.1.
NetworkConfig IdentityNet(Precision precision) {
  NetworkConfig config = Net({2, 6, 6},
                             {Residual({NoBias(Conv(2, 3, 1, 1)), Norm2d()}, {}), Conv(3, 3, 1, 1),
                              Residual({NoBias(Conv(3, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                                        NoBias(Conv(3, 3, 1, 1)), Norm2d()},
                                       {}),
                              Residual({Conv(3, 1, 1, 0)}, {}, LayerConfig::Activation::kGelu),
                              Residual({Conv(3, 3, 1, 1)}, {}, LayerConfig::Activation::kNone),
                              Of(Kind::kGlobalAvgPool), Linear(4)},
                             4, 25, precision);
  config.label_smoothing = 0.1f;
  return config;
}

std::vector<NetworkConfig> AllNets(Precision precision) {
  return {BatchNorm2dNet(precision), BatchNorm1dNet(precision), AvgPoolNet(precision),
          ProjectionNet(precision), IdentityNet(precision)};
}

double LossTolerance(Precision precision) { return precision == Precision::kFp32 ? 1e-4 : 1e-2; }
double UpdateTolerance(Precision precision) { return precision == Precision::kFp32 ? 1e-4 : 3e-2; }

// Both models through `steps` batches (cuda_testing::ExpectTrainingTracksCpu with this file's
// tolerances: every tensor's update, BatchNorm's running statistics and num_batches_tracked
// included, and the optimizer state), then Evaluate (the running statistics) on a held-out batch.
void ExpectTrainingTracksCpu(const NetworkConfig& config, int steps) {
  cuda_testing::ExpectTrainingTracksCpu(config,
                                        {.steps = steps,
                                         .learning_rate = config.optimizer.learning_rate,
                                         .loss_tolerance = LossTolerance(config.precision),
                                         .update_tolerance = UpdateTolerance(config.precision),
                                         .evaluate_held_out = true});
}

// Anywhere: the configs these tests compare are valid and train on the cpu reference (the
// data-parallel one included), so a skip here hides no broken fixture.
TEST(CudaVisionConfigsTest, ConfigsTrainOnTheCpu) {
  for (const NetworkConfig& config : AllNets(Precision::kFp32)) {
    std::unique_ptr<Model> cpu = CpuNetwork(config);
    ASSERT_TRUE(cpu);
    absl::StatusOr<StepResult> step =
        cpu->TrainStep(RandomBatch(config, config.max_batch, 1).View(), 0.05);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_TRUE(std::isfinite(step->loss));
  }
}

class CudaVisionLayersTest : public ::testing::TestWithParam<Precision> {};

TEST_P(CudaVisionLayersTest, BatchNorm2dBiasFreeConvAvgPoolTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(BatchNorm2dNet(GetParam()), 4);
}

TEST_P(CudaVisionLayersTest, BatchNorm1dBiasFreeLinearLabelSmoothingTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(BatchNorm1dNet(GetParam()), 4);
}

TEST_P(CudaVisionLayersTest, PaddedAvgPoolAndGlobalAvgPoolTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(AvgPoolNet(GetParam()), 4);
}

TEST_P(CudaVisionLayersTest, ResidualProjectionShortcutTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(ProjectionNet(GetParam()), 4);
}

TEST_P(CudaVisionLayersTest, ResidualIdentityShortcutsTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(IdentityNet(GetParam()), 4);
}

// AdamW (decoupled decay on Conv2d/Linear weights only) with clipping over BatchNorm's gamma and
// beta too; compared on the parameters (AdamW's first steps move every weight by about +-lr).
TEST_P(CudaVisionLayersTest, AdamWWithClippingTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = ProjectionNet(GetParam());
  config.optimizer = OptimizerConfig{};
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.learning_rate = 3e-3;
  config.optimizer.weight_decay = 0.05;
  config.optimizer.clip_grad_norm = 0.1;
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  for (int step = 0; step < 3; ++step) {
    const Batch batch = RandomBatch(config, config.max_batch, 150 + step);
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 3e-3);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 3e-3);
    ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, LossTolerance(GetParam()) * expected->loss);
  }
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), UpdateTolerance(GetParam()),
                    "AdamW parameters and running statistics");
}

// Train, evaluate, train again, evaluate: Evaluate uses the running statistics and changes
// nothing (no statistics, no num_batches_tracked), TrainStep the batch's; both agree with the cpu
// at every switch, and the two modes give different losses on the same batch.
TEST_P(CudaVisionLayersTest, BatchNormTrainEvalSwitching) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = ProjectionNet(GetParam());
  config.layers[1].momentum = 0.3f;
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  const Batch batch = RandomBatch(config, config.max_batch, 77);
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.0);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.0);
    ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, LossTolerance(GetParam()) * expected->loss);
    const std::vector<NamedTensor> before = gpu->Parameters();
    absl::StatusOr<EvalResult> cpu_eval = cpu->Evaluate(batch.View());
    absl::StatusOr<EvalResult> gpu_eval = gpu->Evaluate(batch.View());
    ASSERT_TRUE(cpu_eval.ok() && gpu_eval.ok()) << gpu_eval.status();
    EXPECT_NEAR(gpu_eval->loss_sum, cpu_eval->loss_sum,
                LossTolerance(GetParam()) * cpu_eval->loss_sum)
        << "round " << round;
    ExpectTensorsNear(gpu->Parameters(), before, 0.0, "Evaluate's effect on the buffers");
    ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), UpdateTolerance(GetParam()),
                      "running statistics");
    EXPECT_GT(std::abs(gpu_eval->loss_sum / config.max_batch - actual->loss), 1e-3)
        << "training and evaluation modes should differ here";
  }
  for (const NamedTensor& t : gpu->Parameters()) {
    if (t.name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(t.values, std::vector<float>{3.0f}) << t.name;
    }
  }
}

// One value per channel in a training batch (batch 1 into a BatchNorm1d) is refused as on the cpu
// (and in PyTorch), naming the layer, with nothing changed; Evaluate still takes batch 1, and two
// samples train.
TEST_P(CudaVisionLayersTest, BatchNormWithOneValuePerChannelIsRefused) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  const NetworkConfig config = BatchNorm1dNet(GetParam());
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_TRUE(gpu->TrainStep(RandomBatch(config, 4, 60).View(), 0.05).ok());
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  const std::vector<NamedTensor> state = gpu->OptimizerState();
  const Batch one = RandomBatch(config, 1, 61);
  absl::StatusOr<StepResult> refused = gpu->TrainStep(one.View(), 0.05);
  absl::StatusOr<StepResult> cpu_refused = cpu->TrainStep(one.View(), 0.05);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), cpu_refused.status().message());
  EXPECT_NE(refused.status().message().find("batchnorm1d layers.1: expected more than 1 value per "
                                            "channel when training, got input size [1, 12]"),
            std::string::npos)
      << refused.status();
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "after the refused step");
  ExpectTensorsNear(gpu->OptimizerState(), state, 0.0, "state after the refused step");
  EXPECT_TRUE(gpu->Evaluate(one.View()).ok());
  EXPECT_TRUE(gpu->TrainStep(RandomBatch(config, 2, 62).View(), 0.05).ok());
}

// A cpu checkpoint (weights, running statistics, momentum, counters) loads into the cuda network
// and reads back unchanged, and the other way round; the next step then agrees.
TEST_P(CudaVisionLayersTest, CheckpointsMoveBetweenBackends) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  cuda_testing::ExpectCheckpointsMoveBetweenBackends(
      IdentityNet(GetParam()), {.loss_tolerance = LossTolerance(GetParam()),
                                .update_tolerance = UpdateTolerance(GetParam())});
}

// Parameters() (running statistics included) and OptimizerState() into a fresh cuda model continue
// the run: the same losses, parameters and state for the next steps (full and partial batches).
TEST_P(CudaVisionLayersTest, ResumeContinuesWithRunningStatistics) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  cuda_testing::ExpectResumeContinuesExactly(ProjectionNet(GetParam()),
                                             {.next_learning_rate = 0.05, .batch_shrink = 5});
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaVisionLayersTest, cuda_testing::AllPrecisions(),
                         cuda_testing::PrecisionParamName);

// The cuda network's bf16 and fp16 against its own fp32 on the projection block (the cpu test's
// bounds): the first step's loss within 2e-2, the trained tensors' step within 0.1 (bf16) and
// 0.01 (fp16) relative L2, the running statistics within half that.
TEST(CudaVisionPrecisionTest, Bf16AndFp16AgreeWithFp32) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = ProjectionNet(Precision::kFp32);
  config.optimizer = OptimizerConfig{};
  config.optimizer.momentum = 0;
  const Batch batch = RandomBatch(config, config.max_batch, 10, /*float_features=*/true);
  std::unique_ptr<Model> reference = CudaNetwork(config);
  ASSERT_TRUE(reference);
  const std::vector<NamedTensor> initial = reference->Parameters();
  absl::StatusOr<StepResult> reference_step = reference->TrainStep(batch.View(), 1.0);
  ASSERT_TRUE(reference_step.ok()) << reference_step.status();
  const std::vector<NamedTensor> reference_delta = Delta(reference->Parameters(), initial);
  const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config);
  for (auto [precision, tolerance] :
       {std::pair{Precision::kBf16, 0.1}, std::pair{Precision::kFp16, 0.01}}) {
    config.precision = precision;
    std::unique_ptr<Model> model = CudaNetwork(config);
    ASSERT_TRUE(model);
    absl::StatusOr<StepResult> step = model->TrainStep(batch.View(), 1.0);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_NEAR(step->loss, reference_step->loss, 2e-2 * reference_step->loss)
        << PrecisionName(precision);
    const std::vector<NamedTensor> delta = Delta(model->Parameters(), initial);
    ASSERT_EQ(delta.size(), specs.size());
    for (size_t t = 0; t < delta.size(); ++t) {
      if (specs[t].kind == NetworkTensorKind::kBatchesTracked) continue;
      const double bound = IsTrainedTensor(specs[t].kind) ? tolerance : tolerance / 2;
      EXPECT_LE(cuda_testing::RelativeError(delta[t].values, reference_delta[t].values), bound)
          << PrecisionName(precision) << " " << delta[t].name;
    }
  }
}

// Weight decay touches Conv2d and Linear weights only: two cuda models from one seed, one with
// decay, take one step on the same batch: biases and BatchNorm's parameters and buffers come out
// bit-identical, every weight differs.
TEST(CudaVisionPrecisionTest, WeightDecayOnlyOnConvAndLinearWeights) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdamW}) {
    NetworkConfig config = IdentityNet(Precision::kFp32);
    config.optimizer.type = type;
    config.optimizer.weight_decay = 0;
    std::unique_ptr<Model> plain = CudaNetwork(config);
    config.optimizer.weight_decay = 0.5;
    std::unique_ptr<Model> decayed = CudaNetwork(config);
    ASSERT_TRUE(plain && decayed);
    const Batch batch = RandomBatch(config, config.max_batch, 9);
    ASSERT_TRUE(plain->TrainStep(batch.View(), 0.1).ok());
    ASSERT_TRUE(decayed->TrainStep(batch.View(), 0.1).ok());
    const std::vector<NamedTensor> a = plain->Parameters(), b = decayed->Parameters();
    const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config);
    ASSERT_EQ(a.size(), specs.size());
    for (size_t t = 0; t < a.size(); ++t) {
      if (IsDecayedTensor(specs[t].kind)) {
        EXPECT_NE(a[t].values, b[t].values) << OptimizerTypeName(type) << " " << a[t].name;
      } else {
        EXPECT_EQ(a[t].values, b[t].values) << OptimizerTypeName(type) << " " << a[t].name;
      }
    }
  }
}

// ---- Data-parallel training through a GradientReducer ----

// Records what a model hands over; Finish answers `finish`. LocalShare 1.
class RecordingReducer : public GradientReducer {
 public:
  explicit RecordingReducer(absl::Status finish = absl::OkStatus()) : finish_(std::move(finish)) {}
  float LocalShare() const override { return 1.0f; }
  void GradientReady(int index, float* gradient, int64_t count) override {
    EXPECT_EQ(index, static_cast<int>(counts.size()));
    EXPECT_NE(gradient, nullptr);
    counts.push_back(count);
  }
  absl::Status Finish() override { return finish_; }
  std::vector<int64_t> counts;

 private:
  absl::Status finish_;
};

// The trained tensors' sizes in reverse Parameters() order: the order both networks hand over.
TEST(CudaVisionDataParallelTest, HandsOverInTheCpuOrder) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  const NetworkConfig config = ProjectionNet(Precision::kFp32);
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  RecordingReducer cpu_reducer, gpu_reducer;
  ASSERT_TRUE(cpu->SetGradientReducer(&cpu_reducer).ok());
  ASSERT_TRUE(gpu->SetGradientReducer(&gpu_reducer).ok());
  const Batch batch = RandomBatch(config, config.max_batch, 40);
  absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.05);
  absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.05);
  ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
  std::vector<int64_t> reversed;
  const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config);
  for (size_t t = specs.size(); t-- > 0;) {
    if (!IsTrainedTensor(specs[t].kind)) continue;
    int64_t size = 1;
    for (int64_t d : specs[t].shape) size *= d;
    reversed.push_back(size);
  }
  EXPECT_EQ(cpu_reducer.counts, reversed);
  EXPECT_EQ(gpu_reducer.counts, reversed);
  // A one-rank reducer changes nothing: the step equals the cpu's alone.
  EXPECT_NEAR(actual->loss, expected->loss, 1e-4 * expected->loss);
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), 1e-4, "one-rank step");
}

// A failing Finish fails the step and leaves weights, running statistics and optimizer state
// (counters included) as they were.
TEST(CudaVisionDataParallelTest, FailedFinishChangesNothing) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  const NetworkConfig config = ProjectionNet(Precision::kFp32);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(gpu);
  ASSERT_TRUE(gpu->TrainStep(RandomBatch(config, config.max_batch, 41).View(), 0.05).ok());
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  const std::vector<NamedTensor> state = gpu->OptimizerState();
  RecordingReducer failing(absl::UnavailableError("peer gone"));
  ASSERT_TRUE(gpu->SetGradientReducer(&failing).ok());
  absl::StatusOr<StepResult> step =
      gpu->TrainStep(RandomBatch(config, config.max_batch, 42).View(), 0.05);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable);
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "after a failed Finish");
  ExpectTensorsNear(gpu->OptimizerState(), state, 0.0, "state after a failed Finish");
  ASSERT_TRUE(gpu->SetGradientReducer(nullptr).ok());
  EXPECT_TRUE(gpu->TrainStep(RandomBatch(config, config.max_batch, 43).View(), 0.05).ok());
}

#ifdef STOKER_HAVE_CUDNN  // CudaNetwork
// Two ranks' reducers sum through host copies of the device gradients: a genuine sum in rank
// order, every rank getting the same bits. Each rank first waits for its model's compute stream
// (the gradients' work is only enqueued at GradientReady), and the device is idle again before
// Finish returns (a pageable cudaMemcpy to the device may return before its DMA ends).
class HostSum {
 public:
  explicit HostSum(int ranks) : slots_(ranks), barrier_(ranks) {}
  absl::Status AllReduce(int rank, cudaStream_t compute,
                         const std::vector<std::pair<float*, int64_t>>& gradients) {
    if (cudaStreamSynchronize(compute) != cudaSuccess) {
      return absl::InternalError("the compute stream failed");
    }
    std::vector<std::vector<float>>& slot = slots_[rank];
    slot.clear();
    for (const auto& [data, count] : gradients) {
      slot.emplace_back(count);
      if (cudaMemcpy(slot.back().data(), data, count * sizeof(float), cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
        return absl::InternalError("cudaMemcpy from the device failed");
      }
    }
    barrier_.arrive_and_wait();
    for (size_t t = 0; t < gradients.size(); ++t) {
      std::vector<float> sum = slots_[0][t];
      for (size_t r = 1; r < slots_.size(); ++r) {
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += slots_[r][t][i];
      }
      if (cudaMemcpy(gradients[t].first, sum.data(), sum.size() * sizeof(float),
                     cudaMemcpyHostToDevice) != cudaSuccess) {
        return absl::InternalError("cudaMemcpy to the device failed");
      }
    }
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device failed");
    barrier_.arrive_and_wait();
    return absl::OkStatus();
  }

 private:
  std::vector<std::vector<std::vector<float>>> slots_;
  std::barrier<> barrier_;
};

class HostSumReducer : public GradientReducer {
 public:
  HostSumReducer(HostSum& sum, int rank, float share, cudaStream_t compute)
      : sum_(sum), rank_(rank), share_(share), compute_(compute) {}
  float LocalShare() const override { return share_; }
  void GradientReady(int, float* gradient, int64_t count) override {
    gradients_.push_back({gradient, count});
  }
  absl::Status Finish() override {
    absl::Status status = sum_.AllReduce(rank_, compute_, gradients_);
    gradients_.clear();
    return status;
  }

 private:
  HostSum& sum_;
  int rank_;
  float share_;
  cudaStream_t compute_;
  std::vector<std::pair<float*, int64_t>> gradients_;
};

// Without BatchNorm (whose batch statistics are each rank's own) two ranks on 5 and 11 samples
// follow one model on all 16, in fp32; a rank without samples (TrainStepWithoutSamples) alongside
// one with the whole batch follows one model on that batch.
TEST(CudaVisionDataParallelTest, TwoRanksMatchOneModel) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = AvgPoolNet(Precision::kFp32);
  config.layers.insert(config.layers.begin() + 2,
                       Residual({Conv(5, 3, 1, 1), Of(Kind::kRelu), NoBias(Conv(5, 3, 1, 1))}, {}));
  config.label_smoothing = 0.1f;
  for (const int first : {5, 0}) {
    std::unique_ptr<Model> whole = CudaNetwork(config);
    std::unique_ptr<Model> rank0 = CudaNetwork(config);
    std::unique_ptr<Model> rank1 = CudaNetwork(config);
    ASSERT_TRUE(whole && rank0 && rank1);
    HostSum sum(2);
    const int total = config.max_batch;
    const auto stream0 = static_cast<cudaStream_t>(rank0->device_stream());
    const auto stream1 = static_cast<cudaStream_t>(rank1->device_stream());
    ASSERT_TRUE(stream0 != nullptr && stream1 != nullptr);
    EXPECT_EQ(CpuNetwork(config)->device_stream(), nullptr);
    HostSumReducer reducer0(sum, 0, static_cast<float>(total - first) / total, stream0);
    HostSumReducer reducer1(sum, 1, static_cast<float>(first) / total, stream1);
    ASSERT_TRUE(rank0->SetGradientReducer(&reducer0).ok());
    ASSERT_TRUE(rank1->SetGradientReducer(&reducer1).ok());
    for (int step = 0; step < 3; ++step) {
      const Batch batch = RandomBatch(config, total, 500 + step, /*float_features=*/true);
      Batch part0, part1;
      const int64_t features = static_cast<int64_t>(batch.features.size()) / total;
      part0.count = total - first;
      part0.features.assign(batch.features.begin(),
                            batch.features.begin() + part0.count * features);
      part0.labels.assign(batch.labels.begin(), batch.labels.begin() + part0.count);
      part1.count = first;
      part1.features.assign(batch.features.begin() + part0.count * features, batch.features.end());
      part1.labels.assign(batch.labels.begin() + part0.count, batch.labels.end());
      ASSERT_TRUE(whole->TrainStep(batch.View(), 0.05).ok());
      absl::Status status0, status1;
      std::thread other([&] {
        absl::StatusOr<StepResult> r =
            first > 0 ? rank1->TrainStep(part1.View(), 0.05) : rank1->TrainStepWithoutSamples(0.05);
        status1 = r.status();
      });
      status0 = rank0->TrainStep(part0.View(), 0.05).status();
      other.join();
      ASSERT_TRUE(status0.ok()) << status0;
      ASSERT_TRUE(status1.ok()) << status1;
    }
    ExpectTensorsNear(rank0->Parameters(), whole->Parameters(), 1e-4,
                      "rank 0 against one model, first " + std::to_string(first));
    ExpectTensorsNear(rank1->Parameters(), rank0->Parameters(), 0.0, "the ranks agree");
    ExpectTensorsNear(rank1->OptimizerState(), rank0->OptimizerState(), 0.0,
                      "the ranks' optimizer state");
  }
}

#endif  // STOKER_HAVE_CUDNN

}  // namespace
}  // namespace stoker
