// fp16 conversions against the CPU's own F16C instructions (round to nearest even).
#include "engine/fp16.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "engine/cpu/cpu_train_kernels.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

__attribute__((target("f16c"))) uint16_t HardwareToFp16(float value) {
  return static_cast<uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareFromFp16(uint16_t value) { return _cvtsh_ss(value); }

TEST(Fp16Test, EveryHalfConvertsExactlyAndRoundTrips) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float expected = HardwareFromFp16(static_cast<uint16_t>(h));
    const float actual = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(actual)) << h;
      continue;
    }
    ASSERT_EQ(__builtin_bit_cast(uint32_t, actual), __builtin_bit_cast(uint32_t, expected)) << h;
    ASSERT_EQ(FloatToFp16(actual), h) << h;
  }
}

TEST(Fp16Test, RoundsLikeF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C";
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns, and values near the fp16 range (normals, subnormals, overflow, ties).
    const uint32_t bits = i % 2 == 0 ? static_cast<uint32_t>(rng())
                                     : (static_cast<uint32_t>(rng()) & 0x80ffffffu) |
                                           (static_cast<uint32_t>(100 + rng() % 44) << 23);
    const float value = __builtin_bit_cast(float, bits);
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFp16(value), HardwareToFp16(value)) << value;
  }
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bffu);  // largest finite
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00u);  // the tie rounds to inf
  EXPECT_EQ(FloatToFp16(-1e6f), 0xfc00u);
  EXPECT_EQ(FloatToFp16(0x1.0p-25f), 0u);  // tie to even: zero
  EXPECT_EQ(FloatToFp16(0x1.8p-25f), 1u);  // above the tie: smallest subnormal
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::quiet_NaN()))));
  float values[3] = {1.0f + 0x1.0p-11f, 70000.0f, 0.1f};
  cpu::RoundToFp16InPlace(values, 3);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_TRUE(std::isinf(values[1]));
  EXPECT_EQ(values[2], HardwareFromFp16(HardwareToFp16(0.1f)));
}

// Dropout keeps about 1 - rate, scales kept values by 1 / (1 - rate), gives the same mask for the
// same (seed, stream) and a different one otherwise; backward uses the mask.
TEST(DropoutKernelTest, InvertedAndDeterministic) {
  const int n = 100000;
  std::vector<float> x(n, 2.0f), y(n), y2(n), dx(n);
  std::vector<uint8_t> keep(n), keep2(n);
  cpu::DropoutForward(x.data(), n, 0.25f, 7, 3, keep.data(), y.data());
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    kept += keep[i];
    ASSERT_EQ(y[i], keep[i] ? 2.0f / 0.75f : 0.0f);
  }
  EXPECT_NEAR(kept / double(n), 0.75, 0.01);
  cpu::DropoutForward(x.data(), n, 0.25f, 7, 3, keep2.data(), y2.data());
  EXPECT_EQ(keep, keep2);
  cpu::DropoutForward(x.data(), n, 0.25f, 7, 4, keep2.data(), y2.data());
  EXPECT_NE(keep, keep2);
  cpu::DropoutBackward(x.data(), keep.data(), n, 0.25f, dx.data());
  EXPECT_EQ(dx, y);
}

}  // namespace
}  // namespace stoker
