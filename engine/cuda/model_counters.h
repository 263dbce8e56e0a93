// Private to the cuda backend: the base of its models, which keeps the CudaModelCounters that
// GetCudaModelCounters (cuda_backend.h) reports.
#ifndef STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_
#define STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_context.h"
#include "engine/cuda/lt_gemm.h"
#include "engine/model.h"
#include "engine/model_base.h"

namespace stoker::cuda {

class CountingModel : public ModelBase {
 public:
  const CudaModelCounters& counters() const { return counters_; }

 protected:
  explicit CountingModel(bool gradient_test_hook) : ModelBase(gradient_test_hook) {}
  // Records why a fused epilogue or a CUDA graph capture fell back, and writes it to stderr (the
  // trainer's log), once per distinct reason.
  void NoteFallback(const std::string& reason);
  // Tries the fused epilogue (when `try_fused`), else a plain GEMM, noting why it fell back. Sets
  // *fused accordingly.
  absl::StatusOr<std::unique_ptr<LtGemm>> MakeGemmPreferFused(const DeviceContext& context,
                                                              bool try_fused,
                                                              const GemmShape& shape,
                                                              const GemmEpilogueArgs& epilogue,
                                                              bool* fused);

  CudaModelCounters counters_;
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_MODEL_COUNTERS_H_
