// From a job's ModelSpec and TrainSpec to an engine model: the MLP fast path or a layered network.
#ifndef STOKER_SPEC_MODEL_SPEC_H_
#define STOKER_SPEC_MODEL_SPEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_shapes.h"
#include "stoker.pb.h"

namespace stoker {

class Backend;  // engine/backend.h

struct BuiltModel {
  std::unique_ptr<Model> model;
  // NetworkDescription, or "mlp 784-256-128-10".
  std::string description;
  // The architecture as JSON, stored in each checkpoint's metadata ("model") so the weights can
  // be rebuilt elsewhere (scripts/pytorch_eval.py): {"type": "mlp", "input_features",
  // "input_channels", "hidden", "classes", "input_scale", "input_shift"} or {"type": "cnn",
  // "input_shape", "layers", "classes", "input_scale", "input_shift", and "label_smoothing" when
  // it is not 0}. A layer is {"type", and what its kind has: "out_channels", "kernel", "stride",
  // "padding", "bias" (conv2d); "kernel", "stride", "padding" (maxpool2d, avgpool2d); "units",
  // "bias" (linear); "rate" (dropout); "momentum", "eps" (batchnorm2d, batchnorm1d); "layers",
  // "shortcut" (lists of layers) and "activation" ("relu", "gelu", "none"; residual)}. A resnet
  // is written as the cnn it expands to (ExpandModel). Strides are the effective ones (never 0).
  // The input is normalised as x = pixel * input_scale[c] + input_shift[c], c the
  // channel (input_shape[0] of a cnn, input_channels equal blocks of an mlp's features); each of
  // the two is a number when one value serves every channel (as in checkpoints from before
  // per-channel values), else a list of one per channel.
  std::string architecture;
  Precision precision = Precision::kFp32;
};

// The optimizer settings of `spec` (PyTorch defaults where a field is 0).
OptimizerConfig OptimizerFromSpec(const v1::TrainSpec& train);

// The engine's configs for `spec` (no backend needed) on samples of `sample_dims`: an mlp on
// their product of inputs, or a cnn (a resnet as the layers ExpandModel makes of it, its last
// linear layer `classes` wide; train.label_smoothing goes into the NetworkConfig). A cnn takes {H,
// W} images as {1, H, W}, 3-D samples as [C, H, W] (PyTorch's layout, for every format), and flat
// {features} samples; INVALID_ARGUMENT for other ranks or an unknown layer. The input
// normalisation: for image_folder and shards, dataset.image.mean and std per channel (input_scale_c
// = 1 / (255 std_c), input_shift_c = -mean_c / std_c; an mlp's input_channels is the images' C),
// INVALID_ARGUMENT naming dataset.image.mean or dataset.image.std when one holds neither 1 value
// nor one per channel; the engine's defaults (mean 0.5, std 0.5) otherwise. Neither checks that the
// layers fit: ValidateModelForData and the backends do.
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

// BuiltModel::architecture of an mlp and of a network.
std::string ArchitectureJson(const MlpConfig& config);
std::string ArchitectureJson(const NetworkConfig& config);

// For a network that ValidateNetworkConfig accepts (ValidateModelForData says so for a job):
// its trainable parameters (Conv2d and Linear weights and biases, BatchNorm weights and biases;
// not BatchNorm's running statistics), as sum(p.numel() for p in model.parameters()) counts them
// in PyTorch;
int64_t NetworkParameterCount(const NetworkConfig& config);
// its layers, counting those inside residual blocks (and the blocks themselves);
int NetworkLayerCount(const NetworkConfig& config);
// its layers as a job file's model section ("model:\n  type: cnn\n  layers:\n    - {type: ...}"),
// every field the engine uses written out (strides as the effective ones, bias: false), and each
// layer followed by a comment with its output shape and parameter count: what a resnet expands
// to, and what `stoker submit --dry-run` prints. Read back as a job file it gives the same
// NetworkConfig layers.
std::string NetworkLayersYaml(const NetworkConfig& config);
// the trainer's one-line description: "cnn 1x28x28 conv2d-relu-maxpool2d-flatten-linear" (a
// residual block as "residual(main | shortcut)", followed by the parameter count when there are
// blocks), or "resnet-20 width 16 1x28x28 (64 layers, 272186 parameters)".
std::string NetworkDescription(const v1::ModelSpec& model, const NetworkConfig& config);

}  // namespace stoker

#endif  // STOKER_SPEC_MODEL_SPEC_H_
