// IEEE half precision as raw uint16_t bits, converted in software with round-to-nearest-even
// (bit-exact with F16C's vcvtps2ph under the default rounding mode; checked in fp16_test.cc).
#ifndef STOKER_ENGINE_FP16_H_
#define STOKER_ENGINE_FP16_H_

#include <cstdint>

namespace stoker {

using fp16_t = uint16_t;

// Largest finite fp16 value.
inline constexpr float kFp16Max = 65504.0f;

// Round to nearest even; overflow gives +-inf, NaN stays a quiet NaN, subnormals are kept.
inline __attribute__((always_inline)) fp16_t FloatToFp16(float value) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<fp16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<fp16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (magnitude < 0x38800000u) {
    // Below 2^-14 (fp16 subnormals): adding 0.5 puts the value where a float's ulp is 2^-24, the
    // fp16 subnormal step, so the hardware's own round-to-nearest-even does the rounding.
    const float shifted = __builtin_bit_cast(float, magnitude) + 0.5f;
    return static_cast<fp16_t>(sign | (__builtin_bit_cast(uint32_t, shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  magnitude += 0xc8000fffu + ((magnitude >> 13) & 1u);
  return static_cast<fp16_t>(sign | (magnitude >> 13));
}

inline __attribute__((always_inline)) float Fp16ToFloat(fp16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1f) return __builtin_bit_cast(float, sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    return sign ? -magnitude : magnitude;
  }
  return __builtin_bit_cast(float, sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// The fp32 value nearest `value` that fp16 can hold (the round trip through fp16).
inline __attribute__((always_inline)) float RoundToFp16(float value) {
  return Fp16ToFloat(FloatToFp16(value));
}

}  // namespace stoker

#endif  // STOKER_ENGINE_FP16_H_
