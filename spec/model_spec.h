// From a job's ModelSpec and TrainSpec to an engine model: the MLP fast path or a layered network.
#ifndef STOKER_SPEC_MODEL_SPEC_H_
#define STOKER_SPEC_MODEL_SPEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "stoker.pb.h"

namespace stoker {

struct BuiltModel {
  std::unique_ptr<Model> model;
  std::string description;  // e.g. "mlp 784-256-128-10" or "cnn conv2d(32,k3)-relu-..."
  // The architecture as JSON, stored in each checkpoint's metadata ("model") so the weights can
  // be rebuilt elsewhere (scripts/pytorch_eval.py): {"type": "mlp", "input_features", "hidden",
  // "classes", "input_scale", "input_shift"} or {"type": "cnn", "input_shape", "layers": [{"type",
  // and out_channels/kernel/stride/padding, units or rate as the layer has}], "classes",
  // "input_scale", "input_shift"}; strides are the effective ones (never 0).
  std::string architecture;
  Precision precision = Precision::kFp32;
};

// The optimizer settings of `spec` (PyTorch defaults where a field is 0).
OptimizerConfig OptimizerFromSpec(const v1::TrainSpec& train);

// The engine's configs for `spec` (no backend needed): an mlp on `features` inputs, or a cnn on
// samples of `sample_dims` ({H, W} images become {1, H, W}; INVALID_ARGUMENT for other ranks or
// an unknown layer). Neither checks that the layers fit: ValidateModelForData and the backends do.
MlpConfig MlpConfigFromSpec(const v1::JobSpec& spec, int features, int classes);
absl::StatusOr<NetworkConfig> NetworkConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::vector<int>& sample_dims,
                                                    int classes);

// INVALID_ARGUMENT when a cnn cannot take samples of `sample_dims` with `classes` classes: a layer
// that does not fit its input, or an output that is not `classes` logits. Messages start with the
// job-file field ("model.layers[0] (conv2d): kernel 40 larger than input 28x28"). OK for an mlp,
// which fits any input. The server runs it at submit, so such a job never waits in the queue.
absl::Status ValidateModelForData(const v1::JobSpec& spec, const std::vector<int>& sample_dims,
                                  int classes);

// Builds the model on `backend`. `sample_dims` are the dimensions of one sample (e.g. {28, 28});
// a cnn takes single-channel images ({H, W} becomes {1, H, W}). INVALID_ARGUMENT names the layer;
// RESOURCE_EXHAUSTED when the model would not fit in the backend's free memory.
absl::StatusOr<BuiltModel> BuildModel(Backend& backend, const v1::JobSpec& spec,
                                      const std::vector<int>& sample_dims, int classes);

}  // namespace stoker

#endif  // STOKER_SPEC_MODEL_SPEC_H_
