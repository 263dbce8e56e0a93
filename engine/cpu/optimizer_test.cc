// The optimizers against hand-computed PyTorch references: SGD with momentum, Nesterov and weight
// decay, AdamW, gradient clipping by global norm. Gradients come from a plain-SGD twin of the
// model.
#include <cmath>
#include <memory>
#include <vector>

#include "engine/cpu/cpu_train_kernels.h"
#include "engine/cpu/network_test_util.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace stoker::testing_util;  // NOLINT: test helpers
using Kind = LayerConfig::Kind;

// AdamW by hand, one value, PyTorch 1.13 formula: w = 1, g = 0.5, lr = 0.1, wd = 0.01, step 1:
// w = 0.999; m = 0.05; v = 0.00025; bias corrections 0.1 and 0.001;
// w -= (0.1 / 0.1) * 0.05 / (sqrt(0.00025) / sqrt(0.001) + 1e-8) = 0.999 - 0.1 = 0.899.
// Step 2 with g = -0.25: w = 0.899 * 0.999 = 0.898101; m = 0.045 - 0.025 = 0.02;
// v = 0.00024975 + 0.0000625 = 0.00031225; corrections 0.19 and 0.001999;
// w -= (0.1 / 0.19) * 0.02 / (sqrt(0.00031225 / 0.001999) + 1e-8).
TEST(OptimizerKernelTest, AdamWMatchesHandComputedSteps) {
  float w = 1, m = 0, v = 0;
  const float g1 = 0.5f;
  cpu::AdamWUpdate(1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, &g1, &w, &m, &v);
  EXPECT_NEAR(w, 0.899, 1e-6);
  EXPECT_NEAR(m, 0.05, 1e-7);  // (1 - beta) is rounded in float
  EXPECT_NEAR(v, 0.00025, 1e-8);
  const float g2 = -0.25f;
  cpu::AdamWUpdate(1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, &g2, &w, &m, &v);
  const double expected =
      0.898101 - (0.1 / 0.19) * 0.02 / (std::sqrt(0.00031225 / 0.001999) + 1e-8);
  EXPECT_NEAR(w, expected, 1e-6);
}

// SGD by hand: momentum 0.9, wd 0.1, lr 0.5, w = 2, g = 1 then g = -1.
// Step 1: g' = 1.2, v = 1.2; plain w = 2 - 0.6 = 1.4; nesterov w = 2 - 0.5 (1.2 + 1.08) = 0.86.
TEST(OptimizerKernelTest, SgdMomentumAndNesterovMatchHandComputedSteps) {
  float w = 2, v = 0;
  const float g = 1;
  cpu::SgdUpdate(1, 0.5f, 0.9f, 0.1f, false, &g, &w, &v);
  EXPECT_FLOAT_EQ(w, 1.4f);
  EXPECT_FLOAT_EQ(v, 1.2f);
  // Step 2 (plain): g' = -1 + 0.14 = -0.86; v = 1.08 - 0.86 = 0.22; w = 1.4 - 0.11 = 1.29.
  const float g2 = -1;
  cpu::SgdUpdate(1, 0.5f, 0.9f, 0.1f, false, &g2, &w, &v);
  EXPECT_NEAR(w, 1.29, 1e-6);
  float wn = 2, vn = 0;
  cpu::SgdUpdate(1, 0.5f, 0.9f, 0.1f, true, &g, &wn, &vn);
  EXPECT_NEAR(wn, 0.86, 1e-6);
}

NetworkConfig TinyNet(OptimizerConfig optimizer) {
  NetworkConfig config;
  config.input_shape = {1, 5, 5};
  config.layers = {test_layers::Conv(2, 3, 0, 0), test_layers::Of(Kind::kRelu),
                   test_layers::Linear(3)};
  config.classes = 3;
  config.max_batch = 8;
  config.seed = 9;
  config.optimizer = optimizer;
  return config;
}

OptimizerConfig PlainSgd() {
  OptimizerConfig optimizer;
  optimizer.momentum = 0;
  return optimizer;
}

// Three steps of `optimizer` on the network against the same formula in double, fed with the
// gradients a plain-SGD twin recovers at the same weights.
void CheckAgainstReference(const OptimizerConfig& optimizer) {
  std::unique_ptr<Model> model = MakeNetwork(TinyNet(optimizer));
  std::unique_ptr<Model> oracle = MakeNetwork(TinyNet(PlainSgd()));
  ASSERT_TRUE(model && oracle);
  const double lr = 0.05;
  DoubleParams state1, state2;
  for (int step = 1; step <= 3; ++step) {
    const FeatureBatch batch = RandomFeatures(8, 25, 3, 500 + step);
    const std::vector<NamedTensor> before = model->Parameters();
    ASSERT_TRUE(oracle->SetParameters(before).ok());
    DoubleParams gradient = StepGradient(*oracle, batch.View(), 4.0, nullptr);
    ASSERT_TRUE(model->TrainStep(batch.View(), lr).ok());
    const std::vector<NamedTensor> after = model->Parameters();
    if (state1.empty()) {
      state1 = state2 = gradient;
      for (auto& s : state1) std::fill(s.begin(), s.end(), 0.0);
      state2 = state1;
    }
    if (optimizer.clip_grad_norm > 0) {
      double squares = 0;
      for (const auto& g : gradient) {
        for (double v : g) squares += v * v;
      }
      const double coefficient = optimizer.clip_grad_norm / (std::sqrt(squares) + 1e-6);
      ASSERT_LT(coefficient, 0.9) << "the test must really clip";
      for (auto& g : gradient) {
        for (double& v : g) v *= coefficient;
      }
    }
    for (size_t t = 0; t < before.size(); ++t) {
      const double decay = t % 2 == 0 ? optimizer.weight_decay : 0.0;
      for (size_t i = 0; i < before[t].values.size(); ++i) {
        const double w = before[t].values[i];
        double expected;
        if (optimizer.type == OptimizerType::kAdamW) {
          const double b1 = optimizer.beta1, b2 = optimizer.beta2, g = gradient[t][i];
          state1[t][i] = b1 * state1[t][i] + (1 - b1) * g;
          state2[t][i] = b2 * state2[t][i] + (1 - b2) * g * g;
          const double m_hat = state1[t][i] / (1 - std::pow(b1, step));
          const double denom =
              std::sqrt(state2[t][i]) / std::sqrt(1 - std::pow(b2, step)) + optimizer.eps;
          expected = w * (1 - lr * decay) - lr * m_hat / denom;
        } else {
          const double g = gradient[t][i] + decay * w;
          state1[t][i] = optimizer.momentum * state1[t][i] + g;
          expected =
              w - lr * (optimizer.nesterov ? g + optimizer.momentum * state1[t][i] : state1[t][i]);
        }
        ASSERT_NEAR(after[t].values[i], expected, 2e-6 + 2e-4 * std::abs(expected - w))
            << "step " << step << " " << before[t].name << "[" << i << "]";
      }
    }
  }
}

TEST(OptimizerTest, SgdMomentumWeightDecay) {
  OptimizerConfig optimizer;
  optimizer.momentum = 0.9;
  optimizer.weight_decay = 0.05;
  CheckAgainstReference(optimizer);
}

TEST(OptimizerTest, SgdNesterov) {
  OptimizerConfig optimizer;
  optimizer.momentum = 0.8;
  optimizer.nesterov = true;
  optimizer.weight_decay = 0.01;
  CheckAgainstReference(optimizer);
}

TEST(OptimizerTest, AdamW) {
  OptimizerConfig optimizer;
  optimizer.type = OptimizerType::kAdamW;
  optimizer.weight_decay = 0.1;
  CheckAgainstReference(optimizer);
}

TEST(OptimizerTest, AdamWWithClipping) {
  OptimizerConfig optimizer;
  optimizer.type = OptimizerType::kAdamW;
  optimizer.beta1 = 0.8;
  optimizer.beta2 = 0.99;
  optimizer.eps = 1e-6;
  optimizer.clip_grad_norm = 0.05;
  CheckAgainstReference(optimizer);
}

TEST(OptimizerTest, SgdWithClipping) {
  OptimizerConfig optimizer;
  optimizer.momentum = 0.9;
  optimizer.clip_grad_norm = 0.05;
  CheckAgainstReference(optimizer);
}

}  // namespace
}  // namespace stoker
