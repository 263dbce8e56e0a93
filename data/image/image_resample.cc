#include "data/image/image_resample.h"

#include <algorithm>
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
  const int n = static_cast<int>(taps.start.size());
  const int32_t* coeffs = taps.coeffs.data();
  if (channels == 3) {
    for (int o = 0; o < n; ++o) {
      const uint8_t* p = row + (taps.start[o] - row_lo) * 3;
      const int32_t* k = coeffs + o * taps.ksize;
      int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
      for (int t = 0, c = taps.count[o]; t < c; ++t) {
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
      const uint8_t* p = row + (taps.start[o] - row_lo);
      const int32_t* k = coeffs + o * taps.ksize;
      int32_t s = kHalf;
      for (int t = 0, c = taps.count[o]; t < c; ++t) s += p[t] * k[t];
      out[o] = Clip8(s);
    }
  }
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

// One RGB pixel per 4-lane vector (the 4th lane reads the next byte and is discarded).
__attribute__((target("sse4.1"))) void HorizontalSse41(const AxisTaps& taps, const uint8_t* row,
                                                       int row_lo, int channels, uint8_t* out) {
  if (channels != 3) {
    HorizontalPortable(taps, row, row_lo, channels, out);
    return;
  }
  const int n = static_cast<int>(taps.start.size());
  const int32_t* coeffs = taps.coeffs.data();
  for (int o = 0; o < n; ++o) {
    const uint8_t* p = row + (taps.start[o] - row_lo) * 3;
    const int32_t* k = coeffs + o * taps.ksize;
    __m128i sum = _mm_set1_epi32(kHalf);
    for (int t = 0, c = taps.count[o]; t < c; ++t) {
      int32_t pixel;
      std::memcpy(&pixel, p + 3 * t, 4);
      const __m128i v = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(pixel));
      sum = _mm_add_epi32(sum, _mm_mullo_epi32(v, _mm_set1_epi32(k[t])));
    }
    const int32_t packed = _mm_cvtsi128_si32(Pack4(sum));
    std::memcpy(out + 3 * o, &packed, 4);  // the 4th byte is overwritten by the next pixel
  }
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

bool CpuHasSse41() {
  static const bool has = __builtin_cpu_supports("sse4.1");
  return has;
}
#else
bool CpuHasSse41() { return false; }
#endif

std::atomic<bool> simd_allowed{true};

}  // namespace

bool ResampleUsesSimd() { return simd_allowed.load(std::memory_order_relaxed) && CpuHasSse41(); }

void SetResampleSimdForTesting(bool enabled) { simd_allowed.store(enabled); }

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
}

void ResampleRowHorizontal(const AxisTaps& taps, const uint8_t* row, int row_lo, int channels,
                           uint8_t* out) {
#if STOKER_RESAMPLE_SSE41
  if (ResampleUsesSimd()) {
    HorizontalSse41(taps, row, row_lo, channels, out);
    return;
  }
#endif
  HorizontalPortable(taps, row, row_lo, channels, out);
}

void ResampleRowVertical(const AxisTaps& taps, int o, const uint8_t* rows, int rows_lo,
                         int row_bytes, int32_t* acc, uint8_t* out) {
#if STOKER_RESAMPLE_SSE41
  if (ResampleUsesSimd()) {
    VerticalSse41(taps, o, rows, rows_lo, row_bytes, acc, out);
    return;
  }
#endif
  VerticalPortable(taps, o, rows, rows_lo, row_bytes, acc, out);
}

}  // namespace stoker::image_internal
