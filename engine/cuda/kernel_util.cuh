// Private to the cuda backend's kernel files (mlp_kernels.cu, network_kernels.cu,
// vision_kernels.cu): launch geometry, fp32 <-> bf16/fp16 element conversion, block- and
// warp-wide reductions, the DType -> element type dispatch of the launchers, and the multi-tensor
// lists the optimizer kernels take by value. CUDA only.
#ifndef STOKER_ENGINE_CUDA_KERNEL_UTIL_CUH_
#define STOKER_ENGINE_CUDA_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "engine/cuda/dtype.h"

namespace stoker::cuda::kernel_util {

inline constexpr int kThreads = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; grid-stride loops do the rest.
inline constexpr int64_t kMaxBlocks = 132 * 16;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of kThreads for a grid-stride loop over n elements.
inline unsigned ElementwiseBlocks(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(CeilDiv(n, kThreads), kMaxBlocks)));
}

// ---- Element conversion ----

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

// ---- Reductions ----

// The sum of `value` over a block of kThreads threads (blockDim.x == kThreads, blockDim.y ==
// blockDim.z == 1), added in a fixed tree (deterministic), returned to every thread. Every thread
// of the block must call it (it synchronises the block); it synchronises again before it returns,
// so a kernel may call it several times in a row without a barrier of its own.
template <typename Acc>
__device__ Acc BlockSum(Acc value) {
  __shared__ Acc partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const Acc total = partial[0];
  __syncthreads();  // every thread has read the total before a next call overwrites it
  return total;
}

// The sum of `value` over the 32 lanes of a warp, in a fixed butterfly (deterministic), returned
// to every lane. Every lane of the warp must call it.
template <typename Acc>
__device__ __forceinline__ Acc WarpSum(Acc value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// This thread's place in a kernel that gives each row of a matrix one warp (blockDim.x / 32 rows
// a block): its lane in the warp and the warp's row.
struct WarpRow {
  int lane;
  int row;
};
__device__ __forceinline__ WarpRow ThisWarpRow() {
  return WarpRow{static_cast<int>(threadIdx.x % 32),
                 static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32)};
}

// The maximum of a row and the index of its first occurrence.
struct RowMax {
  float value;
  int index;
};

// One warp per row of `classes` logits z, lane `lane` reading z[lane], z[lane + 32], ...: the
// row's maximum and the index of its first occurrence (ties go to the lowest class, as in the CPU
// reference), returned to every lane. Every lane of the warp must call it.
__device__ __forceinline__ RowMax WarpRowMax(const float* z, int classes, int lane) {
  RowMax best{-FLT_MAX, classes};
  for (int c = lane; c < classes; c += 32) {
    if (z[c] > best.value || best.index == classes) {
      best.value = z[c];
      best.index = c;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, best.value, offset);
    const int other_arg = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (other_max > best.value || (other_max == best.value && other_arg < best.index)) {
      best.value = other_max;
      best.index = other_arg;
    }
  }
  return best;
}

// ---- Launch helpers ----

// Calls launch(T{}) with T the element type of `type` (float, __nv_bfloat16 or __half), then
// returns cudaGetLastError().
template <typename Launch>
cudaError_t DispatchType(DType type, Launch&& launch) {
  switch (type) {
    case DType::kF32:
      launch(float{});
      break;
    case DType::kBf16:
      launch(__nv_bfloat16{});
      break;
    case DType::kF16:
      launch(__half{});
      break;
  }
  return cudaGetLastError();
}

// Up to kCapacity tensors of one multi-tensor launch, passed to the kernel by value (kernel
// parameters are limited in size: the capacity depends on sizeof(Tensor)).
template <typename TensorType, int kCapacityValue>
struct TensorList {
  using Tensor = TensorType;
  static constexpr int kCapacity = kCapacityValue;
  Tensor tensors[kCapacity];
  int count;
};

// Splits a tensor array into launches of at most List::kCapacity tensors: launch(list, grid) with
// grid.y = the list's count (blockIdx.y picks the tensor) and grid.x enough blocks for the largest
// tensor. `Tensor` has an int64_t `size`. Returns the first launch error.
template <typename List, typename Launch>
cudaError_t ForEachTensorList(const typename List::Tensor* tensors, int count, Launch&& launch) {
  for (int first = 0; first < count; first += List::kCapacity) {
    List list{};
    list.count = std::min(List::kCapacity, count - first);
    int64_t largest = 1;
    for (int i = 0; i < list.count; ++i) {
      list.tensors[i] = tensors[first + i];
      largest = std::max(largest, tensors[first + i].size);
    }
    const dim3 grid(ElementwiseBlocks(largest), list.count);
    launch(list, grid);
    if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

}  // namespace stoker::cuda::kernel_util

// for (int64_t i = ...; i < n; ...) over this thread's elements of a grid-stride loop.
#define STOKER_GRID_STRIDE_LOOP(i, n)                                                    \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

#endif  // STOKER_ENGINE_CUDA_KERNEL_UTIL_CUH_
