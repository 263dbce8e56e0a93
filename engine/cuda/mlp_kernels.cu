// Kernels of the cuda MLP (see mlp_kernels.h for each contract), then their launchers.
#include <cuda_runtime.h>

#include "engine/cuda/kernel_util.cuh"
#include "engine/cuda/mlp_kernels.h"

namespace stoker::cuda {
namespace {

using kernel_util::CeilDiv;
using kernel_util::DispatchType;
using kernel_util::ElementwiseBlocks;
using kernel_util::ForEachTensorList;
using kernel_util::FromFloat;
using kernel_util::kThreads;

using TensorList = kernel_util::TensorList<SgdTensor, /*kCapacity=*/24>;

// ================================ kernels ================================

template <typename T>
__global__ void NormalizeInputKernel(const uint8_t* samples, int64_t n, float scale, float shift,
                                     T* out) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    // Separate roundings (no FMA), like the CPU reference built with -ffp-contract=off.
    out[i] = FromFloat<T>(__fadd_rn(__fmul_rn(static_cast<float>(samples[i]), scale), shift));
  }
}

// blockIdx.y strides over the planes (its channel's constants loaded once), x over a plane.
template <typename T>
__global__ void NormalizeInputPerChannelKernel(const uint8_t* samples, int64_t planes,
                                               int64_t plane, int channels, const float* scale,
                                               const float* shift, T* out) {
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const int c = static_cast<int>(p % channels);
    const float a = scale[c];
    const float b = shift[c];
    const uint8_t* in = samples + p * plane;
    T* o = out + p * plane;
    STOKER_GRID_STRIDE_LOOP(i, plane) {
      o[i] = FromFloat<T>(__fadd_rn(__fmul_rn(static_cast<float>(in[i]), a), b));
    }
  }
}

template <typename T>
__global__ void ConvertFloatKernel(const float* in, int64_t n, T* out) {
  STOKER_GRID_STRIDE_LOOP(i, n) { out[i] = FromFloat<T>(in[i]); }
}

template <typename T>
__global__ void BiasActivationKernel(T* y, const float* bias, int rows, int cols, bool relu) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  STOKER_GRID_STRIDE_LOOP(i, n) {
    float v = kernel_util::ToFloat(y[i]) + bias[i % cols];
    if (relu) v = v > 0.0f ? v : 0.0f;
    y[i] = FromFloat<T>(v);
  }
}

// Block (32, 8): x picks the column, y strides over rows; a shared-memory sum over y follows.
template <typename T>
__global__ void ReluBackwardBiasGradKernel(T* grad, const T* activation, int rows, int cols,
                                           float* bias_grad) {
  __shared__ float partial[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += 8) {
      const int64_t i = static_cast<int64_t>(r) * cols + col;
      float g = kernel_util::ToFloat(grad[i]);
      if (activation != nullptr && !(kernel_util::ToFloat(activation[i]) > 0.0f)) {
        g = 0.0f;
        grad[i] = FromFloat<T>(0.0f);
      }
      sum += g;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += partial[y][threadIdx.x];
    bias_grad[col] = total;
  }
}

// One warp per row. Ties in the argmax go to the lowest class, as in the CPU reference.
template <typename T>
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const uint8_t* labels, int rows,
                                          int classes, T* grad, StepState* state) {
  const auto [lane, row] = kernel_util::ThisWarpRow();
  if (row >= rows) return;
  const float* z = logits + static_cast<int64_t>(row) * classes;

  const auto [max_logit, argmax] = kernel_util::WarpRowMax(z, classes, lane);
  float sum = 0.0f;
  for (int c = lane; c < classes; c += 32) sum += expf(z[c] - max_logit);
  sum = kernel_util::WarpSum(sum);

  const int label = labels[row];
  if (lane == 0) {
    const double loss = static_cast<double>(logf(sum)) + max_logit - z[label];
    atomicAdd(&state->loss_sum, loss);
    if (argmax == label) atomicAdd(&state->correct, 1ull);
  }
  if (grad != nullptr) {
    const float scale = state->loss_scale;
    const float inverse_rows = 1.0f / static_cast<float>(rows);
    const float inverse_sum = inverse_rows / sum;
    T* g = grad + static_cast<int64_t>(row) * classes;
    for (int c = lane; c < classes; c += 32) {
      float value = expf(z[c] - max_logit) * inverse_sum;
      if (c == label) value -= inverse_rows;
      g[c] = FromFloat<T>(value * scale);
    }
  }
}

// blockIdx.y picks the tensor; x blocks stride over its elements.
__global__ void CheckFiniteKernel(TensorList list, StepState* state) {
  const SgdTensor& t = list.tensors[blockIdx.y];
  bool bad = false;
  STOKER_GRID_STRIDE_LOOP(i, t.size) { bad |= !isfinite(t.grad[i]); }
  if (__syncthreads_or(bad) && threadIdx.x == 0) state->found_inf = 1;
}

template <typename T>
__global__ void SgdMomentumKernel(TensorList list, float rate_argument, bool rate_from_state,
                                  float momentum, bool nesterov, const StepState* state,
                                  bool skip_on_inf) {
  if (skip_on_inf && state->found_inf != 0) return;
  const float learning_rate = rate_from_state ? state->learning_rate : rate_argument;
  // The scale is a power of two, so the reciprocal and the product below are exact.
  const float inverse_scale = 1.0f / state->loss_scale;
  const SgdTensor& t = list.tensors[blockIdx.y];
  T* low = static_cast<T*>(t.weight_low);
  STOKER_GRID_STRIDE_LOOP(i, t.size) {
    // Separate roundings, in the CPU reference's order.
    const float w = t.weight[i];
    const float g = __fadd_rn(__fmul_rn(t.grad[i], inverse_scale), __fmul_rn(t.weight_decay, w));
    const float v = __fadd_rn(__fmul_rn(momentum, t.velocity[i]), g);
    t.velocity[i] = v;
    const float step = nesterov ? __fadd_rn(g, __fmul_rn(momentum, v)) : v;
    const float updated = __fsub_rn(w, __fmul_rn(learning_rate, step));
    t.weight[i] = updated;
    if (low != nullptr) low[i] = FromFloat<T>(updated);
  }
}

__global__ void UpdateLossScaleKernel(StepState* state) {
  if (state->found_inf != 0) {
    state->loss_scale *= state->backoff_factor;
    state->growth_tracker = 0;
  } else if (++state->growth_tracker >= state->growth_interval) {
    state->loss_scale *= state->growth_factor;
    state->growth_tracker = 0;
  }
}

__global__ void AddToFirstKernel(float* data, float value) { data[0] += value; }

}  // namespace

// ================================ launchers ================================

cudaError_t LaunchNormalizeInput(const uint8_t* samples, int64_t n, float scale, float shift,
                                 DType type, void* out, cudaStream_t stream) {
  if (samples == nullptr || out == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    NormalizeInputKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(samples, n, scale, shift,
                                                                           static_cast<T*>(out));
  });
}

cudaError_t LaunchNormalizeInputPerChannel(const uint8_t* samples, int64_t planes, int64_t plane,
                                           int channels, const float* scale, const float* shift,
                                           DType type, void* out, cudaStream_t stream) {
  if (samples == nullptr || out == nullptr || scale == nullptr || shift == nullptr || planes <= 0 ||
      plane <= 0 || channels <= 0) {
    return cudaErrorInvalidValue;
  }
  // grid.y is limited to 65535; the kernel strides over the rest.
  const dim3 grid(ElementwiseBlocks(plane),
                  static_cast<unsigned>(std::min<int64_t>(planes, 65535)));
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    NormalizeInputPerChannelKernel<T><<<grid, kThreads, 0, stream>>>(
        samples, planes, plane, channels, scale, shift, static_cast<T*>(out));
  });
}

cudaError_t LaunchConvertFloat(const float* features, int64_t n, DType type, void* out,
                               cudaStream_t stream) {
  if (features == nullptr || out == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ConvertFloatKernel<T>
        <<<ElementwiseBlocks(n), kThreads, 0, stream>>>(features, n, static_cast<T*>(out));
  });
}

cudaError_t LaunchConvertFromF32(const float* src, int64_t n, DType type, void* dst,
                                 cudaStream_t stream) {
  return LaunchConvertFloat(src, n, type, dst, stream);
}

cudaError_t LaunchBiasActivation(void* y, DType type, const float* bias, int rows, int cols,
                                 bool relu, cudaStream_t stream) {
  if (y == nullptr || bias == nullptr || rows <= 0 || cols <= 0) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(rows) * cols;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    BiasActivationKernel<T>
        <<<ElementwiseBlocks(n), kThreads, 0, stream>>>(static_cast<T*>(y), bias, rows, cols, relu);
  });
}

cudaError_t LaunchReluBackwardBiasGrad(void* grad, const void* activation, DType type, int rows,
                                       int cols, float* bias_grad, cudaStream_t stream) {
  if (grad == nullptr || bias_grad == nullptr || rows <= 0 || cols <= 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ReluBackwardBiasGradKernel<T>
        <<<static_cast<unsigned>(CeilDiv(cols, 32)), dim3(32, 8), 0, stream>>>(
            static_cast<T*>(grad), static_cast<const T*>(activation), rows, cols, bias_grad);
  });
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                      int classes, DType grad_type, void* grad, StepState* state,
                                      cudaStream_t stream) {
  if (logits == nullptr || labels == nullptr || state == nullptr || rows <= 0 || classes <= 0 ||
      classes > 256) {
    return cudaErrorInvalidValue;
  }
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, kRowsPerBlock));
  return DispatchType(grad_type, [&](auto zero) {
    using T = decltype(zero);
    SoftmaxCrossEntropyKernel<T><<<blocks, kThreads, 0, stream>>>(logits, labels, rows, classes,
                                                                  static_cast<T*>(grad), state);
  });
}

cudaError_t LaunchCheckFinite(const SgdTensor* tensors, int count, StepState* state,
                              cudaStream_t stream) {
  if (tensors == nullptr || state == nullptr || count < 0) return cudaErrorInvalidValue;
  return ForEachTensorList<TensorList>(tensors, count, [&](const TensorList& list, dim3 grid) {
    CheckFiniteKernel<<<grid, kThreads, 0, stream>>>(list, state);
  });
}

namespace {
cudaError_t SgdMomentum(const SgdTensor* tensors, int count, DType low_type, float learning_rate,
                        bool rate_from_state, float momentum, bool nesterov, const StepState* state,
                        bool skip_on_inf, cudaStream_t stream) {
  if (tensors == nullptr || state == nullptr || count < 0) return cudaErrorInvalidValue;
  cudaError_t result = cudaSuccess;
  const cudaError_t dispatched = DispatchType(low_type, [&](auto zero) {
    using T = decltype(zero);
    result = ForEachTensorList<TensorList>(tensors, count, [&](const TensorList& list, dim3 grid) {
      SgdMomentumKernel<T><<<grid, kThreads, 0, stream>>>(list, learning_rate, rate_from_state,
                                                          momentum, nesterov, state, skip_on_inf);
    });
  });
  return result != cudaSuccess ? result : dispatched;
}
}  // namespace

cudaError_t LaunchSgdMomentum(const SgdTensor* tensors, int count, DType low_type,
                              float learning_rate, float momentum, bool nesterov,
                              const StepState* state, bool skip_on_inf, cudaStream_t stream) {
  return SgdMomentum(tensors, count, low_type, learning_rate, /*rate_from_state=*/false, momentum,
                     nesterov, state, skip_on_inf, stream);
}

cudaError_t LaunchSgdMomentumRateFromState(const SgdTensor* tensors, int count, DType low_type,
                                           float momentum, bool nesterov, const StepState* state,
                                           bool skip_on_inf, cudaStream_t stream) {
  return SgdMomentum(tensors, count, low_type, 0.0f, /*rate_from_state=*/true, momentum, nesterov,
                     state, skip_on_inf, stream);
}

cudaError_t LaunchUpdateLossScale(StepState* state, cudaStream_t stream) {
  if (state == nullptr) return cudaErrorInvalidValue;
  UpdateLossScaleKernel<<<1, 1, 0, stream>>>(state);
  return cudaGetLastError();
}

cudaError_t LaunchAddToFirst(float* data, float value, cudaStream_t stream) {
  if (data == nullptr) return cudaErrorInvalidValue;
  AddToFirstKernel<<<1, 1, 0, stream>>>(data, value);
  return cudaGetLastError();
}

}  // namespace stoker::cuda
