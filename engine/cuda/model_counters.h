// Private to the cuda backend: the base of its models, which keeps the CudaModelCounters that
// GetCudaModelCounters (cuda_backend.h) reports.
#ifndef STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_
#define STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_

#include <string>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"

namespace stoker::cuda {

class CountingModel : public Model {
 public:
  const CudaModelCounters& counters() const { return counters_; }

 protected:
  // Records why a fused epilogue or a CUDA graph capture fell back, and writes it to stderr (the
  // trainer's log), once per distinct reason.
  void NoteFallback(const std::string& reason);

  CudaModelCounters counters_;
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_
