#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_mlp.h"
#include "engine/cuda/model_counters.h"
#ifdef STOKER_HAVE_CUDNN
#include "engine/cuda/cuda_network.h"
#endif

namespace stoker {
namespace {

struct RegionPin final : HostMemoryPin {
  PinnedHostRegion region;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options) : device_(device), options_(options) {}
  std::string Name() const override { return "cuda"; }
  // Best effort: a region that cannot be pinned is copied through the driver's staging.
  std::unique_ptr<HostMemoryPin> PinHostMemory(void* base, size_t bytes) override {
    auto pin = std::make_unique<RegionPin>();
    if (!pin->region.Register(base, bytes).ok()) return nullptr;
    return pin;
  }
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override {
    STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free_bytes = 0, total_bytes = 0;
    STOKER_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(free_bytes);
  }

 protected:
  // Backend::CreateMlp routes (MlpNeedsNetwork) as on the cpu. Without cuDNN the fast path takes
  // every MLP (it does fp16 and Nesterov; AdamW and clipping are then UNIMPLEMENTED).
  absl::StatusOr<std::unique_ptr<Model>> CreateMlpFastPath(const MlpConfig& config) override {
    return CreateCudaMlp(config, device_, options_);
  }
  absl::StatusOr<std::unique_ptr<Model>> CreateNetworkModel(const NetworkConfig& config,
                                                            ParameterNaming naming) override {
#ifdef STOKER_HAVE_CUDNN
    return CreateCudaNetwork(config, device_, options_, naming);
#else
    (void)config;
    (void)naming;
    return absl::UnimplementedError("the cuda backend was built without cuDNN: no networks");
#endif
  }
  bool BuildsNetworks() const override {
#ifdef STOKER_HAVE_CUDNN
    return true;
#else
    return false;
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

absl::Status CudaDeviceStatus() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount failed: ", cudaGetErrorName(error), " (",
                     static_cast<int>(error), "): ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device: the runtime sees none");
  return absl::OkStatus();
}

absl::StatusOr<CudaModelCounters> GetCudaModelCounters(const Model& model) {
  const auto* counting = dynamic_cast<const cuda::CountingModel*>(&model);
  if (counting == nullptr) {
    return absl::InvalidArgumentError("not a model of the cuda backend");
  }
  return counting->counters();
}

namespace cuda {

void CountingModel::NoteFallback(const std::string& reason) {
  constexpr size_t kMaxReasons = 32;
  std::vector<std::string>& reasons = counters_.fallbacks;
  if (std::find(reasons.begin(), reasons.end(), reason) != reasons.end()) return;
  if (reasons.size() >= kMaxReasons) return;
  reasons.push_back(reason);
  std::fprintf(stderr, "stoker cuda: fallback: %s\n", reason.c_str());
}

absl::StatusOr<std::unique_ptr<LtGemm>> CountingModel::MakeGemmPreferFused(
    const DeviceContext& context, bool try_fused, const GemmShape& shape,
    const GemmEpilogueArgs& epilogue, bool* fused) {
  std::string why_not_fused;
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = CreateGemmPreferFused(
      context.lt(), shape, epilogue, context.workspace_bytes(), try_fused, fused, &why_not_fused);
  if (!why_not_fused.empty()) NoteFallback(why_not_fused);
  return gemm;
}

}  // namespace cuda

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index) {
  return CreateCudaBackend(device_index, CudaBackendOptions{});
}

bool CudaBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendIfBuilt(int device_index) {
  return CreateCudaBackend(device_index);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index,
                                                           const CudaBackendOptions& options) {
  if (absl::Status status = CudaDeviceStatus(); !status.ok()) return status;
  const int count = CudaDeviceCount();
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

PinnedHostRegion::PinnedHostRegion(PinnedHostRegion&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)) {}

PinnedHostRegion& PinnedHostRegion::operator=(PinnedHostRegion&& other) noexcept {
  if (this != &other) {
    (void)Release();
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

absl::Status PinnedHostRegion::Register(void* ptr, size_t bytes) {
  STOKER_RETURN_IF_ERROR(Release());
  STOKER_RETURN_IF_ERROR(RegisterHostRegion(ptr, bytes));
  ptr_ = ptr;
  return absl::OkStatus();
}

absl::Status PinnedHostRegion::Release() {
  if (ptr_ == nullptr) return absl::OkStatus();
  void* ptr = std::exchange(ptr_, nullptr);
  STOKER_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr));
  return absl::OkStatus();
}

}  // namespace stoker
