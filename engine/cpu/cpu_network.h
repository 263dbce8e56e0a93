// The oneDNN implementation of a layered network Model (NetworkConfig; see backend.h).
//
// Activations are NHWC (or [N, features]; the input NCHW unless C = 1) in the compute type: f32
// for fp32 and fp16, bf16 for bf16; the logits are f32. oneDNN picks the weights' layouts
// (format_tag::any) for convolution and inner product; the optimizer updates the fp32 master
// weights in PyTorch's layout and a reorder then writes the copies the primitives read (converting
// to bf16 on the way).
//
// fp16: this CPU's oneDNN has no f16 convolution or matmul, so fp16 is emulated as fp16 storage
// with fp32 compute: weights, activations and activation gradients are rounded to fp16 values
// (round to nearest even, overflow to inf) wherever fp16 storage would hold them, and kept in
// fp32 buffers; gradients are computed on the loss times a dynamic loss scale (LossScaleConfig),
// and a step whose gradients are not finite is skipped.
//
// Primitives are built once per batch size: max_batch at creation, a few partial sizes on first
// use. Not thread-safe: one caller at a time per model.
#ifndef STOKER_ENGINE_CPU_CPU_NETWORK_H_
#define STOKER_ENGINE_CPU_CPU_NETWORK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace stoker {

// Parameters and optimizer state named by `naming` (ParameterNaming::kMlp for an MLP that
// Backend::CreateMlp routes here). INVALID_ARGUMENT for a bad config (ValidateNetworkConfig),
// RESOURCE_EXHAUSTED if the buffers cannot be allocated, INTERNAL if oneDNN cannot build a
// primitive.
absl::StatusOr<std::unique_ptr<Model>> CreateCpuNetwork(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);

}  // namespace stoker

#endif  // STOKER_ENGINE_CPU_CPU_NETWORK_H_
