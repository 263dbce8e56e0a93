// Kernels of the cuda network's vision layers (cuda_network.cc), which neither cuDNN's legacy API
// nor cuBLASLt runs as PyTorch defines them: batch normalisation (torch.nn.BatchNorm2d/1d, fp32
// statistics and affine parameters in every precision), average pooling (torch.nn.AvgPool2d,
// count_include_pad) and global average pooling (torch.nn.AdaptiveAvgPool2d(1)), and the residual
// blocks' sums with their activation.
//
// Launchers as network_kernels.h's: they enqueue on the given stream, check their arguments
// (cudaErrorInvalidValue) and return cudaGetLastError() after each launch. `void*` tensors hold
// `type` elements; every result is computed in fp32 and rounded once to the tensor's type.
// Deterministic: every sum has a fixed order. Plain C++: included by g++-built code.
#ifndef STOKER_ENGINE_CUDA_VISION_KERNELS_H_
#define STOKER_ENGINE_CUDA_VISION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/dtype.h"
#include "engine/cuda/network_kernels.h"  // PoolGeometry

namespace stoker::cuda {

// ---- BatchNorm (torch.nn.BatchNorm2d/1d), activations NCHW [batch, channels, spatial] (1d:
// spatial 1) in `type`, statistics and affine parameters fp32 ----

// Batch statistics of each channel over batch x spatial values: mean[c] and the biased
// variance[c] (two passes: the mean, then the mean squared deviation; a fixed order).
cudaError_t LaunchBatchNormStatistics(const void* x, DType type, int batch, int channels,
                                      int64_t spatial, float* mean, float* variance,
                                      cudaStream_t stream);
// y = (x - mean[c]) / sqrt(variance[c] + eps) * gamma[c] + beta[c]: training with the batch's
// statistics, evaluation with the running ones.
cudaError_t LaunchBatchNormApply(const void* x, void* y, DType type, int batch, int channels,
                                 int64_t spatial, const float* mean, const float* variance,
                                 const float* gamma, const float* beta, float eps,
                                 cudaStream_t stream);
// Backward of the training-mode forward: gamma_grad[c] = sum dy x_hat, beta_grad[c] = sum dy
// (fp32, written, not added); dx (when not null) = gamma invstd / m (m dy - beta_grad - x_hat
// gamma_grad), m = batch x spatial. `mean`/`variance` are the forward's batch statistics.
cudaError_t LaunchBatchNormBackward(const void* x, const void* dy, void* dx, DType type, int batch,
                                    int channels, int64_t spatial, const float* mean,
                                    const float* variance, const float* gamma, float eps,
                                    float* gamma_grad, float* beta_grad, cudaStream_t stream);
// PyTorch's running statistics update, once the step cannot fail any more:
// running_mean = momentum mean + (1 - momentum) running_mean, running_var likewise with the
// unbiased variance (variance * unbias, unbias = m / (m - 1), or 1 when m = 1), and
// batches_tracked[0] += 1.
cudaError_t LaunchBatchNormUpdateRunning(const float* mean, const float* variance, int channels,
                                         float momentum, double unbias, float* running_mean,
                                         float* running_var, float* batches_tracked,
                                         cudaStream_t stream);

// ---- Average pooling ----

// torch.nn.AvgPool2d (floor mode, count_include_pad=True): each output is the sum of its window's
// in-bounds inputs divided by kernel^2.
cudaError_t LaunchAvgPoolForward(const void* x, void* y, DType type, const PoolGeometry& geometry,
                                 cudaStream_t stream);
// dx[i] = sum over the windows containing i of dy / kernel^2 (written, not added).
cudaError_t LaunchAvgPoolBackward(const void* dy, void* dx, DType type,
                                  const PoolGeometry& geometry, cudaStream_t stream);
// torch.nn.AdaptiveAvgPool2d(1): y[p] = mean of plane p's `plane` values, for `planes` planes.
cudaError_t LaunchGlobalAvgPoolForward(const void* x, void* y, DType type, int64_t planes,
                                       int64_t plane, cudaStream_t stream);
// dx[p, i] = dy[p] / plane.
cudaError_t LaunchGlobalAvgPoolBackward(const void* dy, void* dx, DType type, int64_t planes,
                                        int64_t plane, cudaStream_t stream);

// ---- Residual blocks ----

enum class SumActivation { kNone, kRelu, kGelu };

// y = act(a + b), the sum rounded to `type` first; `sum` (may be null; needed for GELU's
// backward) receives the rounded sum.
cudaError_t LaunchAddActivationForward(SumActivation act, const void* a, const void* b, void* sum,
                                       void* y, DType type, int64_t n, cudaStream_t stream);
// g = dy * act'(.) (ReLU from its output `y`, GELU from `sum`, none: dy itself), written to
// `grad` and, when not null, to `grad2` (a projection shortcut's own gradient buffer).
cudaError_t LaunchAddActivationBackward(SumActivation act, const void* sum, const void* y,
                                        const void* dy, void* grad, void* grad2, DType type,
                                        int64_t n, cudaStream_t stream);
// dst[i] += src[i] (a block input's gradient gets its shortcut's).
cudaError_t LaunchAddInPlace(void* dst, const void* src, DType type, int64_t n,
                             cudaStream_t stream);

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_VISION_KERNELS_H_
