// bfloat16 as raw uint16_t bits: the top half of an IEEE fp32, rounded to nearest even.
#ifndef STOKER_ENGINE_BF16_H_
#define STOKER_ENGINE_BF16_H_

#include <cstdint>

namespace stoker {

using bf16_t = uint16_t;

// Always inlined: the kernels are compiled for two instruction sets (cpu_kernels_impl.inc), and an
// out-of-line copy shared between them could carry AVX-512 code into the baseline path.
#define STOKER_BF16_INLINE inline __attribute__((always_inline))

// Round to nearest even; NaN stays a (quiet) NaN, infinities stay infinite.
STOKER_BF16_INLINE bf16_t FloatToBf16(float value) {
  uint32_t bits = __builtin_bit_cast(uint32_t, value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>(bits >> 16);
}

STOKER_BF16_INLINE float Bf16ToFloat(bf16_t value) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(value) << 16);
}

// True when the bf16 value is > 0 (sign clear, not +0). NaN counts as positive, as in fp32 `x > 0`
// it would not; ReLU outputs are never NaN unless the step is already lost.
STOKER_BF16_INLINE bool Bf16IsPositive(bf16_t value) { return static_cast<int16_t>(value) > 0; }

}  // namespace stoker

#endif  // STOKER_ENGINE_BF16_H_
