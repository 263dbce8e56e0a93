// The cuda backend against the cpu backend (the reference for every GPU result) on fresh random
// inputs: forward loss, one and two optimizer steps (parameters and momentum), Evaluate, 20 steps
// of training, in fp32 (tolerance 1e-4: cuBLASLt runs with CUBLAS_COMPUTE_32F, no TF32) and bf16
// (1e-2), with the fused cuBLASLt epilogues and with the fallback kernels; fp16 loss scaling
// (skip and halve on overflow, growth after N clean steps); per-channel input normalisation;
// that the fast paths (fused epilogues, CUDA graph replays) really ran where they must
// (GetCudaModelCounters). Every test but the first
// two skips without a device (fails with STOKER_REQUIRE_CUDA=1); the first checks the clean
// failure on machines without one, and the calls that succeed on machines with one.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_test_util.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using cuda_testing::Batch;
using cuda_testing::Counters;
using cuda_testing::CpuMlp;
using cuda_testing::CudaMlp;
using cuda_testing::Delta;
using cuda_testing::ExpectTensorsNear;
using cuda_testing::Normalized;
using cuda_testing::RandomBatch;

MlpConfig TestConfig(Precision precision) {
  MlpConfig config = test_layers::TestMlp(40, {64, 32}, 10, 64, /*seed=*/11, precision);
  config.optimizer.learning_rate = 0.05;
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 1e-3;
  return config;
}

// All the fast-path counters of a model, for failure messages.
std::string Describe(const CudaModelCounters& c) {
  std::string text = "fused_gemms=" + std::to_string(c.fused_gemms) +
                     " plain_gemms=" + std::to_string(c.plain_gemms) +
                     " graph_replays=" + std::to_string(c.graph_replays) +
                     " eager_steps=" + std::to_string(c.eager_steps) +
                     " graph_captures=" + std::to_string(c.graph_captures);
  for (const std::string& reason : c.fallbacks) text += "\n  fallback: " + reason;
  return text;
}

TEST(CudaBackendNoDeviceTest, FailsCleanlyWithoutDevice) {
  if (CudaDeviceCount() > 0) {
    // Not a skip (tests/gpu/check.sh fails on any): with a device the same calls succeed, and a
    // device index out of range is refused.
    EXPECT_TRUE(CudaDeviceStatus().ok()) << CudaDeviceStatus();
    EXPECT_TRUE(CreateCudaBackend(0).ok());
    EXPECT_EQ(CreateCudaBackend(CudaDeviceCount()).status().code(),
              absl::StatusCode::kInvalidArgument);
    return;
  }
  EXPECT_EQ(CudaDeviceCount(), 0);
  const absl::Status device = CudaDeviceStatus();
  EXPECT_EQ(device.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(device.message().find("no CUDA device"), std::string::npos) << device;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(backend.status().message().find("no CUDA device"), std::string::npos);
  std::vector<uint8_t> region(4096);
  EXPECT_EQ(RegisterHostRegion(region.data(), region.size()).code(),
            absl::StatusCode::kFailedPrecondition);
  // Asking twice gives the same answer: the first failure left no sticky error behind.
  EXPECT_EQ(CudaDeviceCount(), 0);
}

// Anywhere: only the cuda backend's models have counters.
TEST(CudaModelCountersTest, CpuModelHasNone) {
  std::unique_ptr<Model> cpu = CpuMlp(TestConfig(Precision::kFp32));
  ASSERT_TRUE(cpu);
  EXPECT_EQ(GetCudaModelCounters(*cpu).status().code(), absl::StatusCode::kInvalidArgument);
}

// (precision, fused epilogues)
class CudaConformanceTest : public ::testing::TestWithParam<std::tuple<Precision, bool>> {
 protected:
  Precision precision() const { return std::get<0>(GetParam()); }
  CudaBackendOptions options() const {
    CudaBackendOptions options;
    options.fused_epilogues = std::get<1>(GetParam());
    return options;
  }
  double tolerance() const { return precision() == Precision::kFp32 ? 1e-4 : 1e-2; }
};

TEST_P(CudaConformanceTest, InitialParametersMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(cpu && gpu);
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), 0.0, "initial parameters");
  ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), 0.0, "initial momentum");
}

TEST_P(CudaConformanceTest, EvaluateMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(cpu && gpu);
  for (const bool float_features : {false, true}) {
    for (const int count : {64, 37}) {
      const Batch batch =
          RandomBatch(count, config.input_features, config.classes, 1000 + count, float_features);
      absl::StatusOr<EvalResult> expected = cpu->Evaluate(batch.View());
      absl::StatusOr<EvalResult> actual = gpu->Evaluate(batch.View());
      ASSERT_TRUE(expected.ok()) << expected.status();
      ASSERT_TRUE(actual.ok()) << actual.status();
      EXPECT_EQ(actual->count, count);
      EXPECT_NEAR(actual->loss_sum, expected->loss_sum, tolerance() * expected->loss_sum)
          << "count " << count << " features " << float_features;
      // Near-ties may flip an argmax under different rounding.
      EXPECT_NEAR(actual->correct, expected->correct, precision() == Precision::kFp32 ? 1 : 3);
    }
  }
}

TEST_P(CudaConformanceTest, TwoStepsMatchCpuParametersAndMomentum) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(cpu && gpu);
  const std::vector<NamedTensor> initial = cpu->Parameters();
  // A full batch, then a partial one (a second GEMM plan) with float features.
  const Batch batches[2] = {RandomBatch(64, config.input_features, config.classes, 7),
                            RandomBatch(29, config.input_features, config.classes, 8, true)};
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batches[step].View(), 0.05);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batches[step].View(), 0.05);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, tolerance() * expected->loss) << "step " << step;
    EXPECT_FALSE(actual->skipped);
    EXPECT_EQ(actual->loss_scale, 1.0f);
    const std::string what = "step " + std::to_string(step);
    ExpectTensorsNear(Delta(gpu->Parameters(), initial), Delta(cpu->Parameters(), initial),
                      tolerance(), what + " update");
    ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), tolerance(),
                      what + " momentum");
  }
}

TEST_P(CudaConformanceTest, TwentyStepsOfTrainingTrackCpu) {
  SKIP_WITHOUT_DEVICE();
  MlpConfig config = TestConfig(precision());
  config.input_features = 784;
  config.hidden = {256, 128};
  config.max_batch = 128;
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(cpu && gpu);
  // A learnable problem, so the loss moves: the label is a function of the sample.
  std::vector<Batch> batches;
  for (int b = 0; b < 4; ++b) {
    Batch batch = RandomBatch(128, config.input_features, config.classes, 50 + b);
    for (int s = 0; s < batch.count; ++s) batch.labels[s] = batch.samples[s * 784] % 10;
    batches.push_back(std::move(batch));
  }
  const double tolerance = precision() == Precision::kFp32 ? 1e-4 : 3e-2;
  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < 20; ++step) {
    const BatchView view = batches[step % batches.size()].View();
    absl::StatusOr<StepResult> expected = cpu->TrainStep(view, 0.02);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(view, 0.02);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, tolerance * expected->loss) << "step " << step;
    if (step == 0) first_loss = actual->loss;
    last_loss = actual->loss;
  }
  EXPECT_LT(last_loss, first_loss);
  ExpectTensorsNear(gpu->Parameters(), cpu->Parameters(), tolerance, "after 20 steps");
  const Batch held_out = RandomBatch(128, config.input_features, config.classes, 99);
  absl::StatusOr<EvalResult> expected = cpu->Evaluate(held_out.View());
  absl::StatusOr<EvalResult> actual = gpu->Evaluate(held_out.View());
  ASSERT_TRUE(expected.ok() && actual.ok());
  EXPECT_NEAR(actual->loss_sum, expected->loss_sum, tolerance * expected->loss_sum);
}

TEST_P(CudaConformanceTest, ResumeFromParametersAndOptimizerState) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> first = CudaMlp(config, options());
  std::unique_ptr<Model> second = CudaMlp(config, options());
  ASSERT_TRUE(first && second);
  const Batch batch = RandomBatch(64, config.input_features, config.classes, 3);
  ASSERT_TRUE(first->TrainStep(batch.View(), 0.05).ok());
  ASSERT_TRUE(second->SetParameters(first->Parameters()).ok());
  ASSERT_TRUE(second->SetOptimizerState(first->OptimizerState()).ok());
  const Batch next = RandomBatch(64, config.input_features, config.classes, 4);
  ASSERT_TRUE(first->TrainStep(next.View(), 0.05).ok());
  ASSERT_TRUE(second->TrainStep(next.View(), 0.05).ok());
  ExpectTensorsNear(second->Parameters(), first->Parameters(), 1e-6, "resumed");
  ExpectTensorsNear(second->OptimizerState(), first->OptimizerState(), 1e-6, "resumed momentum");
}

// Results cannot tell a fused epilogue or a graph replay from its fallback, so count them: the
// first step of a batch size runs kernel by kernel (the warm-up), the next ones replay a graph
// captured from the second on. On sm_90 (the H100/H200 the service targets) in bf16 the fused
// variant must fuse and replay; elsewhere a fallback is allowed but logged.
TEST_P(CudaConformanceTest, FastPathsRunWhereExpected) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(gpu);
  for (int step = 0; step < 3; ++step) {
    const Batch batch = RandomBatch(64, config.input_features, config.classes, 60 + step);
    ASSERT_TRUE(gpu->TrainStep(batch.View(), 0.05).ok());
  }
  const CudaModelCounters counters = Counters(*gpu);
  EXPECT_EQ(counters.graph_replays + counters.eager_steps, 3) << Describe(counters);
  EXPECT_GE(counters.eager_steps, 1) << "the first step must run eagerly\n" << Describe(counters);
  EXPECT_GT(counters.fused_gemms + counters.plain_gemms, 0) << Describe(counters);
  if (!options().fused_epilogues) {
    EXPECT_EQ(counters.fused_gemms, 0) << Describe(counters);
  }
  if (cuda_testing::DeviceComputeCapability() == 90 && precision() == Precision::kBf16) {
    EXPECT_EQ(counters.eager_steps, 1) << Describe(counters);
    EXPECT_EQ(counters.graph_replays, 2) << Describe(counters);
    if (options().fused_epilogues) {
      // Some shapes may still fall back (logged, listed here); none fusing at all is a bug.
      EXPECT_GT(counters.fused_gemms, 0) << Describe(counters);
    }
  }
}

TEST_P(CudaConformanceTest, RejectsBadInput) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = TestConfig(precision());
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  ASSERT_TRUE(gpu);
  Batch batch = RandomBatch(8, config.input_features, config.classes, 5);
  batch.labels[3] = 10;
  EXPECT_EQ(gpu->TrainStep(batch.View(), 0.05).status().code(), absl::StatusCode::kInvalidArgument);
  batch.labels[3] = 0;
  batch.count = 65;
  EXPECT_EQ(gpu->Evaluate(batch.View()).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<NamedTensor> parameters = gpu->Parameters();
  parameters[0].name = "wrong";
  EXPECT_EQ(gpu->SetParameters(parameters).code(), absl::StatusCode::kInvalidArgument);
}

// 48 inputs as 3 channels of 16 values, each with its own scale and shift.
MlpConfig ThreeChannelConfig(Precision precision) {
  MlpConfig config = TestConfig(precision);
  config.input_features = 48;
  config.input_channels = 3;
  config.input_scale = {1 / 58.4f, 1 / 57.1f, 1 / 57.4f};
  config.input_shift = {-2.12f, -2.04f, -1.8f};
  return config;
}

// Per-channel normalisation on the MLP fast path (the per-plane kernel, captured in the CUDA
// graphs of the later steps): Evaluate and four steps (full and partial batches) track the cpu,
// and the model fed pixels agrees with a second cuda model fed the same batches pre-normalised
// on the host, far closer than a mix-up of channels would allow.
TEST_P(CudaConformanceTest, PerChannelNormalisationTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = ThreeChannelConfig(precision());
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config, options());
  std::unique_ptr<Model> gpu_floats = CudaMlp(config, options());
  ASSERT_TRUE(cpu && gpu && gpu_floats);
  const ChannelNormalization norm = InputNormalization(config);
  for (const int count : {64, 37}) {
    const Batch batch = RandomBatch(count, config.input_features, config.classes, 300 + count);
    absl::StatusOr<EvalResult> expected = cpu->Evaluate(batch.View());
    absl::StatusOr<EvalResult> actual = gpu->Evaluate(batch.View());
    absl::StatusOr<EvalResult> floats = gpu_floats->Evaluate(Normalized(batch, norm).View());
    ASSERT_TRUE(expected.ok() && actual.ok() && floats.ok()) << actual.status();
    EXPECT_NEAR(actual->loss_sum, expected->loss_sum, tolerance() * expected->loss_sum);
    EXPECT_NEAR(actual->loss_sum, floats->loss_sum, 1e-6 * floats->loss_sum);
  }
  const std::vector<NamedTensor> initial = cpu->Parameters();
  for (int step = 0; step < 4; ++step) {
    const Batch batch =
        RandomBatch(step == 2 ? 29 : 64, config.input_features, config.classes, 310 + step);
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> floats = gpu_floats->TrainStep(Normalized(batch, norm).View(), 0.05);
    ASSERT_TRUE(expected.ok() && actual.ok() && floats.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, tolerance() * expected->loss) << "step " << step;
    const std::string what = "step " + std::to_string(step);
    ExpectTensorsNear(Delta(gpu->Parameters(), initial), Delta(cpu->Parameters(), initial),
                      tolerance(), what + " update");
    ExpectTensorsNear(gpu->Parameters(), gpu_floats->Parameters(), 1e-6,
                      what + " pixels against pre-normalised floats");
  }
}

INSTANTIATE_TEST_SUITE_P(PrecisionsAndEpilogues, CudaConformanceTest,
                         ::testing::Combine(::testing::Values(Precision::kFp32, Precision::kBf16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Precision, bool>>& info) {
                           return std::string(PrecisionName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_fused" : "_unfused");
                         });

// A captured step replays the same work: with a learning rate that changes every step (it
// travels in device memory, not in the graph), full and partial batches (one graph per batch
// size), uint8 and float inputs (one graph per input kind) and both staging buffers, the graph
// run's losses, parameters and momentum equal the kernel-by-kernel run's bit for bit.
TEST(CudaGraphTest, GraphStepsEqualKernelByKernelSteps) {
  SKIP_WITHOUT_DEVICE();
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const MlpConfig config = TestConfig(precision);
    CudaBackendOptions eager_options;
    eager_options.cuda_graphs = false;
    std::unique_ptr<Model> graphed = CudaMlp(config);
    std::unique_ptr<Model> eager = CudaMlp(config, eager_options);
    ASSERT_TRUE(graphed && eager);
    for (int step = 0; step < 12; ++step) {
      const int count = step % 3 == 2 ? 29 : 64;
      const Batch batch =
          RandomBatch(count, config.input_features, config.classes, 200 + step, step % 4 == 3);
      const double rate = 0.05 * (1.0 + std::cos(3.14159 * step / 12.0)) / 2.0;
      absl::StatusOr<StepResult> a = graphed->TrainStep(batch.View(), rate);
      absl::StatusOr<StepResult> b = eager->TrainStep(batch.View(), rate);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->loss, b->loss) << PrecisionName(precision) << " step " << step;
    }
    // Otherwise this test compares eager with eager: the graphed model must have replayed.
    const CudaModelCounters graphed_counters = Counters(*graphed);
    EXPECT_GT(graphed_counters.graph_replays, 0) << PrecisionName(precision) << "\n"
                                                 << Describe(graphed_counters);
    EXPECT_EQ(Counters(*eager).graph_replays, 0);
    const std::vector<NamedTensor> pa = graphed->Parameters(), pb = eager->Parameters();
    const std::vector<NamedTensor> sa = graphed->OptimizerState(), sb = eager->OptimizerState();
    ASSERT_EQ(pa.size(), pb.size());
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(pa[i].values == pb[i].values) << PrecisionName(precision) << " " << pa[i].name;
    }
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_TRUE(sa[i].values == sb[i].values) << PrecisionName(precision) << " " << sa[i].name;
    }
  }
}

// Odd, tiny shapes (no multiple of 8 anywhere), as in the cpu backend's own tests.
TEST(CudaConformanceOddShapesTest, Fp32StepMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const MlpConfig config = test_layers::OddShapedMlp();
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config);
  ASSERT_TRUE(cpu && gpu);
  const Batch batch = RandomBatch(5, 6, 3, 101);
  absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.1);
  absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.1);
  ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
  EXPECT_NEAR(actual->loss, expected->loss, 1e-4 * expected->loss);
  ExpectTensorsNear(gpu->OptimizerState(), cpu->OptimizerState(), 1e-4, "momentum");
}

// The ".momentum" tensors of an optimizer state. An fp16 MLP runs as a network where cuDNN is
// built in (MlpNeedsNetwork, as on the cpu), whose state also holds "optimizer.step",
// "train_step" and "loss_scale"; the fast path's holds the momentum and "loss_scale".
std::vector<NamedTensor> MomentumOnly(const std::vector<NamedTensor>& state) {
  std::vector<NamedTensor> momentum;
  for (const NamedTensor& tensor : state) {
    const std::string& name = tensor.name;
    if (name.size() > 9 && name.compare(name.size() - 9, 9, ".momentum") == 0) {
      momentum.push_back(tensor);
    }
  }
  return momentum;
}

// fp16 has no cpu twin: it is checked against the cpu fp32 model, within fp16's rounding.
TEST(CudaFp16Test, StepCloseToCpuFp32) {
  SKIP_WITHOUT_DEVICE();
  MlpConfig config = TestConfig(Precision::kFp32);
  std::unique_ptr<Model> cpu = CpuMlp(config);
  config.precision = Precision::kFp16;
  std::unique_ptr<Model> gpu = CudaMlp(config);
  ASSERT_TRUE(cpu && gpu);
  const Batch batch = RandomBatch(64, config.input_features, config.classes, 21);
  absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.05);
  absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.05);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_FALSE(actual->skipped);
  EXPECT_EQ(actual->loss_scale, 65536.0f);
  EXPECT_NEAR(actual->loss, expected->loss, 1e-2 * expected->loss);
  std::vector<NamedTensor> state = gpu->OptimizerState();
  ASSERT_FALSE(state.empty());
  EXPECT_EQ(state.back().name, "loss_scale");
  ExpectTensorsNear(MomentumOnly(state), MomentumOnly(cpu->OptimizerState()), 1e-2,
                    "fp16 momentum");
}

TEST(CudaFp16Test, OverflowSkipsStepAndHalvesScale) {
  SKIP_WITHOUT_DEVICE();
  MlpConfig config = TestConfig(Precision::kFp16);
  std::unique_ptr<Model> gpu = CudaMlp(config);
  ASSERT_TRUE(gpu);
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  const std::vector<NamedTensor> momentum = gpu->OptimizerState();
  // An infinite feature: the forward pass, the loss and the gradients all go non-finite.
  Batch poisoned = RandomBatch(64, config.input_features, config.classes, 31, true);
  poisoned.features[5] = std::numeric_limits<float>::infinity();
  absl::StatusOr<StepResult> skipped = gpu->TrainStep(poisoned.View(), 0.05);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(skipped->loss_scale, 32768.0f);
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "skipped step's parameters");
  // The loss scale did change (and a network's train_step counts the skipped step too).
  ExpectTensorsNear(MomentumOnly(gpu->OptimizerState()), MomentumOnly(momentum), 0.0,
                    "skipped step's momentum");

  const Batch clean = RandomBatch(64, config.input_features, config.classes, 32);
  absl::StatusOr<StepResult> result = gpu->TrainStep(clean.View(), 0.05);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->skipped);
  EXPECT_EQ(result->loss_scale, 32768.0f);
  EXPECT_TRUE(std::isfinite(result->loss));
}

TEST(CudaFp16Test, InjectedInfGradientSkipsStepAndHalvesScale) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Model> gpu = CudaMlp(TestConfig(Precision::kFp16));
  ASSERT_TRUE(gpu);
  const Batch batch = RandomBatch(64, 40, 10, 33);
  ASSERT_TRUE(gpu->TrainStep(batch.View(), 0.05).ok());
  const std::vector<NamedTensor> parameters = gpu->Parameters();
  ASSERT_TRUE(gpu->InjectGradientForTest(std::numeric_limits<float>::infinity()).ok());
  absl::StatusOr<StepResult> skipped = gpu->TrainStep(batch.View(), 0.05);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_TRUE(std::isfinite(skipped->loss));  // the forward pass was fine
  EXPECT_EQ(skipped->loss_scale, 32768.0f);
  ExpectTensorsNear(gpu->Parameters(), parameters, 0.0, "skipped step's parameters");
  // The optimizer state carries the scale: {scale, clean steps}.
  const std::vector<NamedTensor> state = gpu->OptimizerState();
  ASSERT_FALSE(state.empty());
  EXPECT_EQ(state.back().name, "loss_scale");
  EXPECT_EQ(state.back().values, (std::vector<float>{32768.0f, 0.0f}));
}

TEST(CudaFp16Test, ScaleGrowsAfterIntervalOfCleanSteps) {
  SKIP_WITHOUT_DEVICE();
  MlpConfig config = TestConfig(Precision::kFp16);
  config.loss_scale.growth_interval = 3;
  config.loss_scale.initial = 1024.0f;
  std::unique_ptr<Model> gpu = CudaMlp(config);
  ASSERT_TRUE(gpu);
  const float expected_scales[7] = {1024, 1024, 2048, 2048, 2048, 4096, 4096};
  for (int step = 0; step < 7; ++step) {
    const Batch batch = RandomBatch(64, 40, 10, 40 + step);
    absl::StatusOr<StepResult> result = gpu->TrainStep(batch.View(), 0.01);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_FALSE(result->skipped) << "step " << step;
    EXPECT_EQ(result->loss_scale, expected_scales[step]) << "step " << step;
  }
}

// An fp16 MLP (a network where cuDNN is built in, else the fast path) on a flat input of 3
// channels, each with its own values, tracks the cpu.
TEST(CudaFp16Test, PerChannelNormalisationTracksCpu) {
  SKIP_WITHOUT_DEVICE();
  MlpConfig config;
  config.input_features = 3 * 10;
  config.input_channels = 3;
  config.input_scale = {1 / 50.0f, 1 / 60.0f, 1 / 70.0f};
  config.input_shift = {-2.5f, -2.0f, -1.5f};
  config.hidden = {24};
  config.classes = 6;
  config.max_batch = 20;
  config.precision = Precision::kFp16;
  ASSERT_TRUE(MlpNeedsNetwork(config));
  std::unique_ptr<Model> cpu = CpuMlp(config);
  std::unique_ptr<Model> gpu = CudaMlp(config);
  ASSERT_TRUE(cpu && gpu);
  const std::vector<NamedTensor> initial = cpu->Parameters();
  for (int step = 0; step < 3; ++step) {
    const Batch batch =
        RandomBatch(config.max_batch, config.input_features, config.classes, 600 + step);
    absl::StatusOr<StepResult> expected = cpu->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> actual = gpu->TrainStep(batch.View(), 0.05);
    ASSERT_TRUE(expected.ok() && actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, 1e-2 * expected->loss) << "step " << step;
  }
  ExpectTensorsNear(Delta(gpu->Parameters(), initial), Delta(cpu->Parameters(), initial), 2e-2,
                    "fp16 MLP updates");
}

TEST(CudaHostRegionTest, RegisterAndUnregister) {
  SKIP_WITHOUT_DEVICE();
  std::vector<uint8_t> region(1 << 20);
  ASSERT_TRUE(RegisterHostRegion(region.data(), region.size()).ok());
  EXPECT_FALSE(RegisterHostRegion(region.data(), region.size()).ok());  // already registered
  EXPECT_TRUE(UnregisterHostRegion(region.data()).ok());
}

// The trainer's ring: unregistered when the holder goes, so the mapping can be unmapped.
TEST(CudaHostRegionTest, PinnedHostRegionUnregistersOnDestruction) {
  SKIP_WITHOUT_DEVICE();
  std::vector<uint8_t> region(1 << 20);
  {
    PinnedHostRegion pinned;
    ASSERT_TRUE(pinned.Register(region.data(), region.size()).ok());
    EXPECT_TRUE(pinned.pinned());
    EXPECT_FALSE(RegisterHostRegion(region.data(), region.size()).ok());  // held
    PinnedHostRegion moved = std::move(pinned);
    EXPECT_TRUE(moved.pinned());
  }
  // Registering again works only because the destructor unregistered it.
  ASSERT_TRUE(RegisterHostRegion(region.data(), region.size()).ok());
  EXPECT_TRUE(UnregisterHostRegion(region.data()).ok());
  PinnedHostRegion released;
  ASSERT_TRUE(released.Register(region.data(), region.size()).ok());
  EXPECT_TRUE(released.Release().ok());
  EXPECT_FALSE(released.pinned());
  EXPECT_TRUE(released.Release().ok());  // nothing held: a no-op
}

}  // namespace
}  // namespace stoker
