#include "spec/model_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
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
#include "engine/backend.h"
#include "engine/layer_kinds.h"
#include "nlohmann/json.hpp"
#include "spec/model_preset.h"

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

absl::StatusOr<std::vector<LayerConfig>> ToLayers(
    const google::protobuf::RepeatedPtrField<v1::LayerSpec>& specs, const std::string& path);

// A job file's layer at `at` ("model.layers[3]") as the engine's, branches and all.
absl::StatusOr<LayerConfig> ToLayer(const v1::LayerSpec& spec, const std::string& at) {
  LayerConfig layer;
  const std::optional<LayerConfig::Kind> kind = LayerKindFromName(spec.type());
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(at, ".type: unknown layer '", spec.type(), "'"));
  }
  layer.kind = *kind;
  layer.out_channels = spec.out_channels();
  layer.kernel = spec.kernel();
  layer.stride = spec.stride();
  layer.padding = spec.padding();
  layer.units = spec.units();
  layer.rate = static_cast<float>(spec.rate());
  if (spec.has_bias()) layer.bias = spec.bias();
  if (spec.has_momentum()) layer.momentum = static_cast<float>(spec.momentum());
  if (spec.has_eps()) layer.eps = static_cast<float>(spec.eps());
  if (spec.activation() == "none") {
    layer.activation = LayerConfig::Activation::kNone;
  } else if (spec.activation() == "gelu") {
    layer.activation = LayerConfig::Activation::kGelu;
  } else if (!spec.activation().empty() && spec.activation() != "relu") {
    return absl::InvalidArgumentError(absl::StrCat(at, ".activation: unknown activation '",
                                                   spec.activation(), "' (relu, gelu or none)"));
  }
  STOKER_ASSIGN_OR_RETURN(layer.layers, ToLayers(spec.layers(), at + ".layers"));
  STOKER_ASSIGN_OR_RETURN(layer.shortcut, ToLayers(spec.shortcut(), at + ".shortcut"));
  return layer;
}

absl::StatusOr<std::vector<LayerConfig>> ToLayers(
    const google::protobuf::RepeatedPtrField<v1::LayerSpec>& specs, const std::string& path) {
  std::vector<LayerConfig> layers;
  for (int i = 0; i < specs.size(); ++i) {
    STOKER_ASSIGN_OR_RETURN(LayerConfig layer, ToLayer(specs[i], absl::StrCat(path, "[", i, "]")));
    layers.push_back(std::move(layer));
  }
  return layers;
}

// The shortest decimal text that reads back as `value` ("0.1", not 0.100000001490116), as a
// double for JSON.
double ShortestDouble(float value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::strtod(std::string(text, result.ptr).c_str(), nullptr);
}

const char* ActivationName(LayerConfig::Activation activation) {
  switch (activation) {
    case LayerConfig::Activation::kNone:
      return "none";
    case LayerConfig::Activation::kGelu:
      return "gelu";
    default:
      return "relu";
  }
}

bool IsBatchNorm(LayerConfig::Kind kind) {
  return kind == LayerConfig::Kind::kBatchNorm2d || kind == LayerConfig::Kind::kBatchNorm1d;
}

// One layer of the architecture JSON: its type and the fields its kind has.
nlohmann::json LayerJson(const LayerConfig& layer) {
  nlohmann::json entry = {{"type", LayerKindName(layer.kind)}};
  switch (layer.kind) {
    case LayerConfig::Kind::kConv2d:
      entry["out_channels"] = layer.out_channels;
      entry["kernel"] = layer.kernel;
      entry["stride"] = EffectiveStride(layer);
      entry["padding"] = layer.padding;
      entry["bias"] = layer.bias;
      break;
    case LayerConfig::Kind::kMaxPool2d:
    case LayerConfig::Kind::kAvgPool2d:
      entry["kernel"] = layer.kernel;
      entry["stride"] = EffectiveStride(layer);
      entry["padding"] = layer.padding;
      break;
    case LayerConfig::Kind::kLinear:
      entry["units"] = layer.units;
      entry["bias"] = layer.bias;
      break;
    case LayerConfig::Kind::kDropout:
      entry["rate"] = layer.rate;
      break;
    case LayerConfig::Kind::kBatchNorm2d:
    case LayerConfig::Kind::kBatchNorm1d:
      entry["momentum"] = ShortestDouble(layer.momentum);
      entry["eps"] = ShortestDouble(layer.eps);
      break;
    case LayerConfig::Kind::kResidual: {
      nlohmann::json main = nlohmann::json::array(), shortcut = nlohmann::json::array();
      for (const LayerConfig& inner : layer.layers) main.push_back(LayerJson(inner));
      for (const LayerConfig& inner : layer.shortcut) shortcut.push_back(LayerJson(inner));
      entry["layers"] = std::move(main);
      entry["shortcut"] = std::move(shortcut);
      entry["activation"] = ActivationName(layer.activation);
      break;
    }
    default:
      break;
  }
  return entry;
}

// input_scale or input_shift in the architecture: a number when one value serves every channel
// (what checkpoints held before per-channel values, so older readers still take them), else a
// list with one value per channel.
nlohmann::json NormalizationJson(const std::vector<float>& values) {
  if (values.size() == 1) return values[0];
  return values;
}

// "conv2d-relu-residual(conv2d-batchnorm2d | conv2d)-linear": the kinds in order, a residual
// block's main branch and shortcut in parentheses.
std::string LayerNames(const std::vector<LayerConfig>& layers) {
  std::vector<std::string> names;
  for (const LayerConfig& layer : layers) {
    std::string name = LayerKindName(layer.kind);
    if (layer.kind == LayerConfig::Kind::kResidual) {
      absl::StrAppend(&name, "(", LayerNames(layer.layers), layer.shortcut.empty() ? "" : " | ",
                      LayerNames(layer.shortcut), ")");
    }
    names.push_back(std::move(name));
  }
  return absl::StrJoin(names, "-");
}

int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

// The output of `layer` on an input of shape `in` (the engine's rule), and its trainable
// parameters, for a layer NetworkShapes accepts.
std::vector<int> LayerOutput(const LayerConfig& layer, const std::vector<int>& in) {
  absl::StatusOr<std::vector<int>> out = LayerOutputShape(layer, in);
  return out.ok() ? *out : in;
}

int64_t LayerParameters(const LayerConfig& layer, const std::vector<int>& in) {
  using Kind = LayerConfig::Kind;
  switch (layer.kind) {
    case Kind::kConv2d:
      return int64_t{layer.out_channels} * (in.empty() ? 0 : in[0]) * layer.kernel * layer.kernel +
             (layer.bias ? layer.out_channels : 0);
    case Kind::kLinear:
      return int64_t{layer.units} * Product(in) + (layer.bias ? layer.units : 0);
    case Kind::kBatchNorm2d:
    case Kind::kBatchNorm1d:
      return 2 * int64_t{in.empty() ? 0 : in[0]};  // weight and bias; running statistics aside
    case Kind::kResidual: {
      int64_t count = 0;
      for (const auto* branch : {&layer.layers, &layer.shortcut}) {
        std::vector<int> shape = in;
        for (const LayerConfig& inner : *branch) {
          count += LayerParameters(inner, shape);
          shape = LayerOutput(inner, shape);
        }
      }
      return count;
    }
    default:
      return 0;
  }
}

int CountLayers(const std::vector<LayerConfig>& layers) {
  int count = 0;
  for (const LayerConfig& layer : layers) {
    count += 1 + CountLayers(layer.layers) + CountLayers(layer.shortcut);
  }
  return count;
}

std::string ShapeText(const std::vector<int>& shape) { return absl::StrJoin(shape, "x"); }

// The job-file YAML of `layers` at `indent`, each followed by its output shape and parameters.
void AppendLayersYaml(const std::vector<LayerConfig>& layers, std::vector<int> shape,
                      const std::string& indent, std::string* out) {
  using Kind = LayerConfig::Kind;
  for (const LayerConfig& layer : layers) {
    const std::vector<int> output = LayerOutput(layer, shape);
    const std::string comment = absl::StrCat("  # ", ShapeText(output), ", ",
                                             LayerParameters(layer, shape), " parameters\n");
    std::vector<std::string> fields = {absl::StrCat("type: ", LayerKindName(layer.kind))};
    if (layer.kind == Kind::kConv2d)
      fields.push_back(absl::StrCat("out_channels: ", layer.out_channels));
    if (LayerKindInfoOf(layer.kind).has_kernel) {
      fields.push_back(absl::StrCat("kernel: ", layer.kernel));
      fields.push_back(absl::StrCat("stride: ", EffectiveStride(layer)));
      fields.push_back(absl::StrCat("padding: ", layer.padding));
    }
    if (layer.kind == Kind::kLinear) fields.push_back(absl::StrCat("units: ", layer.units));
    if ((layer.kind == Kind::kConv2d || layer.kind == Kind::kLinear) && !layer.bias) {
      fields.push_back("bias: false");
    }
    if (layer.kind == Kind::kDropout) fields.push_back(absl::StrCat("rate: ", layer.rate));
    if (IsBatchNorm(layer.kind) && layer.momentum != LayerConfig().momentum) {
      fields.push_back(absl::StrCat("momentum: ", ShortestDouble(layer.momentum)));
    }
    if (IsBatchNorm(layer.kind) && layer.eps != LayerConfig().eps) {
      fields.push_back(absl::StrCat("eps: ", ShortestDouble(layer.eps)));
    }
    if (layer.kind != Kind::kResidual) {
      absl::StrAppend(out, indent, "- {", absl::StrJoin(fields, ", "), "}", comment);
    } else {
      absl::StrAppend(out, indent, "- type: residual", comment);
      absl::StrAppend(out, indent, "  activation: ", ActivationName(layer.activation), "\n");
      absl::StrAppend(out, indent, "  layers:\n");
      AppendLayersYaml(layer.layers, shape, indent + "    ", out);
      if (!layer.shortcut.empty()) {
        absl::StrAppend(out, indent, "  shortcut:\n");
        AppendLayersYaml(layer.shortcut, shape, indent + "    ", out);
      }
    }
    shape = output;
  }
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

// The job-file path and kind of the first BatchNorm in `layers` (on inputs of `shape`) that a
// batch of one sample gives one value per channel: every BatchNorm1d, and a BatchNorm2d on a 1x1
// plane. Empty when there is none.
std::string FirstSingleValueBatchNorm(const std::vector<LayerConfig>& layers,
                                      std::vector<int> shape, const std::string& path) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& layer = layers[i];
    const std::string here = absl::StrCat(path, "[", i, "]");
    if (IsBatchNorm(layer.kind) && Product(shape) == (shape.empty() ? 1 : shape[0])) {
      return absl::StrCat(here, " (", LayerKindName(layer.kind), ")");
    }
    if (layer.kind == LayerConfig::Kind::kResidual) {
      for (const auto& [branch, name] :
           {std::pair{&layer.layers, ".layers"}, std::pair{&layer.shortcut, ".shortcut"}}) {
        std::string found = FirstSingleValueBatchNorm(*branch, shape, here + name);
        if (!found.empty()) return found;
      }
    }
    shape = LayerOutput(layer, shape);
  }
  return "";
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
  config.label_smoothing = static_cast<float>(spec.train().label_smoothing());
  if (IsImageFormat(spec.dataset().format())) config.input_channels = SampleChannels(sample_dims);
  STOKER_RETURN_IF_ERROR(SetInputNormalization(spec, config.input_channels, &config));
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
  STOKER_ASSIGN_OR_RETURN(const v1::ModelSpec model, ExpandModel(spec.model(), classes));
  STOKER_ASSIGN_OR_RETURN(config.layers, ToLayers(model.layers(), "model.layers"));
  SetTrainingFields(spec, classes, &config);
  config.label_smoothing = static_cast<float>(spec.train().label_smoothing());
  const int channels = config.input_shape.size() == 3 ? config.input_shape[0] : 1;
  STOKER_RETURN_IF_ERROR(SetInputNormalization(spec, channels, &config));
  return config;
}

absl::Status ValidateModelForData(const v1::JobSpec& spec, const std::vector<int>& sample_dims,
                                  int classes) {
  if (spec.model().type() == "mlp") return MlpConfigFromSpec(spec, sample_dims, classes).status();
  absl::StatusOr<NetworkConfig> config = NetworkConfigFromSpec(spec, sample_dims, classes);
  if (!config.ok()) return config.status();
  absl::Status status = ValidateNetworkConfig(*config);
  if (status.ok() && spec.train().batch_size() == 1) {
    // Every training batch then gives such a BatchNorm one value per channel, which training
    // refuses (as PyTorch does): say so now rather than fail the job at its first step.
    const std::string norm =
        FirstSingleValueBatchNorm(config->layers, config->input_shape, "model.layers");
    if (!norm.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.batch_size: 1 gives ", norm,
          spec.model().type() == "resnet" ? " of the resnet preset" : "",
          " one value per channel; BatchNorm trains on the batch's statistics and needs more "
          "than 1 value per channel (PyTorch: \"Expected more than 1 value per channel when "
          "training\"): use a batch_size of at least 2"));
    }
  }
  if (status.ok()) return status;
  // The engine names the layer ("layers[0] (conv2d): ..."); the job file calls it model.layers.
  // A resnet's layers are not in the job file: say what they came from and where to see them.
  const absl::string_view message = status.message();
  if (spec.model().type() == "resnet") {
    return absl::Status(
        status.code(), absl::StrCat("model: resnet-", spec.model().depth(), " on samples of ",
                                    absl::StrJoin(config->input_shape, "x"), ": ", message,
                                    " (`stoker submit --dry-run` lists the layers it expands to)"));
  }
  return absl::Status(status.code(), absl::StartsWith(message, "layers[")
                                         ? absl::StrCat("model.", message)
                                         : absl::StrCat("model: ", message));
}

absl::StatusOr<BuiltModel> BuildModel(Backend& backend, const v1::JobSpec& spec,
                                      const std::vector<int>& sample_dims, int classes) {
  BuiltModel built;
  built.precision = ToPrecision(spec.train().precision());
  if (spec.model().type() == "mlp") {
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
  built.description = NetworkDescription(spec.model(), *config);
  built.architecture = ArchitectureJson(*config);
  return built;
}

namespace {

// What both architectures end with: the classes, the input normalisation and, when not 0, the
// label smoothing.
template <typename Config>
std::string FinishArchitecture(nlohmann::json json, const Config& config) {
  json["classes"] = config.classes;
  json["input_scale"] = NormalizationJson(config.input_scale);
  json["input_shift"] = NormalizationJson(config.input_shift);
  if (config.label_smoothing != 0) {
    json["label_smoothing"] = ShortestDouble(config.label_smoothing);
  }
  return json.dump();
}

}  // namespace

std::string ArchitectureJson(const MlpConfig& config) {
  return FinishArchitecture({{"type", "mlp"},
                             {"input_features", config.input_features},
                             {"input_channels", config.input_channels},
                             {"hidden", config.hidden}},
                            config);
}

std::string ArchitectureJson(const NetworkConfig& config) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerConfig& layer : config.layers) layers.push_back(LayerJson(layer));
  return FinishArchitecture(
      {{"type", "cnn"}, {"input_shape", config.input_shape}, {"layers", std::move(layers)}},
      config);
}

int64_t NetworkParameterCount(const NetworkConfig& config) {
  int64_t count = 0;
  for (const NetworkTensorSpec& tensor : NetworkTensorSpecs(config)) {
    if (!IsTrainedTensor(tensor.kind)) continue;
    int64_t values = 1;
    for (int64_t d : tensor.shape) values *= d;
    count += values;
  }
  return count;
}

int NetworkLayerCount(const NetworkConfig& config) { return CountLayers(config.layers); }

std::string NetworkLayersYaml(const NetworkConfig& config) {
  std::string yaml = "model:\n  type: cnn\n  layers:\n";
  AppendLayersYaml(config.layers, config.input_shape, "    ", &yaml);
  return yaml;
}

std::string NetworkDescription(const v1::ModelSpec& model, const NetworkConfig& config) {
  const std::string input = absl::StrJoin(config.input_shape, "x");
  const int64_t parameters = NetworkParameterCount(config);
  if (model.type() == "resnet") {
    return absl::StrCat("resnet-", model.depth(), " width ", ResnetWidth(model), " ", input, " (",
                        NetworkLayerCount(config), " layers, ", parameters, " parameters)");
  }
  return absl::StrCat("cnn ", input, " ", LayerNames(config.layers),
                      NetworkLayerCount(config) > static_cast<int>(config.layers.size())
                          ? absl::StrCat(" (", parameters, " parameters)")
                          : "");
}

}  // namespace stoker
