// The cuda implementation of a layered network Model (NetworkConfig; see backend.h), the twin of
// cpu_network.h: same parameters (names, PyTorch layouts, initialisation), same optimizer state,
// same math within rounding, so a checkpoint moves between the two backends.
//
// Layout: activations NCHW (or [N, features]) in the compute type (fp32, bf16 or fp16); the
// logits are fp32 (straight from a final Linear in fp32/bf16, converted otherwise). fp32 master
// weights; in bf16/fp16 the optimizer also writes the compute-type copy of each parameter: the
// layers read the weights' copies, and a fused Linear epilogue with a compute-type output adds
// the bias copy (cuBLASLt's rule, lt_gemm.h); other biases are read in fp32. Gradients of the
// parameters are fp32. GetCudaModelCounters counts fused and plain GEMMs (no CUDA graphs here).
//   Conv2d     cuDNN legacy convolution (fp32 compute: FLOAT, PSEUDO_BFLOAT16, PSEUDO_HALF
//              configurations; no TF32 and only GEMM-family algorithms in fp32), algorithms from
//              cuDNN's heuristics once per batch size, workspace allocated with the plan; bias
//              and its gradient by kernels. cuDNN writes 16-bit weight gradients in the compute
//              type; a kernel widens them. fp16 computes them unscaled (alpha = 1 / loss scale,
//              no overflow of a scaled dW) and the widening scales them back in fp32, so the
//              optimizer unscales every gradient alike, once.
//   MaxPool2d  cuDNN pooling (CUDNN_POOLING_MAX_DETERMINISTIC, padding ignored as in PyTorch),
//              or network_kernels' own when cuDNN refuses the data type.
//   Linear     cuBLASLt (LtGemm), with the bias / bias-gradient epilogues where available.
//   ReLU, GELU (exact erf), Dropout (the cpu's hash: identical masks), Flatten (an alias).
//   BatchNorm2d/1d  own kernels (vision_kernels.h): batch statistics (biased variance, fp32)
//              in TrainStep, the running ones in Evaluate; affine parameters and statistics fp32
//              in every precision. The running statistics (unbiased variance, momentum) and
//              num_batches_tracked are updated once the step can no longer fail, after a
//              reducer's Finish; they travel in Parameters() with PyTorch's names. TrainStep
//              refuses (INVALID_ARGUMENT, naming the layer) a batch that gives a BatchNorm one
//              value per channel, as PyTorch and the cpu network do.
//   AvgPool2d (count_include_pad, floor), global average pooling, residual sums: own kernels
//              (vision_kernels.h).
//   Conv2d and Linear with `bias: false` have no bias tensor, add and differentiate none.
// The layers run as a flattened graph, the cpu network's own (cuda_network_internal.h, Graph): a
// residual block opens up into a fork, its main branch, its shortcut and a sum with the block's
// activation; backward writes the sum's gradient to both branches and adds the shortcut's input
// gradient into the main branch's. Weight decay applies to Conv2d and Linear weights only.
// Softmax cross-entropy (with label smoothing), the fp16 finite check and GradScaler update,
// clipping and the SGD / AdamW steps are kernels (network_kernels.h, mlp_kernels.h).
//
// One TrainStep, as CudaMlp: the copy stream moves the batch into one of two staging buffers
// (events order it against the compute stream), the compute stream normalises, runs forward,
// the loss, backward, [fp16: finite check], [clipping: norm and coefficient], the optimizer,
// [fp16: loss-scale update], then copies the step state to pinned memory; the one host wait is
// on that copy. Not thread-safe: one caller at a time per model.
//
// Data-parallel training (SetGradientReducer, GradientReducer in backend.h): the loss gradient is
// multiplied by loss scale x LocalShare(); backward hands each node's trained gradients (fp32
// device pointers on this model's device) to GradientReady right after it has enqueued, on the
// compute stream (Model::device_stream), the work that finalises them, in the cpu network's
// order (nodes last to first, bias before weight, BatchNorm beta before gamma: the reverse of
// Parameters()' trained tensors). The reducer orders its reads after that stream, and its sums
// must be complete, or ordered before the compute stream's later work, when Finish() returns
// (comm/nccl_reducer.h does both with events). A failed Finish() leaves weights, optimizer state,
// running statistics and counters as they were. TrainStepWithoutSamples hands zeroed gradients
// over in the same order.
#ifndef STOKER_ENGINE_CUDA_CUDA_NETWORK_H_
#define STOKER_ENGINE_CUDA_CUDA_NETWORK_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_backend_options.h"
#include "engine/model_shapes.h"

namespace stoker {

// Every layer kind of NetworkConfig. Parameters and optimizer state named by `naming`
// (ParameterNaming::kMlp for an MLP that Backend::CreateMlp routes here). INVALID_ARGUMENT for a
// bad config (ValidateNetworkConfig) or one too large for 32-bit tensor sizes; RESOURCE_EXHAUSTED
// if device memory runs out; INTERNAL naming the failing call for other CUDA/cuDNN/cuBLASLt
// failures (e.g. no cuDNN algorithm for a convolution).
absl::StatusOr<std::unique_ptr<Model>> CreateCudaNetwork(
    const NetworkConfig& config, int device, const CudaBackendOptions& options,
    ParameterNaming naming = ParameterNaming::kByLayer);

}  // namespace stoker

#endif  // STOKER_ENGINE_CUDA_CUDA_NETWORK_H_
