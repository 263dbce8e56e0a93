// Dispatch: the loops compiled for AVX-512 when the CPU has it (3x faster for the optimizer's
// update, which converts to bf16), the baseline build otherwise. Chosen once per process.
#include "engine/cpu/cpu_kernels.h"

#include <algorithm>

#include "engine/cpu/cpu_kernels_table.h"

namespace stoker::cpu {
namespace {

const KernelTable& Kernels() {
  static const KernelTable& table =
      __builtin_cpu_supports("x86-64-v4") ? kAvx512Kernels : kGenericKernels;
  return table;
}

}  // namespace

void NormalizeToF32(const uint8_t* src, int64_t n, const ChannelAffine& affine, float* dst) {
  Kernels().normalize_to_f32(src, n, affine, dst);
}

void NormalizeToBf16(const uint8_t* src, int64_t n, const ChannelAffine& affine, bf16_t* dst) {
  Kernels().normalize_to_bf16(src, n, affine, dst);
}

double SoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows, int classes,
                           float* grad, int64_t* correct) {
  return Kernels().softmax_cross_entropy(logits, labels, rows, classes, grad, correct);
}

template <>
void FinishOutputGrad<float>(const float* activation, int rows, int cols, float* grad,
                             float* bias_grad, bf16_t* grad_bf16) {
  Kernels().finish_output_grad_f32(activation, rows, cols, grad, bias_grad, grad_bf16);
}

template <>
void FinishOutputGrad<bf16_t>(const bf16_t* activation, int rows, int cols, float* grad,
                              float* bias_grad, bf16_t* grad_bf16) {
  Kernels().finish_output_grad_bf16(activation, rows, cols, grad, bias_grad, grad_bf16);
}

void SgdMomentumUpdate(int64_t n, float learning_rate, float momentum, float weight_decay,
                       const float* grad, float* weight, float* velocity, bf16_t* weight_bf16) {
  Kernels().sgd_momentum_update(n, learning_rate, momentum, weight_decay, grad, weight, velocity,
                                weight_bf16);
}

void ConvertToBf16(const float* src, int64_t n, bf16_t* dst) {
  Kernels().convert_to_bf16(src, n, dst);
}

template <>
void MaxPoolForward<float>(const float* x, const PoolShape& shape, bool relu, float* y,
                           uint8_t* arg) {
  Kernels().max_pool_forward_f32(x, shape, relu, y, arg);
}

template <>
void MaxPoolForward<bf16_t>(const bf16_t* x, const PoolShape& shape, bool relu, bf16_t* y,
                            uint8_t* arg) {
  Kernels().max_pool_forward_bf16(x, shape, relu, y, arg);
}

template <>
void MaxPoolBackward<float>(const float* dy, const float* relu_y, const uint8_t* arg,
                            const PoolShape& shape, float* dx) {
  Kernels().max_pool_backward_f32(dy, relu_y, arg, shape, dx);
}

template <>
void MaxPoolBackward<bf16_t>(const bf16_t* dy, const bf16_t* relu_y, const uint8_t* arg,
                             const PoolShape& shape, bf16_t* dx) {
  Kernels().max_pool_backward_bf16(dy, relu_y, arg, shape, dx);
}

int64_t NormWorkDoubles(const NormShape& shape) {
  // As cpu_norm_kernels.inc: the chunks' partial sums, the totals, three floats a channel.
  const int64_t rows_per_chunk = std::max<int64_t>(1, 4096 / std::max(1, shape.channels));
  const int64_t chunks = (shape.rows + rows_per_chunk - 1) / rows_per_chunk;
  return (chunks * 2 + 4) * std::max(1, shape.channels);
}

template <>
void BatchNormForward<float>(const float* x, const NormShape& shape, const float* scale,
                             const float* shift, const float* add, bool relu, float* mean,
                             float* variance, float* y, double* work) {
  Kernels().batch_norm_forward_f32(x, shape, scale, shift, add, relu, mean, variance, y, work);
}

template <>
void BatchNormForward<bf16_t>(const bf16_t* x, const NormShape& shape, const float* scale,
                              const float* shift, const bf16_t* add, bool relu, float* mean,
                              float* variance, bf16_t* y, double* work) {
  Kernels().batch_norm_forward_bf16(x, shape, scale, shift, add, relu, mean, variance, y, work);
}

template <>
void BatchNormBackward<float>(const float* x, const float* dy, const float* relu_y,
                              const NormShape& shape, const float* mean, const float* variance,
                              const float* scale, float* dscale, float* dshift, float* dx,
                              float* g_out, float* g_out2, double* work) {
  Kernels().batch_norm_backward_f32(x, dy, relu_y, shape, mean, variance, scale, dscale, dshift, dx,
                                    g_out, g_out2, work);
}

template <>
void BatchNormBackward<bf16_t>(const bf16_t* x, const bf16_t* dy, const bf16_t* relu_y,
                               const NormShape& shape, const float* mean, const float* variance,
                               const float* scale, float* dscale, float* dshift, bf16_t* dx,
                               bf16_t* g_out, bf16_t* g_out2, double* work) {
  Kernels().batch_norm_backward_bf16(x, dy, relu_y, shape, mean, variance, scale, dscale, dshift,
                                     dx, g_out, g_out2, work);
}

}  // namespace stoker::cpu
