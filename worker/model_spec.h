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
