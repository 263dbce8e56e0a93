// What the backends share besides the graph (network_graph.h): input normalisation, batch and
// learning-rate checks, the data-parallel loss share, an MLP's layer shapes, initial parameters,
// the state checks of a restored checkpoint, and the error for a BatchNorm batch of one. Not for
// the engine's users.
#ifndef STOKER_ENGINE_BACKEND_HELPERS_H_
#define STOKER_ENGINE_BACKEND_HELPERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_shapes.h"

namespace stoker {

// The normalisation a model applies to uint8 samples, one value per channel: a sample is
// `channels` consecutive planes of `plane` values, and a value of plane c becomes
// pixel * scale[c] + shift[c] (computed in fp32, a multiply then an add, no FMA).
struct ChannelNormalization {
  int channels = 1;
  int64_t plane = 0;         // values per channel of one sample
  std::vector<float> scale;  // [channels]
  std::vector<float> shift;  // [channels]
};

// The per-channel normalisation of a config that ValidateMlpConfig (ValidateNetworkConfig)
// accepts: input_scale and input_shift expanded to one value per channel.
ChannelNormalization InputNormalization(const MlpConfig& config);
ChannelNormalization InputNormalization(const NetworkConfig& config);

// The checks of input_channels, input_scale and input_shift that ValidateMlpConfig and
// ValidateNetworkConfig share, for a sample of `features` values in `channels` channels;
// `channels_name` names where the channel count came from ("input_channels", "input_shape[0]").
absl::Status ValidateInputNormalization(int64_t features, int channels,
                                        const std::string& channels_name,
                                        const std::vector<float>& scale,
                                        const std::vector<float>& shift);

// `scale` and `shift` (1 or `channels` values each) expanded to one value per channel, for a
// sample of `features` values; arguments that ValidateInputNormalization accepts.
ChannelNormalization ExpandNormalization(int64_t features, int channels,
                                         const std::vector<float>& scale,
                                         const std::vector<float>& shift);

// INVALID_ARGUMENT unless samples/labels are set, 1 <= count <= config.max_batch and every label is
// < config.classes.
absl::Status ValidateBatch(const MlpConfig& config, const BatchView& batch);

// INVALID_ARGUMENT unless the learning rate TrainStep got is finite and >= 0.
absl::Status ValidateLearningRate(double learning_rate);

// What TrainStep scales its batch-mean loss gradient by: 1 without a reducer, else the
// reducer's LocalShare(), which must be in (0, 1] for a rank with samples (INVALID_ARGUMENT).
absl::StatusOr<float> LocalGradientShare(const GradientReducer* reducer);

// An MLP's Linear layers, input to logits: `in` -> `out` features, with a ReLU after every layer
// but the last.
struct MlpLayerShape {
  int in = 0;
  int out = 0;
  bool relu = false;
};
std::vector<MlpLayerShape> MlpLayerShapes(const MlpConfig& config);

// The initial fp32 parameters for `config`, identical on every backend and platform for a given
// seed: "layers.<i>.weight" [out, in] then "layers.<i>.bias" [out] for each Linear i = 0, 1, ...,
// each drawn U(-1/sqrt(in), 1/sqrt(in)) from one std::mt19937_64(config.seed) in that order.
std::vector<NamedTensor> InitialMlpParameters(const MlpConfig& config);

// The network optimizer state's scalar entries, as a checkpoint brings them back: "loss_scale"
// must hold {finite scale > 0, whole count >= 0}; a counter ("optimizer.step", "train_step") a
// whole, finite value >= 0. INVALID_ARGUMENT naming the entry otherwise.
absl::Status ValidateScalarState(const NamedTensor& entry);

// ValidateBatch for a network (count, pointers, labels < classes).
absl::Status ValidateBatch(const NetworkConfig& config, const BatchView& batch);

// The error both networks' TrainStep return for a training batch of `batch` samples that gives a
// BatchNorm (`kind`, its weight tensor named `weight_name`, input `shape` without the batch) one
// value per channel, as PyTorch refuses it: INVALID_ARGUMENT naming the module and the remedy.
absl::Status OneValuePerChannelError(LayerConfig::Kind kind, absl::string_view weight_name,
                                     int batch, const std::vector<int>& shape);

// The initial fp32 values of NetworkTensorSpecs(config, naming), in that order: each Conv2d or
// Linear weight then its bias drawn U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from one
// std::mt19937_64(config.seed), in that order (a bias-free layer draws no bias); BatchNorm
// weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0. Configs without the
// new layer kinds get the values they always had.
std::vector<NamedTensor> InitialNetworkParameters(
    const NetworkConfig& config, ParameterNaming naming = ParameterNaming::kByLayer);

}  // namespace stoker

#endif  // STOKER_ENGINE_BACKEND_HELPERS_H_
