#include "worker/engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/cuda_mlp.h"
#ifdef STOKER_HAVE_CUDNN
#include "worker/engine/cuda/cuda_network.h"
#endif

namespace stoker {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options) : device_(device), options_(options) {}
  std::string Name() const override { return "cuda"; }
  // As the cpu backend routes (MlpNeedsNetwork): fp16, AdamW, Nesterov and clipping take the
  // network, so an MLP's checkpoint holds the same tensors on either backend. A build without
  // cuDNN keeps the fast path for all (it does fp16 and Nesterov; AdamW and clipping are then
  // UNIMPLEMENTED).
  absl::StatusOr<std::unique_ptr<Model>> CreateMlp(const MlpConfig& config) override {
#ifdef STOKER_HAVE_CUDNN
    if (MlpNeedsNetwork(config)) return CreateCudaNetworkForMlp(config, device_, options_);
#endif
    return CreateCudaMlp(config, device_, options_);
  }
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override {
    STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free_bytes = 0, total_bytes = 0;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(free_bytes);
  }
  absl::StatusOr<std::unique_ptr<Model>> CreateNetwork(const NetworkConfig& config) override {
#ifdef STOKER_HAVE_CUDNN
    return CreateCudaNetwork(config, device_, options_);
#else
    (void)config;
    return absl::UnimplementedError("the cuda backend was built without cuDNN: no networks");
#endif
  }

 private:
  const int device_;
  const CudaBackendOptions options_;
};

}  // namespace

int CudaDeviceCount() {
  // Without a driver this returns cudaErrorInsufficientDriver (35) and leaves `count` alone.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index) {
  return CreateCudaBackend(device_index, CudaBackendOptions{});
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index,
                                                           const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError("no CUDA device");
  if (device_index < 0 || device_index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_index must be in [0, ", count, "), got ", device_index));
  }
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device_index, options));
}

absl::Status RegisterHostRegion(void* ptr, size_t bytes) {
  if (CudaDeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  if (ptr == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("host region must be non-null and non-empty");
  }
  STOKER_CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  return absl::OkStatus();
}

absl::Status UnregisterHostRegion(void* ptr) {
  if (CudaDeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  STOKER_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr));
  return absl::OkStatus();
}

}  // namespace stoker
