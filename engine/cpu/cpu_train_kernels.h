// Element-wise loops of the CPU network that cpu_kernels.h does not have: the optimizers (SGD with
// momentum/Nesterov, AdamW), gradient norm and finiteness checks for clipping and loss scaling,
// inverted dropout, and fp16/bf16 conversions. None allocate; all are deterministic (fixed
// summation order whatever the thread count).
#ifndef STOKER_ENGINE_CPU_CPU_TRAIN_KERNELS_H_
#define STOKER_ENGINE_CPU_CPU_TRAIN_KERNELS_H_

#include <cstdint>

#include "engine/bf16.h"

namespace stoker::cpu {

// torch.optim.SGD on n values: g = grad + weight_decay * w; v = momentum * v + g;
// w -= lr * (nesterov ? g + momentum * v : v). With momentum 0, v is left alone and w -= lr * g.
void SgdUpdate(int64_t n, float learning_rate, float momentum, float weight_decay, bool nesterov,
               const float* grad, float* weight, float* velocity);

// torch.optim.AdamW on n values at step `step` (1 for the first):
// w *= 1 - lr * weight_decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// w -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
void AdamWUpdate(int64_t n, float learning_rate, float beta1, float beta2, float eps,
                 float weight_decay, int64_t step, const float* grad, float* weight, float* exp_avg,
                 float* exp_avg_sq);

// Softmax cross-entropy against the smoothed target (1 - smoothing) * onehot + smoothing /
// classes, as torch.nn.CrossEntropyLoss(label_smoothing=smoothing): per row
// (1 - smoothing) * (lse - z[label]) + smoothing * mean_k (lse - z[k]), lse = log sum_k exp z[k].
// Returns the summed loss (in double). `grad`, when set, must hold cpu::SoftmaxCrossEntropy's
// gradient of the same logits, (softmax - onehot) / rows; it becomes
// (softmax - smoothed target) / rows.
double SmoothLabels(const float* logits, const uint8_t* labels, int rows, int classes,
                    float smoothing, float* grad);

// Sum of squares in double, in index order.
double SumOfSquares(const float* data, int64_t n);
// True when no value is inf or NaN.
bool AllFinite(const float* data, int64_t n);
// data[i] *= factor.
void ScaleInPlace(float* data, int64_t n, float factor);

// Inverted dropout: keep[i] = 1 with probability 1 - rate, drawn from a hash of (seed, stream, i)
// so the mask depends on nothing else; y = keep ? x / (1 - rate) : 0. T = float or bf16_t.
template <typename T>
void DropoutForward(const T* x, int64_t n, float rate, uint64_t seed, uint64_t stream,
                    uint8_t* keep, T* y);
// dx = keep ? dy / (1 - rate) : 0.
template <typename T>
void DropoutBackward(const T* dy, const uint8_t* keep, int64_t n, float rate, T* dx);

// data[i] = the nearest fp16 value (fp16 storage emulated in fp32 buffers).
void RoundToFp16InPlace(float* data, int64_t n);
// dst[i] = float(src[i]).
void ConvertBf16ToF32(const bf16_t* src, int64_t n, float* dst);
// dst[i] = src[i] * scale, in the compute type (bf16 rounded, or fp16 rounded when round_fp16).
void ScaleToBf16(const float* src, int64_t n, float scale, bf16_t* dst);
void ScaleToF32(const float* src, int64_t n, float scale, bool round_fp16, float* dst);

}  // namespace stoker::cpu

#endif  // STOKER_ENGINE_CPU_CPU_TRAIN_KERNELS_H_
