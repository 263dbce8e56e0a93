// What can be known of a model config without building it: validation (errors name the layer or
// field), each layer's output shape, the tensors a model will hold and their names, forward
// FLOPs, and a training run's memory footprint. What the server's submit check, the CLI's dry
// run and the job spec use (stoker_engine_common: no oneDNN, no CUDA); the backends use the same
// functions, so a config the server accepts builds.
#ifndef STOKER_ENGINE_MODEL_SHAPES_H_
#define STOKER_ENGINE_MODEL_SHAPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace stoker {

// INVALID_ARGUMENT, naming the field, unless: input_features > 0, 1 <= classes <= 256 (labels are
// uint8), every hidden width > 0, max_batch > 0, input_channels >= 1 dividing input_features,
// input_scale and input_shift of 1 or input_channels values each (every scale finite and != 0,
// every shift finite), and the optimizer and loss scale pass ValidateTrainingOptions
// (learning_rate >= 0, 0 <= momentum <= 1, weight_decay >= 0, ...).
absl::Status ValidateMlpConfig(const MlpConfig& config);

// Multiply-adds x 2 of one sample's forward pass (the Linear layers only).
int64_t MlpForwardFlopsPerSample(const MlpConfig& config);

// True when an MLP needs the general network path: fp16, AdamW, Nesterov or gradient clipping.
// Each backend's MLP fast path does SGD with momentum in fp32 or bf16 only. Asked in one place,
// Backend::CreateMlp, so both backends route alike and an MLP's checkpoint holds the same tensors
// on either.
bool MlpNeedsNetwork(const MlpConfig& config);

// The activation shape after each layer: shapes[0] = input_shape, shapes[i + 1] = the output of
// layers[i] ({C, H, W} or {features}). INVALID_ARGUMENT naming the layer for a bad config (see
// ValidateNetworkConfig).
absl::StatusOr<std::vector<std::vector<int>>> NetworkShapes(const NetworkConfig& config);

// The output shape of one layer (a residual block: its sum) on input shape `in`; INVALID_ARGUMENT
// as NetworkShapes, the layer named "layer".
absl::StatusOr<std::vector<int>> LayerOutputShape(const LayerConfig& layer,
                                                  const std::vector<int>& in);

// Layers inside residual blocks are checked as top-level ones and named by their path:
// "layers[3].layers[1] (conv2d): kernel 5 larger than input 4x4"; a block needs a non-empty main
// branch whose output shape equals the shortcut's (the input's for an identity shortcut), and
// blocks nest at most 16 deep. BatchNorm2d needs [C, H, W], BatchNorm1d [features], momentum in
// [0, 1] and eps > 0; label_smoothing must be in [0, 1).
// INVALID_ARGUMENT, naming the layer or field, unless every layer fits its input (kernel no larger
// than the padded input, positive sizes, 0 <= rate < 1, Conv2d/MaxPool2d on [C, H, W] only), the
// output is flat with `classes` features, input_channels is 0 or input_shape[0] for a {C, H, W}
// input (0 or a divisor of the features for a flat one), input_scale and input_shift hold 1 or
// C values, and the rest is as ValidateMlpConfig asks, plus: AdamW
// betas in [0, 1), eps > 0, nesterov only with SGD momentum > 0, clip_grad_norm >= 0, and a sane
// LossScaleConfig (initial > 0, growth_interval >= 1, growth_factor > 1, 0 < backoff_factor < 1).
absl::Status ValidateNetworkConfig(const NetworkConfig& config);

// The optimizer and loss-scale checks of ValidateNetworkConfig (ValidateMlpConfig runs them too).
absl::Status ValidateTrainingOptions(const OptimizerConfig& optimizer,
                                     const LossScaleConfig& loss_scale);

// A Conv2d's, MaxPool2d's or AvgPool2d's stride: LayerConfig::stride, or its default when 0 (1
// for Conv2d, the kernel size for the pools, as in PyTorch).
int EffectiveStride(const LayerConfig& layer);

// The name every path gives a parameter: "layers.<index>.weight" or "layers.<index>.bias", the
// index as ParameterNaming says (MlpParameterIndex / the layer index). The MLP fast paths, both
// networks and the initial parameters all name through it.
std::string ParameterName(size_t index, bool weight);

// The index that names the parameters of layers[layer] under `naming`: `layer` itself
// (kByLayer), or the number of layers with parameters (Conv2d, Linear, BatchNorm) before it (kMlp:
// the MLP's Linear ordinal). Nested layers are named by their path (NetworkTensorSpecs).
size_t ParameterIndex(const NetworkConfig& config, size_t layer, ParameterNaming naming);

// What a tensor of a network's state is. BatchNorm's running statistics are buffers: they
// travel with the parameters (Model::Parameters() and SetParameters() list them, so a checkpoint
// saves and restores them and PyTorch's load_state_dict(strict=True) takes the same names), but
// they have no gradient, no optimizer state, no weight decay and no part in gradient clipping.
enum class NetworkTensorKind {
  kWeight,          // Conv2d / Linear weight: trained, weight-decayed
  kBias,            // Conv2d / Linear bias: trained, never decayed
  kNormWeight,      // BatchNorm gamma [C]: trained, never decayed
  kNormBias,        // BatchNorm beta [C]: trained, never decayed
  kRunningMean,     // BatchNorm buffer [C]
  kRunningVar,      // BatchNorm buffer [C]
  kBatchesTracked,  // BatchNorm buffer [1]: TrainStep calls that updated the statistics (a float)
};
bool IsTrainedTensor(NetworkTensorKind kind);  // weights, biases, BatchNorm gamma and beta
bool IsDecayedTensor(NetworkTensorKind kind);  // Conv2d and Linear weights only

struct NetworkTensorSpec {
  std::string name;  // "layers.3.layers.1.weight", "layers.4.running_mean", ...
  std::vector<int64_t> shape;
  NetworkTensorKind kind;
  int64_t fan_in = 0;  // Conv2d / Linear weight and bias: in_channels * k * k or in_features
};

// Every tensor Model::Parameters() lists, in that order: PyTorch's state_dict order for a module
// tree where top-level layer i is "layers.<ParameterIndex(i)>" and a residual block's branches
// are "<block>.layers.<j>" and "<block>.shortcut.<j>" (nested blocks recurse; a block's main
// branch comes before its shortcut). A Conv2d/Linear gives ".weight" then ".bias" (none when
// bias is false); a BatchNorm ".weight", ".bias", ".running_mean", ".running_var",
// ".num_batches_tracked". Empty for a config NetworkShapes refuses.
std::vector<NetworkTensorSpec> NetworkTensorSpecs(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);


// The MLP as a network: Linear(+ReLU) per hidden width, then Linear to the classes; same seed,
// optimizer, precision and input normalisation (a flat input of input_channels blocks). Its initial
// parameters equal InitialMlpParameters(mlp) value for value, and name for name under
// ParameterNaming::kMlp (by layer index, layers.0, layers.2, ..., under kByLayer).
NetworkConfig NetworkFromMlp(const MlpConfig& mlp);

// Multiply-adds x 2 of one sample's forward pass (Conv2d and Linear layers only, those inside
// residual blocks included); 0 for a bad config.
int64_t NetworkForwardFlopsPerSample(const NetworkConfig& config);

// A training run's memory, roughly as either backend allocates it: fp32 master weights, their
// gradients and optimizer state (1 slot for SGD with momentum, 2 for AdamW), a low-precision
// weight copy for bf16/fp16, and max_batch samples of every activation with its gradient and a
// low-precision copy. An estimate for refusing a model that cannot fit, not an exact figure.
struct TrainingFootprint {
  int64_t parameters = 0;
  int64_t activations_per_sample = 0;  // values of every layer's output, input included
  int64_t bytes = 0;
};

// The footprint of `config`; INVALID_ARGUMENT as NetworkShapes for a bad config.
absl::StatusOr<TrainingFootprint> EstimateTrainingFootprint(const NetworkConfig& config);

// OK when `footprint` fits in `available_bytes` (less a tenth kept for everything else);
// RESOURCE_EXHAUSTED naming both sizes, the parameter count and the batch size otherwise.
absl::Status CheckTrainingFits(const TrainingFootprint& footprint, int64_t available_bytes,
                               const std::string& where, int max_batch);

}  // namespace stoker

#endif  // STOKER_ENGINE_MODEL_SHAPES_H_
