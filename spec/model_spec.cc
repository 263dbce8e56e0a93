#include "spec/model_spec.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/layer_kinds.h"
#include "nlohmann/json.hpp"

namespace stoker {
namespace {

Precision ToPrecision(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_BF16:
      return Precision::kBf16;
    case v1::PRECISION_FP16:
      return Precision::kFp16;
    default:
      return Precision::kFp32;
  }
}

absl::StatusOr<LayerConfig> ToLayer(const v1::LayerSpec& spec, int index) {
  LayerConfig layer;
  const std::optional<LayerConfig::Kind> kind = LayerKindFromName(spec.type());
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.layers[", index, "].type: unknown layer '", spec.type(), "'"));
  }
  layer.kind = *kind;
  layer.out_channels = spec.out_channels();
  layer.kernel = spec.kernel();
  layer.stride = spec.stride();
  layer.padding = spec.padding();
  layer.units = spec.units();
  layer.rate = static_cast<float>(spec.rate());
  return layer;
}

// input_scale or input_shift in the architecture: a number when one value serves every channel
// (what checkpoints held before per-channel values, so older readers still take them), else a
// list with one value per channel.
nlohmann::json NormalizationJson(const std::vector<float>& values) {
  if (values.size() == 1) return values[0];
  return values;
}

std::string ArchitectureJson(const MlpConfig& config) {
  nlohmann::json json = {{"type", "mlp"},
                         {"input_features", config.input_features},
                         {"input_channels", config.input_channels},
                         {"hidden", config.hidden},
                         {"classes", config.classes},
                         {"input_scale", NormalizationJson(config.input_scale)},
                         {"input_shift", NormalizationJson(config.input_shift)}};
  return json.dump();
}

std::string ArchitectureJson(const NetworkConfig& config) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerConfig& layer : config.layers) {
    nlohmann::json entry = {{"type", LayerKindName(layer.kind)}};
    switch (layer.kind) {
      case LayerConfig::Kind::kConv2d:
        entry["out_channels"] = layer.out_channels;
        entry["kernel"] = layer.kernel;
        entry["stride"] = EffectiveStride(layer);
        entry["padding"] = layer.padding;
        break;
      case LayerConfig::Kind::kMaxPool2d:
        entry["kernel"] = layer.kernel;
        entry["stride"] = EffectiveStride(layer);
        entry["padding"] = layer.padding;
        break;
      case LayerConfig::Kind::kLinear:
        entry["units"] = layer.units;
        break;
      case LayerConfig::Kind::kDropout:
        entry["rate"] = layer.rate;
        break;
      default:
        break;
    }
    layers.push_back(std::move(entry));
  }
  nlohmann::json json = {{"type", "cnn"},
                         {"input_shape", config.input_shape},
                         {"layers", std::move(layers)},
                         {"classes", config.classes},
                         {"input_scale", NormalizationJson(config.input_scale)},
                         {"input_shift", NormalizationJson(config.input_shift)}};
  return json.dump();
}

// RESOURCE_EXHAUSTED when the model would not fit in what `backend` has free, so a job that
// is too big fails with both sizes rather than being killed by the kernel part way through.
absl::Status CheckFits(const Backend& backend, const NetworkConfig& network) {
  absl::StatusOr<int64_t> available = backend.AvailableMemoryBytes();
  if (!available.ok()) return absl::OkStatus();  // cannot tell: the allocations will say
  absl::StatusOr<TrainingFootprint> footprint = EstimateTrainingFootprint(network);
  if (!footprint.ok()) return absl::OkStatus();  // Create* names the bad layer
  const std::string where = backend.Name() == "cpu" ? "this machine" : "the GPU";
  return CheckTrainingFits(*footprint, *available, where, network.max_batch);
}

bool IsImageFormat(const std::string& format) {
  return format == "image_folder" || format == "shards";
}

// The channels of one sample: C of a [C, H, W] sample, 1 for {H, W} and flat samples.
int SampleChannels(const std::vector<int>& sample_dims) {
  return sample_dims.size() == 3 ? sample_dims[0] : 1;
}

// The engine's input_scale and input_shift for samples of `channels` channels. Image datasets
// take dataset.image.mean and std, torchvision's Normalize after ToTensor:
// x = (pixel / 255 - mean_c) / std_c, so scale_c = 1 / (255 std_c) and shift_c = -mean_c / std_c
// (computed in double, stored as float), one value per channel unless both fields hold at most
// one. Everything else (IDX, NPY, CSV, and images without mean and std) keeps the engine's
// defaults: [0, 255] to [-1, 1], mean 0.5 and std 0.5.
template <typename Config>
absl::Status SetInputNormalization(const v1::JobSpec& spec, int channels, Config* config) {
  if (!IsImageFormat(spec.dataset().format())) return absl::OkStatus();
  const v1::ImageSpec& image = spec.dataset().image();
  for (const auto& [field, values] : {std::pair{"dataset.image.mean", &image.mean()},
                                      std::pair{"dataset.image.std", &image.std()}}) {
    if (values->size() > 1 && values->size() != channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " holds ", values->size(), " values but the images have ", channels,
          channels == 1 ? " channel" : " channels", "; give 1 value, or 1 per channel"));
    }
  }
  if (image.mean().empty() && image.std().empty()) return absl::OkStatus();
  auto value = [](const auto& values, int c) {
    if (values.empty()) return 0.5;  // the field's documented default
    return static_cast<double>(values.size() == 1 ? values[0] : values[c]);
  };
  const int count = image.mean().size() > 1 || image.std().size() > 1 ? channels : 1;
  config->input_scale.clear();
  config->input_shift.clear();
  for (int c = 0; c < count; ++c) {
    const double mean = value(image.mean(), c), deviation = value(image.std(), c);
    const float scale = static_cast<float>(1.0 / (255.0 * deviation));
    const float shift = static_cast<float>(-mean / deviation);
    if (!std::isfinite(scale) || scale == 0 || !std::isfinite(shift)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.image.mean and dataset.image.std: channel ", c, " (mean ", mean,
                       ", std ", deviation, ") gives x = pixel * ", scale, " + ", shift,
                       ", outside the range of a float"));
    }
    config->input_scale.push_back(scale);
    config->input_shift.push_back(shift);
  }
  return absl::OkStatus();
}

// The fields MlpConfig and NetworkConfig share: classes and everything from train.
template <typename Config>
void SetTrainingFields(const v1::JobSpec& spec, int classes, Config* config) {
  config->classes = classes;
  config->max_batch = spec.train().batch_size();
  config->precision = ToPrecision(spec.train().precision());
  config->seed = static_cast<uint64_t>(spec.train().seed());
  config->optimizer = OptimizerFromSpec(spec.train());
}

}  // namespace

OptimizerConfig OptimizerFromSpec(const v1::TrainSpec& train) {
  const v1::OptimizerSpec& spec = train.optimizer();
  OptimizerConfig config;
  config.type = spec.type() == "adamw" ? OptimizerType::kAdamW : OptimizerType::kSgd;
  config.learning_rate = spec.lr();
  config.momentum = spec.momentum();
  config.weight_decay = spec.weight_decay();
  config.nesterov = spec.nesterov();
  if (spec.beta1() > 0) config.beta1 = spec.beta1();
  if (spec.beta2() > 0) config.beta2 = spec.beta2();
  if (spec.eps() > 0) config.eps = spec.eps();
  config.clip_grad_norm = spec.clip_grad_norm();
  return config;
}

absl::StatusOr<MlpConfig> MlpConfigFromSpec(const v1::JobSpec& spec,
                                            const std::vector<int>& sample_dims, int classes) {
  MlpConfig config;
  config.input_features =
      std::accumulate(sample_dims.begin(), sample_dims.end(), 1, std::multiplies<int>());
  config.hidden.assign(spec.model().hidden().begin(), spec.model().hidden().end());
  SetTrainingFields(spec, classes, &config);
  if (IsImageFormat(spec.dataset().format())) config.input_channels = SampleChannels(sample_dims);
  STOKER_RETURN_IF_ERROR(SetInputNormalization(spec, config.input_channels, &config));
  return config;
}

absl::StatusOr<NetworkConfig> NetworkConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::vector<int>& sample_dims,
                                                    int classes) {
  NetworkConfig config;
  const std::string& format = spec.dataset().format();
  if (sample_dims.size() == 2) {
    config.input_shape = {1, sample_dims[0], sample_dims[1]};
  } else if (sample_dims.size() == 1) {
    config.input_shape = {sample_dims[0]};
  } else if (sample_dims.size() == 3) {
    // [C, H, W], as PyTorch: the image loaders write them so, and 3-D IDX/NPY samples are read so
    // (data/augment.h crops and flips them per channel plane).
    config.input_shape = sample_dims;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model.type: a cnn takes [C, H, W] or [H, W] images, or flat samples; these "
                     "samples have ",
                     sample_dims.size(), " dimensions"));
  }
  for (int i = 0; i < spec.model().layers_size(); ++i) {
    absl::StatusOr<LayerConfig> layer = ToLayer(spec.model().layers(i), i);
    if (!layer.ok()) return layer.status();
    config.layers.push_back(*layer);
  }
  SetTrainingFields(spec, classes, &config);
  const int channels = config.input_shape.size() == 3 ? config.input_shape[0] : 1;
  STOKER_RETURN_IF_ERROR(SetInputNormalization(spec, channels, &config));
  return config;
}

absl::Status ValidateModelForData(const v1::JobSpec& spec, const std::vector<int>& sample_dims,
                                  int classes) {
  if (spec.model().type() != "cnn") return MlpConfigFromSpec(spec, sample_dims, classes).status();
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, sample_dims, classes);
  if (!config.ok()) return config.status();
  absl::Status status = ValidateNetworkConfig(*config);
  if (status.ok()) return status;
  // The engine names the layer ("layers[0] (conv2d): ..."); the job file calls it model.layers.
  const absl::string_view message = status.message();
  return absl::Status(status.code(), absl::StartsWith(message, "layers[")
                                         ? absl::StrCat("model.", message)
                                         : absl::StrCat("model: ", message));
}

absl::StatusOr<BuiltModel> BuildModel(Backend& backend, const v1::JobSpec& spec,
                                      const std::vector<int>& sample_dims, int classes) {
  BuiltModel built;
  built.precision = ToPrecision(spec.train().precision());
  if (spec.model().type() != "cnn") {
    STOKER_ASSIGN_OR_RETURN(const MlpConfig config, MlpConfigFromSpec(spec, sample_dims, classes));
    const int features = config.input_features;
    STOKER_RETURN_IF_ERROR(CheckFits(backend, NetworkFromMlp(config)));
    absl::StatusOr<std::unique_ptr<Model>> model = backend.CreateMlp(config);
    if (!model.ok()) return model.status();
    built.model = std::move(*model);
    built.description = absl::StrCat("mlp ", features, "-", absl::StrJoin(config.hidden, "-"),
                                     config.hidden.empty() ? "" : "-", classes);
    built.architecture = ArchitectureJson(config);
    return built;
  }
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, sample_dims, classes);
  if (!config.ok()) return config.status();
  STOKER_RETURN_IF_ERROR(CheckFits(backend, *config));
  absl::StatusOr<std::unique_ptr<Model>> model = backend.CreateNetwork(*config);
  if (!model.ok()) return model.status();
  built.model = std::move(*model);
  std::vector<std::string> names;
  for (const v1::LayerSpec& layer : spec.model().layers()) names.push_back(layer.type());
  built.description =
      absl::StrCat("cnn ", absl::StrJoin(config->input_shape, "x"), " ", absl::StrJoin(names, "-"));
  built.architecture = ArchitectureJson(*config);
  return built;
}

}  // namespace stoker
