// Checked CUDA and cuBLAS calls for host code that returns absl::Status: every failure becomes an
// INTERNAL status naming the call, its file:line and the library's error string.
#ifndef STOKER_ENGINE_CUDA_CUDA_CHECK_H_
#define STOKER_ENGINE_CUDA_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/status_macros.h"  // STOKER_RETURN_IF_ERROR

namespace stoker::cuda {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace stoker::cuda

// Returns from the enclosing function (absl::Status or StatusOr) when the call fails.
#define STOKER_CUDA_RETURN_IF_ERROR(call)                                              \
  do {                                                                                 \
    const cudaError_t stoker_cuda_error_ = (call);                                     \
    if (stoker_cuda_error_ != cudaSuccess) {                                           \
      return ::stoker::cuda::CudaError(stoker_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#define STOKER_CUBLAS_RETURN_IF_ERROR(call)                                                 \
  do {                                                                                      \
    const cublasStatus_t stoker_cublas_status_ = (call);                                    \
    if (stoker_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                   \
      return ::stoker::cuda::CublasError(stoker_cublas_status_, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#endif  // STOKER_ENGINE_CUDA_CUDA_CHECK_H_
