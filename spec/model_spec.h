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
  // be rebuilt elsewhere (scripts/pytorch_eval.py): {"type": "mlp", "input_features",
  // "input_channels", "hidden", "classes", "input_scale", "input_shift"} or {"type": "cnn",
  // "input_shape", "layers": [{"type", and out_channels/kernel/stride/padding, units or rate as
  // the layer has}], "classes", "input_scale", "input_shift"}; strides are the effective ones
  // (never 0). The input is normalised as x = pixel * input_scale[c] + input_shift[c], c the
  // channel (input_shape[0] of a cnn, input_channels equal blocks of an mlp's features); each of
  // the two is a number when one value serves every channel (as in checkpoints from before
  // per-channel values), else a list of one per channel.
  std::string architecture;
  Precision precision = Precision::kFp32;
};

// The optimizer settings of `spec` (PyTorch defaults where a field is 0).
OptimizerConfig OptimizerFromSpec(const v1::TrainSpec& train);

// The engine's configs for `spec` (no backend needed) on samples of `sample_dims`: an mlp on
// their product of inputs, or a cnn. A cnn takes {H, W} images as {1, H, W}, 3-D samples as
// [C, H, W] (PyTorch's layout, for every format), and flat {features} samples; INVALID_ARGUMENT
// for other ranks or an unknown layer.
// The input normalisation: for image_folder and shards, dataset.image.mean and std per channel
// (input_scale_c = 1 / (255 std_c), input_shift_c = -mean_c / std_c; an mlp's input_channels is
// the images' C), INVALID_ARGUMENT naming dataset.image.mean or dataset.image.std when one holds
// neither 1 value nor one per channel; the engine's defaults (mean 0.5, std 0.5) otherwise.
// Neither checks that the layers fit: ValidateModelForData and the backends do.
absl::StatusOr<MlpConfig> MlpConfigFromSpec(const v1::JobSpec& spec,
                                            const std::vector<int>& sample_dims, int classes);
absl::StatusOr<NetworkConfig> NetworkConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::vector<int>& sample_dims,
                                                    int classes);

// INVALID_ARGUMENT when the model cannot take samples of `sample_dims` with `classes` classes: a
// cnn layer that does not fit its input, an output that is not `classes` logits, or (either model)
// a dataset.image.mean or std whose count does not fit the images' channels. Messages start with
// the job-file field ("model.layers[0] (conv2d): kernel 40 larger than input 28x28"). The server
// runs it at submit, so such a job never waits in the queue.
absl::Status ValidateModelForData(const v1::JobSpec& spec, const std::vector<int>& sample_dims,
                                  int classes);

// Builds the model on `backend`. `sample_dims` are the dimensions of one sample (e.g. {28, 28},
// or {3, 224, 224} from an image dataset), taken as NetworkConfigFromSpec says. INVALID_ARGUMENT
// names the layer or field; RESOURCE_EXHAUSTED when the model would not fit in the backend's free
// memory.
absl::StatusOr<BuiltModel> BuildModel(Backend& backend, const v1::JobSpec& spec,
                                      const std::vector<int>& sample_dims, int classes);

}  // namespace stoker

#endif  // STOKER_SPEC_MODEL_SPEC_H_
