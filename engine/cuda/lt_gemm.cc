#include "engine/cuda/lt_gemm.h"

#include <library_types.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "engine/cuda/cuda_check.h"

namespace stoker::cuda {
namespace {

cudaDataType_t CudaType(DType type) {
  switch (type) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBf16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

cublasLtEpilogue_t LtEpilogue(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kReluAuxBias:
      return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case GemmEpilogue::kDReluBGrad:
      return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case GemmEpilogue::kBGradB:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* EpilogueName(GemmEpilogue kind) {
  static constexpr const char* kNames[] = {"none", "BIAS", "RELU_AUX_BIAS", "DRELU_BGRAD",
                                           "BGRADB"};
  return EnumName(kind, kNames, "?");
}

const char* DTypeName(DType type) {
  static constexpr const char* kNames[] = {"f32", "bf16", "f16"};
  return EnumName(type, kNames, "?");
}

template <typename T>
absl::Status SetDescAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                              const T& value) {
  STOKER_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create(cublasLtHandle_t lt, const GemmShape& shape,
                                                       const GemmEpilogueArgs& epilogue,
                                                       size_t workspace_bytes) {
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM dimensions must be > 0, got m=", shape.m,
                                                   " n=", shape.n, " k=", shape.k));
  }
  const bool needs_bias = epilogue.kind != GemmEpilogue::kNone;
  const bool needs_aux =
      epilogue.kind == GemmEpilogue::kReluAuxBias || epilogue.kind == GemmEpilogue::kDReluBGrad;
  if ((needs_bias && epilogue.bias == nullptr) ||
      (needs_aux &&
       (epilogue.aux == nullptr || epilogue.aux_ld < shape.m || epilogue.aux_ld % 128 != 0))) {
    return absl::InvalidArgumentError("GEMM epilogue is missing its bias or ReLU mask buffer");
  }

  std::unique_ptr<LtGemm> gemm(new LtGemm());
  gemm->shape_ = shape;
  gemm->epilogue_ = epilogue.kind;
  STOKER_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&gemm->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t transpose_a = shape.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t transpose_b = shape.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STOKER_RETURN_IF_ERROR(SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_TRANSA, transpose_a));
  STOKER_RETURN_IF_ERROR(SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_TRANSB, transpose_b));
  const uint32_t lt_epilogue = LtEpilogue(epilogue.kind);
  STOKER_RETURN_IF_ERROR(SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue));
  if (needs_bias) {
    // The documented rule (lt_gemm.h): the bias and the bias gradient are in D's type.
    const int32_t bias_type = CudaType(shape.d_type);
    STOKER_RETURN_IF_ERROR(
        SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type));
    void* bias = epilogue.bias;
    STOKER_RETURN_IF_ERROR(SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  }
  if (needs_aux) {
    void* aux = epilogue.aux;
    STOKER_RETURN_IF_ERROR(
        SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux));
    STOKER_RETURN_IF_ERROR(
        SetDescAttribute(gemm->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, epilogue.aux_ld));
  }

  // Stored shapes: op(A) is [m, k], so A is [k, m] when transposed; likewise B.
  const uint64_t a_rows = shape.transpose_a ? shape.k : shape.m;
  const uint64_t a_cols = shape.transpose_a ? shape.m : shape.k;
  const uint64_t b_rows = shape.transpose_b ? shape.n : shape.k;
  const uint64_t b_cols = shape.transpose_b ? shape.k : shape.n;
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &gemm->a_layout_, CudaType(shape.a_type), a_rows, a_cols, static_cast<int64_t>(a_rows)));
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &gemm->b_layout_, CudaType(shape.b_type), b_rows, b_cols, static_cast<int64_t>(b_rows)));
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&gemm->d_layout_, CudaType(shape.d_type),
                                                           shape.m, shape.n, shape.m));

  cublasLtMatmulPreference_t preference = nullptr;
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t max_workspace = workspace_bytes;
  const cublasStatus_t set_status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic_status =
      set_status != CUBLAS_STATUS_SUCCESS
          ? set_status
          : cublasLtMatmulAlgoGetHeuristic(lt, gemm->desc_, gemm->a_layout_, gemm->b_layout_,
                                           gemm->d_layout_, gemm->d_layout_, preference, 1, &result,
                                           &found);
  cublasLtMatmulPreferenceDestroy(preference);
  const std::string what =
      absl::StrCat("m=", shape.m, " n=", shape.n, " k=", shape.k, " types ",
                   DTypeName(shape.a_type), "/", DTypeName(shape.b_type), "->",
                   DTypeName(shape.d_type), " epilogue ", EpilogueName(epilogue.kind));
  if (heuristic_status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cublasLtMatmulAlgoGetHeuristic ran out of memory for ", what));
  }
  // Any other failure of the heuristic (NOT_SUPPORTED, INVALID_VALUE for a combination this
  // cuBLASLt does not take, ...) means "no algorithm here": callers fall back.
  if (heuristic_status != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic failed for ", what,
                                                 ": ", cublasLtGetStatusName(heuristic_status),
                                                 ": ", cublasLtGetStatusString(heuristic_status)));
  }
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for ", what,
        found == 0 ? std::string() : absl::StrCat(": ", cublasLtGetStatusName(result.state))));
  }
  gemm->algo_ = result.algo;
  gemm->algo_workspace_bytes_ = result.workspaceSize;
  return gemm;
}

LtGemm::~LtGemm() {
  if (d_layout_ != nullptr) cublasLtMatrixLayoutDestroy(d_layout_);
  if (b_layout_ != nullptr) cublasLtMatrixLayoutDestroy(b_layout_);
  if (a_layout_ != nullptr) cublasLtMatrixLayoutDestroy(a_layout_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::Status LtGemm::Run(cublasLtHandle_t lt, const void* a, const void* b, void* d,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) const {
  if (workspace_bytes < algo_workspace_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM algorithm needs ", algo_workspace_bytes_,
                                                   " workspace bytes, got ", workspace_bytes));
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  STOKER_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(lt, desc_, &alpha, a, a_layout_, b, b_layout_, &beta,
                                               d, d_layout_, d, d_layout_, &algo_, workspace,
                                               workspace_bytes, stream));
  return absl::OkStatus();
}

LinearGemmShapes LinearShapes(int in, int out, int batch, DType type, DType forward_out) {
  return {.forward = {.m = out,
                      .n = batch,
                      .k = in,
                      .transpose_a = true,
                      .transpose_b = false,
                      .a_type = type,
                      .b_type = type,
                      .d_type = forward_out},
          .weight_grad = {.m = in,
                          .n = out,
                          .k = batch,
                          .transpose_a = false,
                          .transpose_b = true,
                          .a_type = type,
                          .b_type = type,
                          .d_type = DType::kF32},
          .input_grad = {.m = in,
                         .n = batch,
                         .k = out,
                         .transpose_a = false,
                         .transpose_b = false,
                         .a_type = type,
                         .b_type = type,
                         .d_type = type}};
}

absl::StatusOr<std::unique_ptr<LtGemm>> CreateGemmPreferFused(
    cublasLtHandle_t lt, const GemmShape& shape, const GemmEpilogueArgs& epilogue,
    size_t workspace_bytes, bool try_fused, bool* fused, std::string* why_not_fused) {
  *fused = false;
  why_not_fused->clear();
  if (try_fused && epilogue.kind != GemmEpilogue::kNone) {
    absl::StatusOr<std::unique_ptr<LtGemm>> gemm =
        LtGemm::Create(lt, shape, epilogue, workspace_bytes);
    if (gemm.ok()) {
      *fused = true;
      return gemm;
    }
    // Out of memory is out of memory for the plain GEMM too; anything else (a refused descriptor
    // attribute, a failed heuristic, no algorithm) leaves the epilogue to the caller's kernels.
    if (absl::IsResourceExhausted(gemm.status())) return gemm.status();
    *why_not_fused = absl::StrCat("cuBLASLt epilogue ", EpilogueName(epilogue.kind),
                                  " not fused: ", gemm.status().message());
  }
  return LtGemm::Create(lt, shape, GemmEpilogueArgs{}, workspace_bytes);
}

}  // namespace stoker::cuda
