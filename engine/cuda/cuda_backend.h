// The CUDA training backend: cuBLASLt tensor-core GEMMs with fused epilogues, fp32 master weights,
// bf16/fp16/fp32 compute, a copy stream that moves each batch to the device while the compute
// stream waits on an event. Results match the cpu backend (CreateCpuBackend) within rounding:
// same parameter names and layout, same initialisation, same PyTorch SGD semantics.
// CreateNetwork builds layered networks with cuDNN (cuda_network.h); a build without cuDNN
// answers UNIMPLEMENTED there, and its CreateMlp keeps the fast path for every MLP.
//
// Everything here links only the CUDA runtime, cuBLAS(Lt) and cuDNN; none of it needs a driver
// to load.
// On a machine without a GPU, CudaDeviceCount() is 0 and CreateCudaBackend fails cleanly.
#ifndef STOKER_ENGINE_CUDA_CUDA_BACKEND_H_
#define STOKER_ENGINE_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_backend_options.h"

namespace stoker {

// Number of CUDA devices the runtime sees; 0 on any error (no driver, no device).
int CudaDeviceCount();

// OK when the runtime sees at least one device; otherwise FAILED_PRECONDITION "no CUDA device: "
// followed by the CUDA error cudaGetDeviceCount returned (e.g. cudaErrorInsufficientDriver).
absl::Status CudaDeviceStatus();

// What a model of this backend did, so that tests and benchmarks can tell a fast path from its
// fallback (both give the same results, so results alone cannot).
struct CudaModelCounters {
  // GEMMs that ran (eagerly or inside a replayed CUDA graph) with their epilogue fused by
  // cuBLASLt, and those that ran without one (no epilogue wanted, or own kernels did its work).
  int64_t fused_gemms = 0;
  int64_t plain_gemms = 0;
  // TrainSteps that replayed a captured CUDA graph, and those enqueued kernel by kernel (the
  // warm-up step before each capture, graphs off, a failed capture, a test hook).
  int64_t graph_replays = 0;
  int64_t eager_steps = 0;
  int64_t graph_captures = 0;
  // Why a fused epilogue or a capture fell back, one line per distinct reason (also written to
  // stderr when it happens).
  std::vector<std::string> fallbacks;
};

// The counters of a model that CreateCudaBackend's backend built; INVALID_ARGUMENT for any other.
absl::StatusOr<CudaModelCounters> GetCudaModelCounters(const Model& model);

// FAILED_PRECONDITION "no CUDA device" when CudaDeviceCount() is 0, INVALID_ARGUMENT for a
// device_index out of range. The backend's models run on that device; each model owns its own
// streams, cuBLASLt handle and workspace. A model is not thread-safe: one caller at a time.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index,
                                                           const CudaBackendOptions& options);

// Pins an existing host mapping (e.g. the job region's memfd) for every CUDA context
// (cudaHostRegisterPortable), so that TrainStep's host-to-device copies out of it are true
// asynchronous DMA. Call UnregisterHostRegion before unmapping (or hold a PinnedHostRegion).
// FAILED_PRECONDITION without a device; INTERNAL with the CUDA error otherwise.
absl::Status RegisterHostRegion(void* ptr, size_t bytes);
absl::Status UnregisterHostRegion(void* ptr);

// A host mapping pinned with RegisterHostRegion while this object holds it; the destructor (or
// Release) unregisters it. Declare it after the mapping's owner, so that the memory is
// unregistered before it is unmapped, and before the models that copy out of it, so that they go
// first (their destructors wait for their streams). Move-only.
class PinnedHostRegion {
 public:
  PinnedHostRegion() = default;
  ~PinnedHostRegion() { (void)Release(); }
  PinnedHostRegion(PinnedHostRegion&& other) noexcept;
  PinnedHostRegion& operator=(PinnedHostRegion&& other) noexcept;
  PinnedHostRegion(const PinnedHostRegion&) = delete;
  PinnedHostRegion& operator=(const PinnedHostRegion&) = delete;

  // Pins [ptr, ptr + bytes) (releasing what this object held before). Errors as
  // RegisterHostRegion's; nothing is held after one.
  absl::Status Register(void* ptr, size_t bytes);
  // Unregisters the mapping now (no-op when nothing is held).
  absl::Status Release();
  bool pinned() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace stoker

#endif  // STOKER_ENGINE_CUDA_CUDA_BACKEND_H_
