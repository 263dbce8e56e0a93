// Per-model device resources: the compute and copy streams, the cuBLASLt handle and its
// preallocated workspace, and owning wrappers for device and pinned host memory.
#ifndef STOKER_ENGINE_CUDA_CUDA_CONTEXT_H_
#define STOKER_ENGINE_CUDA_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stoker::cuda {

// cudaMalloc'd memory (256-byte aligned, as cuBLASLt's default alignment preferences assume),
// freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // RESOURCE_EXHAUSTED when the device is out of memory, INTERNAL for other CUDA errors.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The streams, library handle and workspace one model uses. Created on `device`, which it makes
// current; callers make it current again (Activate) before each use from another thread.
class DeviceContext {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceContext>> Create(int device, size_t workspace_bytes);
  // Waits for both streams, then releases everything.
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  absl::Status Activate() const;
  int device() const { return device_; }
  // Runs forward/backward/optimizer work.
  cudaStream_t compute_stream() const { return compute_stream_; }
  // Moves batches host->device; ordered against compute by events, never by host waits.
  cudaStream_t copy_stream() const { return copy_stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_.get(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  explicit DeviceContext(int device) : device_(device) {}
  int device_;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace stoker::cuda

// Allocates `bytes` of device memory into the DeviceBuffer `target`, or returns the allocation's
// error from the enclosing function (absl::Status or StatusOr).
#define STOKER_ASSIGN_BUFFER(target, bytes)                       \
  do {                                                            \
    absl::StatusOr<::stoker::cuda::DeviceBuffer> stoker_buffer_ = \
        ::stoker::cuda::DeviceBuffer::Allocate(bytes);            \
    if (!stoker_buffer_.ok()) return stoker_buffer_.status();     \
    (target) = *std::move(stoker_buffer_);                        \
  } while (0)

#endif  // STOKER_ENGINE_CUDA_CUDA_CONTEXT_H_
