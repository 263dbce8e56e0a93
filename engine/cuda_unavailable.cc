// The cuda half of the engine's factory in a build without engine/cuda (no CUDA toolkit).
#include "engine/backend.h"

namespace stoker {

bool CudaBackendBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendIfBuilt(int device_index) {
  (void)device_index;
  return absl::FailedPreconditionError(
      "this trainer was built without the cuda backend (no CUDA toolkit at build time)");
}

}  // namespace stoker
