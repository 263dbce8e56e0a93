// The MLP's own kernels, everything that is not a GEMM (or that a GEMM epilogue could not fuse):
// input normalisation, softmax cross-entropy, the fallback bias/ReLU kernels, the fp16 finite
// check and loss-scale update, and one multi-tensor SGD-momentum step.
//
// Launchers enqueue on the given stream, check their arguments (cudaErrorInvalidValue) and return
// cudaGetLastError() after each launch. Buffers are row-major; `void*` tensors hold `type`
// elements (fp32, bf16 or fp16). Plain C++: this header is included by host code built with g++.
#ifndef STOKER_ENGINE_CUDA_MLP_KERNELS_H_
#define STOKER_ENGINE_CUDA_MLP_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/cuda/dtype.h"

namespace stoker::cuda {

// Device-resident state of one step, read back with one copy at its end. The first three fields
// are zeroed at the start of every step (kStepStateResetBytes); the loss scale and its growth
// counter persist across steps.
struct StepState {
  double loss_sum;             // summed cross-entropy over the batch
  unsigned long long correct;  // argmax hits (Evaluate)
  int found_inf;               // 1 when a gradient held inf/NaN (fp16)
  float loss_scale;            // in force; 1 for fp32/bf16
  int growth_tracker;          // clean steps since the last change of the scale
  int growth_interval;         // clean steps that grow the scale
  float growth_factor;         // applied after growth_interval clean steps
  float backoff_factor;        // applied after an overflow
  // The step's learning rate, for LaunchSgdMomentumRateFromState: written by the host (a copy on
  // the stream) before each step, so a captured CUDA graph need not bake it in.
  float learning_rate;
};
inline constexpr size_t kStepStateResetBytes = offsetof(StepState, loss_scale);

// One tensor of the optimizer's view: fp32 master, its gradient and momentum, and the optional
// low-precision copy the GEMMs read (null in fp32).
struct SgdTensor {
  float* weight;
  const float* grad;
  float* velocity;
  void* weight_low;
  int64_t size;
  float weight_decay;
};

// out[i] = samples[i] * scale + shift, rounded once per multiply and add as the CPU does, then
// to `type`.
cudaError_t LaunchNormalizeInput(const uint8_t* samples, int64_t n, float scale, float shift,
                                 DType type, void* out, cudaStream_t stream);
// The same per channel: `planes` consecutive planes of `plane` values, plane p in channel
// p % channels (a batch of [C, H, W] samples, or of flat samples cut into C equal blocks), and
// out[i] = samples[i] * scale[c] + shift[c] with the same roundings. `scale` and `shift` are
// device arrays of `channels` floats; each block reads them once per plane.
cudaError_t LaunchNormalizeInputPerChannel(const uint8_t* samples, int64_t planes, int64_t plane,
                                           int channels, const float* scale, const float* shift,
                                           DType type, void* out, cudaStream_t stream);
// out[i] = features[i] in `type`.
cudaError_t LaunchConvertFloat(const float* features, int64_t n, DType type, void* out,
                               cudaStream_t stream);

// y[r, c] = act(y[r, c] + bias[c]) in place, act = ReLU or identity (fallback for the fused
// forward epilogue).
cudaError_t LaunchBiasActivation(void* y, DType type, const float* bias, int rows, int cols,
                                 bool relu, cudaStream_t stream);

// Completes a layer's output gradient (fallback for the fused backward epilogues): if
// `activation` is set, zeroes grad where activation <= 0 (in place); then
// bias_grad[c] = sum over rows of grad[r, c].
cudaError_t LaunchReluBackwardBiasGrad(void* grad, const void* activation, DType type, int rows,
                                       int cols, float* bias_grad, cudaStream_t stream);

// Softmax cross-entropy of fp32 logits [rows, classes <= 256] against labels: adds the summed
// loss to state->loss_sum and the argmax hits to state->correct. If `grad` is set, writes
// ((softmax - onehot) / rows) * state->loss_scale in `grad_type`.
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                      int classes, DType grad_type, void* grad, StepState* state,
                                      cudaStream_t stream);

// Sets state->found_inf when any gradient value is inf or NaN.
cudaError_t LaunchCheckFinite(const SgdTensor* tensors, int count, StepState* state,
                              cudaStream_t stream);

// PyTorch SGD on every tensor (one launch per 24 tensors): g = grad / loss_scale +
// weight_decay * w; v = momentum * v + g; w -= learning_rate * v (nesterov:
// w -= learning_rate * (g + momentum * v)); weight_low = w in `low_type`.
// When `skip_on_inf` and state->found_inf, changes nothing.
cudaError_t LaunchSgdMomentum(const SgdTensor* tensors, int count, DType low_type,
                              float learning_rate, float momentum, bool nesterov,
                              const StepState* state, bool skip_on_inf, cudaStream_t stream);

// LaunchSgdMomentum with the learning rate read from state->learning_rate on the device.
cudaError_t LaunchSgdMomentumRateFromState(const SgdTensor* tensors, int count, DType low_type,
                                           float momentum, bool nesterov, const StepState* state,
                                           bool skip_on_inf, cudaStream_t stream);

// GradScaler's update: scale *= backoff_factor and reset the counter after an overflow, else count
// the clean step and scale *= growth_factor every growth_interval of them.
cudaError_t LaunchUpdateLossScale(StepState* state, cudaStream_t stream);

// data[0] += value (InjectGradientForTest).
cudaError_t LaunchAddToFirst(float* data, float value, cudaStream_t stream);

// dst[i] = src[i] in `type` (refreshes low-precision weight copies after SetParameters).
cudaError_t LaunchConvertFromF32(const float* src, int64_t n, DType type, void* dst,
                                 cudaStream_t stream);

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_MLP_KERNELS_H_
