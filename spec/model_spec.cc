#include "spec/model_spec.h"

#include <numeric>
#include <optional>

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

std::string ArchitectureJson(const MlpConfig& config) {
  nlohmann::json json = {{"type", "mlp"},
                         {"input_features", config.input_features},
                         {"hidden", config.hidden},
                         {"classes", config.classes},
                         {"input_scale", config.input_scale},
                         {"input_shift", config.input_shift}};
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
                         {"input_scale", config.input_scale},
                         {"input_shift", config.input_shift}};
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

MlpConfig MlpConfigFromSpec(const v1::JobSpec& spec, int features, int classes) {
  MlpConfig config;
  config.input_features = features;
  config.hidden.assign(spec.model().hidden().begin(), spec.model().hidden().end());
  SetTrainingFields(spec, classes, &config);
  return config;
}

absl::StatusOr<NetworkConfig> NetworkConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::vector<int>& sample_dims,
                                                    int classes) {
  NetworkConfig config;
  if (sample_dims.size() == 2) {
    config.input_shape = {1, sample_dims[0], sample_dims[1]};
  } else if (sample_dims.size() == 1) {
    config.input_shape = {sample_dims[0]};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model.type: a cnn takes single-channel images; these samples have ",
                     sample_dims.size(), " dimensions"));
  }
  for (int i = 0; i < spec.model().layers_size(); ++i) {
    absl::StatusOr<LayerConfig> layer = ToLayer(spec.model().layers(i), i);
    if (!layer.ok()) return layer.status();
    config.layers.push_back(*layer);
  }
  SetTrainingFields(spec, classes, &config);
  return config;
}

absl::Status ValidateModelForData(const v1::JobSpec& spec, const std::vector<int>& sample_dims,
                                  int classes) {
  if (spec.model().type() != "cnn") return absl::OkStatus();
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
  const int features =
      std::accumulate(sample_dims.begin(), sample_dims.end(), 1, std::multiplies<int>());
  if (spec.model().type() != "cnn") {
    const MlpConfig config = MlpConfigFromSpec(spec, features, classes);
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
