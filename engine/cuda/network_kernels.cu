// Kernels of the cuda network (see network_kernels.h for each contract), then their launchers.
// The vision layers' kernels (BatchNorm, average pooling, residual sums) are vision_kernels.cu.
// Arithmetic that the cpu reference rounds step by step is spelled with __fmul_rn/__fadd_rn, so
// that nvcc does not contract it into FMAs and the fp32 results match the cpu's bit for bit
// where the inputs do.
#include <cuda_runtime.h>

#include <cmath>

#include "engine/cuda/dropout_hash.h"
#include "engine/cuda/kernel_util.cuh"
#include "engine/cuda/network_kernels.h"
#include "engine/cuda/pool_window.cuh"

namespace stoker::cuda {
namespace {

using kernel_util::BlockSum;
using kernel_util::DispatchType;
using kernel_util::ElementwiseBlocks;
using kernel_util::ForEachTensorList;
using kernel_util::FromFloat;
using kernel_util::kThreads;
using kernel_util::ToFloat;
using kernel_util::WindowRange;
using kernel_util::WindowsContaining;

using TensorList = kernel_util::TensorList<OptimizerTensor, /*kCapacity=*/32>;

// The gradient as the optimizer uses it: unscaled (fp16), then clipped.
__device__ __forceinline__ float EffectiveGrad(float grad, float inverse_scale,
                                               const ClipState* clip, float coefficient) {
  float g = __fmul_rn(grad, inverse_scale);
  if (clip != nullptr) g = __fmul_rn(g, coefficient);
  return g;
}

// ================================ kernels ================================

template <typename T>
__global__ void AddChannelBiasKernel(T* y, const float* bias, int64_t n, int channels,
                                     int64_t spatial) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int c = static_cast<int>((i / spatial) % channels);
    y[i] = FromFloat<T>(__fadd_rn(ToFloat(y[i]), bias[c]));
  }
}

// One block per channel; thread t sums elements t, t + kThreads, ... of the channel's
// batch * spatial values, then the block adds the partial sums in a fixed tree.
template <typename T>
__global__ void ChannelBiasGradKernel(const T* dy, int batch, int channels, int64_t spatial,
                                      float* bias_grad) {
  const int c = blockIdx.x;
  const int64_t count = static_cast<int64_t>(batch) * spatial;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t n = j / spatial;
    const int64_t s = j - n * spatial;
    sum += ToFloat(dy[(n * channels + c) * spatial + s]);
  }
  const float total = BlockSum(sum);
  if (threadIdx.x == 0) bias_grad[c] = total;
}

// NaN and infinities propagate as through oneDNN's eltwise (x * 0 for the negative side), so
// that an fp16 overflow upstream still reaches the finite check.
template <typename T>
__global__ void ActivationForwardKernel(ActivationKind kind, const T* x, T* y, int64_t n) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const float v = ToFloat(x[i]);
    float out;
    if (kind == ActivationKind::kRelu) {
      out = v > 0.0f ? v : v * 0.0f;
    } else {
      out = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    y[i] = FromFloat<T>(out);
  }
}

template <typename T>
__global__ void ActivationBackwardKernel(ActivationKind kind, const T* x, const T* dy, T* dx,
                                         int64_t n) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const float v = ToFloat(x[i]);
    const float g = ToFloat(dy[i]);
    float out;
    if (kind == ActivationKind::kRelu) {
      out = v > 0.0f ? g : g * 0.0f;
    } else {
      // d/dx [x Phi(x)] = Phi(x) + x phi(x).
      const float u = v * 0.70710678118654752f;
      const float cdf = 0.5f * (1.0f + erff(u));
      const float pdf = expf(-u * u) * 0.39894228040143268f;
      out = g * (cdf + v * pdf);
    }
    dx[i] = FromFloat<T>(out);
  }
}

template <typename T>
__global__ void DropoutForwardKernel(const T* x, T* y, uint8_t* keep, int64_t n, int channels,
                                     int64_t spatial, uint64_t key, uint64_t threshold,
                                     float inverse_keep) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const uint64_t cpu_index = DropoutCpuIndex(
        static_cast<uint64_t>(i), static_cast<uint64_t>(channels), static_cast<uint64_t>(spatial));
    const bool kept = DropoutKeep(key, cpu_index, threshold);
    keep[i] = kept ? 1 : 0;
    y[i] = kept ? FromFloat<T>(__fmul_rn(ToFloat(x[i]), inverse_keep)) : FromFloat<T>(0.0f);
  }
}

template <typename T>
__global__ void DropoutBackwardKernel(const T* dy, const uint8_t* keep, T* dx, int64_t n,
                                      float inverse_keep) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    dx[i] = keep[i] ? FromFloat<T>(__fmul_rn(ToFloat(dy[i]), inverse_keep)) : FromFloat<T>(0.0f);
  }
}

template <typename T>
__global__ void ConvertToF32Kernel(const T* src, int64_t n, float* dst) {
  STOKER_GRID_STRIDE_LOOP(i, n) { dst[i] = ToFloat(src[i]); }
}

template <typename T>
__global__ void ConvertToF32ScaledKernel(const T* src, int64_t n, const float* scale, float* dst) {
  const float factor = *scale;
  STOKER_GRID_STRIDE_LOOP(i, n) { dst[i] = __fmul_rn(ToFloat(src[i]), factor); }
}

// Index (in the plane) of the first maximum of output window (oh, ow), padding skipped; the
// first NaN wins over any number.
template <typename T>
__device__ int WindowArgmax(const T* plane, const PoolGeometry& g, int oh, int ow, float* value) {
  int best_index = -1;
  float best = 0.0f;
  kernel_util::ForEachInWindow(g, oh, ow, [&](int index) {
    const float v = ToFloat(plane[index]);
    if (best_index < 0 || (!isnan(best) && (v > best || isnan(v)))) {
      best = v;
      best_index = index;
    }
  });
  *value = best;
  return best_index;
}

// Max pooling's window value (PoolForwardKernel): the window's first maximum.
struct MaxWindow {
  template <typename T>
  __device__ float operator()(const T* plane, const PoolGeometry& g, int oh, int ow) const {
    float value;
    WindowArgmax(plane, g, oh, ow, &value);
    return value;
  }
};

// One thread per input element: visits the windows that contain it, in order.
template <typename T>
__global__ void MaxPoolBackwardKernel(const T* x, const T* dy, T* dx, PoolGeometry g) {
  const int64_t in_plane = static_cast<int64_t>(g.height) * g.width;
  const int64_t out_plane = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t n = g.planes * in_plane;
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int64_t p = i / in_plane;
    const int within = static_cast<int>(i - p * in_plane);
    const WindowRange r = WindowsContaining(g, within / g.width, within % g.width);
    const T* plane = x + p * in_plane;
    float sum = 0.0f;
    for (int oh = r.oh_begin; oh <= r.oh_end; ++oh) {
      for (int ow = r.ow_begin; ow <= r.ow_end; ++ow) {
        float value;
        if (WindowArgmax(plane, g, oh, ow, &value) == within) {
          sum += ToFloat(dy[p * out_plane + oh * g.out_width + ow]);
        }
      }
    }
    dx[i] = FromFloat<T>(sum);
  }
}

// One warp per row, as mlp_kernels.cu's SoftmaxCrossEntropyKernel, with the smoothing terms.
template <typename T>
__global__ void SmoothedCrossEntropyKernel(const float* logits, const uint8_t* labels, int rows,
                                           int classes, float smoothing, float share, T* grad,
                                           StepState* state) {
  const auto [lane, row] = kernel_util::ThisWarpRow();
  if (row >= rows) return;
  const float* z = logits + static_cast<int64_t>(row) * classes;
  const auto [max_logit, argmax] = kernel_util::WarpRowMax(z, classes, lane);
  double logit_sum = 0.0;
  float sum = 0.0f;
  for (int c = lane; c < classes; c += 32) {
    sum += expf(z[c] - max_logit);
    logit_sum += z[c];
  }
  sum = kernel_util::WarpSum(sum);
  logit_sum = kernel_util::WarpSum(logit_sum);
  const int label = labels[row];
  if (lane == 0) {
    const double lse = static_cast<double>(logf(sum)) + max_logit;
    double loss = lse - z[label];
    if (smoothing != 0.0f) {
      loss = (1.0 - smoothing) * loss + smoothing * (lse - logit_sum / classes);
    }
    atomicAdd(&state->loss_sum, loss);
    if (argmax == label) atomicAdd(&state->correct, 1ull);
  }
  if (grad != nullptr) {
    const float scale = __fmul_rn(state->loss_scale, share);
    const float inverse_rows = 1.0f / static_cast<float>(rows);
    const float inverse_sum = inverse_rows / sum;
    const float uniform = smoothing / static_cast<float>(classes) * inverse_rows;
    T* g = grad + static_cast<int64_t>(row) * classes;
    for (int c = lane; c < classes; c += 32) {
      float value = expf(z[c] - max_logit) * inverse_sum;
      if (c == label) value -= inverse_rows;
      if (smoothing != 0.0f) {
        if (c == label) value += smoothing * inverse_rows;
        value -= uniform;
      }
      g[c] = FromFloat<T>(value * scale);
    }
  }
}

// blockIdx.y picks the tensor; x blocks stride over its elements.
__global__ void GradSumOfSquaresKernel(TensorList list, const StepState* state, ClipState* clip) {
  const OptimizerTensor& t = list.tensors[blockIdx.y];
  const float inverse_scale = 1.0f / state->loss_scale;
  double sum = 0.0;
  STOKER_GRID_STRIDE_LOOP(i, t.size) {
    const double g = __fmul_rn(t.grad[i], inverse_scale);
    sum += g * g;
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) atomicAdd(&clip->sum_of_squares, total);
}

__global__ void ClipCoefficientKernel(ClipState* clip, double max_norm) {
  // torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), applied only when below 1.
  const double coefficient = max_norm / (sqrt(clip->sum_of_squares) + 1e-6);
  clip->coefficient = coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

template <typename T>
__global__ void SgdStepKernel(TensorList list, float learning_rate, float momentum, bool nesterov,
                              const StepState* state, const ClipState* clip, bool skip_on_inf) {
  if (skip_on_inf && state->found_inf != 0) return;
  // The scale is a power of two: the reciprocal and the products are exact.
  const float inverse_scale = 1.0f / state->loss_scale;
  const float coefficient = clip != nullptr ? clip->coefficient : 1.0f;
  const OptimizerTensor& t = list.tensors[blockIdx.y];
  T* low = static_cast<T*>(t.weight_low);
  STOKER_GRID_STRIDE_LOOP(i, t.size) {
    const float g = EffectiveGrad(t.grad[i], inverse_scale, clip, coefficient);
    const float w = t.weight[i];
    float updated;
    if (momentum == 0.0f) {
      updated = __fsub_rn(w, __fmul_rn(learning_rate, __fadd_rn(g, __fmul_rn(t.weight_decay, w))));
    } else {
      const float decayed = __fadd_rn(g, __fmul_rn(t.weight_decay, w));
      const float v = __fadd_rn(__fmul_rn(momentum, t.state1[i]), decayed);
      t.state1[i] = v;
      const float step = nesterov ? __fadd_rn(decayed, __fmul_rn(momentum, v)) : v;
      updated = __fsub_rn(w, __fmul_rn(learning_rate, step));
    }
    t.weight[i] = updated;
    if (low != nullptr) low[i] = FromFloat<T>(updated);
  }
}

template <typename T>
__global__ void AdamWStepKernel(TensorList list, AdamWConstants k, const StepState* state,
                                const ClipState* clip, bool skip_on_inf) {
  if (skip_on_inf && state->found_inf != 0) return;
  const float inverse_scale = 1.0f / state->loss_scale;
  const float coefficient = clip != nullptr ? clip->coefficient : 1.0f;
  const OptimizerTensor& t = list.tensors[blockIdx.y];
  T* low = static_cast<T*>(t.weight_low);
  const float decay = __fsub_rn(1.0f, __fmul_rn(k.learning_rate, t.weight_decay));
  const float one_minus_beta1 = __fsub_rn(1.0f, k.beta1);
  const float one_minus_beta2 = __fsub_rn(1.0f, k.beta2);
  STOKER_GRID_STRIDE_LOOP(i, t.size) {
    const float g = EffectiveGrad(t.grad[i], inverse_scale, clip, coefficient);
    const float w = __fmul_rn(t.weight[i], decay);
    const float m = __fadd_rn(__fmul_rn(k.beta1, t.state1[i]), __fmul_rn(one_minus_beta1, g));
    const float v =
        __fadd_rn(__fmul_rn(k.beta2, t.state2[i]), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    t.state1[i] = m;
    t.state2[i] = v;
    const float denominator =
        __fadd_rn(__fmul_rn(__fsqrt_rn(v), k.inverse_sqrt_correction2), k.eps);
    const float updated = __fsub_rn(w, __fdiv_rn(__fmul_rn(k.step_size, m), denominator));
    t.weight[i] = updated;
    if (low != nullptr) low[i] = FromFloat<T>(updated);
  }
}

}  // namespace

// ================================ launchers ================================

cudaError_t LaunchAddChannelBias(void* y, DType type, const float* bias, int batch, int channels,
                                 int64_t spatial, cudaStream_t stream) {
  if (y == nullptr || bias == nullptr || batch <= 0 || channels <= 0 || spatial <= 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = static_cast<int64_t>(batch) * channels * spatial;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    AddChannelBiasKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(static_cast<T*>(y), bias,
                                                                           n, channels, spatial);
  });
}

cudaError_t LaunchChannelBiasGrad(const void* dy, DType type, int batch, int channels,
                                  int64_t spatial, float* bias_grad, cudaStream_t stream) {
  if (dy == nullptr || bias_grad == nullptr || batch <= 0 || channels <= 0 || spatial <= 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ChannelBiasGradKernel<T><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), batch, channels, spatial, bias_grad);
  });
}

cudaError_t LaunchActivationForward(ActivationKind kind, const void* x, void* y, DType type,
                                    int64_t n, cudaStream_t stream) {
  if (x == nullptr || y == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ActivationForwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        kind, static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}

cudaError_t LaunchActivationBackward(ActivationKind kind, const void* x, const void* dy, void* dx,
                                     DType type, int64_t n, cudaStream_t stream) {
  if (x == nullptr || dy == nullptr || dx == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ActivationBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        kind, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n);
  });
}

cudaError_t LaunchDropoutForward(const void* x, void* y, uint8_t* keep, DType type, int64_t n,
                                 int channels, int64_t spatial, uint64_t key, uint64_t threshold,
                                 float inverse_keep, cudaStream_t stream) {
  if (x == nullptr || y == nullptr || keep == nullptr || n <= 0 || channels <= 0 || spatial <= 0 ||
      n % (channels * spatial) != 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    DropoutForwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), keep, n, channels, spatial, key, threshold,
        inverse_keep);
  });
}

cudaError_t LaunchDropoutBackward(const void* dy, const uint8_t* keep, void* dx, DType type,
                                  int64_t n, float inverse_keep, cudaStream_t stream) {
  if (dy == nullptr || keep == nullptr || dx == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    DropoutBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), keep, static_cast<T*>(dx), n, inverse_keep);
  });
}

cudaError_t LaunchConvertToF32(const void* src, DType type, int64_t n, float* dst,
                               cudaStream_t stream) {
  if (src == nullptr || dst == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ConvertToF32Kernel<T>
        <<<ElementwiseBlocks(n), kThreads, 0, stream>>>(static_cast<const T*>(src), n, dst);
  });
}

cudaError_t LaunchConvertToF32Scaled(const void* src, DType type, int64_t n, const float* scale,
                                     float* dst, cudaStream_t stream) {
  if (src == nullptr || scale == nullptr || dst == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    ConvertToF32ScaledKernel<T>
        <<<ElementwiseBlocks(n), kThreads, 0, stream>>>(static_cast<const T*>(src), n, scale, dst);
  });
}

cudaError_t LaunchMaxPoolForward(const void* x, void* y, DType type, const PoolGeometry& geometry,
                                 cudaStream_t stream) {
  return kernel_util::LaunchPoolForward(x, y, type, geometry, MaxWindow{}, stream);
}

cudaError_t LaunchMaxPoolBackward(const void* x, const void* dy, void* dx, DType type,
                                  const PoolGeometry& geometry, cudaStream_t stream) {
  if (x == nullptr || dy == nullptr || dx == nullptr || !ValidPoolGeometry(geometry)) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = static_cast<int64_t>(geometry.planes) * geometry.height * geometry.width;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    MaxPoolBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), geometry);
  });
}

cudaError_t LaunchSmoothedCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                       int classes, float smoothing, float share, DType grad_type,
                                       void* grad, StepState* state, cudaStream_t stream) {
  if (logits == nullptr || labels == nullptr || state == nullptr || rows <= 0 || classes <= 0 ||
      classes > 256 || !(smoothing >= 0.0f && smoothing < 1.0f) || !(share > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>(kernel_util::CeilDiv(rows, kRowsPerBlock));
  return DispatchType(grad_type, [&](auto zero) {
    using T = decltype(zero);
    SmoothedCrossEntropyKernel<T><<<blocks, kThreads, 0, stream>>>(
        logits, labels, rows, classes, smoothing, share, static_cast<T*>(grad), state);
  });
}

cudaError_t LaunchGradSumOfSquares(const OptimizerTensor* tensors, int count,
                                   const StepState* state, ClipState* clip, cudaStream_t stream) {
  if (tensors == nullptr || state == nullptr || clip == nullptr || count < 0) {
    return cudaErrorInvalidValue;
  }
  return ForEachTensorList<TensorList>(tensors, count, [&](const TensorList& list, dim3 grid) {
    GradSumOfSquaresKernel<<<grid, kThreads, 0, stream>>>(list, state, clip);
  });
}

cudaError_t LaunchClipCoefficient(ClipState* clip, double max_norm, cudaStream_t stream) {
  if (clip == nullptr || !(max_norm > 0)) return cudaErrorInvalidValue;
  ClipCoefficientKernel<<<1, 1, 0, stream>>>(clip, max_norm);
  return cudaGetLastError();
}

cudaError_t LaunchSgdStep(const OptimizerTensor* tensors, int count, DType low_type,
                          float learning_rate, float momentum, bool nesterov,
                          const StepState* state, const ClipState* clip, bool skip_on_inf,
                          cudaStream_t stream) {
  if (tensors == nullptr || state == nullptr || count < 0) return cudaErrorInvalidValue;
  cudaError_t result = cudaSuccess;
  const cudaError_t dispatched = DispatchType(low_type, [&](auto zero) {
    using T = decltype(zero);
    result = ForEachTensorList<TensorList>(tensors, count, [&](const TensorList& list, dim3 grid) {
      SgdStepKernel<T><<<grid, kThreads, 0, stream>>>(list, learning_rate, momentum, nesterov,
                                                      state, clip, skip_on_inf);
    });
  });
  return result != cudaSuccess ? result : dispatched;
}

cudaError_t LaunchAdamWStep(const OptimizerTensor* tensors, int count, DType low_type,
                            const AdamWConstants& constants, const StepState* state,
                            const ClipState* clip, bool skip_on_inf, cudaStream_t stream) {
  if (tensors == nullptr || state == nullptr || count < 0) return cudaErrorInvalidValue;
  for (int i = 0; i < count; ++i) {
    if (tensors[i].state2 == nullptr) return cudaErrorInvalidValue;
  }
  cudaError_t result = cudaSuccess;
  const cudaError_t dispatched = DispatchType(low_type, [&](auto zero) {
    using T = decltype(zero);
    result = ForEachTensorList<TensorList>(tensors, count, [&](const TensorList& list, dim3 grid) {
      AdamWStepKernel<T><<<grid, kThreads, 0, stream>>>(list, constants, state, clip, skip_on_inf);
    });
  });
  return result != cudaSuccess ? result : dispatched;
}

}  // namespace stoker::cuda
