// Test-only shorthands for LayerConfig and small configs, shared by the cpu and cuda tests.
#ifndef STOKER_ENGINE_TEST_LAYERS_H_
#define STOKER_ENGINE_TEST_LAYERS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model_config.h"

namespace stoker::test_layers {

using Kind = LayerConfig::Kind;

inline LayerConfig Of(Kind kind) {
  LayerConfig layer;
  layer.kind = kind;
  return layer;
}
inline LayerConfig Conv(int out_channels, int kernel, int stride, int padding) {
  LayerConfig layer = Of(Kind::kConv2d);
  layer.out_channels = out_channels;
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = padding;
  return layer;
}
// stride 0: the kernel size (PyTorch's default).
inline LayerConfig Pool(int kernel, int stride = 0, int padding = 0) {
  LayerConfig layer = Of(Kind::kMaxPool2d);
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = padding;
  return layer;
}
inline LayerConfig Linear(int units) {
  LayerConfig layer = Of(Kind::kLinear);
  layer.units = units;
  return layer;
}
inline LayerConfig Dropout(float rate) {
  LayerConfig layer = Of(Kind::kDropout);
  layer.rate = rate;
  return layer;
}
inline LayerConfig NoBias(LayerConfig layer) {
  layer.bias = false;
  return layer;
}
inline LayerConfig Norm2d() { return Of(Kind::kBatchNorm2d); }
inline LayerConfig Norm1d() { return Of(Kind::kBatchNorm1d); }
// stride 0: the kernel size (PyTorch's default).
inline LayerConfig AvgPool(int kernel, int stride = 0, int padding = 0) {
  LayerConfig layer = Pool(kernel, stride, padding);
  layer.kind = Kind::kAvgPool2d;
  return layer;
}
inline LayerConfig Residual(std::vector<LayerConfig> main, std::vector<LayerConfig> shortcut,
                            LayerConfig::Activation activation = LayerConfig::Activation::kRelu) {
  LayerConfig layer = Of(Kind::kResidual);
  layer.layers = std::move(main);
  layer.shortcut = std::move(shortcut);
  layer.activation = activation;
  return layer;
}

// An MLP `input_features` -> `hidden` -> `classes` on batches up to `max_batch`, the other fields
// MlpConfig's defaults.
inline MlpConfig TestMlp(int input_features, std::vector<int> hidden, int classes, int max_batch,
                         uint64_t seed, Precision precision = Precision::kFp32) {
  MlpConfig config;
  config.input_features = input_features;
  config.hidden = std::move(hidden);
  config.classes = classes;
  config.max_batch = max_batch;
  config.precision = precision;
  config.seed = seed;
  return config;
}

// A tiny MLP 6-5-4-3 with odd shapes (no multiple of 8 anywhere), fixed seed, batches up to 8.
inline MlpConfig OddShapedMlp() { return TestMlp(6, {5, 4}, 3, 8, /*seed=*/42); }

}  // namespace stoker::test_layers

#endif  // STOKER_ENGINE_TEST_LAYERS_H_
