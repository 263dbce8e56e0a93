// The cuda implementation of the MLP Model (see backend.h for the contract).
//
// Layout: parameters stay [out, in] row-major, fp32 masters as Parameters() reports them; in
// bf16/fp16 the optimizer writes a low-precision copy of each weight matrix as it updates the
// master, and activations and output gradients are in the compute type. Row-major [rows, cols]
// buffers are column-major [cols, rows] matrices to cuBLASLt, so every layer is, per step:
//   forward  Y^T[out, B]  = W[out, in] X^T[in, B]        + bias, ReLU (epilogue RELU_AUX_BIAS,
//            which also writes the ReLU bit mask backward needs; BIAS for the logits, in fp32)
//   weights  dW^T[in, out] = X^T[in, B] dY[B, out]       (BGRADB gives the last layer's bias grad)
//   input    dX^T[in, B]  = W^T[in, out] dY^T[out, B]    (DRELU_BGRAD: ReLU backward of the layer
//            below through its mask, and its bias gradient)
// When cuBLASLt has no fused algorithm for a shape (or CudaBackendOptions::fused_epilogues is
// false), that GEMM runs plain and a small kernel does the epilogue's work (the reason is
// logged). Epilogue biases are in the GEMM output's type (lt_gemm.h): bf16/fp16 hidden layers
// keep a compute-type copy of their bias, and widen the fused bias gradient to fp32; fp16 sums
// its bias gradients in fp32 with its own kernel instead (a fused fp16 sum could overflow).
//
// One TrainStep: the copy stream copies the batch (uint8 pixels or float features, and labels)
// into one of two staging buffers, after the compute stream has released that buffer (event);
// the compute stream waits for the copy (event), then runs the step body: reset the step state,
// load the learning rate into device memory, normalise, forward, softmax cross-entropy,
// backward, [fp16: finite check], one multi-tensor SGD launch (reading the learning rate from
// device memory), [fp16: loss-scale update], and the copy of the 32-byte step state (loss,
// overflow flag, scale) to pinned host memory. The body is captured once per batch size,
// staging buffer and input kind as a CUDA graph and replayed with one launch
// (CudaBackendOptions::cuda_graphs; kernel by kernel when off or when a capture fails, which is
// logged). The first step of each batch size and input kind runs kernel by kernel: a warm-up, so
// that lazy module loading and cuBLASLt's first use of each GEMM happen outside any capture.
// GetCudaModelCounters reports fused GEMMs, replays and eager steps. The only
// host wait is one cudaStreamSynchronize at the end of the step: StepResult needs the loss.
// Plans (GEMM descriptors, algorithms, graphs) are built once per batch size: max_batch at
// creation, a few others on first use.
//
// Data-parallel training (SetGradientReducer), the cpu MLP's contract on device buffers: the
// loss gradient is multiplied by the reducer's LocalShare() (folded into the cross-entropy
// kernel's loss-scale multiplier for that kernel), and each gradient (a device pointer to fp32)
// goes to GradientReady right after the work that finalises it is enqueued on the compute stream
// (Model::device_stream), layers last to first, bias then weight: index 2k is layer (L-1-k)'s
// bias, 2k+1 its weight. Then Finish(), and only if it succeeds [fp16: the finite check], the SGD
// update [and the loss-scale update]; a failed Finish() returns its error with weights and
// momentum untouched. Such steps run kernel by kernel, never as a CUDA graph (logged once as a
// fallback, counted in eager_steps). TrainStepWithoutSamples hands zeroed gradients over in the
// same order.
#ifndef STOKER_ENGINE_CUDA_CUDA_MLP_H_
#define STOKER_ENGINE_CUDA_CUDA_MLP_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_backend_options.h"
#include "engine/model.h"
#include "engine/model_shapes.h"

namespace stoker {

// INVALID_ARGUMENT for a bad config (ValidateMlpConfig); RESOURCE_EXHAUSTED if device memory runs
// out; INTERNAL for other CUDA/cuBLASLt failures.
absl::StatusOr<std::unique_ptr<Model>> CreateCudaMlp(const MlpConfig& config, int device,
                                                     const CudaBackendOptions& options);

}  // namespace stoker

#endif  // STOKER_ENGINE_CUDA_CUDA_MLP_H_
