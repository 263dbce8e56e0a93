// The element-wise loops of the CPU MLP, everything that is not a matmul: input normalisation,
// softmax cross-entropy, ReLU backward fused with the bias gradient, and the SGD-momentum update.
// All buffers are row-major; none of these functions allocate.
#ifndef STOKER_ENGINE_CPU_CPU_KERNELS_H_
#define STOKER_ENGINE_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "engine/bf16.h"

namespace stoker::cpu {

// dst[i] = src[i] * scale + shift for i < n (computed in fp32, then rounded for bf16).
void NormalizeToF32(const uint8_t* src, int64_t n, float scale, float shift, float* dst);
void NormalizeToBf16(const uint8_t* src, int64_t n, float scale, float shift, bf16_t* dst);

// Softmax cross-entropy of `rows` x `classes` logits against `labels` (each < classes).
// Returns the summed loss (in double). When `grad` is set it receives d(mean loss)/d(logits),
// i.e. (softmax - onehot) / rows. When `correct` is set it receives the argmax hits.
double SoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows, int classes,
                           float* grad, int64_t* correct);

// Completes the gradient at a Linear layer's output, in one pass over `grad` (rows x cols, fp32):
// - if `activation` is set (the layer's ReLU output, Act = float or bf16_t), zeroes grad where the
//   activation is <= 0 (ReLU backward);
// - writes bias_grad[c] = sum over rows of grad[r, c];
// - if `grad_bf16` is set, stores a bf16 copy of the result for the bf16 matmuls.
template <typename Act>
void FinishOutputGrad(const Act* activation, int rows, int cols, float* grad, float* bias_grad,
                      bf16_t* grad_bf16);

// One PyTorch SGD step on n values: g = grad + weight_decay * w; v = momentum * v + g;
// w -= lr * v. If `weight_bf16` is set it receives the updated weights rounded to bf16, so the
// next forward pass needs no separate conversion.
void SgdMomentumUpdate(int64_t n, float learning_rate, float momentum, float weight_decay,
                       const float* grad, float* weight, float* velocity, bf16_t* weight_bf16);

// dst[i] = bf16(src[i]) for i < n.
void ConvertToBf16(const float* src, int64_t n, bf16_t* dst);

}  // namespace stoker::cpu

#endif  // STOKER_ENGINE_CPU_CPU_KERNELS_H_
