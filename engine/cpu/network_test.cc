// The cpu backend's layered networks: every layer's forward and backward against central
// differences of a double reference, conv/pool shapes with padding and stride, bf16 and fp16
// against fp32, dropout, determinism, resume exactness, fp16 loss scaling, and config errors.
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cpu/network_test_util.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace stoker::testing_util;  // NOLINT: test helpers
using namespace stoker::test_layers;   // NOLINT: Conv, Pool, Linear, Of, Dropout

NetworkConfig PlainSgd(NetworkConfig config) {
  config.optimizer.momentum = 0;
  config.optimizer.weight_decay = 0;
  return config;
}

// conv stride 2 pad 1 (7 -> 4), GELU, pool k3 s2 p1 (4 -> 2), Flatten, Linear, ReLU, Linear.
NetworkConfig StridedNet() {
  return TinyNet({2, 7, 7},
                 {Conv(3, 3, 2, 1), Of(Kind::kGelu), Pool(3, 2, 1), Of(Kind::kFlatten), Linear(5),
                  Of(Kind::kRelu), Linear(3)},
                 11);
}

// conv k3 (6 -> 4), ReLU, pool k2 (default stride 2: 4 -> 2), conv k2 pad 1 (2 -> 3), GELU,
// Linear straight off [C, H, W], ReLU, Linear.
NetworkConfig PaddedNet() {
  return TinyNet({1, 6, 6},
                 {Conv(4, 3, 0, 0), Of(Kind::kRelu), Pool(2, 0, 0), Conv(3, 2, 1, 1),
                  Of(Kind::kGelu), Linear(4), Of(Kind::kRelu), Linear(3)},
                 12);
}

// Flat input: Linear, GELU, Dropout(0), Linear.
NetworkConfig FlatNet() {
  return TinyNet({6}, {Linear(5), Of(Kind::kGelu), Dropout(0), Linear(3)}, 13);
}

// Elementwise layers between Flatten and Linear on a multi-channel image: conv k3 pad 1 (3 ch),
// Flatten, GELU, Dropout(0), ReLU, Linear, Linear. The Linear must still see PyTorch's
// [C, H, W] flattened order (this used to fail to build on the cpu).
NetworkConfig FlattenThenElementwiseNet() {
  return TinyNet({2, 4, 4},
                 {Conv(3, 3, 1, 1), Of(Kind::kFlatten), Of(Kind::kGelu), Dropout(0),
                  Of(Kind::kRelu), Linear(5), Linear(3)},
                 14);
}

// Elementwise layers straight on a multi-channel input (kept in the caller's NCHW order):
// ReLU, GELU, Dropout(0), conv k3 pad 1, ReLU, Linear off the image, Linear; and a ReLU then a
// Linear straight off the input.
NetworkConfig ElementwiseOnInputNet() {
  return TinyNet({3, 3, 3},
                 {Of(Kind::kRelu), Of(Kind::kGelu), Dropout(0), Conv(2, 3, 1, 1), Of(Kind::kRelu),
                  Linear(4), Linear(3)},
                 15);
}
NetworkConfig ReluThenLinearOnInputNet() {
  return TinyNet({3, 2, 2}, {Of(Kind::kRelu), Linear(3)}, 16);
}

// The fp32 model's loss (training and Evaluate) and gradient against the double reference and its
// central differences: |g - fd| <= 2e-3 |fd| + 2e-5 per element.
void CheckGradient(const NetworkConfig& config, int count, uint64_t seed) {
  testing_util::CheckGradient(config, count, seed, 2e-3, 2e-5, /*check_evaluate=*/true);
}

TEST(CpuNetworkTest, StridedConvGeluPaddedPoolFlattenGradients) {
  CheckGradient(StridedNet(), 4, 1);
}
TEST(CpuNetworkTest, StridedNetPartialBatchGradients) { CheckGradient(StridedNet(), 3, 2); }
TEST(CpuNetworkTest, PaddedConvReluPoolLinearOnImageGradients) { CheckGradient(PaddedNet(), 4, 3); }
TEST(CpuNetworkTest, FlatGeluDropoutGradients) { CheckGradient(FlatNet(), 4, 4); }
TEST(CpuNetworkTest, ElementwiseLayersAfterFlattenGradients) {
  CheckGradient(FlattenThenElementwiseNet(), 4, 5);
}
TEST(CpuNetworkTest, ElementwiseLayersOnMultiChannelInputGradients) {
  CheckGradient(ElementwiseOnInputNet(), 4, 6);
  CheckGradient(ReluThenLinearOnInputNet(), 4, 7);
}

TEST(CpuNetworkTest, ShapesAndParameterNamesFollowPyTorch) {
  absl::StatusOr<std::vector<std::vector<int>>> shapes = NetworkShapes(StridedNet());
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  const std::vector<std::vector<int>> expected = {{2, 7, 7}, {3, 4, 4}, {3, 4, 4}, {3, 2, 2},
                                                  {12},      {5},       {5},       {3}};
  EXPECT_EQ(*shapes, expected);
  std::unique_ptr<Model> model = MakeNetwork(PaddedNet());
  ASSERT_NE(model, nullptr);
  const std::vector<NamedTensor> params = model->Parameters();
  ASSERT_EQ(params.size(), 8u);
  EXPECT_EQ(params[0].name, "layers.0.weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{4, 1, 3, 3}));
  EXPECT_EQ(params[2].name, "layers.3.weight");
  EXPECT_EQ(params[2].shape, (std::vector<int64_t>{3, 4, 2, 2}));
  EXPECT_EQ(params[4].name, "layers.5.weight");
  EXPECT_EQ(params[4].shape, (std::vector<int64_t>{4, 27}));
  EXPECT_EQ(params[7].name, "layers.7.bias");
  const double bound = 1 / std::sqrt(9.0);
  for (float v : params[0].values) EXPECT_LE(std::abs(v), bound);
  EXPECT_EQ(NetworkForwardFlopsPerSample(PaddedNet()),
            2 * (4 * 16 * 9) + 2 * (3 * 9 * 16) + 2 * 27 * 4 + 2 * 4 * 3);
}

TEST(NetworkFootprintTest, CountsEveryParameterAndActivation) {
  for (const NetworkConfig& config : {StridedNet(), PaddedNet(), FlatNet()}) {
    absl::StatusOr<TrainingFootprint> footprint = EstimateTrainingFootprint(config);
    ASSERT_TRUE(footprint.ok()) << footprint.status();
    int64_t parameters = 0;
    for (const NamedTensor& tensor : InitialNetworkParameters(config)) {
      parameters += static_cast<int64_t>(tensor.values.size());
    }
    EXPECT_EQ(footprint->parameters, parameters);
  }
  // StridedNet's activations: 98 + 48 + 48 + 12 + 12 + 5 + 5 + 3 values per sample.
  NetworkConfig config = StridedNet();
  config.precision = Precision::kBf16;
  config.optimizer.type = OptimizerType::kAdamW;
  absl::StatusOr<TrainingFootprint> footprint = EstimateTrainingFootprint(config);
  ASSERT_TRUE(footprint.ok()) << footprint.status();
  EXPECT_EQ(footprint->activations_per_sample, 98 + 48 + 48 + 12 + 12 + 5 + 5 + 3);
  EXPECT_EQ(footprint->bytes, footprint->parameters * (4 + 4 + 8 + 2) +
                                  config.max_batch * footprint->activations_per_sample * 10);

  // The Fashion-MNIST MLP is tiny; 16 layers of 16384 are not (4.0e9 parameters).
  MlpConfig mlp;
  absl::StatusOr<TrainingFootprint> small = EstimateTrainingFootprint(NetworkFromMlp(mlp));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->parameters, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_TRUE(CheckTrainingFits(*small, int64_t{1} << 30, "this machine", 128).ok());
  mlp.hidden.assign(16, 16384);
  absl::StatusOr<TrainingFootprint> huge = EstimateTrainingFootprint(NetworkFromMlp(mlp));
  ASSERT_TRUE(huge.ok()) << huge.status();
  absl::Status refused = CheckTrainingFits(*huge, int64_t{24} << 30, "this machine", 128);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("training needs about 45.6 GiB (4039802890 parameters"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("this machine has 24.0 GiB available"), std::string::npos)
      << refused;
  // A tenth of what is free is kept back.
  TrainingFootprint exact{.bytes = 950};
  EXPECT_FALSE(CheckTrainingFits(exact, 1000, "x", 1).ok());
  EXPECT_TRUE(CheckTrainingFits(exact, 1056, "x", 1).ok());
}

TEST(CpuNetworkTest, CpuBackendKnowsItsAvailableMemory) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  ASSERT_TRUE(backend.ok());
  absl::StatusOr<int64_t> available = (*backend)->AvailableMemoryBytes();
  ASSERT_TRUE(available.ok()) << available.status();
  EXPECT_GT(*available, int64_t{64} << 20);  // this process runs, so some is free
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t total_kib = 0;
  meminfo >> key >> total_kib;
  ASSERT_EQ(key, "MemTotal:");
  EXPECT_LE(*available, total_kib * 1024);
}

// A small CNN shaped like the Fashion-MNIST one.
NetworkConfig SmallCnn(Precision precision) {
  NetworkConfig config;
  config.input_shape = {1, 12, 12};
  config.layers = {Conv(8, 3, 1, 1), Of(Kind::kRelu), Pool(2, 0, 0),      Conv(16, 3, 1, 1),
                   Of(Kind::kRelu),  Pool(2, 0, 0),   Of(Kind::kFlatten), Linear(32),
                   Of(Kind::kRelu),  Dropout(0.25f),  Linear(10)};
  config.classes = 10;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 5;
  return config;
}

// bf16 and fp16 against fp32 on one step (no dropout): loss within 2e-2 relative; the gradients of
// the Linear layers within 0.02 (relative L2) for bf16's 8 bits and 0.003 for fp16's 11, the
// convolutions' within 0.1.
TEST(CpuNetworkTest, ReducedPrecisionAgreesWithFp32) {
  NetworkConfig fp32_config = PlainSgd(SmallCnn(Precision::kFp32));
  fp32_config.layers[9].rate = 0;
  std::unique_ptr<Model> fp32 = MakeNetwork(fp32_config);
  ASSERT_NE(fp32, nullptr);
  const FeatureBatch batch = RandomFeatures(16, 144, 10, 21);
  float fp32_loss = 0;
  const DoubleParams fp32_gradient = StepGradient(*fp32, batch.View(), 1.0, &fp32_loss);
  for (const auto& [precision, tolerance] :
       {std::pair{Precision::kBf16, 0.02}, std::pair{Precision::kFp16, 0.003}}) {
    NetworkConfig config = fp32_config;
    config.precision = precision;
    std::unique_ptr<Model> model = MakeNetwork(config);
    ASSERT_NE(model, nullptr);
    float loss = 0;
    const DoubleParams gradient = StepGradient(*model, batch.View(), 1.0, &loss);
    EXPECT_NEAR(loss, fp32_loss, 2e-2 * fp32_loss) << PrecisionName(precision);
    EXPECT_NE(loss, fp32_loss) << PrecisionName(precision) << " really rounded";
    for (size_t t = 0; t < gradient.size(); ++t) {
      // Before the pooling layers, near-ties that rounding breaks differently reroute gradients
      // (0.03-0.06 seen for both bf16 and fp16); after them only rounding differs.
      EXPECT_LT(RelativeDifference(gradient[t], fp32_gradient[t]), t < 6 ? 0.1 : tolerance)
          << PrecisionName(precision) << " tensor " << t;
    }
  }
}

// Same config, same batches: bit-identical weights, dropout included, partial batch included.
TEST(CpuNetworkTest, TrainingIsDeterministicWithDropout) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    std::unique_ptr<Model> a = MakeNetwork(SmallCnn(precision));
    std::unique_ptr<Model> b = MakeNetwork(SmallCnn(precision));
    ASSERT_TRUE(a && b);
    for (int step = 0; step < 3; ++step) {
      const FeatureBatch batch = RandomFeatures(step == 2 ? 11 : 16, 144, 10, 40 + step);
      ASSERT_TRUE(a->TrainStep(batch.View(), 0.05).ok());
      ASSERT_TRUE(b->TrainStep(batch.View(), 0.05).ok());
    }
    ExpectSameParameters(*a, *b, PrecisionName(precision));
  }
}

// Dropout is active in TrainStep only: Evaluate is unchanged by it, and two steps from the same
// weights draw different masks (different gradients).
TEST(CpuNetworkTest, DropoutOnlyInTrainingAndFreshEachStep) {
  NetworkConfig with = PlainSgd(SmallCnn(Precision::kFp32));
  with.layers[9].rate = 0.5f;
  NetworkConfig without = with;
  without.layers[9].rate = 0;
  std::unique_ptr<Model> a = MakeNetwork(with);
  std::unique_ptr<Model> b = MakeNetwork(without);
  ASSERT_TRUE(a && b);
  const FeatureBatch batch = RandomFeatures(16, 144, 10, 60);
  EXPECT_EQ(a->Evaluate(batch.View())->loss_sum, b->Evaluate(batch.View())->loss_sum);
  const std::vector<NamedTensor> start = a->Parameters();
  const DoubleParams first = StepGradient(*a, batch.View(), 1.0, nullptr);
  ASSERT_TRUE(a->SetParameters(start).ok());
  const DoubleParams second = StepGradient(*a, batch.View(), 1.0, nullptr);
  const DoubleParams plain = StepGradient(*b, batch.View(), 1.0, nullptr);
  EXPECT_GT(RelativeDifference(first[6], second[6]), 0.05);
  EXPECT_GT(RelativeDifference(first[6], plain[6]), 0.05);
}

// TimeKernels (bench/run_limits.sh's overhead row) times every kind of kernel of a step, refuses a
// batch the model cannot take, and leaves a model that still trains.
TEST(CpuNetworkTest, TimeKernelsListsEveryKernelOfAStep) {
  NetworkConfig config = SmallCnn(Precision::kBf16);
  config.layers[9].rate = 0.5f;
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_TRUE(model);
  const FeatureBatch batch = RandomFeatures(16, 144, 10, 70);
  ASSERT_TRUE(model->TrainStep(batch.View(), 0.05).ok());
  absl::StatusOr<std::vector<KernelTime>> times = model->TimeKernels(16, 3);
  ASSERT_TRUE(times.ok()) << times.status();
  std::string names;
  double sum = 0;
  for (const KernelTime& k : *times) {
    EXPECT_GE(k.median_ms, 0) << k.name;
    sum += k.median_ms;
    names += k.name + "; ";
  }
  EXPECT_GT(sum, 0);
  for (const char* expected : {"input", "conv2d forward", "conv2d backward_weights",
                               "conv2d backward_data", "linear forward", "dropout forward",
                               "dropout backward", "loss", "optimizer and weight copies"}) {
    EXPECT_NE(names.find(expected), std::string::npos) << expected << " not in " << names;
  }
  EXPECT_EQ(model->TimeKernels(0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->TimeKernels(config.max_batch + 1, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->TimeKernels(16, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<StepResult> after = model->TrainStep(batch.View(), 0.05);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(std::isfinite(after->loss));
}

// Parameters() + OptimizerState() restored into a fresh model continue bit-exactly: CNN with
// dropout and AdamW (and SGD with Nesterov in fp16, with its loss-scale state).
TEST(CpuNetworkTest, ResumeIsExact) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    NetworkConfig config = SmallCnn(precision);
    if (precision == Precision::kFp16) {
      config.optimizer.nesterov = true;
      config.loss_scale.growth_interval = 2;
    } else {
      config.optimizer.type = OptimizerType::kAdamW;
      config.optimizer.weight_decay = 0.01;
    }
    config.optimizer.clip_grad_norm = 1.0;
    std::unique_ptr<Model> straight = MakeNetwork(config);
    std::unique_ptr<Model> first_half = MakeNetwork(config);
    ASSERT_TRUE(straight && first_half);
    std::vector<FeatureBatch> batches;
    for (int step = 0; step < 6; ++step) batches.push_back(RandomFeatures(16, 144, 10, 80 + step));
    for (int step = 0; step < 6; ++step)
      ASSERT_TRUE(straight->TrainStep(batches[step].View(), 0.01).ok());
    for (int step = 0; step < 3; ++step)
      ASSERT_TRUE(first_half->TrainStep(batches[step].View(), 0.01).ok());
    const std::vector<NamedTensor> state = first_half->OptimizerState();
    if (precision == Precision::kFp16) {
      EXPECT_EQ(state[0].name, "layers.0.weight.momentum");
      EXPECT_EQ(state.back().name, "loss_scale");
    } else {
      ASSERT_EQ(state.size(), 2 * first_half->Parameters().size() + 2);
      EXPECT_EQ(state[0].name, "layers.0.weight.exp_avg");
      EXPECT_EQ(state[1].name, "layers.0.weight.exp_avg_sq");
      EXPECT_EQ(state[state.size() - 2].name, "optimizer.step");
      EXPECT_EQ(state[state.size() - 2].values, std::vector<float>{3});
    }
    std::unique_ptr<Model> resumed = MakeNetwork(config);
    ASSERT_TRUE(resumed);
    ASSERT_TRUE(resumed->SetParameters(first_half->Parameters()).ok());
    ASSERT_TRUE(resumed->SetOptimizerState(state).ok());
    for (int step = 3; step < 6; ++step)
      ASSERT_TRUE(resumed->TrainStep(batches[step].View(), 0.01).ok());
    ExpectSameParameters(*straight, *resumed, PrecisionName(precision));
    std::vector<NamedTensor> wrong = state;
    wrong[0].name = "layers.0.bias";
    EXPECT_EQ(resumed->SetOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
    wrong = state;
    wrong.back().values[0] = -1;
    EXPECT_EQ(resumed->SetOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
  }
}

// GradScaler: an overflowing step is skipped (weights and optimizer buffers unchanged) and halves
// the scale; the scale doubles after exactly growth_interval finite steps; a skip restarts the
// count. An inf feature overflows the same way.
TEST(CpuNetworkTest, Fp16LossScalingSkipsAndGrowsOnSchedule) {
  NetworkConfig config = SmallCnn(Precision::kFp16);
  config.loss_scale.growth_interval = 3;
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_TRUE(model);
  auto step = [&](int seed) {
    absl::StatusOr<StepResult> result =
        model->TrainStep(RandomFeatures(16, 144, 10, seed).View(), 0.01);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : StepResult{};
  };
  StepResult r = step(1);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 65536.0f);
  const std::vector<NamedTensor> params = model->Parameters();
  std::vector<NamedTensor> state = model->OptimizerState();
  ASSERT_TRUE(model->InjectGradientForTest(std::numeric_limits<float>::infinity()).ok());
  r = step(2);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 32768.0f);
  const std::vector<NamedTensor> after = model->Parameters();
  const std::vector<NamedTensor> after_state = model->OptimizerState();
  for (size_t t = 0; t < params.size(); ++t) EXPECT_EQ(after[t].values, params[t].values);
  for (size_t t = 0; t + 3 < state.size(); ++t) EXPECT_EQ(after_state[t].values, state[t].values);
  EXPECT_EQ(after_state[state.size() - 3].values, state[state.size() - 3].values);  // steps
  EXPECT_EQ(after_state.back().values, (std::vector<float>{32768, 0}));
  // Three finite steps: 32768 twice, then 65536 on the third.
  EXPECT_EQ(step(3).loss_scale, 32768.0f);
  EXPECT_EQ(step(4).loss_scale, 32768.0f);
  r = step(5);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 65536.0f);
  // NaN and an inf input skip too.
  ASSERT_TRUE(model->InjectGradientForTest(std::numeric_limits<float>::quiet_NaN()).ok());
  EXPECT_TRUE(step(6).skipped);
  FeatureBatch poisoned = RandomFeatures(16, 144, 10, 7);
  poisoned.features[3] = std::numeric_limits<float>::infinity();
  absl::StatusOr<StepResult> skipped = model->TrainStep(poisoned.View(), 0.01);
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(skipped->loss_scale, 16384.0f);
  EXPECT_EQ(step(8).loss_scale, 16384.0f);
  // fp32 and bf16 report a scale of 1 and never skip.
  std::unique_ptr<Model> bf16 = MakeNetwork(SmallCnn(Precision::kBf16));
  absl::StatusOr<StepResult> plain = bf16->TrainStep(RandomFeatures(16, 144, 10, 9).View(), 0.01);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->loss_scale, 1.0f);
  EXPECT_FALSE(plain->skipped);
}

// Loss falls and held-out accuracy rises on a learnable problem (class = brightest quadrant).
TEST(CpuNetworkTest, CnnLearns) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    NetworkConfig config = SmallCnn(precision);
    config.classes = 4;
    config.layers.back().units = 4;
    config.optimizer.type = OptimizerType::kAdamW;
    std::unique_ptr<Model> model = MakeNetwork(config);
    ASSERT_TRUE(model);
    auto make = [](int count, uint64_t seed) {
      FeatureBatch batch = RandomFeatures(count, 144, 4, seed);
      for (int s = 0; s < count; ++s) {
        const int q = batch.labels[s];
        for (int y = 0; y < 6; ++y) {
          for (int x = 0; x < 6; ++x) {
            batch.features[s * 144 + (y + 6 * (q / 2)) * 12 + x + 6 * (q % 2)] += 1.0f;
          }
        }
      }
      return batch;
    };
    const FeatureBatch held_out = make(16, 1);
    const double before = model->Evaluate(held_out.View())->loss_sum;
    for (int step = 0; step < 60; ++step) {
      ASSERT_TRUE(model->TrainStep(make(step % 4 == 3 ? 9 : 16, 100 + step).View(), 0.003).ok());
    }
    absl::StatusOr<EvalResult> after = model->Evaluate(held_out.View());
    ASSERT_TRUE(after.ok());
    EXPECT_LT(after->loss_sum, 0.2 * before) << PrecisionName(precision);
    EXPECT_GE(after->correct, 15) << PrecisionName(precision);
  }
}

TEST(CpuNetworkTest, RejectsBadConfigsNamingTheLayer) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  ASSERT_TRUE(backend.ok());
  auto status = [&](auto mutate) {
    NetworkConfig config = SmallCnn(Precision::kFp32);
    mutate(config);
    return (*backend)->CreateNetwork(config).status();
  };
  EXPECT_TRUE(status([](NetworkConfig&) {}).ok());
  absl::Status s = status([](NetworkConfig& c) {
    c.input_shape = {1, 8, 8};
    c.layers[3].kernel = 5;
    c.layers[3].padding = 0;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "layers[3] (conv2d): kernel 5 larger than input 4x4");
  s = status([](NetworkConfig& c) { c.layers[2].kernel = 0; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers[2] (maxpool2d)"), std::string::npos) << s;
  s = status([](NetworkConfig& c) { c.layers[2].padding = 2; });
  EXPECT_NE(s.message().find("layers[2]"), std::string::npos) << s;
  s = status([](NetworkConfig& c) { c.layers[9].rate = 1; });
  EXPECT_NE(s.message().find("layers[9] (dropout): rate"), std::string::npos) << s;
  s = status([](NetworkConfig& c) { c.layers[10].units = 7; });
  EXPECT_NE(s.message().find("layers[10] (linear)"), std::string::npos) << s;
  s = status([](NetworkConfig& c) { c.layers.insert(c.layers.begin() + 7, Conv(4, 1, 1, 0)); });
  EXPECT_NE(s.message().find("layers[7] (conv2d): needs a [C, H, W] input"), std::string::npos)
      << s;
  s = status([](NetworkConfig& c) { c.layers[0].out_channels = 0; });
  EXPECT_NE(s.message().find("layers[0] (conv2d): out_channels"), std::string::npos) << s;
  s = status([](NetworkConfig& c) { c.input_shape = {1, 12}; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  auto code = [&](auto mutate) { return status(mutate).code(); };
  using absl::StatusCode;
  EXPECT_EQ(code([](NetworkConfig& c) { c.max_batch = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) {
              c.optimizer.nesterov = true;
              c.optimizer.momentum = 0;
            }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) { c.optimizer.beta2 = 1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) { c.optimizer.eps = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) { c.optimizer.clip_grad_norm = -1; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) { c.loss_scale.growth_interval = 0; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](NetworkConfig& c) { c.loss_scale.backoff_factor = 1; }),
            StatusCode::kInvalidArgument);
}

TEST(CpuNetworkTest, RejectsBadBatchesAndParameters) {
  std::unique_ptr<Model> model = MakeNetwork(SmallCnn(Precision::kFp32));
  ASSERT_TRUE(model);
  FeatureBatch batch = RandomFeatures(16, 144, 10, 3);
  BatchView view = batch.View();
  view.count = 17;
  EXPECT_EQ(model->TrainStep(view, 0.1).status().code(), absl::StatusCode::kInvalidArgument);
  batch.labels[2] = 10;
  EXPECT_EQ(model->Evaluate(batch.View()).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<NamedTensor> params = model->Parameters();
  params[0].shape = {8, 1, 9};
  EXPECT_EQ(model->SetParameters(params).code(), absl::StatusCode::kInvalidArgument);
}

// The MLP's features beyond the fast path (here fp16 and AdamW) come from the network, with the
// MLP's names and initial weights.
TEST(CpuNetworkTest, MlpDelegatesToNetwork) {
  MlpConfig config = test_layers::OddShapedMlp();
  config.optimizer.type = OptimizerType::kAdamW;
  config.precision = Precision::kFp16;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateMlp(config);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<NamedTensor> params = (*model)->Parameters();
  const std::vector<NamedTensor> expected = InitialMlpParameters(config);
  ASSERT_EQ(params.size(), expected.size());
  for (size_t t = 0; t < params.size(); ++t) {
    EXPECT_EQ(params[t].name, expected[t].name);
    EXPECT_EQ(params[t].values, expected[t].values);
  }
  EXPECT_EQ((*model)->OptimizerState()[0].name, "layers.0.weight.exp_avg");
}

}  // namespace
}  // namespace stoker
