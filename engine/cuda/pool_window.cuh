// Private to the cuda backend's pooling kernels (network_kernels.cu's max pooling,
// vision_kernels.cu's average pooling): the forward kernel and its launcher, one thread per output
// element, over what a window's value is; the positions of a window; and which output windows of a
// PoolGeometry contain a given input element, for the backward kernels that run one thread per
// input element. CUDA only.
#ifndef STOKER_ENGINE_CUDA_POOL_WINDOW_CUH_
#define STOKER_ENGINE_CUDA_POOL_WINDOW_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/dtype.h"
#include "engine/cuda/kernel_util.cuh"
#include "engine/cuda/network_kernels.h"  // PoolGeometry

namespace stoker::cuda::kernel_util {

// Calls visit(index) with the index in the plane of each position of output window (oh, ow) that
// lies inside the plane (padding skipped), row by row.
template <typename Visit>
__device__ __forceinline__ void ForEachInWindow(const PoolGeometry& g, int oh, int ow,
                                                Visit&& visit) {
  const int h0 = oh * g.stride - g.padding;
  const int w0 = ow * g.stride - g.padding;
  for (int kh = 0; kh < g.kernel; ++kh) {
    const int h = h0 + kh;
    if (h < 0 || h >= g.height) continue;
    for (int kw = 0; kw < g.kernel; ++kw) {
      const int w = w0 + kw;
      if (w < 0 || w >= g.width) continue;
      visit(h * g.width + w);
    }
  }
}

// The output windows (oh, ow), oh in [oh_begin, oh_end] and ow in [ow_begin, ow_end] (empty when
// begin > end), that contain input element (h, w) of a plane.
struct WindowRange {
  int oh_begin;
  int ow_begin;
  int oh_end;
  int ow_end;
};

__device__ __forceinline__ WindowRange WindowsContaining(const PoolGeometry& g, int h, int w) {
  // Windows oh with oh * stride - padding <= h <= oh * stride - padding + kernel - 1.
  const int low_h = h + g.padding - g.kernel + 1;
  const int low_w = w + g.padding - g.kernel + 1;
  WindowRange range;
  range.oh_begin = low_h <= 0 ? 0 : (low_h + g.stride - 1) / g.stride;
  range.ow_begin = low_w <= 0 ? 0 : (low_w + g.stride - 1) / g.stride;
  range.oh_end = min(g.out_height - 1, (h + g.padding) / g.stride);
  range.ow_end = min(g.out_width - 1, (w + g.padding) / g.stride);
  return range;
}

// One thread per output element: y = window(the plane's values, g, oh, ow) for output window
// (oh, ow) of its plane, `window` computing it in fp32 (a functor with a templated
// `__device__ float operator()(const T* plane, const PoolGeometry& g, int oh, int ow) const`).
template <typename T, typename Window>
__global__ void PoolForwardKernel(const T* x, T* y, PoolGeometry g, Window window) {
  const int64_t out_plane = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t n = g.planes * out_plane;
  STOKER_GRID_STRIDE_LOOP(i, n) {
    const int64_t p = i / out_plane;
    const int within = static_cast<int>(i - p * out_plane);
    y[i] = FromFloat<T>(
        window(x + p * g.height * g.width, g, within / g.out_width, within % g.out_width));
  }
}

// Launches PoolForwardKernel over `x` ([planes, height, width] of `type`) into `y`; what
// LaunchMaxPoolForward and LaunchAvgPoolForward check and return.
template <typename Window>
cudaError_t LaunchPoolForward(const void* x, void* y, DType type, const PoolGeometry& geometry,
                              Window window, cudaStream_t stream) {
  if (x == nullptr || y == nullptr || !ValidPoolGeometry(geometry)) return cudaErrorInvalidValue;
  const int64_t n =
      static_cast<int64_t>(geometry.planes) * geometry.out_height * geometry.out_width;
  return DispatchType(type, [&](auto zero) {
    using T = decltype(zero);
    PoolForwardKernel<T><<<ElementwiseBlocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), geometry, window);
  });
}

}  // namespace stoker::cuda::kernel_util

#endif  // STOKER_ENGINE_CUDA_POOL_WINDOW_CUH_
