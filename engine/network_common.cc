// Backend-independent parts of the network contract: shape inference, config and batch checks,
// the seeded initialisation.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/enum_names.h"
#include "engine/backend_helpers.h"
#include "engine/layer_kinds.h"

namespace stoker {
namespace {

using Kind = LayerConfig::Kind;

std::string ShapeText(const std::vector<int>& shape) {
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&text, i ? "x" : "", shape[i]);
  return text;
}

int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int d : shape) product *= d;
  return product;
}

// The channels the input normalisation sees: C of a {C, H, W} input, input_channels (0 = 1) of a
// flat one.
int InputChannels(const NetworkConfig& config) {
  if (config.input_shape.size() == 3) return config.input_shape[0];
  return config.input_channels == 0 ? 1 : config.input_channels;
}

// Uniform in [0, 1) from the top 53 bits (as mlp_common.cc: independent of the standard library).
double UnitUniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Output side of a window (conv or pool) of `kernel` over `size` with `padding` and `stride`,
// PyTorch's floor mode.
int WindowOutput(int size, int kernel, int stride, int padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}

// The weight shape of a Conv2d ([out_c, in_c, k, k]) or Linear ([units, in_features]) on input
// `in`, as PyTorch lays it out; empty for a layer without parameters. Its bias is [shape[0]].
std::vector<int64_t> WeightShape(const LayerConfig& layer, const std::vector<int>& in) {
  if (layer.kind == Kind::kConv2d) return {layer.out_channels, in[0], layer.kernel, layer.kernel};
  if (layer.kind == Kind::kLinear) return {layer.units, Product(in)};
  return {};
}

}  // namespace

const char* LayerKindName(LayerConfig::Kind kind) {
  if (static_cast<size_t>(kind) >= kLayerKinds.size()) return "unknown";
  return LayerKindInfoOf(kind).name;
}

const char* OptimizerTypeName(OptimizerType type) {
  static constexpr const char* kNames[] = {"sgd", "adamw"};
  return EnumName(type, kNames);
}

namespace {

// Deepest nesting of residual blocks a config may have: bounds the recursion on a job file's
// input.
constexpr int kMaxNesting = 16;

absl::StatusOr<std::vector<int>> BranchOutput(const std::vector<LayerConfig>& layers,
                                              std::vector<int> in, const std::string& path,
                                              int depth);

// The output shape of `layer` on input `in`; `path` names it in errors ("layers[3].layers[1]").
absl::StatusOr<std::vector<int>> LayerOutput(const LayerConfig& layer, const std::vector<int>& in,
                                             const std::string& path, int depth) {
  const std::string where = absl::StrCat(path, " (", LayerKindName(layer.kind), "): ");
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, parts...));
  };
  auto needs_image = [&]() -> absl::Status {
    if (in.size() == 3) return absl::OkStatus();
    return invalid("needs a [C, H, W] input, got [", ShapeText(in),
                   "] (a Flatten or Linear came before it)");
  };
  switch (layer.kind) {
    case Kind::kConv2d:
    case Kind::kMaxPool2d:
    case Kind::kAvgPool2d: {
      const bool conv = layer.kind == Kind::kConv2d;
      if (absl::Status s = needs_image(); !s.ok()) return s;
      if (conv && layer.out_channels <= 0) {
        return invalid("out_channels must be > 0, got ", layer.out_channels);
      }
      if (layer.kernel <= 0) return invalid("kernel must be > 0, got ", layer.kernel);
      if (layer.stride < 0) return invalid("stride must be >= 0 (0 = default), got ", layer.stride);
      if (layer.padding < 0) return invalid("padding must be >= 0, got ", layer.padding);
      if (!conv && layer.padding > layer.kernel / 2) {
        return invalid("padding ", layer.padding, " must be at most half the kernel (",
                       layer.kernel, ")");
      }
      const int stride = EffectiveStride(layer);
      if (layer.kernel > in[1] + 2 * layer.padding || layer.kernel > in[2] + 2 * layer.padding) {
        return invalid("kernel ", layer.kernel, " larger than input ", in[1], "x", in[2],
                       layer.padding > 0 ? absl::StrCat(" padded by ", layer.padding) : "");
      }
      return std::vector<int>{conv ? layer.out_channels : in[0],
                              WindowOutput(in[1], layer.kernel, stride, layer.padding),
                              WindowOutput(in[2], layer.kernel, stride, layer.padding)};
    }
    case Kind::kLinear:
      if (layer.units <= 0) return invalid("units must be > 0, got ", layer.units);
      return std::vector<int>{layer.units};
    case Kind::kDropout:
      if (!(layer.rate >= 0 && layer.rate < 1)) {
        return invalid("rate must be in [0, 1), got ", layer.rate);
      }
      return in;
    case Kind::kRelu:
    case Kind::kGelu:
      return in;
    case Kind::kFlatten:
      return std::vector<int>{static_cast<int>(Product(in))};
    case Kind::kBatchNorm2d:
    case Kind::kBatchNorm1d:
      if (layer.kind == Kind::kBatchNorm2d) {
        if (absl::Status s = needs_image(); !s.ok()) return s;
      } else if (in.size() != 1) {
        return invalid("needs a flat [features] input, got [", ShapeText(in),
                       "] (use batchnorm2d on images)");
      }
      if (!(layer.momentum >= 0 && layer.momentum <= 1)) {
        return invalid("momentum must be in [0, 1], got ", layer.momentum);
      }
      if (!(layer.eps > 0) || !std::isfinite(layer.eps)) {
        return invalid("eps must be finite and > 0, got ", layer.eps);
      }
      return in;
    case Kind::kGlobalAvgPool:
      if (absl::Status s = needs_image(); !s.ok()) return s;
      return std::vector<int>{in[0], 1, 1};
    case Kind::kResidual: {
      if (depth >= kMaxNesting) {
        return invalid("residual blocks nested deeper than ", kMaxNesting);
      }
      if (layer.layers.empty()) return invalid("the main branch `layers` is empty");
      if (layer.activation != LayerConfig::Activation::kNone &&
          layer.activation != LayerConfig::Activation::kRelu &&
          layer.activation != LayerConfig::Activation::kGelu) {
        return invalid("activation ", static_cast<int>(layer.activation), " is unknown");
      }
      absl::StatusOr<std::vector<int>> main =
          BranchOutput(layer.layers, in, absl::StrCat(path, ".layers"), depth + 1);
      if (!main.ok()) return main.status();
      absl::StatusOr<std::vector<int>> shortcut =
          BranchOutput(layer.shortcut, in, absl::StrCat(path, ".shortcut"), depth + 1);
      if (!shortcut.ok()) return shortcut.status();
      if (*main != *shortcut) {
        return invalid("the main branch gives [", ShapeText(*main), "] but the ",
                       layer.shortcut.empty() ? "identity shortcut" : "shortcut", " gives [",
                       ShapeText(*shortcut), "]; they must match to be added");
      }
      return main;
    }
  }
  return invalid("unknown layer kind ", static_cast<int>(layer.kind));
}

absl::StatusOr<std::vector<int>> BranchOutput(const std::vector<LayerConfig>& layers,
                                              std::vector<int> in, const std::string& path,
                                              int depth) {
  for (size_t j = 0; j < layers.size(); ++j) {
    absl::StatusOr<std::vector<int>> out =
        LayerOutput(layers[j], in, absl::StrCat(path, "[", j, "]"), depth);
    if (!out.ok()) return out.status();
    in = *std::move(out);
  }
  return in;
}

// Calls visit(layer, in_shape, out_shape, prefix) for every layer of `layers` on input `in`,
// residual blocks' branches included (the block first, then its main branch, then its shortcut),
// in the order PyTorch's module tree lists them; `prefix` names the layer's tensors
// ("layers.3.layers.1"). The shapes must be valid (NetworkShapes passed).
template <typename Visit>
std::vector<int> VisitBranch(const std::vector<LayerConfig>& layers, std::vector<int> in,
                             const std::string& prefix, Visit& visit);

// VisitBranch for one layer named `name`; returns its output shape.
template <typename Visit>
std::vector<int> VisitLayer(const LayerConfig& layer, const std::vector<int>& in,
                            const std::string& name, Visit& visit) {
  std::vector<int> out = *LayerOutput(layer, in, name, 0);
  visit(layer, in, out, name);
  if (layer.kind == Kind::kResidual) {
    VisitBranch(layer.layers, in, name + ".layers", visit);
    VisitBranch(layer.shortcut, in, name + ".shortcut", visit);
  }
  return out;
}

template <typename Visit>
std::vector<int> VisitBranch(const std::vector<LayerConfig>& layers, std::vector<int> in,
                             const std::string& prefix, Visit& visit) {
  for (size_t j = 0; j < layers.size(); ++j) {
    in = VisitLayer(layers[j], in, absl::StrCat(prefix, ".", j), visit);
  }
  return in;
}

}  // namespace

absl::StatusOr<std::vector<int>> LayerOutputShape(const LayerConfig& layer,
                                                  const std::vector<int>& in) {
  return LayerOutput(layer, in, "layer", 0);
}

absl::StatusOr<std::vector<std::vector<int>>> NetworkShapes(const NetworkConfig& config) {
  if (config.input_shape.size() != 1 && config.input_shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_shape must be {C, H, W} or {features}, got ", config.input_shape.size(),
                     " dimensions"));
  }
  for (int d : config.input_shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_shape ", ShapeText(config.input_shape), " has a dimension <= 0"));
    }
  }
  std::vector<std::vector<int>> shapes = {config.input_shape};
  for (size_t i = 0; i < config.layers.size(); ++i) {
    absl::StatusOr<std::vector<int>> out =
        LayerOutput(config.layers[i], shapes.back(), absl::StrCat("layers[", i, "]"), 0);
    if (!out.ok()) return out.status();
    shapes.push_back(*std::move(out));
  }
  const std::vector<int>& out = shapes.back();
  if (out.size() != 1 || out[0] != config.classes) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.layers.empty() ? std::string("the input")
                              : absl::StrCat("layers[", config.layers.size() - 1, "] (",
                                             LayerKindName(config.layers.back().kind), ")"),
        " gives [", ShapeText(out), "]; the network must end in [classes] = [", config.classes,
        "] logits (end with a Linear of ", config.classes, " units)"));
  }
  return shapes;
}

namespace {

absl::Status ValidateOptimizer(const OptimizerConfig& opt) {
  if (!(opt.learning_rate >= 0) || !std::isfinite(opt.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.learning_rate must be finite and >= 0, got ", opt.learning_rate));
  }
  if (!(opt.momentum >= 0 && opt.momentum <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.momentum must be in [0, 1], got ", opt.momentum));
  }
  if (!(opt.weight_decay >= 0) || !std::isfinite(opt.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.weight_decay must be finite and >= 0, got ", opt.weight_decay));
  }
  if (opt.type != OptimizerType::kSgd && opt.type != OptimizerType::kAdamW) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.type ", static_cast<int>(opt.type), " is unknown"));
  }
  if (opt.nesterov && (opt.type != OptimizerType::kSgd || opt.momentum <= 0)) {
    return absl::InvalidArgumentError("optimizer.nesterov needs SGD with momentum > 0");
  }
  if (!(opt.beta1 >= 0 && opt.beta1 < 1) || !(opt.beta2 >= 0 && opt.beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.beta1 and beta2 must be in [0, 1), got ", opt.beta1, " and ", opt.beta2));
  }
  if (!(opt.eps > 0) || !std::isfinite(opt.eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.eps must be finite and > 0, got ", opt.eps));
  }
  if (!(opt.clip_grad_norm >= 0) || !std::isfinite(opt.clip_grad_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.clip_grad_norm must be finite and >= 0 (0 = off), got ", opt.clip_grad_norm));
  }
  return absl::OkStatus();
}

absl::Status ValidateLossScale(const LossScaleConfig& scale) {
  if (!(scale.initial > 0) || !std::isfinite(scale.initial) || scale.growth_interval < 1 ||
      !(scale.growth_factor > 1) || !std::isfinite(scale.growth_factor) ||
      !(scale.backoff_factor > 0 && scale.backoff_factor < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_scale needs initial > 0, growth_interval >= 1, growth_factor > 1 and backoff_factor "
        "in (0, 1); got ",
        scale.initial, ", ", scale.growth_interval, ", ", scale.growth_factor, ", ",
        scale.backoff_factor));
  }
  return absl::OkStatus();
}

}  // namespace

// Also used by ValidateMlpConfig for the fields the two configs share.
absl::Status ValidateTrainingOptions(const OptimizerConfig& optimizer,
                                     const LossScaleConfig& loss_scale) {
  if (absl::Status s = ValidateOptimizer(optimizer); !s.ok()) return s;
  return ValidateLossScale(loss_scale);
}

absl::Status ValidateNetworkConfig(const NetworkConfig& config) {
  if (config.classes < 1 || config.classes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("classes must be in [1, 256] (labels are uint8), got ", config.classes));
  }
  if (config.max_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch must be > 0, got ", config.max_batch));
  }
  if (absl::Status s = NetworkShapes(config).status(); !s.ok()) return s;
  if (!(config.label_smoothing >= 0 && config.label_smoothing < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_smoothing must be in [0, 1), got ", config.label_smoothing));
  }
  const bool image = config.input_shape.size() == 3;
  if (image && config.input_channels != 0 && config.input_channels != config.input_shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_channels must be 0 or input_shape[0] (", config.input_shape[0],
                     ") for a [C, H, W] input, got ", config.input_channels));
  }
  if (absl::Status s = ValidateInputNormalization(
          Product(config.input_shape), InputChannels(config),
          image ? "input_shape[0]" : "input_channels", config.input_scale, config.input_shift);
      !s.ok()) {
    return s;
  }
  return ValidateTrainingOptions(config.optimizer, config.loss_scale);
}

ChannelNormalization InputNormalization(const NetworkConfig& config) {
  return ExpandNormalization(Product(config.input_shape), InputChannels(config), config.input_scale,
                             config.input_shift);
}

absl::Status ValidateBatch(const NetworkConfig& config, const BatchView& batch) {
  MlpConfig as_mlp;
  as_mlp.classes = config.classes;
  as_mlp.max_batch = config.max_batch;
  return ValidateBatch(as_mlp, batch);
}

absl::Status OneValuePerChannelError(LayerConfig::Kind kind, absl::string_view weight_name,
                                     int batch, const std::vector<int>& shape) {
  // The module's name as PyTorch spells it: "layers.3.layers.1" for layers.3.layers.1.weight.
  const absl::string_view name = absl::StripSuffix(weight_name, ".weight");
  return absl::InvalidArgumentError(absl::StrCat(
      LayerKindName(kind), " ", name,
      ": expected more than 1 value per channel when training, got input size [", batch, ", ",
      absl::StrJoin(shape, ", "), "] (a training batch of ", batch,
      batch == 1 ? " sample" : " samples",
      "); BatchNorm needs at least 2 values per channel to normalise by the batch's statistics: "
      "raise train.batch_size, or choose dataset.train_limit so that no batch holds one "
      "sample"));
}

std::string ParameterName(size_t index, bool weight) {
  return absl::StrCat("layers.", index, weight ? ".weight" : ".bias");
}

size_t ParameterIndex(const NetworkConfig& config, size_t layer, ParameterNaming naming) {
  if (naming == ParameterNaming::kByLayer) return layer;
  size_t index = 0;
  for (size_t i = 0; i < layer && i < config.layers.size(); ++i) {
    if (LayerHasParameters(config.layers[i].kind)) ++index;
  }
  return index;
}

bool IsTrainedTensor(NetworkTensorKind kind) {
  return kind == NetworkTensorKind::kWeight || kind == NetworkTensorKind::kBias ||
         kind == NetworkTensorKind::kNormWeight || kind == NetworkTensorKind::kNormBias;
}

bool IsDecayedTensor(NetworkTensorKind kind) { return kind == NetworkTensorKind::kWeight; }

std::vector<NetworkTensorSpec> NetworkTensorSpecs(const NetworkConfig& config,
                                                  ParameterNaming naming) {
  absl::StatusOr<std::vector<std::vector<int>>> shapes = NetworkShapes(config);
  if (!shapes.ok()) return {};
  std::vector<NetworkTensorSpec> specs;
  auto visit = [&](const LayerConfig& layer, const std::vector<int>& in, const std::vector<int>&,
                   const std::string& prefix) {
    const std::vector<int64_t> weight_shape = WeightShape(layer, in);
    if (!weight_shape.empty()) {
      const int64_t fan_in =
          Product(std::vector<int>(weight_shape.begin() + 1, weight_shape.end()));
      specs.push_back({prefix + ".weight", weight_shape, NetworkTensorKind::kWeight, fan_in});
      if (layer.bias) {
        specs.push_back({prefix + ".bias", {weight_shape[0]}, NetworkTensorKind::kBias, fan_in});
      }
    } else if (layer.kind == Kind::kBatchNorm2d || layer.kind == Kind::kBatchNorm1d) {
      const int64_t channels = in[0];
      specs.push_back({prefix + ".weight", {channels}, NetworkTensorKind::kNormWeight, 0});
      specs.push_back({prefix + ".bias", {channels}, NetworkTensorKind::kNormBias, 0});
      specs.push_back({prefix + ".running_mean", {channels}, NetworkTensorKind::kRunningMean, 0});
      specs.push_back({prefix + ".running_var", {channels}, NetworkTensorKind::kRunningVar, 0});
      specs.push_back(
          {prefix + ".num_batches_tracked", {1}, NetworkTensorKind::kBatchesTracked, 0});
    }
  };
  for (size_t i = 0; i < config.layers.size(); ++i) {
    VisitLayer(config.layers[i], (*shapes)[i],
               absl::StrCat("layers.", ParameterIndex(config, i, naming)), visit);
  }
  return specs;
}

std::vector<NamedTensor> InitialNetworkParameters(const NetworkConfig& config,
                                                  ParameterNaming naming) {
  std::mt19937_64 rng(config.seed);
  std::vector<NamedTensor> parameters;
  for (const NetworkTensorSpec& spec : NetworkTensorSpecs(config, naming)) {
    NamedTensor tensor{spec.name, spec.shape, {}};
    int64_t size = 1;
    for (int64_t d : spec.shape) size *= d;
    tensor.values.resize(size);
    switch (spec.kind) {
      case NetworkTensorKind::kWeight:
      case NetworkTensorKind::kBias: {
        // PyTorch's default for Conv2d and Linear, the weight's values then the bias's.
        const double bound = 1.0 / std::sqrt(static_cast<double>(spec.fan_in));
        for (float& v : tensor.values) v = static_cast<float>((2 * UnitUniform(rng) - 1) * bound);
        break;
      }
      case NetworkTensorKind::kNormWeight:
      case NetworkTensorKind::kRunningVar:
        std::fill(tensor.values.begin(), tensor.values.end(), 1.0f);
        break;
      case NetworkTensorKind::kNormBias:
      case NetworkTensorKind::kRunningMean:
      case NetworkTensorKind::kBatchesTracked:
        break;  // zeros
    }
    parameters.push_back(std::move(tensor));
  }
  return parameters;
}

NetworkConfig NetworkFromMlp(const MlpConfig& mlp) {
  NetworkConfig config;
  config.input_shape = {mlp.input_features};
  auto linear = [](int units) {
    LayerConfig layer;
    layer.kind = Kind::kLinear;
    layer.units = units;
    return layer;
  };
  LayerConfig relu;
  relu.kind = Kind::kRelu;
  for (int width : mlp.hidden) {
    config.layers.push_back(linear(width));
    config.layers.push_back(relu);
  }
  config.layers.push_back(linear(mlp.classes));
  config.classes = mlp.classes;
  config.max_batch = mlp.max_batch;
  config.precision = mlp.precision;
  config.seed = mlp.seed;
  config.optimizer = mlp.optimizer;
  config.input_channels = mlp.input_channels;
  config.input_scale = mlp.input_scale;
  config.input_shift = mlp.input_shift;
  config.loss_scale = mlp.loss_scale;
  config.label_smoothing = mlp.label_smoothing;
  return config;
}

int64_t NetworkForwardFlopsPerSample(const NetworkConfig& config) {
  absl::StatusOr<std::vector<std::vector<int>>> shapes = NetworkShapes(config);
  if (!shapes.ok()) return 0;
  int64_t flops = 0;
  auto visit = [&](const LayerConfig& layer, const std::vector<int>& in,
                   const std::vector<int>& out, const std::string&) {
    if (layer.kind == Kind::kConv2d) {
      flops += 2 * Product(out) * in[0] * layer.kernel * layer.kernel;
    } else if (layer.kind == Kind::kLinear) {
      flops += 2 * Product(in) * layer.units;
    }
  };
  VisitBranch(config.layers, config.input_shape, "layers", visit);
  return flops;
}

absl::StatusOr<TrainingFootprint> EstimateTrainingFootprint(const NetworkConfig& config) {
  absl::StatusOr<std::vector<std::vector<int>>> shapes = NetworkShapes(config);
  if (!shapes.ok()) return shapes.status();
  TrainingFootprint footprint;
  int64_t buffers = 0;
  for (const NetworkTensorSpec& spec : NetworkTensorSpecs(config, ParameterNaming::kByLayer)) {
    int64_t size = 1;
    for (int64_t d : spec.shape) size *= d;
    (IsTrainedTensor(spec.kind) ? footprint.parameters : buffers) += size;
  }
  // Every layer's output, nested ones included (a residual block's sum counts as its output).
  footprint.activations_per_sample = Product(config.input_shape);
  auto visit = [&](const LayerConfig&, const std::vector<int>&, const std::vector<int>& out,
                   const std::string&) { footprint.activations_per_sample += Product(out); };
  VisitBranch(config.layers, config.input_shape, "layers", visit);
  const bool low_precision = config.precision != Precision::kFp32;
  int64_t optimizer_slots = 0;
  if (config.optimizer.type == OptimizerType::kAdamW) {
    optimizer_slots = 2;
  } else if (config.optimizer.momentum > 0) {
    optimizer_slots = 1;
  }
  const int64_t per_parameter = 4 + 4 + 4 * optimizer_slots + (low_precision ? 2 : 0);
  const int64_t per_activation = 4 + 4 + (low_precision ? 2 : 0);
  footprint.bytes = footprint.parameters * per_parameter + buffers * 4 +
                    int64_t{config.max_batch} * footprint.activations_per_sample * per_activation;
  return footprint;
}

absl::Status CheckTrainingFits(const TrainingFootprint& footprint, int64_t available_bytes,
                               const std::string& where, int max_batch) {
  if (footprint.bytes <= available_bytes - available_bytes / 10) return absl::OkStatus();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "training needs about %.1f GiB (%d parameters with their gradients and optimizer state, "
      "activations for batch %d) but %s has %.1f GiB available; use a smaller model or "
      "batch_size",
      footprint.bytes / kGiB, footprint.parameters, max_batch, where, available_bytes / kGiB));
}

int EffectiveStride(const LayerConfig& layer) {
  if (layer.stride > 0) return layer.stride;
  const bool pool =
      layer.kind == LayerConfig::Kind::kMaxPool2d || layer.kind == LayerConfig::Kind::kAvgPool2d;
  return pool ? layer.kernel : 1;
}

absl::Status ValidateScalarState(const NamedTensor& entry) {
  const std::vector<float>& v = entry.values;
  const bool is_scale = entry.name == "loss_scale";
  const bool ok =
      is_scale ? v.size() == 2 && std::isfinite(v[0]) && v[0] > 0 && v[1] >= 0 &&
                     v[1] == std::floor(v[1])
               : v.size() == 1 && std::isfinite(v[0]) && v[0] >= 0 && v[0] == std::floor(v[0]);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer state '", entry.name, "' holds ", v.empty() ? 0.0f : v[0],
                   is_scale ? "; expected a finite scale > 0 and a count" : "; expected a count"));
}

}  // namespace stoker
