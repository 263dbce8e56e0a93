// Per-channel input normalisation on the cpu backend: the kernels against the formula (every
// path: one plane, per-channel tables, more channels than tables, planes cut into chunks, both
// instruction-set builds), models fed uint8 samples against the same models fed the
// pre-normalised floats (bit for bit, fp32, bf16 and fp16, MLP fast path and network), the
// gradient against central differences of a double reference, and the config checks.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "engine/backend.h"
#include "engine/backend_helpers.h"
#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu/cpu_kernels_table.h"
#include "engine/cpu/network_test_util.h"
#include "engine/test_layers.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using testing_util::CentralDifference;
using testing_util::DoubleParams;
using testing_util::ExpectSameParameters;
using testing_util::FeatureBatch;
using testing_util::ReferenceLoss;
using testing_util::StepGradient;
using testing_util::ToDouble;
using namespace stoker::test_layers;  // NOLINT: Conv, Pool, Linear, Of, Kind

// ImageNet's mean and std (torchvision's usual Normalize) as scale and shift.
const std::vector<float> kMean = {0.485f, 0.456f, 0.406f};
const std::vector<float> kStd = {0.229f, 0.224f, 0.225f};
std::vector<float> ImageNetScale() {
  std::vector<float> scale;
  for (float s : kStd) scale.push_back(static_cast<float>(1.0 / (255.0 * s)));
  return scale;
}
std::vector<float> ImageNetShift() {
  std::vector<float> shift;
  for (int c = 0; c < 3; ++c) shift.push_back(static_cast<float>(-kMean[c] / kStd[c]));
  return shift;
}

// pixel * scale + shift in fp32, a multiply then an add (no FMA), as the kernels compute it.
float Affine(uint8_t pixel, float scale, float shift) {
  volatile float product = static_cast<float>(pixel) * scale;
  return product + shift;
}

std::vector<uint8_t> RandomPixels(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> pixels(n);
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(rng() >> 56);
  return pixels;
}

// ---- Kernels ----

struct KernelCase {
  const char* name;
  int samples;
  int channels;
  int64_t plane;
  std::vector<float> scale, shift;
};

std::vector<KernelCase> KernelCases() {
  std::vector<float> six_scale, six_shift;
  for (int c = 0; c < 6; ++c) {
    six_scale.push_back(0.01f * (c + 1));
    six_shift.push_back(-0.25f * c);
  }
  return {
      // One value for all three channels: the whole batch as one plane.
      {"uniform", 5, 3, 70, {0.5f, 0.5f, 0.5f}, {-1.0f, -1.0f, -1.0f}},
      // Small planes, below the parallel threshold.
      {"small", 4, 3, 7 * 5, ImageNetScale(), ImageNetShift()},
      // Planes longer than a chunk (4096) with a remainder, above the parallel threshold.
      {"chunked", 3, 3, 4096 * 2 + 123, ImageNetScale(), ImageNetShift()},
      // One sample, large planes: the chunks spread it over the threads.
      {"one sample", 1, 3, 224 * 224, ImageNetScale(), ImageNetShift()},
      // More channels than bf16 tables: converted value by value.
      {"six channels", 9, 6, 1000, six_scale, six_shift},
      // Channels of one value each (a flat sample cut into single values).
      {"planes of one", 40000, 3, 1, ImageNetScale(), ImageNetShift()},
  };
}

void ExpectKernelsMatchFormula(const cpu::KernelTable* table) {
  for (const KernelCase& k : KernelCases()) {
    const int64_t n = k.samples * k.channels * k.plane;
    const std::vector<uint8_t> pixels = RandomPixels(n, n);
    const cpu::ChannelAffine affine{k.channels, k.plane, k.scale.data(), k.shift.data()};
    std::vector<float> f32(n, std::nanf(""));
    std::vector<bf16_t> bf16(n, 0xffff);
    if (table == nullptr) {
      cpu::NormalizeToF32(pixels.data(), n, affine, f32.data());
      cpu::NormalizeToBf16(pixels.data(), n, affine, bf16.data());
    } else {
      table->normalize_to_f32(pixels.data(), n, affine, f32.data());
      table->normalize_to_bf16(pixels.data(), n, affine, bf16.data());
    }
    for (int64_t i = 0; i < n; ++i) {
      const int c = static_cast<int>((i / k.plane) % k.channels);
      const float expected = Affine(pixels[i], k.scale[c], k.shift[c]);
      ASSERT_EQ(f32[i], expected) << k.name << " value " << i << " channel " << c;
      ASSERT_EQ(bf16[i], FloatToBf16(expected)) << k.name << " value " << i << " channel " << c;
    }
  }
}

TEST(InputNormalizationKernelTest, EveryPathMatchesTheFormula) {
  ExpectKernelsMatchFormula(nullptr);
}

TEST(InputNormalizationKernelTest, BothBuildsMatchTheFormula) {
  ExpectKernelsMatchFormula(&cpu::kGenericKernels);
  if (!__builtin_cpu_supports("x86-64-v4")) GTEST_SKIP() << "this CPU has no AVX-512";
  ExpectKernelsMatchFormula(&cpu::kAvx512Kernels);
}

TEST(InputNormalizationKernelTest, ExpandsOneValueToEveryChannel) {
  const ChannelNormalization norm = ExpandNormalization(12, 3, {0.5f}, {-1.0f, 0.0f, 1.0f});
  EXPECT_EQ(norm.channels, 3);
  EXPECT_EQ(norm.plane, 4);
  EXPECT_EQ(norm.scale, (std::vector<float>{0.5f, 0.5f, 0.5f}));
  EXPECT_EQ(norm.shift, (std::vector<float>{-1.0f, 0.0f, 1.0f}));
  MlpConfig mlp;
  EXPECT_EQ(InputNormalization(mlp).scale, std::vector<float>{1.0f / 127.5f});  // the default
  EXPECT_EQ(InputNormalization(mlp).plane, 784);
  NetworkConfig net;
  net.input_shape = {3, 4, 5};
  net.input_scale = ImageNetScale();
  EXPECT_EQ(InputNormalization(net).channels, 3);
  EXPECT_EQ(InputNormalization(net).plane, 20);
  EXPECT_EQ(InputNormalization(net).shift, (std::vector<float>{-1.0f, -1.0f, -1.0f}));
}

// ---- Models: uint8 with per-channel values == the pre-normalised floats ----

struct PixelBatch {
  std::vector<uint8_t> samples;
  std::vector<uint8_t> labels;
  int count = 0;
  BatchView View() const { return {samples.data(), labels.data(), count}; }
};

PixelBatch RandomPixelBatch(int count, int64_t features, int classes, uint64_t seed) {
  PixelBatch batch;
  batch.count = count;
  batch.samples = RandomPixels(count * features, seed);
  std::mt19937_64 rng(seed + 1);
  for (int i = 0; i < count; ++i) batch.labels.push_back(static_cast<uint8_t>(rng() % classes));
  return batch;
}

// The batch as the model should see it: value i of a sample in channel i / plane.
FeatureBatch Normalized(const PixelBatch& batch, const ChannelNormalization& norm) {
  FeatureBatch out;
  out.count = batch.count;
  out.labels = batch.labels;
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const int c = static_cast<int>((i / norm.plane) % norm.channels);
    out.features.push_back(Affine(batch.samples[i], norm.scale[c], norm.shift[c]));
  }
  return out;
}

std::unique_ptr<Backend> Cpu() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// Two models of one config (same seed: same weights), one fed `pixels`, the other the
// pre-normalised floats: equal Evaluate results and training losses, bit-identical parameters
// after each step (so the gradients are the same too); and a model with the first channel's
// values for every channel disagrees (the check would see channels mixed up).
template <typename Config>
void ExpectPixelsEqualNormalizedFloats(const Config& config, int64_t features,
                                       const std::string& label) {
  SCOPED_TRACE(label);
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  auto create = [&](const Config& c) -> std::unique_ptr<Model> {
    absl::StatusOr<std::unique_ptr<Model>> model;
    if constexpr (std::is_same_v<Config, MlpConfig>) {
      model = backend->CreateMlp(c);
    } else {
      model = backend->CreateNetwork(c);
    }
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  };
  std::unique_ptr<Model> pixels_model = create(config);
  std::unique_ptr<Model> floats_model = create(config);
  Config first_channel_config = config;
  first_channel_config.input_scale = {config.input_scale[0]};
  first_channel_config.input_shift = {config.input_shift[0]};
  std::unique_ptr<Model> first_channel_model = create(first_channel_config);
  ASSERT_TRUE(pixels_model && floats_model && first_channel_model);
  const ChannelNormalization norm = InputNormalization(config);

  const PixelBatch eval = RandomPixelBatch(config.max_batch, features, config.classes, 7);
  absl::StatusOr<EvalResult> from_pixels = pixels_model->Evaluate(eval.View());
  absl::StatusOr<EvalResult> from_floats = floats_model->Evaluate(Normalized(eval, norm).View());
  absl::StatusOr<EvalResult> first_channel = first_channel_model->Evaluate(eval.View());
  ASSERT_TRUE(from_pixels.ok() && from_floats.ok() && first_channel.ok()) << from_pixels.status();
  EXPECT_EQ(from_pixels->loss_sum, from_floats->loss_sum);
  EXPECT_EQ(from_pixels->correct, from_floats->correct);
  EXPECT_GT(std::abs(first_channel->loss_sum - from_pixels->loss_sum),
            1e-3 * from_pixels->loss_sum);

  for (int step = 0; step < 3; ++step) {
    const int count = step == 1 ? config.max_batch / 2 + 1 : config.max_batch;  // a partial batch
    const PixelBatch batch = RandomPixelBatch(count, features, config.classes, 100 + step);
    absl::StatusOr<StepResult> a = pixels_model->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> b = floats_model->TrainStep(Normalized(batch, norm).View(), 0.05);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(a->loss, b->loss) << "step " << step;
    ExpectSameParameters(*pixels_model, *floats_model, "step " + std::to_string(step));
  }
}

MlpConfig ThreeChannelMlp(Precision precision) {
  MlpConfig config;
  config.input_features = 3 * 6 * 5;
  config.input_channels = 3;
  config.input_scale = ImageNetScale();
  config.input_shift = ImageNetShift();
  config.hidden = {24, 16};
  config.classes = 5;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 3;
  return config;
}

NetworkConfig ThreeChannelCnn(Precision precision) {
  NetworkConfig config;
  config.input_shape = {3, 8, 7};
  config.input_scale = ImageNetScale();
  config.input_shift = ImageNetShift();
  config.layers = {Conv(4, 3, 1, 1), Of(Kind::kRelu), Pool(2),  Of(Kind::kFlatten),
                   Linear(12),       Of(Kind::kRelu), Linear(5)};
  config.classes = 5;
  config.max_batch = 16;
  config.precision = precision;
  config.seed = 4;
  return config;
}

TEST(InputNormalizationModelTest, MlpFastPathFp32) {
  const MlpConfig config = ThreeChannelMlp(Precision::kFp32);
  ASSERT_FALSE(MlpNeedsNetwork(config));
  ExpectPixelsEqualNormalizedFloats(config, config.input_features, "mlp fp32");
}

TEST(InputNormalizationModelTest, MlpFastPathBf16) {
  const MlpConfig config = ThreeChannelMlp(Precision::kBf16);
  ExpectPixelsEqualNormalizedFloats(config, config.input_features, "mlp bf16");
}

TEST(InputNormalizationModelTest, MlpThroughTheNetwork) {
  MlpConfig config = ThreeChannelMlp(Precision::kFp16);
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.learning_rate = 1e-3;
  ASSERT_TRUE(MlpNeedsNetwork(config));
  ExpectPixelsEqualNormalizedFloats(config, config.input_features, "mlp as network fp16");
  // One scale for all channels, a shift per channel.
  config.precision = Precision::kFp32;
  config.input_scale = {0.02f};
  ExpectPixelsEqualNormalizedFloats(config, config.input_features, "mlp one scale");
}

// train.label_smoothing on an mlp: the MLP trains as a network (MLP names, the smoothed loss),
// the same model as NetworkFromMlp's network with smoothing (other names), step for step.
TEST(InputNormalizationModelTest, MlpWithLabelSmoothingTrainsAsTheSmoothedNetwork) {
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  MlpConfig config = ThreeChannelMlp(Precision::kFp32);
  ASSERT_FALSE(MlpNeedsNetwork(config));
  config.label_smoothing = 0.2f;
  ASSERT_TRUE(MlpNeedsNetwork(config));
  absl::StatusOr<std::unique_ptr<Model>> smoothed = backend->CreateMlp(config);
  ASSERT_TRUE(smoothed.ok()) << smoothed.status();
  absl::StatusOr<std::unique_ptr<Model>> network = backend->CreateNetwork(NetworkFromMlp(config));
  ASSERT_TRUE(network.ok()) << network.status();
  MlpConfig plain_config = config;
  plain_config.label_smoothing = 0;
  absl::StatusOr<std::unique_ptr<Model>> plain = backend->CreateMlp(plain_config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<NamedTensor> names = (*smoothed)->Parameters();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0].name, "layers.0.weight");
  EXPECT_EQ(names[2].name, "layers.1.weight") << "an MLP's names (j-th Linear)";
  for (int step = 0; step < 3; ++step) {
    const PixelBatch batch = RandomPixelBatch(8, config.input_features, config.classes, 40 + step);
    absl::StatusOr<StepResult> a = (*smoothed)->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> b = (*network)->TrainStep(batch.View(), 0.05);
    absl::StatusOr<StepResult> c = (*plain)->TrainStep(batch.View(), 0.05);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << step;
    EXPECT_GT(std::abs(a->loss - c->loss), 1e-4) << "step " << step << ": not smoothed";
  }
  config.label_smoothing = 1;
  absl::StatusOr<std::unique_ptr<Model>> refused = backend->CreateMlp(config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("label_smoothing must be in [0, 1)"), std::string::npos)
      << refused.status();
}

TEST(InputNormalizationModelTest, CnnOnRgbImages) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    ExpectPixelsEqualNormalizedFloats(ThreeChannelCnn(precision), 3 * 8 * 7,
                                      std::string("cnn ") + PrecisionName(precision));
  }
}

// The gradient of a per-channel model fed pixels against central differences of the double
// reference fed the normalised floats, for every first-layer weight (each sees one input channel)
// and a few of the rest.
TEST(InputNormalizationModelTest, GradientMatchesReferenceOnNormalizedInput) {
  NetworkConfig config = ThreeChannelCnn(Precision::kFp32);
  config.optimizer.momentum = 0;
  std::unique_ptr<Model> model = testing_util::MakeNetwork(config);
  ASSERT_NE(model, nullptr);
  const PixelBatch batch = RandomPixelBatch(6, 3 * 8 * 7, config.classes, 31);
  const FeatureBatch floats = Normalized(batch, InputNormalization(config));
  const std::vector<NamedTensor> start = model->Parameters();
  const DoubleParams params = ToDouble(start);
  absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
  ASSERT_TRUE(eval.ok()) << eval.status();
  const double reference_loss = ReferenceLoss(config, params, floats);
  EXPECT_NEAR(eval->loss_sum / batch.count, reference_loss, 1e-5 * reference_loss);
  float loss = 0;
  const DoubleParams gradient = StepGradient(*model, batch.View(), 1.0, &loss);
  for (size_t t = 0; t < params.size(); ++t) {
    const size_t stride = t == 0 ? 1 : 7;  // every conv weight; a sample of the others
    for (size_t i = 0; i < params[t].size(); i += stride) {
      const double fd = CentralDifference(params, t, i, 1e-5, [&](const DoubleParams& p) {
        return ReferenceLoss(config, p, floats);
      });
      EXPECT_NEAR(gradient[t][i], fd, 1e-3 * std::abs(fd) + 2e-5)
          << start[t].name << "[" << i << "]";
    }
  }
}

// ---- Config checks ----

TEST(InputNormalizationConfigTest, MlpRefusesBadValuesNamingTheField) {
  std::unique_ptr<Backend> backend = Cpu();
  ASSERT_NE(backend, nullptr);
  auto status = [&](auto mutate) {
    MlpConfig config = ThreeChannelMlp(Precision::kFp32);
    mutate(config);
    return backend->CreateMlp(config).status();
  };
  EXPECT_TRUE(status([](MlpConfig&) {}).ok());
  EXPECT_TRUE(status([](MlpConfig& c) { c.input_shift = {0.0f}; }).ok());
  const struct {
    void (*mutate)(MlpConfig&);
    const char* names;
  } cases[] = {
      {[](MlpConfig& c) { c.input_channels = 0; }, "input_channels"},
      {[](MlpConfig& c) { c.input_channels = 4; }, "input_channels"},  // 90 % 4 != 0
      {[](MlpConfig& c) {
         c.input_scale = {1.0f, 2.0f};
       },
       "input_scale holds 2 values"},
      {[](MlpConfig& c) { c.input_shift = {}; }, "input_shift holds 0 values"},
      {[](MlpConfig& c) { c.input_scale[1] = 0.0f; }, "input_scale[1]"},
      {[](MlpConfig& c) { c.input_scale[2] = std::nanf(""); }, "input_scale[2]"},
      {[](MlpConfig& c) { c.input_shift[0] = -std::numeric_limits<float>::infinity(); },
       "input_shift[0]"},
  };
  for (const auto& k : cases) {
    const absl::Status s = status(k.mutate);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.names;
    EXPECT_TRUE(absl::StrContains(s.message(), k.names)) << s;
  }
}

TEST(InputNormalizationConfigTest, NetworkRefusesBadValuesNamingTheField) {
  auto status = [](auto mutate) {
    NetworkConfig config = ThreeChannelCnn(Precision::kFp32);
    mutate(config);
    return ValidateNetworkConfig(config);
  };
  EXPECT_TRUE(status([](NetworkConfig&) {}).ok());
  EXPECT_TRUE(status([](NetworkConfig& c) { c.input_channels = 3; }).ok());
  absl::Status s = status([](NetworkConfig& c) { c.input_scale = {1.0f, 2.0f}; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "input_scale holds 2 values")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "input_shape[0]")) << s;
  s = status([](NetworkConfig& c) { c.input_channels = 2; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "input_channels")) << s;
  s = status([](NetworkConfig& c) { c.input_shift[1] = std::nanf(""); });
  EXPECT_TRUE(absl::StartsWith(s.message(), "input_shift[1]")) << s;
  // A flat input: input_channels blocks, which must divide the features.
  s = status([](NetworkConfig& c) {
    c.input_shape = {168};
    c.layers = {Linear(5)};
    c.input_channels = 5;
  });
  EXPECT_TRUE(absl::StartsWith(s.message(), "input_channels")) << s;
  s = status([](NetworkConfig& c) {
    c.input_shape = {168};
    c.layers = {Linear(5)};
  });
  EXPECT_TRUE(absl::StrContains(s.message(), "input_scale holds 3 values")) << s;  // 1 channel
  EXPECT_TRUE(status([](NetworkConfig& c) {
                c.input_shape = {168};
                c.layers = {Linear(5)};
                c.input_channels = 3;
              }).ok());
}

}  // namespace
}  // namespace stoker
