// Kernels of the cuda network (cuda_network.cc) that neither cuDNN nor cuBLASLt provides:
// per-channel bias and its gradient for NCHW convolutions, ReLU and exact GELU with their
// backward passes, inverted dropout with the cpu's mask (dropout_hash.h), conversions to fp32, a
// max-pooling fallback, softmax cross-entropy with label smoothing, and the multi-tensor optimizer
// steps (SGD with momentum/Nesterov, AdamW) with gradient clipping by global norm and fp16
// unscaling. The vision layers' own kernels (batch normalisation, average pooling, residual sums)
// are in vision_kernels.h.
//
// Launchers enqueue on the given stream, check their arguments (cudaErrorInvalidValue) and return
// cudaGetLastError() after each launch. `void*` tensors hold `type` elements; every result is
// computed in fp32 and rounded once to the tensor's type. Plain C++: included by g++-built code.
#ifndef STOKER_ENGINE_CUDA_NETWORK_KERNELS_H_
#define STOKER_ENGINE_CUDA_NETWORK_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/dtype.h"
#include "engine/cuda/mlp_kernels.h"

namespace stoker::cuda {

// y[n, c, s] += bias[c] in place, y NCHW [batch, channels, spatial].
cudaError_t LaunchAddChannelBias(void* y, DType type, const float* bias, int batch, int channels,
                                 int64_t spatial, cudaStream_t stream);

// bias_grad[c] = sum over n and s of dy[n, c, s] (fp32, in a fixed order: deterministic).
cudaError_t LaunchChannelBiasGrad(const void* dy, DType type, int batch, int channels,
                                  int64_t spatial, float* bias_grad, cudaStream_t stream);

enum class ActivationKind { kRelu, kGelu };

// y = relu(x) or x * Phi(x) (exact erf GELU), n elements.
cudaError_t LaunchActivationForward(ActivationKind kind, const void* x, void* y, DType type,
                                    int64_t n, cudaStream_t stream);
// dx = dy * act'(x): ReLU passes dy where x > 0; GELU multiplies by Phi(x) + x phi(x).
cudaError_t LaunchActivationBackward(ActivationKind kind, const void* x, const void* dy, void* dx,
                                     DType type, int64_t n, cudaStream_t stream);

// Inverted dropout over an NCHW [n / (channels * spatial), channels, spatial] activation:
// keep[i] = DropoutKeep(key, DropoutCpuIndex(i, channels, spatial), threshold);
// y = keep ? x * inverse_keep : 0.
cudaError_t LaunchDropoutForward(const void* x, void* y, uint8_t* keep, DType type, int64_t n,
                                 int channels, int64_t spatial, uint64_t key, uint64_t threshold,
                                 float inverse_keep, cudaStream_t stream);
// dx = keep ? dy * inverse_keep : 0.
cudaError_t LaunchDropoutBackward(const void* dy, const uint8_t* keep, void* dx, DType type,
                                  int64_t n, float inverse_keep, cudaStream_t stream);

// dst[i] = float(src[i]).
cudaError_t LaunchConvertToF32(const void* src, DType type, int64_t n, float* dst,
                               cudaStream_t stream);
// dst[i] = float(src[i]) * *scale, `scale` a device scalar read when the kernel runs (e.g.
// &StepState::loss_scale: a gradient computed unscaled, put back on the loss scale's footing).
cudaError_t LaunchConvertToF32Scaled(const void* src, DType type, int64_t n, const float* scale,
                                     float* dst, cudaStream_t stream);

// Max pooling of NCHW planes ([planes, height, width] -> [planes, out_height, out_width]), padded
// positions ignored (PyTorch), NaN propagated. Used where cuDNN's pooling refuses a data type.
struct PoolGeometry {
  int planes = 0;  // batch * channels
  int height = 0;
  int width = 0;
  int out_height = 0;
  int out_width = 0;
  int kernel = 0;
  int stride = 0;
  int padding = 0;
};
// True for a geometry the pooling launchers accept: every size > 0, padding >= 0 and at most half
// the kernel (PyTorch's rule for pooling).
inline bool ValidPoolGeometry(const PoolGeometry& g) {
  return g.planes > 0 && g.height > 0 && g.width > 0 && g.out_height > 0 && g.out_width > 0 &&
         g.kernel > 0 && g.stride > 0 && g.padding >= 0 && 2 * g.padding <= g.kernel;
}
cudaError_t LaunchMaxPoolForward(const void* x, void* y, DType type, const PoolGeometry& geometry,
                                 cudaStream_t stream);
// dx[i] = sum of dy over the windows whose first maximum (row-major) is element i. Deterministic.
cudaError_t LaunchMaxPoolBackward(const void* x, const void* dy, void* dx, DType type,
                                  const PoolGeometry& geometry, cudaStream_t stream);

// ---- Loss ----

// Softmax cross-entropy of fp32 logits [rows, classes <= 256] against labels smoothed as
// torch.nn.CrossEntropyLoss(label_smoothing=s): targets (1 - s) one_hot + s / classes. Adds the
// summed loss, (1 - s)(lse - z[label]) + s(lse - mean_k z[k]), to state->loss_sum and the argmax
// hits to state->correct. If `grad` is set, writes
// ((softmax - onehot) / rows + s onehot / rows - s / (classes rows)) * state->loss_scale * share
// in `grad_type` (share: a data-parallel rank's part of the global batch, 1 alone). With s = 0 it
// computes what LaunchSoftmaxCrossEntropy (mlp_kernels.h) does.
cudaError_t LaunchSmoothedCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                       int classes, float smoothing, float share, DType grad_type,
                                       void* grad, StepState* state, cudaStream_t stream);

// One parameter tensor as the optimizer sees it: fp32 master, gradient, state (SGD: state1 =
// momentum; AdamW: state1 = exp_avg, state2 = exp_avg_sq), and the optional compute-type copy
// of the master that the layers read (null when they read the master).
struct OptimizerTensor {
  float* weight;
  const float* grad;
  float* state1;
  float* state2;
  void* weight_low;
  int64_t size;
  float weight_decay;  // 0 for biases
};

// Device scalars of gradient clipping.
struct ClipState {
  double sum_of_squares;  // of the unscaled gradients
  // min(1, max_norm / (norm + 1e-6)), as the cpu computes it: 0 for an infinite norm, 1 for a
  // NaN one (a skipped fp16 step uses neither).
  float coefficient;
};

// clip->sum_of_squares += sum over every tensor of (grad / state->loss_scale)^2, in double.
// Zero clip->sum_of_squares first.
cudaError_t LaunchGradSumOfSquares(const OptimizerTensor* tensors, int count,
                                   const StepState* state, ClipState* clip, cudaStream_t stream);
// clip->coefficient from clip->sum_of_squares (one thread).
cudaError_t LaunchClipCoefficient(ClipState* clip, double max_norm, cudaStream_t stream);

// torch.optim.SGD on every tensor (one launch per 32 tensors), with g = grad / loss_scale
// [* clip->coefficient when clip is set]: with momentum, g += weight_decay * w;
// v = momentum * v + g; w -= lr * (nesterov ? g + momentum * v : v). With momentum 0,
// w -= lr * (g + weight_decay * w) and v is left alone. weight_low = w in `low_type`.
// When `skip_on_inf` and state->found_inf, changes nothing.
cudaError_t LaunchSgdStep(const OptimizerTensor* tensors, int count, DType low_type,
                          float learning_rate, float momentum, bool nesterov,
                          const StepState* state, const ClipState* clip, bool skip_on_inf,
                          cudaStream_t stream);

// Per-step constants of AdamW, computed on the host as the cpu computes them.
struct AdamWConstants {
  float learning_rate;
  float beta1;
  float beta2;
  float eps;
  float step_size;                 // lr / (1 - beta1^step)
  float inverse_sqrt_correction2;  // 1 / sqrt(1 - beta2^step)
};

// torch.optim.AdamW on every tensor, g as for LaunchSgdStep: w *= 1 - lr * weight_decay;
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g; w -= step_size m / (sqrt(v) isc2 + eps).
cudaError_t LaunchAdamWStep(const OptimizerTensor* tensors, int count, DType low_type,
                            const AdamWConstants& constants, const StepState* state,
                            const ClipState* clip, bool skip_on_inf, cudaStream_t stream);

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_NETWORK_KERNELS_H_
