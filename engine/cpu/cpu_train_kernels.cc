#include "engine/cpu/cpu_train_kernels.h"

#include <algorithm>
#include <cmath>

#include "engine/fp16.h"

namespace stoker::cpu {
namespace {

// Below this many elements a loop runs on one thread: forking the OpenMP team costs more.
constexpr int64_t kParallelMinElements = 1 << 15;

// splitmix64's finaliser: a bijective 64-bit mix, enough for dropout masks.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline float ToFloat(float v) { return v; }
inline float ToFloat(bf16_t v) { return Bf16ToFloat(v); }
template <typename T>
inline T FromFloat(float v);
template <>
inline float FromFloat<float>(float v) {
  return v;
}
template <>
inline bf16_t FromFloat<bf16_t>(float v) {
  return FloatToBf16(v);
}

}  // namespace

double SmoothLabels(const float* logits, const uint8_t* labels, int rows, int classes,
                    float smoothing, float* grad) {
  double loss_sum = 0;
  const float inverse_rows = 1.0f / static_cast<float>(rows);
  const float uniform = smoothing / static_cast<float>(classes) * inverse_rows;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<int64_t>(r) * classes;
    double max_logit = z[0];
    for (int c = 1; c < classes; ++c) max_logit = std::max(max_logit, static_cast<double>(z[c]));
    double sum = 0, mean_logit = 0;
    for (int c = 0; c < classes; ++c) {
      sum += std::exp(z[c] - max_logit);
      mean_logit += z[c];
    }
    mean_logit /= classes;
    const double lse = std::log(sum) + max_logit;
    loss_sum += (1.0 - smoothing) * (lse - z[labels[r]]) + smoothing * (lse - mean_logit);
    if (grad != nullptr) {
      float* g = grad + static_cast<int64_t>(r) * classes;
      g[labels[r]] += smoothing * inverse_rows;
      for (int c = 0; c < classes; ++c) g[c] -= uniform;
    }
  }
  return loss_sum;
}

void SgdUpdate(int64_t n, float learning_rate, float momentum, float weight_decay, bool nesterov,
               const float* grad, float* weight, float* velocity) {
  if (momentum == 0) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i)
      weight[i] -= learning_rate * (grad[i] + weight_decay * weight[i]);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * weight[i];
    const float v = momentum * velocity[i] + g;
    velocity[i] = v;
    weight[i] -= learning_rate * (nesterov ? g + momentum * v : v);
  }
}

void AdamWUpdate(int64_t n, float learning_rate, float beta1, float beta2, float eps,
                 float weight_decay, int64_t step, const float* grad, float* weight, float* exp_avg,
                 float* exp_avg_sq) {
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  const float step_size = static_cast<float>(learning_rate / bias_correction1);
  const float inverse_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay = 1.0f - learning_rate * weight_decay;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float w = weight[i] * decay;
    const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    weight[i] = w - step_size * m / (std::sqrt(v) * inverse_sqrt_correction2 + eps);
  }
}

double SumOfSquares(const float* data, int64_t n) {
  // Serial, in index order: the same sum on any thread count (clipping is rare and cheap).
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(data[i]) * data[i];
  return total;
}

bool AllFinite(const float* data, int64_t n) {
  int bad = 0;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(data[i]);
  return bad == 0;
}

void ScaleInPlace(float* data, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) data[i] *= factor;
}

template <typename T>
void DropoutForward(const T* x, int64_t n, float rate, uint64_t seed, uint64_t stream,
                    uint8_t* keep, T* y) {
  const uint64_t key = Mix(seed ^ Mix(stream));
  // keep when the top 32 bits of the hash are >= rate * 2^32.
  const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(rate) * 4294967296.0);
  const float inverse_keep = 1.0f / (1.0f - rate);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = (Mix(key + static_cast<uint64_t>(i)) >> 32) >= threshold;
    keep[i] = kept;
    y[i] = kept ? FromFloat<T>(ToFloat(x[i]) * inverse_keep) : FromFloat<T>(0.0f);
  }
}

template <typename T>
void DropoutBackward(const T* dy, const uint8_t* keep, int64_t n, float rate, T* dx) {
  const float inverse_keep = 1.0f / (1.0f - rate);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = keep[i] ? FromFloat<T>(ToFloat(dy[i]) * inverse_keep) : FromFloat<T>(0.0f);
  }
}

template void DropoutForward<float>(const float*, int64_t, float, uint64_t, uint64_t, uint8_t*,
                                    float*);
template void DropoutForward<bf16_t>(const bf16_t*, int64_t, float, uint64_t, uint64_t, uint8_t*,
                                     bf16_t*);
template void DropoutBackward<float>(const float*, const uint8_t*, int64_t, float, float*);
template void DropoutBackward<bf16_t>(const bf16_t*, const uint8_t*, int64_t, float, bf16_t*);

void RoundToFp16InPlace(float* data, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) data[i] = RoundToFp16(data[i]);
}

void ConvertBf16ToF32(const bf16_t* src, int64_t n, float* dst) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

void ScaleToBf16(const float* src, int64_t n, float scale, bf16_t* dst) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i] * scale);
}

void ScaleToF32(const float* src, int64_t n, float scale, bool round_fp16, float* dst) {
  if (round_fp16) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) dst[i] = RoundToFp16(src[i] * scale);
  } else {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
  }
}

}  // namespace stoker::cpu
