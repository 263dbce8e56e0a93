#include "data/image/image_resample.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define STOKER_RESAMPLE_SSE41 1
#endif

namespace stoker::image_internal {
namespace {

constexpr int32_t kHalf = 1 << (kResampleFractionBits - 1);
constexpr int kFastFractionBits = 14;
constexpr int32_t kFastHalf = 1 << (kFastFractionBits - 1);

double Triangle(double x) {
  if (x < 0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t Clip8(int32_t sum) {
  const int32_t v = sum >> kResampleFractionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

void HorizontalPortable(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                        uint8_t* out) {
  // The taps' arrays through locals: `out` may alias anything, so a member read inside the loop
  // would be reloaded after every output's store (see HorizontalRgbAvx2).
  const int n = static_cast<int>(taps.start.size());
  const int32_t* coeffs = taps.coeffs.data();
  const int32_t* starts = taps.start.data();
  const int32_t* counts = taps.count.data();
  const int ksize = taps.ksize;
  if (channels == 3) {
    for (int o = 0; o < n; ++o) {
      const uint8_t* p = row + (starts[o] - row_lo) * 3;
      const int32_t* k = coeffs + o * ksize;
      int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
      for (int t = 0, c = counts[o]; t < c; ++t) {
        s0 += p[3 * t] * k[t];
        s1 += p[3 * t + 1] * k[t];
        s2 += p[3 * t + 2] * k[t];
      }
      out[3 * o] = Clip8(s0);
      out[3 * o + 1] = Clip8(s1);
      out[3 * o + 2] = Clip8(s2);
    }
  } else {
    for (int o = 0; o < n; ++o) {
      const uint8_t* p = row + (starts[o] - row_lo);
      const int32_t* k = coeffs + o * ksize;
      int32_t s = kHalf;
      for (int t = 0, c = counts[o]; t < c; ++t) s += p[t] * k[t];
      out[o] = Clip8(s);
    }
  }
}

// The fast mode's horizontal pass for output pixel o (RGB): its `pairs` tap pairs with 14-bit
// weights (pair_coeffs16), summed from 2^13 and shifted by 14.
inline void HorizontalRgbFastPixel(const AxisTaps& taps, const uint8_t* row, int row_lo, int pairs,
                                   int o, uint8_t* out) {
  const uint8_t* p = row + (taps.fixed_start[o] - row_lo) * 3;
  const int16_t* c = taps.pair_coeffs16.data() + static_cast<size_t>(o) * pairs * 8;
  int32_t sum[3] = {kFastHalf, kFastHalf, kFastHalf};
  for (int j = 0; j < pairs; ++j) {
    for (int ch = 0; ch < 3; ++ch) {
      sum[ch] += p[6 * j + ch] * c[8 * j + 2 * ch] + p[6 * j + 3 + ch] * c[8 * j + 2 * ch + 1];
    }
  }
  for (int ch = 0; ch < 3; ++ch) {
    const int32_t v = sum[ch] >> kFastFractionBits;
    out[3 * o + ch] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
  }
}

// The fast mode's horizontal pass (ResampleRowHorizontalFast) over every output pixel. The AVX2
// version computes the same.
void HorizontalRgbFastPortable(const AxisTaps& taps, const uint8_t* row, int row_lo, uint8_t* out) {
  const int n = static_cast<int>(taps.fixed_start.size());
  for (int o = 0; o < n; ++o) HorizontalRgbFastPixel(taps, row, row_lo, taps.pairs, o, out);
}

void VerticalPortable(const AxisTaps& taps, int o, const uint8_t* rows, int rows_lo, int row_bytes,
                      int32_t* acc, uint8_t* out) {
  std::fill(acc, acc + row_bytes, kHalf);
  const int32_t* k = taps.coeffs.data() + static_cast<size_t>(o) * taps.ksize;
  const uint8_t* first = rows + static_cast<size_t>(taps.start[o] - rows_lo) * row_bytes;
  for (int t = 0, c = taps.count[o]; t < c; ++t) {
    const uint8_t* r = first + static_cast<size_t>(t) * row_bytes;
    const int32_t w = k[t];
    for (int j = 0; j < row_bytes; ++j) acc[j] += r[j] * w;
  }
  for (int j = 0; j < row_bytes; ++j) out[j] = Clip8(acc[j]);
}

#if STOKER_RESAMPLE_SSE41

// (sum >> 22) clamped to 0..255 in the low 4 bytes (packs saturates to int16, packus to uint8:
// the same clamp as Clip8).
__attribute__((target("sse4.1"))) inline __m128i Pack4(__m128i sum) {
  const __m128i v = _mm_srai_epi32(sum, kResampleFractionBits);
  const __m128i w = _mm_packs_epi32(v, v);
  return _mm_packus_epi16(w, w);
}

// One RGB pixel per 4-lane vector (the 4th lane reads the next byte and is discarded), over the
// fixed-length taps (K > 0: unrolled for that length; K = 0: taps.fixed_k).
template <int K>
__attribute__((target("sse4.1"))) void HorizontalRgbSse41(const AxisTaps& taps, const uint8_t* row,
                                                          int row_lo, uint8_t* out) {
  const int n = static_cast<int>(taps.fixed_start.size());
  const int k = K > 0 ? K : taps.fixed_k;
  const int32_t* coeffs = taps.fixed_coeffs.data();
  const int32_t* starts = taps.fixed_start.data();
  for (int o = 0; o < n; ++o) {
    const uint8_t* p = row + (starts[o] - row_lo) * 3;
    const int32_t* c = coeffs + o * k;
    __m128i sum = _mm_set1_epi32(kHalf);
    for (int t = 0; t < k; ++t) {
      int32_t pixel;
      std::memcpy(&pixel, p + 3 * t, 4);
      const __m128i v = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(pixel));
      sum = _mm_add_epi32(sum, _mm_mullo_epi32(v, _mm_set1_epi32(c[t])));
    }
    const int32_t packed = _mm_cvtsi128_si32(Pack4(sum));
    std::memcpy(out + 3 * o, &packed, 4);  // the 4th byte is overwritten by the next pixel
  }
}

// Two RGB pixels (two taps) per 8-lane vector: bytes [R0 G0 B0 R1 G1 B1 x x] widened to 32 bits
// as they lie, times the pair's weights {c0, c0, c0, c1, c1, c1, 0, 0}; at the end lanes 3-5 are
// added to lanes 0-2 (R, G, B). An odd tap count has a zero last weight (its pixel bytes are
// read: the row's slack covers them).
template <int P>
__attribute__((target("avx2"))) void HorizontalRgbAvx2(const AxisTaps& taps, const uint8_t* row,
                                                       int row_lo, uint8_t* out) {
  const __m256i fold = _mm256_setr_epi32(3, 4, 5, 6, 6, 6, 6, 6);
  const __m256i half = _mm256_setr_epi32(kHalf, kHalf, kHalf, 0, 0, 0, 0, 0);
  const int n = static_cast<int>(taps.fixed_start.size());
  const int pairs = P > 0 ? P : taps.pairs;
  const int32_t* coeffs = taps.pair_coeffs.data();
  // In a local, not read through `taps` in the loop: `out` may alias the taps (uint8_t), so the
  // member would be reloaded after every output's store.
  const int32_t* starts = taps.fixed_start.data();
  for (int o = 0; o < n; ++o) {
    const uint8_t* p = row + (starts[o] - row_lo) * 3;
    const int32_t* c = coeffs + static_cast<size_t>(o) * pairs * 8;
    __m256i acc = half;
    for (int j = 0; j < pairs; ++j) {
      const __m256i v =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 6 * j)));
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 8 * j));
      acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(v, w));
    }
    // Lane 6 is 0 (zero weights): lane 3 of the result is lane 3 + 0, discarded anyway.
    const __m256i sum = _mm256_add_epi32(acc, _mm256_permutevar8x32_epi32(acc, fold));
    const int32_t packed = _mm_cvtsi128_si32(Pack4(_mm256_castsi256_si128(sum)));
    std::memcpy(out + 3 * o, &packed, 4);  // the 4th byte is overwritten by the next pixel
  }
}

// The fast mode's horizontal pass, two outputs per 256-bit vector (output o in the low lane, o + 1
// in the high one). Per tap pair, 16 bytes from the pair's first pixel are loaded (only 6 used:
// [R0 G0 B0 R1 G1 B1]; the row's slack covers the rest), shuffled to 16-bit [R0 R1 G0 G1 B0 B1 0
// 0] and multiplied by {c0, c1, c0, c1, c0, c1, 0, 0} with pmaddwd: one instruction gives the
// pair's R, G and B sums. No 32-bit multiplies, which is what makes it faster than the exact
// passes (whose 22-bit weights do not fit 16 bits).
template <int P>
__attribute__((target("avx2"))) void HorizontalRgbFastAvx2(const AxisTaps& taps, const uint8_t* row,
                                                           int row_lo, uint8_t* out) {
  const __m256i shuffle =
      _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0, -1, 3, -1, 1,
                       -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(kFastHalf);
  const int n = static_cast<int>(taps.fixed_start.size());
  const int pairs = P > 0 ? P : taps.pairs;
  const int16_t* coeffs = taps.pair_coeffs16.data();
  const int32_t* starts = taps.fixed_start.data();  // a local: see HorizontalRgbAvx2
  int o = 0;
  for (; o + 2 <= n; o += 2) {
    const uint8_t* p0 = row + (starts[o] - row_lo) * 3;
    const uint8_t* p1 = row + (starts[o + 1] - row_lo) * 3;
    const int16_t* c0 = coeffs + static_cast<size_t>(o) * pairs * 8;
    const int16_t* c1 = c0 + pairs * 8;
    __m256i acc = half;
    for (int j = 0; j < pairs; ++j) {
      const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p1 + 6 * j),
                                            reinterpret_cast<const __m128i*>(p0 + 6 * j));
      const __m256i w = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c1 + 8 * j),
                                            reinterpret_cast<const __m128i*>(c0 + 8 * j));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(v, shuffle), w));
    }
    const __m256i sums = _mm256_srai_epi32(acc, kFastFractionBits);
    const __m256i words = _mm256_packs_epi32(sums, sums);
    const __m256i bytes = _mm256_packus_epi16(words, words);
    const int32_t lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(bytes));
    const int32_t hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1));
    std::memcpy(out + 3 * o, &lo, 4);  // the 4th byte is overwritten by the next pixel
    std::memcpy(out + 3 * o + 3, &hi, 4);
  }
  // An odd count: the last output as the portable version computes it.
  if (o < n) HorizontalRgbFastPixel(taps, row, row_lo, pairs, o, out);
}

// 16 bytes of a row at a time in two 8-lane accumulators.
__attribute__((target("avx2"))) void VerticalAvx2(const AxisTaps& taps, int o, const uint8_t* rows,
                                                  int rows_lo, int row_bytes, uint8_t* out) {
  const int k = taps.fixed_k;
  const int32_t* c = taps.fixed_coeffs.data() + static_cast<size_t>(o) * k;
  const uint8_t* first = rows + static_cast<size_t>(taps.fixed_start[o] - rows_lo) * row_bytes;
  int j = 0;
  for (; j + 16 <= row_bytes; j += 16) {
    __m256i s0 = _mm256_set1_epi32(kHalf), s1 = s0;
    const uint8_t* r = first + j;
    for (int t = 0; t < k; ++t, r += row_bytes) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r));
      const __m256i w = _mm256_set1_epi32(c[t]);
      s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b), w));
      s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), w));
    }
    // packs works within 128-bit lanes: [0-3, 8-11, 4-7, 12-15], put back in order.
    const __m256i words =
        _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_srai_epi32(s0, kResampleFractionBits),
                                                    _mm256_srai_epi32(s1, kResampleFractionBits)),
                                 0xd8);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + j),
        _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
  }
  for (; j < row_bytes; ++j) {
    int32_t sum = kHalf;
    for (int t = 0; t < k; ++t) sum += first[t * row_bytes + j] * c[t];
    out[j] = Clip8(sum);
  }
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// 16 bytes of a row at a time, all taps accumulated in registers.
__attribute__((target("sse4.1"))) void VerticalSse41(const AxisTaps& taps, int o,
                                                     const uint8_t* rows, int rows_lo,
                                                     int row_bytes, int32_t* acc, uint8_t* out) {
  const int32_t* k = taps.coeffs.data() + static_cast<size_t>(o) * taps.ksize;
  const uint8_t* first = rows + static_cast<size_t>(taps.start[o] - rows_lo) * row_bytes;
  const int count = taps.count[o];
  int j = 0;
  for (; j + 16 <= row_bytes; j += 16) {
    __m128i s0 = _mm_set1_epi32(kHalf), s1 = s0, s2 = s0, s3 = s0;
    for (int t = 0; t < count; ++t) {
      const __m128i b =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + t * row_bytes + j));
      const __m128i w = _mm_set1_epi32(k[t]);
      s0 = _mm_add_epi32(s0, _mm_mullo_epi32(_mm_cvtepu8_epi32(b), w));
      s1 = _mm_add_epi32(s1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(b, 4)), w));
      s2 = _mm_add_epi32(s2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(b, 8)), w));
      s3 = _mm_add_epi32(s3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(b, 12)), w));
    }
    const __m128i lo = _mm_packs_epi32(_mm_srai_epi32(s0, kResampleFractionBits),
                                       _mm_srai_epi32(s1, kResampleFractionBits));
    const __m128i hi = _mm_packs_epi32(_mm_srai_epi32(s2, kResampleFractionBits),
                                       _mm_srai_epi32(s3, kResampleFractionBits));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm_packus_epi16(lo, hi));
  }
  for (; j < row_bytes; ++j) {
    int32_t s = kHalf;
    for (int t = 0; t < count; ++t) s += first[t * row_bytes + j] * k[t];
    out[j] = Clip8(s);
  }
  (void)acc;
}

// SSSE3: 16 pixels (48 bytes) per step, each plane gathered from the three loads by shuffles.
__attribute__((target("ssse3"))) int DeinterleaveSsse3(const uint8_t* rgb, int count, uint8_t* r,
                                                       uint8_t* g, uint8_t* b) {
  // mask[plane][load]: byte i of the plane's 16 comes from byte 3i + plane of the 48.
  alignas(16) static const auto masks = [] {
    std::array<std::array<std::array<int8_t, 16>, 3>, 3> m{};
    for (int plane = 0; plane < 3; ++plane) {
      for (int load = 0; load < 3; ++load) {
        for (int i = 0; i < 16; ++i) {
          const int src = 3 * i + plane;
          m[plane][load][i] = static_cast<int8_t>(src / 16 == load ? src % 16 : -1);
        }
      }
    }
    return m;
  }();
  uint8_t* planes[3] = {r, g, b};
  int x = 0;
  for (; x + 16 <= count; x += 16) {
    const __m128i in[3] = {_mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x + 16)),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x + 32))};
    for (int plane = 0; plane < 3; ++plane) {
      __m128i v = _mm_setzero_si128();
      for (int load = 0; load < 3; ++load) {
        v = _mm_or_si128(
            v, _mm_shuffle_epi8(in[load], _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                              masks[plane][load].data()))));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[plane] + x), v);
    }
  }
  return x;
}

bool CpuHasSse41() {
  static const bool has = __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("ssse3");
  return has;
}
#else
bool CpuHasSse41() { return false; }
bool CpuHasAvx2() { return false; }
#endif

std::atomic<int> level_cap{static_cast<int>(ResampleLevel::kAvx2)};

ResampleLevel Level() {
  return static_cast<ResampleLevel>(
      std::min(level_cap.load(std::memory_order_relaxed), static_cast<int>(ResampleBestLevel())));
}

}  // namespace

ResampleLevel ResampleBestLevel() {
  if (CpuHasAvx2() && CpuHasSse41()) return ResampleLevel::kAvx2;
  if (CpuHasSse41()) return ResampleLevel::kSse41;
  return ResampleLevel::kPortable;
}

ResampleLevel ResampleActiveLevel() { return Level(); }

void SetResampleLevelForTesting(ResampleLevel cap) { level_cap.store(static_cast<int>(cap)); }

bool ResampleUsesSimd() { return Level() != ResampleLevel::kPortable; }

void SetResampleSimdForTesting(bool enabled) {
  SetResampleLevelForTesting(enabled ? ResampleLevel::kAvx2 : ResampleLevel::kPortable);
}

void DeinterleaveRgb(const uint8_t* rgb, int count, uint8_t* r, uint8_t* g, uint8_t* b) {
  int x = 0;
#if STOKER_RESAMPLE_SSE41
  if (Level() != ResampleLevel::kPortable) x = DeinterleaveSsse3(rgb, count, r, g, b);
#endif
  for (; x < count; ++x) {
    r[x] = rgb[3 * x];
    g[x] = rgb[3 * x + 1];
    b[x] = rgb[3 * x + 2];
  }
}

void ComputeAxisTaps(const AxisSpec& spec, bool reverse, AxisTaps* taps) {
  const double scale = (spec.in1 - spec.in0) / spec.out_full;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filterscale;  // the triangle's support is 1
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int window = spec.window_hi - spec.window_lo;
  taps->ksize = ksize;
  taps->coeffs.assign(static_cast<size_t>(spec.out_count) * ksize, 0);
  taps->start.assign(spec.out_count, 0);
  taps->count.assign(spec.out_count, 0);
  taps->src_lo = spec.image_size;
  taps->src_hi = 0;
  double weights[64];
  std::vector<double> heap_weights;
  double* w = weights;
  if (ksize > 64) {
    heap_weights.resize(ksize);
    w = heap_weights.data();
  }
  const double ss = 1.0 / filterscale;
  for (int i = 0; i < spec.out_count; ++i) {
    const int xx = spec.out_begin + i;
    if (xx < 0 || xx >= spec.out_full) continue;  // padding: no taps, output 0
    const int o = reverse ? spec.out_count - 1 - i : i;
    const double center = spec.in0 + (xx + 0.5) * scale;
    // (int) truncates like PIL's cast; negative values are clipped to 0 right after.
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > window) xmax = window;
    const int n = xmax - xmin;
    double total = 0;
    for (int x = 0; x < n; ++x) {
      w[x] = Triangle((x + xmin - center + 0.5) * ss);
      total += w[x];
    }
    // Source positions outside the image are zero pixels: drop those taps.
    int first = 0, last = n;
    const int abs_min = spec.window_lo + xmin;
    if (abs_min < 0) first = std::min(n, -abs_min);
    if (abs_min + last > spec.image_size) last = std::max(first, spec.image_size - abs_min);
    int32_t* k = &taps->coeffs[static_cast<size_t>(o) * ksize];
    for (int x = first; x < last; ++x) {
      const double v = total != 0.0 ? w[x] / total : w[x];
      const double fixed = v * (1 << kResampleFractionBits);
      k[x - first] = static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps->start[o] = abs_min + first;
    taps->count[o] = last - first;
    if (last > first) {
      taps->src_lo = std::min(taps->src_lo, abs_min + first);
      taps->src_hi = std::max(taps->src_hi, abs_min + last);
    }
  }
  // The fixed-length taps (see AxisTaps): as many as the longest output has (PIL's ksize is up
  // to two more, whose weights would all be zero).
  const int longest =
      taps->count.empty() ? 0 : *std::max_element(taps->count.begin(), taps->count.end());
  const int k = std::max(0, std::min(longest, taps->src_hi - taps->src_lo));
  taps->fixed_k = k;
  taps->fixed_coeffs.assign(static_cast<size_t>(spec.out_count) * k + kFixedCoeffSlack, 0);
  taps->fixed_start.assign(spec.out_count, taps->src_lo);
  const int pairs = (k + 1) / 2;
  taps->pairs = pairs;
  taps->pair_coeffs.assign(static_cast<size_t>(spec.out_count) * pairs * 8, 0);
  taps->pair_coeffs16.assign(static_cast<size_t>(spec.out_count) * pairs * 8, 0);
  if (k == 0) return;
  for (int o = 0; o < spec.out_count; ++o) {
    const int count = taps->count[o];
    if (count == 0) continue;
    const int start = std::min(taps->start[o], taps->src_hi - k);
    taps->fixed_start[o] = start;
    const int shift = taps->start[o] - start;
    int32_t* fixed = &taps->fixed_coeffs[static_cast<size_t>(o) * k];
    std::copy_n(&taps->coeffs[static_cast<size_t>(o) * ksize], count, fixed + shift);
    int32_t* pair = &taps->pair_coeffs[static_cast<size_t>(o) * pairs * 8];
    int16_t* pair16 = &taps->pair_coeffs16[static_cast<size_t>(o) * pairs * 8];
    for (int t = 0; t < k; ++t) {
      int32_t* lanes = pair + (t / 2) * 8 + (t % 2) * 3;
      lanes[0] = lanes[1] = lanes[2] = fixed[t];
      // 22 fraction bits to 14, rounded (weights are in [0, 1]: at most 2^14 after).
      const int16_t w16 = static_cast<int16_t>(
          (fixed[t] + (1 << (kResampleFractionBits - kFastFractionBits - 1))) >>
          (kResampleFractionBits - kFastFractionBits));
      int16_t* w = pair16 + (t / 2) * 8 + (t % 2);
      w[0] = w[2] = w[4] = w16;
    }
  }
}

void ResampleRowHorizontal(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                           uint8_t* out) {
#if STOKER_RESAMPLE_SSE41
  const ResampleLevel level = Level();
  if (level != ResampleLevel::kPortable && channels == 3 && taps.fixed_k > 0) {
    // Unrolled for the common lengths (upscales: 2-3 taps; downscales by up to ~3: up to 9).
    using Fn = void (*)(const AxisTaps&, const uint8_t*, int, uint8_t*);
    static constexpr Fn kAvx2[] = {HorizontalRgbAvx2<0>, HorizontalRgbAvx2<1>,
                                   HorizontalRgbAvx2<2>, HorizontalRgbAvx2<3>,
                                   HorizontalRgbAvx2<4>, HorizontalRgbAvx2<5>};
    static constexpr Fn kSse41[] = {
        HorizontalRgbSse41<0>, HorizontalRgbSse41<1>, HorizontalRgbSse41<2>, HorizontalRgbSse41<3>,
        HorizontalRgbSse41<4>, HorizontalRgbSse41<5>, HorizontalRgbSse41<6>, HorizontalRgbSse41<7>,
        HorizontalRgbSse41<8>, HorizontalRgbSse41<9>};
    if (level == ResampleLevel::kAvx2) {
      kAvx2[taps.pairs < 6 ? taps.pairs : 0](taps, row, row_lo, out);
    } else {
      kSse41[taps.fixed_k < 10 ? taps.fixed_k : 0](taps, row, row_lo, out);
    }
    return;
  }
#endif
  HorizontalPortable(taps, row, row_lo, channels, out);
}

void ResampleRowHorizontalFast(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                               uint8_t* out) {
  if (channels != 3 || taps.fixed_k == 0) {
    ResampleRowHorizontal(taps, row, row_lo, channels, out);
    return;
  }
#if STOKER_RESAMPLE_SSE41
  if (Level() == ResampleLevel::kAvx2) {
    using Fn = void (*)(const AxisTaps&, const uint8_t*, int, uint8_t*);
    static constexpr Fn kFast[] = {HorizontalRgbFastAvx2<0>, HorizontalRgbFastAvx2<1>,
                                   HorizontalRgbFastAvx2<2>, HorizontalRgbFastAvx2<3>};
    kFast[taps.pairs < 4 ? taps.pairs : 0](taps, row, row_lo, out);
    return;
  }
#endif
  HorizontalRgbFastPortable(taps, row, row_lo, out);
}

void ResampleRowVertical(const AxisTaps& taps, int o, const uint8_t* rows, int rows_lo,
                         int row_bytes, int32_t* acc, uint8_t* out) {
#if STOKER_RESAMPLE_SSE41
  const ResampleLevel level = Level();
  if (level == ResampleLevel::kAvx2 && taps.fixed_k > 0) {
    VerticalAvx2(taps, o, rows, rows_lo, row_bytes, out);
    return;
  }
  if (level == ResampleLevel::kSse41) {
    VerticalSse41(taps, o, rows, rows_lo, row_bytes, acc, out);
    return;
  }
#endif
  VerticalPortable(taps, o, rows, rows_lo, row_bytes, acc, out);
}

}  // namespace stoker::image_internal
