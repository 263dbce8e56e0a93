// The oneDNN implementation of the MLP Model (see backend.h for the contract).
//
// Layout: weights stay [out, in] row-major as Parameters() reports them; the forward matmul reads
// them through a transposed view, so no per-step reorder exists. In bf16 the optimizer keeps a bf16
// copy of every weight matrix up to date as it writes the fp32 master, and activations are bf16;
// the matmuls accumulate in fp32 and write fp32 gradients.
//
// Primitives and their arguments are built once per batch size: the full max_batch shape at
// creation, and a few others (the partial last batch of an epoch) on first use. Not thread-safe:
// one caller at a time per model.
//
// Data-parallel training (SetGradientReducer): TrainStep multiplies the logits' gradient by the
// reducer's LocalShare() (a pass over rows x classes values, skipped for a share of 1) and hands
// the reducer each gradient as backward finalises it, layers last to first, the bias (after the
// ReLU backward that sums it) before the weight (after its matmul): GradientReady index 2k is
// layer (L-1-k)'s bias, 2k+1 its weight. After Finish() the SGD update runs on the sums; a failed
// Finish() returns its error with the weights and momentum untouched. TrainStepWithoutSamples
// hands zeroed gradients over in the same order.
#ifndef STOKER_ENGINE_CPU_CPU_MLP_H_
#define STOKER_ENGINE_CPU_CPU_MLP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model_shapes.h"

namespace stoker {

// The fast path: SGD with momentum in fp32 or bf16. INVALID_ARGUMENT for a bad config
// (ValidateMlpConfig), UNIMPLEMENTED for one that MlpNeedsNetwork (fp16, AdamW, Nesterov, gradient
// clipping: Backend::CreateMlp sends those to the general network, same parameter names, same
// initial weights), RESOURCE_EXHAUSTED if the buffers cannot be allocated, INTERNAL if oneDNN
// cannot build a primitive.
absl::StatusOr<std::unique_ptr<Model>> CreateCpuMlp(const MlpConfig& config);

}  // namespace stoker

#endif  // STOKER_ENGINE_CPU_CPU_MLP_H_
