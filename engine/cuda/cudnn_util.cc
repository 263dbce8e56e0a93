#include "engine/cuda/cudnn_util.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace stoker::cuda {
namespace {

// Tensor cores are what 16-bit convolutions are for; fp32 keeps plain FMA math (no TF32).
bool MathTypeAllowed(DType type, cudnnMathType_t math) {
  if (type != DType::kF32) return true;
  return math == CUDNN_DEFAULT_MATH || math == CUDNN_FMA_MATH;
}

// fp32 convolutions run only GEMM-family algorithms, whose results differ from the cpu's by
// summation order alone (~1e-6). Winograd and FFT transform the data and lose several bits,
// errors near the tests' 1e-4 tolerance (and not what fp32 promises a user). 16-bit types take
// whatever is fastest: their own rounding dwarfs the algorithm's.
bool AlgorithmAllowed(DType type, cudnnConvolutionFwdAlgo_t algo) {
  return type != DType::kF32 || algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
}
bool AlgorithmAllowed(DType type, cudnnConvolutionBwdDataAlgo_t algo) {
  return type != DType::kF32 || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool AlgorithmAllowed(DType type, cudnnConvolutionBwdFilterAlgo_t algo) {
  return type != DType::kF32 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
}

// The first (fastest) usable result, preferring deterministic ones when asked; -1 when none.
template <typename Perf>
int PickAlgorithm(const Perf* results, int count, DType type, size_t max_workspace_bytes,
                  bool prefer_deterministic) {
  int fallback = -1;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > max_workspace_bytes ||
        !MathTypeAllowed(type, r.mathType) || !AlgorithmAllowed(type, r.algo)) {
      continue;
    }
    if (!prefer_deterministic || r.determinism == CUDNN_DETERMINISTIC) return i;
    if (fallback < 0) fallback = i;
  }
  return fallback;
}

absl::Status NoAlgorithm(const char* direction, const ConvolutionShape& s) {
  return absl::InternalError(absl::StrCat(
      "cuDNN offers no ", direction, " algorithm for a ", s.kernel, "x", s.kernel,
      " convolution of [", s.batch, ", ", s.in_channels, ", ", s.height, ", ", s.width, "] to ",
      s.out_channels, " channels (stride ", s.stride, ", padding ", s.padding, ")"));
}

// The math type a direction runs with: fp32 always FMA; otherwise the algorithm's own.
cudnnMathType_t RunMathType(DType type, cudnnMathType_t chosen) {
  return type == DType::kF32 ? CUDNN_FMA_MATH : chosen;
}

absl::Status SetUpConvolution(ConvolutionDescriptor& conv, const ConvolutionShape& s) {
  if (absl::Status status = conv.Create(); !status.ok()) return status;
  STOKER_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolution2dDescriptor(conv.get(), s.padding, s.padding, s.stride, s.stride, 1, 1,
                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
      conv.get(), s.type == DType::kF32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudnnError(cudnnStatus_t status, const char* call, const char* file, int line) {
  const std::string message =
      absl::StrCat(file, ":", line, ": ", call, " failed: cuDNN status ", static_cast<int>(status),
                   ": ", cudnnGetErrorString(status));
  if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

cudnnDataType_t CudnnType(DType type) {
  switch (type) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kBf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF16:
      return CUDNN_DATA_HALF;
  }
  return CUDNN_DATA_FLOAT;
}

absl::StatusOr<TensorDescriptor> MakeTensorDescriptor(DType type, int n, int c, int h, int w) {
  TensorDescriptor descriptor;
  if (absl::Status s = descriptor.Create(); !s.ok()) return s;
  STOKER_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(descriptor.get(), CUDNN_TENSOR_NCHW, CudnnType(type), n, c, h, w));
  return descriptor;
}

absl::StatusOr<ConvolutionPlan> PlanConvolution(cudnnHandle_t handle,
                                                cudnnFilterDescriptor_t filter,
                                                const ConvolutionShape& s,
                                                size_t max_workspace_bytes) {
  ConvolutionPlan plan;
  absl::StatusOr<TensorDescriptor> x =
      MakeTensorDescriptor(s.type, s.batch, s.in_channels, s.height, s.width);
  if (!x.ok()) return x.status();
  plan.x = *std::move(x);
  absl::StatusOr<TensorDescriptor> y =
      MakeTensorDescriptor(s.type, s.batch, s.out_channels, s.out_height, s.out_width);
  if (!y.ok()) return y.status();
  plan.y = *std::move(y);
  for (ConvolutionDescriptor* conv : {&plan.forward, &plan.backward_data, &plan.backward_filter}) {
    if (absl::Status status = SetUpConvolution(*conv, s); !status.ok()) return status;
  }

  int n = 0, c = 0, h = 0, w = 0;
  STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(
      plan.forward.get(), plan.x.get(), filter, &n, &c, &h, &w));
  if (n != s.batch || c != s.out_channels || h != s.out_height || w != s.out_width) {
    return absl::InternalError(absl::StrCat(
        "cuDNN computes a convolution output of [", n, ", ", c, ", ", h, ", ", w, "]; expected [",
        s.batch, ", ", s.out_channels, ", ", s.out_height, ", ", s.out_width, "]"));
  }

  // Forward.
  {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, plan.x.get(), filter, plan.forward.get(), plan.y.get(),
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results));
    const int pick = PickAlgorithm(results, count, s.type, max_workspace_bytes, false);
    if (pick < 0) return NoAlgorithm("forward", s);
    plan.forward_algo = results[pick].algo;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        plan.forward.get(), RunMathType(s.type, results[pick].mathType)));
    size_t bytes = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardWorkspaceSize(
        handle, plan.x.get(), filter, plan.forward.get(), plan.y.get(), plan.forward_algo, &bytes));
    plan.workspace_bytes = std::max({plan.workspace_bytes, bytes, results[pick].memory});
  }
  // Backward data (dx from dy and w), only when the layer's input gradient is needed.
  if (s.needs_backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, filter, plan.y.get(), plan.backward_data.get(), plan.x.get(),
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results));
    const int pick = PickAlgorithm(results, count, s.type, max_workspace_bytes, true);
    if (pick < 0) return NoAlgorithm("backward-data", s);
    plan.backward_data_algo = results[pick].algo;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        plan.backward_data.get(), RunMathType(s.type, results[pick].mathType)));
    size_t bytes = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardDataWorkspaceSize(
        handle, filter, plan.y.get(), plan.backward_data.get(), plan.x.get(),
        plan.backward_data_algo, &bytes));
    plan.workspace_bytes = std::max({plan.workspace_bytes, bytes, results[pick].memory});
  }
  // Backward filter (dw from x and dy).
  {
    cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, plan.x.get(), plan.y.get(), plan.backward_filter.get(), filter,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results));
    const int pick = PickAlgorithm(results, count, s.type, max_workspace_bytes, true);
    if (pick < 0) return NoAlgorithm("backward-filter", s);
    plan.backward_filter_algo = results[pick].algo;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        plan.backward_filter.get(), RunMathType(s.type, results[pick].mathType)));
    size_t bytes = 0;
    STOKER_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        handle, plan.x.get(), plan.y.get(), plan.backward_filter.get(), filter,
        plan.backward_filter_algo, &bytes));
    plan.workspace_bytes = std::max({plan.workspace_bytes, bytes, results[pick].memory});
  }
  return plan;
}

}  // namespace stoker::cuda
