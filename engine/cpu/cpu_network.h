// The oneDNN implementation of a layered network Model (NetworkConfig; see backend.h).
//
// Activations are NHWC (or [N, features]; the input NCHW unless C = 1) in the compute type: f32
// for fp32 and fp16, bf16 for bf16; the logits are f32. oneDNN picks the weights' layouts
// (format_tag::any) for convolution and inner product; the optimizer updates the fp32 master
// weights in PyTorch's layout and then writes the copies the primitives read (converting to bf16
// on the way): tensors of up to 1M values by precomputed index gathers, all in one parallel region
// (and the blocked weight gradients back to PyTorch's layout by gathers on the calling thread),
// larger ones by oneDNN reorders. A bf16 BatchNorm whose channels oneDNN has no bf16 jit kernel
// for (not a multiple of 16) runs the f32 kernel on f32 copies of its activations.
//
// fp16: this CPU's oneDNN has no f16 convolution or matmul, so fp16 is emulated as fp16 storage
// with fp32 compute: weights, activations and activation gradients are rounded to fp16 values
// (round to nearest even, overflow to inf) wherever fp16 storage would hold them, and kept in
// fp32 buffers; gradients are computed on the loss times a dynamic loss scale (LossScaleConfig),
// and a step whose gradients are not finite is skipped.
//
// The layers run as a flattened graph: a residual block opens up into its main branch, its
// shortcut and a sum (oneDNN binary add with the ReLU fused as a post-op; GELU after it on the
// kept sum); in backward the sum's gradient goes to both branches (a copy for a projection
// shortcut) and the block input's gradient is the main branch's plus the shortcut's (a binary
// add). BatchNorm2d/1d are oneDNN batch normalisation (scale and shift f32 in every precision,
// statistics f32): TrainStep normalises by the batch's statistics and then updates the running
// ones on the host as PyTorch does; Evaluate runs the inference primitive on the running ones.
// A training batch that gives a BatchNorm one value per channel (batch 1 into a BatchNorm1d, or N
// x H x W = 1 into a BatchNorm2d) is refused before anything runs, as PyTorch refuses it:
// INVALID_ARGUMENT naming the layer ("batchnorm1d layers.4: expected more than 1 value per channel
// when training, ..."); weights, statistics and counters stay as they were. Evaluate takes it.
// AvgPool2d is pooling_avg_include_padding, global average pooling a pooling over the whole plane.
// Weight decay applies to Conv2d and Linear weights only; BatchNorm's buffers travel with
// Parameters() and are never updated by the optimizer.
//
// Primitives are built once per batch size: max_batch at creation, a few partial sizes on first
// use. Not thread-safe: one caller at a time per model.
//
// Data-parallel training (SetGradientReducer): the loss gradient is multiplied by
// loss scale x LocalShare() in the one multiply that enters backward. Backward hands the reducer
// each node's trained gradients as soon as that node's backward-weights primitive (and the reorder
// of oneDNN's blocked weight gradient into PyTorch's layout, run right after it) has written them:
// nodes last to first, bias before weight (BatchNorm beta before gamma), i.e. exactly the reverse
// of Parameters()' trained tensors; BatchNorm's buffers are never passed. The test hook's value is
// added before the reducer sees params_[0]'s gradient. After Finish() the fp16 finiteness check and
// unscale, clipping and the optimizer run on the sums as alone, so every rank takes the same
// decision. BatchNorm's running statistics are updated only once the step can no longer fail: a
// failed Finish() (or oneDNN error) leaves weights, optimizer state, running statistics, loss scale
// and step counters as they were. The running statistics are each rank's own (from its local
// batch, never reduced, as PyTorch DDP without SyncBatchNorm); rank 0's are the checkpoint's.
// TrainStepWithoutSamples hands zeroed gradients over in the same order, runs no forward pass (the
// running statistics stay), and still counts the step in "train_step", so every rank's dropout
// masks stay at the same step. Dropout masks hash (seed, step, layer, index within the local
// batch): ranks with the same seed draw the same masks for their j-th local samples.
#ifndef STOKER_ENGINE_CPU_CPU_NETWORK_H_
#define STOKER_ENGINE_CPU_CPU_NETWORK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace stoker {

// Parameters and optimizer state named by `naming` (ParameterNaming::kMlp for an MLP that
// Backend::CreateMlp routes here). INVALID_ARGUMENT for a bad config (ValidateNetworkConfig),
// RESOURCE_EXHAUSTED if the buffers cannot be allocated, INTERNAL if oneDNN cannot build a
// primitive.
absl::StatusOr<std::unique_ptr<Model>> CreateCpuNetwork(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);

}  // namespace stoker

#endif  // STOKER_ENGINE_CPU_CPU_NETWORK_H_
