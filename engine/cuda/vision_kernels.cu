// Kernels of the cuda network's vision layers (see vision_kernels.h for each contract), then their
// launchers. BatchNorm's per-channel sums run one block per channel over batch x spatial values,
// added in a fixed tree (kernel_util::BlockSum); everything else is one thread per output value.
// The running-statistics update is spelled with __fmul_rn/__fadd_rn, as the cpu rounds it.
#include <cuda_runtime.h>

#include <cmath>

#include "engine/cuda/kernel_util.cuh"
#include "engine/cuda/pool_window.cuh"
#include "engine/cuda/vision_kernels.h"

namespace stoker::cuda {
namespace {

using kernel_util::BlockSum;
using kernel_util::DispatchType;
using kernel_util::ElementwiseBlocks;
using kernel_util::FromFloat;
using kernel_util::kThreads;
using kernel_util::ToFloat;
using kernel_util::WindowRange;
using kernel_util::WindowsContaining;

// ================================ kernels ================================

// One block per channel: the mean, then the mean squared deviation, each a fixed-order sum.
template <typename T>
__global__ void BatchNormStatisticsKernel(const T* x, int batch, int channels, int64_t spatial,
                                          float* mean, float* variance) {
  const int c = blockIdx.x;
  const int64_t count = static_cast<int64_t>(batch) * spatial;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t n = j / spatial;
    sum += ToFloat(x[(n * channels + c) * spatial + (j - n * spatial)]);
  }
  const float m = BlockSum(sum) / static_cast<float>(count);  // every thread gets the sum
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t n = j / spatial;
    const float d = ToFloat(x[(n * channels + c) * spatial + (j - n * spatial)]) - m;
    squares += d * d;
  }
  const float total_squares = BlockSum(squares);
  if (threadIdx.x == 0) {
    mean[c] = m;
    variance[c] = total_squares / static_cast<float>(count);
  }
}

template <typename T>
__global__ void BatchNormApplyKernel(const T* x, T* y, int64_t n, int channels, int64_t spatial,
                                     const float* mean, const float* variance, const float* gamma,
                                     const float* beta, float eps) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int c = static_cast<int>((i / spatial) % channels);
    const float inverse_std = rsqrtf(variance[c] + eps);
    y[i] = FromFloat<T>((ToFloat(x[i]) - mean[c]) * inverse_std * gamma[c] + beta[c]);
  }
}

// One block per channel: sum dy and sum dy x_hat.
template <typename T>
__global__ void BatchNormParamGradKernel(const T* x, const T* dy, int batch, int channels,
                                         int64_t spatial, const float* mean, const float* variance,
                                         float eps, float* gamma_grad, float* beta_grad) {
  const int c = blockIdx.x;
  const int64_t count = static_cast<int64_t>(batch) * spatial;
  const float m = mean[c];
  const float inverse_std = rsqrtf(variance[c] + eps);
  float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t n = j / spatial;
    const int64_t index = (n * channels + c) * spatial + (j - n * spatial);
    const float g = ToFloat(dy[index]);
    sum_dy += g;
    sum_dy_xhat += g * (ToFloat(x[index]) - m) * inverse_std;
  }
  const float total_dy = BlockSum(sum_dy);  // BlockSum syncs before it returns: a second may follow
  const float total_dy_xhat = BlockSum(sum_dy_xhat);
  if (threadIdx.x == 0) {
    beta_grad[c] = total_dy;
    gamma_grad[c] = total_dy_xhat;
  }
}

template <typename T>
__global__ void BatchNormInputGradKernel(const T* x, const T* dy, T* dx, int64_t n, int channels,
                                         int64_t spatial, float count, const float* mean,
                                         const float* variance, const float* gamma, float eps,
                                         const float* gamma_grad, const float* beta_grad) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int c = static_cast<int>((i / spatial) % channels);
    const float inverse_std = rsqrtf(variance[c] + eps);
    const float x_hat = (ToFloat(x[i]) - mean[c]) * inverse_std;
    const float value = gamma[c] * inverse_std / count *
                        (count * ToFloat(dy[i]) - beta_grad[c] - x_hat * gamma_grad[c]);
    dx[i] = FromFloat<T>(value);
  }
}

__global__ void BatchNormUpdateRunningKernel(const float* mean, const float* variance, int channels,
                                             float momentum, double unbias, float* running_mean,
                                             float* running_var, float* batches_tracked) {
  STOKER_GRID_STRIDE_LOOP(c, channels) {
    const float keep = 1.0f - momentum;
    running_mean[c] = __fadd_rn(__fmul_rn(momentum, mean[c]), __fmul_rn(keep, running_mean[c]));
    const float unbiased = static_cast<float>(static_cast<double>(variance[c]) * unbias);
    running_var[c] = __fadd_rn(__fmul_rn(momentum, unbiased), __fmul_rn(keep, running_var[c]));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) batches_tracked[0] += 1.0f;
}

// Average pooling's window value (PoolForwardKernel): the sum of the window's values in the
// plane (padding counts as zeros), times 1 / kernel^2.
struct AvgWindow {
  template <typename T>
  __device__ float operator()(const T* plane, const PoolGeometry& g, int oh, int ow) const {
    const float inverse_window = 1.0f / static_cast<float>(g.kernel * g.kernel);
    float sum = 0.0f;
    kernel_util::ForEachInWindow(g, oh, ow, [&](int index) { sum += ToFloat(plane[index]); });
    return sum * inverse_window;
  }
};

// One thread per input element: the windows that contain it (WindowsContaining), as
// MaxPoolBackwardKernel visits them.
template <typename T>
__global__ void AvgPoolBackwardKernel(const T* dy, T* dx, PoolGeometry g) {
  const int64_t in_plane = static_cast<int64_t>(g.height) * g.width;
  const int64_t out_plane = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t n = g.planes * in_plane;
  const float inverse_window = 1.0f / static_cast<float>(g.kernel * g.kernel);
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int64_t p = i / in_plane;
    const int within = static_cast<int>(i - p * in_plane);
    const WindowRange r = WindowsContaining(g, within / g.width, within % g.width);
    float sum = 0.0f;
    for (int oh = r.oh_begin; oh <= r.oh_end; ++oh) {
      for (int ow = r.ow_begin; ow <= r.ow_end; ++ow) {
        sum += ToFloat(dy[p * out_plane + oh * g.out_width + ow]);
      }
    }
    dx[i] = FromFloat<T>(sum * inverse_window);
  }
}

// One thread per plane.
template <typename T>
__global__ void GlobalAvgPoolForwardKernel(const T* x, T* y, int64_t planes, int64_t plane) {
  STOKER_GRID_STRIDE_LOOP(p, planes) {
    float sum = 0.0f;
    for (int64_t i = 0; i < plane; ++i) sum += ToFloat(x[p * plane + i]);
    y[p] = FromFloat<T>(sum / static_cast<float>(plane));
  }
}

template <typename T>
__global__ void GlobalAvgPoolBackwardKernel(const T* dy, T* dx, int64_t planes, int64_t plane) {
  const int64_t n = planes * plane;
  STOKER_GRID_STRIDE_LOOP(i, n) {
    dx[i] = FromFloat<T>(ToFloat(dy[i / plane]) / static_cast<float>(plane));
  }
}

__device__ __forceinline__ float ApplySumActivation(SumActivation act, float v) {
  if (act == SumActivation::kRelu) return v > 0.0f ? v : v * 0.0f;
  if (act == SumActivation::kGelu) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  return v;
}

template <typename T>
__global__ void AddActivationForwardKernel(SumActivation act, const T* a, const T* b, T* sum, T* y,
                                           int64_t n) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const T s = FromFloat<T>(__fadd_rn(ToFloat(a[i]), ToFloat(b[i])));
    if (sum != nullptr) sum[i] = s;
    y[i] = FromFloat<T>(ApplySumActivation(act, ToFloat(s)));
  }
}

template <typename T>
__global__ void AddActivationBackwardKernel(SumActivation act, const T* sum, const T* y,
                                            const T* dy, T* grad, T* grad2, int64_t n) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const float g = ToFloat(dy[i]);
    float out = g;
    if (act == SumActivation::kRelu) {
      out = ToFloat(y[i]) > 0.0f ? g : g * 0.0f;
    } else if (act == SumActivation::kGelu) {
      const float v = ToFloat(sum[i]);
      const float u = v * 0.70710678118654752f;
      const float cdf = 0.5f * (1.0f + erff(u));
      const float pdf = expf(-u * u) * 0.39894228040143268f;
      out = g * (cdf + v * pdf);
    }
    const T value = FromFloat<T>(out);
    grad[i] = value;
    if (grad2 != nullptr) grad2[i] = value;
  }
}

template <typename T>
__global__ void AddInPlaceKernel(T* dst, const T* src, int64_t n) {
  STOKER_GRID_STRIDE_LOOP(i, n) {
    dst[i] = FromFloat<T>(__fadd_rn(ToFloat(dst[i]), ToFloat(src[i])));
  }
}

}  // namespace

// ================================ launchers ================================

cudaError_t LaunchBatchNormStatistics(const void* x, DType type, int batch, int channels,
                                      int64_t spatial, float* mean, float* variance,
                                      cudaStream_t stream) {
  if (x == nullptr || mean == nullptr || variance == nullptr || batch <= 0 || channels <= 0 ||
      spatial <= 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    BatchNormStatisticsKernel<T><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(x), batch, channels, spatial, mean, variance);
  });
}

cudaError_t LaunchBatchNormApply(const void* x, void* y, DType type, int batch, int channels,
                                 int64_t spatial, const float* mean, const float* variance,
                                 const float* gamma, const float* beta, float eps,
                                 cudaStream_t stream) {
  if (x == nullptr || y == nullptr || mean == nullptr || variance == nullptr || gamma == nullptr ||
      beta == nullptr || batch <= 0 || channels <= 0 || spatial <= 0 || !(eps > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = static_cast<int64_t>(batch) * channels * spatial;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    BatchNormApplyKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, channels, spatial, mean, variance, gamma,
        beta, eps);
  });
}

cudaError_t LaunchBatchNormBackward(const void* x, const void* dy, void* dx, DType type, int batch,
                                    int channels, int64_t spatial, const float* mean,
                                    const float* variance, const float* gamma, float eps,
                                    float* gamma_grad, float* beta_grad, cudaStream_t stream) {
  if (x == nullptr || dy == nullptr || mean == nullptr || variance == nullptr || gamma == nullptr ||
      gamma_grad == nullptr || beta_grad == nullptr || batch <= 0 || channels <= 0 ||
      spatial <= 0 || !(eps > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = static_cast<int64_t>(batch) * channels * spatial;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    BatchNormParamGradKernel<T><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), batch, channels, spatial, mean,
        variance, eps, gamma_grad, beta_grad);
    if (dx == nullptr) return;
    BatchNormInputGradKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n, channels,
        spatial, static_cast<float>(static_cast<int64_t>(batch) * spatial), mean, variance, gamma,
        eps, gamma_grad, beta_grad);
  });
}

cudaError_t LaunchBatchNormUpdateRunning(const float* mean, const float* variance, int channels,
                                         float momentum, double unbias, float* running_mean,
                                         float* running_var, float* batches_tracked,
                                         cudaStream_t stream) {
  if (mean == nullptr || variance == nullptr || running_mean == nullptr || running_var == nullptr ||
      batches_tracked == nullptr || channels <= 0) {
    return cudaErrorInvalidValue;
  }
  BatchNormUpdateRunningKernel<<<ElementwiseBlocks(channels), kThreads, 0, stream>>>(
      mean, variance, channels, momentum, unbias, running_mean, running_var, batches_tracked);
  return cudaGetLastError();
}

cudaError_t LaunchAvgPoolForward(const void* x, void* y, DType type, const PoolGeometry& geometry,
                                 cudaStream_t stream) {
  return kernel_util::LaunchPoolForward(x, y, type, geometry, AvgWindow{}, stream);
}

cudaError_t LaunchAvgPoolBackward(const void* dy, void* dx, DType type,
                                  const PoolGeometry& geometry, cudaStream_t stream) {
  if (dy == nullptr || dx == nullptr || !ValidPoolGeometry(geometry)) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(geometry.planes) * geometry.height * geometry.width;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    AvgPoolBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(dx), geometry);
  });
}

cudaError_t LaunchGlobalAvgPoolForward(const void* x, void* y, DType type, int64_t planes,
                                       int64_t plane, cudaStream_t stream) {
  if (x == nullptr || y == nullptr || planes <= 0 || plane <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    GlobalAvgPoolForwardKernel<T><<<ElementwiseBlocks(planes), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), planes, plane);
  });
}

cudaError_t LaunchGlobalAvgPoolBackward(const void* dy, void* dx, DType type, int64_t planes,
                                        int64_t plane, cudaStream_t stream) {
  if (dy == nullptr || dx == nullptr || planes <= 0 || plane <= 0) return cudaErrorInvalidValue;
  const int64_t n = planes * plane;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    GlobalAvgPoolBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(dx), planes, plane);
  });
}

cudaError_t LaunchAddActivationForward(SumActivation act, const void* a, const void* b, void* sum,
                                       void* y, DType type, int64_t n, cudaStream_t stream) {
  if (a == nullptr || b == nullptr || y == nullptr || n <= 0 ||
      (act == SumActivation::kGelu && sum == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    AddActivationForwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        act, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(sum),
        static_cast<T*>(y), n);
  });
}

cudaError_t LaunchAddActivationBackward(SumActivation act, const void* sum, const void* y,
                                        const void* dy, void* grad, void* grad2, DType type,
                                        int64_t n, cudaStream_t stream) {
  if (dy == nullptr || grad == nullptr || n <= 0 || (act == SumActivation::kRelu && y == nullptr) ||
      (act == SumActivation::kGelu && sum == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    AddActivationBackwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        act, static_cast<const T*>(sum), static_cast<const T*>(y), static_cast<const T*>(dy),
        static_cast<T*>(grad), static_cast<T*>(grad2), n);
  });
}

cudaError_t LaunchAddInPlace(void* dst, const void* src, DType type, int64_t n,
                             cudaStream_t stream) {
  if (dst == nullptr || src == nullptr || n <= 0) return cudaErrorInvalidValue;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    AddInPlaceKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n);
  });
}

}  // namespace stoker::cuda
