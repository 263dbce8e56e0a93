// From a job's ModelSpec and TrainSpec to an engine model: the MLP fast path or a layered network.
#ifndef STOKER_WORKER_MODEL_SPEC_H_
#define STOKER_WORKER_MODEL_SPEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stoker.pb.h"
#include "worker/engine/backend.h"

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

// Builds the model on `backend`. `sample_dims` are the dimensions of one sample (e.g. {28, 28});
// a cnn takes single-channel images ({H, W} becomes {1, H, W}). INVALID_ARGUMENT names the layer.
absl::StatusOr<BuiltModel> BuildModel(Backend& backend, const v1::JobSpec& spec,
                                      const std::vector<int>& sample_dims, int classes);

}  // namespace stoker

#endif  // STOKER_WORKER_MODEL_SPEC_H_
