// cuDNN for the cuda network: checked calls (a status naming the call, file:line and cuDNN's
// message), owning wrappers for the handle and descriptors, and the choice of convolution
// algorithms. Only built when cuDNN is found (STOKER_HAVE_CUDNN).
#ifndef STOKER_ENGINE_CUDA_CUDNN_UTIL_H_
#define STOKER_ENGINE_CUDA_CUDNN_UTIL_H_

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/dtype.h"

namespace stoker::cuda {

// RESOURCE_EXHAUSTED when cuDNN could not allocate, INTERNAL otherwise.
absl::Status CudnnError(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace stoker::cuda

#define STOKER_CUDNN_RETURN_IF_ERROR(call)                                                \
  do {                                                                                    \
    const cudnnStatus_t stoker_cudnn_status_ = (call);                                    \
    if (stoker_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                   \
      return ::stoker::cuda::CudnnError(stoker_cudnn_status_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)

namespace stoker::cuda {

// A cuDNN object (handle or descriptor) destroyed with its owner. Move-only. `Traits` has
// `Handle`, `kCreateName`, `Create(Handle*)` and `Destroy(Handle)`.
template <typename Traits>
class CudnnObject {
 public:
  using Handle = typename Traits::Handle;
  CudnnObject() = default;
  ~CudnnObject() {
    if (handle_ != nullptr) Traits::Destroy(handle_);
  }
  CudnnObject(CudnnObject&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CudnnObject& operator=(CudnnObject&& other) noexcept {
    if (this != &other) {
      if (handle_ != nullptr) Traits::Destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  CudnnObject(const CudnnObject&) = delete;
  CudnnObject& operator=(const CudnnObject&) = delete;

  // Creates the object (once).
  absl::Status Create() {
    if (handle_ != nullptr) return absl::OkStatus();
    const cudnnStatus_t status = Traits::Create(&handle_);
    if (status != CUDNN_STATUS_SUCCESS) {
      handle_ = nullptr;
      return CudnnError(status, Traits::kCreateName, __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

struct CudnnHandleTraits {
  using Handle = cudnnHandle_t;
  static constexpr const char* kCreateName = "cudnnCreate";
  static cudnnStatus_t Create(Handle* handle) { return cudnnCreate(handle); }
  static void Destroy(Handle handle) { cudnnDestroy(handle); }
};
struct TensorDescriptorTraits {
  using Handle = cudnnTensorDescriptor_t;
  static constexpr const char* kCreateName = "cudnnCreateTensorDescriptor";
  static cudnnStatus_t Create(Handle* handle) { return cudnnCreateTensorDescriptor(handle); }
  static void Destroy(Handle handle) { cudnnDestroyTensorDescriptor(handle); }
};
struct FilterDescriptorTraits {
  using Handle = cudnnFilterDescriptor_t;
  static constexpr const char* kCreateName = "cudnnCreateFilterDescriptor";
  static cudnnStatus_t Create(Handle* handle) { return cudnnCreateFilterDescriptor(handle); }
  static void Destroy(Handle handle) { cudnnDestroyFilterDescriptor(handle); }
};
struct ConvolutionDescriptorTraits {
  using Handle = cudnnConvolutionDescriptor_t;
  static constexpr const char* kCreateName = "cudnnCreateConvolutionDescriptor";
  static cudnnStatus_t Create(Handle* handle) { return cudnnCreateConvolutionDescriptor(handle); }
  static void Destroy(Handle handle) { cudnnDestroyConvolutionDescriptor(handle); }
};
struct PoolingDescriptorTraits {
  using Handle = cudnnPoolingDescriptor_t;
  static constexpr const char* kCreateName = "cudnnCreatePoolingDescriptor";
  static cudnnStatus_t Create(Handle* handle) { return cudnnCreatePoolingDescriptor(handle); }
  static void Destroy(Handle handle) { cudnnDestroyPoolingDescriptor(handle); }
};

using CudnnHandle = CudnnObject<CudnnHandleTraits>;
using TensorDescriptor = CudnnObject<TensorDescriptorTraits>;
using FilterDescriptor = CudnnObject<FilterDescriptorTraits>;
using ConvolutionDescriptor = CudnnObject<ConvolutionDescriptorTraits>;
using PoolingDescriptor = CudnnObject<PoolingDescriptorTraits>;

cudnnDataType_t CudnnType(DType type);

// A created NCHW descriptor of `type`.
absl::StatusOr<TensorDescriptor> MakeTensorDescriptor(DType type, int n, int c, int h, int w);

// One convolution of a layer for one batch size: the descriptors and the algorithm of each
// direction. Each direction has its own convolution descriptor because the math type (tensor
// cores or not) goes with the algorithm chosen for it.
struct ConvolutionPlan {
  TensorDescriptor x;  // input [N, C, H, W]
  TensorDescriptor y;  // output [N, K, P, Q]
  ConvolutionDescriptor forward;
  ConvolutionDescriptor backward_data;
  ConvolutionDescriptor backward_filter;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t backward_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter_algo{};
  size_t workspace_bytes = 0;  // the most any of its three algorithms needs
};

struct ConvolutionShape {
  int batch = 0;
  int in_channels = 0;
  int height = 0;
  int width = 0;
  int out_channels = 0;
  int out_height = 0;
  int out_width = 0;
  int kernel = 0;
  int stride = 1;
  int padding = 0;
  DType type = DType::kF32;
  bool needs_backward_data = true;
};

// Builds the descriptors (cross-correlation, fp32 compute: the PSEUDO_HALF / PSEUDO_BFLOAT16
// configurations for 16-bit types) and picks, with cuDNN's heuristics (the *_v7 getters), the
// fastest algorithm of each direction that needs at most `max_workspace_bytes`, preferring
// deterministic ones for the backward passes. fp32 never uses tensor cores (no TF32) and only
// GEMM-family algorithms (forward IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM; backward ALGO_0,
// ALGO_1; no Winograd or FFT): results match the cpu to ~1e-6. INTERNAL when cuDNN offers no
// such algorithm; checks that cuDNN's output size is the expected one.
absl::StatusOr<ConvolutionPlan> PlanConvolution(cudnnHandle_t handle,
                                                cudnnFilterDescriptor_t filter,
                                                const ConvolutionShape& shape,
                                                size_t max_workspace_bytes);

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_CUDNN_UTIL_H_
