// The cuda network against the cpu network (CreateCpuBackend()->CreateNetwork), the reference
// for every result, on fresh random inputs (never zeros). Tolerances (L2 relative per tensor, or
// relative on losses): fp32 1e-4 (cuDNN without TF32, cuBLASLt with 32F compute: the differences
// are summation order only); bf16 and fp16 1e-2 for losses and evaluation, 2e-2 for parameter
// updates and optimizer state (the roundings of a 16-bit CNN compound over four layers, and
// cuDNN writes 16-bit weight gradients). Dropout masks are the cpu's bit for bit, so parameters
// track the cpu through dropout. Every test skips without a device (fails with
// STOKER_REQUIRE_CUDA=1) except the first, which checks the clean failure there (and the
// successful calls with one); DropoutHashTest checks the host side of the mask anywhere.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_test_util.h"
#include "engine/cuda/dropout_hash.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"
#ifdef STOKER_HAVE_CUDNN
#include "engine/cuda/cuda_network_internal.h"
#endif

namespace stoker {
namespace {

using cuda_testing::Batch;
using cuda_testing::CpuNetwork;
using cuda_testing::CudaBackend;
using cuda_testing::CudaNetwork;
using cuda_testing::Delta;
using cuda_testing::ExpectTensorsNear;
using cuda_testing::Normalized;
using cuda_testing::RandomBatch;
using namespace stoker::test_layers;  // NOLINT: Conv, Pool, Linear, Of, Dropout, Kind

// examples/fashion-mnist-cnn.yaml's network and SGD (Nesterov, weight decay), smaller batches.
NetworkConfig FashionCnn(Precision precision) {
  NetworkConfig config;
  config.input_shape = {1, 28, 28};
  config.layers = {Conv(32, 3, 0, 1),  Of(Kind::kRelu), Pool(2),
                   Conv(64, 3, 0, 1),  Of(Kind::kRelu), Pool(2),
                   Of(Kind::kFlatten), Linear(256),     Of(Kind::kRelu),
                   Dropout(0.3f),      Linear(10)};
  config.classes = 10;
  config.max_batch = 32;
  config.precision = precision;
  config.seed = 1;
  config.optimizer.learning_rate = 0.05;
  config.optimizer.momentum = 0.9;
  config.optimizer.nesterov = true;
  config.optimizer.weight_decay = 5e-4;
  return config;
}

// GELU and Dropout on images (the cpu's NHWC mask order) and on flat features; a strided, padded
// conv and an overlapping padded pool; a Linear straight off [C, H, W].
NetworkConfig GeluDropoutNet(Precision precision) {
  NetworkConfig config;
  config.input_shape = {3, 9, 9};
  config.layers = {Conv(6, 3, 2, 1), Of(Kind::kGelu), Dropout(0.25f), Pool(3, 2, 1),
                   Linear(24),       Of(Kind::kGelu), Dropout(0.5f),  Linear(7)};
  config.classes = 7;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 5;
  config.optimizer.learning_rate = 0.05;
  config.optimizer.momentum = 0.9;
  return config;
}

// AdamW with decoupled weight decay and a clip small enough to act on every step.
NetworkConfig AdamWClipNet(Precision precision) {
  NetworkConfig config;
  config.input_shape = {2, 8, 8};
  config.layers = {Conv(5, 3, 1, 0), Of(Kind::kRelu), Pool(2),  Of(Kind::kFlatten),
                   Linear(20),       Of(Kind::kRelu), Linear(4)};
  config.classes = 4;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 9;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.learning_rate = 3e-3;
  config.optimizer.weight_decay = 0.05;
  config.optimizer.clip_grad_norm = 0.05;
  return config;
}

const NamedTensor* Find(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const NamedTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

double LossTolerance(Precision precision) { return precision == Precision::kFp32 ? 1e-4 : 1e-2; }
double UpdateTolerance(Precision precision) { return precision == Precision::kFp32 ? 1e-4 : 2e-2; }

// cuda_testing::ExpectTrainingTracksCpu with this file's tolerances.
void ExpectTrainingTracksCpu(const NetworkConfig& config, int steps, double learning_rate,
                             bool compare_updates = true) {
  cuda_testing::ExpectTrainingTracksCpu(config,
                                        {.steps = steps,
                                         .learning_rate = learning_rate,
                                         .loss_tolerance = LossTolerance(config.precision),
                                         .update_tolerance = UpdateTolerance(config.precision),
                                         .compare_updates = compare_updates});
}

TEST(CudaNetworkNoDeviceTest, FailsCleanlyWithoutDevice) {
  if (CudaDeviceCount() > 0) {
    // Not a skip (tests/gpu/check.sh fails on any): with a device the backend is there.
    EXPECT_TRUE(CreateCudaBackend(0).ok());
    return;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(backend.status().message().find("no CUDA device"), std::string::npos);
}

// The host half of the mask (no device needed): the shared hash draws the cpu's masks, and the
// NCHW -> NHWC index map is the cpu's layout.
TEST(DropoutHashTest, MatchesCpuMask) {
  const int64_t n = 4096;
  const std::vector<float> ones(n, 1.0f);
  std::vector<uint8_t> keep(n);
  std::vector<float> out(n);
  for (const float rate : {0.1f, 0.3f, 0.5f, 0.9f}) {
    for (const uint64_t seed : {uint64_t{1}, uint64_t{12345}}) {
      const uint64_t stream = cuda::DropoutStream(/*train_steps=*/7, /*layer_index=*/3);
      cpu::DropoutForward(ones.data(), n, rate, seed, stream, keep.data(), out.data());
      const uint64_t key = cuda::DropoutKey(seed, stream);
      const uint64_t threshold = cuda::DropoutThreshold(rate);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(cuda::DropoutKeep(key, i, threshold), keep[i] != 0)
            << "rate " << rate << " seed " << seed << " index " << i;
      }
    }
  }
  // [N=2, C=3, H*W=4]: NCHW element (n, c, s) is NHWC index (n * 4 + s) * 3 + c.
  for (uint64_t n_ = 0; n_ < 2; ++n_) {
    for (uint64_t c = 0; c < 3; ++c) {
      for (uint64_t s = 0; s < 4; ++s) {
        EXPECT_EQ(cuda::DropoutCpuIndex((n_ * 3 + c) * 4 + s, 3, 4), (n_ * 4 + s) * 3 + c);
      }
    }
  }
  EXPECT_EQ(cuda::DropoutCpuIndex(37, 50, 1), 37u);
}

#ifdef STOKER_HAVE_CUDNN
// The cuda network's view of the shared graph (engine/network_graph_test.cc tests its shape):
// fp32 logits straight from the final Linear in bf16, the rest in the compute type, and no
// gradient buffer for the network input.
TEST(CudaNetworkGraphTest, ValueTypesAndNoInputGradient) {
  NetworkConfig config;
  config.input_shape = {2, 6, 6};
  config.layers = {Conv(3, 3, 1, 1), Of(Kind::kRelu), Of(Kind::kFlatten), Linear(5)};
  config.classes = 5;
  const cuda::network_internal::Graph graph =
      cuda::network_internal::BuildGraph(config, cuda::DType::kBf16);
  ASSERT_EQ(graph.nodes.size(), 4u);
  EXPECT_EQ(graph.activations[graph.output].type, cuda::DType::kF32);
  EXPECT_EQ(graph.activations[graph.nodes[1].out].type, cuda::DType::kBf16);
  EXPECT_EQ(graph.activations[0].grad, -1);
  EXPECT_EQ(graph.nodes[0].diff_src, -1);
  const cuda::network_internal::Graph f16 =
      cuda::network_internal::BuildGraph(config, cuda::DType::kF16);
  EXPECT_EQ(f16.activations[f16.output].type, cuda::DType::kF16);
}
#endif

class CudaNetworkTest : public ::testing::TestWithParam<Precision> {};

TEST_P(CudaNetworkTest, InitialParametersAndStateEqualCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  const NetworkConfig config = FashionCnn(GetParam());
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), 0.0, "initial parameters");
  ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), 0.0, "initial state");
}

// The Linear layers' cuBLASLt epilogues (bias, bias gradient) must fuse on sm_90 in bf16, or the
// conformance tests above compare the fallback kernels only; elsewhere a fallback is logged.
TEST_P(CudaNetworkTest, LinearEpiloguesFuseOnSm90Bf16) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  const NetworkConfig config = FashionCnn(GetParam());
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(gpu);
  ASSERT_TRUE(gpu->TrainStep(RandomBatch(config, config.max_batch, 70).View(), 0.05).ok());
  const CudaModelCounters counters = cuda_testing::Counters(*gpu);
  std::string fallbacks;
  for (const std::string& reason : counters.fallbacks) fallbacks += "\n  " + reason;
  EXPECT_EQ(counters.eager_steps, 1);
  EXPECT_GT(counters.fused_gemms + counters.plain_gemms, 0);
  if (cuda_testing::DeviceComputeCapability() == 90 && GetParam() == Precision::kBf16) {
    EXPECT_GT(counters.fused_gemms, 0) << "plain " << counters.plain_gemms << fallbacks;
  }
}

TEST_P(CudaNetworkTest, EvaluateMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  for (const NetworkConfig& config : {FashionCnn(GetParam()), GeluDropoutNet(GetParam())}) {
    std::unique_ptr<Model> cpu = CpuNetwork(config);
    std::unique_ptr<Model> gpu = CudaNetwork(config);
    ASSERT_TRUE(cpu && gpu);
    for (const bool float_features : {false, true}) {
      for (const int count : {config.max_batch, 7}) {
        const Batch batch = RandomBatch(config, count, 1000 + count, float_features);
        absl::StatusOr<EvalResult> expected = cpu->Evaluate(batch.View());
        absl::StatusOr<EvalResult> actual = gpu->Evaluate(batch.View());
        ASSERT_TRUE(expected.ok()) << expected.status();
        ASSERT_TRUE(actual.ok()) << actual.status();
        EXPECT_EQ(actual->count, count);
        EXPECT_NEAR(actual->loss_sum, expected->loss_sum,
                    LossTolerance(GetParam()) * expected->loss_sum)
            << "count " << count << " features " << float_features;
        // Near-ties may flip an argmax under different rounding.
        EXPECT_NEAR(actual->correct, expected->correct, GetParam() == Precision::kFp32 ? 1 : 2);
      }
    }
  }
}

TEST_P(CudaNetworkTest, FashionCnnStepsTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(FashionCnn(GetParam()), 4, 0.05);
}

TEST_P(CudaNetworkTest, GeluAndDropoutStepsTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(GeluDropoutNet(GetParam()), 5, 0.05);
}

// A Dropout after Flatten draws the cpu's mask (the cpu hashes the image's NHWC positions there).
TEST(CudaNetworkDropoutTest, DropoutAfterFlattenTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = AdamWClipNet(Precision::kFp32);
  config.layers = {Conv(5, 3, 1, 0), Of(Kind::kRelu), Of(Kind::kFlatten), Dropout(0.5f), Linear(4)};
  config.optimizer = OptimizerConfig{};
  ExpectTrainingTracksCpu(config, 3, 0.05);
}

TEST_P(CudaNetworkTest, AdamWWithDecayAndClippingTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  ExpectTrainingTracksCpu(AdamWClipNet(GetParam()), 4, 3e-3,
                          /*compare_updates=*/GetParam() == Precision::kFp32);
}

TEST_P(CudaNetworkTest, NesterovWithoutClippingTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = AdamWClipNet(GetParam());
  config.optimizer = OptimizerConfig{};
  config.optimizer.learning_rate = 0.05;
  config.optimizer.momentum = 0.8;
  config.optimizer.nesterov = true;
  config.optimizer.weight_decay = 1e-3;
  ExpectTrainingTracksCpu(config, 3, 0.05);
}

// A checkpoint written by the cpu loads into the cuda model and reads back unchanged, and the
// other way round; the next step then agrees.
TEST_P(CudaNetworkTest, CheckpointsMoveBetweenBackends) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  for (NetworkConfig config : {GeluDropoutNet(GetParam()), AdamWClipNet(GetParam())}) {
    cuda_testing::ExpectCheckpointsMoveBetweenBackends(
        config, {.learning_rate = config.optimizer.learning_rate,
                 .loss_tolerance = LossTolerance(GetParam()),
                 .update_tolerance = UpdateTolerance(GetParam())});
  }
}

// Parameters and optimizer state (momentum or moments, step counters that drive AdamW's bias
// correction and the dropout masks, fp16's loss scale) make a resumed run continue exactly.
TEST_P(CudaNetworkTest, ResumeContinuesExactly) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  for (NetworkConfig config : {GeluDropoutNet(GetParam()), AdamWClipNet(GetParam())}) {
    cuda_testing::ExpectResumeContinuesExactly(config,
                                               {.learning_rate = config.optimizer.learning_rate});
  }
}

// GeluDropoutNet on [3, 9, 9] images with a scale and shift per channel (ImageNet's mean and std):
// Evaluate matches the cpu and the same network fed the batches pre-normalised on the host; steps
// on pixels (alternating with float batches) track the cpu.
TEST_P(CudaNetworkTest, PerChannelNormalisationTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = GeluDropoutNet(GetParam());
  config.input_scale = {1 / (255 * 0.229f), 1 / (255 * 0.224f), 1 / (255 * 0.225f)};
  config.input_shift = {-0.485f / 0.229f, -0.456f / 0.224f, -0.406f / 0.225f};
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  const ChannelNormalization norm = InputNormalization(config);
  for (const int count : {config.max_batch, 7}) {
    const Batch batch = RandomBatch(config, count, 2000 + count);
    absl::StatusOr<EvalResult> expected = cpu->Evaluate(batch.View());
    absl::StatusOr<EvalResult> actual = gpu->Evaluate(batch.View());
    absl::StatusOr<EvalResult> floats = gpu->Evaluate(Normalized(batch, norm).View());
    ASSERT_TRUE(expected.ok() && actual.ok() && floats.ok()) << actual.status();
    EXPECT_NEAR(actual->loss_sum, expected->loss_sum,
                LossTolerance(GetParam()) * expected->loss_sum);
    EXPECT_NEAR(actual->loss_sum, floats->loss_sum, 1e-6 * floats->loss_sum);
  }
  ExpectTrainingTracksCpu(config, 4, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaNetworkTest, cuda_testing::AllPrecisions(),
                         cuda_testing::PrecisionParamName);

// An MLP that needs the network (Nesterov, AdamW, clipping, fp16) runs as one on both backends,
// with the MLP's tensor names, and the two agree.
TEST(CudaNetworkMlpTest, MlpNeedingNetworkRoutesLikeCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    MlpConfig config = TestMlp(30, {24, 12}, 6, 20, /*seed=*/3, precision);
    config.optimizer.nesterov = true;
    config.optimizer.weight_decay = 1e-3;
    config.optimizer.clip_grad_norm = precision == Precision::kFp32 ? 0.5 : 0.0;
    ASSERT_TRUE(MlpNeedsNetwork(config));
    absl::StatusOr<std::unique_ptr<Backend>> cpu_backend = CreateCpuBackend();
    ASSERT_TRUE(cpu_backend.ok());
    absl::StatusOr<std::unique_ptr<Model>> cpu = (*cpu_backend)->CreateMlp(config);
    std::unique_ptr<Backend> gpu_backend = CudaBackend();
    ASSERT_TRUE(cpu.ok() && gpu_backend);
    absl::StatusOr<std::unique_ptr<Model>> gpu = gpu_backend->CreateMlp(config);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const std::vector<NamedTensor> initial = (*cpu)->Parameters();
    ExpectTensorsNear((*gpu)->Parameters(), initial, 0.0, "initial MLP parameters");
    EXPECT_EQ(initial[2].name, "layers.1.weight");
    NetworkConfig as_network = NetworkFromMlp(config);
    for (int step = 0; step < 3; ++step) {
      const Batch batch = RandomBatch(as_network, config.max_batch, 500 + step);
      absl::StatusOr<StepResult> expected = (*cpu)->TrainStep(batch.View(), 0.05);
      absl::StatusOr<StepResult> actual = (*gpu)->TrainStep(batch.View(), 0.05);
      ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
      EXPECT_NEAR(actual->loss, expected->loss, LossTolerance(precision) * expected->loss);
    }
    ExpectTensorsNear(Delta((*gpu)->Parameters(), initial), Delta((*cpu)->Parameters(), initial),
                      UpdateTolerance(precision), "MLP updates");
    ExpectTensorsNear((*gpu)->OptimizerState(), (*cpu)->OptimizerState(),
                      UpdateTolerance(precision), "MLP optimizer state");
  }
}

// fp16 with a large loss scale (2^18: scaled conv weight gradients above 65504 / 2^18 = 0.25
// would overflow fp16; the logits' scaled gradient stays below 2^18 / 32 = 8192): the cuda
// network computes conv weight gradients unscaled and widens them, so it skips exactly the steps
// the cpu (fp32 gradients) skips, and tracks it.
TEST(CudaNetworkFp16Test, LargeLossScaleTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = FashionCnn(Precision::kFp16);
  config.loss_scale.initial = 262144.0f;
  ExpectTrainingTracksCpu(config, 3, 0.05);
}

// GradScaler: an injected inf skips the step on both backends (no parameter, momentum or
// optimizer.step change) and halves the scale; clean steps grow it every growth_interval.
TEST(CudaNetworkFp16Test, InjectedInfSkipsStepAndHalvesScale) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  NetworkConfig config = GeluDropoutNet(Precision::kFp16);
  config.loss_scale.initial = 1024.0f;
  config.loss_scale.growth_interval = 2;
  std::unique_ptr<Model> cpu = CpuNetwork(config);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(cpu && gpu);
  const Batch batch = RandomBatch(config, config.max_batch, 600);
  ASSERT_TRUE(gpu->TrainStep(batch.View(), 0.05).ok());
  ASSERT_TRUE(cpu->TrainStep(batch.View(), 0.05).ok());
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  const std::vector<NamedTensor> state = gpu->OptimizerState();
  ASSERT_TRUE(gpu->InjectGradientForTest(std::numeric_limits<float>::infinity()).ok());
  ASSERT_TRUE(cpu->InjectGradientForTest(std::numeric_limits<float>::infinity()).ok());
  absl::StatusOr<StepResult> skipped = gpu->TrainStep(batch.View(), 0.05);
  absl::StatusOr<StepResult> cpu_skipped = cpu->TrainStep(batch.View(), 0.05);
  ASSERT_TRUE(skipped.ok() && cpu_skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_TRUE(cpu_skipped->skipped);
  EXPECT_TRUE(std::isfinite(skipped->loss));  // the forward pass was fine
  EXPECT_EQ(skipped->loss_scale, 512.0f);
  EXPECT_EQ(cpu_skipped->loss_scale, 512.0f);
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "skipped step's parameters");
  const std::vector<NamedTensor> after = gpu->OptimizerState();
  ASSERT_EQ(after.size(), state.size());
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i].name == "train_step" || after[i].name == "loss_scale") continue;
    EXPECT_TRUE(after[i].values == state[i].values) << "skipped step changed " << after[i].name;
  }
  EXPECT_EQ(Find(after, "optimizer.step")->values, std::vector<float>{1.0f});
  EXPECT_EQ(Find(after, "train_step")->values, std::vector<float>{2.0f});
  EXPECT_EQ(Find(after, "loss_scale")->values, (std::vector<float>{512.0f, 0.0f}));
  ExpectTensorsNear(after, cpu->OptimizerState(), 2e-2, "state after the skip, against cpu");

  const float expected_scales[4] = {512, 1024, 1024, 2048};
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<StepResult> result =
        gpu->TrainStep(RandomBatch(config, config.max_batch, 610 + step).View(), 0.01);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_FALSE(result->skipped) << "step " << step;
    EXPECT_EQ(result->loss_scale, expected_scales[step]) << "step " << step;
  }
}

TEST(CudaNetworkErrorsTest, RefusesBadConfigsBatchesAndTensors) {
  SKIP_WITHOUT_DEVICE();
  SKIP_WITHOUT_CUDNN();
  std::unique_ptr<Backend> backend = CudaBackend();
  ASSERT_TRUE(backend);
  NetworkConfig bad = GeluDropoutNet(Precision::kFp32);
  bad.layers[0] = Conv(6, 12, 1, 0);  // kernel larger than the 9x9 input
  absl::StatusOr<std::unique_ptr<Model>> refused = backend->CreateNetwork(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("layers[0]"), std::string::npos) << refused.status();
  bad = GeluDropoutNet(Precision::kFp32);
  bad.layers.back() = Linear(3);  // not `classes` logits
  EXPECT_EQ(backend->CreateNetwork(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = GeluDropoutNet(Precision::kFp32);
  bad.optimizer.nesterov = true;
  bad.optimizer.momentum = 0;
  EXPECT_EQ(backend->CreateNetwork(bad).status().code(), absl::StatusCode::kInvalidArgument);

  const NetworkConfig config = GeluDropoutNet(Precision::kFp32);
  std::unique_ptr<Model> gpu = CudaNetwork(config);
  ASSERT_TRUE(gpu);
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  Batch batch = RandomBatch(config, 8, 700);
  batch.labels[3] = static_cast<uint8_t>(config.classes);
  EXPECT_EQ(gpu->TrainStep(batch.View(), 0.05).status().code(), absl::StatusCode::kInvalidArgument);
  batch.labels[3] = 0;
  EXPECT_EQ(gpu->TrainStep(batch.View(), -1.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->TrainStep(batch.View(), std::nan("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  batch.count = config.max_batch + 1;
  EXPECT_EQ(gpu->Evaluate(batch.View()).status().code(), absl::StatusCode::kInvalidArgument);
  batch.count = 0;
  EXPECT_EQ(gpu->Evaluate(batch.View()).status().code(), absl::StatusCode::kInvalidArgument);
  BatchView empty;
  empty.count = 4;
  EXPECT_EQ(gpu->TrainStep(empty, 0.05).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "after refused batches");

  std::vector<NamedTensor> wrong = parameters;
  wrong[0].name = "wrong";
  EXPECT_EQ(gpu->SetParameters(wrong).code(), absl::StatusCode::kInvalidArgument);
  wrong = parameters;
  wrong[1].values.pop_back();
  EXPECT_EQ(gpu->SetParameters(wrong).code(), absl::StatusCode::kInvalidArgument);
  std::vector<NamedTensor> state = gpu->OptimizerState();
  state.back().values[0] = -1;  // train_step
  EXPECT_EQ(gpu->SetOptimizerState(state).code(), absl::StatusCode::kInvalidArgument);
  state.pop_back();
  EXPECT_EQ(gpu->SetOptimizerState(state).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaNetworkBuildTest, WithoutCudnnNetworksAreUnimplemented) {
  SKIP_WITHOUT_DEVICE();
#ifdef STOKER_HAVE_CUDNN
  // Built with cuDNN (not a skip: tests/gpu/check.sh fails on any): the network is built.
  std::unique_ptr<Backend> backend = CudaBackend();
  ASSERT_TRUE(backend);
  EXPECT_TRUE(backend->CreateNetwork(GeluDropoutNet(Precision::kFp32)).ok());
#else
  std::unique_ptr<Backend> backend = CudaBackend();
  ASSERT_TRUE(backend);
  absl::StatusOr<std::unique_ptr<Model>> model =
      backend->CreateNetwork(GeluDropoutNet(Precision::kFp32));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("built without cuDNN"), std::string::npos);
#endif
}

}  // namespace
}  // namespace stoker
