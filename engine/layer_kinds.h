// The layer vocabulary in one table: every LayerConfig::Kind with the name that job files, a
// checkpoint's architecture and error messages spell it with, and what it takes (parameters, a
// kernel). Whatever names or parses a layer kind goes through here: LayerKindName (backend.h),
// the job spec's validation (spec/job_spec.cc) and its translation (spec/model_spec.cc), and the
// engine's messages ("layers[2] (conv2d): ...").
//
// Header-only, with nothing to link: stoker_spec, which client, server and worker link, builds
// without the engine (STOKER_PARTS) and still checks names against this table.
#ifndef STOKER_ENGINE_LAYER_KINDS_H_
#define STOKER_ENGINE_LAYER_KINDS_H_

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "engine/model_config.h"

namespace stoker {

struct LayerKindInfo {
  LayerConfig::Kind kind;
  const char* name;     // as a job file's model.layers[i].type spells it
  bool has_parameters;  // a weight and a bias: "layers.<i>.weight", "layers.<i>.bias" (Conv2d
                        // and Linear with bias: false have the weight only)
  bool has_kernel;      // kernel, stride and padding, on a [C, H, W] input
  bool has_buffers;     // running statistics, saved but not trained (BatchNorm)
};

// Every kind, in LayerConfig::Kind's order (kLayerKinds[k].kind == Kind(k)).
inline constexpr std::array<LayerKindInfo, 12> kLayerKinds = {{
    {LayerConfig::Kind::kConv2d, "conv2d", /*has_parameters=*/true, /*has_kernel=*/true, false},
    {LayerConfig::Kind::kMaxPool2d, "maxpool2d", false, /*has_kernel=*/true, false},
    {LayerConfig::Kind::kLinear, "linear", /*has_parameters=*/true, false, false},
    {LayerConfig::Kind::kRelu, "relu", false, false, false},
    {LayerConfig::Kind::kGelu, "gelu", false, false, false},
    {LayerConfig::Kind::kDropout, "dropout", false, false, false},
    {LayerConfig::Kind::kFlatten, "flatten", false, false, false},
    {LayerConfig::Kind::kBatchNorm2d, "batchnorm2d", /*has_parameters=*/true, false,
     /*has_buffers=*/true},
    {LayerConfig::Kind::kBatchNorm1d, "batchnorm1d", /*has_parameters=*/true, false,
     /*has_buffers=*/true},
    {LayerConfig::Kind::kAvgPool2d, "avgpool2d", false, /*has_kernel=*/true, false},
    {LayerConfig::Kind::kGlobalAvgPool, "global_avgpool", false, false, false},
    {LayerConfig::Kind::kResidual, "residual", false, false, false},
}};

// The row of `kind`.
constexpr const LayerKindInfo& LayerKindInfoOf(LayerConfig::Kind kind) {
  return kLayerKinds[static_cast<size_t>(kind)];
}

// The kind a name spells, or nullopt for a name outside the table (names are lower case, exact).
constexpr std::optional<LayerConfig::Kind> LayerKindFromName(std::string_view name) {
  for (const LayerKindInfo& info : kLayerKinds) {
    if (name == info.name) return info.kind;
  }
  return std::nullopt;
}

// True for the kinds with a weight and a bias (Conv2d, Linear, BatchNorm2d, BatchNorm1d).
constexpr bool LayerHasParameters(LayerConfig::Kind kind) {
  return LayerKindInfoOf(kind).has_parameters;
}

// Every name in the table's order, joined by ", ": for "supported: ..." messages.
inline std::string LayerKindNameList() {
  std::string list;
  for (const LayerKindInfo& info : kLayerKinds) {
    if (!list.empty()) list += ", ";
    list += info.name;
  }
  return list;
}

// The table's order is the enum's, so LayerKindInfoOf can index it.
static_assert([] {
  for (size_t k = 0; k < kLayerKinds.size(); ++k) {
    if (static_cast<size_t>(kLayerKinds[k].kind) != k) return false;
  }
  return true;
}());

}  // namespace stoker

#endif  // STOKER_ENGINE_LAYER_KINDS_H_
