// The cpu network's vision layers (issue 15): BatchNorm2d/1d, AvgPool2d, global average pooling,
// bias-free Conv2d/Linear, residual blocks (projection and identity shortcuts) and label
// smoothing. Gradients against central differences of the double reference
// (ReferenceBatchLoss), BatchNorm's running statistics and evaluation against hand computations,
// bf16/fp16 against fp32, weight decay only on Conv2d/Linear weights, exact resumption with the
// running statistics, PyTorch names, and errors naming nested layers.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "engine/cpu/network_test_util.h"
#include "engine/model_shapes.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace stoker::testing_util;  // NOLINT: test helpers
using namespace stoker::test_layers;   // NOLINT: Conv, Pool, Linear, Of

// conv (no bias) k3 pad 1, BatchNorm2d, ReLU, AvgPool k2, Flatten, Linear.
NetworkConfig BatchNorm2dNet() {
  return TinyNet({2, 6, 6},
                 {NoBias(Conv(3, 3, 1, 1)), Norm2d(), Of(Kind::kRelu), AvgPool(2),
                  Of(Kind::kFlatten), Linear(3)},
                 21);
}

// Flat: Linear (no bias), BatchNorm1d, GELU, Linear; with label smoothing 0.2.
NetworkConfig BatchNorm1dNet() {
  NetworkConfig config =
      TinyNet({6}, {NoBias(Linear(5)), Norm1d(), Of(Kind::kGelu), Linear(3)}, 22);
  config.label_smoothing = 0.2f;
  return config;
}

// conv k3, AvgPool k3 s2 p1 (count_include_pad: the border windows divide by 9), GELU,
// global average pooling, Linear off [C, 1, 1].
NetworkConfig AvgPoolNet() {
  return TinyNet(
      {1, 7, 7},
      {Conv(3, 3, 1, 0), AvgPool(3, 2, 1), Of(Kind::kGelu), Of(Kind::kGlobalAvgPool), Linear(3)},
      23);
}

// A ResNet basic block with a projection: conv, BN, ReLU, then
// residual(conv s2 (no bias), BN, ReLU, conv (no bias), BN | conv 1x1 s2 (no bias), BN) + ReLU,
// global average pooling, Linear.
NetworkConfig ProjectionNet() {
  return TinyNet({2, 6, 6},
                 {Conv(3, 3, 1, 1), Norm2d(), Of(Kind::kRelu),
                  Residual({NoBias(Conv(4, 3, 2, 1)), Norm2d(), Of(Kind::kRelu),
                            NoBias(Conv(4, 3, 1, 1)), Norm2d()},
                           {NoBias(Conv(4, 1, 2, 0)), Norm2d()}),
                  Of(Kind::kGlobalAvgPool), Of(Kind::kFlatten), Linear(3)},
                 24);
}

// Identity shortcuts: a block straight on the input (no gradient needed there), then conv, then
// a ReLU block and a GELU block, global average pooling, Linear.
NetworkConfig IdentityNet() {
  return TinyNet({2, 5, 5},
                 {Residual({Conv(2, 3, 1, 1), Norm2d()}, {}), Conv(3, 3, 1, 1),
                  Residual({NoBias(Conv(3, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                            NoBias(Conv(3, 3, 1, 1)), Norm2d()},
                           {}),
                  Residual({Conv(3, 1, 1, 0)}, {}, LayerConfig::Activation::kGelu),
                  Of(Kind::kGlobalAvgPool), Linear(3)},
                 25);
}

// True for the tensors that have a gradient (not BatchNorm's buffers).
std::vector<bool> Trained(const NetworkConfig& config) {
  std::vector<bool> trained;
  for (const NetworkTensorSpec& spec : NetworkTensorSpecs(config)) {
    trained.push_back(IsTrainedTensor(spec.kind));
  }
  return trained;
}

// Gives `model` the initial values `start` (another network's: the layer indices, hence the
// names, may differ).
void SetStart(const std::vector<NamedTensor>& start, Model& model, const std::string& label) {
  std::vector<NamedTensor> values = model.Parameters();
  ASSERT_EQ(values.size(), start.size()) << label;
  for (size_t t = 0; t < values.size(); ++t) values[t].values = start[t].values;
  ASSERT_TRUE(model.SetParameters(values).ok()) << label;
}

// `b` from `a`'s initial values, then both trained three steps on batches from seed `seed` on
// (the last a partial batch) and evaluated: every loss, parameter and evaluation the same bits.
void ExpectSameTrainingBits(Model& a, Model& b, const NetworkConfig& config, uint64_t seed,
                            const std::string& label) {
  SetStart(a.Parameters(), b, label);
  for (int step = 0; step < 3; ++step) {
    const FeatureBatch batch = RandomFeatures(step == 2 ? 5 : 8, Features(config), 3, seed + step);
    absl::StatusOr<StepResult> ra = a.TrainStep(batch.View(), 0.1);
    absl::StatusOr<StepResult> rb = b.TrainStep(batch.View(), 0.1);
    ASSERT_TRUE(ra.ok() && rb.ok()) << label;
    EXPECT_EQ(ra->loss, rb->loss) << label << " step " << step;
  }
  const std::vector<NamedTensor> pa = a.Parameters(), pb = b.Parameters();
  for (size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(pa[t].values, pb[t].values) << label << " " << pa[t].name;
  }
  const FeatureBatch test = RandomFeatures(8, Features(config), 3, 99);
  absl::StatusOr<EvalResult> ea = a.Evaluate(test.View());
  absl::StatusOr<EvalResult> eb = b.Evaluate(test.View());
  ASSERT_TRUE(ea.ok() && eb.ok()) << label;
  EXPECT_EQ(ea->loss_sum, eb->loss_sum) << label;
  EXPECT_EQ(ea->correct, eb->correct) << label;
}

// The fp32 engine's training loss and gradients against the double reference (batch statistics)
// and its central differences: |g - fd| <= 3e-3 |fd| + 3e-5 per element (BatchNorm divides by the
// batch's deviation, which amplifies fp32 rounding a little beyond the plain layers' 2e-3).
void CheckGradient(const NetworkConfig& config, int count, uint64_t seed) {
  testing_util::CheckGradient(config, count, seed, 3e-3, 3e-5, /*check_evaluate=*/false);
}

TEST(VisionLayersTest, BatchNorm2dBiasFreeConvAvgPoolGradients) {
  CheckGradient(BatchNorm2dNet(), 4, 1);
  CheckGradient(BatchNorm2dNet(), 3, 2);  // a partial batch
}
TEST(VisionLayersTest, BatchNorm1dBiasFreeLinearLabelSmoothingGradients) {
  CheckGradient(BatchNorm1dNet(), 4, 3);
}
TEST(VisionLayersTest, PaddedAvgPoolAndGlobalAvgPoolGradients) {
  CheckGradient(AvgPoolNet(), 4, 4);
}
TEST(VisionLayersTest, ResidualProjectionShortcutGradients) {
  CheckGradient(ProjectionNet(), 4, 5);
}
// (Batch seed 6 puts a ReLU input 1.5e-7 from 0, where the central difference straddles the kink.)
TEST(VisionLayersTest, ResidualIdentityShortcutGradients) { CheckGradient(IdentityNet(), 4, 9); }

// Convolutions from 16 channels to 16 run on oneDNN's nChw16c view of their NHWC activations
// where that is faster (PlanConv2d): the same bytes, so the same loss and gradients.
TEST(VisionLayersTest, SixteenChannelConvolutionGradients) {
  CheckGradient(TinyNet({16, 4, 4},
                        {NoBias(Conv(16, 3, 1, 1)), Norm2d(), Of(Kind::kRelu), Conv(16, 3, 1, 1),
                         Of(Kind::kGlobalAvgPool), Linear(3)},
                        26),
                3, 10);
}

TEST(VisionLayersTest, ParameterAndBufferNamesFollowPyTorch) {
  std::unique_ptr<Model> model = MakeNetwork(ProjectionNet());
  ASSERT_NE(model, nullptr);
  std::vector<std::string> names;
  for (const NamedTensor& t : model->Parameters()) names.push_back(t.name);
  const std::vector<std::string> bn = {".weight", ".bias", ".running_mean", ".running_var",
                                       ".num_batches_tracked"};
  std::vector<std::string> expected = {"layers.0.weight", "layers.0.bias"};
  for (const std::string& s : bn) expected.push_back("layers.1" + s);
  expected.push_back("layers.3.layers.0.weight");
  for (const std::string& s : bn) expected.push_back("layers.3.layers.1" + s);
  expected.push_back("layers.3.layers.3.weight");
  for (const std::string& s : bn) expected.push_back("layers.3.layers.4" + s);
  expected.push_back("layers.3.shortcut.0.weight");
  for (const std::string& s : bn) expected.push_back("layers.3.shortcut.1" + s);
  expected.push_back("layers.6.weight");
  expected.push_back("layers.6.bias");
  EXPECT_EQ(names, expected);
  const std::vector<NamedTensor> tensors = model->Parameters();
  EXPECT_EQ(tensors[2].values, std::vector<float>(3, 1.0f));  // BN weight
  EXPECT_EQ(tensors[3].values, std::vector<float>(3, 0.0f));  // BN bias
  EXPECT_EQ(tensors[5].values, std::vector<float>(3, 1.0f));  // running_var
  EXPECT_EQ(tensors[6].shape, std::vector<int64_t>{1});       // num_batches_tracked
  // Optimizer state only for the trained tensors.
  for (const NamedTensor& t : model->OptimizerState()) {
    EXPECT_EQ(t.name.find("running"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("num_batches"), std::string::npos) << t.name;
  }
}

// BatchNorm2d straight on the input: its batch statistics are the input's, computed here by hand.
// With lr = 0 the batch is the same every step, so after k steps
// running_mean = (1 - (1 - m)^k) mean and running_var = (1 - m)^k + (1 - (1 - m)^k) var_unbiased
// (PyTorch's update from 0 and 1). Evaluate normalises by them; TrainStep by the batch's.
TEST(VisionLayersTest, BatchNormRunningStatisticsAndEvaluation) {
  NetworkConfig config = TinyNet({2, 3, 3}, {Norm2d(), Of(Kind::kFlatten), Linear(3)}, 31);
  config.layers[0].momentum = 0.3f;
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_NE(model, nullptr);
  const FeatureBatch batch = RandomFeatures(4, 18, 3, 7);
  const int steps = 3;
  float train_loss = 0;
  for (int k = 0; k < steps; ++k) {
    absl::StatusOr<StepResult> step = model->TrainStep(batch.View(), 0.0);
    ASSERT_TRUE(step.ok()) << step.status();
    train_loss = step->loss;
  }
  const std::vector<NamedTensor> tensors = model->Parameters();
  ASSERT_EQ(tensors[2].name, "layers.0.running_mean");
  const double keep = std::pow(1 - 0.3, steps);
  for (int c = 0; c < 2; ++c) {
    double sum = 0, squares = 0;
    for (int s = 0; s < 4; ++s) {
      for (int i = 0; i < 9; ++i) sum += batch.features[s * 18 + c * 9 + i];
    }
    const double mean = sum / 36;
    for (int s = 0; s < 4; ++s) {
      for (int i = 0; i < 9; ++i) {
        const double d = batch.features[s * 18 + c * 9 + i] - mean;
        squares += d * d;
      }
    }
    const double unbiased = squares / 35;
    EXPECT_NEAR(tensors[2].values[c], (1 - keep) * mean, 1e-6) << c;
    EXPECT_NEAR(tensors[3].values[c], keep + (1 - keep) * unbiased, 1e-6) << c;
  }
  EXPECT_EQ(tensors[4].values, std::vector<float>{3.0f});
  const DoubleParams params = ToDouble(tensors);
  absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
  ASSERT_TRUE(eval.ok()) << eval.status();
  const double eval_reference = ReferenceBatchLoss(config, params, batch, /*training=*/false);
  EXPECT_NEAR(eval->loss_sum / 4, eval_reference, 1e-5 * eval_reference);
  EXPECT_NEAR(train_loss, ReferenceBatchLoss(config, params, batch, true), 1e-5);
  EXPECT_GT(std::abs(eval_reference - train_loss), 1e-3);  // the two modes differ here
  // Evaluate changes no statistics.
  EXPECT_EQ(model->Parameters()[3].values, tensors[3].values);
}

// Label smoothing in Evaluate's loss sum: the formula, (1 - s) * nll + s * mean_k(-log p_k).
TEST(VisionLayersTest, LabelSmoothingLossMatchesFormula) {
  NetworkConfig config = TinyNet({4}, {Linear(3)}, 32);
  config.label_smoothing = 0.3f;
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_NE(model, nullptr);
  const FeatureBatch batch = RandomFeatures(4, 4, 3, 8);
  const std::vector<NamedTensor> p = model->Parameters();
  double expected = 0;
  for (int s = 0; s < 4; ++s) {
    double z[3], lse = 0;
    for (int o = 0; o < 3; ++o) {
      z[o] = p[1].values[o];
      for (int i = 0; i < 4; ++i)
        z[o] += double{p[0].values[o * 4 + i]} * batch.features[s * 4 + i];
      lse += std::exp(z[o]);
    }
    lse = std::log(lse);
    double nll_sum = 0;
    for (int o = 0; o < 3; ++o) nll_sum += lse - z[o];
    expected += 0.7 * (lse - z[batch.labels[s]]) + 0.3 * nll_sum / 3;
  }
  absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->loss_sum, expected, 1e-5 * expected);
  config.label_smoothing = 0;
  std::unique_ptr<Model> plain = MakeNetwork(config);
  ASSERT_NE(plain, nullptr);
  EXPECT_GT(std::abs(plain->Evaluate(batch.View())->loss_sum - expected), 1e-3);
}

// Weight decay touches Conv2d and Linear weights only: two models from one seed, one with decay,
// take one step on the same batch (same gradients): biases and BatchNorm's parameters come out
// bit-identical, the weights differ by lr * wd * w (SGD with momentum and Nesterov, and AdamW).
TEST(VisionLayersTest, WeightDecayOnlyOnConvAndLinearWeights) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdamW}) {
    NetworkConfig config = ProjectionNet();
    config.optimizer.type = type;
    if (type == OptimizerType::kSgd) {
      config.optimizer.momentum = 0.9;
      config.optimizer.nesterov = true;
    }
    std::unique_ptr<Model> plain = MakeNetwork(config);
    config.optimizer.weight_decay = 0.5;
    std::unique_ptr<Model> decayed = MakeNetwork(config);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(decayed, nullptr);
    const FeatureBatch batch = RandomFeatures(4, Features(config), 3, 9);
    const std::vector<NamedTensor> before = plain->Parameters();
    ASSERT_TRUE(plain->TrainStep(batch.View(), 0.1).ok());
    ASSERT_TRUE(decayed->TrainStep(batch.View(), 0.1).ok());
    const std::vector<NamedTensor> a = plain->Parameters(), b = decayed->Parameters();
    const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config);
    int decayed_tensors = 0;
    for (size_t t = 0; t < a.size(); ++t) {
      if (!IsDecayedTensor(specs[t].kind)) {
        EXPECT_EQ(a[t].values, b[t].values) << a[t].name;
        continue;
      }
      ++decayed_tensors;
      double diff = 0, norm = 0;
      for (size_t i = 0; i < a[t].values.size(); ++i) {
        diff += std::abs(a[t].values[i] - b[t].values[i]);
        norm += 0.1 * 0.5 * std::abs(before[t].values[i]);
      }
      // SGD (Nesterov, first step): w -= lr * (g + wd w) * (1 + mu); AdamW: w *= 1 - lr wd.
      const double factor = type == OptimizerType::kSgd ? 1.9 : 1.0;
      EXPECT_NEAR(diff, factor * norm, 0.02 * factor * norm) << a[t].name;
    }
    EXPECT_EQ(decayed_tensors, 5);
  }
}

// bf16 and fp16 against fp32 on the projection block: the first step's loss within 2e-2
// (relative), the trained tensors' step within 0.1 (bf16) and 0.01 (fp16) relative L2, and the
// running statistics within 2e-2 and 5e-3 (they stay fp32; only the activations are rounded).
TEST(VisionLayersTest, Bf16AndFp16AgreeWithFp32) {
  NetworkConfig config = ProjectionNet();
  // The first conv's bias feeds a BatchNorm, so its gradient is 0 up to rounding: no relative
  // comparison is possible for it.
  config.layers[0].bias = false;
  config.max_batch = 8;
  const FeatureBatch batch = RandomFeatures(8, Features(config), 3, 10);
  std::unique_ptr<Model> reference = MakeNetwork(config);
  ASSERT_NE(reference, nullptr);
  float reference_loss = 0;
  const DoubleParams reference_step = StepGradient(*reference, batch.View(), 1.0, &reference_loss);
  const DoubleParams reference_after = ToDouble(reference->Parameters());
  const std::vector<bool> trained = Trained(config);
  for (auto [precision, tolerance] :
       {std::pair{Precision::kBf16, 0.1}, std::pair{Precision::kFp16, 0.01}}) {
    config.precision = precision;
    std::unique_ptr<Model> model = MakeNetwork(config);
    ASSERT_NE(model, nullptr);
    float loss = 0;
    const DoubleParams step = StepGradient(*model, batch.View(), 1.0, &loss);
    EXPECT_NEAR(loss, reference_loss, 2e-2 * reference_loss) << PrecisionName(precision);
    const DoubleParams after = ToDouble(model->Parameters());
    for (size_t t = 0; t < step.size(); ++t) {
      if (trained[t]) {
        EXPECT_LT(RelativeDifference(step[t], reference_step[t]), tolerance)
            << PrecisionName(precision) << " tensor " << t;
      } else if (after[t].size() > 1) {
        EXPECT_LT(RelativeDifference(after[t], reference_after[t]), tolerance / 2)
            << PrecisionName(precision) << " buffer " << t;
      }
    }
  }
}

// Parameters() (with the running statistics) and OptimizerState() into a fresh model continue
// bit-exactly: the same losses and parameters for the next steps.
TEST(VisionLayersTest, ResumeContinuesExactlyWithRunningStatistics) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    NetworkConfig config = ProjectionNet();
    config.precision = precision;
    config.optimizer.momentum = 0.9;
    config.optimizer.weight_decay = 1e-3;
    std::unique_ptr<Model> first = MakeNetwork(config);
    ASSERT_NE(first, nullptr);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(
          first->TrainStep(RandomFeatures(4, Features(config), 3, 40 + s).View(), 0.05).ok());
    }
    std::unique_ptr<Model> resumed = MakeNetwork(config);
    ASSERT_NE(resumed, nullptr);
    ASSERT_TRUE(resumed->SetParameters(first->Parameters()).ok());
    ASSERT_TRUE(resumed->SetOptimizerState(first->OptimizerState()).ok());
    for (int s = 3; s < 6; ++s) {
      const FeatureBatch batch = RandomFeatures(s == 5 ? 3 : 4, Features(config), 3, 40 + s);
      absl::StatusOr<StepResult> a = first->TrainStep(batch.View(), 0.05);
      absl::StatusOr<StepResult> b = resumed->TrainStep(batch.View(), 0.05);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->loss, b->loss) << PrecisionName(precision) << " step " << s;
    }
    ExpectSameParameters(*first, *resumed, PrecisionName(precision));
    const FeatureBatch test = RandomFeatures(4, Features(config), 3, 99);
    EXPECT_EQ(first->Evaluate(test.View())->loss_sum, resumed->Evaluate(test.View())->loss_sum);
  }
}

// The cpu network folds a ReLU into the BatchNorm before it (fuse_norm_relu, not in fp16) and
// into the MaxPool2d after it (applied to the pooled values: a 2x2 pool of Stoker's own and a
// padded 3x3 one of oneDNN's). A Dropout of rate 0 (a copy) between them keeps them apart: both
// networks must train and evaluate to the same bits, at width 16 (the bf16 BatchNorm jit kernels)
// and 4 (bf16 BatchNorm through f32 copies), with a partial batch.
TEST(VisionLayersTest, FusedReluTrainsAsTheUnfusedLayers) {
  auto net = [](int width, bool apart) {
    auto gap = [apart](std::vector<LayerConfig> layers) {
      std::vector<LayerConfig> out;
      for (size_t i = 0; i < layers.size(); ++i) {
        out.push_back(layers[i]);
        const bool before_relu = i + 1 < layers.size() && layers[i + 1].kind == Kind::kRelu;
        const bool relu_before_pool = layers[i].kind == Kind::kRelu && i + 1 < layers.size() &&
                                      layers[i + 1].kind == Kind::kMaxPool2d;
        if (apart &&
            (((layers[i].kind == Kind::kBatchNorm2d || layers[i].kind == Kind::kBatchNorm1d) &&
              before_relu) ||
             relu_before_pool)) {
          out.push_back(Dropout(0));
        }
      }
      return out;
    };
    NetworkConfig config =
        TinyNet({3, 8, 8},
                gap({NoBias(Conv(width, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                     Residual(gap({NoBias(Conv(width, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                                   NoBias(Conv(width, 3, 1, 1)), Norm2d()}),
                              {}),
                     Conv(width, 3, 1, 1), Of(Kind::kRelu), Pool(2, 0, 0), Conv(width, 3, 1, 1),
                     Of(Kind::kRelu), Pool(3, 2, 1), Of(Kind::kFlatten), NoBias(Linear(width)),
                     Norm1d(), Of(Kind::kRelu), Linear(3)}),
                31);
    config.max_batch = 8;
    config.optimizer.momentum = 0.9;
    config.optimizer.weight_decay = 1e-3;
    return config;
  };
  for (int width : {16, 4}) {
    for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
      const std::string label = absl::StrCat(PrecisionName(precision), " width ", width);
      NetworkConfig fused_config = net(width, false);
      NetworkConfig apart_config = net(width, true);
      fused_config.precision = apart_config.precision = precision;
      std::unique_ptr<Model> fused = MakeNetwork(fused_config);
      std::unique_ptr<Model> apart = MakeNetwork(apart_config);
      ASSERT_TRUE(fused && apart) << label;
      ExpectSameTrainingBits(*fused, *apart, fused_config, 70, label);
    }
  }
}

// A residual block's sum (and its ReLU) is computed by the BatchNorm that makes one of its
// inputs (FuseNormAdds: the branch that runs last, the main branch's with an identity shortcut,
// else the projection shortcut's). A Dropout of rate 0 (a copy) at the end of each branch keeps
// them apart. fp32: the fused sum is the same additions, so both networks train and evaluate to
// the same bits; bf16: the unfused path rounds the BatchNorm's output to bf16 before the sum and
// the fused one does not, so each is held to fp32's step as bf16 is elsewhere. Blocks with a ReLU
// after the sum and without, an identity shortcut and projection ones (one whose main branch ends
// in a convolution), width 16 (the unrolled kernels) and 6, a partial batch.
TEST(VisionLayersTest, FusedResidualSumTrainsAsTheUnfusedLayers) {
  auto net = [](int width, bool apart) {
    auto branch = [apart](std::vector<LayerConfig> layers) {
      if (apart) layers.push_back(Dropout(0));
      return layers;
    };
    NetworkConfig config =
        TinyNet({3, 8, 8},
                {NoBias(Conv(width, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                 Residual(branch({NoBias(Conv(width, 3, 1, 1)), Norm2d(), Of(Kind::kRelu),
                                  NoBias(Conv(width, 3, 1, 1)), Norm2d()}),
                          {}),
                 Residual(branch({NoBias(Conv(width, 3, 1, 1)), Norm2d()}), {},
                          LayerConfig::Activation::kNone),
                 Residual(branch({NoBias(Conv(2 * width, 3, 2, 1)), Norm2d(), Of(Kind::kRelu),
                                  NoBias(Conv(2 * width, 3, 1, 1)), Norm2d()}),
                          branch({NoBias(Conv(2 * width, 1, 2, 0)), Norm2d()})),
                 Residual(branch({NoBias(Conv(2 * width, 3, 1, 1))}),
                          branch({NoBias(Conv(2 * width, 1, 1, 0)), Norm2d()})),
                 Of(Kind::kGlobalAvgPool), Of(Kind::kFlatten), Linear(3)},
                37);
    config.max_batch = 8;
    config.optimizer.momentum = 0.9;
    config.optimizer.weight_decay = 1e-3;
    return config;
  };
  // Which path ran, from the kernels a step runs: the four blocks' sums fused in one network,
  // none in the other (`what` "residual sum fused"); the three ReLU'd sums' backward left to
  // their BatchNorms (`what` "add backward_data": fewer kernels).
  auto kernels_named = [](Model& model, const std::string& what) {
    absl::StatusOr<std::vector<KernelTime>> kernels = model.TimeKernels(8, 1);
    EXPECT_TRUE(kernels.ok()) << kernels.status();
    int n = 0;
    for (const KernelTime& k : kernels.ok() ? *kernels : std::vector<KernelTime>{}) {
      n += absl::StrContains(k.name, what);
    }
    return n;
  };
  auto fused_sums = [&](Model& model) { return kernels_named(model, "residual sum fused"); };
  for (int width : {16, 6}) {
    const std::string label = absl::StrCat("width ", width);
    NetworkConfig fused_config = net(width, false);
    NetworkConfig apart_config = net(width, true);
    std::unique_ptr<Model> fused = MakeNetwork(fused_config);
    std::unique_ptr<Model> apart = MakeNetwork(apart_config);
    ASSERT_TRUE(fused && apart) << label;
    // The same initial values (the layer indices, hence the names, differ).
    const std::vector<NamedTensor> start = fused->Parameters();
    // fp32: three steps (the last a partial batch) and an evaluation, bit for bit.
    ExpectSameTrainingBits(*fused, *apart, fused_config, 80, label);
    EXPECT_EQ(fused_sums(*fused), 4) << label;
    EXPECT_EQ(fused_sums(*apart), 0) << label;
    EXPECT_LT(kernels_named(*fused, "add backward_data"),
              kernels_named(*apart, "add backward_data") - 2)
        << label;

    // bf16: one step of each from the same start, against fp32's. The unfused path rounds the
    // BatchNorm's output to bf16 before the sum and the fused one does not, so they are not
    // bit-equal; each must track fp32 alike.
    std::unique_ptr<Model> reference = MakeNetwork(apart_config);
    ASSERT_NE(reference, nullptr);
    SetStart(start, *reference, label);
    fused_config.precision = apart_config.precision = Precision::kBf16;
    std::unique_ptr<Model> fused_bf16 = MakeNetwork(fused_config);
    std::unique_ptr<Model> apart_bf16 = MakeNetwork(apart_config);
    ASSERT_TRUE(fused_bf16 && apart_bf16) << label;
    SetStart(start, *fused_bf16, label);
    SetStart(start, *apart_bf16, label);
    const FeatureBatch batch = RandomFeatures(8, Features(fused_config), 3, 90);
    float reference_loss = 0, fused_loss = 0, apart_loss = 0;
    const DoubleParams reference_step =
        StepGradient(*reference, batch.View(), 1.0, &reference_loss);
    const DoubleParams fused_step = StepGradient(*fused_bf16, batch.View(), 1.0, &fused_loss);
    const DoubleParams apart_step = StepGradient(*apart_bf16, batch.View(), 1.0, &apart_loss);
    EXPECT_NEAR(fused_loss, reference_loss, 2e-2 * reference_loss) << label;
    EXPECT_NEAR(apart_loss, reference_loss, 2e-2 * reference_loss) << label;
    const std::vector<bool> trained = Trained(fused_config);
    // Five residual blocks deep and batch 8, bf16's update is 10-25 % from fp32's tensor by
    // tensor, fused or not (measured): over the whole model, the fused one must be about as close
    // as the unfused one, and never far.
    std::vector<double> fused_all, apart_all, reference_all;
    for (size_t t = 0; t < reference_step.size(); ++t) {
      if (!trained[t]) continue;
      fused_all.insert(fused_all.end(), fused_step[t].begin(), fused_step[t].end());
      apart_all.insert(apart_all.end(), apart_step[t].begin(), apart_step[t].end());
      reference_all.insert(reference_all.end(), reference_step[t].begin(), reference_step[t].end());
    }
    const double fused_off = RelativeDifference(fused_all, reference_all);
    const double apart_off = RelativeDifference(apart_all, reference_all);
    std::cout << label << ": bf16 update against fp32's: fused " << fused_off << ", unfused "
              << apart_off << "\n";
    EXPECT_LT(fused_off, 0.2) << label;
    EXPECT_LT(fused_off, 1.25 * apart_off + 0.02) << label << " (unfused " << apart_off << ")";
    EXPECT_EQ(fused_sums(*fused_bf16), 4) << label;
  }
}

// bf16 convolutions on images of at most 7x7 take their weight gradient from f32 copies when
// oneDNN's bf16 kernel for it is AMX's (faster there). 16 channels on 7x7 images, so that kernel
// is the one oneDNN picks on an AMX CPU: the bf16 gradient tracks fp32's, a partial batch plans
// and trains too, and a copy resumed from Parameters() and OptimizerState() continues bit-exactly.
TEST(VisionLayersTest, Bf16SmallImageWeightGradientsTrackFp32) {
  NetworkConfig config =
      TinyNet({16, 7, 7},
              {NoBias(Conv(16, 3, 1, 1)), Norm2d(), Of(Kind::kRelu), NoBias(Conv(16, 3, 1, 1)),
               Norm2d(), Of(Kind::kRelu), Of(Kind::kGlobalAvgPool), Linear(3)},
              41);
  config.max_batch = 8;
  const FeatureBatch batch = RandomFeatures(8, Features(config), 3, 11);
  std::unique_ptr<Model> fp32 = MakeNetwork(config);
  config.precision = Precision::kBf16;
  std::unique_ptr<Model> bf16 = MakeNetwork(config);
  ASSERT_TRUE(fp32 && bf16);
  const DoubleParams fp32_step = StepGradient(*fp32, batch.View(), 1.0, nullptr);
  const DoubleParams bf16_step = StepGradient(*bf16, batch.View(), 1.0, nullptr);
  const std::vector<bool> trained = Trained(config);
  for (size_t t = 0; t < fp32_step.size(); ++t) {
    if (trained[t]) {
      EXPECT_LT(RelativeDifference(bf16_step[t], fp32_step[t]), 0.1) << t;
    }
  }
  std::unique_ptr<Model> resumed = MakeNetwork(config);
  ASSERT_NE(resumed, nullptr);
  ASSERT_TRUE(resumed->SetParameters(bf16->Parameters()).ok());
  ASSERT_TRUE(resumed->SetOptimizerState(bf16->OptimizerState()).ok());
  for (int count : {8, 5}) {
    const FeatureBatch next = RandomFeatures(count, Features(config), 3, 20 + count);
    absl::StatusOr<StepResult> a = bf16->TrainStep(next.View(), 0.1);
    absl::StatusOr<StepResult> b = resumed->TrainStep(next.View(), 0.1);
    ASSERT_TRUE(a.ok() && b.ok()) << count;
    EXPECT_EQ(a->loss, b->loss) << count;
  }
  ExpectSameParameters(*bf16, *resumed, "bf16 7x7");
}

TEST(VisionLayersTest, BadNestedConfigsNameTheNestedLayer) {
  struct Case {
    NetworkConfig config;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({TinyNet({1, 8, 8},
                           {Conv(2, 3, 2, 0), Residual({Conv(2, 1, 1, 0), Conv(2, 5, 1, 0)}, {}),
                            Of(Kind::kGlobalAvgPool), Linear(3)},
                           1),
                   "layers[1].layers[1] (conv2d): kernel 5 larger than input 3x3"});
  cases.push_back({TinyNet({2, 4, 4},
                           {Residual({Conv(2, 3, 1, 1)},
                                     {Residual({Of(Kind::kRelu)}, {Of(Kind::kBatchNorm1d)})}),
                            Of(Kind::kGlobalAvgPool), Linear(3)},
                           1),
                   "layers[0].shortcut[0].shortcut[0] (batchnorm1d): needs a flat"});
  cases.push_back(
      {TinyNet({2, 4, 4}, {Residual({Conv(3, 3, 1, 1)}, {}), Of(Kind::kGlobalAvgPool), Linear(3)},
               1),
       "layers[0] (residual): the main branch gives [3x4x4] but the identity shortcut "
       "gives [2x4x4]"});
  cases.push_back({TinyNet({2, 4, 4}, {Residual({}, {}), Of(Kind::kGlobalAvgPool), Linear(3)}, 1),
                   "layers[0] (residual): the main branch `layers` is empty"});
  NetworkConfig smoothing = TinyNet({4}, {Linear(3)}, 1);
  smoothing.label_smoothing = 1;
  cases.push_back({smoothing, "label_smoothing must be in [0, 1)"});
  LayerConfig deep = Conv(2, 1, 1, 0);
  for (int d = 0; d < 20; ++d) deep = Residual({deep}, {});
  cases.push_back({TinyNet({2, 4, 4}, {deep, Of(Kind::kGlobalAvgPool), Linear(3)}, 1),
                   "nested deeper than 16"});
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  ASSERT_TRUE(backend.ok());
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(c.config);
    ASSERT_FALSE(model.ok()) << c.message;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(model.status().message()).find(c.message), std::string::npos)
        << model.status();
  }
}

// Footprint and flops see the layers inside blocks.
TEST(VisionLayersTest, FlopsAndFootprintCountNestedLayers) {
  const NetworkConfig config = ProjectionNet();
  // conv 2->3 k3 on 6x6, conv 3->4 k3 s2 -> 3x3, conv 4->4 k3 3x3, conv 3->4 k1 s2 3x3, linear.
  const int64_t flops = 2 * (3 * 36 * 2 * 9 + 4 * 9 * 3 * 9 + 4 * 9 * 4 * 9 + 4 * 9 * 3 + 4 * 3);
  EXPECT_EQ(NetworkForwardFlopsPerSample(config), flops);
  absl::StatusOr<TrainingFootprint> footprint = EstimateTrainingFootprint(config);
  ASSERT_TRUE(footprint.ok());
  // Trained: conv0 54+3, BN 3+3, conv 108, BN 8, conv 144, BN 8, shortcut conv 12, BN 8, linear 15.
  EXPECT_EQ(footprint->parameters, 57 + 6 + 108 + 8 + 144 + 8 + 12 + 8 + 15);
}

// The network of pytorch_step.py: every new kind (bias-free conv and linear, BatchNorm2d/1d, a
// projection and an identity block, padded AvgPool2d, global average pooling) and label smoothing.
NetworkConfig PyTorchNet() {
  NetworkConfig config = TinyNet(
      {2, 6, 6},
      {Conv(4, 3, 1, 1), Norm2d(), Of(Kind::kRelu),
       Residual({NoBias(Conv(6, 3, 2, 1)), Norm2d(), Of(Kind::kRelu), NoBias(Conv(6, 3, 1, 1)),
                 Norm2d()},
                {NoBias(Conv(6, 1, 2, 0)), Norm2d()}),
       Residual({Conv(6, 3, 1, 1), Norm2d()}, {}), AvgPool(3, 1, 1), Of(Kind::kGlobalAvgPool),
       Of(Kind::kFlatten), NoBias(Linear(5)), Norm1d(), Of(Kind::kGelu), Linear(3)},
      26);
  config.label_smoothing = 0.1f;
  return config;
}

void WriteValues(std::ostream& out, const std::vector<float>& values) {
  out.precision(9);
  for (float v : values) out << " " << v;
  out << "\n";
}

// One training step and an evaluation against PyTorch 1.13 (pytorch_step.py, which loads the
// engine's Parameters() with load_state_dict(strict=True)): the training loss and the evaluation
// loss within 1e-5 (relative), every tensor after the step (parameters, running statistics,
// num_batches_tracked) within 2e-5 + 1e-4 relative. Skipped when /usr/bin/python3 has no torch.
TEST(VisionLayersTest, PyTorchAgreesOnOneStepAndEvaluation) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no torch";
  }
  const NetworkConfig config = PyTorchNet();
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_NE(model, nullptr);
  const FeatureBatch batch = RandomFeatures(4, Features(config), 3, 12);
  const double lr = 0.5;
  const std::string in_path = ::testing::TempDir() + "/vision_pytorch_in.txt";
  const std::string out_path = ::testing::TempDir() + "/vision_pytorch_out.txt";
  {
    std::ofstream in(in_path);
    in << "x";
    WriteValues(in, batch.features);
    in << "y";
    for (uint8_t label : batch.labels) in << " " << int{label};
    in << "\nlr " << lr << "\n";
    for (const NamedTensor& t : model->Parameters()) {
      in << "p " << t.name;
      WriteValues(in, t.values);
    }
  }
  const std::string command =
      std::string("/usr/bin/python3 ") + STOKER_PYTORCH_STEP + " " + in_path + " " + out_path;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::map<std::string, std::vector<double>> expected;
  double expected_loss = 0, expected_eval = 0;
  std::ifstream out(out_path);
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (tag == "loss") fields >> expected_loss;
    if (tag == "eval") fields >> expected_eval;
    if (tag == "p") {
      std::string name;
      fields >> name;
      double v;
      while (fields >> v) expected[name].push_back(v);
    }
  }
  absl::StatusOr<StepResult> step = model->TrainStep(batch.View(), lr);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, expected_loss, 1e-5 * expected_loss);
  const std::vector<NamedTensor> after = model->Parameters();
  EXPECT_EQ(after.size(), expected.size());
  for (const NamedTensor& t : after) {
    ASSERT_EQ(expected.count(t.name), 1u) << t.name;
    const std::vector<double>& want = expected[t.name];
    ASSERT_EQ(want.size(), t.values.size()) << t.name;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(t.values[i], want[i], 2e-5 + 1e-4 * std::abs(want[i]))
          << t.name << "[" << i << "]";
    }
  }
  absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->loss_sum, expected_eval, 1e-5 * expected_eval);
}

// One value per channel in a training batch (batch 1 into a BatchNorm1d, N x H x W = 1 into a
// BatchNorm2d) is refused as PyTorch refuses it, naming the layer; nothing changes (no NaN in
// the weights or the running statistics, the step not counted), Evaluate still takes batch 1,
// and two samples train.
TEST(VisionLayersTest, BatchNormWithOneValuePerChannelIsRefusedNamingTheLayer) {
  struct Case {
    NetworkConfig config;
    std::string message;
  };
  std::vector<Case> cases;
  // BatchNorm1d after global average pooling and a Linear (batch 1: one value per feature); the
  // BatchNorm2d layers before it see 36 values per channel and pass.
  cases.push_back({PyTorchNet(),
                   "batchnorm1d layers.9: expected more than 1 value per channel when training, "
                   "got input size [1, 5] (a training batch of 1 sample)"});
  // BatchNorm2d on a 1x1 plane, inside a residual block's main branch.
  cases.push_back({TinyNet({2, 2, 2},
                           {Residual({NoBias(Conv(4, 2, 1, 0)), Norm2d()},
                                     {NoBias(Conv(4, 2, 1, 0)), Norm2d()}),
                            Of(Kind::kFlatten), Linear(3)},
                           27),
                   "batchnorm2d layers.0.layers.1: expected more than 1 value per channel when "
                   "training, got input size [1, 4, 1, 1]"});
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    for (Case& c : cases) {
      c.config.precision = precision;
      c.config.optimizer.momentum = 0.9;
      std::unique_ptr<Model> model = MakeNetwork(c.config);
      ASSERT_NE(model, nullptr);
      // A full step first, so the refused one has momentum and statistics it could spoil.
      ASSERT_TRUE(model->TrainStep(RandomFeatures(4, Features(c.config), 3, 50).View(), 0.1).ok());
      const std::vector<NamedTensor> before = model->Parameters();
      const std::vector<NamedTensor> state_before = model->OptimizerState();
      const FeatureBatch one = RandomFeatures(1, Features(c.config), 3, 51);
      absl::StatusOr<StepResult> step = model->TrainStep(one.View(), 0.1);
      ASSERT_FALSE(step.ok()) << c.message;
      EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(step.status().message()).find(c.message), std::string::npos)
          << step.status();
      const std::vector<NamedTensor> after = model->Parameters();
      ASSERT_EQ(after.size(), before.size());
      for (size_t t = 0; t < after.size(); ++t) {
        EXPECT_EQ(after[t].values, before[t].values) << after[t].name;
        for (float v : after[t].values) ASSERT_TRUE(std::isfinite(v)) << after[t].name;
      }
      const std::vector<NamedTensor> state_after = model->OptimizerState();
      for (size_t t = 0; t < state_after.size(); ++t) {
        EXPECT_EQ(state_after[t].values, state_before[t].values) << state_after[t].name;
      }
      absl::StatusOr<EvalResult> eval = model->Evaluate(one.View());
      ASSERT_TRUE(eval.ok()) << eval.status();
      EXPECT_TRUE(std::isfinite(eval->loss_sum));
      absl::StatusOr<StepResult> two =
          model->TrainStep(RandomFeatures(2, Features(c.config), 3, 52).View(), 0.1);
      ASSERT_TRUE(two.ok()) << two.status();
      EXPECT_TRUE(std::isfinite(two->loss));
    }
  }
}

}  // namespace
}  // namespace stoker
