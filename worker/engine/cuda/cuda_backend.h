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
#ifndef STOKER_WORKER_ENGINE_CUDA_CUDA_BACKEND_H_
#define STOKER_WORKER_ENGINE_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/backend.h"

namespace stoker {

// Knobs beyond MlpConfig (whose LossScaleConfig drives fp16 loss scaling). The defaults are what a
// trainer wants; tests change them.
struct CudaBackendOptions {
  // Fuse bias, ReLU, ReLU backward and bias gradients into the cuBLASLt GEMMs (epilogues). When
  // false, or when cuBLASLt has no fused algorithm for a shape, plain GEMMs plus small kernels do
  // the same work; both paths give the same results up to rounding.
  bool fused_epilogues = true;
  // cuBLASLt workspace, allocated once per model (32 MiB is what Hopper GEMMs ask for).
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // Capture each TrainStep's device work (everything after the batch copy) in a CUDA graph, one
  // per batch size and staging buffer, and replay it: one launch per step instead of one per
  // kernel. The learning rate travels in device memory, so a graph serves every step. When
  // false, or if a capture fails, the same work is enqueued kernel by kernel; the results are
  // bit-identical either way.
  bool cuda_graphs = true;
};

// Number of CUDA devices the runtime sees; 0 on any error (no driver, no device).
int CudaDeviceCount();

// FAILED_PRECONDITION "no CUDA device" when CudaDeviceCount() is 0, INVALID_ARGUMENT for a
// device_index out of range. The backend's models run on that device; each model owns its own
// streams, cuBLASLt handle and workspace. A model is not thread-safe: one caller at a time.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_index,
                                                           const CudaBackendOptions& options);

// Pins an existing host mapping (e.g. the ring buffer's memfd region) for every CUDA context
// (cudaHostRegisterPortable), so that TrainStep's host-to-device copies out of it are true
// asynchronous DMA. Call UnregisterHostRegion before unmapping. FAILED_PRECONDITION without a
// device; INTERNAL with the CUDA error otherwise.
absl::Status RegisterHostRegion(void* ptr, size_t bytes);
absl::Status UnregisterHostRegion(void* ptr);

}  // namespace stoker

#endif  // STOKER_WORKER_ENGINE_CUDA_CUDA_BACKEND_H_
