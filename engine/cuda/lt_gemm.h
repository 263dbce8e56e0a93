// The one cuBLASLt wrapper every GEMM of the cuda backend goes through.
//
// Column-major, as cuBLASLt sees memory: D[m, n] = op(A)[m, k] * op(B)[k, n] (+ epilogue), alpha 1,
// beta 0, fp32 accumulation (CUBLAS_COMPUTE_32F: for fp32 inputs this also keeps TF32 off, so fp32
// results match the CPU reference to ~1e-6). Matrices are tightly packed: the leading dimension of
// each stored matrix is its stored row count. A row-major [rows, cols] buffer is a column-major
// [cols, rows] matrix; the MLP code spells out each mapping where it builds a GEMM.
#ifndef STOKER_ENGINE_CUDA_LT_GEMM_H_
#define STOKER_ENGINE_CUDA_LT_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/dtype.h"

namespace stoker::cuda {

struct GemmShape {
  int m = 0;
  int n = 0;
  int k = 0;
  bool transpose_a = false;  // A is stored [k, m] and used transposed
  bool transpose_b = false;  // B is stored [n, k] and used transposed
  DType a_type = DType::kF32;
  DType b_type = DType::kF32;
  DType d_type = DType::kF32;
};

// The bias and the bias gradient are vectors of D's type (shape.d_type): cuBLASLt's documented
// rule (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE and _BIAS_POINTER: "same type as the
// elements of output matrix (Dtype)", the IMMA and fp8 kernels excepted; bias gradients "the
// same type as the output elements"). A bf16 D takes a bf16 bias and writes a bf16 bias gradient.
enum class GemmEpilogue {
  kNone,
  kBias,         // D = AB + bias (bias: [m], broadcast over columns)
  kReluAuxBias,  // D = relu(AB + bias); bit mask of D > 0 written to `aux`
  kDReluBGrad,   // D = AB * mask(aux); bias = row sums of D ([m])
  kBGradB,       // D = AB; bias = column sums of op(B) over k ([n])
};

struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::kNone;
  // Bias (kBias, kReluAuxBias) or bias gradient output (kDReluBGrad, kBGradB), in D's type. Fixed
  // at creation: the plans bind buffers that live as long as the model.
  void* bias = nullptr;
  // ReLU bit mask, one bit per element of D, `aux_ld` bits per column (a multiple of 128).
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// ReLU bit-mask leading dimension (in bits) for a D with `rows` rows: cuBLASLt wants a multiple
// of 128.
inline int64_t ReluMaskLd(int rows) { return (static_cast<int64_t>(rows) + 127) / 128 * 128; }

// The three GEMMs of a Linear layer (in -> out features) on `batch` rows, as both cuda models
// lay them out: row-major [rows, cols] buffers are column-major [cols, rows] to cuBLASLt, so
//   forward      Y^T[out, B]  = W[out, in] X^T[in, B]     (W column-major [in, out], transposed)
//   weight_grad  dW^T[in, out] = X^T[in, B] dY[B, out]    (dY column-major [out, B], transposed;
//                                                          written in fp32)
//   input_grad   dX^T[in, B]  = W^T[in, out] dY^T[out, B]
// Inputs, weights and the input gradient are in `type`; the forward output in `forward_out`.
struct LinearGemmShapes {
  GemmShape forward;
  GemmShape weight_grad;
  GemmShape input_grad;
};
LinearGemmShapes LinearShapes(int in, int out, int batch, DType type, DType forward_out);

class LtGemm;

// LtGemm::Create with `epilogue` when `try_fused` and the epilogue is not kNone; when that is off,
// or the fused GEMM cannot be made for any reason but memory (RESOURCE_EXHAUSTED is returned), a
// plain GEMM, the caller then doing the epilogue's work with its own kernels. *fused says which
// one it got; when a fused GEMM was tried and refused, *why_not_fused says why (else it is
// cleared), for the caller to log.
absl::StatusOr<std::unique_ptr<LtGemm>> CreateGemmPreferFused(
    cublasLtHandle_t lt, const GemmShape& shape, const GemmEpilogueArgs& epilogue,
    size_t workspace_bytes, bool try_fused, bool* fused, std::string* why_not_fused);

class LtGemm {
 public:
  // Builds the descriptors and asks cuBLASLt's heuristic for the best algorithm that fits in
  // `workspace_bytes`. UNIMPLEMENTED, naming cuBLASLt's status, when the heuristic fails or finds
  // no algorithm for this combination (callers then fall back to kNone plus their own kernels);
  // RESOURCE_EXHAUSTED when cuBLASLt runs out of memory; INVALID_ARGUMENT for a bad shape.
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create(cublasLtHandle_t lt, const GemmShape& shape,
                                                        const GemmEpilogueArgs& epilogue,
                                                        size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues D = op(A) op(B) (+ epilogue) on `stream`. Pointers must be 16-byte aligned (cudaMalloc
  // gives 256) and stay valid until the stream passes this point.
  absl::Status Run(cublasLtHandle_t lt, const void* a, const void* b, void* d, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) const;

  const GemmShape& shape() const { return shape_; }
  GemmEpilogue epilogue() const { return epilogue_; }
  // 2 m n k.
  double Flops() const { return 2.0 * shape_.m * shape_.n * shape_.k; }

 private:
  LtGemm() = default;
  GemmShape shape_;
  GemmEpilogue epilogue_ = GemmEpilogue::kNone;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr;
  cublasLtMatrixLayout_t b_layout_ = nullptr;
  cublasLtMatrixLayout_t d_layout_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  size_t algo_workspace_bytes_ = 0;
};

}  // namespace stoker::cuda

#endif  // STOKER_ENGINE_CUDA_LT_GEMM_H_
