// Backend-independent parts of the MLP contract: config and batch checks, the seeded
// initialisation, and the route an MLP takes (Backend::CreateMlp).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/backend_helpers.h"

namespace stoker {
namespace {

// Uniform in [0, 1) from the top 53 bits, so the values do not depend on the standard library
// (std::uniform_real_distribution's algorithm is implementation-defined).
double UnitUniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

ChannelNormalization ExpandNormalization(int64_t features, int channels,
                                         const std::vector<float>& scale,
                                         const std::vector<float>& shift) {
  // Arguments the validation refuses still give a well-formed (if meaningless) result.
  ChannelNormalization out;
  out.channels = std::max(channels, 1);
  out.plane = features / out.channels;
  auto value = [](const std::vector<float>& values, int c, float fallback) {
    if (values.empty()) return fallback;
    return values.size() == 1 ? values[0] : values[std::min<size_t>(c, values.size() - 1)];
  };
  for (int c = 0; c < out.channels; ++c) {
    out.scale.push_back(value(scale, c, 1.0f));
    out.shift.push_back(value(shift, c, 0.0f));
  }
  return out;
}

absl::Status ValidateMlpConfig(const MlpConfig& config) {
  if (config.input_features <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_features must be > 0, got ", config.input_features));
  }
  if (config.classes < 1 || config.classes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("classes must be in [1, 256] (labels are uint8), got ", config.classes));
  }
  for (size_t i = 0; i < config.hidden.size(); ++i) {
    if (config.hidden[i] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden[", i, "] must be > 0, got ", config.hidden[i]));
    }
  }
  if (config.max_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch must be > 0, got ", config.max_batch));
  }
  STOKER_RETURN_IF_ERROR(ValidateInputNormalization(config.input_features, config.input_channels,
                                                    "input_channels", config.input_scale,
                                                    config.input_shift));
  if (!(config.label_smoothing >= 0 && config.label_smoothing < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_smoothing must be in [0, 1), got ", config.label_smoothing));
  }
  return ValidateTrainingOptions(config.optimizer, config.loss_scale);
}

absl::Status ValidateInputNormalization(int64_t features, int channels,
                                        const std::string& channels_name,
                                        const std::vector<float>& scale,
                                        const std::vector<float>& shift) {
  if (channels < 1 || features % channels != 0) {
    return absl::InvalidArgumentError(absl::StrCat(channels_name, " must be >= 1 and divide the ",
                                                   features, " values of a sample, got ",
                                                   channels));
  }
  for (const auto& [name, values] : {std::pair{"input_scale", &scale}, {"input_shift", &shift}}) {
    if (values->size() != 1 && values->size() != static_cast<size_t>(channels)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " holds ", values->size(), " values; it needs 1 (every channel) or ",
                       channels, " (one per channel: ", channels_name, ")"));
    }
    for (size_t c = 0; c < values->size(); ++c) {
      const float v = (*values)[c];
      const bool is_scale = values == &scale;
      if (!std::isfinite(v) || (is_scale && v == 0)) {
        return absl::InvalidArgumentError(absl::StrCat(name, "[", c, "] must be finite",
                                                       is_scale ? " and != 0" : "", ", got ", v));
      }
    }
  }
  return absl::OkStatus();
}

ChannelNormalization InputNormalization(const MlpConfig& config) {
  return ExpandNormalization(config.input_features, config.input_channels, config.input_scale,
                             config.input_shift);
}

absl::Status ValidateLearningRate(double learning_rate) {
  if (!(learning_rate >= 0) || !std::isfinite(learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate must be finite and >= 0, got ", learning_rate));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> LocalGradientShare(const GradientReducer* reducer) {
  if (reducer == nullptr) return 1.0f;
  const float share = reducer->LocalShare();
  if (!(share > 0 && share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the gradient reducer's LocalShare() is ", share,
                     "; a rank with samples needs a share in (0, 1] (with none it calls "
                     "TrainStepWithoutSamples)"));
  }
  return share;
}

absl::Status ValidateBatch(const MlpConfig& config, const BatchView& batch) {
  if (batch.count < 1 || batch.count > config.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch count must be in [1, ", config.max_batch,
                                                   "] (max_batch), got ", batch.count));
  }
  if ((batch.samples == nullptr && batch.features == nullptr) || batch.labels == nullptr) {
    return absl::InvalidArgumentError("batch samples and labels must not be null");
  }
  for (int i = 0; i < batch.count; ++i) {
    if (batch.labels[i] >= config.classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", int{batch.labels[i]}, " of sample ",
                                                     i, " is >= classes (", config.classes, ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<MlpLayerShape> MlpLayerShapes(const MlpConfig& config) {
  std::vector<MlpLayerShape> shapes;
  int in = config.input_features;
  for (int width : config.hidden) {
    shapes.push_back({in, width, /*relu=*/true});
    in = width;
  }
  shapes.push_back({in, config.classes, /*relu=*/false});
  return shapes;
}

std::vector<NamedTensor> InitialMlpParameters(const MlpConfig& config) {
  std::mt19937_64 rng(config.seed);
  std::vector<NamedTensor> parameters;
  const std::vector<MlpLayerShape> shapes = MlpLayerShapes(config);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int fan_in = shapes[i].in;
    const int fan_out = shapes[i].out;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    NamedTensor weight{ParameterName(i, /*weight=*/true), {fan_out, fan_in}, {}};
    NamedTensor bias{ParameterName(i, /*weight=*/false), {fan_out}, {}};
    weight.values.resize(static_cast<size_t>(fan_out) * fan_in);
    bias.values.resize(fan_out);
    for (float& w : weight.values) w = static_cast<float>((2 * UnitUniform(rng) - 1) * bound);
    for (float& b : bias.values) b = static_cast<float>((2 * UnitUniform(rng) - 1) * bound);
    parameters.push_back(std::move(weight));
    parameters.push_back(std::move(bias));
  }
  return parameters;
}

int64_t MlpForwardFlopsPerSample(const MlpConfig& config) {
  int64_t flops = 0;
  for (const MlpLayerShape& shape : MlpLayerShapes(config)) flops += 2LL * shape.in * shape.out;
  return flops;
}

bool MlpNeedsNetwork(const MlpConfig& config) {
  const OptimizerConfig& opt = config.optimizer;
  return config.precision == Precision::kFp16 || opt.type != OptimizerType::kSgd || opt.nesterov ||
         opt.clip_grad_norm > 0 || config.label_smoothing != 0;
}

absl::StatusOr<std::unique_ptr<Model>> Backend::CreateMlp(const MlpConfig& config) {
  STOKER_RETURN_IF_ERROR(ValidateMlpConfig(config));
  if (MlpNeedsNetwork(config) && BuildsNetworks()) {
    return CreateNetworkModel(NetworkFromMlp(config), ParameterNaming::kMlp);
  }
  if (config.label_smoothing != 0) {
    return absl::InvalidArgumentError(
        "label_smoothing: this backend's MLP path has no label smoothing (it builds no networks)");
  }
  return CreateMlpFastPath(config);
}

}  // namespace stoker
