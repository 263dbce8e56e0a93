// The element type a model computes in for each Precision (activations, gradients and the
// low-precision weight copies; masters and optimizer state stay fp32).
#ifndef STOKER_ENGINE_CUDA_COMPUTE_TYPE_H_
#define STOKER_ENGINE_CUDA_COMPUTE_TYPE_H_

#include "engine/cuda/dtype.h"
#include "engine/model_config.h"

namespace stoker::cuda {

inline DType ComputeType(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kBf16:
      return DType::kBf16;
    case Precision::kFp16:
      return DType::kF16;
  }
  return DType::kF32;
}

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_COMPUTE_TYPE_H_
