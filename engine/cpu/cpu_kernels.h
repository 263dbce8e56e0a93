// The element-wise loops of the CPU MLP, everything that is not a matmul: input normalisation,
// softmax cross-entropy, ReLU backward fused with the bias gradient, and the SGD-momentum update.
// All buffers are row-major; none of these functions allocate.
#ifndef STOKER_ENGINE_CPU_CPU_KERNELS_H_
#define STOKER_ENGINE_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "engine/bf16.h"

namespace stoker::cpu {

// Per-channel input normalisation of a batch: consecutive planes of `plane` values, the planes of
// each sample in channel order (NCHW, or a flat sample cut into `channels` equal blocks), so plane
// p is in channel p % channels. `scale` and `shift` point to `channels` values each.
struct ChannelAffine {
  int channels = 1;
  int64_t plane = 1;
  const float* scale = nullptr;
  const float* shift = nullptr;
};

// dst[i] = src[i] * scale[c] + shift[c] for i < n, c = (i / plane) % channels (computed in fp32,
// a multiply then an add, then rounded for bf16). n must be a multiple of channels * plane. Every
// plane uses constants (no division per value); when all channels share their values, the whole
// batch runs as one plane.
void NormalizeToF32(const uint8_t* src, int64_t n, const ChannelAffine& affine, float* dst);
void NormalizeToBf16(const uint8_t* src, int64_t n, const ChannelAffine& affine, bf16_t* dst);

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

// Max pooling of an NHWC batch with a kernel x kernel window and stride `kernel`, no padding
// (PyTorch's MaxPool2d(kernel) in floor mode); kernel at most 15.
struct PoolShape {
  int batch = 0, height = 0, width = 0, channels = 0, kernel = 2;
};
// y[n, i, j, c] = the maximum of x over the window (a NaN wins, as in PyTorch), and
// arg[n, i, j, c] = the window position (row * kernel + column) of its first maximum, in
// PyTorch's scan order. With `relu`, y = 0 where the maximum is negative: the ReLU before a max
// pool, which commutes with it. T = float or bf16_t.
template <typename T>
void MaxPoolForward(const T* x, const PoolShape& shape, bool relu, T* y, uint8_t* arg);
// dx = 0 except at each window's first maximum, which gets dy; with `relu_y` (the forward's
// output, ReLU fused) only where relu_y > 0. Rows and columns outside every window get 0.
template <typename T>
void MaxPoolBackward(const T* dy, const T* relu_y, const uint8_t* arg, const PoolShape& shape,
                     T* dx);

// BatchNorm in training over NHWC activations: `rows` rows (N x H x W) of `channels` values.
struct NormShape {
  int64_t rows = 0;
  int channels = 0;
  float eps = 1e-5f;
};
// Doubles of scratch the two functions below need for `shape` (`work`).
int64_t NormWorkDoubles(const NormShape& shape);
// The batch's mean and biased variance per channel (sums in float over chunks of ~4096 values,
// the chunks added in double in a fixed order: the same bits whatever the thread count), then
// y = (x - mean) * a + shift with a = scale / sqrt(variance + eps) (fp32, rounded to bf16 for
// bf16), plus add[i] when `add` is set (a residual block's sum, fused: one rounding),
// then y = max(y, 0) with `relu` (the ReLU after it, fused). T = float or bf16_t.
template <typename T>
void BatchNormForward(const T* x, const NormShape& shape, const float* scale, const float* shift,
                      const T* add, bool relu, float* mean, float* variance, T* y, double* work);
// The gradients of that forward pass (mean and variance the batch's, from it): g = dy, or 0
// where relu_y (the forward's output, when it fused the ReLU) is not positive; dshift = sum g,
// dscale = sum g * xhat; dx (skipped when null) = scale / std * (g - mean(g) - xhat *
// mean(g * xhat)), xhat = (x - mean) / std. dy and dx may be the same buffer. g_out and g_out2
// (each may be null) receive g itself (a fused residual sum's ReLU backward: the gradient of the
// sum's inputs), written by the first pass and read back by the second instead of dy and relu_y.
template <typename T>
void BatchNormBackward(const T* x, const T* dy, const T* relu_y, const NormShape& shape,
                       const float* mean, const float* variance, const float* scale, float* dscale,
                       float* dshift, T* dx, T* g_out, T* g_out2, double* work);

}  // namespace stoker::cpu

#endif  // STOKER_ENGINE_CPU_CPU_KERNELS_H_
