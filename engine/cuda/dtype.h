// Element types of device tensors, as a value (one code path for every precision).
#ifndef STOKER_ENGINE_CUDA_DTYPE_H_
#define STOKER_ENGINE_CUDA_DTYPE_H_

#include <cstddef>

namespace stoker::cuda {

enum class DType { kF32, kBf16, kF16 };

inline size_t DTypeBytes(DType type) { return type == DType::kF32 ? 4 : 2; }

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_DTYPE_H_
