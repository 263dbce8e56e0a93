#include "engine/cuda/cuda_context.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"

namespace stoker::cuda {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  // A failed call leaves the error in the runtime's per-thread slot; clear it so that the next
  // cudaGetLastError after a launch reports that launch, not this call.
  cudaGetLastError();
  const std::string message =
      absl::StrCat(file, ":", line, ": ", call, " failed: ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  const std::string message =
      absl::StrCat(file, ":", line, ": ", call, " failed: ", cublasLtGetStatusName(status), ": ",
                   cublasLtGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  STOKER_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.ptr_, bytes));
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Create(int device,
                                                                     size_t workspace_bytes) {
  std::unique_ptr<DeviceContext> context(new DeviceContext(device));
  STOKER_RETURN_IF_ERROR(context->Activate());
  // Non-blocking: neither stream synchronises with the legacy default stream, so nothing another
  // library does there can stall a step.
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&context->compute_stream_, cudaStreamNonBlocking));
  STOKER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&context->copy_stream_, cudaStreamNonBlocking));
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&context->lt_));
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(workspace_bytes);
  if (!workspace.ok()) return workspace.status();
  context->workspace_ = *std::move(workspace);
  return context;
}

DeviceContext::~DeviceContext() {
  cudaSetDevice(device_);
  if (compute_stream_ != nullptr) cudaStreamSynchronize(compute_stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (compute_stream_ != nullptr) cudaStreamDestroy(compute_stream_);
}

absl::Status DeviceContext::Activate() const {
  STOKER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return absl::OkStatus();
}

}  // namespace stoker::cuda
