// Internal to the cpu kernels: one table of the element-wise loops per instruction set.
#ifndef STOKER_ENGINE_CPU_CPU_KERNELS_TABLE_H_
#define STOKER_ENGINE_CPU_CPU_KERNELS_TABLE_H_

#include <cstdint>

#include "engine/bf16.h"
#include "engine/cpu/cpu_kernels.h"

namespace stoker::cpu {

// Signatures and contracts as in cpu_kernels.h.
struct KernelTable {
  void (*normalize_to_f32)(const uint8_t*, int64_t, const ChannelAffine&, float*);
  void (*normalize_to_bf16)(const uint8_t*, int64_t, const ChannelAffine&, bf16_t*);
  double (*softmax_cross_entropy)(const float*, const uint8_t*, int, int, float*, int64_t*);
  void (*finish_output_grad_f32)(const float*, int, int, float*, float*, bf16_t*);
  void (*finish_output_grad_bf16)(const bf16_t*, int, int, float*, float*, bf16_t*);
  void (*sgd_momentum_update)(int64_t, float, float, float, const float*, float*, float*, bf16_t*);
  void (*convert_to_bf16)(const float*, int64_t, bf16_t*);
  void (*max_pool_forward_f32)(const float*, const PoolShape&, bool, float*, uint8_t*);
  void (*max_pool_forward_bf16)(const bf16_t*, const PoolShape&, bool, bf16_t*, uint8_t*);
  void (*max_pool_backward_f32)(const float*, const float*, const uint8_t*, const PoolShape&,
                                float*);
  void (*max_pool_backward_bf16)(const bf16_t*, const bf16_t*, const uint8_t*, const PoolShape&,
                                 bf16_t*);
  void (*batch_norm_forward_f32)(const float*, const NormShape&, const float*, const float*,
                                 const float*, bool, float*, float*, float*, double*);
  void (*batch_norm_forward_bf16)(const bf16_t*, const NormShape&, const float*, const float*,
                                  const bf16_t*, bool, float*, float*, bf16_t*, double*);
  void (*batch_norm_backward_f32)(const float*, const float*, const float*, const NormShape&,
                                  const float*, const float*, const float*, float*, float*, float*,
                                  float*, float*, double*);
  void (*batch_norm_backward_bf16)(const bf16_t*, const bf16_t*, const bf16_t*, const NormShape&,
                                   const float*, const float*, const float*, float*, float*,
                                   bf16_t*, bf16_t*, bf16_t*, double*);
};

extern const KernelTable kGenericKernels;  // baseline x86-64
extern const KernelTable kAvx512Kernels;   // x86-64-v4 (AVX-512 F/BW/DQ/VL)

}  // namespace stoker::cpu

#endif  // STOKER_ENGINE_CPU_CPU_KERNELS_TABLE_H_
