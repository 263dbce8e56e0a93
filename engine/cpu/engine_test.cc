// The cpu backend's MLP against references: gradients against central differences, bf16 against
// fp32, the optimizer against PyTorch's SGD formula, training on a separable problem, and the
// contract's error cases.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cpu/network_test_util.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

// The double-precision helpers the network tests use too (network_test_util.h).
using testing_util::CentralDifference;
using testing_util::DoubleParams;
using testing_util::ExpectSameParameters;
using testing_util::RelativeDifference;
using testing_util::StepGradient;
using testing_util::ToDouble;

struct Batch {
  std::vector<uint8_t> samples;
  std::vector<uint8_t> labels;
  int count = 0;
  BatchView View() const { return {samples.data(), labels.data(), count}; }
};

// Uniformly random pixels and labels (never all zeros), from a fixed seed.
Batch RandomBatch(int count, int features, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch batch;
  batch.count = count;
  batch.samples.resize(static_cast<size_t>(count) * features);
  batch.labels.resize(count);
  for (uint8_t& p : batch.samples) p = static_cast<uint8_t>(rng() >> 56);
  for (uint8_t& l : batch.labels) l = static_cast<uint8_t>(rng() % classes);
  return batch;
}

std::unique_ptr<Model> MakeModel(const MlpConfig& config) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateMlp(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

MlpConfig SmallConfig() {
  MlpConfig config = test_layers::OddShapedMlp();
  config.optimizer.momentum = 0;
  config.optimizer.weight_decay = 0;
  return config;
}

// Mean cross-entropy of the MLP in double precision (weights [out, in], then bias, per layer).
double ReferenceLoss(const MlpConfig& config, const DoubleParams& params, const Batch& batch) {
  double loss = 0;
  for (int s = 0; s < batch.count; ++s) {
    std::vector<double> x(config.input_features);
    for (int i = 0; i < config.input_features; ++i) {
      x[i] = batch.samples[s * config.input_features + i] *
                 static_cast<double>(config.input_scale[0]) +
             config.input_shift[0];
    }
    const size_t layers = params.size() / 2;
    for (size_t l = 0; l < layers; ++l) {
      const std::vector<double>& w = params[2 * l];
      const std::vector<double>& b = params[2 * l + 1];
      std::vector<double> y(b.size());
      for (size_t o = 0; o < b.size(); ++o) {
        double sum = b[o];
        for (size_t i = 0; i < x.size(); ++i) sum += w[o * x.size() + i] * x[i];
        y[o] = l + 1 < layers ? std::max(sum, 0.0) : sum;
      }
      x = std::move(y);
    }
    double max_logit = x[0];
    for (double z : x) max_logit = std::max(max_logit, z);
    double sum = 0;
    for (double z : x) sum += std::exp(z - max_logit);
    loss += std::log(sum) + max_logit - x[batch.labels[s]];
  }
  return loss / batch.count;
}

// Gradient checks: the fp32 model's gradient against central differences of the double reference
// (h = 1e-5) and of the model's own fp32 Evaluate (h = 1e-3, via SetParameters). Tolerance per
// element: |g - fd| <= 1e-3 |fd| + 1e-5 against the double reference, <= 2e-2 |fd| + 2e-4 against
// fp32 differences (their rounding noise is ~1e-7 / 2h).
void CheckGradient(int count, uint64_t seed) {
  const MlpConfig config = SmallConfig();
  std::unique_ptr<Model> model = MakeModel(config);
  ASSERT_NE(model, nullptr);
  const Batch batch = RandomBatch(count, config.input_features, config.classes, seed);
  const std::vector<NamedTensor> start = model->Parameters();
  const DoubleParams params = ToDouble(start);

  // Forward: Evaluate's loss against the double reference.
  absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
  ASSERT_TRUE(eval.ok()) << eval.status();
  const double reference_loss = ReferenceLoss(config, params, batch);
  EXPECT_NEAR(eval->loss_sum / count, reference_loss, 1e-6 * reference_loss);

  float step_loss = 0;
  const DoubleParams gradient = StepGradient(*model, batch.View(), /*lr=*/8.0, &step_loss);
  EXPECT_NEAR(step_loss, reference_loss, 1e-6 * reference_loss);
  ASSERT_TRUE(model->SetParameters(start).ok());

  double max_gradient = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    for (size_t i = 0; i < params[t].size(); ++i) {
      const double fd = CentralDifference(params, t, i, /*h=*/1e-5, [&](const DoubleParams& p) {
        return ReferenceLoss(config, p, batch);
      });
      max_gradient = std::max(max_gradient, std::abs(fd));
      EXPECT_NEAR(gradient[t][i], fd, 1e-3 * std::abs(fd) + 1e-5)
          << start[t].name << "[" << i << "]";

      // The same difference through the model itself (fp32 forward).
      const double h32 = 1e-3;
      std::vector<NamedTensor> perturbed = start;
      perturbed[t].values[i] = static_cast<float>(params[t][i] + h32);
      ASSERT_TRUE(model->SetParameters(perturbed).ok());
      const double plus32 = model->Evaluate(batch.View())->loss_sum / count;
      perturbed[t].values[i] = static_cast<float>(params[t][i] - h32);
      ASSERT_TRUE(model->SetParameters(perturbed).ok());
      const double minus32 = model->Evaluate(batch.View())->loss_sum / count;
      const double step32 = static_cast<double>(static_cast<float>(params[t][i] + h32)) -
                            static_cast<float>(params[t][i] - h32);
      const double fd32 = (plus32 - minus32) / step32;
      EXPECT_NEAR(gradient[t][i], fd32, 2e-2 * std::abs(fd32) + 2e-4)
          << start[t].name << "[" << i << "]";
    }
  }
  EXPECT_GT(max_gradient, 1e-2);  // the check is not vacuous
}

TEST(CpuMlpTest, GradientMatchesFiniteDifferencesFullBatch) { CheckGradient(8, 101); }
TEST(CpuMlpTest, GradientMatchesFiniteDifferencesPartialBatch) { CheckGradient(5, 202); }

MlpConfig MnistShapedConfig(Precision precision) {
  MlpConfig config;  // 784-256-128-10
  config.max_batch = 64;
  config.precision = precision;
  config.seed = 7;
  return config;
}

// bf16 rounds inputs, weights and activations to 8 significant bits; the loss stays within 1e-2
// relative of fp32 and each gradient tensor within 0.1 (relative L2 norm). For scale:
// PyTorch 1.13's bf16 autocast differs from its fp32 by 5-8% on the hidden layers' gradients for
// such a batch (random pixels, fresh init: small gradients with much cancellation).
TEST(CpuMlpTest, Bf16StepAgreesWithFp32) {
  MlpConfig fp32_config = MnistShapedConfig(Precision::kFp32);
  fp32_config.optimizer.momentum = 0;
  MlpConfig bf16_config = fp32_config;
  bf16_config.precision = Precision::kBf16;
  std::unique_ptr<Model> fp32 = MakeModel(fp32_config);
  std::unique_ptr<Model> bf16 = MakeModel(bf16_config);
  ASSERT_NE(fp32, nullptr);
  ASSERT_NE(bf16, nullptr);
  const Batch batch = RandomBatch(64, 784, 10, 5);
  float fp32_loss = 0, bf16_loss = 0;
  const DoubleParams fp32_gradient = StepGradient(*fp32, batch.View(), 1.0, &fp32_loss);
  const DoubleParams bf16_gradient = StepGradient(*bf16, batch.View(), 1.0, &bf16_loss);
  EXPECT_NEAR(bf16_loss, fp32_loss, 1e-2 * fp32_loss);
  EXPECT_NE(bf16_loss, fp32_loss);  // bf16 really ran in bf16
  for (size_t t = 0; t < fp32_gradient.size(); ++t) {
    EXPECT_LT(RelativeDifference(bf16_gradient[t], fp32_gradient[t]), 0.1) << "tensor " << t;
  }
}

// PyTorch SGD: v = mu v + g + wd w (weights only); w -= lr v. The gradients come from a twin model
// with plain SGD set to the same weights.
TEST(CpuMlpTest, OptimizerFollowsPyTorchSgd) {
  MlpConfig config = SmallConfig();
  config.optimizer.momentum = 0.9;
  config.optimizer.weight_decay = 0.05;
  std::unique_ptr<Model> model = MakeModel(config);
  std::unique_ptr<Model> oracle = MakeModel(SmallConfig());
  ASSERT_NE(model, nullptr);
  ASSERT_NE(oracle, nullptr);
  const double lr = 0.1;
  DoubleParams velocity;
  for (int step = 0; step < 3; ++step) {
    const Batch batch = RandomBatch(8, config.input_features, config.classes, 300 + step);
    const std::vector<NamedTensor> before = model->Parameters();
    ASSERT_TRUE(oracle->SetParameters(before).ok());
    const DoubleParams gradient = StepGradient(*oracle, batch.View(), 8.0, nullptr);
    ASSERT_TRUE(model->TrainStep(batch.View(), lr).ok());
    const std::vector<NamedTensor> after = model->Parameters();
    if (velocity.empty()) {
      velocity = gradient;
      for (auto& v : velocity) std::fill(v.begin(), v.end(), 0.0);
    }
    for (size_t t = 0; t < before.size(); ++t) {
      const bool is_weight = t % 2 == 0;
      for (size_t i = 0; i < before[t].values.size(); ++i) {
        const double w = before[t].values[i];
        velocity[t][i] = config.optimizer.momentum * velocity[t][i] + gradient[t][i] +
                         (is_weight ? config.optimizer.weight_decay * w : 0.0);
        ASSERT_NEAR(after[t].values[i], w - lr * velocity[t][i], 2e-6)
            << "step " << step << " " << before[t].name << "[" << i << "]";
      }
    }
  }
}

// Ten classes, each a random uint8 prototype plus bounded noise: linearly separable.
struct Separable {
  std::vector<std::vector<uint8_t>> prototypes;
  Batch Sample(int count, int features, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    Batch batch;
    batch.count = count;
    for (int s = 0; s < count; ++s) {
      const int label = static_cast<int>(rng() % prototypes.size());
      batch.labels.push_back(static_cast<uint8_t>(label));
      for (int i = 0; i < features; ++i) {
        const int noise = static_cast<int>(rng() % 121) - 60;
        batch.samples.push_back(
            static_cast<uint8_t>(std::clamp(prototypes[label][i] + noise, 0, 255)));
      }
    }
    return batch;
  }
};

class CpuMlpTrainingTest : public testing::TestWithParam<Precision> {};

TEST_P(CpuMlpTrainingTest, LossFallsAndAccuracyRises) {
  const MlpConfig config = test_layers::TestMlp(64, {32, 16}, 10, 32, /*seed=*/3, GetParam());
  std::unique_ptr<Model> model = MakeModel(config);
  ASSERT_NE(model, nullptr);
  Separable data;
  std::mt19937_64 rng(99);
  data.prototypes.resize(config.classes);
  for (auto& p : data.prototypes) {
    for (int i = 0; i < config.input_features; ++i) p.push_back(static_cast<uint8_t>(rng() >> 56));
  }
  const Batch held_out = data.Sample(32, config.input_features, 1);
  absl::StatusOr<EvalResult> before = model->Evaluate(held_out.View());
  ASSERT_TRUE(before.ok()) << before.status();
  for (int step = 0; step < 150; ++step) {
    // Every 5th batch is partial, as at the end of an epoch.
    const int count = step % 5 == 4 ? 19 : 32;
    ASSERT_TRUE(
        model->TrainStep(data.Sample(count, config.input_features, 1000 + step).View(), 0.02).ok());
  }
  absl::StatusOr<EvalResult> after = model->Evaluate(held_out.View());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss_sum, 0.1 * before->loss_sum);
  EXPECT_GE(after->correct, 31);
  EXPECT_LE(before->correct, 10);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CpuMlpTrainingTest,
                         testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

TEST(CpuMlpTest, SameSeedSameWeightsAndPyTorchInitBounds) {
  MlpConfig config = MnistShapedConfig(Precision::kFp32);
  std::unique_ptr<Model> a = MakeModel(config);
  config.precision = Precision::kBf16;
  std::unique_ptr<Model> b = MakeModel(config);
  config.seed = 8;
  std::unique_ptr<Model> c = MakeModel(config);
  ASSERT_TRUE(a && b && c);
  const std::vector<NamedTensor> pa = a->Parameters(), pb = b->Parameters(), pc = c->Parameters();
  ASSERT_EQ(pa.size(), 6u);
  const std::vector<NamedTensor> initial =
      InitialMlpParameters(MnistShapedConfig(Precision::kFp32));
  for (size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(pa[t].values, pb[t].values) << pa[t].name;
    EXPECT_EQ(pa[t].values, initial[t].values) << pa[t].name;
    EXPECT_NE(pa[t].values, pc[t].values) << pa[t].name;
    const double bound = 1.0 / std::sqrt(static_cast<double>(pa[t - t % 2].shape[1]));
    double sum_squares = 0;
    for (float v : pa[t].values) {
      ASSERT_LE(std::abs(v), bound);
      sum_squares += static_cast<double>(v) * v;
    }
    // U(-b, b) has variance b^2 / 3.
    EXPECT_NEAR(sum_squares / pa[t].values.size(), bound * bound / 3, 0.3 * bound * bound / 3)
        << pa[t].name;
  }
  EXPECT_EQ(pa[0].name, "layers.0.weight");
  EXPECT_EQ(pa[0].shape, (std::vector<int64_t>{256, 784}));
  EXPECT_EQ(pa[5].name, "layers.2.bias");
  EXPECT_EQ(pa[5].shape, (std::vector<int64_t>{10}));
}

TEST(CpuMlpTest, TrainingIsDeterministic) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const MlpConfig config = MnistShapedConfig(precision);
    std::unique_ptr<Model> a = MakeModel(config);
    std::unique_ptr<Model> b = MakeModel(config);
    ASSERT_TRUE(a && b);
    for (int step = 0; step < 3; ++step) {
      const Batch batch = RandomBatch(step == 2 ? 40 : 64, 784, 10, 50 + step);
      ASSERT_TRUE(a->TrainStep(batch.View(), 0.05).ok());
      ASSERT_TRUE(b->TrainStep(batch.View(), 0.05).ok());
    }
    ExpectSameParameters(*a, *b, PrecisionName(precision));
  }
}

// A checkpoint is Parameters() plus OptimizerState(): restoring both into a fresh model and
// continuing gives bit-identical weights to never having stopped.
TEST(CpuMlpTest, ResumeFromParametersAndOptimizerStateIsExact) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    MlpConfig config = MnistShapedConfig(precision);
    config.optimizer.momentum = 0.9;
    config.optimizer.weight_decay = 1e-4;
    std::unique_ptr<Model> straight = MakeModel(config);
    std::unique_ptr<Model> first_half = MakeModel(config);
    ASSERT_TRUE(straight && first_half);
    std::vector<Batch> batches;
    for (int step = 0; step < 6; ++step) batches.push_back(RandomBatch(64, 784, 10, 90 + step));
    for (int step = 0; step < 6; ++step)
      ASSERT_TRUE(straight->TrainStep(batches[step].View(), 0.05).ok());
    for (int step = 0; step < 3; ++step)
      ASSERT_TRUE(first_half->TrainStep(batches[step].View(), 0.05).ok());

    const std::vector<NamedTensor> momentum = first_half->OptimizerState();
    ASSERT_EQ(momentum.size(), first_half->Parameters().size());
    EXPECT_EQ(momentum[0].name, "layers.0.weight.momentum");
    bool nonzero = false;
    for (float v : momentum[0].values) nonzero |= v != 0;
    EXPECT_TRUE(nonzero) << "momentum after 3 steps cannot be all zeros";

    config.seed = 777;  // different initial weights: everything must come from the checkpoint
    std::unique_ptr<Model> resumed = MakeModel(config);
    ASSERT_TRUE(resumed);
    ASSERT_TRUE(resumed->SetParameters(first_half->Parameters()).ok());
    ASSERT_TRUE(resumed->SetOptimizerState(momentum).ok());
    for (int step = 3; step < 6; ++step)
      ASSERT_TRUE(resumed->TrainStep(batches[step].View(), 0.05).ok());
    ExpectSameParameters(*straight, *resumed, PrecisionName(precision));

    std::vector<NamedTensor> wrong = momentum;
    wrong[1].name = "layers.0.bias";
    EXPECT_EQ(resumed->SetOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
    wrong.pop_back();
    EXPECT_EQ(resumed->SetOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CpuMlpTest, SetParametersRoundTripsAndRejectsMismatches) {
  const MlpConfig config = SmallConfig();
  MlpConfig other_config = config;
  other_config.seed = 1234;
  std::unique_ptr<Model> model = MakeModel(config);
  std::unique_ptr<Model> other = MakeModel(other_config);
  ASSERT_TRUE(model && other);
  const std::vector<NamedTensor> original = model->Parameters();
  const std::vector<NamedTensor> replacement = other->Parameters();
  ASSERT_NE(original[0].values, replacement[0].values);
  ASSERT_TRUE(model->SetParameters(replacement).ok());
  const std::vector<NamedTensor> read_back = model->Parameters();
  for (size_t t = 0; t < read_back.size(); ++t) {
    EXPECT_EQ(read_back[t].name, replacement[t].name);
    EXPECT_EQ(read_back[t].shape, replacement[t].shape);
    EXPECT_EQ(read_back[t].values, replacement[t].values);
  }
  // Same weights, same predictions.
  const Batch batch = RandomBatch(8, config.input_features, config.classes, 77);
  EXPECT_EQ(model->Evaluate(batch.View())->loss_sum, other->Evaluate(batch.View())->loss_sum);

  std::vector<NamedTensor> bad = original;
  bad[2].name = "layers.9.weight";
  EXPECT_EQ(model->SetParameters(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = original;
  bad[1].shape = {4};
  EXPECT_EQ(model->SetParameters(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = original;
  bad[0].values.pop_back();
  EXPECT_EQ(model->SetParameters(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = original;
  bad.pop_back();
  EXPECT_EQ(model->SetParameters(bad).code(), absl::StatusCode::kInvalidArgument);
  // A rejected call changes nothing.
  EXPECT_EQ(model->Parameters()[0].values, replacement[0].values);
}

TEST(CpuMlpTest, RejectsBadLearningRates) {
  const MlpConfig config = SmallConfig();
  std::unique_ptr<Model> model = MakeModel(config);
  ASSERT_NE(model, nullptr);
  const Batch batch = RandomBatch(8, config.input_features, config.classes, 6);
  const std::vector<NamedTensor> before = model->Parameters();
  for (double lr :
       {-0.1, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<StepResult> step = model->TrainStep(batch.View(), lr);
    ASSERT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument) << lr;
    EXPECT_NE(step.status().message().find("learning_rate"), std::string::npos);
  }
  EXPECT_EQ(model->Parameters()[0].values, before[0].values) << "a refused step changes nothing";
}

TEST(CpuMlpTest, RejectsBadBatches) {
  const MlpConfig config = SmallConfig();
  std::unique_ptr<Model> model = MakeModel(config);
  ASSERT_NE(model, nullptr);
  Batch batch = RandomBatch(8, config.input_features, config.classes, 5);
  const std::vector<NamedTensor> before = model->Parameters();
  auto expect_invalid = [&](BatchView view) {
    EXPECT_EQ(model->TrainStep(view, 0.1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(model->Evaluate(view).status().code(), absl::StatusCode::kInvalidArgument);
  };
  expect_invalid({batch.samples.data(), batch.labels.data(), 0});
  expect_invalid({batch.samples.data(), batch.labels.data(), -1});
  expect_invalid({batch.samples.data(), batch.labels.data(), config.max_batch + 1});
  expect_invalid({nullptr, batch.labels.data(), 4});
  expect_invalid({batch.samples.data(), nullptr, 4});
  batch.labels[6] = static_cast<uint8_t>(config.classes);
  expect_invalid(batch.View());
  batch.labels[6] = 0;
  EXPECT_EQ(model->TrainStep(batch.View(), -1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->TrainStep(batch.View(), std::nan("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->Parameters()[0].values, before[0].values);  // nothing was applied
  EXPECT_TRUE(model->TrainStep(batch.View(), 0.1).ok());
}

TEST(CpuMlpTest, RejectsBadConfigs) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ((*backend)->Name(), "cpu");
  auto code = [&](auto mutate) {
    MlpConfig config = SmallConfig();
    mutate(config);
    return (*backend)->CreateMlp(config).status().code();
  };
  using absl::StatusCode;
  EXPECT_EQ(code([](MlpConfig&) {}), StatusCode::kOk);
  EXPECT_EQ(code([](MlpConfig& c) { c.hidden = {}; }), StatusCode::kOk);  // logistic regression
  EXPECT_EQ(code([](MlpConfig& c) { c.input_features = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.classes = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.classes = 257; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.max_batch = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.hidden = {5, 0}; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.optimizer.momentum = 1.5; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.optimizer.weight_decay = -1; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.input_scale = {INFINITY}; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](MlpConfig& c) { c.precision = Precision::kFp16; }), StatusCode::kOk);
}

}  // namespace
}  // namespace stoker
