// The element-wise loops against straightforward double-precision references.
#include "engine/cpu/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cpu/aligned_array.h"
#include "engine/cpu/cpu_kernels_table.h"
#include "gtest/gtest.h"

namespace stoker::cpu {
namespace {

std::vector<float> RandomFloats(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::vector<float> values(n);
  // Map the top 24 bits to [-scale, scale); exact and library-independent.
  for (float& v : values) v = scale * (static_cast<float>(rng() >> 40) * 0x1.0p-23f - 1.0f);
  return values;
}

// The /proc/self/smaps field `field` of the mapping that holds `address`; -1 when not found.
long SmapsField(const void* address, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0) {
      std::istringstream value(line.substr(field.size() + 1));
      long v = -1;
      value >> v;
      return v;
    }
  }
  return -1;
}

TEST(AlignedArrayTest, LargeArraysStartOnAHugePageAndAskForHugePages) {
  AlignedArray<float> small(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  AlignedArray<float> large((size_t{5} << 20) / sizeof(float) + 7);  // 5 MiB and a bit
  ASSERT_EQ(reinterpret_cast<uintptr_t>(large.data()) % (size_t{2} << 20), 0u);
  for (size_t i = 0; i < large.size(); i += 4099) ASSERT_EQ(large[i], 0.0f) << i;
  EXPECT_EQ(large[large.size() - 1], 0.0f);
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off here (" << mode << ")";
  }
  // The kernel says the whole 2 MiB pages may get huge pages (it decides whether they do).
  EXPECT_EQ(SmapsField(large.data(), "THPeligible"), 1);
  // The tail past the last whole 2 MiB page is not advised (its mapping ends before it).
  const long tail = SmapsField(large.data() + (size_t{4} << 20) / sizeof(float), "THPeligible");
  if (mode.find("[madvise]") != std::string::npos) {
    EXPECT_EQ(tail, 0);
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f), 0x3f80);               // tie, round down to even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);           // tie, round up to even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(0.15625f)), 0.15625f);  // exactly representable
  for (float v : RandomFloats(1000, 7, 100.0f)) {
    EXPECT_NEAR(Bf16ToFloat(FloatToBf16(v)), v, std::abs(v) * 0x1.0p-8f) << v;
  }
}

TEST(CpuKernelsTest, NormalizeMatchesFormula) {
  std::vector<uint8_t> pixels(70000);
  std::mt19937_64 rng(3);
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(rng() >> 56);
  std::vector<float> f32(pixels.size());
  std::vector<bf16_t> bf16(pixels.size());
  const float scale = 1.0f / 127.5f, shift = -1.0f;
  const ChannelAffine affine{1, static_cast<int64_t>(pixels.size()), &scale, &shift};
  NormalizeToF32(pixels.data(), pixels.size(), affine, f32.data());
  NormalizeToBf16(pixels.data(), pixels.size(), affine, bf16.data());
  for (size_t i = 0; i < pixels.size(); ++i) {
    const double expected = pixels[i] / 127.5 - 1.0;
    ASSERT_NEAR(f32[i], expected, 1e-6) << i;
    ASSERT_NEAR(Bf16ToFloat(bf16[i]), expected, 4e-3) << i;  // bf16 has 8 significant bits
  }
}

TEST(CpuKernelsTest, SoftmaxCrossEntropyMatchesDoubleReference) {
  const int rows = 9, classes = 7;
  const std::vector<float> logits = RandomFloats(rows * classes, 11, 4.0f);
  std::vector<uint8_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = static_cast<uint8_t>((r * 5) % classes);
  std::vector<float> grad(rows * classes);
  int64_t correct = -1;
  const double loss =
      SoftmaxCrossEntropy(logits.data(), labels.data(), rows, classes, grad.data(), &correct);
  double expected_loss = 0;
  int64_t expected_correct = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = &logits[r * classes];
    double sum = 0;
    int argmax = 0;
    for (int c = 0; c < classes; ++c) {
      sum += std::exp(static_cast<double>(z[c]));
      if (z[c] > z[argmax]) argmax = c;
    }
    expected_loss += std::log(sum) - z[labels[r]];
    expected_correct += argmax == labels[r];
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(z[c])) / sum;
      EXPECT_NEAR(grad[r * classes + c], (p - (c == labels[r])) / rows, 1e-6);
    }
  }
  EXPECT_NEAR(loss, expected_loss, 1e-5 * expected_loss);
  EXPECT_EQ(correct, expected_correct);
}

TEST(CpuKernelsTest, FinishOutputGradMasksSumsAndConverts) {
  const int rows = 5, cols = 37;
  std::vector<float> grad = RandomFloats(rows * cols, 21, 1.0f);
  const std::vector<float> activation_values = RandomFloats(rows * cols, 22, 1.0f);
  std::vector<bf16_t> activation_bf16(rows * cols);
  for (int i = 0; i < rows * cols; ++i) activation_bf16[i] = FloatToBf16(activation_values[i]);
  std::vector<float> expected_grad(rows * cols);
  std::vector<double> expected_bias(cols, 0.0);
  for (int i = 0; i < rows * cols; ++i) {
    expected_grad[i] = Bf16ToFloat(activation_bf16[i]) > 0 ? grad[i] : 0.0f;
    expected_bias[i % cols] += expected_grad[i];
  }
  std::vector<float> bias(cols, 123.0f);  // must be overwritten, not accumulated into
  std::vector<bf16_t> grad_bf16(rows * cols);
  FinishOutputGrad(activation_bf16.data(), rows, cols, grad.data(), bias.data(), grad_bf16.data());
  for (int i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(grad[i], expected_grad[i]) << i;
    ASSERT_EQ(grad_bf16[i], FloatToBf16(expected_grad[i])) << i;
  }
  for (int c = 0; c < cols; ++c) EXPECT_NEAR(bias[c], expected_bias[c], 1e-5) << c;
}

TEST(CpuKernelsTest, SgdMomentumFollowsPyTorchFormula) {
  const size_t n = 40000;  // above the threshold for the parallel loop
  std::vector<float> weight = RandomFloats(n, 31, 0.5f);
  std::vector<float> velocity(n, 0.0f);
  std::vector<bf16_t> weight_bf16(n);
  std::vector<double> ref_weight(weight.begin(), weight.end()), ref_velocity(n, 0.0);
  const float lr = 0.1f, momentum = 0.9f, decay = 0.01f;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> grad = RandomFloats(n, 40 + step, 1.0f);
    SgdMomentumUpdate(n, lr, momentum, decay, grad.data(), weight.data(), velocity.data(),
                      weight_bf16.data());
    for (size_t i = 0; i < n; ++i) {
      ref_velocity[i] = momentum * ref_velocity[i] + grad[i] + decay * ref_weight[i];
      ref_weight[i] -= lr * ref_velocity[i];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(weight[i], ref_weight[i], 1e-6) << i;
    ASSERT_NEAR(velocity[i], ref_velocity[i], 1e-5) << i;
    ASSERT_EQ(weight_bf16[i], FloatToBf16(weight[i])) << i;
  }
}

// The public functions run one build of the loops; this checks the other one against it. Both are
// compiled without FMA contraction, so they agree bit for bit.
TEST(CpuKernelsTest, GenericAndAvx512BuildsAgree) {
  if (!__builtin_cpu_supports("x86-64-v4")) GTEST_SKIP() << "this CPU has no AVX-512";
  const KernelTable* tables[] = {&kGenericKernels, &kAvx512Kernels};
  const int rows = 33, cols = 40;
  const int64_t n = 50000;
  std::vector<uint8_t> pixels(n);
  std::mt19937_64 rng(5);
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(rng() >> 56);
  const std::vector<float> grad_in = RandomFloats(rows * cols, 61, 1.0f);
  const std::vector<float> activation = RandomFloats(rows * cols, 62, 1.0f);
  const std::vector<float> update = RandomFloats(n, 63, 1.0f);
  const std::vector<float> start = RandomFloats(n, 64, 0.5f);
  std::vector<uint8_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = static_cast<uint8_t>(r % cols);

  // One value for all channels, and one per channel (planes of 2000 values, 25 samples).
  const float scale = 1 / 255.0f, shift = -0.5f;
  const ChannelAffine uniform{1, n, &scale, &shift};
  const float scales[] = {1 / 58.0f, 1 / 57.0f, 1 / 57.5f}, shifts[] = {-2.1f, -2.0f, -1.8f};
  const ChannelAffine per_channel{3, 2000, scales, shifts};
  struct Outputs {
    std::vector<float> normalized, normalized_channels, softmax_grad, grad, bias, weight, velocity;
    std::vector<bf16_t> normalized_bf16, normalized_channels_bf16, grad_bf16, weight_bf16;
    double loss = 0;
  } out[2];
  for (int t = 0; t < 2; ++t) {
    const KernelTable& k = *tables[t];
    Outputs& o = out[t];
    o.normalized.resize(n);
    o.normalized_bf16.resize(n);
    k.normalize_to_f32(pixels.data(), n, uniform, o.normalized.data());
    k.normalize_to_bf16(pixels.data(), n, uniform, o.normalized_bf16.data());
    o.normalized_channels.resize(n);
    o.normalized_channels_bf16.resize(n);
    k.normalize_to_f32(pixels.data(), n, per_channel, o.normalized_channels.data());
    k.normalize_to_bf16(pixels.data(), n, per_channel, o.normalized_channels_bf16.data());
    o.softmax_grad.resize(rows * cols);
    o.loss = k.softmax_cross_entropy(grad_in.data(), labels.data(), rows, cols,
                                     o.softmax_grad.data(), nullptr);
    o.grad = grad_in;
    o.bias.resize(cols);
    o.grad_bf16.resize(rows * cols);
    k.finish_output_grad_f32(activation.data(), rows, cols, o.grad.data(), o.bias.data(),
                             o.grad_bf16.data());
    o.weight = start;
    o.velocity.assign(n, 0.25f);
    o.weight_bf16.resize(n);
    k.sgd_momentum_update(n, 0.1f, 0.9f, 0.01f, update.data(), o.weight.data(), o.velocity.data(),
                          o.weight_bf16.data());
  }
  EXPECT_EQ(out[0].loss, out[1].loss);
  EXPECT_EQ(out[0].normalized, out[1].normalized);
  EXPECT_EQ(out[0].normalized_bf16, out[1].normalized_bf16);
  EXPECT_EQ(out[0].normalized_channels, out[1].normalized_channels);
  EXPECT_EQ(out[0].normalized_channels_bf16, out[1].normalized_channels_bf16);
  EXPECT_EQ(out[0].softmax_grad, out[1].softmax_grad);
  EXPECT_EQ(out[0].grad, out[1].grad);
  EXPECT_EQ(out[0].grad_bf16, out[1].grad_bf16);
  EXPECT_EQ(out[0].bias, out[1].bias);
  EXPECT_EQ(out[0].weight, out[1].weight);
  EXPECT_EQ(out[0].velocity, out[1].velocity);
  EXPECT_EQ(out[0].weight_bf16, out[1].weight_bf16);
  EXPECT_NE(out[0].weight, start);  // the update happened
}

// Max pooling (NHWC, window = stride) of both builds against a direct reference: ties (values on
// a coarse grid) go to the first maximum in PyTorch's scan order, a NaN wins its window, ReLU
// after the pool, and backward writes every input value (dx starts as garbage), rows and columns
// outside the windows included. float and bf16 (the same values, exact in bf16).
TEST(CpuKernelsTest, MaxPoolMatchesReference) {
  std::vector<const KernelTable*> tables = {&kGenericKernels};
  if (__builtin_cpu_supports("x86-64-v4")) tables.push_back(&kAvx512Kernels);
  const PoolShape shapes[] = {{3, 7, 5, 19, 2}, {2, 9, 8, 16, 3}, {2, 4, 4, 33, 2}};
  for (const PoolShape& shape : shapes) {
    const int out_h = shape.height / shape.kernel, out_w = shape.width / shape.kernel;
    const size_t in_n =
        static_cast<size_t>(shape.batch) * shape.height * shape.width * shape.channels;
    const size_t out_n = static_cast<size_t>(shape.batch) * out_h * out_w * shape.channels;
    std::vector<float> x = RandomFloats(in_n, 80 + shape.kernel, 2.0f);
    for (float& v : x) v = std::round(v * 2) / 2;  // -2, -1.5, ..., 2: many ties
    x[5 * shape.channels + 3] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> dy = RandomFloats(out_n, 90, 1.0f);
    for (bool relu : {false, true}) {
      // Reference: y, the winner's flat input index, and dx.
      std::vector<float> y_ref(out_n);
      std::vector<size_t> from(out_n);
      std::vector<float> dx_ref(in_n, 0.0f);
      for (int n = 0; n < shape.batch; ++n) {
        for (int i = 0; i < out_h; ++i) {
          for (int j = 0; j < out_w; ++j) {
            for (int c = 0; c < shape.channels; ++c) {
              const size_t o =
                  ((static_cast<size_t>(n) * out_h + i) * out_w + j) * shape.channels + c;
              size_t best = 0;
              bool first = true;
              for (int di = 0; di < shape.kernel; ++di) {
                for (int dj = 0; dj < shape.kernel; ++dj) {
                  const size_t at =
                      ((static_cast<size_t>(n) * shape.height + i * shape.kernel + di) *
                           shape.width +
                       j * shape.kernel + dj) *
                          shape.channels +
                      c;
                  const bool nan_best = std::isnan(x[best]);
                  if (first || (!nan_best && (x[at] > x[best] || std::isnan(x[at])))) best = at;
                  first = false;
                }
              }
              from[o] = best;
              y_ref[o] = relu && x[best] < 0 ? 0.0f : x[best];
              if (!relu || y_ref[o] > 0) dx_ref[best] = dy[o];
            }
          }
        }
      }
      for (const KernelTable* table : tables) {
        const std::string label = std::string(table == &kGenericKernels ? "generic" : "avx512") +
                                  " k" + std::to_string(shape.kernel) + (relu ? " relu" : "");
        std::vector<float> y(out_n, 7.0f), dx(in_n, 7.0f);
        std::vector<uint8_t> arg(out_n, 99);
        table->max_pool_forward_f32(x.data(), shape, relu, y.data(), arg.data());
        table->max_pool_backward_f32(dy.data(), relu ? y.data() : nullptr, arg.data(), shape,
                                     dx.data());
        for (size_t o = 0; o < out_n; ++o) {
          if (std::isnan(y_ref[o])) {
            EXPECT_TRUE(std::isnan(y[o])) << label << " output " << o;
          } else {
            EXPECT_EQ(y[o], y_ref[o]) << label << " output " << o;
          }
        }
        EXPECT_EQ(dx, dx_ref) << label;
        // bf16: the same values (all exact in bf16) give the same bits.
        std::vector<bf16_t> xb(in_n), dyb(out_n), yb(out_n, 1), dxb(in_n, 1);
        for (size_t t = 0; t < in_n; ++t) xb[t] = FloatToBf16(x[t]);
        for (size_t t = 0; t < out_n; ++t) dyb[t] = FloatToBf16(dy[t]);
        std::vector<uint8_t> argb(out_n, 99);
        table->max_pool_forward_bf16(xb.data(), shape, relu, yb.data(), argb.data());
        table->max_pool_backward_bf16(dyb.data(), relu ? yb.data() : nullptr, argb.data(), shape,
                                      dxb.data());
        EXPECT_EQ(argb, arg) << label << " bf16";
        for (size_t o = 0; o < out_n; ++o) {
          if (!std::isnan(y_ref[o])) {
            EXPECT_EQ(yb[o], FloatToBf16(y_ref[o])) << label << " bf16";
          }
        }
        for (size_t t = 0; t < in_n; ++t) {
          EXPECT_EQ(dxb[t], FloatToBf16(dx_ref[t])) << label << " bf16 input " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker::cpu
